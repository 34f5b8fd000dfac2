//! The GPU's SM against the architectures the image's kernels are compiled for.

use commstack_stack::arch::{Code, CudaArch, Variant};

use crate::nvidia_smi::{NvidiaSmiOutput, parse_compute_caps};
use crate::report::{Check, Status};

const ID: &str = "gpu-arch";
const TITLE: &str = "GPU architecture among the image's";

/// How a build for `arch` runs on a GPU of compute capability `gpu`: `Some("SASS")` with
/// code for it, `Some("PTX JIT")` when only the driver's JIT can make it, `None` not at all.
/// SASS runs on its SM and later minors of the same major; `a` SASS on its SM only, `f`
/// on its family (same major, same or later minor); portable PTX on every later SM.
pub(crate) fn runs_on(arch: &CudaArch, gpu: (u32, u32)) -> Option<&'static str> {
    let sm = arch.sm();
    let (major, minor) = (sm / 10, sm % 10);
    let gpu_sm = gpu.0 * 10 + gpu.1;
    let sass = arch.code() != Code::Ptx
        && match arch.variant() {
            Variant::ArchSpecific => gpu_sm == sm,
            Variant::Portable | Variant::FamilySpecific => gpu.0 == major && gpu.1 >= minor,
        };
    if sass {
        return Some("SASS");
    }
    let ptx = arch.code() != Code::Sass && arch.variant() == Variant::Portable && gpu_sm >= sm;
    ptx.then_some("PTX JIT")
}

pub(crate) fn check(smi: &NvidiaSmiOutput, archs: &[CudaArch]) -> Check {
    let built: Vec<String> = archs.iter().map(CudaArch::cmake).collect();
    let built = built.join(", ");
    let caps = match smi
        .compute_cap
        .as_deref()
        .map_err(Clone::clone)
        .and_then(parse_compute_caps)
    {
        Ok(caps) if !caps.is_empty() => caps,
        Ok(_) => {
            return Check::new(ID, TITLE, Status::Fail, "nvidia-smi lists no GPU")
                .fix("run the preflight where the job runs, with the node's GPUs (--gpus all, or the GPU resource on Kubernetes)");
        }
        Err(why) => {
            return Check::new(ID, TITLE, Status::Fail, format!("cannot read the GPUs' compute capability: {why}"))
                .fix("run the preflight with the node's GPUs and their nvidia-smi (the NVIDIA container toolkit's utility capability)");
        }
    };
    let mut details = Vec::new();
    let mut missing = Vec::new();
    let mut jit = Vec::new();
    for (index, (major, minor)) in &caps {
        let how = archs.iter().find_map(|a| runs_on(a, (*major, *minor)));
        details.push(format!(
            "GPU {index}: compute capability {major}.{minor}: {}",
            how.unwrap_or("no code for it")
        ));
        match how {
            None => missing.push(format!("GPU {index} (sm_{major}{minor})")),
            Some("PTX JIT") => jit.push(format!("GPU {index} (sm_{major}{minor})")),
            Some(_) => {}
        }
    }
    let fix = |sm: &str| {
        format!(
            "build the image for this GPU too: add \"{sm}\" to stack.toml's nvshmem.cuda-archs (or `--cuda-archs`) and run `cargo xtask build`"
        )
    };
    let first_sm = |list: &[String]| {
        list.first()
            .and_then(|g| g.split("(sm_").nth(1))
            .map(|s| s.trim_end_matches(')').to_string())
            .unwrap_or_default()
    };
    if !missing.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!(
                "{} cannot run the image's kernels: built for {built}",
                missing.join(", ")
            ),
        )
        .fix(fix(&first_sm(&missing)))
        .details(details);
    }
    if !jit.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!(
                "{}: no SASS in the image (built for {built}); the driver compiles its PTX at start-up",
                jit.join(", ")
            ),
        )
        .fix(fix(&first_sm(&jit)))
        .details(details);
    }
    Check::new(
        ID,
        TITLE,
        Status::Pass,
        format!(
            "{} GPU(s), each with SASS in the image (built for {built})",
            caps.len()
        ),
    )
    .details(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(s: &str) -> CudaArch {
        s.parse().unwrap()
    }

    #[test]
    fn sass_ptx_and_the_variants() {
        assert_eq!(runs_on(&arch("90"), (9, 0)), Some("SASS"));
        assert_eq!(runs_on(&arch("80"), (8, 6)), Some("SASS"));
        assert_eq!(runs_on(&arch("90"), (10, 0)), Some("PTX JIT"));
        assert_eq!(runs_on(&arch("90-real"), (10, 0)), None);
        assert_eq!(runs_on(&arch("90a"), (9, 0)), Some("SASS"));
        assert_eq!(runs_on(&arch("90a"), (10, 0)), None);
        assert_eq!(runs_on(&arch("100f"), (10, 3)), Some("SASS"));
        assert_eq!(runs_on(&arch("100f"), (12, 0)), None);
        assert_eq!(runs_on(&arch("100"), (9, 0)), None);
        assert_eq!(runs_on(&arch("90-virtual"), (9, 0)), Some("PTX JIT"));
    }
}
