//! Fixtures from real parts: shared objects compiled with gcc (an NVSHMEM-like host
//! library carrying the build-variable string, an NCCL answering ncclGetVersion, a torch
//! whose library needs both, a libcuda stub), real wheels written with commstack-wheel,
//! real venvs made by this machine's python3.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use commstack_deepep::LockedWheel;
use commstack_wheel::WheelBuilder;

pub use commstack_testkit::native::{compile as cc, shared_lib};

/// NVSHMEM's build-variable and vendor strings, as NVSHMEM's host library carries them,
/// and the one symbol DeepEP's loader looks for.
pub fn nvshmem_like_source(use_nccl: &str, version: &str) -> String {
    commstack_testkit::native::nvshmem_like_source(
        use_nccl,
        version,
        "int nvshmemx_my_pe(void) { return 0; }",
    )
}

pub fn nvshmem_host_lib(dir: &Path, use_nccl: &str, version: &str) -> PathBuf {
    shared_lib(
        dir,
        "libnvshmem_host.so.3",
        "libnvshmem_host.so.3",
        &nvshmem_like_source(use_nccl, version),
        &[],
    )
}

pub fn nccl_lib(dir: &Path, code: u32) -> PathBuf {
    shared_lib(
        dir,
        "libnccl.so.2",
        "libnccl.so.2",
        &format!("int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}"),
        &[],
    )
}

/// An NVSHMEM install prefix as `cmake --install` lays it out: include/nvshmem.h,
/// lib/libnvshmem_host.so -> .so.3, lib/libnvshmem_device.a.
pub fn nvshmem_prefix(root: &Path, use_nccl: &str, unversioned_link: bool) -> PathBuf {
    let lib = root.join("lib");
    nvshmem_host_lib(&lib, use_nccl, "3.4.5");
    if unversioned_link {
        std::os::unix::fs::symlink("libnvshmem_host.so.3", lib.join("libnvshmem_host.so")).unwrap();
    }
    let obj = lib.join(".src/device.o");
    cc(
        &lib.join(".src"),
        "device.c",
        "int nvshmemi_device_state_d;\n",
        &obj,
        &["-c", "-fPIC"],
    );
    let status = Command::new("ar")
        .arg("rcs")
        .arg(lib.join("libnvshmem_device.a"))
        .arg(&obj)
        .status()
        .expect("ar");
    assert!(status.success());
    std::fs::remove_dir_all(lib.join(".src")).unwrap();
    std::fs::create_dir_all(root.join("include")).unwrap();
    // A header that expands __FILE__, as NVSHMEM's error macros do: its path reaches the
    // objects that include it.
    std::fs::write(
        root.join("include/nvshmem.h"),
        "int nvshmemx_my_pe(void);\nstatic inline const char *nvshmem_header_file(void) { return __FILE__; }\n",
    )
    .unwrap();
    root.to_path_buf()
}

/// A libcuda link stub with the driver's SONAME, as the toolchain makes one.
pub fn libcuda_stub(dir: &Path) -> PathBuf {
    shared_lib(
        dir,
        "libcuda.so",
        "libcuda.so.1",
        "int cuInit(unsigned f) { return 34; }\nint cuDriverGetVersion(int *v) { return 34; }\n",
        &[],
    )
}

/// Write a wheel: `files` are (path inside, bytes, executable).
pub fn wheel(
    out: &Path,
    name: &str,
    version: &str,
    tag: (&str, &str, &str),
    purelib: bool,
    requires: &[&str],
    files: &[(&str, Vec<u8>)],
) -> LockedWheel {
    let mut b = WheelBuilder::new(name, version)
        .unwrap()
        .root_is_purelib(purelib)
        .tag(tag.0, tag.1, tag.2);
    for r in requires {
        b = b.metadata("Requires-Dist", r);
    }
    for (path, bytes) in files {
        b.add_bytes(path, bytes.clone(), false).unwrap();
    }
    let written = b.write(out).unwrap();
    LockedWheel::from_file(&written.path).unwrap()
}

pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `cp311` for the python3 running the tests.
pub fn python_tag() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print('cp%d%d' % sys.version_info[:2])"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `3.11` for the python3 running the tests.
pub fn python_minor() -> String {
    let t = python_tag();
    format!("{}.{}", &t[2..3], &t[3..])
}

pub fn python3() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A venv with `--without-pip` (fast) or with pip.
pub fn venv(dir: &Path, with_pip: bool) -> PathBuf {
    let mut cmd = Command::new(python3());
    cmd.args(["-m", "venv"]);
    if !with_pip {
        cmd.arg("--without-pip");
    }
    let status = cmd.arg(dir).env_remove("PYTHONPATH").status().unwrap();
    assert!(status.success(), "python3 -m venv {}", dir.display());
    dir.join("bin/python")
}

