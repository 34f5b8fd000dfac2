//! Errors that point into a file: `stack.toml:12:11: message` plus a hint.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A position in a text file, 1-based, as editors and compilers print it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` in `text`. Columns count characters, not bytes.
    pub fn of_offset(file: &Path, text: &str, offset: usize) -> Location {
        let offset = offset.min(text.len());
        let before = &text[..text.floor_char_boundary(offset)];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Location {
            file: file.to_path_buf(),
            line,
            column,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

/// One problem found in a file. `related` points at the other side of a conflict
/// (e.g. the base image whose Python disagrees with the target's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub location: Option<Location>,
    pub message: String,
    pub related: Vec<(Location, String)>,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(location: Option<Location>, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            location,
            message: message.into(),
            related: Vec::new(),
            hint: None,
        }
    }
    pub fn at(
        file: &Path,
        text: &str,
        span: Range<usize>,
        message: impl Into<String>,
    ) -> Diagnostic {
        Diagnostic::new(Some(Location::of_offset(file, text, span.start)), message)
    }
    pub fn with_hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }
    pub fn with_related(mut self, location: Location, note: impl Into<String>) -> Diagnostic {
        self.related.push((location, note.into()));
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(loc) => write!(f, "{loc}: {}", self.message)?,
            None => write!(f, "{}", self.message)?,
        }
        for (loc, note) in &self.related {
            write!(f, "\n  {loc}: {note}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

/// Several diagnostics at once: a manifest is checked whole, not stopped at the first error.
#[derive(Debug)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_to_line_and_column() {
        let text = "a = 1\n[torch]\nversion = \"2.x\"\n";
        let off = text.find("\"2.x\"").unwrap();
        let loc = Location::of_offset(Path::new("stack.toml"), text, off);
        assert_eq!((loc.line, loc.column), (3, 11));
        assert_eq!(loc.to_string(), "stack.toml:3:11");
        let loc = Location::of_offset(Path::new("s"), text, 0);
        assert_eq!((loc.line, loc.column), (1, 1));
    }
}
