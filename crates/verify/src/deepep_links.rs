//! DeepEP's extension is linked to the stack's libraries and finds them: V1's
//! `deep_ep_cpp` and V2's `deep_ep/_C` NEED libnvshmem_host (V2 still builds the legacy
//! kernels on NVSHMEM), V2's also libnccl.so.2; each resolves, through the extension's own
//! RUNPATH or the search directories, to the environment's one copy of that SONAME.

use std::path::{Path, PathBuf};

use commstack_elf::{TreeLibrary, resolve_needed_with};

use crate::check::Check;
use crate::facts::is_deepep_extension;

pub const DEEPEP_LINKS: &str = "static.deepep.links";

/// One check per DeepEP extension of `stack`; none when DeepEP is not installed.
/// `search_dirs` are the directories after the extension's own (the tree's and the
/// target's system ones), `is_file` whether a path is a file of the environment.
pub fn deepep_links_checks(
    stack: &[&TreeLibrary],
    search_dirs: &[PathBuf],
    is_file: &dyn Fn(&Path) -> bool,
) -> Vec<Check> {
    stack
        .iter()
        .filter(|l| is_deepep_extension(&l.path))
        .map(|l| one(l, stack, search_dirs, is_file))
        .collect()
}

fn one(
    ext: &TreeLibrary,
    stack: &[&TreeLibrary],
    search_dirs: &[PathBuf],
    is_file: &dyn Fn(&Path) -> bool,
) -> Check {
    let v2 = ext
        .path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == "deep_ep");
    let mut wanted: Vec<&str> = vec!["libnvshmem_host"];
    if v2 {
        wanted.push("libnccl.so.2");
    }
    let resolved = resolve_needed_with(&ext.path, &ext.dynamic, search_dirs, is_file);
    let mut found = Vec::new();
    let mut wrong = Vec::new();
    for want in wanted {
        let Some(r) = resolved.iter().find(|r| r.needed.starts_with(want)) else {
            wrong.push(format!(
                "does not NEED {want}* (it NEEDs {})",
                ext.dynamic.needed.join(", ")
            ));
            continue;
        };
        let copies: Vec<&PathBuf> = stack
            .iter()
            .filter(|l| l.name == r.needed)
            .map(|l| &l.path)
            .collect();
        match &r.found {
            // Not on its own path: the process has it already when torch loaded the
            // environment's one copy by SONAME first (torch's own RUNPATH finds it).
            None if copies.len() == 1 => found.push(format!(
                "{} -> {} (by SONAME, loaded first by torch)",
                r.needed,
                copies[0].display()
            )),
            None => wrong.push(format!(
                "NEEDs {} but it resolves nowhere and the environment has {} copies of it",
                r.needed,
                copies.len()
            )),
            Some(p) if copies.len() == 1 && same_file(p, copies[0]) => {
                found.push(format!("{} -> {}", r.needed, p.display()));
            }
            Some(p) => wrong.push(format!(
                "NEEDs {} and loads {}, not the environment's one copy ({})",
                r.needed,
                p.display(),
                copies
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    if wrong.is_empty() {
        Check::pass(
            DEEPEP_LINKS,
            format!("{}: {}", ext.path.display(), found.join(", ")),
        )
    } else {
        Check::fail(
            DEEPEP_LINKS,
            format!("{}: {}", ext.path.display(), wrong.join("; ")),
            "install DeepEP and the NVSHMEM drop-in from one `cargo xtask build deepep` (the wheelhouse), with the stack's one NCCL wheel",
        )
    }
}

/// Whether two paths of the environment name the same file (a link in the search path, or
/// `..` in an `$ORIGIN` path, names the file the tree lists).
fn same_file(a: &Path, b: &Path) -> bool {
    normalize(a) == normalize(b)
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
