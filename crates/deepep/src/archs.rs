//! CUDA architectures as the stack writes them (CMake style: `90`, `90a`, `100f`,
//! `90-real`) to the `TORCH_CUDA_ARCH_LIST` that torch's extension builder reads
//! (`9.0`, `9.0a`, `10.0f`).

use anyhow::{Result, bail};

/// `["90"]` -> `"9.0"`; several are joined with `;`. `-real` is what torch builds anyway
/// (SASS); `-virtual` (PTX only) has no TORCH_CUDA_ARCH_LIST spelling and is refused.
pub fn torch_cuda_arch_list(archs: &[String]) -> Result<String> {
    if archs.is_empty() {
        bail!("no CUDA architecture given: set nvshmem.cuda-archs in stack.toml (90 = H100/H200)");
    }
    let mut out: Vec<String> = Vec::new();
    for arch in archs {
        let entry = torch_entry(arch)?;
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    Ok(out.join(";"))
}

fn torch_entry(arch: &str) -> Result<String> {
    let (base, kind) = match arch.split_once('-') {
        Some((b, k)) => (b, Some(k)),
        None => (arch, None),
    };
    match kind {
        None | Some("real") => {}
        Some("virtual") => bail!(
            "CUDA architecture {arch:?}: PTX-only builds have no TORCH_CUDA_ARCH_LIST form; use {base:?} (SASS for that GPU)"
        ),
        Some(other) => {
            bail!("CUDA architecture {arch:?}: unknown suffix -{other} (expected -real or none)")
        }
    }
    let digits: String = base.chars().take_while(char::is_ascii_digit).collect();
    let suffix = &base[digits.len()..];
    if digits.len() < 2 || !matches!(suffix, "" | "a" | "f") {
        bail!(
            "CUDA architecture {arch:?} is not like 90, 90a or 100f (an SM number with an optional a/f suffix)"
        );
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    Ok(format!("{major}.{minor}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(a: &[&str]) -> Result<String> {
        torch_cuda_arch_list(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn cmake_archs_become_torch_archs() {
        assert_eq!(list(&["90"]).unwrap(), "9.0");
        assert_eq!(list(&["90a", "100f", "120"]).unwrap(), "9.0a;10.0f;12.0");
        assert_eq!(list(&["90-real", "90"]).unwrap(), "9.0");
    }

    #[test]
    fn bad_archs_are_refused_with_the_reason() {
        assert!(
            list(&[])
                .unwrap_err()
                .to_string()
                .contains("nvshmem.cuda-archs")
        );
        assert!(
            list(&["90-virtual"])
                .unwrap_err()
                .to_string()
                .contains("PTX-only")
        );
        assert!(list(&["sm_90"]).is_err());
        assert!(list(&["9"]).is_err());
        assert!(list(&["90b"]).is_err());
    }
}
