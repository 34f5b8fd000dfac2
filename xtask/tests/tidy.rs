//! Tidy checks: rules of the repository's layout that the compiler does not enforce.
//! Each check is a function over a file's path and text, so that the unit tests at the
//! bottom can show it catches a bad input; the `#[test]`s above them run it over the tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "tidy/fn_length.rs"]
mod fn_length;
#[path = "tidy/imports.rs"]
mod imports;

/// The workspace root (xtask lives one level below it).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

/// Every `.rs` file under `dir` (relative to the root): its path relative to `dir`, with
/// `/` separators, and its text. Build outputs (`target/`) are skipped.
fn rust_files(dir: &str) -> Vec<(String, String)> {
    files(dir, &["rs"])
}

/// Every file under `dir` with one of the extensions `exts`, as [`rust_files`] gives them.
fn files(dir: &str, exts: &[&str]) -> Vec<(String, String)> {
    let base = root().join(dir);
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(&base)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| e.file_name() != "target")
    {
        let entry = entry.unwrap();
        let wanted = entry
            .path()
            .extension()
            .is_some_and(|e| exts.iter().any(|x| e == *x));
        if entry.file_type().is_file() && wanted {
            let rel = entry.path().strip_prefix(&base).unwrap();
            let rel = rel.to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(entry.path()).unwrap();
            out.push((rel, text));
        }
    }
    out
}

fn fail_if_any(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

/// The identifier at the start of `s` (letters, digits, `_`).
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte].matches('\n').count() + 1
}

// ---- (a) command modules do not import each other -------------------------------------

/// The command modules each name only themselves; only main.rs names them all. `path` is
/// relative to xtask/src (`cmd_bench.rs`, `cmd_bench/fetch.rs`, `flow/lock.rs`): a file
/// belongs to the module of its first component. So the flow layer and the other shared
/// modules name no command module either.
fn command_imports(path: &str, text: &str) -> Vec<String> {
    let first = path.split('/').next().unwrap_or(path);
    let own = first.strip_suffix(".rs").unwrap_or(first);
    if own == "main" {
        return Vec::new();
    }
    let mut named = Vec::new(); // (byte offset, module)
    for prefix in ["crate::", "super::"] {
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            if rest.starts_with("cmd_") {
                named.push((at, ident(rest)));
            } else if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{ctx::Ctx, cmd_x};`: the top level of the group.
                let mut depth = 0;
                let mut start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        _ if depth == 0 && start && group[i..].starts_with("cmd_") => {
                            named.push((at, ident(&group[i..])));
                        }
                        _ => {}
                    }
                    start = c == ',' || c == '{' || c.is_whitespace();
                }
            }
        }
    }
    // `#[path = "cmd_x.rs"] mod y;` pulls another command's file in under a new name.
    for (at, _) in text.match_indices("#[path") {
        let attr = &text[at..text[at..].find(']').map_or(text.len(), |e| at + e)];
        if let Some(i) = attr.find("cmd_") {
            named.push((at, ident(&attr[i..])));
        }
    }
    named
        .into_iter()
        .filter(|(_, module)| !(own.starts_with("cmd_") && *module == own))
        .map(|(at, module)| {
            format!(
                "xtask/src/{path}:{}: names the command module {module}",
                line_of(text, at)
            )
        })
        .collect()
}

#[test]
fn command_modules_do_not_import_each_other() {
    let problems = rust_files("xtask/src")
        .iter()
        .flat_map(|(path, text)| command_imports(path, text))
        .collect();
    fail_if_any(
        "a command module (or a shared one) names another command module: move what they share into xtask/src/flow",
        problems,
    );
}

// ---- (b) no tar or cp subprocesses ------------------------------------------------------

/// `Command::new("tar")`, `Command::new("cp")` and xshell's `cmd!(sh, "tar ...")` /
/// `cmd!(sh, "cp ...")`: archives and copies go through Rust code, which behaves the same
/// on every host and reports errors by path.
fn shell_outs(path: &str, text: &str) -> Vec<String> {
    let banned = |program: &str| {
        let name = program.rsplit('/').next().unwrap_or(program);
        name == "tar" || name == "cp"
    };
    // The first string literal after `at`: its contents.
    let literal = |at: usize| -> Option<&str> {
        let open = at + text[at..].find('"')?;
        let body = &text[open + 1..];
        Some(&body[..body.find('"')?])
    };
    let mut out = Vec::new();
    for (at, _) in text.match_indices("Command::new(") {
        let after = text[at + "Command::new(".len()..].trim_start();
        if after.starts_with('"')
            && let Some(program) = literal(at)
            && banned(program)
        {
            out.push(format!(
                "{path}:{}: runs {program} as a subprocess",
                line_of(text, at)
            ));
        }
    }
    for (at, _) in text.match_indices("cmd!(") {
        if let Some(command) = literal(at)
            && banned(command.split_whitespace().next().unwrap_or(""))
        {
            out.push(format!(
                "{path}:{}: runs `{command}` as a subprocess",
                line_of(text, at)
            ));
        }
    }
    out
}

#[test]
fn no_tar_or_cp_subprocesses() {
    let mut problems = Vec::new();
    for dir in ["crates", "xtask", "kernels"] {
        for (path, text) in rust_files(dir) {
            // Integration tests may run GNU tar as an independent maker of fixture
            // archives (and this file holds the bad examples its unit tests feed the
            // check); what the tool itself runs is what this rule is about.
            if path.starts_with("tests/") || path.contains("/tests/") {
                continue;
            }
            problems.extend(shell_outs(&format!("{dir}/{path}"), &text));
        }
    }
    fail_if_any(
        "tar or cp run as a subprocess: use the archive crate",
        problems,
    );
}

// ---- (c) doc comments -------------------------------------------------------------------

/// A crate root or module that does not open with a `//!` doc comment.
fn missing_doc(path: &str, text: &str) -> Option<String> {
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    (!first.starts_with("//!")).then(|| format!("{path}: does not start with a //! doc comment"))
}

#[test]
fn every_crate_and_xtask_module_has_a_doc_comment() {
    let mut roots = vec!["kernels/src/lib.rs".to_string()];
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").is_file() {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let lib = format!("crates/{name}/src/lib.rs");
            let main = format!("crates/{name}/src/main.rs");
            roots.push(if root().join(&lib).is_file() {
                lib
            } else {
                main
            });
        }
    }
    let mut problems: Vec<String> = roots
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(root().join(path))
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            missing_doc(path, &text)
        })
        .collect();
    // xtask/src/main.rs and every module of xtask.
    for (path, text) in rust_files("xtask/src") {
        problems.extend(missing_doc(&format!("xtask/src/{path}"), &text));
    }
    fail_if_any("missing crate or module documentation", problems);
}

