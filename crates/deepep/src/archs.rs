//! CUDA architectures as the stack writes them ([`commstack_stack::arch`]'s grammar:
//! `90`, `90a`, `100f`, `90-real`) to the `TORCH_CUDA_ARCH_LIST` that torch's extension
//! builder reads (`9.0`, `9.0a`, `10.0f`).

use anyhow::{Result, bail};
use commstack_stack::CudaArch;

/// `["90"]` -> `"9.0"`; several are joined with `;`. `-real` is what torch builds anyway
/// (SASS); `-virtual` (PTX only) has no TORCH_CUDA_ARCH_LIST spelling and is refused.
pub fn torch_cuda_arch_list(archs: &[CudaArch]) -> Result<String> {
    if archs.is_empty() {
        bail!("no CUDA architecture given: set nvshmem.cuda-archs in stack.toml (90 = H100/H200)");
    }
    let mut out: Vec<String> = Vec::new();
    for arch in archs {
        let Some(entry) = arch.torch() else {
            bail!(
                "CUDA architecture \"{arch}\": PTX-only builds have no TORCH_CUDA_ARCH_LIST form; \
                 use \"{}\" (SASS for that GPU) in nvshmem.cuda-archs or --cuda-archs",
                arch.sm()
            );
        };
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    Ok(out.join(";"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(a: &[&str]) -> Result<String> {
        let archs = a
            .iter()
            .map(|s| s.parse::<CudaArch>())
            .collect::<Result<Vec<_>, _>>()?;
        torch_cuda_arch_list(&archs)
    }

    #[test]
    fn cmake_archs_become_torch_archs() {
        assert_eq!(list(&["90"]).unwrap(), "9.0");
        assert_eq!(list(&["90a", "100f", "120"]).unwrap(), "9.0a;10.0f;12.0");
        assert_eq!(list(&["90-real", "90"]).unwrap(), "9.0");
        // The entries every place pins (commstack_stack::arch).
        assert_eq!(
            list(&["90", "90a", "100f", "90-real"]).unwrap(),
            "9.0;9.0a;10.0f"
        );
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
        let e = list(&["9x0"]).unwrap_err().to_string();
        assert!(e.contains("\"9x0\" is not a CUDA architecture"), "{e}");
    }
}
