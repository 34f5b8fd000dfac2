//! A throwaway archive signing key, made with the real `gpg`, to sign InRelease files with
//! the dates a test chooses (an expired index, one from the future, an older one).
//!
//! The key lives in a temporary GNUPGHOME that is removed, with its gpg-agent stopped,
//! when the [`ArchiveKey`] is dropped. Its public part is in [`ArchiveKey::keyring`], the
//! file gpgv (and commstack's `image.keyring`) takes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// An ed25519 signing key in its own GNUPGHOME.
pub struct ArchiveKey {
    home: tempfile::TempDir,
    keyring: PathBuf,
}

impl ArchiveKey {
    /// Makes the key (about a second). Panics, naming the package, when gpg is missing:
    /// a test that needs it must not pass without it.
    pub fn new() -> ArchiveKey {
        // Short path: gpg-agent's socket lives in it (sockets have a ~100-byte path limit).
        let home = tempfile::Builder::new()
            .prefix("cs-gpg")
            .tempdir_in("/tmp")
            .expect("a temporary GNUPGHOME");
        let key = ArchiveKey {
            keyring: home.path().join("archive-keyring.gpg"),
            home,
        };
        key.gpg(&[
            "--passphrase",
            "",
            "--quick-gen-key",
            "commstack test archive <archive@commstack.invalid>",
            "ed25519",
            "sign",
            "never",
        ]);
        let exported = key.gpg(&["--export"]);
        std::fs::write(&key.keyring, exported).expect("write the keyring");
        key
    }

    /// The public keyring (binary, as Debian ships its archive keyrings).
    pub fn keyring(&self) -> &Path {
        &self.keyring
    }

    /// `text` as a clearsigned message (what a mirror serves as InRelease).
    pub fn clearsign(&self, text: &str) -> Vec<u8> {
        let input = self.home.path().join("Release");
        std::fs::write(&input, text).expect("write the Release text");
        let out = self.gpg(&[
            "--digest-algo",
            "SHA256",
            "--clearsign",
            "--output",
            "-",
            input.to_str().expect("a UTF-8 temporary path"),
        ]);
        assert!(
            out.starts_with(b"-----BEGIN PGP SIGNED MESSAGE-----"),
            "gpg --clearsign wrote no signed message"
        );
        out
    }

    fn gpg(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new("gpg")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--batch", "--quiet", "--yes", "--pinentry-mode", "loopback"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run gpg ({e}): install it with `apt-get install gnupg`")
            });
        assert!(
            out.status.success(),
            "gpg {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

impl Default for ArchiveKey {
    fn default() -> ArchiveKey {
        ArchiveKey::new()
    }
}

impl Drop for ArchiveKey {
    fn drop(&mut self) {
        // The agent gpg started for this home; it would outlive the test otherwise.
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "all"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The text of a suite's Release, listing `files` (path under `dists/<suite>/`, bytes)
/// with their size and sha256. `date` and `valid_until` are written as given (RFC 2822,
/// e.g. `Tue, 01 Dec 2026 00:00:00 UTC`).
pub fn release_text(
    suite: &str,
    codename: &str,
    date: &str,
    valid_until: Option<&str>,
    files: &[(&str, &[u8])],
) -> String {
    let mut text = String::new();
    let mut line = |l: String| {
        text.push_str(&l);
        text.push('\n');
    };
    line("Origin: commstack".into());
    line("Label: commstack test archive".into());
    line(format!("Suite: {suite}"));
    line(format!("Codename: {codename}"));
    line(format!("Date: {date}"));
    if let Some(until) = valid_until {
        line(format!("Valid-Until: {until}"));
    }
    line("Architectures: amd64 arm64".into());
    line("Components: main".into());
    line("SHA256:".into());
    for (path, bytes) in files {
        line(format!(
            " {} {} {path}",
            hex::encode(Sha256::digest(bytes)),
            bytes.len()
        ));
    }
    text
}
