//! DeepEP's extension must use the process's libstdc++: NEED `libstdc++.so.6` and define
//! none of its internals. A copy linked in (a compiler that finds only libstdc++.a, or
//! `-static-libstdc++`) crashed DeepEP V2's JIT in `std::regex` on the H200 once torch had
//! loaded the shared one (docs/deepep-v2.md).

use std::collections::BTreeMap;
use std::path::PathBuf;

use commstack_elf::TreeLibrary;

use crate::check::Check;
use crate::facts::{FileFacts, is_deepep_extension};

pub const DEEPEP_LIBSTDCXX: &str = "static.deepep.libstdcxx";

const FIX: &str = "rebuild DeepEP with `cargo xtask build deepep --force` with a g++ first on PATH whose libstdc++.so.6 is installed (`g++ -print-file-name=libstdc++.so` prints a path): a g++ that finds only libstdc++.a (CXX=/opt/gcc/bin/g++ on the GPU machine) or -static-libstdc++ links a second copy";

/// One check per DeepEP extension of `stack`; none when DeepEP is not installed.
pub fn deepep_libstdcxx_checks(
    stack: &[&TreeLibrary],
    facts: &BTreeMap<PathBuf, FileFacts>,
) -> Vec<Check> {
    stack
        .iter()
        .filter(|l| is_deepep_extension(&l.path))
        .map(|l| one(l, facts))
        .collect()
}

fn one(lib: &TreeLibrary, facts: &BTreeMap<PathBuf, FileFacts>) -> Check {
    let path = lib.path.display();
    let internals = facts
        .get(&lib.path)
        .and_then(|f| f.library.as_ref())
        .and_then(|l| l.as_ref().ok())
        .and_then(|l| l.libstdcxx_internals.clone());
    let internals = match internals {
        Some(Ok(names)) => names,
        Some(Err(why)) => {
            return Check::fail(
                DEEPEP_LIBSTDCXX,
                format!("{path}: its symbols cannot be read: {why}"),
                FIX,
            );
        }
        None => {
            return Check::not_run(
                DEEPEP_LIBSTDCXX,
                format!("{path}: its symbols were not read"),
            );
        }
    };
    let needs = lib.dynamic.needed.iter().any(|n| n == "libstdc++.so.6");
    match (needs, internals.len()) {
        (true, 0) => Check::pass(
            DEEPEP_LIBSTDCXX,
            format!("{path} NEEDs libstdc++.so.6 and defines none of its internals"),
        ),
        (needs, n) => Check::fail(
            DEEPEP_LIBSTDCXX,
            format!(
                "{path} {} and defines {n} of libstdc++'s internals{}: a copy of libstdc++ linked in; beside torch's libstdc++.so.6 its std::locale breaks (V2's JIT crashes in std::regex)",
                if needs {
                    "NEEDs libstdc++.so.6"
                } else {
                    "does not NEED libstdc++.so.6"
                },
                internals
                    .first()
                    .map(|s| format!(" ({s}, ...)"))
                    .unwrap_or_default()
            ),
            FIX,
        ),
    }
}
