//! The static level over an image's layer tars: real tars of real (gcc-built) shared
//! objects, read in place. The same checks as over the directory they were made from;
//! whiteouts, opaque directories, symbolic links and a second copy in a later layer seen
//! as Docker's overlay would see them.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use commstack_verify::layers::{ImageFiles, LayerIndex, index_layer};
use commstack_verify::static_level::{StaticFindings, check_gathered, check_static};
use commstack_verify::{Expectations, Status};

const SITE: &str = "opt/commstack/venv/lib/python3.11/site-packages";

enum Item<'a> {
    /// A directory of this machine, put at the path.
    Tree(&'a Path),
    File(&'a Path),
    Symlink(&'a str),
    Empty,
}

/// A layer tar holding `items` (path in the image, without the leading `/`).
fn layer(out: &Path, items: &[(&str, Item<'_>)]) -> PathBuf {
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    b.follow_symlinks(false);
    for (at, item) in items {
        match item {
            Item::Tree(dir) => b.append_dir_all(at, dir).unwrap(),
            Item::File(f) => b.append_path_with_name(f, at).unwrap(),
            Item::Symlink(target) => {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                h.set_mode(0o777);
                b.append_link(&mut h, at, target).unwrap();
            }
            Item::Empty => {
                let mut h = tar::Header::new_gnu();
                h.set_size(0);
                h.set_mode(0o644);
                b.append_data(&mut h, at, std::io::empty()).unwrap();
            }
        }
    }
    b.into_inner().unwrap();
    out.to_path_buf()
}

fn index(tar: &Path) -> LayerIndex {
    let index = index_layer(tar, &format!("sha256:{}", tar.display())).unwrap();
    // What the pipeline keeps between builds is this JSON: it must give the same index.
    let again: LayerIndex = serde_json::from_str(&serde_json::to_string(&index).unwrap()).unwrap();
    assert_eq!(again, index);
    again
}

fn checks(f: &StaticFindings) -> Vec<(String, Status)> {
    let mut v: Vec<(String, Status)> = f
        .checks
        .iter()
        .map(|c| (c.name.clone(), c.status))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn find<'a>(f: &'a StaticFindings, name: &str) -> &'a commstack_verify::Check {
    f.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}: {:#?}", f.checks))
}

/// A Debian-like base (`/lib` a link to `usr/lib`, libc in it) and a site-packages layer.
struct Fixture {
    _dir: tempfile::TempDir,
    site: PathBuf,
    base: PathBuf,
    venv: PathBuf,
    expect: Expectations,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    fake_deep_ep(&site, None);
    let base = layer(
        &dir.path().join("base.tar"),
        &[
            ("lib", Item::Symlink("usr/lib")),
            (
                "usr/lib/x86_64-linux-gnu/libc.so.6",
                Item::File(Path::new("/lib/x86_64-linux-gnu/libc.so.6")),
            ),
        ],
    );
    let venv = layer(&dir.path().join("venv.tar"), &[(SITE, Item::Tree(&site))]);
    let mut expect = Expectations::new();
    // Only the directory reached through the base's link: resolution must follow it.
    expect.system_lib_dirs = vec![PathBuf::from("/lib/x86_64-linux-gnu")];
    expect.target_glibc = Some("2.36".parse().unwrap());
    Fixture {
        _dir: dir,
        site,
        base,
        venv,
        expect,
    }
}

fn over_layers(layers: &[&Path], expect: &Expectations) -> StaticFindings {
    let files = ImageFiles::new(layers.iter().map(|l| index(l)).collect());
    check_gathered(&files.gather(&[PathBuf::from("/").join(SITE)]), expect)
}

#[test]
fn the_layers_of_an_image_give_the_checks_the_directory_gives() {
    let f = fixture();
    let here = check_static(std::slice::from_ref(&f.site), &f.expect);
    let image = over_layers(&[&f.base, &f.venv], &f.expect);
    assert!(image.libraries >= 3, "{image:#?}");
    assert_eq!(image.libraries, here.libraries);
    assert_eq!(checks(&image), checks(&here));
    for name in [
        "static.nvshmem-host.build-vars",
        "static.nvshmem-host.no-libnccl",
        "static.one-copy.libnvshmem_host.so.3",
        "static.one-copy.libnccl.so.2",
        "static.needed-resolve",
        "static.glibc",
    ] {
        assert_eq!(
            find(&image, name).status,
            Status::Passed,
            "{name}: {image:#?}"
        );
    }
    // libc is found only through the base's `/lib -> usr/lib`: without the link the
    // libraries' DT_NEEDED libc.so.6 is unresolved.
    let no_link = layer(
        &f._dir.path().join("nolink.tar"),
        &[(
            "usr/lib/x86_64-linux-gnu/libc.so.6",
            Item::File(Path::new("/lib/x86_64-linux-gnu/libc.so.6")),
        )],
    );
    let broken = over_layers(&[&no_link, &f.venv], &f.expect);
    let c = find(&broken, "static.needed-resolve");
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains("libc.so.6"), "{c:?}");
}

#[test]
fn whiteouts_and_opaque_directories_remove_what_lower_layers_hold() {
    let f = fixture();
    let dir = f._dir.path();
    let nccl = format!("{SITE}/nvidia/nccl/lib");
    // A later layer deletes libnccl.so.2 (`.wh.` file).
    let gone = layer(
        &dir.join("gone.tar"),
        &[(&format!("{nccl}/.wh.libnccl.so.2"), Item::Empty)],
    );
    let image = over_layers(&[&f.base, &f.venv, &gone], &f.expect);
    let c = find(&image, "static.one-copy.libnccl.so.2");
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains("no libnccl.so.2"), "{c:?}");
    let c = find(&image, "static.needed-resolve");
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains("libnccl.so.2"), "{c:?}");

    // An opaque directory hides the whole lower nvidia/nccl.
    let opaque = layer(
        &dir.join("opaque.tar"),
        &[(&format!("{SITE}/nvidia/nccl/.wh..wh..opq"), Item::Empty)],
    );
    let image = over_layers(&[&f.base, &f.venv, &opaque], &f.expect);
    assert_eq!(
        find(&image, "static.one-copy.libnccl.so.2").status,
        Status::Failed
    );

    // A second libnvshmem_host in torch/lib from a later layer is a second copy.
    let second = layer(
        &dir.join("second.tar"),
        &[(
            &format!("{SITE}/torch/lib/libnvshmem_host.so.3"),
            Item::File(&f.site.join("nvidia/nvshmem/lib/libnvshmem_host.so.3")),
        )],
    );
    let image = over_layers(&[&f.base, &f.venv, &second], &f.expect);
    let c = find(&image, "static.one-copy.libnvshmem_host.so.3");
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains("2 copies"), "{c:?}");

    // The same file again at the same path replaces it: still one copy.
    let same = layer(
        &dir.join("same.tar"),
        &[(
            &format!("{SITE}/nvidia/nvshmem/lib/libnvshmem_host.so.3"),
            Item::File(&f.site.join("nvidia/nvshmem/lib/libnvshmem_host.so.3")),
        )],
    );
    let image = over_layers(&[&f.base, &f.venv, &same], &f.expect);
    assert_eq!(
        find(&image, "static.one-copy.libnvshmem_host.so.3").status,
        Status::Passed
    );
}

