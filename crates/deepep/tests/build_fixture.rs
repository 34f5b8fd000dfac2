//! The build recipe against a fixture source that follows DeepEP V1's setup.py contract:
//! it reads NVSHMEM_DIR and links `-l:libnvshmem_host.so -l:libnvshmem_device.a -lcuda`
//! with an rpath to NVSHMEM_DIR/lib, includes <cuda/std/tuple> (only the cccl directory
//! has it), and records the environment it saw in the wheel. Real gcc, real python,
//! real store; a real DeepEP needs torch (2.7 GB) and is built on the GPU machine.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use commstack_deepep::build::{BuildRequest, PythonTarget, build};
use commstack_deepep::run::CommandFailed;
use commstack_deepep::{NvshmemInput, SourceInput};
use commstack_stack::CudaArch;
use commstack_stack::manifest::DeepEpApi;
use commstack_store::Store;
use commstack_toolchain::{ToolVersions, Toolchain, ToolchainSource};
use commstack_wheel::{InstallLayout, install};

const SETUP_PY: &str = r#"
# A fixture following DeepEP V1's setup.py contract (567632d), without torch.
import base64, hashlib, json, os, subprocess, sys, zipfile
assert sys.argv[1] == "bdist_wheel", sys.argv
dist = sys.argv[sys.argv.index("--dist-dir") + 1]
nv = os.environ["NVSHMEM_DIR"]
tag = "cp%d%d" % sys.version_info[:2]
ext = "deep_ep_cpp.cpython-%d%d-x86_64-linux-gnu.so" % sys.version_info[:2]
os.makedirs("build", exist_ok=True)
sources = ["csrc/ext.c"] + (["csrc/broken.c"] if os.path.exists("csrc/broken.c") else [])
subprocess.check_call([os.environ["CC"], "-shared", "-fPIC", "-O1", "-o", "build/" + ext] + sources + [
    "-I" + nv + "/include", "-L" + nv + "/lib", "-Wl,--no-as-needed",
    "-l:libnvshmem_host.so", "-l:libnvshmem_device.a", "-lcuda", "-Wl,-rpath," + nv + "/lib"])
files = {
    "deep_ep/__init__.py": b"import torch\n",
    "deep_ep/build_env.json": json.dumps(sorted(os.environ)).encode(),
    ext: open("build/" + ext, "rb").read(),
}
if os.path.exists("SHIP_STUB"):
    files["deep_ep/libcuda.so"] = open(os.path.join(os.environ["LIBRARY_PATH"], "libcuda.so"), "rb").read()
info = "deep_ep-1.2.1.dist-info"
files[info + "/METADATA"] = b"Metadata-Version: 2.1\nName: deep_ep\nVersion: 1.2.1\n"
files[info + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: fixture\nRoot-Is-Purelib: false\nTag: %s-%s-linux_x86_64\n" % (tag, tag)).encode()
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += "%s,sha256=%s,%d\n" % (name, digest, len(data))
files[info + "/RECORD"] = (record + info + "/RECORD,,\n").encode()
os.makedirs(dist, exist_ok=True)
with zipfile.ZipFile(os.path.join(dist, "deep_ep-1.2.1-%s-%s-linux_x86_64.whl" % (tag, tag)), "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
"#;

const EXT_C: &str = r#"
#include <cuda/std/tuple>
#include <nvshmem.h>
int cuInit(unsigned flags);
int deep_ep_init(void) { return COMMSTACK_CCCL_TUPLE + nvshmemx_my_pe() + cuInit(0); }
"#;

const CONFIGS_CUH_FIXED: &str = "#pragma once\n#ifndef DISABLE_NVSHMEM\n#ifndef __CUDACC_RDC__\n#define __CUDACC_RDC__\n#endif\n#endif\n";

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    toolchain: Toolchain,
    python: PythonTarget,
    nvshmem: NvshmemInput,
    store: Store,
}

fn which(tool: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(tool))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("the tests need {tool} on PATH"))
}