/// Run pip in a venv with no configuration of this machine (PIP_FIND_LINKS, pip.conf).
pub fn pip(python: &Path, args: &[&str]) -> std::process::Output {
    Command::new(python)
        .args(["-m", "pip"])
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", std::env::temp_dir())
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .unwrap()
}

/// The fake stack's libraries and wheels.
pub struct FakeStack {
    pub torch: LockedWheel,
    pub nccl: LockedWheel,
    /// NVIDIA's: NVSHMEM_USE_NCCL=ON.
    pub nvidia_nvshmem: LockedWheel,
    /// Ours: NVSHMEM_USE_NCCL=OFF, `3.4.5+commstack.gabc1234`.
    pub dropin: LockedWheel,
    pub deepep: LockedWheel,
    /// A deep_ep that also loads its own NCCL (the V2 override trap).
    pub deepep_second_nccl: LockedWheel,
}

/// torch's wheel needs libnccl.so.2 and libnvshmem_host.so.3 through an RPATH into
/// nvidia/*/lib (as the real one), so it maps whatever NVSHMEM is installed there.
pub fn fake_stack(root: &Path) -> FakeStack {
    let libs = root.join("libs");
    let nccl = nccl_lib(&libs.join("nccl"), 22809);
    let nccl_other = nccl_lib(&libs.join("nccl-2.30.7"), 23007);
    let theirs = nvshmem_host_lib(&libs.join("nvidia-nvshmem"), "ON", "3.4.5");
    let ours = nvshmem_host_lib(&libs.join("ours-nvshmem"), "OFF", "3.4.5");
    let l_nccl = format!("-L{}", libs.join("nccl").display());
    let l_nvshmem = format!("-L{}", libs.join("ours-nvshmem").display());
    let torch_so = shared_lib(
        &libs.join("torch"),
        "libtorch_fake.so",
        "libtorch_fake.so",
        "int torch_fake(void) { return 0; }",
        &[
            &l_nccl,
            &l_nvshmem,
            "-Wl,--no-as-needed",
            "-l:libnccl.so.2",
            "-l:libnvshmem_host.so.3",
            "-Wl,--disable-new-dtags",
            "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib:$ORIGIN/../../nvidia/nvshmem/lib",
        ],
    );
    let tag = python_tag();
    let ext = format!(
        "deep_ep_cpp.{}-x86_64-linux-gnu.so",
        tag.replace("cp", "cpython-")
    );
    let deepep_so = shared_lib(
        &libs.join("deepep"),
        &ext,
        &ext,
        "int nvshmemx_my_pe(void);\nint deep_ep_rank(void) { return nvshmemx_my_pe(); }\n",
        &[&l_nvshmem, "-Wl,--no-as-needed", "-l:libnvshmem_host.so.3"],
    );
    let wheels = root.join("wheels");
    let torch_init = br#"
import ctypes as _ctypes, os as _os
_ctypes.CDLL(_os.path.join(_os.path.dirname(__file__), "lib", "libtorch_fake.so"), mode=_ctypes.RTLD_GLOBAL)
from torch.version import __version__
from torch import version
class cuda:
    class nccl:
        @staticmethod
        def version():
            return (2, 28, 9)
"#;
    let torch = wheel(
        &wheels,
        "torch",
        "2.11.0",
        (tag.as_str(), tag.as_str(), "linux_x86_64"),
        false,
        &[
            "nvidia-nccl-cu13==2.28.9; platform_system == \"Linux\"",
            "nvidia-nvshmem-cu13==3.4.5; platform_system == \"Linux\"",
        ],
        &[
            ("torch/__init__.py", torch_init.to_vec()),
            (
                "torch/version.py",
                b"__version__ = '2.11.0'\ncuda = '13.0'\ngit_version = 'fake'\n".to_vec(),
            ),
            ("torch/lib/libtorch_fake.so", read(&torch_so)),
        ],
    );
    let nccl_w = wheel(
        &wheels,
        "nvidia-nccl-cu13",
        "2.28.9",
        ("py3", "none", "manylinux_2_17_x86_64"),
        true,
        &[],
        &[
            ("nvidia/nccl/lib/libnccl.so.2", read(&nccl)),
            (
                "nvidia/nccl/include/nccl.h",
                b"#define NCCL_MAJOR 2\n".to_vec(),
            ),
        ],
    );
    let nvidia = wheel(
        &wheels,
        "nvidia-nvshmem-cu13",
        "3.4.5",
        ("py3", "none", "manylinux_2_17_x86_64"),
        true,
        &[],
        &[
            ("nvidia/nvshmem/lib/libnvshmem_host.so.3", read(&theirs)),
            (
                "nvidia/nvshmem/include/nvshmem.h",
                b"/* NVIDIA's */\n".to_vec(),
            ),
        ],
    );
    let dropin_dir = root.join("dropin");
    let dropin = wheel(
        &dropin_dir,
        "nvidia-nvshmem-cu13",
        "3.4.5+commstack.gabc1234",
        ("py3", "none", "manylinux_2_17_x86_64"),
        true,
        &[],
        &[
            ("nvidia/nvshmem/lib/libnvshmem_host.so.3", read(&ours)),
            ("nvidia/nvshmem/include/nvshmem.h", b"/* ours */\n".to_vec()),
        ],
    );
    // The extension is mapped with ctypes (a real one would be imported: PyInit_* needs
    // Python's headers, which CI machines may lack); the loader resolves its
    // libnvshmem_host.so.3 the same way.
    let load_ext = format!(
        "import torch\nimport ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(os.path.dirname(__file__)), {ext:?}))\n"
    );
    let deepep_init = format!("{load_ext}__version__ = '1.2.1'\n").into_bytes();
    let deepep = wheel(
        &root.join("deepep"),
        "deep_ep",
        "1.2.1",
        (tag.as_str(), tag.as_str(), "linux_x86_64"),
        false,
        &[],
        &[
            ("deep_ep/__init__.py", deepep_init.clone()),
            (&ext, read(&deepep_so)),
        ],
    );
    let second = format!(
        "{load_ext}ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'nccl', 'libnccl.so.2'))\n__version__ = '1.2.1'\n"
    );
    let deepep_second_nccl = wheel(
        &root.join("deepep-v2-override"),
        "deep_ep",
        "1.2.1",
        (tag.as_str(), tag.as_str(), "linux_x86_64"),
        false,
        &[],
        &[
            ("deep_ep/__init__.py", second.into_bytes()),
            ("deep_ep/nccl/libnccl.so.2", read(&nccl_other)),
            (&ext, read(&deepep_so)),
        ],
    );
    FakeStack {
        torch,
        nccl: nccl_w,
        nvidia_nvshmem: nvidia,
        dropin,
        deepep,
        deepep_second_nccl,
    }
}

