//! The RFC 822 style header files of a wheel (`METADATA`, `WHEEL`): `Key: value` lines,
//! continuation lines starting with whitespace, then an optional body after a blank line.

use anyhow::{Result, bail};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    pub entries: Vec<(String, String)>,
    pub body: Option<String>,
}

impl Headers {
    pub fn parse(text: &str) -> Result<Headers> {
        let mut entries: Vec<(String, String)> = Vec::new();
        let mut lines = text.split_inclusive('\n');
        let mut body = None;
        let mut consumed = 0usize;
        for raw in lines.by_ref() {
            consumed += raw.len();
            let line = raw.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                let rest = &text[consumed..];
                body = (!rest.is_empty()).then(|| rest.to_string());
                break;
            }
            if line.starts_with([' ', '\t']) {
                match entries.last_mut() {
                    Some((_, value)) => {
                        value.push('\n');
                        value.push_str(line.trim_start());
                    }
                    None => bail!("a continuation line comes before any header: {line:?}"),
                }
                continue;
            }
            let Some((key, value)) = line.split_once(':') else {
                bail!("not a `Key: value` header line: {line:?}");
            };
            entries.push((key.trim().to_string(), value.trim().to_string()));
        }
        Ok(Headers { entries, body })
    }

    /// The first value of `key` (keys compare case-insensitively).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.entries
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    pub fn push(&mut self, key: &str, value: &str) {
        self.entries.push((key.to_string(), value.to_string()));
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.entries {
            out.push_str(k);
            out.push_str(": ");
            // Multi-line values (e.g. License) continue with 8 spaces, as setuptools writes.
            out.push_str(&v.replace('\n', "\n        "));
            out.push('\n');
        }
        if let Some(body) = &self.body {
            out.push('\n');
            out.push_str(body);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_metadata_with_body_and_repeats() {
        let text = "Metadata-Version: 2.1\nName: x\nClassifier: A\nClassifier: B\nLicense: l1\n        l2\n\nThe body.\n";
        let h = Headers::parse(text).unwrap();
        assert_eq!(h.get("name"), Some("x"));
        assert_eq!(h.get_all("Classifier").collect::<Vec<_>>(), ["A", "B"]);
        assert_eq!(h.get("License"), Some("l1\nl2"));
        assert_eq!(h.body.as_deref(), Some("The body.\n"));
        assert_eq!(Headers::parse(&h.render()).unwrap(), h);
    }

    #[test]
    fn rejects_garbage() {
        assert!(Headers::parse("no colon here\n").is_err());
    }
}
