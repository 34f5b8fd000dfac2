//! What the signature tests verify with and push to besides docker-registry: the real
//! `cosign` binary, and [`ReferrersRegistry`], a registry with the OCI 1.1 referrers API
//! (go-containerregistry's pkg/registry, `crates/testkit/refreg/main.go`). Both come from
//! Debian's packages through `bash ci/cosign-tools.sh`, into `.tools/bin/`
//! (`$COMMSTACK_COSIGN`, `$COMMSTACK_REFREG` name others). A test that needs one and
//! does not find it fails, saying how to install it.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `.tools/bin/<name>` of the workspace, or the file `$<var>` names; panics with how to
/// install it when it is not there.
fn tool(name: &str, var: &str) -> PathBuf {
    let path = match std::env::var_os(var) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../.tools/bin")
            .join(name),
    };
    assert!(
        path.is_file(),
        "{name} is needed for this test and is not at {} (${var} names another): install it with `bash ci/cosign-tools.sh` (Debian's packages: cosign from sid, a referrers registry built from golang-github-google-go-containerregistry-dev)",
        path.display()
    );
    path
}

/// The real cosign binary.
pub fn cosign() -> PathBuf {
    tool("cosign", "COMMSTACK_COSIGN")
}

/// A registry with the referrers API on a free 127.0.0.1 port, plain HTTP, no auth,
/// storage in memory. Killed when dropped.
pub struct ReferrersRegistry {
    port: u16,
    child: Child,
}

impl ReferrersRegistry {
    /// Serving; returns when it listens.
    pub fn start() -> ReferrersRegistry {
        let binary = tool("refreg", "COMMSTACK_REFREG");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(&binary)
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{} exited ({status})", binary.display());
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{} did not listen on {port}",
                binary.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        ReferrersRegistry { port, child }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for ReferrersRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cosign verify --key PUBLIC --insecure-ignore-tlog=true REFERENCE` against the test
/// docker-registry (its CA, the test's credentials): whether cosign verified it, and what
/// it said.
pub fn cosign_verify(
    registry: &crate::TestRegistry,
    public: &std::path::Path,
    reference: &str,
) -> (bool, String) {
    let ca = registry.ca();
    let mut args: Vec<&std::ffi::OsStr> = vec!["--registry-cacert".as_ref(), ca.as_os_str()];
    for arg in [
        "--registry-username",
        crate::REGISTRY_USER,
        "--registry-password",
        crate::REGISTRY_PASSWORD,
    ] {
        args.push(arg.as_ref());
    }
    verify_with(public, reference, &args)
}

/// `cosign verify` as [`cosign_verify`] against a plain-HTTP registry without credentials
/// (a [`ReferrersRegistry`]); `oci11` adds `--experimental-oci11` (the referrers API first).
pub fn cosign_verify_http(
    public: &std::path::Path,
    reference: &str,
    oci11: bool,
) -> (bool, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["--allow-http-registry".as_ref()];
    if oci11 {
        args.push("--experimental-oci11".as_ref());
    }
    verify_with(public, reference, &args)
}

fn verify_with(
    public: &std::path::Path,
    reference: &str,
    args: &[&std::ffi::OsStr],
) -> (bool, String) {
    let out = Command::new(cosign())
        .args(["verify", "--key"])
        .arg(public)
        .arg("--insecure-ignore-tlog=true")
        .args(args)
        .arg(reference)
        // cosign keeps a TUF cache under HOME; with a key given it fetches nothing.
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
