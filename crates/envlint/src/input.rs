//! The settings a file makes: an env file's `KEY=VALUE` lines, a shell or sbatch
//! script's `export` lines, and the `env` (and `envFrom` ConfigMaps) of every container of
//! every Kubernetes object in a YAML file (Pods, Deployments, Jobs, LeaderWorkerSets,
//! JobSets and anything else with a pod template, ours or someone else's).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_norway::Value;

/// Where a setting is written.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Place {
    pub file: String,
    /// 1-based, for line-oriented files.
    pub line: Option<usize>,
    /// For manifests: the object and container (`LeaderWorkerSet default/commstack
    /// spec.leaderWorkerTemplate.workerTemplate container main`).
    pub context: Option<String>,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(c) = &self.context {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

/// One variable set somewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub name: String,
    /// The text, or None when it is only known at run time (`valueFrom`, `$(OTHER)`, `$X`).
    pub value: Option<String>,
    pub place: Place,
    /// Settings of one scope (a container, a file) apply together: a name twice in one
    /// scope is a duplicate.
    pub scope: String,
}

/// The kind of a file, by its name and first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    EnvFile,
    Script,
    Manifest,
}

pub fn kind_of(path: &Path, text: &str) -> FileKind {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    if name.ends_with(".yaml") || name.ends_with(".yml") {
        FileKind::Manifest
    } else if name.ends_with(".sh")
        || name.ends_with(".sbatch")
        || text.starts_with("#!")
        || text.contains("\n#SBATCH")
    {
        FileKind::Script
    } else {
        FileKind::EnvFile
    }
}

/// A value is known only at run time when it refers to another variable.
fn literal(value: &str) -> Option<String> {
    (!value.contains('$')).then(|| value.to_string())
}

/// `KEY=VALUE` lines (an optional `export `, `#` comments, single or double quotes).
pub fn env_file(file: &str, text: &str) -> Vec<Setting> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line
            .strip_prefix("export ")
            .map(str::trim_start)
            .unwrap_or(line);
        if let Some((name, value)) = assignment(line) {
            out.push(Setting {
                name,
                value: value.and_then(|v| literal(&v)),
                place: Place {
                    file: file.into(),
                    line: Some(n + 1),
                    context: None,
                },
                scope: file.into(),
            });
        }
    }
    out
}

/// `export NAME=VALUE ...` lines of a shell script (one or more assignments each).
pub fn script(file: &str, text: &str) -> Vec<Setting> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("export ") else {
            continue;
        };
        for word in shell_words(rest) {
            if let Some((name, value)) = assignment(&word) {
                out.push(Setting {
                    name,
                    value: value.and_then(|v| literal(&v)),
                    place: Place {
                        file: file.into(),
                        line: Some(n + 1),
                        context: None,
                    },
                    scope: file.into(),
                });
            }
        }
    }
    out
}

/// `NAME=VALUE` with VALUE unquoted; None for the value when a quote is left open.
fn assignment(text: &str) -> Option<(String, Option<String>)> {
    let (name, value) = text.split_once('=')?;
    if !commstack_stack::env_name_ok(name) {
        return None;
    }
    let v = value.trim();
    let v = if let Some(inner) = v.strip_prefix('"') {
        inner.strip_suffix('"').map(str::to_string)
    } else if let Some(inner) = v.strip_prefix('\'') {
        inner.strip_suffix('\'').map(str::to_string)
    } else {
        // An unquoted value ends at a comment.
        Some(v.split(" #").next().unwrap_or(v).trim().to_string())
    };
    Some((name.to_string(), v))
}

/// Words of a shell line, quotes kept together (no expansion: values with `$` are taken
/// as run-time values by the caller).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (None, '#') if cur.is_empty() => break,
            (None, ';' | '&' | '|') => break,
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                cur.push(c);
            }
            (Some(q), c) if c == q => {
                quote = None;
                cur.push(c);
            }
            (_, c) => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// Every container's environment in every object of a YAML file (several documents).
pub fn manifest(file: &str, text: &str) -> Result<Vec<Setting>> {
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).with_context(|| format!("{file} is not YAML"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    // ConfigMaps first, so `envFrom` in any document of the file can name them.
    let mut config_maps: BTreeMap<String, &serde_norway::Mapping> = BTreeMap::new();
    for d in &docs {
        if d.get("kind").and_then(Value::as_str) == Some("ConfigMap")
            && let (Some(name), Some(data)) = (
                d.get("metadata")
                    .and_then(|m| m.get("name"))
                    .and_then(Value::as_str),
                d.get("data").and_then(Value::as_mapping),
            )
        {
            config_maps.insert(name.to_string(), data);
        }
    }
    let mut out = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        let object = describe(d, i);
        let mut walker = Walker {
            file,
            object: &object,
            config_maps: &config_maps,
            out: &mut out,
        };
        walker.walk(d, "");
    }
    Ok(out)
}

