//! RECORD: one CSV row per file of the wheel: path, `sha256=<urlsafe base64, no padding>`,
//! size. RECORD lists itself with empty hash and size.

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordEntry {
    pub path: String,
    /// `sha256=...` as written (None for RECORD itself and signatures).
    pub hash: Option<String>,
    pub size: Option<u64>,
}

impl RecordEntry {
    /// The digest bytes and algorithm of `hash`.
    pub fn digest(&self) -> Result<Option<(String, Vec<u8>)>> {
        let Some(hash) = &self.hash else {
            return Ok(None);
        };
        let (algo, b64) = hash.split_once('=').with_context(|| {
            format!(
                "RECORD: hash {hash:?} of {} is not `algorithm=digest`",
                self.path
            )
        })?;
        let bytes = URL_SAFE_NO_PAD
            .decode(b64.trim_end_matches('='))
            .with_context(|| format!("RECORD: hash of {} is not urlsafe base64", self.path))?;
        Ok(Some((algo.to_string(), bytes)))
    }
}

/// `sha256=<urlsafe base64 without padding>` of `bytes`.
pub fn record_hash(bytes: &[u8]) -> String {
    format_sha256(&Sha256::digest(bytes))
}

/// `sha256=<urlsafe base64>`, RECORD's form of a digest.
pub fn format_sha256(digest: &[u8]) -> String {
    format!("sha256={}", URL_SAFE_NO_PAD.encode(digest))
}

pub fn parse_record(bytes: &[u8]) -> Result<Vec<RecordEntry>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(bytes);
    let mut out = Vec::new();
    for (i, row) in reader.records().enumerate() {
        let row = row.with_context(|| format!("RECORD line {} is not valid CSV", i + 1))?;
        if row.len() != 3 {
            bail!(
                "RECORD line {} has {} fields, expected 3 (path,hash,size)",
                i + 1,
                row.len()
            );
        }
        let path = row[0].to_string();
        let hash = (!row[1].is_empty()).then(|| row[1].to_string());
        let size = if row[2].is_empty() {
            None
        } else {
            Some(row[2].parse().with_context(|| {
                format!("RECORD line {}: size {:?} is not a number", i + 1, &row[2])
            })?)
        };
        out.push(RecordEntry { path, hash, size });
    }
    Ok(out)
}

pub fn render_record(entries: &[RecordEntry]) -> Vec<u8> {
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    for e in entries {
        let size = e.size.map(|s| s.to_string()).unwrap_or_default();
        writer
            .write_record([
                e.path.as_str(),
                e.hash.as_deref().unwrap_or(""),
                size.as_str(),
            ])
            .expect("writing CSV into memory cannot fail");
    }
    writer
        .into_inner()
        .expect("writing CSV into memory cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_urlsafe_unpadded() {
        // sha256("") = e3b0c442...; its urlsafe base64 has no '=' and no '+' or '/'.
        assert_eq!(
            record_hash(b""),
            "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
    }

    #[test]
    fn round_trips_quoted_paths() {
        let entries = vec![
            RecordEntry {
                path: "a,b/c.py".into(),
                hash: Some(record_hash(b"x")),
                size: Some(1),
            },
            RecordEntry {
                path: "p-1.0.dist-info/RECORD".into(),
                hash: None,
                size: None,
            },
        ];
        let text = render_record(&entries);
        assert!(String::from_utf8_lossy(&text).starts_with("\"a,b/c.py\","));
        assert_eq!(parse_record(&text).unwrap(), entries);
        assert_eq!(
            entries[0].digest().unwrap().unwrap().1,
            Sha256::digest(b"x").to_vec()
        );
    }
}
