//! A source's `.gitmodules`: the path and URL of each submodule, as `lock` and the DeepEP
//! step read them (docs/sources.md). The subset of git's config syntax that `git
//! submodule add` writes and hand edits keep: `[submodule "NAME"]` sections, `key = value`
//! lines, `#`/`;` comments, double-quoted values. Anything else (a line continuation, an
//! include, a key outside a submodule section) is refused, naming the line, rather than
//! read another way than git reads it.

use std::collections::BTreeMap;

/// One `[submodule "NAME"]` with its `path` and `url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitSubmodule {
    pub name: String,
    /// As written, without a leading or trailing `/`.
    pub path: String,
    pub url: String,
}

/// Every submodule of `text`, in the order of their sections; an error names the line.
pub fn parse(text: &str) -> Result<Vec<GitSubmodule>, String> {
    // name -> (path, url), and the order the names came in.
    let mut found: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut section: Option<String> = None;
    for (n, raw) in text.lines().enumerate() {
        let at = |what: String| format!(".gitmodules line {}: {what}", n + 1);
        let line = strip_comment(raw.trim());
        if line.is_empty() {
            continue;
        }
        if line.ends_with('\\') {
            return Err(at("a line continuation is not read here".into()));
        }
        if let Some(header) = line.strip_prefix('[') {
            let name = header
                .strip_suffix(']')
                .and_then(|h| h.trim().strip_prefix("submodule"))
                .map(str::trim)
                .and_then(|q| q.strip_prefix('"')?.strip_suffix('"'));
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                return Err(at(format!("{raw:?} is not a [submodule \"NAME\"] section")));
            };
            if !found.contains_key(name) {
                order.push(name.to_string());
            }
            found.entry(name.to_string()).or_default();
            section = Some(name.to_string());
            continue;
        }
        let Some(name) = &section else {
            return Err(at(format!("{raw:?} is outside a [submodule] section")));
        };
        let Some((key, value)) = line.split_once('=') else {
            return Err(at(format!("{raw:?} is not `key = value`")));
        };
        let value = unquote(value.trim()).ok_or_else(|| at(format!("{raw:?}: unclosed quote")))?;
        let entry = found.get_mut(name).expect("the section was entered");
        match key.trim().to_ascii_lowercase().as_str() {
            "path" => entry.0 = Some(value.trim_matches('/').to_string()),
            "url" => entry.1 = Some(value),
            _ => {}
        }
    }
    order
        .into_iter()
        .map(|name| {
            let (path, url) = found.remove(&name).expect("listed in order");
            match (path, url) {
                (Some(path), Some(url)) => Ok(GitSubmodule { name, path, url }),
                _ => Err(format!(
                    ".gitmodules: submodule {name:?} lacks its path or url"
                )),
            }
        })
        .collect()
}

/// The line without a `#` or `;` comment outside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' | ';' if !quoted => return line[..i].trim_end(),
            _ => {}
        }
    }
    line
}

/// A value with its double quotes removed (and `\"`, `\\` unescaped); None when a quote
/// is left open.
fn unquote(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut quoted = false;
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    (!quoted).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_git_submodule_add_writes() {
        let text = "[submodule \"third-party/fmt\"]\n\tpath = third-party/fmt\n\turl = https://github.com/fmtlib/fmt.git\n\
                    # a comment\n[submodule \"x\"]\n\tpath = \"deps/x\" ; trailing\n\turl = https://e.example/x\n";
        let subs = parse(text).unwrap();
        assert_eq!(
            subs,
            [
                GitSubmodule {
                    name: "third-party/fmt".into(),
                    path: "third-party/fmt".into(),
                    url: "https://github.com/fmtlib/fmt.git".into()
                },
                GitSubmodule {
                    name: "x".into(),
                    path: "deps/x".into(),
                    url: "https://e.example/x".into()
                }
            ]
        );
        assert_eq!(parse("").unwrap(), []);
    }

    #[test]
    fn refuses_what_it_would_read_otherwise_than_git() {
        for (text, want) in [
            ("path = a\n", "line 1"),
            ("[submodule \"a\"]\npath = a \\\n", "continuation"),
            ("[include]\npath = x\n", "not a [submodule"),
            ("[submodule \"a\"]\npath = a\n", "lacks its path or url"),
            ("[submodule \"a\"]\nurl = \"x\n", "unclosed quote"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
