//! The sources a stack names (docs/sources.md): `[deepep] repo`, `tree` and
//! `[[deepep.submodule]]`, `[nvshmem] url` and `sha256`, read into the model, in the
//! fingerprint only when written, and bad values pointed at.

use std::path::Path;

use commstack_stack::Stack;
use commstack_stack::manifest::DEFAULT_DEEPEP_REPO;

const BASE: &str = r#"
[target]
python = "3.12"
base = "ubuntu-24.04"

[torch]
version = "2.11.0"
cuda = 13

[nvshmem]
version = "match-torch"
cuda-archs = ["90"]

[deepep]
rev = "567632d"
api = "v1"
"#;

const TREE: &str = "sha256:790bdac49e9d2d2b29da03e52479a0f4be38011901eebadf835466efe6407cb7";

fn parse(text: &str) -> Result<Stack, String> {
    Stack::parse(Path::new("stack.toml"), text).map_err(|e| e.to_string())
}

fn named() -> String {
    BASE.replace(
        "cuda-archs = [\"90\"]\n",
        &format!(
            "cuda-archs = [\"90\"]\nurl = \"https://files.example/nvshmem_src.tar.gz\"\nsha256 = \"sha256:{}\"\n",
            "AB".repeat(32)
        ),
    )
    .replace(
        "rev = \"567632d\"\napi = \"v1\"\n",
        &format!(
            "repo = \"https://github.com/me/DeepEP/\"\nrev = \"dd758caf451848bd150e1046af3d0a73e5fff38d\"\napi = \"v2\"\ntree = \"{TREE}\"\n\n\
             [[deepep.submodule]]\npath = \"third-party/fmt/\"\nrepo = \"https://github.com/fmtlib/fmt\"\nrev = \"a4c7e17133ee9cb6a2f45545f6e974dd3c393efa\"\n"
        ),
    )
}

#[test]
fn named_sources_are_read_and_change_the_fingerprint() {
    let plain = parse(BASE).unwrap();
    assert_eq!(plain.deepep.repo, DEFAULT_DEEPEP_REPO);
    assert!(plain.deepep.submodules.is_empty() && plain.nvshmem.source.is_none());
    // A stack that names none keeps the echo it had before they existed.
    assert!(
        plain
            .echo()
            .keys()
            .all(|k| k != "deepep.repo" && k != "deepep.tree" && !k.starts_with("nvshmem.url"))
    );

    let s = parse(&named()).unwrap();
    assert_eq!(s.deepep.repo, "https://github.com/me/DeepEP");
    assert_eq!(s.deepep.tree.as_deref(), Some(TREE));
    let sub = &s.deepep.submodules[0];
    assert_eq!(sub.path, "third-party/fmt");
    assert_eq!(sub.rev, "a4c7e17133ee9cb6a2f45545f6e974dd3c393efa");
    let nv = s.nvshmem.source.as_ref().unwrap();
    assert_eq!(nv.sha256, "ab".repeat(32));
    let echo = s.echo();
    assert_eq!(
        echo["deepep.submodule.third-party/fmt"],
        "https://github.com/fmtlib/fmt a4c7e17133ee9cb6a2f45545f6e974dd3c393efa"
    );
    assert_eq!(
        echo["nvshmem.url"],
        "https://files.example/nvshmem_src.tar.gz"
    );
    let other_sub = named().replace("a4c7e17133ee", "b4c7e17133ee");
    assert_ne!(s.fingerprint(), parse(&other_sub).unwrap().fingerprint());
    assert_eq!(
        commstack_stack::manifest::git_archive_url(&s.deepep.repo, &s.deepep.rev),
        "https://github.com/me/DeepEP/archive/dd758caf451848bd150e1046af3d0a73e5fff38d.tar.gz"
    );
    assert_eq!(
        commstack_stack::manifest::git_archive_filename(&sub.repo, &sub.rev),
        "fmt-a4c7e17133ee9cb6a2f45545f6e974dd3c393efa.tar.gz"
    );
}

#[test]
fn bad_source_values_are_pointed_at() {
    let cases = [
        (
            named().replace("sha256 = \"sha256:", "# sha256 = \""),
            "stack.toml:13:7: [nvshmem] names its source with both url and sha256, or neither",
        ),
        (
            named().replace(TREE, "sha256:1234"),
            "stack.toml:20:8: deepep.tree: \"sha256:1234\" is not a tree hash",
        ),
        (
            named().replace(
                "repo = \"https://github.com/me/DeepEP/\"",
                "repo = \"git@github.com:me/DeepEP\"",
            ),
            "stack.toml:17:8: deepep.repo: \"git@github.com:me/DeepEP\" is not an http(s) URL",
        ),
        (
            named().replace(
                "\"a4c7e17133ee9cb6a2f45545f6e974dd3c393efa\"",
                "\"a4c7e17\"",
            ),
            "stack.toml:25:7: deepep.submodule[0].rev: a submodule is pinned by its full commit",
        ),
        (
            named().replace("path = \"third-party/fmt/\"", "path = \"../fmt\""),
            "stack.toml:23:8: deepep.submodule[0].path: \"../fmt\" is not a relative path",
        ),
        (
            named()
                + "\n[[deepep.submodule]]\npath = \"third-party/fmt\"\nrepo = \"https://e.example/fmt\"\nrev = \"a4c7e17133ee9cb6a2f45545f6e974dd3c393efa\"\n",
            "deepep.submodule[1].path: submodule \"third-party/fmt\" is declared twice",
        ),
    ];
    for (text, want) in cases {
        let err = parse(&text).unwrap_err();
        assert!(err.contains(want), "want {want:?} in\n{err}");
    }
}