// ---- (d) every command is in the README's table -----------------------------------------

/// The entries of a clap help text's `Commands:` section, without `help`.
fn help_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l[2..].starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The possible values of a positional argument (`build <TARGET>`: nvshmem, kernels,
/// deepep), from the long help's `Arguments:` section: targets that read as subcommands.
fn help_targets(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Arguments:")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|v| v.split(':').next().unwrap_or(v).trim().to_string())
        .collect()
}

/// Every command of the CLI: `lock`, ..., and `cache ls`, `build deepep` for those with
/// subcommands or targets. `help` runs the CLI with the given arguments.
fn cli_commands(help: impl Fn(&[&str]) -> String) -> Vec<String> {
    let mut out = Vec::new();
    for command in help_commands(&help(&["--help"])) {
        let text = help(&[&command, "--help"]);
        let subs: Vec<String> = help_commands(&text)
            .into_iter()
            .chain(help_targets(&text))
            .collect();
        if subs.is_empty() {
            out.push(command);
        } else {
            out.extend(subs.iter().map(|s| format!("{command} {s}")));
        }
    }
    out
}

/// The commands (`cache ls`, `adopt`) the table under the README's "## The flow" lacks. A
/// row `cargo xtask cache ls\|verify` covers `cache ls` and `cache verify`; `bench ...`
/// covers every bench subcommand.
fn missing_from_readme(readme: &str, commands: &[String]) -> Vec<String> {
    let rows: Vec<Vec<String>> = readme
        .lines()
        .skip_while(|l| l.trim() != "## The flow")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| `cargo xtask "))
        .map(|cell| {
            let cell = cell.split('`').next().unwrap_or("").replace("\\|", "|");
            cell.split_whitespace().map(str::to_string).collect()
        })
        .collect();
    commands
        .iter()
        .filter(|command| {
            let mut words = command.split(' ');
            let (top, sub) = (words.next().unwrap_or(""), words.next());
            !rows.iter().any(|row| {
                row.first().is_some_and(|c| c == top)
                    && sub.is_none_or(|s| {
                        row.get(1)
                            .is_some_and(|alts| alts.split('|').any(|a| a == s || a == "..."))
                    })
            })
        })
        .cloned()
        .collect()
}