/// A CUDA 13 "toolkit" with what the build reads of it: the cccl include directory and
/// the libcuda stub. nvcc is not called by the fixture.
fn toolchain(root: &Path) -> Toolchain {
    let home = root.join("cuda");
    let include = home.join("include");
    std::fs::create_dir_all(include.join("cccl/cuda/std")).unwrap();
    std::fs::write(
        include.join("cccl/cuda/std/tuple"),
        "#define COMMSTACK_CCCL_TUPLE 0\n",
    )
    .unwrap();
    let stubs = home.join("lib/stubs");
    libcuda_stub(&stubs);
    Toolchain {
        source: ToolchainSource::System,
        cuda_home: home.clone(),
        nvcc: home.join("bin/nvcc"),
        cuda_include_dirs: vec![include.clone(), include.join("cccl")],
        cudart_lib_dir: home.join("lib"),
        cuda_stubs_dir: Some(stubs),
        cmake: which("gcc"),
        ninja: which("gcc"),
        cc: which("gcc"),
        cxx: which("g++"),
        versions: ToolVersions {
            nvcc: "13.0.88".into(),
            cuda: "13.0".into(),
            cmake: "-".into(),
            ninja: "-".into(),
            cc: "gcc".into(),
            cxx: "g++".into(),
        },
    }
}

/// A venv (no pip) holding a CUDA 13 torch and a `wheel` distribution: what the
/// recipe's pre-flight asks of an environment. The fixture's setup.py needs neither.
fn python_env(root: &Path) -> PythonTarget {
    let python = venv(&root.join("env"), false);
    let env = commstack_deepep::PythonEnv::probe(&python).unwrap();
    let layout = InstallLayout {
        purelib: env.paths.purelib.clone(),
        platlib: env.paths.platlib.clone(),
        scripts: env.paths.scripts.clone(),
        data: env.paths.data.clone(),
        headers: env.paths.include.clone(),
    };
    let w = root.join("wheels");
    let torch = wheel(
        &w,
        "torch",
        "2.11.0",
        ("py3", "none", "any"),
        true,
        &[],
        &[
            ("torch/__init__.py", b"".to_vec()),
            (
                "torch/version.py",
                b"__version__ = '2.11.0'\ncuda = '13.0'\n".to_vec(),
            ),
        ],
    );
    let stand_in = wheel(
        &w,
        "wheel",
        "0.45.1",
        ("py3", "none", "any"),
        true,
        &[],
        &[("wheel_stand_in/__init__.py", b"".to_vec())],
    );
    // The CUDA math libraries' headers torch's ATen includes, as the nvidia-* cu13 wheels
    // ship them (the fixture toolkit, like the compiler wheels, lacks them).
    let headers: Vec<(String, Vec<u8>)> = commstack_deepep::build::TORCH_CUDA_LIBRARY_HEADERS
        .iter()
        .map(|h| {
            (
                format!("nvidia/cu13/include/{h}"),
                format!("/* {h} */\n").into_bytes(),
            )
        })
        .collect();
    let header_refs: Vec<(&str, Vec<u8>)> = headers
        .iter()
        .map(|(p, b)| (p.as_str(), b.clone()))
        .collect();
    let libs = wheel(
        &w,
        "nvidia-cublas",
        "13.1.0.3",
        ("py3", "none", "any"),
        true,
        &[],
        &header_refs,
    );
    install(&libs.path, &layout).unwrap();
    install(&torch.path, &layout).unwrap();
    install(&stand_in.path, &layout).unwrap();
    PythonTarget::adopted(&python).unwrap()
}

fn source(root: &Path, name: &str, configs_cuh: &str, extra: &[(&str, &str)]) -> SourceInput {
    let src = root.join(name);
    std::fs::create_dir_all(src.join("csrc/kernels")).unwrap();
    std::fs::write(src.join("setup.py"), SETUP_PY).unwrap();
    std::fs::write(src.join("csrc/deep_ep.cpp"), "// V1\n").unwrap();
    std::fs::write(src.join("csrc/ext.c"), EXT_C).unwrap();
    std::fs::write(src.join("csrc/kernels/configs.cuh"), configs_cuh).unwrap();
    for (path, text) in extra {
        std::fs::write(src.join(path), text).unwrap();
    }
    SourceInput::from_path(&src, None, "567632dd59810d77b3cc05553df953cc0f779799").unwrap()
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    Fixture {
        toolchain: toolchain(&root),
        python: python_env(&root),
        nvshmem: NvshmemInput::open(&nvshmem_prefix(&root.join("nvshmem"), "OFF", true)).unwrap(),
        store: Store::open(root.join("store")).unwrap(),
        root,
        _dir: dir,
    }
}

