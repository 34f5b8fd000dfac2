//! NVSHMEM's own tables, read from its source: the run-time variables
//! (`NVSHMEMI_ENV_DEF(NAME, KIND, DEFAULT, CATEGORY, SHORT_DESC)` entries of the env_defs
//! headers, each with the `#if` conditions around it) and the build-time options
//! (`nvshmem_add_default_*_option` / `nvshmem_add_default_environment_path` of
//! cmake_config/NVSHMEMEnv.cmake: what CMake reads from the environment while building).

use anyhow::{Result, bail};

use crate::cpp::{self, Cond, CondStack};

/// How NVSHMEM reads a variable's text (env_defs_internal.h's `nvshmemi_getenv_<kind>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NvKind {
    /// First character 0/N/n/F/f is false, anything else (the empty text too) true.
    Bool,
    /// `strtol(s, &end, 0)` into an int.
    Int,
    /// `strtol(s, &end, 0)` into a long.
    Long,
    /// `sscanf("%lf%c")`: a number and one optional k/m/g/t multiplier (binary).
    Size,
    String,
}

impl NvKind {
    fn parse(s: &str) -> Option<NvKind> {
        Some(match s {
            "bool" => NvKind::Bool,
            "int" => NvKind::Int,
            "long" => NvKind::Long,
            "size" => NvKind::Size,
            "string" => NvKind::String,
            _ => return None,
        })
    }
}

/// One `NVSHMEMI_ENV_DEF` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvDef {
    /// The variable's name, `NVSHMEM_` + NAME.
    pub name: String,
    pub kind: NvKind,
    /// The DEFAULT argument as written (`false`, `"PMI"`, `(size_t)(1 << 29)`).
    pub default: String,
    pub category: String,
    /// SHORT_DESC with its string literals joined.
    pub description: String,
    /// The header, relative to the source root, and the entry's line.
    pub file: String,
    pub line: usize,
    /// The `#if` conditions the entry sits under (the `#ifdef NVSHMEMI_ENV_DEF` wrapper
    /// included).
    pub condition: Cond,
    /// Values the description lists as allowed ("Allowed values: PMI, MPI, ..."), if any.
    pub allowed: Vec<String>,
}

/// One build-time option or path of NVSHMEM's CMake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOption {
    pub name: String,
    pub description: String,
    pub file: String,
    pub line: usize,
}

/// Every `NVSHMEMI_ENV_DEF` entry of one header. `file` is how messages name it.
pub fn env_defs(file: &str, text: &str) -> Result<Vec<EnvDef>> {
    let clean = cpp::strip_comments(text);
    let mut conds = CondStack::default();
    let mut out = Vec::new();
    let lines: Vec<&str> = clean.split('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        // A directive, with its backslash continuations.
        if cpp::directive(lines[i]).is_some() {
            let mut joined = lines[i].trim_end().to_string();
            while joined.ends_with('\\') && i + 1 < lines.len() {
                joined.pop();
                i += 1;
                joined.push(' ');
                joined.push_str(lines[i].trim_end());
            }
            let (keyword, rest) = cpp::directive(&joined).expect("checked above");
            conds
                .apply(keyword, rest)
                .map_err(|e| anyhow::anyhow!("{file}:{}: {e}", i + 1))?;
            i += 1;
            continue;
        }
        if let Some(col) = find_invocation(lines[i]) {
            let start_line = i + 1;
            let (args, end_line) = read_args(&lines, i, col).ok_or_else(|| {
                anyhow::anyhow!(
                    "{file}:{start_line}: an NVSHMEMI_ENV_DEF( without its closing parenthesis"
                )
            })?;
            out.push(entry(file, start_line, &args, conds.current())?);
            i = end_line + 1;
            continue;
        }
        i += 1;
    }
    if conds.depth() != 0 {
        bail!("{file}: {} #if without #endif", conds.depth());
    }
    Ok(out)
}

/// The column of an `NVSHMEMI_ENV_DEF(` invocation on this line, if any (a whole word).
fn find_invocation(line: &str) -> Option<usize> {
    const MACRO: &str = "NVSHMEMI_ENV_DEF";
    let mut from = 0;
    while let Some(at) = line[from..].find(MACRO).map(|a| a + from) {
        let before_ok = at == 0
            || !line[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let after = line[at + MACRO.len()..].trim_start();
        if before_ok && after.starts_with('(') {
            return Some(at + MACRO.len() + (line[at + MACRO.len()..].len() - after.len()));
        }
        from = at + MACRO.len();
    }
    None
}

/// The top-level, comma-separated arguments of the call whose `(` is at `lines[at][col]`,
/// and the line it closes on.
fn read_args(lines: &[&str], at: usize, col: usize) -> Option<(Vec<String>, usize)> {
    let mut args = vec![String::new()];
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for (n, line) in lines.iter().enumerate().skip(at) {
        let text = if n == at { &line[col..] } else { line };
        for c in text.chars() {
            if in_str {
                args.last_mut()?.push(c);
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_str = false;
                }
                continue;
            }
            match c {
                '"' => {
                    in_str = true;
                    args.last_mut()?.push(c);
                }
                '(' => {
                    depth += 1;
                    if depth > 1 {
                        args.last_mut()?.push(c);
                    }
                }
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some((args.into_iter().map(|a| a.trim().to_string()).collect(), n));
                    }
                    args.last_mut()?.push(c);
                }
                ',' if depth == 1 => args.push(String::new()),
                c => args.last_mut()?.push(c),
            }
        }
        args.last_mut()?.push(' ');
    }
    None
}

