//! The knowledge base: signatures from `signatures.toml`, compiled once into a prefilter and a
//! `RegexSet`.

use std::sync::OnceLock;

use anyhow::{Context, Result, bail, ensure};
use regex::bytes::{Regex, RegexSet};
use serde::Deserialize;

use crate::signature::Signature;
use crate::unknown::{self, LevelMatcher, UnknownLevel};

/// The built-in knowledge base, as shipped in this crate.
pub const BUILTIN_TOML: &str = include_str!("../signatures.toml");

/// Matching looks at the first this-many bytes of a line; the rest of a longer line is ignored.
pub const MAX_MATCH_LINE: usize = 16 * 1024;

const SCHEMA_VERSION: u32 = 1;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KbFile {
    schema_version: u32,
    signature: Vec<Signature>,
}

/// What one line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineClass<'kb> {
    /// A known signature.
    Known(&'kb Signature),
    /// A warning or error line that no signature explains.
    Unknown(UnknownLevel),
    /// Anything else (INFO chatter, program output).
    Other,
}

/// Known signatures plus the machinery that finds them fast.
#[derive(Debug)]
pub struct KnowledgeBase {
    signatures: Vec<Signature>,
    set: RegexSet,
    /// Every needle: only lines holding one can match a signature.
    needles: Regex,
    levels: LevelMatcher,
    /// One literal alternation of every needle and every unknown-line trigger: a line that does
    /// not contain any of them is neither known nor unknown, and costs one SIMD scan.
    prefilter: Regex,
}

impl KnowledgeBase {
    /// The knowledge base shipped with this crate, parsed and compiled once per process.
    pub fn builtin() -> &'static KnowledgeBase {
        static KB: OnceLock<KnowledgeBase> = OnceLock::new();
        KB.get_or_init(|| {
            KnowledgeBase::from_toml(BUILTIN_TOML)
                .expect("crates/logscan/signatures.toml is valid: the crate's tests parse it")
        })
    }

    /// Parse and compile a knowledge base in the `signatures.toml` format.
    pub fn from_toml(text: &str) -> Result<KnowledgeBase> {
        let file: KbFile =
            toml::from_str(text).context("parsing the logscan knowledge base (TOML)")?;
        ensure!(
            file.schema_version == SCHEMA_VERSION,
            "knowledge base schema_version is {}, this logscan reads {SCHEMA_VERSION}",
            file.schema_version
        );
        KnowledgeBase::from_signatures(file.signature)
    }

    pub fn from_signatures(signatures: Vec<Signature>) -> Result<KnowledgeBase> {
        let mut ids = std::collections::HashSet::new();
        for sig in &signatures {
            ensure!(
                ids.insert(sig.id.as_str()),
                "signature id `{}` appears twice",
                sig.id
            );
            if sig.needles.is_empty() || sig.needles.iter().any(|n| n.is_empty()) {
                bail!(
                    "signature `{}` needs at least one non-empty needle (the prefilter literal)",
                    sig.id
                );
            }
            Regex::new(&sig.regex)
                .with_context(|| format!("signature `{}`: bad regex {:?}", sig.id, sig.regex))?;
        }
        let set = RegexSet::new(signatures.iter().map(|s| s.regex.as_str()))
            .context("compiling the signature RegexSet")?;
        let needle_list: Vec<&str> = signatures
            .iter()
            .flat_map(|s| s.needles.iter().map(String::as_str))
            .collect();
        let needles =
            literal_alternation(needle_list.iter().copied()).context("compiling the needles")?;
        let prefilter = literal_alternation(
            needle_list
                .iter()
                .copied()
                .chain(unknown::TRIGGERS.iter().copied()),
        )
        .context("compiling the prefilter")?;
        Ok(KnowledgeBase {
            signatures,
            set,
            needles,
            levels: LevelMatcher::new(),
            prefilter,
        })
    }

    pub fn signatures(&self) -> &[Signature] {
        &self.signatures
    }

    pub fn get(&self, id: &str) -> Option<&Signature> {
        self.signatures.iter().find(|s| s.id == id)
    }

    /// The known signature a line matches, if any (the first in knowledge-base order).
    pub fn classify_line(&self, line: &str) -> Option<&Signature> {
        match self.classify_bytes(line.as_bytes()) {
            LineClass::Known(sig) => Some(sig),
            _ => None,
        }
    }

    /// Classify one line (without its newline). Invalid UTF-8 is fine; only the first
    /// [`MAX_MATCH_LINE`] bytes are looked at.
    pub fn classify_bytes(&self, line: &[u8]) -> LineClass<'_> {
        let line = clip(line);
        if !self.prefilter.is_match(line) {
            return LineClass::Other;
        }
        self.classify_candidate(line)
    }

    /// Where the next line worth classifying may start: the first prefilter hit at or after `from`.
    pub(crate) fn next_candidate(&self, haystack: &[u8], from: usize) -> Option<usize> {
        self.prefilter.find_at(haystack, from).map(|m| m.start())
    }

    /// Classify a (clipped) line the prefilter already flagged.
    pub(crate) fn classify_candidate(&self, line: &[u8]) -> LineClass<'_> {
        if self.needles.is_match(line)
            && let Some(index) = self.set.matches(line).iter().next()
        {
            return LineClass::Known(&self.signatures[index]);
        }
        match self.levels.level(line) {
            Some(level) => LineClass::Unknown(level),
            None => LineClass::Other,
        }
    }
}

/// One regex that finds any of `literals` (the regex crate runs such an alternation as a SIMD
/// multi-literal search).
fn literal_alternation<'a>(literals: impl Iterator<Item = &'a str>) -> Result<Regex> {
    let mut literals: Vec<&str> = literals.collect();
    literals.sort_unstable();
    literals.dedup();
    Ok(Regex::new(
        &literals
            .iter()
            .map(|l| regex::escape(l))
            .collect::<Vec<_>>()
            .join("|"),
    )?)
}

/// A line without its trailing `\r`, cut to [`MAX_MATCH_LINE`] bytes.
pub(crate) fn clip(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    &line[..line.len().min(MAX_MATCH_LINE)]
}
