//! Sources the user names, with no edit to commstack (docs/sources.md): a DeepEP commit
//! and its submodule that no table knows, made here with `git` and served as their
//! upstream by a real HTTP server on 127.0.0.1, and an NVSHMEM archive by URL and sha256.
//! `lock` fetches and hashes them and records the trust; every later fetch is held to
//! the recorded bytes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use commstack_testkit::Route;
use commstack_testkit::TestServer;
use commstack_testkit::pypi::FixtureIndex;
use sha2::{Digest, Sha256};

mod common;
use common::text;

/// torch pinning an NVSHMEM release commstack's known table does not have.
const NVSHMEM: &str = "3.9.1";

fn index() -> FixtureIndex {
    common::torch_index(NVSHMEM)
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
        .args([
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .env("GIT_AUTHOR_DATE", "2026-07-14T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-07-14T00:00:00Z")
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A git repository at `dir` with `files` committed (and `gitlink`: path -> commit, as
/// `git submodule add` leaves it); returns the commit.
fn repo(dir: &Path, files: &[(&str, &str)], gitlink: Option<(&str, &str)>) -> String {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    for (path, body) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    git(dir, &["add", "."]);
    if let Some((path, commit)) = gitlink {
        git(
            dir,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{commit},{path}"),
            ],
        );
    }
    git(dir, &["commit", "-q", "-m", "fixture"]);
    git(dir, &["rev-parse", "HEAD"])
}

/// `git archive` of HEAD as GitHub names and lays it out: `<name>-<commit>/...`, gzipped.
fn archive(dir: &Path, name: &str, commit: &str) -> Vec<u8> {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "archive",
            "--format=tar.gz",
            &format!("--prefix={name}-{commit}/"),
            "HEAD",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    out.stdout
}

fn xtask(dir: &Path, home: &str, args: &[&str]) -> Output {
    common::xtask_in(dir, &dir.join(home), args)
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The fixture world: the index, and the sources' upstream on the same server.
struct World {
    server: TestServer,
    dir: tempfile::TempDir,
    deepep: (String, Vec<u8>, PathBuf),
    fmt: (String, Vec<u8>, PathBuf),
    nvshmem: Vec<u8>,
}

impl World {
    fn new() -> World {
        let server = TestServer::start();
        index().serve(&server);
        let dir = tempfile::tempdir().unwrap();
        let fmt_dir = dir.path().join("git/fmt");
        let fmt_rev = repo(
            &fmt_dir,
            &[
                ("include/fmt/core.h", "#pragma once\n"),
                ("README.md", "fmt\n"),
            ],
            None,
        );
        let deepep_dir = dir.path().join("git/DeepEP");
        let gitmodules = format!(
            "[submodule \"third-party/fmt\"]\n\tpath = third-party/fmt\n\turl = {}.git\n",
            server.url("/fmt")
        );
        let deepep_rev = repo(
            &deepep_dir,
            &[
                (
                    "setup.py",
                    "from setuptools import setup\nsetup(name='deep_ep')\n",
                ),
                ("csrc/deep_ep.cpp", "int x;\n"),
                (".gitmodules", &gitmodules),
            ],
            Some(("third-party/fmt", &fmt_rev)),
        );
        let deepep_bytes = archive(&deepep_dir, "DeepEP", &deepep_rev);
        let fmt_bytes = archive(&fmt_dir, "fmt", &fmt_rev);
        let nvshmem = archive(&fmt_dir, "nvshmem_src", &fmt_rev);
        let world = World {
            server,
            dir,
            deepep: (deepep_rev, deepep_bytes, deepep_dir),
            fmt: (fmt_rev, fmt_bytes, fmt_dir),
            nvshmem,
        };
        world.serve(&world.deepep.1, &world.fmt.1);
        world.server.route(
            "/nvshmem/nvshmem_src_3.9.1.tar.gz",
            Route::ok(world.nvshmem.clone()),
        );
        world
    }

    fn serve(&self, deepep: &[u8], fmt: &[u8]) {
        let s = &self.server;
        s.route(
            &format!("/DeepEP/archive/{}.tar.gz", self.deepep.0),
            Route::ok(deepep.to_vec()),
        );
        s.route(
            &format!("/fmt/archive/{}.tar.gz", self.fmt.0),
            Route::ok(fmt.to_vec()),
        );
    }

    /// The stack file, with or without the submodule declared.
    fn write_stack(&self, with_submodule: bool) {
        let mut toml = format!(
            "[target]\npython = \"3.12\"\nbase = \"ubuntu-24.04\"\n\n[torch]\nversion = \"2.11.0\"\ncuda = 13\n\n\
             [nvshmem]\nversion = \"match-torch\"\ncuda-archs = [\"90\"]\nurl = \"{}\"\nsha256 = \"{}\"\n\n\
             [deepep]\nrepo = \"{}\"\nrev = \"{}\"\napi = \"v1\"\n\n",
            self.server.url("/nvshmem/nvshmem_src_3.9.1.tar.gz"),
            sha256(&self.nvshmem),
            self.server.url("/DeepEP"),
            self.deepep.0
        );
        if with_submodule {
            toml += &format!(
                "[[deepep.submodule]]\npath = \"third-party/fmt\"\nrepo = \"{}\"\nrev = \"{}\"\n\n",
                self.server.url("/fmt"),
                self.fmt.0
            );
        }
        toml += &format!(
            "[resolve]\nindex-url = \"{}\"\n",
            self.server.url("/simple")
        );
        std::fs::write(self.dir.path().join("stack.toml"), toml).unwrap();
    }

    fn xtask(&self, home: &str, args: &[&str]) -> Output {
        xtask(self.dir.path(), home, args)
    }
}

/// One `[[source]]` of stack.lock, by name.
fn locked_source(lock: &str, name: &str) -> toml::Table {
    let doc: toml::Table = lock.parse().unwrap();
    doc["source"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_table().unwrap().clone())
        .find(|s| s["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no source {name} in\n{lock}"))
}

#[test]
fn a_commit_no_table_knows_locks_and_later_fetches_are_held_to_its_bytes() {
    let w = World::new();

    // DeepEP's .gitmodules names a submodule the stack does not declare: refused, with
    // the lines to add, and nothing written.
    w.write_stack(false);
    let out = w.xtask("home", &["lock"]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("[[deepep.submodule]]\npath = \"third-party/fmt\"") && t.contains("/fmt\""),
        "{t}"
    );
    assert!(!w.dir.path().join("stack.lock").exists());

    w.write_stack(true);
    let out = w.xtask("home", &["lock"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("WARNING deepep: TRUST ON FIRST USE"), "{t}");
    assert!(
        t.contains("WARNING deepep:third-party/fmt: TRUST ON FIRST USE"),
        "{t}"
    );
    let lock = std::fs::read_to_string(w.dir.path().join("stack.lock")).unwrap();

    let (rev, bytes, checkout) = &w.deepep;
    let deepep = locked_source(&lock, "deepep");
    assert_eq!(deepep["rev"].as_str(), Some(rev.as_str()));
    assert_eq!(deepep["sha256"].as_str(), Some(sha256(bytes).as_str()));
    // The tree recorded is the commit's own: the checkout's tree (its .git is not part of
    // a tree, nor is the empty submodule directory).
    let tree = commstack_fetch::tree::tree_sha256_dir(checkout).unwrap();
    assert_eq!(deepep["tree"].as_str(), Some(tree.as_str()));
    let upstream = w.server.url(&format!("/DeepEP/archive/{rev}.tar.gz"));
    let origin = deepep["origin"].as_str().unwrap();
    assert!(
        origin.starts_with(&format!("first-use {upstream} 20")),
        "{origin}"
    );

    let (fmt_rev, fmt_bytes, fmt_checkout) = &w.fmt;
    let fmt = locked_source(&lock, "deepep:third-party/fmt");
    assert_eq!(fmt["path"].as_str(), Some("third-party/fmt"));
    assert_eq!(fmt["rev"].as_str(), Some(fmt_rev.as_str()));
    assert_eq!(fmt["sha256"].as_str(), Some(sha256(fmt_bytes).as_str()));
    let fmt_tree = commstack_fetch::tree::tree_sha256_dir(fmt_checkout).unwrap();
    assert_eq!(fmt["tree"].as_str(), Some(fmt_tree.as_str()));
    assert!(
        fmt["origin"]
            .as_str()
            .unwrap()
            .starts_with("first-use http://127.0.0.1")
    );

    let nvshmem = locked_source(&lock, "nvshmem");
    assert_eq!(
        nvshmem["sha256"].as_str(),
        Some(sha256(&w.nvshmem).as_str())
    );
    assert_eq!(
        nvshmem["origin"].as_str(),
        Some("stack.toml (nvshmem.sha256)")
    );
    assert!(nvshmem["tree"].as_str().unwrap().starts_with("sha256:"));

    // Seen once: the next lock fetches nothing, and --check passes offline.
    let hits = w.server.hits(&format!("/DeepEP/archive/{rev}.tar.gz"));
    let out = w.xtask("home", &["lock", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        w.server.hits(&format!("/DeepEP/archive/{rev}.tar.gz")),
        hits
    );
    assert_eq!(
        std::fs::read_to_string(w.dir.path().join("stack.lock")).unwrap(),
        lock
    );
    assert!(w.xtask("home", &["lock", "--check"]).status.success());

    // A fresh cache fetches the same bytes.
    let out = w.xtask("home-b", &["fetch", "--only", "sources", "--retries", "0"]);
    assert!(out.status.success(), "{}", text(&out));

    // One changed byte in DeepEP's archive upstream: refused, naming it.
    let mut bad = bytes.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    w.serve(&bad, fmt_bytes);
    let out = w.xtask("home-c", &["fetch", "--only", "sources", "--retries", "0"]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("deepep") && t.contains(&sha256(bytes)), "{t}");
    assert!(!t.contains("deepep:third-party/fmt"), "{t}");

    // The same for the submodule.
    let mut bad = fmt_bytes.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    w.serve(bytes, &bad);
    let out = w.xtask("home-d", &["fetch", "--only", "sources", "--retries", "0"]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("deepep:third-party/fmt") && t.contains(&sha256(fmt_bytes)),
        "{t}"
    );
}

/// `lock --mirror DIR` takes the sources from the mirror first (upstream is never asked
/// here: it is a closed port), and names the mirror's file as the first use; a tree the
/// stack vouches for is checked and becomes the origin, and a wrong one is refused.
#[test]
fn a_mirror_is_the_first_use_and_a_vouched_tree_is_checked() {
    let w = World::new();
    let mirror = w.dir.path().join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    let (rev, bytes, checkout) = &w.deepep;
    let (fmt_rev, fmt_bytes, _) = &w.fmt;
    std::fs::write(mirror.join(format!("DeepEP-{rev}.tar.gz")), bytes).unwrap();
    std::fs::write(mirror.join(format!("fmt-{fmt_rev}.tar.gz")), fmt_bytes).unwrap();
    w.write_stack(true);
    let stack_path = w.dir.path().join("stack.toml");
    let closed = "http://127.0.0.1:9";
    let toml = std::fs::read_to_string(&stack_path)
        .unwrap()
        .replace(&w.server.url("/DeepEP"), &format!("{closed}/DeepEP"))
        .replace(&w.server.url("/fmt"), &format!("{closed}/fmt"));
    std::fs::write(&stack_path, &toml).unwrap();
    let mirror_arg = mirror.to_str().unwrap();

    let out = w.xtask("home", &["lock", "--mirror", mirror_arg]);
    assert!(out.status.success(), "{}", text(&out));
    let lock = std::fs::read_to_string(w.dir.path().join("stack.lock")).unwrap();
    let origin = locked_source(&lock, "deepep")["origin"]
        .as_str()
        .unwrap()
        .to_string();
    let file = mirror.join(format!("DeepEP-{rev}.tar.gz"));
    assert!(
        origin.starts_with(&format!("first-use file://{} 20", file.display())),
        "{origin}"
    );

    // The stack vouches for the tree: checked, and the origin says whose word it is.
    let tree = commstack_fetch::tree::tree_sha256_dir(checkout).unwrap();
    let vouched = toml.replace(
        "api = \"v1\"\n",
        &format!("api = \"v1\"\ntree = \"{tree}\"\n"),
    );
    std::fs::write(&stack_path, &vouched).unwrap();
    std::fs::remove_file(w.dir.path().join("stack.lock")).unwrap();
    let out = w.xtask("home-b", &["lock", "--mirror", mirror_arg]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(!t.contains("WARNING deepep: TRUST ON FIRST USE"), "{t}");
    let lock = std::fs::read_to_string(w.dir.path().join("stack.lock")).unwrap();
    let deepep = locked_source(&lock, "deepep");
    assert_eq!(deepep["origin"].as_str(), Some("stack.toml (deepep.tree)"));
    assert_eq!(deepep["sha256"].as_str(), Some(sha256(bytes).as_str()));

    // A tree that is not the archive's: refused, nothing written.
    let wrong = format!("sha256:{}", "0".repeat(64));
    std::fs::write(&stack_path, vouched.replace(&tree, &wrong)).unwrap();
    std::fs::remove_file(w.dir.path().join("stack.lock")).unwrap();
    let out = w.xtask("home-c", &["lock", "--mirror", mirror_arg]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("deepep") && t.contains(&wrong), "{t}");
    assert!(!w.dir.path().join("stack.lock").exists());
}

/// `[nccl] from-source`: the release tag's archive of the locked NCCL version (torch's
/// pin here, 2.28.9: `nccl-2.28.9-1.tar.gz`), taken from a mirror (GitHub is out of
/// reach), held to the tree the stack vouches for, and every later fetch to its bytes.
#[test]
fn nccl_from_source_locks_the_release_archive_and_fetch_is_held_to_it() {
    let w = World::new();
    let mirror = w.dir.path().join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    let nccl_dir = w.dir.path().join("git/nccl");
    let nccl_rev = repo(
        &nccl_dir,
        &[(
            "makefiles/version.mk",
            "NCCL_MAJOR := 2\nNCCL_MINOR := 28\nNCCL_PATCH := 9\n",
        )],
        None,
    );
    let nccl = archive(&nccl_dir, "nccl-2.28.9-1", &nccl_rev);
    let in_mirror = mirror.join("nccl-2.28.9-1.tar.gz");
    std::fs::write(&in_mirror, &nccl).unwrap();
    w.write_stack(true);
    let stack_path = w.dir.path().join("stack.toml");
    let tree = commstack_fetch::tree::tree_sha256_archive(&in_mirror).unwrap();
    let toml = std::fs::read_to_string(&stack_path).unwrap().replace(
        "[deepep]\n",
        &format!(
            "[nccl]\nversion = \"match-torch\"\nfrom-source = true\ntree = \"{tree}\"\n\n[deepep]\n"
        ),
    );
    std::fs::write(&stack_path, &toml).unwrap();
    let mirror_arg = mirror.to_str().unwrap();

    let out = w.xtask("home", &["lock", "--mirror", mirror_arg]);
    assert!(out.status.success(), "{}", text(&out));
    let lock = std::fs::read_to_string(w.dir.path().join("stack.lock")).unwrap();
    let locked = locked_source(&lock, "nccl");
    assert_eq!(locked["version"].as_str(), Some("2.28.9"));
    assert_eq!(locked["rev"].as_str(), Some("v2.28.9-1"));
    assert_eq!(
        locked["url"].as_str(),
        Some("https://github.com/NVIDIA/nccl/archive/refs/tags/v2.28.9-1.tar.gz")
    );
    assert_eq!(locked["sha256"].as_str(), Some(sha256(&nccl).as_str()));
    assert_eq!(locked["tree"].as_str(), Some(tree.as_str()));
    assert_eq!(locked["origin"].as_str(), Some("stack.toml (nccl.tree)"));

    // Fetched from the mirror into a fresh cache: the same bytes pass.
    let fetch = [
        "fetch",
        "--only",
        "sources",
        "--retries",
        "0",
        "--mirror",
        mirror_arg,
    ];
    let out = w.xtask("home-b", &fetch);
    assert!(out.status.success(), "{}", text(&out));
    // One changed byte: refused, naming the source and its locked sha256.
    let mut bad = nccl.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    std::fs::write(&in_mirror, &bad).unwrap();
    let out = w.xtask("home-c", &fetch);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("nccl-2.28.9-1.tar.gz") && t.contains(&sha256(&nccl)),
        "{t}"
    );

    // A tree that is not the archive's: refused at lock, nothing written.
    std::fs::write(&in_mirror, &nccl).unwrap();
    let wrong = format!("sha256:{}", "0".repeat(64));
    std::fs::write(&stack_path, toml.replace(&tree, &wrong)).unwrap();
    std::fs::remove_file(w.dir.path().join("stack.lock")).unwrap();
    let out = w.xtask("home-d", &["lock", "--mirror", mirror_arg]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&wrong), "{}", text(&out));
    assert!(!w.dir.path().join("stack.lock").exists());
}