fn entry(file: &str, line: usize, args: &[String], condition: Cond) -> Result<EnvDef> {
    if args.len() != 5 {
        bail!(
            "{file}:{line}: NVSHMEMI_ENV_DEF takes 5 arguments (NAME, KIND, DEFAULT, CATEGORY, SHORT_DESC), this one has {}",
            args.len()
        );
    }
    let name = &args[0];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!("{file}:{line}: {name:?} is not a variable name");
    }
    let Some(kind) = NvKind::parse(&args[1]) else {
        bail!(
            "{file}:{line}: NVSHMEM_{name} has the kind {:?}; this reader knows bool, int, long, size and string (env_defs_internal.h's nvshmemi_getenv_<kind>)",
            args[1]
        );
    };
    let description = join_literals(&args[4]);
    let allowed = allowed_values(&description);
    Ok(EnvDef {
        name: format!("NVSHMEM_{name}"),
        kind,
        default: args[2].clone(),
        category: args[3].clone(),
        description,
        file: file.to_string(),
        line,
        condition,
        allowed,
    })
}

/// Adjacent C string literals joined, their escapes read (`\n`, `\"`, `\\`).
fn join_literals(arg: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let mut chars = arg.chars();
    while let Some(c) = chars.next() {
        match (in_str, c) {
            (false, '"') => in_str = true,
            (true, '"') => in_str = false,
            (true, '\\') => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => {}
            },
            (true, c) => out.push(c),
            (false, _) => {}
        }
    }
    out
}

/// The values a description lists after "Allowed values:" or "Optional values:" (NVSHMEM's
/// own wording), or after "remote operations:" (REMOTE_TRANSPORT's).
fn allowed_values(description: &str) -> Vec<String> {
    for marker in ["Allowed values:", "Optional values:", "remote operations:"] {
        if let Some(at) = description.find(marker) {
            let rest = description[at + marker.len()..]
                .lines()
                .next()
                .unwrap_or("");
            return rest
                .split(',')
                .map(|v| v.trim().trim_end_matches('.').to_string())
                .filter(|v| !v.is_empty() && !v.contains(' '))
                .collect();
        }
    }
    Vec::new()
}

/// The options and paths NVSHMEMEnv.cmake takes from the environment at build time.
pub fn build_options(file: &str, text: &str) -> Vec<BuildOption> {
    let mut out: Vec<BuildOption> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let Some(args) = [
            "nvshmem_add_default_on_option(",
            "nvshmem_add_default_off_option(",
            "nvshmem_add_default_environment_path(",
        ]
        .iter()
        .find_map(|m| line.strip_prefix(m)) else {
            continue;
        };
        let name: String = args
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || out.iter().any(|o| o.name == name) {
            continue;
        }
        let description = args.split('"').nth(1).unwrap_or_default().to_string();
        out.push(BuildOption {
            name,
            description,
            file: file.to_string(),
            line: n + 1,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_entry_across_lines_with_nested_parentheses() {
        let text = "#ifdef NVSHMEMI_ENV_DEF\nNVSHMEMI_ENV_DEF(\n    BOOTSTRAP_PMI_PLUGIN, string,\n    \"nvshmem_bootstrap_pmi.so.\" ENV_DEFS_TOSTRING(NVSHMEM_BOOTSTRAP_PLUGIN_MAJOR_VERSION),\n    NVSHMEMI_ENV_CAT_BOOTSTRAP,\n    \"Absolute path, (with a comma) \"\n    \"and more\")\n#endif\n";
        let defs = env_defs("h", text).unwrap();
        assert_eq!(defs.len(), 1);
        assert_eq!(defs[0].name, "NVSHMEM_BOOTSTRAP_PMI_PLUGIN");
        assert_eq!(defs[0].kind, NvKind::String);
        assert_eq!(defs[0].line, 2);
        assert_eq!(
            defs[0].description,
            "Absolute path, (with a comma) and more"
        );
        assert_eq!(defs[0].condition.to_string(), "defined(NVSHMEMI_ENV_DEF)");
    }

    #[test]
    fn the_macro_definition_and_comments_are_not_entries() {
        let text = "/* NVSHMEMI_ENV_DEF( name, kind, default, category, short description ) */\n#define NVSHMEMI_ENV_DEF(NAME, KIND, DEFAULT, CATEGORY, SHORT_DESC) \\\n    nvshmemi_env_##KIND NAME;\n";
        assert!(env_defs("h", text).unwrap().is_empty());
    }

    #[test]
    fn a_wrong_kind_or_arity_is_an_error_naming_the_line() {
        let err = env_defs("x.h", "\nNVSHMEMI_ENV_DEF(A, float, 0, C, \"d\")\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("x.h:2: NVSHMEM_A has the kind \"float\""),
            "{err}"
        );
        let err = env_defs("x.h", "NVSHMEMI_ENV_DEF(A, int, 0)\n").unwrap_err();
        assert!(err.to_string().contains("takes 5 arguments"), "{err}");
    }

    #[test]
    fn allowed_values_come_from_the_description() {
        assert_eq!(
            allowed_values("Name of the bootstrap.\nAllowed values: PMI, MPI, SHMEM, plugin, UID"),
            ["PMI", "MPI", "SHMEM", "plugin", "UID"]
        );
        assert_eq!(
            allowed_values("Selected transport for remote operations: ibrc, ucx, none"),
            ["ibrc", "ucx", "none"]
        );
        assert!(allowed_values("Enable it").is_empty());
    }
}
