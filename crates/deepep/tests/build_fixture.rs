//! The build recipe against a fixture source that follows DeepEP V1's setup.py contract:
//! it reads NVSHMEM_DIR and links `-l:libnvshmem_host.so -l:libnvshmem_device.a -lcuda`
//! with an rpath to NVSHMEM_DIR/lib, includes <cuda/std/tuple> (only the cccl directory
//! has it), and records the environment it saw in the wheel. Real gcc, real python,
//! real store; a real DeepEP needs torch (2.7 GB) and is built on the GPU machine.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use commstack_deepep::build::{BuildRequest, PythonTarget, build};
use commstack_deepep::{NvshmemInput, SourceInput};
use commstack_exec::CommandFailed;
use commstack_stack::CudaArch;
use commstack_stack::manifest::DeepEpApi;
use commstack_store::Store;
use commstack_toolchain::{ToolVersions, Toolchain, ToolchainSource};
use commstack_wheel::{InstallLayout, install};

const SETUP_PY: &str = r#"
# A fixture following DeepEP V1's setup.py contract (567632d), without torch's compiler:
# the flags as setuptools and cpp_extension give them (Python's -g, then CPPFLAGS; LDFLAGS
# on the link; absolute source paths; torch's include directory from torch.__file__), and
# a wheel written as carelessly as a tool may (file modes from the umask, times from the
# files, directory order).
import json, os, shlex, subprocess, sys, zipfile
assert sys.argv[1] == "bdist_wheel", sys.argv
dist = sys.argv[sys.argv.index("--dist-dir") + 1]
nv = os.environ["NVSHMEM_DIR"]
import torch
# As torch's build_ext leaves it when it compiles through ninja: build/temp.<plat>/.ninja_log.
ninja_dir = os.path.abspath("build/temp.fixture")
os.makedirs(ninja_dir, exist_ok=True)
with open(os.path.join(ninja_dir, ".ninja_log"), "w") as f:
    f.write('# ninja log v5\n0\t25\t0\t%s/ext.o\t1f2e\n' % ninja_dir)
torch_include = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "include")
tag = "cp%d%d" % sys.version_info[:2]
ext = "deep_ep_cpp.cpython-%d%d-x86_64-linux-gnu.so" % sys.version_info[:2]
sources = ["csrc/ext.c"] + (["csrc/broken.c"] if os.path.exists("csrc/broken.c") else [])
sources = [os.path.abspath(s) for s in sources]
env = lambda k: shlex.split(os.environ.get(k, ""))
tree = os.path.abspath("build/tree")
os.makedirs(os.path.join(tree, "deep_ep"), exist_ok=True)
subprocess.check_call([os.environ["CC"], "-g", "-O1"] + env("CPPFLAGS") + ["-shared", "-fPIC", "-o", os.path.join(tree, ext)] + sources + [
    "-I" + nv + "/include", "-I" + torch_include] + env("LDFLAGS") + ["-L" + nv + "/lib", "-Wl,--no-as-needed",
    "-l:libnvshmem_host.so", "-l:libnvshmem_device.a", "-lcuda", "-lstdc++", "-Wl,-rpath," + nv + "/lib"])
files = {
    "deep_ep/__init__.py": b"import torch\n",
    "deep_ep/build_env.json": json.dumps(sorted(os.environ)).encode(),
}
if os.path.exists("SHIP_STUB"):
    files["deep_ep/libcuda.so"] = open(os.path.join(os.environ["LIBRARY_PATH"], "libcuda.so"), "rb").read()