/// The built xtask's output for `args` (a help text): it must succeed.
fn xtask_help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .env_remove("COMMSTACK_STACK")
        .env_remove("COMMSTACK_HOME")
        .output()
        .unwrap();
    assert!(out.status.success(), "xtask {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_command_is_in_the_readme_table() {
    let commands = cli_commands(xtask_help);
    assert!(
        commands.iter().any(|c| c == "build nvshmem"),
        "{commands:?}"
    );
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    fail_if_any(
        "commands missing from the table under \"## The flow\" in README.md",
        missing_from_readme(&readme, &commands),
    );
}

// ---- (e) CI files name only commands the CLI has ---------------------------------------

/// Every `cargo xtask <command>` in a CI file (`ci/**/*.yml`) whose command `known` (the
/// commands `cargo xtask --help` lists) lacks: a fork's workflow that calls a renamed or
/// removed command fails here, not on the runner. The global options before the command
/// (`--stack FILE`, `--home DIR`, `--quiet`) are skipped; a line ending in `\` goes on.
fn unknown_xtask_commands(path: &str, text: &str, known: &[String]) -> Vec<String> {
    // Continuations become spaces; the byte offsets (and so the line numbers) stay.
    let joined = text.replace("\\\n", "  ");
    let mut out = Vec::new();
    for (at, _) in joined.match_indices("cargo xtask") {
        let rest = &joined[at + "cargo xtask".len()..];
        if !rest.starts_with([' ', '\t']) {
            continue; // `cargo xtask-foo`, or `cargo xtask` at the end of a line
        }
        // The rest of this command: up to the line's end or a shell separator.
        let line = rest.lines().next().unwrap_or("");
        let end = line
            .find([';', '&', '|', '<', '>', '`', '"', '\'', ')', '#'])
            .unwrap_or(line.len());
        let mut words = line[..end].split_whitespace();
        let command = loop {
            match words.next() {
                Some("--stack" | "--home") => {
                    words.next();
                }
                Some(w) if w.starts_with('-') => {} // --quiet, --stack=FILE, --help
                Some(w) => break Some(w),
                None => break None,
            }
        };
        let Some(word) = command else { continue };
        let name = &word[..word
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(word.len())];
        if !known.iter().any(|k| k == name) {
            out.push(format!(
                "{path}:{}: `cargo xtask {word}`: `cargo xtask --help` lists no command {name:?}",
                line_of(text, at)
            ));
        }
    }
    out
}

#[test]
fn ci_files_name_only_xtask_commands() {
    let known = help_commands(&xtask_help(&["--help"]));
    assert!(known.iter().any(|c| c == "lock"), "{known:?}");
    let ci = files("ci", &["yml", "yaml"]);
    assert!(
        ci.iter().any(|(_, text)| text.contains("cargo xtask")),
        "no CI file under ci/ runs cargo xtask"
    );
    let problems = ci
        .iter()
        .flat_map(|(path, text)| unknown_xtask_commands(&format!("ci/{path}"), text, &known))
        .collect();
    fail_if_any(
        "a CI file runs a cargo xtask command the CLI does not have",
        problems,
    );
}

// ---- (f) no long functions ---------------------------------------------------------------

/// The most lines a function of the crates' code (crates/*, kernels, xtask) may have, from
/// its `fn` to its closing brace: past that it does several things, each of which wants a
/// name of its own.
const FN_MAX_LINES: usize = 120;

/// The same for test code (`#[cfg(test)]` modules, `#[test]` functions, tests/ directories):
/// a test of a real part often reads best as one story (set up, act, check each effect), so
/// it may be longer, but not without bound.
const TEST_FN_MAX_LINES: usize = 250;

