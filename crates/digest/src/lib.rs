//! commstack-digest: the bottom of the flow. How every other crate names bytes: the
//! sha256 of a file, and canonical JSON (the input of every step key and fingerprint).
//! It depends on no other commstack crate, so any stage may use it.

mod canonical;

use std::fs::File;
use std::io;
use std::path::Path;

use sha2::{Digest, Sha256};

pub use canonical::canonical_json;

/// The lowercase hex sha256 of a file's bytes, read in a stream. An error names the file.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut file = File::open(path).map_err(named)?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(named)?;
    Ok(hex::encode(hasher.finalize()))
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_hash_matches_bytes_hash_and_names_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_file(&path).unwrap(), want);
        assert_eq!(sha256_hex(b"abc"), want);
        let err = sha256_file(&dir.path().join("missing")).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
