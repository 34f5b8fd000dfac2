//! The image step's fixture stack (a tiny base, tiny wheels, the real wheelhouse step, a
//! fake lock), shared by this crate's image tests and by other crates' tests of what an
//! image carries (crates/doctor's preflight in a fixture image includes this file).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use commstack_deepep::LockedWheel;
use commstack_deepep::wheelhouse::{WheelhouseKind, assemble_wheelhouse};
use commstack_image::base::{BaseLayer, BaseManifest, BasePackage};
use commstack_image::{ImageInputs, Tool, write_layer};
use commstack_store::Store;
use commstack_wheel::WheelBuilder;

pub const EPOCH: u64 = 1_764_547_200; // 2025-12-01T00:00:00Z
/// "Large" for the fixture: torch and nccl are above it, the rest below.
pub const LARGE: u64 = 100_000;

pub fn run(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{program} is needed for this test (apt-get install docker.io skopeo umoci): {e}"
            )
        })
}

pub fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deterministic filler bytes (a "library").
pub fn blob(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The fake tool: a static binary printing who and where it runs. Built once; every
/// fixture copies the same bytes.
pub fn tool_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let src = dir.join("tool.c");
        std::fs::write(
            &src,
            "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
             int main(void){printf(\"uid=%d gid=%d home=%s path=%s\\n\",(int)getuid(),(int)getgid(),\
             getenv(\"HOME\"),getenv(\"PATH\"));return 0;}\n",
        )
        .unwrap();
        let bin = dir.join("commstack-verify");
        let status = Command::new("gcc")
            .args(["-static", "-O1", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("gcc");
        assert!(status.success());
        bin
    })
}

pub struct Fixture {
    pub _dir: tempfile::TempDir,
    pub store: Store,
    pub inputs: ImageInputs,
    pub wheels_dir: PathBuf,
}

pub fn wheel(
    out: &Path,
    name: &str,
    version: &str,
    files: &[(&str, Vec<u8>)],
    entry_points: Option<&str>,
) -> LockedWheel {
    let mut b =
        WheelBuilder::new(name, version)
            .unwrap()
            .tag("cp311", "cp311", "manylinux_2_28_x86_64");
    for (path, bytes) in files {
        b.add_bytes(
            path,
            bytes.clone(),
            path.ends_with(".so") || path.contains(".so."),
        )
        .unwrap();
    }
    if let Some(ep) = entry_points {
        b.add_dist_info_bytes("entry_points.txt", ep.as_bytes().to_vec())
            .unwrap();
    }
    let written = b.write(out).unwrap();
    LockedWheel::from_file(&written.path).unwrap()
}

/// A fixture stack in a fresh directory and store; `deepep_seed` varies the DeepEP wheel.
pub fn fixture(name: &str, deepep_seed: u8) -> Fixture {
    fixture_with(name, deepep_seed, &[])
}

/// [`fixture`] with more files in the base (host file, path in the image, its origin such
/// as `deb:libc6`): what a real binary of ours needs there (the C library).
pub fn fixture_with(
    name: &str,
    deepep_seed: u8,
    base_extra: &[(PathBuf, String, String)],
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = Store::open(root.join("store")).unwrap();

    // The base: a tiny root filesystem and its base.json.
    let tree = root.join("base-tree");
    for d in ["etc", "usr/bin", "usr/lib/python3.11", "tmp"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::write(tree.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(tree.join("etc/group"), "root:x:0:\n").unwrap();
    std::fs::write(tree.join("etc/hostname"), "commstack\n").unwrap();
    std::fs::write(tree.join("usr/bin/python3.11"), blob(1, 5000)).unwrap();
    std::fs::write(tree.join("usr/lib/python3.11/os.py"), "# os\n").unwrap();
    std::os::unix::fs::symlink("python3.11", tree.join("usr/bin/python3")).unwrap();
    for (from, to, _) in base_extra {
        let to = tree.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
    let base_dir = root.join("steps-elsewhere/base-fixture");
    std::fs::create_dir_all(&base_dir).unwrap();
    let layer = write_layer(&tree, &base_dir.join("rootfs.tar"), EPOCH).unwrap();
    let deb_sha = "a".repeat(64);
    let files = [
        ("etc/passwd", "generated:passwd"),
        ("etc/group", "generated:group"),
        ("etc/hostname", "generated:hostname"),
        ("usr/bin/python3.11", "deb:python3.11-minimal"),
        ("usr/bin/python3", "deb:python3-minimal"),
        ("usr/lib/python3.11/os.py", "deb:libpython3.11-stdlib"),
    ];
    let base = BaseManifest {
        schema: 1,
        key: "base-fixture".into(),
        epoch: EPOCH,
        suite: "bookworm".into(),
        architecture: "amd64".into(),
        python: "3.11.2".into(),
        mmdebstrap: "fixture".into(),
        network_isolation: "none".into(),
        generated_rules: Default::default(),
        layer: BaseLayer {
            diff_id: layer.diff_id.clone(),
            size: layer.size,
        },
        packages: [
            "libpython3.11-stdlib",
            "python3-minimal",
            "python3.11-minimal",
        ]
        .iter()
        .map(|n| BasePackage {
            name: n.to_string(),
            version: "3.11.2-6+deb12u6".into(),
            architecture: "amd64".into(),
            sha256: deb_sha.clone(),
        })
        .collect(),
        files: files
            .iter()
            .map(|(p, o)| (p.to_string(), o.to_string()))
            .chain(base_extra.iter().map(|(_, p, o)| (p.clone(), o.clone())))
            .collect(),
    };
    std::fs::write(
        base_dir.join("base.json"),
        serde_json::to_string_pretty(&base).unwrap(),
    )
    .unwrap();

    // The wheels.
    let w = root.join("built-wheels");
    let torch = wheel(
        &w,
        "torch",
        "2.11.0",
        &[
            ("torch/__init__.py", b"import os\n".to_vec()),
            ("torch/lib/libtorch_cpu.so", blob(2, 150_000)),
            (
                "torch/distributed/run.py",
                b"def main():\n    pass\n".to_vec(),
            ),
        ],
        Some("[console_scripts]\ntorchrun = torch.distributed.run:main\n"),
    );
    let nccl = wheel(
        &w,
        "nvidia-nccl-cu13",
        "2.28.9",
        &[
            ("nvidia/__init__.py", Vec::new()),
            ("nvidia/nccl/lib/libnccl.so.2", blob(3, 120_000)),
        ],
        None,
    );
    let cudart = wheel(
        &w,
        "nvidia-cuda-runtime",
        "13.0.96",
        &[
            ("nvidia/__init__.py", Vec::new()),
            ("nvidia/cuda_runtime/lib/libcudart.so.13", blob(4, 3000)),
        ],
        None,
    );
    let cublas = wheel(
        &w,
        "nvidia-cublas",
        "13.1.0.3",
        &[
            ("nvidia/__init__.py", Vec::new()),
            ("nvidia/cublas/lib/libcublas.so.13", blob(5, 4000)),
        ],
        None,
    );
    let filelock = wheel(
        &w,
        "filelock",
        "3.20.0",
        &[("filelock/__init__.py", b"# filelock\n".to_vec())],
        None,
    );
    let dropin = wheel(
        &w,
        "nvidia-nvshmem-cu13",
        "3.4.5+commstack.g1a2b3c",
        &[
            ("nvidia/__init__.py", Vec::new()),
            ("nvidia/nvshmem/lib/libnvshmem_host.so.3", blob(6, 2000)),
        ],
        None,
    );
    let deepep = wheel(
        &w,
        "deep_ep",
        "1.2.1+commstack.g567632d",
        &[
            (
                "deep_ep/__init__.py",
                b"from deep_ep_cpp import *\n".to_vec(),
            ),
            (
                "deep_ep_cpp.cpython-311-x86_64-linux-gnu.so",
                blob(deepep_seed, 3000),
            ),
        ],
        None,
    );
    let closure = [&torch, &nccl, &cudart, &cublas, &filelock];
    let mut runtime: Vec<LockedWheel> = closure.iter().map(|w| (*w).clone()).collect();
    runtime.push(dropin.clone());
    let house = assemble_wheelhouse(
        &store,
        WheelhouseKind::Full,
        &runtime,
        &dropin,
        &deepep,
        false,
    )
    .unwrap();

    // The lock: the closure, NVIDIA's NVSHMEM (replaced by the drop-in), the base's debs.
    let mut lock = fake_lock(&closure);
    lock.packages.push(commstack_stack::lock::Wheel {
        name: "nvidia-nvshmem-cu13".into(),
        version: "3.4.5".into(),
        filename: "nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux_2_28_x86_64.whl".into(),
        url: "http://127.0.0.1/files/nvshmem.whl".into(),
        sha256: "f".repeat(64),
        size: 1,
        requires: vec![],
        replaced_by: Some("nvshmem".into()),
    });
    lock.base = Some(commstack_stack::lock::BaseLock {
        distribution: "debian".into(),
        suite: "bookworm".into(),
        mirror: "http://127.0.0.1/debian".into(),
        architecture: "amd64".into(),
        components: vec!["main".into()],
        variant: "essential".into(),
        include: vec!["python3".into()],
        release_date: "2025-11-15".into(),
        packages_sha256: "b".repeat(64),
        epoch: EPOCH,
    });
    lock.debs = base
        .packages
        .iter()
        .map(|p| commstack_stack::lock::Deb {
            name: p.name.clone(),
            version: p.version.clone(),
            architecture: p.architecture.clone(),
            filename: format!("pool/main/p/{}.deb", p.name),
            url: format!("http://127.0.0.1/debian/pool/main/p/{}.deb", p.name),
            sha256: p.sha256.clone(),
            size: 1,
        })
        .collect();
    let lock_path = root.join("stack.lock");
    std::fs::write(&lock_path, lock.render(None)).unwrap();
    let lock_sha256 = commstack_digest::sha256_file(&lock_path).unwrap();

    let inputs = ImageInputs {
        lock,
        lock_path,
        lock_sha256,
        base_dir,
        wheelhouse_dir: house.dir.clone(),
        tools: vec![Tool {
            name: "commstack-verify".into(),
            version: "0.1.0".into(),
            image_path: "/opt/commstack/bin/commstack-verify".into(),
            host_path: tool_binary().to_path_buf(),
            source: "target/release/commstack-verify".into(),
        }],
        data: vec![],
        name: name.to_string(),
        user: "commstack".into(),
        source_url: "https://example.invalid/commstack".into(),
        revision: "0123abc".into(),
        large_wheel_bytes: LARGE,
        jit: None,
    };
    Fixture {
        wheels_dir: house.dir.join("wheels"),
        _dir: dir,
        store,
        inputs,
    }
}

pub fn fake_lock(closure: &[&LockedWheel]) -> commstack_stack::Lock {
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
            python_tag: "cp311".into(),
            platform: "manylinux_2_28_x86_64".into(),
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
        packages: closure
            .iter()
            .map(|w| Wheel {
                name: w.name.clone(),
                version: w.version.clone(),
                filename: w.filename.clone(),
                url: format!("http://127.0.0.1/files/{}", w.filename),
                sha256: w.sha256.clone(),
                size: std::fs::metadata(&w.path).unwrap().len(),
                requires: vec![],
                replaced_by: None,
            })
            .collect(),
        toolchain: vec![],
        base: None,
        debs: Vec::new(),
    }
}