/// The functions of `text` (the file `path`) over the limit: (function, lines, message).
/// Test code (`test` for a whole file under tests/) has the higher limit.
fn long_functions(path: &str, text: &str, test: bool) -> Vec<(String, usize, String)> {
    let functions = fn_length::functions(text).unwrap_or_else(|e| {
        let at = e.span().start();
        panic!(
            "{path}:{}:{}: syn cannot parse it: {e}",
            at.line,
            at.column + 1
        )
    });
    functions
        .into_iter()
        .filter_map(|f| {
            let test = test || f.test;
            let max = if test {
                TEST_FN_MAX_LINES
            } else {
                FN_MAX_LINES
            };
            (f.lines > max).then(|| {
                let message = format!(
                    "{path}:{}: {} is {} lines (at most {max}{})",
                    f.line,
                    f.name,
                    f.lines,
                    if test { " for test code" } else { "" }
                );
                (f.name, f.lines, message)
            })
        })
        .collect()
}

/// Whether `path` (from the root) is a file of tests: under a tests/ or benches/ directory.
fn test_file(path: &str) -> bool {
    path.split('/')
        .any(|part| part == "tests" || part == "benches")
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut problems = Vec::new();
    for dir in ["crates", "kernels", "xtask"] {
        for (rel, text) in rust_files(dir) {
            let path = format!("{dir}/{rel}");
            problems.extend(
                long_functions(&path, &text, test_file(&path))
                    .into_iter()
                    .map(|(_, _, message)| message),
            );
        }
    }
    fail_if_any(
        "functions over the limit (split each into named steps)",
        problems,
    );
}

// ---- (g) no import circle between the files of a crate ---------------------------------

/// `util`-style helper modules: below everything else of their crate, they import none of it.
const HELPER_FILE_NAMES: &[&str] = &["util.rs", "utils.rs", "helpers.rs"];

/// The crate roots of the package in `dir` (relative paths among `files`): lib, main,
/// bins, build script, tests, benches, examples.
fn crate_roots(files: &BTreeMap<String, String>, dir: &str) -> Vec<String> {
    files
        .keys()
        .filter(|path| {
            let Some(rel) = path.strip_prefix(&format!("{dir}/")) else {
                return false;
            };
            let parts: Vec<&str> = rel.split('/').collect();
            matches!(
                parts.as_slice(),
                ["src", "lib.rs" | "main.rs"]
                    | ["build.rs"]
                    | ["src", "bin", _]
                    | ["src", "bin", _, "main.rs"]
                    | ["tests" | "benches" | "examples", _]
                    | ["tests" | "benches" | "examples", _, "main.rs"]
            ) && rel.ends_with(".rs")
        })
        .cloned()
        .collect()
}