fn request<'a>(
    f: &'a Fixture,
    src: &'a SourceInput,
    nvshmem: &'a NvshmemInput,
    archs: &'a [CudaArch],
) -> BuildRequest<'a> {
    BuildRequest {
        api: DeepEpApi::V1,
        source: src,
        nvshmem,
        python: &f.python,
        toolchain: &f.toolchain,
        cuda_archs: archs,
        jobs: 2,
        allow_missing_rdc_fix: false,
        nccl_override: None,
        rdma_core: None,
        allow_second_nccl: false,
        progress: &|_| {},
    }
}

#[test]
fn builds_in_exactly_the_computed_environment_caches_and_rebuilds_on_force() {
    let f = fixture();
    let src = source(&f.root, "src", CONFIGS_CUH_FIXED, &[]);
    let archs: Vec<CudaArch> = vec!["90".parse().unwrap()];
    let built = build(&f.store, &request(&f, &src, &f.nvshmem, &archs), false).unwrap();
    assert!(!built.outcome.was_cached());
    let r = &built.report;
    assert_eq!(r.rdc_fix, Some(true));
    assert_eq!(r.torch_cuda_arch_list, "9.0");
    assert_eq!(
        r.environment.vars["NVSHMEM_DIR"],
        f.nvshmem.prefix.display().to_string()
    );
    let cpath: Vec<&str> = r.environment.vars["CPATH"].split(':').collect();
    assert!(cpath[0].ends_with("include/cccl"), "{cpath:?}");
    assert!(
        cpath[1].ends_with("site-packages/nvidia/cu13/include"),
        "{cpath:?}"
    );
    // The process saw exactly the computed environment: nothing of cargo's or the user's.
    let wheel = commstack_wheel::Wheel::open(&built.wheel).unwrap();
    let seen: Vec<String> =
        serde_json::from_slice(&wheel.read("deep_ep/build_env.json").unwrap()).unwrap();
    let computed: Vec<String> = r.environment.vars.keys().cloned().collect();
    assert_eq!(seen, computed);
    assert!(
        std::env::vars().any(|(k, _)| k.starts_with("CARGO")),
        "the test process has CARGO_* set, the build must not"
    );
    // Linked against the stack's NVSHMEM and the stub's SONAME; the stub is not shipped.
    assert!(
        r.wheel.needed.contains(&"libnvshmem_host.so.3".to_string()),
        "{:?}",
        r.wheel.needed
    );
    assert!(
        r.wheel.needed.contains(&"libcuda.so.1".to_string()),
        "{:?}",
        r.wheel.needed
    );
    assert!(r.wheel.files.iter().all(|p| !p.contains("libcuda")));
    assert!(built.outcome.path().join("logs/build.log").is_file());
    assert!(
        !built.outcome.path().join("work").exists(),
        "the build tree is removed once done"
    );

    let again = build(&f.store, &request(&f, &src, &f.nvshmem, &archs), false).unwrap();
    assert!(again.outcome.was_cached());
    assert_eq!(again.wheel, built.wheel);

    let forced = build(&f.store, &request(&f, &src, &f.nvshmem, &archs), true).unwrap();
    assert!(!forced.outcome.was_cached());

    // Another arch list is another build.
    let other: Vec<CudaArch> = vec!["100".parse().unwrap()];
    let key_a = commstack_deepep::build_key(&request(&f, &src, &f.nvshmem, &archs))
        .unwrap()
        .0;
    let key_b = commstack_deepep::build_key(&request(&f, &src, &f.nvshmem, &other))
        .unwrap()
        .0;
    assert_ne!(key_a, key_b);
}

