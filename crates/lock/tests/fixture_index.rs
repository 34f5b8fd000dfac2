//! Locking against a real HTTP index on 127.0.0.1 (commstack-testkit): real wheels, PEP 691
//! pages, PEP 658 metadata files, and the ways indexes go wrong.

use std::path::Path;
use std::time::Duration;

use commstack_stack::Stack;
use commstack_testkit::pypi::{FixtureIndex, MetadataHash, WheelSpec};
use commstack_testkit::{Behavior, TestServer};

const LINUX: &str = "; platform_system == \"Linux\"";

/// A miniature of PyPI as torch 2.11.0 sees it.
fn world() -> FixtureIndex {
    world_with_torch_on("manylinux_2_28_x86_64")
}

fn world_with_torch_on(platform: &str) -> FixtureIndex {
    let mut ix = FixtureIndex::new();
    for py in ["cp312", "cp311"] {
        ix.add(
            WheelSpec::new("torch", "2.11.0")
                .tags(&format!("{py}-{py}-{platform}"))
                .requires_python(">=3.10")
                .requires("filelock")
                .requires("typing-extensions>=4.10.0")
                .requires(&format!("cuda-toolkit[cublas,cudart]==13.0.2{LINUX}"))
                .requires(&format!("nvidia-nccl-cu13==2.28.9{LINUX}"))
                .requires(&format!("nvidia-nvshmem-cu13==3.4.5{LINUX}"))
                .requires("pywin32; sys_platform == \"win32\"")
                .extra("optree")
                .requires("optree>=0.13.0; extra == \"optree\""),
        );
    }
    // A newer torch that must not be picked for torch==2.11.0, and a macOS-only file.
    ix.add(WheelSpec::new("torch", "2.12.0").tags("cp312-cp312-manylinux_2_28_x86_64"));
    ix.add(WheelSpec::new("torch", "2.11.0").tags("cp312-none-macosx_11_0_arm64"));
    let cu = "(sys_platform == 'linux' or sys_platform == 'win32')";
    ix.add(
        WheelSpec::new("cuda-toolkit", "13.0.2")
            .tags("py2.py3-none-any")
            .extra("cublas")
            .requires(&format!(
                "nvidia-cublas==13.1.0.3.*; {cu} and extra == 'cublas'"
            ))
            .extra("cudart")
            .requires(&format!(
                "nvidia-cuda-runtime==13.0.96.*; {cu} and extra == 'cudart'"
            ))
            .extra("nvcc")
            .requires(&format!(
                "nvidia-cuda-nvcc==13.0.88.*; {cu} and extra == 'nvcc'"
            ))
            .extra("crt")
            .requires(&format!(
                "nvidia-cuda-crt==13.0.88.*; {cu} and extra == 'crt'"
            ))
            .extra("nvvm")
            .requires(&format!("nvidia-nvvm==13.0.88.*; {cu} and extra == 'nvvm'"))
            .extra("cccl")
            .requires(&format!(
                "nvidia-cuda-cccl==13.0.85.*; {cu} and extra == 'cccl'"
            )),
    );
    ix.add(WheelSpec::new("nvidia-cublas", "13.1.0.3").tags("py3-none-manylinux_2_27_x86_64"));
    ix.add(
        WheelSpec::new("nvidia-cuda-runtime", "13.0.96")
            .tags("py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),
    );
    ix.add(
        WheelSpec::new("nvidia-cuda-runtime", "13.1.80")
            .tags("py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),
    );
    // Only tagged manylinux_2_25, like nvidia-cuda-cupti 13.0.85 on PyPI.
    ix.add(
        WheelSpec::new("nvidia-nccl-cu13", "2.28.9")
            .tags("py3-none-manylinux_2_25_x86_64")
            .file("nvidia/nccl/lib/libnccl.so.2", b"\x7fELF"),
    );
    ix.add(
        WheelSpec::new("nvidia-nvshmem-cu13", "3.4.5")
            .tags("py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),
    );
    ix.add(WheelSpec::new("filelock", "3.20.0"));
    ix.add(WheelSpec::new("filelock", "3.21.0").yanked());
    // No .metadata file: read METADATA out of the wheel.
    ix.add(WheelSpec::new("typing-extensions", "4.15.0").without_metadata_file());
    ix.add(WheelSpec::new("typing-extensions", "4.16.0").uploaded("2026-12-05T00:00:00Z"));
    ix.add(WheelSpec::new("nvidia-cuda-nvcc", "13.0.88").tags("py3-none-manylinux_2_27_x86_64"));
    ix.add(WheelSpec::new("nvidia-cuda-crt", "13.0.88").tags("py3-none-manylinux_2_27_x86_64"));
    ix.add(WheelSpec::new("nvidia-nvvm", "13.0.88").tags("py3-none-manylinux_2_27_x86_64"));
    ix.add(WheelSpec::new("nvidia-cuda-cccl", "13.0.85").tags("py3-none-manylinux_2_27_x86_64"));
    ix.add(
        WheelSpec::new("cmake", "3.31.6")
            .tags("py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64"),
    );
    ix.add(
        WheelSpec::new("cmake", "4.2.0")
            .tags("py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64"),
    );
    ix.add(
        WheelSpec::new("ninja", "1.13.0")
            .tags("py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64"),
    );
    ix
}

fn stack(index: &str, edit: impl Fn(String) -> String) -> Stack {
    let text = format!(
        r#"
[target]
python = "3.12"
base = "ubuntu-24.04"

[torch]
version = "2.11.0"
cuda = 13

[nvshmem]
version = "match-torch"
cuda-archs = ["90"]

[deepep]
rev = "567632d"
api = "v1"

[resolve]
index-url = "{index}"
exclude-newer = "2026-12-01T00:00:00Z"
"#
    );
    let text = edit(text);
    Stack::parse(Path::new("stack.toml"), &text).unwrap_or_else(|e| panic!("{e}"))
}

async fn lock(stack: &Stack) -> anyhow::Result<commstack_stack::Lock> {
    Ok(commstack_lock::lock(stack, None, None, &|_: &str| {})
        .await?
        .lock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_the_fixture_stack() {
    let server = TestServer::start();
    let ix = world();
    let url = ix.serve(&server);
    let lock = lock(&stack(&url, |t| t)).await.unwrap();

    let version = |name: &str| {
        lock.packages
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.version.as_str())
    };
    assert_eq!(version("torch"), Some("2.11.0"));
    assert_eq!(
        version("filelock"),
        Some("3.20.0"),
        "the yanked 3.21.0 is skipped"
    );
    assert_eq!(
        version("typing-extensions"),
        Some("4.15.0"),
        "4.16.0 is newer than exclude-newer"
    );
    assert_eq!(
        version("nvidia-cuda-runtime"),
        Some("13.0.96"),
        "==13.0.96.* pins the patch series"
    );
    assert_eq!(
        version("nvidia-nccl-cu13"),
        Some("2.28.9"),
        "a manylinux_2_25-only wheel fits glibc 2.39"
    );
    assert_eq!(
        version("optree"),
        None,
        "extras that were not asked for add nothing"
    );
    assert_eq!(
        version("pywin32"),
        None,
        "markers for other platforms add nothing"
    );
    let names: Vec<&str> = lock.packages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "cuda-toolkit",
            "filelock",
            "nvidia-cublas",
            "nvidia-cuda-runtime",
            "nvidia-nccl-cu13",
            "nvidia-nvshmem-cu13",
            "torch",
            "typing-extensions"
        ]
    );

    // Every wheel is pinned to the bytes the index serves.
    for p in &lock.packages {
        let (_, sha) = ix.wheel(&p.filename).unwrap();
        assert_eq!(p.sha256, sha, "{}", p.filename);
        assert!(p.url.starts_with(&server.url("/files/")), "{}", p.url);
    }
    let torch = lock.packages.iter().find(|p| p.name == "torch").unwrap();
    assert_eq!(
        torch.filename,
        "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    );
    assert_eq!(
        torch.requires,
        [
            "cuda-toolkit",
            "filelock",
            "nvidia-nccl-cu13",
            "nvidia-nvshmem-cu13",
            "typing-extensions"
        ]
    );
    let nvshmem = lock
        .packages
        .iter()
        .find(|p| p.name == "nvidia-nvshmem-cu13")
        .unwrap();
    assert_eq!(nvshmem.replaced_by.as_deref(), Some("nvshmem"));

    let r = &lock.resolved;
    assert_eq!(
        (r.cuda.as_str(), r.nccl.to_string().as_str()),
        ("13.0.2", "nvidia-nccl-cu13==2.28.9")
    );
    assert_eq!(
        (
            r.nvshmem.as_str(),
            r.nvshmem_pin.as_ref().map(|p| p.to_string()).as_deref()
        ),
        ("3.4.5", Some("nvidia-nvshmem-cu13==3.4.5"))
    );
    assert_eq!(r.deepep_rev, "567632dd59810d77b3cc05553df953cc0f779799");

    // The toolchain follows torch's CUDA pin and the cmake specifier.
    let tool = |name: &str| {
        lock.toolchain
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.version.as_str())
    };
    assert_eq!(tool("nvidia-cuda-nvcc"), Some("13.0.88"));
    assert_eq!(tool("nvidia-cuda-cccl"), Some("13.0.85"));
    assert_eq!(tool("nvidia-nvvm"), Some("13.0.88"));
    assert_eq!(
        tool("cmake"),
        Some("3.31.6"),
        "cmake 4.2.0 is outside >=3.28,<4.2"
    );
    assert_eq!(tool("ninja"), Some("1.13.0"));

    // The missing .metadata file was tried, then the wheel was read with range requests.
    let te = "/files/typing_extensions-4.15.0-py3-none-any.whl";
    assert_eq!(server.hits(&format!("{te}.metadata")), 1);
    let reads = server.requests_for(te);
    assert!(!reads.is_empty());
    assert!(
        reads.iter().all(|r| r.method == "GET" && r.range.is_some()),
        "only ranges of the wheel: {reads:?}"
    );

    // requirements.lock: every installable wheel with its hash, the replaced one left out.
    let req = lock.requirements_txt();
    assert!(req.contains(&format!(
        "torch==2.11.0 \\\n    --hash=sha256:{}",
        torch.sha256
    )));
    assert!(req.contains("# nvidia-nvshmem-cu13==3.4.5: replaced by the stack's nvshmem build"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bookworm_target_gets_cp311_wheels() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let s = stack(&url, |t| {
        t.replace("python = \"3.12\"", "python = \"3.11\"")
            .replace("ubuntu-24.04", "debian-12")
    });
    let lock = lock(&s).await.unwrap();
    let torch = lock.packages.iter().find(|p| p.name == "torch").unwrap();
    assert_eq!(
        torch.filename,
        "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    );
    assert_eq!(lock.resolved.platform, "manylinux_2_36_x86_64");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_errors_are_retried() {
    let server = TestServer::start();
    let ix = world();
    let url = ix.serve(&server);
    ix.misbehave(
        &server,
        "torch",
        Behavior::FailFirst {
            n: 2,
            status: 500,
            retry_after: None,
        },
    );
    ix.misbehave(
        &server,
        "filelock",
        Behavior::FailFirst {
            n: 1,
            status: 429,
            retry_after: Some(1),
        },
    );
    let lock = lock(&stack(&url, |t| t)).await.unwrap();
    assert_eq!(lock.packages.len(), 8);
    assert_eq!(server.hits("/simple/torch/"), 3);
    assert_eq!(server.hits("/simple/filelock/"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn persistent_500_names_the_url() {
    let server = TestServer::start();
    let ix = world();
    let url = ix.serve(&server);
    ix.misbehave(
        &server,
        "filelock",
        Behavior::FailFirst {
            n: 100,
            status: 500,
            retry_after: None,
        },
    );
    let err = format!("{:#}", lock(&stack(&url, |t| t)).await.unwrap_err());
    assert!(err.contains("/simple/filelock/ answered 500"), "{err}");
    assert!(err.contains("gave up after"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redirected_pages_are_followed() {
    let server = TestServer::start();
    let ix = world();
    let url = ix.serve(&server);
    // The page moves; its relative file URLs resolve against where it landed.
    ix.misbehave(
        &server,
        "cuda-toolkit",
        Behavior::Redirect {
            to: "/simple/cuda-toolkit-moved/".into(),
            status: 301,
        },
    );
    let page = ix.page("/simple/cuda-toolkit/").unwrap();
    server.route(
        "/simple/cuda-toolkit-moved/",
        commstack_testkit::Route::ok(page)
            .header("Content-Type", "application/vnd.pypi.simple.v1+json"),
    );
    let lock = lock(&stack(&url, |t| t)).await.unwrap();
    assert!(lock.packages.iter().any(|p| p.name == "cuda-toolkit"));
    assert_eq!(
        server.hits("/simple/cuda-toolkit-moved/"),
        1,
        "one fetch serves both resolutions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_metadata_hash_that_does_not_match_is_an_error() {
    let server = TestServer::start();
    let mut ix = world();
    ix.add(WheelSpec::new("filelock", "3.20.1").announce_metadata(MetadataHash::Wrong));
    let url = ix.serve(&server);
    let err = format!("{:#}", lock(&stack(&url, |t| t)).await.unwrap_err());
    assert!(
        err.contains("filelock-3.20.1-py3-none-any.whl.metadata: sha256 mismatch"),
        "{err}"
    );
    assert!(
        err.contains(&"0".repeat(64)),
        "names the expected hash: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_correctly_announced_metadata_hash_is_checked_and_accepted() {
    let server = TestServer::start();
    let mut ix = world();
    ix.add(WheelSpec::new("filelock", "3.20.1").announce_metadata(MetadataHash::Correct));
    let url = ix.serve(&server);
    let lock = lock(&stack(&url, |t| t)).await.unwrap();
    assert!(
        lock.packages
            .iter()
            .any(|p| p.name == "filelock" && p.version == "3.20.1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manylinux_2_25_only_wheel_does_not_fit_glibc_2_24() {
    let server = TestServer::start();
    let url = world_with_torch_on("manylinux_2_17_x86_64").serve(&server);
    let s = stack(&url, |t| {
        t.replace(
            "base = \"ubuntu-24.04\"",
            "base = \"ubuntu-24.04\"\nglibc = \"2.24\"",
        )
    });
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(err.contains("nvidia-nccl-cu13"), "{err}");
    assert!(
        err.contains("nvidia-nccl-cu13 2.28.9: no wheel for the target platform"),
        "{err}"
    );
    assert!(err.contains("manylinux_2_24_x86_64"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deepep_v2_against_torch_nccl_2_28_is_refused_with_both_sides() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let s = stack(&url, |t| t.replace("api = \"v1\"", "api = \"v2\""));
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(err.contains("stack.toml:16:7: DeepEP V2 needs NCCL >= 2.30.4 but torch 2.11.0 pins nvidia-nccl-cu13==2.28.9"), "{err}");
    assert!(
        err.contains("stack.toml:7:11: torch 2.11.0 is chosen here"),
        "{err}"
    );
    assert!(err.contains("allow rule deepep-v2-nccl"), "{err}");
    // The first way out is the [nccl] override.
    assert!(err.contains("set [nccl] version = \"2.30.7\""), "{err}");
}

/// nvidia-nccl-cu13 wheels laid out as NVIDIA's are (headers, lib/libnccl.so.2, the
/// device bitcode): the 2.30.7 that torch 2.14.1 pins, an older 2.27.7, and two of
/// another soname: a 2.99.0 whose wheel ships libnccl.so.3, and a 3.0.0.
fn with_nccl_wheels(mut ix: FixtureIndex) -> FixtureIndex {
    let nccl = |version: &str, lib: &str| {
        WheelSpec::new("nvidia-nccl-cu13", version)
            .tags("py3-none-manylinux_2_18_x86_64")
            .file("nvidia/nccl/include/nccl.h", b"#define NCCL_MAJOR 2\n")
            .file(&format!("nvidia/nccl/lib/{lib}"), b"\x7fELF")
            .file("nvidia/nccl/lib/libnccl_device.bc", b"BC")
    };
    ix.add(nccl("2.30.7", "libnccl.so.2"));
    ix.add(nccl("2.27.7", "libnccl.so.2"));
    ix.add(nccl("2.99.0", "libnccl.so.3"));
    ix.add(nccl("3.0.0", "libnccl.so.3"));
    ix
}

fn with_nccl(version: &str) -> impl Fn(String) -> String {
    let section = format!("\n[nccl]\nversion = \"{version}\"\n");
    move |t: String| t + &section
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_nccl_override_replaces_torchs_pin_and_the_lock_says_why() {
    let server = TestServer::start();
    let ix = with_nccl_wheels(world());
    let url = ix.serve(&server);
    let s = stack(&url, with_nccl("2.30.7"));
    let lock = lock(&s).await.unwrap();

    // Exactly one NCCL in the closure: the override's, torch still requiring it by name.
    let ncc: Vec<&str> = lock
        .packages
        .iter()
        .filter(|p| p.name.starts_with("nvidia-nccl"))
        .map(|p| p.version.as_str())
        .collect();
    assert_eq!(ncc, ["2.30.7"]);
    let torch = lock.packages.iter().find(|p| p.name == "torch").unwrap();
    assert!(torch.requires.contains(&"nvidia-nccl-cu13".to_string()));
    assert!(
        lock.requirements_txt()
            .contains("nvidia-nccl-cu13==2.30.7 \\\n    --hash=sha256:")
    );

    // The lock records what torch pinned (read from its metadata) and why it is replaced.
    let r = &lock.resolved;
    assert_eq!(r.nccl.to_string(), "nvidia-nccl-cu13==2.30.7");
    let o = r.nccl_override.as_ref().expect("the override is recorded");
    assert_eq!(o.torch_pin.to_string(), "nvidia-nccl-cu13==2.28.9");
    assert_eq!(
        o.replaces,
        "nvidia-nccl-cu13==2.28.9 ; platform_system == 'Linux'"
    );
    assert!(
        o.reason.starts_with(
            "[nccl] version = \"2.30.7\" replaces torch 2.11.0's Requires-Dist `nvidia-nccl-cu13==2.28.9 ; platform_system == 'Linux'` (as uv's override-dependencies do)"
        ) && o.reason.contains("rule nccl-not-older-than-torch")
            && o.reason.contains("rule nccl-soname"),
        "{}",
        o.reason
    );
    // Both rules ran and say how they decided.
    let rule = |id: &str| lock.rules.iter().find(|r| r.id == id).unwrap();
    let older = rule("nccl-not-older-than-torch");
    assert_eq!(older.status, commstack_stack::rules::Status::Ok);
    assert_eq!(
        older.detail,
        "NCCL 2.30.7 overrides torch 2.11.0's pin nvidia-nccl-cu13==2.28.9 (not older)"
    );
    let soname = rule("nccl-soname");
    assert_eq!(soname.status, commstack_stack::rules::Status::Ok);
    assert_eq!(
        soname.detail,
        "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl ships nvidia/nccl/lib/libnccl.so.2 (its zip directory, read at lock time)"
    );
    // Only the zip directory of the 2.30.7 wheel was read, by ranges.
    let wheel = "/files/nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl";
    assert!(server.requests_for(wheel).iter().all(|r| r.range.is_some()));

    // Written, read back, fresh; and going back to match-torch is a change the lock sees.
    let text = lock.render(None);
    assert!(
        text.contains("[resolved.nccl-override]\ntorch-pin = \"nvidia-nccl-cu13==2.28.9\"\n"),
        "{text}"
    );
    let back = commstack_stack::Lock::parse(Path::new("stack.lock"), &text).unwrap();
    assert_eq!(back, lock);
    assert!(back.staleness(&s).is_empty());
    let stale = back.staleness(&stack(&url, |t| t));
    assert!(
        stale.contains(
            &"nccl.version: the lock has \"2.30.7\", the manifest no longer sets it".to_string()
        ),
        "{stale:?}"
    );

    // The same stack without [nccl] is torch's pin, recorded as such.
    let plain = self::lock(&stack(&url, |t| t)).await.unwrap();
    assert_eq!(plain.resolved.nccl.to_string(), "nvidia-nccl-cu13==2.28.9");
    assert!(plain.resolved.nccl_override.is_none());
    let plain_rule = plain.rules.iter().find(|r| r.id == "nccl-soname").unwrap();
    assert_eq!(
        plain_rule.status,
        commstack_stack::rules::Status::NotApplicable
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deepep_v2_passes_the_nccl_rule_with_the_override() {
    let server = TestServer::start();
    let url = with_nccl_wheels(world()).serve(&server);
    let s = stack(&url, |t| {
        with_nccl("2.30.7")(t.replace("api = \"v1\"", "api = \"v2\""))
    });
    // Every rule holds; what stops this stack is the known-source table, which has no V2
    // revision (DeepEP 567632d is V1).
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(!err.contains("deepep-v2-nccl"), "{err}");
    assert!(
        err.contains("deepep.api is v2 but DeepEP 567632d is a v1 revision"),
        "{err}"
    );
    // An override still below DeepEP V2's floor is refused at [nccl], not at deepep.api.
    let low = stack(&url, |t| {
        with_nccl("2.28.9")(t.replace("api = \"v1\"", "api = \"v2\""))
    });
    let err = format!("{:#}", lock(&low).await.unwrap_err());
    assert!(
        err.contains("stack.toml:23:11: DeepEP V2 needs NCCL >= 2.30.4 but [nccl] version gives nvidia-nccl-cu13==2.28.9 [rule deepep-v2-nccl]"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_nccl_older_than_torchs_pin_is_refused_naming_the_rule() {
    let server = TestServer::start();
    let url = with_nccl_wheels(world()).serve(&server);
    let err = format!(
        "{:#}",
        lock(&stack(&url, with_nccl("2.27.7"))).await.unwrap_err()
    );
    assert!(
        err.contains("stack.toml:23:11: nccl.version is 2.27.7, older than torch's pin nvidia-nccl-cu13==2.28.9: torch was built against NCCL 2.28.9 and may call what 2.27.7 lacks [rule nccl-not-older-than-torch]"),
        "{err}"
    );
    assert!(
        err.contains("stack.toml:7:11: torch 2.11.0 is chosen here"),
        "{err}"
    );
    assert!(err.contains("set nccl.version to 2.28.9 or newer"), "{err}");
    // Refused without reading the older wheel.
    assert!(
        server
            .requests_for("/files/nvidia_nccl_cu13-2.27.7-py3-none-manylinux_2_18_x86_64.whl")
            .is_empty()
    );
    // Not a rule resolve.allow can waive: refused when the stack is read.
    let text = format!(
        "{}allow = [\"nccl-not-older-than-torch\"]\n",
        "[target]\npython = \"3.12\"\nbase = \"ubuntu-24.04\"\n[torch]\nversion = \"2.11.0\"\ncuda = 13\n\
         [nvshmem]\nversion = \"match-torch\"\ncuda-archs = [\"90\"]\n[deepep]\nrev = \"567632d\"\napi = \"v1\"\n[resolve]\n"
    );
    let refused = Stack::parse(Path::new("stack.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("rule nccl-not-older-than-torch cannot be allowed in resolve.allow"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_nccl_wheel_of_another_soname_is_refused_naming_the_rule() {
    let server = TestServer::start();
    let url = with_nccl_wheels(world()).serve(&server);
    // A 2.x version whose wheel ships libnccl.so.3: its file list says so.
    let err = format!(
        "{:#}",
        lock(&stack(&url, with_nccl("2.99.0"))).await.unwrap_err()
    );
    assert!(
        err.contains("nvidia_nccl_cu13-2.99.0-py3-none-manylinux_2_18_x86_64.whl, the wheel of nccl.version = \"2.99.0\", ships nvidia/nccl/lib/libnccl.so.3, not exactly one libnccl.so.2 (its zip directory, read at lock time) [rule nccl-soname]"),
        "{err}"
    );
    // A 3.x NCCL: its major says so, whatever its wheel holds.
    let err = format!(
        "{:#}",
        lock(&stack(&url, with_nccl("3.0.0"))).await.unwrap_err()
    );
    assert!(
        err.contains("nccl.version is 3.0.0: NCCL 3 ships libnccl.so.3, not libnccl.so.2 (decided from the version's major at lock time) [rule nccl-soname]"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_nvshmem_version_other_than_torchs_needs_an_override() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let s = stack(&url, |t| {
        t.replace("version = \"match-torch\"", "version = \"3.3.24\"")
    });
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(
        err.contains("the stack builds NVSHMEM 3.3.24 but torch pins nvidia-nvshmem-cu13==3.4.5"),
        "{err}"
    );
    let allowed = stack(&url, |t| {
        t.replace("version = \"match-torch\"", "version = \"3.3.24\"")
            + "allow = [\"nvshmem-version-matches-torch\"]\n"
    });
    let lock = lock(&allowed).await.unwrap();
    assert_eq!(lock.resolved.nvshmem, "3.3.24");
    let rule = lock
        .rules
        .iter()
        .find(|r| r.id == "nvshmem-version-matches-torch")
        .unwrap();
    assert_eq!(rule.status, commstack_stack::rules::Status::Allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_package_missing_from_the_index_is_named() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let s = stack(&url, |t| t + "extra-requirements = [\"doesnotexist>=1\"]\n");
    let err = format!(
        "{:#}",
        tokio::time::timeout(Duration::from_secs(30), lock(&s))
            .await
            .unwrap()
            .unwrap_err()
    );
    assert!(err.contains("doesnotexist"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_torch_version_the_index_lacks_points_at_the_manifest() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let s = stack(&url, |t| {
        t.replace("version = \"2.11.0\"", "version = \"2.99.0\"")
    });
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(
        err.contains("stack.toml:7:11: torch 2.99.0 is not on the index"),
        "{err}"
    );
    assert!(err.contains("newest releases: 2.12.0, 2.11.0"), "{err}");
}

/// The Debian fixture mirror of commstack-debian's tests (signed InRelease, Packages.gz,
/// the throwaway key's keyring), served under `/debian` beside the PyPI fixture.
fn debian_fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../debian/tests/fixtures")
        .join(name)
}

fn serve_debian(server: &TestServer) -> String {
    for (route, file) in [
        ("/debian/dists/bookworm/InRelease", "InRelease"),
        (
            "/debian/dists/bookworm/main/binary-amd64/Packages.gz",
            "Packages.gz",
        ),
    ] {
        server.route(
            route,
            commstack_testkit::Route::ok(std::fs::read(debian_fixture(file)).unwrap()),
        );
    }
    server.url("/debian")
}

fn image_stack(url: &str, mirror: &str, include: &str) -> Stack {
    image_stack_aged(url, mirror, include, 36_500)
}

/// The fixture index is dated 2026-12-01 and never re-signed: the image stacks of these
/// tests accept it for a century (`max_age_days`), so that they do not age; the tests of
/// the age itself set their own.
fn image_stack_aged(url: &str, mirror: &str, include: &str, max_age_days: u32) -> Stack {
    let keyring = debian_fixture("keyring.gpg");
    stack(url, |t| {
        t.replace("python = \"3.12\"", "python = \"3.11\"")
            .replace("ubuntu-24.04", "debian-12")
            + &format!(
                "\n[image]\nmirror = \"{mirror}\"\nkeyring = \"{}\"\ninclude = [{include}]\n\
                 index-max-age-days = {max_age_days}\n",
                keyring.display()
            )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn image_stacks_lock_their_base_packages() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let mirror = serve_debian(&server);
    let s = image_stack(&url, &mirror, "\"app\"");
    let lock = lock(&s).await.unwrap();
    let base = lock.base.as_ref().unwrap();
    assert_eq!(base.distribution, "debian");
    assert_eq!(base.suite, "bookworm");
    assert_eq!(base.mirror, mirror);
    assert_eq!(base.architecture, "amd64");
    assert_eq!(base.components, ["main"]);
    assert_eq!(base.variant, "essential");
    assert_eq!(base.include, ["app"]);
    assert_eq!(base.release_date, "2026-12-01T00:00:00Z");
    // exclude-newer (2026-12-01T00:00:00Z) is the epoch.
    assert_eq!(base.epoch, 1_796_083_200);
    let names: Vec<&str> = lock.debs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "app",
            "base-files",
            "dash",
            "exim4",
            "libc6",
            "libfoo1",
            "libssl1.1",
            "mawk",
            "python3",
            "python3-minimal"
        ]
    );
    let exim = &lock.debs[3];
    assert_eq!(
        exim.url,
        format!("{mirror}/pool/main/e/exim4/exim4_4.96-15_all.deb")
    );
    assert_eq!((exim.version.as_str(), exim.size), ("4.96-15", 8000));
    // The Python part is what it is without [image].
    let plain = stack(&url, |t| {
        t.replace("python = \"3.12\"", "python = \"3.11\"")
            .replace("ubuntu-24.04", "debian-12")
    });
    let plain_lock = self::lock(&plain).await.unwrap();
    assert_eq!(plain_lock.packages, lock.packages);
    assert!(plain_lock.base.is_none() && plain_lock.debs.is_empty());

    // Written and read back; keys in a fixed order.
    let text = lock.render(None);
    assert!(
        text.contains("\n[base]\ndistribution = \"debian\"\nsuite = \"bookworm\"\n"),
        "{text}"
    );
    assert!(
        text.contains("\n[[deb]]\nname = \"app\"\nversion = \"1.0-1\"\narchitecture = \"all\"\n")
    );
    let back = commstack_stack::Lock::parse(Path::new("stack.lock"), &text).unwrap();
    assert_eq!(back, lock);
    assert!(back.staleness(&s).is_empty());

    // A changed [image] is stale offline, through the manifest echo.
    let changed = image_stack(&url, &mirror, "\"app\", \"postfix\"");
    let stale = back.staleness(&changed);
    assert!(
        stale
            .iter()
            .any(|p| p.starts_with("image.include: the lock has \"app\"")),
        "{stale:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ubuntu_image_without_a_mirror_is_refused_before_any_request() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let s = stack(&url, |t| t + "\n[image]\n");
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(
        err.starts_with(
            "stack.toml:4:8: the base ubuntu-24.04 is an Ubuntu release and [image] names no mirror"
        ),
        "{err}"
    );
    assert!(
        err.contains("archive.ubuntu.com") && err.contains("image.mirror"),
        "{err}"
    );
    assert!(
        server.requests().is_empty(),
        "nothing was asked of any index"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unsatisfiable_include_stops_the_lock() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let mirror = serve_debian(&server);
    let s = image_stack(&url, &mirror, "\"broken\"");
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(
        err.contains("locking the base of stack.toml ([image])"),
        "{err}"
    );
    assert!(
        err.contains("broken 1.0 depends on `nothere (>= 1) | alsonot`"),
        "{err}"
    );
}

/// `image.index-max-age-days` reaches the check: the fixture index, dated 2026-12-01 with no
/// Valid-Until, is older than one day on any clock that is past 2026-12-02.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_index_older_than_the_stacks_maximum_age_is_refused() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let mirror = serve_debian(&server);
    let s = image_stack_aged(&url, &mirror, "\"app\"", 1);
    let err = format!("{:#}", lock(&s).await.unwrap_err());
    assert!(
        err.contains("locking the base of stack.toml ([image])")
            && err.contains("InRelease is dated 2026-12-01T00:00:00Z")
            && err.contains("has no Valid-Until: older than image.index-max-age-days = 1 allows"),
        "{err}"
    );
    assert_eq!(
        server.hits("/debian/dists/bookworm/main/binary-amd64/Packages.gz"),
        0
    );
}

/// A lock that recorded a newer index of the same mirror and suite refuses an older one
/// (a rollback); another mirror's record sets no floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_index_older_than_the_previous_lock_records_is_refused() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let mirror = serve_debian(&server);
    let s = image_stack(&url, &mirror, "\"app\"");
    let first = lock(&s).await.unwrap();
    let text = first.render(None);
    let path = Path::new("/work/stacks/stack.lock");
    let relock = |text: String| {
        let s = s.clone();
        async move {
            let previous = commstack_lock::PreviousLock { path, text: &text };
            commstack_lock::lock(&s, None, Some(previous), &|_: &str| {})
                .await
                .map(|l| l.lock)
        }
    };
    // The same index again: no rollback.
    let again = relock(text.clone()).await.unwrap();
    assert_eq!(again.base, first.base);
    // The lock saw a newer index there before.
    let newer = text.replace(
        "release-date = \"2026-12-01T00:00:00Z\"",
        "release-date = \"2026-12-03T00:00:00Z\"",
    );
    assert_ne!(newer, text);
    let err = format!("{:#}", relock(newer.clone()).await.unwrap_err());
    assert!(
        err.contains(
            "InRelease is dated 2026-12-01T00:00:00Z, older than the index /work/stacks/stack.lock already \
             records for this mirror and suite ([base] release-date = 2026-12-03T00:00:00Z)"
        ) && err.contains("delete /work/stacks/stack.lock and run `cargo xtask lock`"),
        "{err}"
    );
    // Recorded from another mirror: its dates are its own.
    let elsewhere = newer.replace(
        &format!("mirror = \"{mirror}\""),
        "mirror = \"http://deb.debian.org/debian\"",
    );
    assert_ne!(elsewhere, newer);
    relock(elsewhere).await.unwrap();
}

/// The known table stays as extra assurance (docs/sources.md): a hash the stack gives
/// for a source it knows must agree with it, and then the trust is the table's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hashes_the_stack_gives_for_known_sources_must_agree_with_the_table() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let known_tree = "sha256:8aec908cb686bad3352f58265e8f43e658669ea660f7f73fadf8c7b63688526f";
    let agreeing = stack(&url, |t| {
        t.replace(
            "api = \"v1\"\n",
            &format!("api = \"v1\"\ntree = \"{known_tree}\"\n"),
        )
        .replace(
            "cuda-archs = [\"90\"]\n",
            "cuda-archs = [\"90\"]\nurl = \"https://mirror.example/nv/nvshmem_src_cuda12-all-all-3.4.5.tar.gz\"\n\
             sha256 = \"40c1d4c255dd7395e04df41b181c4afdf2e0724c06b6fabde58bf2f8f532b0e5\"\n",
        )
    });
    let locked = lock(&agreeing).await.unwrap();
    let deepep = locked.sources.iter().find(|s| s.name == "deepep").unwrap();
    assert_eq!(deepep.tree.as_deref(), Some(known_tree));
    assert!(
        deepep.origin.starts_with("known-source table"),
        "{deepep:?}"
    );
    let nvshmem = locked.sources.iter().find(|s| s.name == "nvshmem").unwrap();
    assert_eq!(
        nvshmem.url,
        "https://mirror.example/nv/nvshmem_src_cuda12-all-all-3.4.5.tar.gz"
    );
    assert!(
        nvshmem.origin.starts_with("known-hash table"),
        "{nvshmem:?}"
    );

    let other = format!("sha256:{}", "ab".repeat(32));
    let disagreeing = stack(&url, |t| {
        t.replace(
            "api = \"v1\"\n",
            &format!("api = \"v1\"\ntree = \"{other}\"\n"),
        )
    });
    let err = format!("{:#}", lock(&disagreeing).await.unwrap_err());
    assert!(
        err.contains("stack.toml:17:8: deepep.tree")
            && err.contains(known_tree)
            && err.contains("refused"),
        "{err}"
    );
    let disagreeing = stack(&url, |t| {
        t.replace(
            "cuda-archs = [\"90\"]\n",
            &format!(
                "cuda-archs = [\"90\"]\nurl = \"https://mirror.example/nvshmem_src.tar.gz\"\nsha256 = \"{}\"\n",
                "cd".repeat(32)
            ),
        )
    });
    let err = format!("{:#}", lock(&disagreeing).await.unwrap_err());
    assert!(
        err.contains("nvshmem.sha256") && err.contains("40c1d4c255dd") && err.contains("refused"),
        "{err}"
    );
}

/// A commit no table knows is named in full, and is fetched: a lock that fetches nothing
/// says which sources it would need, and how to fetch them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_no_table_knows_is_named_in_full_and_fetched() {
    let server = TestServer::start();
    let url = world().serve(&server);
    let short = stack(&url, |t| {
        t.replace("rev = \"567632d\"", "rev = \"dd758ca\"")
    });
    let err = format!("{:#}", lock(&short).await.unwrap_err());
    assert!(
        err.contains("stack.toml:15:7: DeepEP revision dd758ca") && err.contains("40 hex digits"),
        "{err}"
    );
    let full = stack(&url, |t| {
        t.replace(
            "rev = \"567632d\"",
            "rev = \"dd758caf451848bd150e1046af3d0a73e5fff38d\"",
        )
    });
    let err = format!("{:#}", lock(&full).await.unwrap_err());
    assert!(
        err.contains("need fetching (deepep)") && err.contains("cargo xtask lock"),
        "{err}"
    );
}
