//! The command line's build overrides reach everything that depends on what is built:
//! verify's expectations (the image's static level and the levels in the container) and
//! the settings a GPU bundle carries to the GPU machine. Resolved once, read everywhere.

use std::path::{Path, PathBuf};

use commstack_pipeline::gpu_bundle::bundle_settings;
use commstack_steps::ctx::Ctx;
use commstack_steps::flow::verify_report::image_expectations;
use commstack_steps::options::{BuildOptions, GlobalOptions};
use commstack_steps::settings::Settings;

fn settings(home: &Path, options: BuildOptions) -> Settings {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ctx = Ctx::new(GlobalOptions {
        stack: Some(root.join("stack.toml")),
        home: Some(home.to_path_buf()),
        quiet: true,
    })
    .unwrap();
    Settings::resolve(&ctx, &options).unwrap()
}

fn flag_values<'a>(flags: &'a [String], name: &str) -> Vec<&'a str> {
    flags
        .windows(2)
        .filter(|w| w[0] == name)
        .map(|w| w[1].as_str())
        .collect()
}

#[test]
fn no_ibgda_and_cuda_archs_reach_verify_and_the_gpu_bundle() {
    let home = tempfile::tempdir().unwrap();
    let site = Path::new("/opt/venv/lib/python3.11/site-packages");

    // As stack.toml says: IBGDA on, sm_90.
    let plain = settings(home.path(), BuildOptions::default());
    let e = image_expectations(&plain, site).unwrap();
    assert_eq!(e.nvshmem_build_vars["NVSHMEM_IBGDA_SUPPORT"], "ON");
    assert_eq!(e.cuda_archs, Some([90].into()));

    let overridden = settings(
        home.path(),
        BuildOptions {
            no_ibgda: true,
            cuda_archs: vec!["100".parse().unwrap()],
            ..BuildOptions::default()
        },
    );
    let e = image_expectations(&overridden, site).unwrap();
    assert_eq!(
        e.nvshmem_build_vars["NVSHMEM_IBGDA_SUPPORT"], "OFF",
        "verify expects what --no-ibgda builds"
    );
    assert_eq!(
        e.cuda_archs,
        Some([100].into()),
        "and the archs --cuda-archs builds"
    );

    let bundle = bundle_settings(&overridden).unwrap();
    assert_eq!(flag_values(&bundle.build_flags, "--cuda-archs"), ["100"]);
    assert!(
        bundle.build_flags.iter().any(|f| f == "--no-ibgda"),
        "{:?}",
        bundle.build_flags
    );
    assert!(
        flag_values(&bundle.verify_flags, "--nvshmem-option")
            .contains(&"NVSHMEM_IBGDA_SUPPORT=OFF"),
        "{:?}",
        bundle.verify_flags
    );
    assert_eq!(flag_values(&bundle.verify_flags, "--cuda-arch"), ["100"]);
    assert!(
        flag_values(&bundle.verify_flags, "--nvshmem-prefix").is_empty(),
        "the GPU machine's environment names its own NVSHMEM"
    );

    let plain_bundle = bundle_settings(&plain).unwrap();
    assert_eq!(
        flag_values(&plain_bundle.build_flags, "--cuda-archs"),
        ["90"]
    );
    assert!(!plain_bundle.build_flags.iter().any(|f| f == "--no-ibgda"));
}

#[test]
fn the_images_preflight_expects_what_is_built() {
    use commstack_steps::flow::image::preflight_expectations;
    let home = tempfile::tempdir().unwrap();
    let plain = preflight_expectations(&settings(home.path(), BuildOptions::default())).unwrap();
    // stack.lock's CUDA 13.0.x, stack.toml's sm_90 and IBGDA, DeepEP V1.
    assert_eq!(plain.cuda, "13.0");
    assert_eq!(plain.cuda_archs, ["90".parse().unwrap()]);
    assert_eq!(plain.transports, ["ibgda"]);
    assert_eq!(plain.deepep_api.as_str(), "v1");
    let overridden = preflight_expectations(&settings(
        home.path(),
        BuildOptions {
            no_ibgda: true,
            cuda_archs: vec!["100f".parse().unwrap()],
            ..BuildOptions::default()
        },
    ))
    .unwrap();
    assert_eq!(overridden.cuda_archs, ["100f".parse().unwrap()]);
    assert!(
        overridden.transports.is_empty(),
        "--no-ibgda: no fabric transport, so the preflight defaults to one node"
    );
}
