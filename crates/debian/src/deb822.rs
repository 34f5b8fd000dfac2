//! deb822 paragraphs (Packages, Release): `Field: value` lines, continuation lines that
//! start with a space or tab, paragraphs separated by blank lines (deb822(5)). Values are
//! borrowed from the text; a multi-line value keeps its continuation lines.

/// One paragraph: fields in file order, names as written.
#[derive(Debug, Default)]
pub struct Paragraph<'a> {
    fields: Vec<(&'a str, &'a str)>,
}

impl<'a> Paragraph<'a> {
    /// The value of `name` (field names are case-insensitive), first line trimmed, with its
    /// continuation lines after a newline.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}

/// Every paragraph of `text`. A line that is neither a field nor a continuation (no colon)
/// is an error naming its line number.
pub fn paragraphs(text: &str) -> Result<Vec<Paragraph<'_>>, String> {
    let mut out = Vec::new();
    let mut current = Paragraph::default();
    // (name, start of value, end of value) of the field being read, as byte offsets.
    let mut open: Option<(&str, usize, usize)> = None;
    let mut offset = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += line.len();
        let body = line.trim_end_matches(['\n', '\r']);
        if body.trim().is_empty() {
            if let Some((k, a, b)) = open.take() {
                current.fields.push((k, text[a..b].trim()));
            }
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            continue;
        }
        if body.starts_with([' ', '\t']) {
            match &mut open {
                Some((_, _, end)) => *end = start + body.len(),
                None => {
                    return Err(format!(
                        "line {}: a continuation line without a field",
                        n + 1
                    ));
                }
            }
            continue;
        }
        if body.starts_with('#') {
            continue;
        }
        if let Some((k, a, b)) = open.take() {
            current.fields.push((k, text[a..b].trim()));
        }
        let Some(colon) = body.find(':') else {
            return Err(format!(
                "line {}: {body:?} is not a `Field: value` line",
                n + 1
            ));
        };
        open = Some((&body[..colon], start + colon + 1, start + body.len()));
    }
    if let Some((k, a, b)) = open.take() {
        current.fields.push((k, text[a..b].trim()));
    }
    if !current.is_empty() {
        out.push(current);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_continuations_and_paragraphs() {
        let text =
            "Package: a\nDescription: one\n two\n .\nVersion: 1\n\n\nPackage: b\r\nDepends: c\n";
        let ps = paragraphs(text).unwrap();
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0].get("package"), Some("a"));
        assert_eq!(ps[0].get("Description"), Some("one\n two\n ."));
        assert_eq!(ps[0].get("Version"), Some("1"));
        assert_eq!(ps[1].get("Depends"), Some("c"));
        assert!(paragraphs("Package a\n").unwrap_err().contains("line 1"));
        assert!(paragraphs(" x\n").is_err());
    }
}