/// The import graphs of every crate of the package in `dir`.
fn package_graphs(files: &BTreeMap<String, String>, dir: &str) -> Vec<imports::Graph> {
    crate_roots(files, dir)
        .iter()
        .map(|root| imports::graph(files, root).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// Every circle of `graphs`, each a problem.
fn circle_problems(graphs: &[imports::Graph]) -> Vec<String> {
    let mut problems: Vec<String> = graphs
        .iter()
        .flat_map(imports::circles)
        .map(|circle| format!("a circle of {circle}"))
        .collect();
    problems.sort();
    problems.dedup();
    problems
}

/// What helper modules (by [`HELPER_FILE_NAMES`]) of `graphs` import of their own crate.
fn helper_problems(graphs: &[imports::Graph]) -> Vec<String> {
    let mut problems = Vec::new();
    for graph in graphs {
        for ((from, to), names) in &graph.edges {
            let name = from.rsplit('/').next().unwrap_or(from);
            if HELPER_FILE_NAMES.contains(&name) {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                problems.push(format!(
                    "{from} imports {to} ({}): a helper module imports nothing of its crate",
                    names.join(", ")
                ));
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// Every `.rs` file of the packages (crates/*, kernels, xtask), by path from the root.
fn package_files() -> (BTreeMap<String, String>, Vec<String>) {
    let mut files = BTreeMap::new();
    for dir in ["crates", "kernels", "xtask"] {
        for (rel, text) in rust_files(dir) {
            files.insert(format!("{dir}/{rel}"), text);
        }
    }
    let mut packages: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("Cargo.toml").is_file())
        .map(|d| format!("crates/{}", d.file_name().unwrap().to_string_lossy()))
        .collect();
    packages.sort();
    packages.extend(["kernels".to_string(), "xtask".to_string()]);
    (files, packages)
}

#[test]
fn no_import_circle_between_the_files_of_a_crate() {
    let (files, packages) = package_files();
    let graphs: Vec<imports::Graph> = packages
        .iter()
        .flat_map(|p| package_graphs(&files, p))
        .collect();
    assert!(
        graphs.iter().any(|g| g.edges.len() > 10),
        "the import graphs have (almost) no edges: the reading is broken"
    );
    fail_if_any(
        "import circles between the files of a crate (move what they share into a module of its own, below both)",
        circle_problems(&graphs),
    );
}

#[test]
fn helper_modules_import_nothing_of_their_crate() {
    let (files, packages) = package_files();
    let graphs: Vec<imports::Graph> = packages
        .iter()
        .flat_map(|p| package_graphs(&files, p))
        .collect();
    fail_if_any(
        "util-style helper modules that import their own crate (move what they use below them, or move them up)",
        helper_problems(&graphs),
    );
}

// ---- each check fails on a bad input ----------------------------------------------------

#[test]
fn command_imports_catches_one_command_naming_another() {
    let bad = "use crate::cmd_build::deepep::{AdoptPointer, POINTER_FILE};\n";
    assert_eq!(
        command_imports("cmd_adopt.rs", bad),
        ["xtask/src/cmd_adopt.rs:1: names the command module cmd_build"]
    );
    let grouped = "use crate::ctx::Ctx;\nuse crate::{\n    ctx,\n    cmd_store::human,\n};\n";
    assert_eq!(command_imports("cmd_fetch.rs", grouped).len(), 1);
    let path_attr = "#[path = \"cmd_build_deepep.rs\"]\npub mod deepep;\n";
    assert_eq!(command_imports("cmd_build.rs", path_attr).len(), 1);
    let from_super = "fn f() { super::cmd_toolchain::resolve() }";
    assert_eq!(command_imports("cmd_gpu_bundle.rs", from_super).len(), 1);
    // The flow layer names no command module either.
    let flow = "let p = crate::cmd_fetch::Part::Sources;";
    assert_eq!(command_imports("flow/nvshmem.rs", flow).len(), 1);
    // Its own submodules, main.rs, and other shared modules are fine.
    assert!(command_imports("cmd_bench.rs", "crate::cmd_bench::fetch::cold()").is_empty());
    assert!(command_imports("cmd_bench/fetch.rs", "crate::cmd_bench::Which").is_empty());
    assert!(command_imports("main.rs", "cmd_build::run(&ctx, *args)").is_empty());
    assert!(command_imports("main.rs", "crate::cmd_lock::Args").is_empty());
    assert!(command_imports("cmd_fetch.rs", "use crate::flow::fetch::FetchFlags;").is_empty());
}

#[test]
fn shell_outs_catches_tar_and_cp() {
    let bad = [
        "let s = Command::new(\"tar\").arg(\"-xzf\").status();",
        "std::process::Command::new( \"cp\" )",
        "xshell::cmd!(sh, \"tar -xzf {archive} -C {src} --strip-components=1\")",
        "cmd!(\n    sh,\n    \"cp -a {rdma} {dir}/rdma-core\"\n)\n.run()?;",
        "Command::new(\"/bin/tar\")",
    ];
    for text in bad {
        assert_eq!(shell_outs("x.rs", text).len(), 1, "{text}");
    }
    assert_eq!(
        shell_outs("x.rs", "\n\ncmd!(sh, \"cp a b\")")[0],
        "x.rs:3: runs `cp a b` as a subprocess"
    );
    let fine = [
        "cmd!(sh, \"cargo build --release --locked -p xtask\")",
        "cmd!(sh, \"strip {to}\")",
        "Command::new(\"tarball-tool\")",
        "Command::new(&exe).args([\"cp\"])",
        "let t = \"tar\";",
    ];
    for text in fine {
        assert!(shell_outs("x.rs", text).is_empty(), "{text}");
    }
}

#[test]
fn missing_doc_catches_an_undocumented_file() {
    assert!(missing_doc("a/lib.rs", "use std::path::Path;\n").is_some());
    assert!(missing_doc("a/lib.rs", "// a plain comment\n//! late\n").is_some());
    assert!(missing_doc("a/lib.rs", "/// an item doc\nfn f() {}\n").is_some());
    assert!(missing_doc("a/lib.rs", "").is_some());
    assert!(missing_doc("a/lib.rs", "\n//! The crate.\n").is_none());
}

const TOP_HELP: &str = "\
Usage: cargo xtask [OPTIONS] <COMMAND>

Commands:
  lock        Resolve stack.toml into stack.lock
  cache       Inspect, verify or prune the download cache
  build       Build one part of the stack (nvshmem, kernels, deepep) into the store
  adopt       Bring an existing Python environment onto the stack: compare with the lock, install
              the drop-in NVSHMEM and DeepEP with a backup
  bench       Run a benchmark
  help        Print this message or the help of the given subcommand(s)

Options:
  -q, --quiet
          Print less
";

const BUILD_HELP: &str = "\
Usage: cargo xtask build [OPTIONS] <TARGET>

Arguments:
  <TARGET>
          What to build

          Possible values:
          - nvshmem: NVSHMEM from source
          - kernels: The CUDA kernel crate
          - deepep:  DeepEP into a wheel and the wheelhouse (managed venv, or --python PATH to
            adopt)

Options:
      --only <PART,...>
          Possible values:
          - sources
";

const CACHE_HELP: &str = "\
Commands:
  ls      List the cached files
  hash    Print the sha256
  help    Print this message or the help of the given subcommand(s)
";

const BENCH_HELP: &str = "Commands:\n  lock  Time lock\n  fetch  Time fetch\n";

#[test]
fn cli_commands_reads_commands_subcommands_and_targets() {
    let commands = cli_commands(|args: &[&str]| match args[0] {
        "--help" => TOP_HELP.into(),
        "build" => BUILD_HELP.into(),
        "cache" => CACHE_HELP.into(),
        "bench" => BENCH_HELP.into(),
        _ => "Usage: cargo xtask x\n".into(),
    });
    assert_eq!(
        commands,
        [
            "lock",
            "cache ls",
            "cache hash",
            "build nvshmem",
            "build kernels",
            "build deepep",
            "adopt",
            "bench lock",
            "bench fetch"
        ]
    );
}

#[test]
fn missing_from_readme_names_the_missing_commands() {
    let readme = "\
# x

## The flow

| command | what it does |
| --- | --- |
| `cargo xtask lock [--check]` | resolve |
| `cargo xtask cache ls\\|verify` | the cache |
| `cargo xtask build nvshmem` | NVSHMEM, `nvshmem.static-lib = true` |
| `cargo xtask bench ...` | benchmarks |

## Layout

| `cargo xtask adopt` | not the flow's table |
";
    let commands: Vec<String> = [
        "lock",
        "cache ls",
        "cache hash",
        "build nvshmem",
        "build deepep",
        "adopt",
        "bench fetch",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        missing_from_readme(readme, &commands),
        ["cache hash", "build deepep", "adopt"]
    );
}

#[test]
fn unknown_xtask_commands_catches_a_command_the_cli_lacks() {
    let known: Vec<String> = ["lock", "build", "fetch"].map(String::from).to_vec();
    let bad = "\
jobs:
  cpu:
    steps:
      - run: cargo xtask lock --check
      - run: cargo xtask --stack stacks/gpu-adopt.toml --quiet bulid --gpus
      - run: |
          cargo xtask \\
            --home /h imagine --verify
";
    assert_eq!(
        unknown_xtask_commands("ci/x.yml", bad, &known),
        [
            "ci/x.yml:5: `cargo xtask bulid`: `cargo xtask --help` lists no command \"bulid\"",
            "ci/x.yml:7: `cargo xtask imagine`: `cargo xtask --help` lists no command \"imagine\""
        ]
    );
    let fine = "\
- run: cargo xtask build --locked --gpus --json >out.json
- run: cargo xtask --stack=stacks/gpu-adopt.toml fetch --only sources
# `cargo xtask lock`'s check; cargo xtask --help; cargo xtask-other x
- run: cargo xtask -q build; cargo xtask fetch && cargo xtask lock
";
    assert!(
        unknown_xtask_commands("ci/x.yml", fine, &known).is_empty(),
        "{:?}",
        unknown_xtask_commands("ci/x.yml", fine, &known)
    );
}

#[test]
fn long_functions_catches_a_function_over_the_limit() {
    let function = |name: &str, lines: usize| {
        // `fn` line, body lines, closing brace.
        format!(
            "fn {name}() {{\n{}}}\n",
            "    let _ = 1;\n".repeat(lines - 2)
        )
    };
    let long = function("long", FN_MAX_LINES + 1);
    assert_eq!(
        long_functions("crates/x/src/a.rs", &long, false)
            .into_iter()
            .map(|(_, _, m)| m)
            .collect::<Vec<_>>(),
        [format!(
            "crates/x/src/a.rs:1: long is {} lines (at most {FN_MAX_LINES})",
            FN_MAX_LINES + 1
        )]
    );
    let method = format!("impl A {{\n{}}}\n", function("long", FN_MAX_LINES + 1));
    assert_eq!(
        long_functions("a.rs", &method, false)[0].0,
        "A::long",
        "a method"
    );
    assert!(long_functions("a.rs", &function("fits", FN_MAX_LINES), false).is_empty());
    // Test code has the higher limit, in a #[cfg(test)] module or in a tests/ file.
    let in_tests = format!("#[cfg(test)]\nmod tests {{\n{long}}}\n");
    assert!(long_functions("a.rs", &in_tests, false).is_empty());
    assert!(long_functions("tests/t.rs", &long, true).is_empty());
    let too_long = function("story", TEST_FN_MAX_LINES + 1);
    assert_eq!(long_functions("tests/t.rs", &too_long, true).len(), 1);
    let too_long = format!("#[cfg(test)]\nmod tests {{\n{too_long}}}\n");
    assert_eq!(long_functions("a.rs", &too_long, false).len(), 1);
    assert!(test_file("crates/x/tests/common/mod.rs") && !test_file("crates/x/src/a.rs"));
}

/// A small crate in memory: `files` as (path, text) under `c/`.
fn crate_of(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, t)| (format!("c/{p}"), t.to_string()))
        .collect()
}

/// The circles of the crate `files` (root c/src/lib.rs), as sorted file lists.
fn circles_of(files: &BTreeMap<String, String>) -> Vec<Vec<String>> {
    let graph = imports::graph(files, "c/src/lib.rs").unwrap();
    imports::circles(&graph)
        .into_iter()
        .map(|c| c.files.into_iter().collect())
        .collect()
}

#[test]
fn import_circles_are_found_whichever_way_a_file_names_another() {
    let lib = "mod a;\nmod b;\nmod c;\npub use a::A;\n";
    // The negative control: a.rs and b.rs import each other.
    let circle = crate_of(&[
        ("src/lib.rs", lib),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        (
            "src/b.rs",
            "pub struct B;\nfn f() { let _ = crate::a::A; }\n",
        ),
        ("src/c.rs", "use crate::a::A;\n"),
    ]);
    assert_eq!(circles_of(&circle), [["c/src/a.rs", "c/src/b.rs"]]);
    let graph = imports::graph(&circle, "c/src/lib.rs").unwrap();
    let found = imports::circles(&graph);
    assert_eq!(
        found[0].to_string(),
        "2 files: c/src/a.rs, c/src/b.rs\n      c/src/a.rs -> c/src/b.rs: B\n      c/src/b.rs -> c/src/a.rs: A"
    );
    // Without b's path to a, no circle: lib.rs's `mod` declarations are not imports, and
    // its `pub use a::A` does not tie it to c.rs, which names a's A.
    let no_circle = crate_of(&[
        ("src/lib.rs", lib),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        ("src/b.rs", "pub struct B;\n"),
        ("src/c.rs", "use crate::a::A;\n"),
    ]);
    assert!(circles_of(&no_circle).is_empty());
    // Each other way of naming a file: a re-export through the root, a macro's argument,
    // super::, a `use` of the module then a path through it, a nested module dir, #[path],
    // an inline test module's `use super::*` and a child module's name.
    let ways = [
        ("src/b.rs", "pub struct B;\nfn f() { let _ = crate::A; }\n"),
        (
            "src/b.rs",
            "pub struct B;\nfn f() { println!(\"{}\", crate::a::x()); }\n",
        ),
        (
            "src/b.rs",
            "pub struct B;\nfn f() -> super::a::A { todo!() }\n",
        ),
        (
            "src/b.rs",
            "use crate::a;\npub struct B;\nfn f() { a::x(); }\n",
        ),
        (
            "src/b.rs",
            "pub struct B;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn f() { let _ = crate::a::A; }\n}\n",
        ),
    ];
    for (path, text) in ways {
        let files = crate_of(&[
            ("src/lib.rs", lib),
            (
                "src/a.rs",
                "use crate::b::B;\npub struct A;\npub fn x() {}\n",
            ),
            (path, text),
            ("src/c.rs", ""),
        ]);
        assert_eq!(circles_of(&files), [["c/src/a.rs", "c/src/b.rs"]], "{text}");
    }
    let nested = crate_of(&[
        ("src/lib.rs", "mod flow;\nmod d;\n"),
        ("src/flow/mod.rs", "pub mod image;\nmod kernels;\n"),
        (
            "src/flow/image.rs",
            "use super::kernels::K;\npub struct I;\n",
        ),
        (
            "src/flow/kernels.rs",
            "#[path = \"../d_impl.rs\"]\nmod dimpl;\npub struct K(crate::d::D);\n",
        ),
        ("src/d_impl.rs", ""),
        ("src/d.rs", "pub struct D(crate::flow::image::I);\n"),
    ]);
    assert_eq!(
        circles_of(&nested),
        [["c/src/d.rs", "c/src/flow/image.rs", "c/src/flow/kernels.rs"]]
    );
    // The parent names its child's item: an import, the other way than `mod`.
    let parent = crate_of(&[
        (
            "src/lib.rs",
            "mod a;\nfn f() { a::x(); }\npub fn helper() {}\n",
        ),
        ("src/a.rs", "pub fn x() { crate::helper(); }\n"),
    ]);
    assert_eq!(circles_of(&parent), [["c/src/a.rs", "c/src/lib.rs"]]);
    // A `mod` whose file is missing is an error, not a smaller graph.
    let missing = crate_of(&[("src/lib.rs", "mod gone;\n")]);
    assert!(
        imports::graph(&missing, "c/src/lib.rs")
            .unwrap_err()
            .contains("gone")
    );
}

#[test]
fn circle_problems_name_each_circle() {
    let files = crate_of(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        ("src/b.rs", "pub struct B;\nuse crate::a::A;\n"),
        ("src/c.rs", "pub struct C;\n"),
    ]);
    let graphs = [imports::graph(&files, "c/src/lib.rs").unwrap()];
    let found = circle_problems(&graphs);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("a circle of 2 files: c/src/a.rs, c/src/b.rs"),
        "{found:?}"
    );
    let no_circle = crate_of(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\n"),
        ("src/b.rs", "pub struct B;\n"),
    ]);
    assert!(circle_problems(&[imports::graph(&no_circle, "c/src/lib.rs").unwrap()]).is_empty());
}

#[test]
fn helper_problems_catch_a_helper_module_importing_its_crate() {
    let files = crate_of(&[
        ("src/lib.rs", "mod a;\nmod util;\n"),
        ("src/a.rs", "use crate::util::human;\npub struct A;\n"),
        (
            "src/util.rs",
            "pub fn human() {}\npub fn f(_: crate::a::A) {}\n",
        ),
    ]);
    let graphs = [imports::graph(&files, "c/src/lib.rs").unwrap()];
    assert_eq!(
        helper_problems(&graphs),
        ["c/src/util.rs imports c/src/a.rs (A): a helper module imports nothing of its crate"]
    );
    let below = crate_of(&[
        ("src/lib.rs", "mod a;\nmod util;\n"),
        ("src/a.rs", "use crate::util::human;\n"),
        ("src/util.rs", "pub fn human() {}\n"),
    ]);
    let graphs = [imports::graph(&below, "c/src/lib.rs").unwrap()];
    assert!(helper_problems(&graphs).is_empty());
}