#[test]
fn an_nccl_on_nvshmem_in_a_layer_fails_from_the_tars_bytes() {
    let f = fixture();
    let dir = f._dir.path();
    let nccl_on = dir.join("on");
    shared_lib(
        &nccl_on,
        "libnvshmem_host.so.3",
        "libnvshmem_host.so.3",
        &nvshmem_like_source("ON", "3.4.5", "const char *n = \"libnccl.so.2\";"),
        &[],
    );
    let over = layer(
        &dir.join("over.tar"),
        &[(
            &format!("{SITE}/nvidia/nvshmem/lib/libnvshmem_host.so.3"),
            Item::File(&nccl_on.join("libnvshmem_host.so.3")),
        )],
    );
    let image = over_layers(&[&f.base, &f.venv, &over], &f.expect);
    let c = find(&image, "static.nvshmem-host.build-vars");
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains("NVSHMEM_USE_NCCL"), "{c:?}");
    let c = find(&image, "static.nvshmem-host.no-libnccl");
    assert_eq!(c.status, Status::Failed, "{c:?}");
}

#[test]
fn a_damaged_layer_tar_is_an_error_naming_it() {
    let f = fixture();
    let mut bytes = std::fs::read(&f.venv).unwrap();
    // One flipped bit in the first header's name: its checksum no longer matches.
    bytes[0] ^= 0x20;
    let bad = f._dir.path().join("bad.tar");
    std::fs::write(&bad, &bytes).unwrap();
    let err = index_layer(&bad, "sha256:bad").map(|_| ()).unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains(&bad.display().to_string()), "{text}");
    assert!(text.contains("checksum"), "{text}");
}
