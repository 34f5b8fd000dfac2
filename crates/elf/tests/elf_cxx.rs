//! A copy of libstdc++ linked into a shared object, on real objects g++ builds here both
//! ways: against libstdc++.so.6 and with `-static-libstdc++` (what a compiler that finds
//! only libstdc++.a does: DeepEP V2's SIGSEGV on the H200, docs/deepep-v2.md).

use std::path::{Path, PathBuf};

use commstack_elf::ElfFile;
use commstack_testkit::native::compile;

/// DeepEP V2's include regex (csrc/jit/include_parser.hpp), linked the way torch's
/// BuildExtension links an extension.
const REGEX_SOURCE: &str = r#"#include <regex>
#include <string>
extern "C" int includes_deep_ep(const char *s) {
    static const std::regex re(R"(#include\s*<deep_ep/([^>]+)>)");
    return std::regex_search(std::string(s), re) ? 1 : 0;
}
"#;

fn regex_so(dir: &Path, file: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(file);
    let mut args = vec![
        "-shared",
        "-fPIC",
        "-O1",
        "-Wl,-O1",
        "-Wl,-Bsymbolic-functions",
    ];
    args.extend_from_slice(extra);
    compile(
        &dir.join(".src"),
        &format!("{file}.cpp"),
        REGEX_SOURCE,
        &out,
        &args,
    );
    out
}

#[test]
fn static_libstdcxx_is_seen_and_the_shared_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let shared = ElfFile::open(&regex_so(dir.path(), "_C.shared.so", &[])).unwrap();
    let copy = ElfFile::open(&regex_so(
        dir.path(),
        "_C.static.so",
        &["-static-libstdc++"],
    ))
    .unwrap();

    let needed = shared.dynamic_info().unwrap().needed;
    assert!(needed.iter().any(|n| n == "libstdc++.so.6"), "{needed:?}");
    assert_eq!(shared.libstdcxx_internals().unwrap(), Vec::<String>::new());

    let needed = copy.dynamic_info().unwrap().needed;
    assert!(
        !needed.iter().any(|n| n.starts_with("libstdc++")),
        "{needed:?}"
    );
    let internals = copy.libstdcxx_internals().unwrap();
    // The classic locale and std::locale::id are what the two copies fight over.
    assert!(
        internals.iter().any(|n| n == "_ZNSt6locale7classicEv"),
        "{} internals, none std::locale::classic(): {:?}",
        internals.len(),
        &internals[..internals.len().min(10)]
    );
    assert!(internals.len() > 50, "{}", internals.len());
}