/// A lock for the fake stack: torch 2.11.0, NCCL 2.28.9, NVSHMEM 3.4.5 (NVIDIA's wheel
/// replaced by the stack's build), for this machine's python3.
pub fn fake_lock(packages: &[(&LockedWheel, bool)]) -> commstack_stack::Lock {
    use commstack_stack::lock::{Inputs, LOCK_VERSION, Resolved, Wheel};
    commstack_stack::Lock {
        version: LOCK_VERSION,
        inputs: Inputs {
            stack: "sha256:fixture".into(),
            rules: commstack_stack::rules::fingerprint(),
            resolver: "fixture".into(),
            index_url: "http://127.0.0.1/simple".into(),
            exclude_newer: None,
        },
        resolved: Resolved {
            python_tag: python_tag(),
            platform: "manylinux_2_39_x86_64".into(),
            torch: "2.11.0".into(),
            cuda: "13.0.2".into(),
            nccl: "nvidia-nccl-cu13==2.28.9".parse().unwrap(),
            nccl_override: None,
            nvshmem_pin: Some("nvidia-nvshmem-cu13==3.4.5".parse().unwrap()),
            nvshmem: "3.4.5".into(),
            deepep_rev: "567632dd59810d77b3cc05553df953cc0f779799".into(),
            deepep_api: commstack_stack::manifest::DeepEpApi::V1,
        },
        manifest: Default::default(),
        rules: vec![],
        sources: vec![],
        packages: packages
            .iter()
            .map(|(w, replaced)| Wheel {
                name: w.name.clone(),
                version: w.version.clone(),
                filename: w.filename.clone(),
                url: format!("http://127.0.0.1/files/{}", w.filename),
                sha256: w.sha256.clone(),
                size: std::fs::metadata(&w.path).map(|m| m.len()).unwrap_or(0),
                requires: vec![],
                replaced_by: replaced.then(|| "nvshmem".to_string()),
            })
            .collect(),
        toolchain: vec![],
        base: None,
        debs: Vec::new(),
    }
}

/// The tree hash of a directory (files, modes, symlinks; not directories or times).
pub fn tree(dir: &Path) -> String {
    commstack_fetch::tree::tree_sha256_dir(dir).unwrap()
}