#[test]
fn traps_are_caught_before_or_while_building_and_failures_keep_their_logs() {
    let f = fixture();
    let archs: Vec<CudaArch> = vec!["90".parse().unwrap()];
    let src = source(&f.root, "src", CONFIGS_CUH_FIXED, &[]);

    // NVSHMEM_DIR at a wheel-like directory (only libnvshmem_host.so.3): refused up front,
    // naming the link error it would cause.
    let wheel_like = nvshmem_prefix(&f.root.join("site/nvidia/nvshmem"), "OFF", false);
    let versioned_only = NvshmemInput::open(&wheel_like).unwrap();
    let err = build(&f.store, &request(&f, &src, &versioned_only, &archs), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot find -l:libnvshmem_host.so") && err.contains("pip wheel"),
        "{err}"
    );

    // NVIDIA's NCCL-on NVSHMEM is never built against.
    let nccl_on = NvshmemInput::open(&nvshmem_prefix(&f.root.join("nccl-on"), "ON", true)).unwrap();
    let err = build(&f.store, &request(&f, &src, &nccl_on, &archs), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("NVSHMEM_USE_NCCL=ON"), "{err}");
    assert!(
        std::fs::read_dir(f.store.root().join("failed"))
            .unwrap()
            .next()
            .is_none(),
        "nothing was built"
    );

    // NVSHMEM built with IBGDA: its headers include <infiniband/mlx5dv.h>. Without
    // rdma-core's headers the build is refused up front (this machine has none in
    // /usr/include); with --rdma-core they are on CPATH and in the key.
    let ibgda_prefix = nvshmem_prefix(&f.root.join("nvshmem-ibgda"), "OFF", true);
    std::fs::create_dir_all(ibgda_prefix.join("include/device_host_transport")).unwrap();
    std::fs::write(
        ibgda_prefix.join("include/device_host_transport/nvshmem_common_ibgda.h"),
        "#include <infiniband/mlx5dv.h>\n",
    )
    .unwrap();
    std::fs::write(
        ibgda_prefix.join("include/nvshmem.h"),
        "#include \"device_host_transport/nvshmem_common_ibgda.h\"\nint nvshmemx_my_pe(void);\n",
    )
    .unwrap();
    let ibgda = NvshmemInput::open(&ibgda_prefix).unwrap();
    if !Path::new("/usr/include/infiniband/mlx5dv.h").exists() {
        let err = build(&f.store, &request(&f, &src, &ibgda, &archs), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("infiniband/mlx5dv.h") && err.contains("--rdma-core"),
            "{err}"
        );
    }
    let rdma = f.root.join("rdma-core");
    std::fs::create_dir_all(rdma.join("usr/include/infiniband")).unwrap();
    std::fs::write(
        rdma.join("usr/include/infiniband/mlx5dv.h"),
        "#define MLX5DV_FIXTURE 1\n",
    )
    .unwrap();
    std::fs::write(rdma.join("usr/include/infiniband/verbs.h"), "\n").unwrap();
    std::fs::create_dir_all(rdma.join("usr/lib/x86_64-linux-gnu")).unwrap();
    std::fs::write(rdma.join("usr/lib/x86_64-linux-gnu/libmlx5.so.1"), "").unwrap();
    let mut req = request(&f, &src, &ibgda, &archs);
    req.rdma_core = Some(&rdma);
    let built = build(&f.store, &req, false).unwrap();
    assert!(
        built.report.environment.vars["CPATH"].contains("rdma-core/usr/include"),
        "{:?}",
        built.report.environment.vars
    );
    assert!(built.report.rdma_core.is_some());

    // A source without the RDC fix: decided from its real configs.cuh, at build time.
    let old = source(
        &f.root,
        "old",
        "#pragma once\n#ifndef DISABLE_NVSHMEM\n#include <nvshmem.h>\n#endif\n",
        &[],
    );
    let err = format!(
        "{:#}",
        build(&f.store, &request(&f, &old, &f.nvshmem, &archs), false).unwrap_err()
    );
    assert!(
        err.contains("multiple definition of nvshmemi_ibgda_device_state_d"),
        "{err}"
    );

    // A compile error: the first error lines and where the whole log is kept.
    let broken = source(
        &f.root,
        "broken",
        CONFIGS_CUH_FIXED,
        &[("csrc/broken.c", "int broken( {\n")],
    );
    let err = build(&f.store, &request(&f, &broken, &f.nvshmem, &archs), false).unwrap_err();
    let failed = err
        .chain()
        .find_map(|e| e.downcast_ref::<CommandFailed>())
        .expect("a CommandFailed in the chain");
    assert!(
        failed.first_errors.iter().any(|l| l.contains("error:")),
        "{:?}",
        failed.first_errors
    );
    let text = format!("{err:#}");
    let log = text
        .split("full log: ")
        .nth(1)
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .trim();
    assert!(Path::new(log).is_file(), "{log} is kept");
    assert!(log.contains("/failed/deepep-"));

    // A setup.py that would ship the libcuda stub: the wheel check stops it.
    let leaky = source(&f.root, "leaky", CONFIGS_CUH_FIXED, &[("SHIP_STUB", "")]);
    let err = format!(
        "{:#}",
        build(&f.store, &request(&f, &leaky, &f.nvshmem, &archs), false).unwrap_err()
    );
    assert!(err.contains("must never ship"), "{err}");
}
