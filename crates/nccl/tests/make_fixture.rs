//! The build step and the drop-in wheel against a real `make` run of a fixture source
//! laid out as NCCL's (a top-level `src.build` target writing BUILDDIR/lib and
//! BUILDDIR/include): the real NCCL takes 25 minutes of nvcc on two cores, and the GPU
//! machine builds it for real (gpu/run.sh step `v2-adopt`).

use std::fs;
use std::path::Path;

use commstack_nccl::{MakeRequest, build, build_dropin_wheel};
use commstack_stack::CudaArch;
use commstack_store::Store;
use commstack_wheel::Wheel;

/// A source whose make writes nccl.h for `version`, records the NVCC_GENCODE and
/// CUDA_HOME it was given, and links a library with `soname`.
fn fixture(dir: &Path, version: &str, soname: &str) {
    let [maj, min, pat]: [&str; 3] = version.split('.').collect::<Vec<_>>().try_into().unwrap();
    fs::create_dir_all(dir).unwrap();
    fs::write(
        dir.join("nccl.c"),
        "int ncclGetVersion(int *v) { *v = 23007; return 0; }\n",
    )
    .unwrap();
    fs::write(
        dir.join("Makefile"),
        format!(
            "BUILDDIR ?= build\n\
             src.build:\n\
             \tmkdir -p $(BUILDDIR)/lib $(BUILDDIR)/include/nccl_device\n\
             \tprintf '#define NCCL_MAJOR {maj}\\n#define NCCL_MINOR {min}\\n#define NCCL_PATCH {pat}\\n' > $(BUILDDIR)/include/nccl.h\n\
             \techo '$(NVCC_GENCODE) $(CUDA_HOME)' > $(BUILDDIR)/include/nccl_device/made_with.txt\n\
             \tcc -shared -fPIC -Wl,-soname,{soname} -o $(BUILDDIR)/lib/libnccl.so.{version} nccl.c\n"
        ),
    )
    .unwrap();
}

fn request<'a>(
    src: &'a Path,
    cuda: &'a Path,
    archs: &'a [CudaArch],
    progress: &'a dyn Fn(&str),
) -> MakeRequest<'a> {
    MakeRequest {
        source_dir: src,
        source_tree: "sha256:fixture",
        version: "2.30.7",
        cuda_home: cuda,
        toolchain_identity: serde_json::json!({"nvcc": "fixture"}),
        cuda_archs: archs,
        jobs: 2,
        progress,
    }
}

#[test]
fn the_locked_source_builds_once_and_ships_as_nvidias_layout_under_the_locked_version() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fixture(&src, "2.30.7", "libnccl.so.2");
    let store = Store::open(tmp.path().join("store")).unwrap();
    let archs = vec!["90".parse().unwrap()];
    let cuda = tmp.path().join("cuda");
    let quiet = |_: &str| {};
    let built = build(&store, &request(&src, &cuda, &archs, &quiet), false).unwrap();
    assert!(!built.outcome.was_cached());
    assert_eq!(built.report.soname, "libnccl.so.2");
    assert!(built.prefix.join("lib/libnccl.so.2").is_file());
    // The archs and CUDA_HOME reached NCCL's Makefile.
    let made_with =
        fs::read_to_string(built.prefix.join("include/nccl_device/made_with.txt")).unwrap();
    assert_eq!(
        made_with.trim(),
        format!("-gencode=arch=compute_90,code=sm_90 {}", cuda.display())
    );
    // The copy it built in is gone; the source was not written to.
    assert!(!built.outcome.path().join("work").exists());
    assert!(!src.join("build").exists());
    // Again: a no-op.
    let again = build(&store, &request(&src, &cuda, &archs, &quiet), false).unwrap();
    assert!(again.outcome.was_cached());

    let (wheel, _) = build_dropin_wheel(&store, &built, 13, false).unwrap();
    assert_eq!(wheel.distribution, "nvidia-nccl-cu13");
    assert_eq!(
        wheel.version,
        format!("2.30.7+commstack.g{}", &built.key.hash[..7])
    );
    assert!(
        wheel
            .filename
            .starts_with("nvidia_nccl_cu13-2.30.7+commstack.g"),
        "{}",
        wheel.filename
    );
    assert_eq!(
        wheel.files,
        [
            "nvidia/nccl/lib/libnccl.so.2",
            "nvidia/nccl/include/nccl.h",
            "nvidia/nccl/include/nccl_device/made_with.txt"
        ]
    );
    // A real wheel: its RECORD verifies.
    Wheel::open(&wheel.wheel).unwrap().verify().unwrap();
}

#[test]
fn another_version_or_soname_is_refused_and_nothing_is_left_in_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let archs = vec!["90".parse().unwrap()];
    let cuda = tmp.path().join("cuda");
    let quiet = |_: &str| {};

    let older = tmp.path().join("older");
    fixture(&older, "2.30.6", "libnccl.so.2");
    let err = format!(
        "{:#}",
        build(&store, &request(&older, &cuda, &archs, &quiet), false)
            .err()
            .unwrap()
    );
    assert!(
        err.contains("built NCCL 2.30.6") && err.contains("not the locked 2.30.7"),
        "{err}"
    );

    let soname = tmp.path().join("soname");
    fixture(&soname, "2.30.7", "libnccl.so.3");
    let err = format!(
        "{:#}",
        build(&store, &request(&soname, &cuda, &archs, &quiet), false)
            .err()
            .unwrap()
    );
    assert!(
        err.contains("\"libnccl.so.3\"") && err.contains("rule nccl-soname"),
        "{err}"
    );

    // No step output was sealed for either.
    let steps: Vec<_> = fs::read_dir(tmp.path().join("store/steps"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("nccl-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(steps.is_empty(), "{steps:?}");
}