info = "deep_ep-1.2.1.dist-info"
files[info + "/METADATA"] = b"Metadata-Version: 2.1\nName: deep_ep\nVersion: 1.2.1\n"
files[info + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: fixture\nRoot-Is-Purelib: false\nTag: %s-%s-linux_x86_64\n" % (tag, tag)).encode()
for name, data in files.items():
    os.makedirs(os.path.dirname(os.path.join(tree, name)), exist_ok=True)
    with open(os.path.join(tree, name), "wb") as f:
        f.write(data)
import base64, hashlib
record = ""
names = []
for d, _, fs in os.walk(tree):
    for f in fs:
        names.append(os.path.relpath(os.path.join(d, f), tree))
for name in names:
    data = open(os.path.join(tree, name), "rb").read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += "%s,sha256=%s,%d\n" % (name, digest, len(data))
with open(os.path.join(tree, info, "RECORD"), "w") as f:
    f.write(record + info + "/RECORD,,\n")
os.makedirs(dist, exist_ok=True)
with zipfile.ZipFile(os.path.join(dist, "deep_ep-1.2.1-%s-%s-linux_x86_64.whl" % (tag, tag)), "w") as z:
    for name in names + [info + "/RECORD"]:
        z.write(os.path.join(tree, name), name)
"#;

const EXT_C: &str = r#"
#include <cuda/std/tuple>
#include <nvshmem.h>
#include <torch/check.h>
int cuInit(unsigned flags);
int deep_ep_init(void) { return COMMSTACK_CCCL_TUPLE + nvshmemx_my_pe() + cuInit(0); }
/* __FILE__ of the source and of a header from each input (toolchain, NVSHMEM, torch). */
const char *deep_ep_where(void) { return __FILE__; }
const char *deep_ep_headers(int i) {
    return i == 0 ? cccl_tuple_file() : i == 1 ? nvshmem_header_file() : torch_check_file();
}
#ifdef COMMSTACK_DUP_TWICE
int deep_ep_dup_included_twice = 1;
#else
int deep_ep_dup_included_twice = 0;
#endif
"#;

const DUP_H: &[u8] = b"#pragma once\n#ifdef COMMSTACK_DUP_SEEN\n#define COMMSTACK_DUP_TWICE 1\n#endif\n#define COMMSTACK_DUP_SEEN 1\n";

/// Sets the times of the two copies of dup.h in the fixture's torch: the same second, or
/// an hour apart (pip writing them across a second boundary).
fn set_dup_times(f: &Fixture, apart: bool) {
    let site = f.python.env.site_packages();
    let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    for (name, t) in [
        ("first", t0),
        (
            "second",
            if apart {
                t0 - std::time::Duration::from_secs(3600)
            } else {
                t0
            },
        ),
    ] {
        let path = site.join(format!("torch/include/torch/{name}/dup.h"));
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
}

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
/// the libcuda stub, in a step directory as the wheel toolchain has one (so its identity
/// names no path). nvcc is not called by the fixture.
fn toolchain(root: &Path) -> Toolchain {
    let step = root.join("toolchain");
    let home = step.join("cuda");
    let include = home.join("include");
    std::fs::create_dir_all(include.join("cccl/cuda/std")).unwrap();
    std::fs::write(
        include.join("cccl/cuda/std/tuple"),
        "#define COMMSTACK_CCCL_TUPLE 0\nstatic inline const char *cccl_tuple_file(void) { return __FILE__; }\n",
    )
    .unwrap();
    let stubs = home.join("lib/stubs");
    libcuda_stub(&stubs);
    Toolchain {
        source: ToolchainSource::Wheels {
            wheels: Vec::new(),
            step,
        },
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
            // As TORCH_CHECK does: __FILE__ of torch's own header.
            (
                "torch/include/torch/check.h",
                b"#include \"first/dup.h\"\n#include \"second/dup.h\"\nstatic inline const char *torch_check_file(void) { return __FILE__; }\n"
                    .to_vec(),
            ),
            // Two copies of one `#pragma once` header, as torch's and the CUDA wheels'
            // include trees have many: gcc includes the second only when its mtime
            // differs from the first's.
            ("torch/include/torch/first/dup.h", DUP_H.to_vec()),
            ("torch/include/torch/second/dup.h", DUP_H.to_vec()),
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
        nccl_dropin: None,
        rdma_core: None,
        allow_second_nccl: false,
        source_date_epoch: 1_796_083_200,
        home: Some(&f.root),
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
    // The build's ninja log (torch's build_ext) is kept with the step's logs.
    let kept = built
        .outcome
        .path()
        .join("logs/ninja/temp.fixture.ninja_log");
    assert!(
        std::fs::read_to_string(&kept)
            .unwrap()
            .starts_with("# ninja log v5"),
        "{}",
        kept.display()
    );
    let r = &built.report;
    assert_eq!(r.rdc_fix, Some(true));
    assert_eq!(r.torch_cuda_arch_list, "9.0");
    // NVSHMEM seen through a link in the fixed build directory.
    let fixed = &r.reproducibility.fixed_build_dir;
    assert!(
        fixed.starts_with(commstack_store::FIXED_BUILD_ROOT),
        "{fixed:?}"
    );
    assert_eq!(
        r.environment.vars["NVSHMEM_DIR"],
        fixed.join("deps/nvshmem").display().to_string()
    );
    let nv = r
        .reproducibility
        .relocated
        .iter()
        .find(|x| x.name == "nvshmem")
        .unwrap();
    assert_eq!(nv.target, f.nvshmem.prefix.canonicalize().unwrap());
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
    // The report holds the sha256 of the wheel and of every file in it.
    assert_eq!(
        r.wheel.sha256,
        commstack_digest::sha256_file(&built.wheel).unwrap()
    );
    assert_eq!(r.wheel.file_sha256.keys().cloned().collect::<Vec<_>>(), {
        let mut f = r.wheel.files.clone();
        f.sort();
        f
    });
    assert_eq!(
        r.wheel.file_sha256[&r.wheel.extension],
        r.wheel.extension_sha256
    );
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
    // On CPATH through the fixed directory's link; keyed by content, not by the path.
    let r = &built.report;
    let link = r.reproducibility.fixed_build_dir.join("deps/rdma-core");
    assert!(
        r.environment.vars["CPATH"]
            .split(':')
            .any(|d| Path::new(d) == link),
        "{:?}",
        r.environment.vars
    );
    assert!(
        r.reproducibility
            .relocated
            .iter()
            .any(|x| x.link == link && x.target.ends_with("rdma-core/usr/include")),
        "{:?}",
        r.reproducibility.relocated
    );
    assert!(r.rdma_core.is_some());
    let inputs = commstack_deepep::build_key(&req).unwrap().1;
    assert!(
        !inputs.to_string().contains(&f.root.display().to_string()),
        "the key names no path of this machine: {inputs}"
    );

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
        failed.stderr_tail.iter().any(|l| l.contains("error:")),
        "{:?}",
        failed.stderr_tail
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
    // Its ninja log too, beside it.
    let ninja = Path::new(log)
        .with_file_name("ninja")
        .join("temp.fixture.ninja_log");
    assert!(ninja.is_file(), "{} is kept", ninja.display());

    // A setup.py that would ship the libcuda stub: the wheel check stops it.
    let leaky = source(&f.root, "leaky", CONFIGS_CUH_FIXED, &[("SHIP_STUB", "")]);
    let err = format!(
        "{:#}",
        build(&f.store, &request(&f, &leaky, &f.nvshmem, &archs), false).unwrap_err()
    );
    assert!(err.contains("must never ship"), "{err}");
}

/// What the helper process reports about its build.
#[derive(serde::Serialize, serde::Deserialize)]
struct ChildBuild {
    key: String,
    root: PathBuf,
    wheel: PathBuf,
    bdist_wheel_sha256: String,
    file_sha256: std::collections::BTreeMap<String, String>,
}

const CHILD_OUT: &str = "COMMSTACK_TEST_REPRO_OUT";

/// Issue 17: the same key gives the same wheel whatever varies between two machines or
/// two runs. Build A runs here; build B in another process (this test binary, the helper
/// below) with its own temp root (so another store, home, toolchain, venv, NVSHMEM and
/// source path), other jobs, umask 077, another TZ, locale and SOURCE_DATE_EPOCH in its
/// environment, and its torch's two copies of a `#pragma once` header an hour apart. The two wheels must be byte-identical; the extension's RUNPATH must
/// be `$ORIGIN/nvidia/nvshmem/lib`; no file may name either root or the build directory.
/// What bdist_wheel itself wrote must differ (the umask reaches its file modes): proof
/// that the variations were real and that the recipe, not chance, made the bytes equal.
#[test]
fn the_same_key_gives_the_same_wheel_whatever_the_machine_varies() {
    let a = fixture();
    set_dup_times(&a, false);
    let src = source(&a.root, "src", CONFIGS_CUH_FIXED, &[]);
    let archs: Vec<CudaArch> = vec!["90".parse().unwrap()];
    let mut req = request(&a, &src, &a.nvshmem, &archs);
    req.jobs = 1;
    let built_a = build(&a.store, &req, true).unwrap();

    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("child.json");
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 077; exec \"$0\" \"$@\"")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "repro_helper_builds_the_fixture_in_another_process",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_OUT, &report)
        .env("TZ", "Pacific/Chatham")
        .env("LC_ALL", "de_DE.UTF-8")
        .env("LANG", "tr_TR.UTF-8")
        .env("SOURCE_DATE_EPOCH", "1")
        .output()
        .unwrap();
    assert!(
        child.status.success() && report.is_file(),
        "the helper build failed: {}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    let b: ChildBuild = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();

    assert_ne!(a.root, b.root);
    assert_eq!(
        built_a.key.hash,
        b.key,
        "the two builds must have the same step key (inputs: {})",
        serde_json::to_string_pretty(&commstack_deepep::build_key(&req).unwrap().1).unwrap()
    );
    assert_ne!(
        built_a.report.reproducibility.bdist_wheel_sha256, b.bdist_wheel_sha256,
        "bdist_wheel's own output should differ between the two (umask): the variations did not reach the build"
    );
    let bytes_a = std::fs::read(&built_a.wheel).unwrap();
    let bytes_b = std::fs::read(&b.wheel).unwrap();
    if bytes_a != bytes_b {
        let differ: Vec<&String> = built_a
            .report
            .wheel
            .file_sha256
            .iter()
            .filter(|(k, v)| b.file_sha256.get(*k) != Some(v))
            .map(|(k, _)| k)
            .collect();
        panic!(
            "the wheels differ ({} vs {}); files that differ: {differ:?}",
            built_a.wheel.display(),
            b.wheel.display()
        );
    }
    assert_eq!(built_a.report.wheel.file_sha256, b.file_sha256);

    // The RUNPATH is the drop-in's place, relative to the extension; no RPATH.
    let r = &built_a.report.wheel;
    assert_eq!(r.runpath, ["$ORIGIN/nvidia/nvshmem/lib"], "{r:?}");
    assert!(r.rpath.is_empty(), "{r:?}");

    // No file names a build path: read here, independently of the build's own scan.
    let needles = [
        a.root.display().to_string(),
        b.root.display().to_string(),
        commstack_store::FIXED_BUILD_ROOT.to_string(),
    ];
    let mut z = zip::ZipArchive::new(std::fs::File::open(&built_a.wheel).unwrap()).unwrap();
    let mut saw_mapped = false;
    for i in 0..z.len() {
        let mut e = z.by_index(i).unwrap();
        let name = e.name().unwrap().to_string();
        assert_eq!(
            e.last_modified().map(|t| (t.year(), t.month(), t.day())),
            Some((2026, 12, 1)),
            "{name}: every time is SOURCE_DATE_EPOCH"
        );
        let mode = e.unix_mode().unwrap() & 0o777;
        assert!(mode == 0o644 || mode == 0o755, "{name}: mode {mode:o}");
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut bytes).unwrap();
        for n in &needles {
            assert!(
                !bytes.windows(n.len()).any(|w| w == n.as_bytes()),
                "{name} names {n}"
            );
        }
        // The extension still knows its files by their mapped names (DWARF, __FILE__).
        if name == r.extension {
            let has = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
            saw_mapped = has("./csrc/ext.c")
                && has("nvshmem/include/nvshmem.h")
                && has("toolchain/cuda/include/cccl/cuda/std/tuple")
                && has("site-packages/torch/include/torch/check.h");
        }
    }
    assert!(
        saw_mapped,
        "the extension should name its sources by their mapped paths"
    );
    // The build's own scan looked for both machine-dependent roots it knows of (the
    // store, COMMSTACK_HOME) and kept no fixed-directory path (the fixture has no nvlink).
    let scanned = &built_a.report.wheel.scanned_for;
    for p in [a.store.root(), a.root.as_path()] {
        assert!(
            scanned.contains(&p.display().to_string()),
            "{p:?} not in {scanned:?}"
        );
    }
    assert!(
        built_a.report.wheel.build_paths_kept.is_empty(),
        "{:?}",
        built_a.report.wheel.build_paths_kept
    );
}

/// Build B of the test above; does nothing unless that test runs it.
#[test]
#[ignore = "run by the_same_key_gives_the_same_wheel_whatever_the_machine_varies, in a process of its own"]
fn repro_helper_builds_the_fixture_in_another_process() {
    let Some(out) = std::env::var_os(CHILD_OUT).map(PathBuf::from) else {
        return;
    };
    let f = fixture();
    set_dup_times(&f, true);
    let src = source(&f.root, "src", CONFIGS_CUH_FIXED, &[]);
    let archs: Vec<CudaArch> = vec!["90".parse().unwrap()];
    let mut req = request(&f, &src, &f.nvshmem, &archs);
    req.jobs = 3;
    let built = build(&f.store, &req, true).unwrap();
    let keep = out.with_extension("whl");
    std::fs::copy(&built.wheel, &keep).unwrap();
    let report = ChildBuild {
        key: built.key.hash.clone(),
        root: f.root.clone(),
        wheel: keep,
        bdist_wheel_sha256: built.report.reproducibility.bdist_wheel_sha256.clone(),
        file_sha256: built.report.wheel.file_sha256.clone(),
    };
    std::fs::write(&out, serde_json::to_vec(&report).unwrap()).unwrap();
}