fn describe(doc: &Value, index: usize) -> String {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let kind = s(doc.get("kind")).unwrap_or_else(|| format!("document {}", index + 1));
    let meta = doc.get("metadata");
    let name = s(meta.and_then(|m| m.get("name"))).unwrap_or_default();
    match s(meta.and_then(|m| m.get("namespace"))) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}").trim_end().to_string(),
    }
}

struct Walker<'a> {
    file: &'a str,
    object: &'a str,
    config_maps: &'a BTreeMap<String, &'a serde_norway::Mapping>,
    out: &'a mut Vec<Setting>,
}

impl Walker<'_> {
    fn walk(&mut self, v: &Value, path: &str) {
        match v {
            Value::Mapping(m) => {
                for (k, child) in m {
                    let Some(key) = k.as_str() else { continue };
                    if matches!(key, "containers" | "initContainers" | "ephemeralContainers")
                        && let Some(list) = child.as_sequence()
                    {
                        for c in list {
                            self.container(c, &format!("{path}.{key}"));
                        }
                    } else {
                        self.walk(child, &format!("{path}.{key}"));
                    }
                }
            }
            Value::Sequence(s) => {
                for (i, child) in s.iter().enumerate() {
                    self.walk(child, &format!("{path}[{i}]"));
                }
            }
            Value::Tagged(t) => self.walk(&t.value, path),
            _ => {}
        }
    }

    fn container(&mut self, c: &Value, path: &str) {
        let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
        let where_ = format!(
            "{} {} container {name}",
            self.object,
            path.trim_start_matches('.')
        );
        let scope = format!("{}\0{where_}", self.file);
        let place = |what: String| Place {
            file: self.file.to_string(),
            line: None,
            context: Some(what),
        };
        for from in c
            .get("envFrom")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let prefix = from.get("prefix").and_then(Value::as_str).unwrap_or("");
            let Some(cm) = from
                .get("configMapRef")
                .and_then(|r| r.get("name"))
                .and_then(Value::as_str)
            else {
                continue;
            };
            if let Some(data) = self.config_maps.get(cm) {
                for (k, v) in data.iter() {
                    if let Some(k) = k.as_str() {
                        self.out.push(Setting {
                            name: format!("{prefix}{k}"),
                            value: scalar(v),
                            place: place(format!("{where_} (envFrom ConfigMap {cm})")),
                            scope: scope.clone(),
                        });
                    }
                }
            }
        }
        for e in c
            .get("env")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let Some(name) = e.get("name").and_then(Value::as_str) else {
                continue;
            };
            let value = if e.get("valueFrom").is_some() {
                None
            } else {
                e.get("value").and_then(scalar)
            };
            self.out.push(Setting {
                name: name.to_string(),
                value: value.and_then(|v| literal_k8s(&v)),
                place: place(where_.clone()),
                scope: scope.clone(),
            });
        }
    }
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Kubernetes expands `$(NAME)` in env values; `$$` is a literal `$`.
fn literal_k8s(value: &str) -> Option<String> {
    (!value.replace("$$", "").contains("$(")).then(|| value.replace("$$", "$"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files_and_scripts() {
        let s = env_file(
            "f",
            "# c\nexport A=1\nB=\"two words\"\nC='x'\nD=$HOME\n bad line\n",
        );
        let got: Vec<_> = s
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_deref(), s.place.line))
            .collect();
        assert_eq!(
            got,
            [
                ("A", Some("1"), Some(2)),
                ("B", Some("two words"), Some(3)),
                ("C", Some("x"), Some(4)),
                ("D", None, Some(5))
            ]
        );
        let s = script(
            "s",
            "#!/bin/bash\n#SBATCH --nodes=2\nexport X=1 Y=\"a b\" # c\nexport Z=$SLURM_NODEID; run\n",
        );
        let got: Vec<_> = s
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_deref()))
            .collect();
        assert_eq!(got, [("X", Some("1")), ("Y", Some("a b")), ("Z", None)]);
    }

    #[test]
    fn manifests_give_every_containers_env_and_config_maps() {
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata: {NVSHMEM_DEBUG: INFO}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: ns}\nspec:\n  template:\n    spec:\n      initContainers:\n      - name: i\n        env: [{name: A, value: '1'}]\n      containers:\n      - name: m\n        envFrom: [{configMapRef: {name: cm}, prefix: P_}]\n        env:\n        - {name: B, value: $(A)}\n        - {name: C, valueFrom: {fieldRef: {fieldPath: status.podIP}}}\n        - {name: D, value: 2}\n";
        let s = manifest("m.yaml", yaml).unwrap();
        let got: Vec<_> = s
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("A", Some("1")),
                ("P_NVSHMEM_DEBUG", Some("INFO")),
                ("B", None),
                ("C", None),
                ("D", Some("2"))
            ]
        );
        assert_eq!(
            s[4].place.to_string(),
            "m.yaml: Deployment ns/d spec.template.spec.containers container m"
        );
        assert_ne!(s[0].scope, s[4].scope);
    }
}
