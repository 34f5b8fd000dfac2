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
    /// A hard link to an earlier entry of the same tar.
    Hardlink(&'a str),
    /// A file of this machine under a name written as is (`..` and all), which the tar
    /// crate's own path setters refuse.
    RawName(&'a Path),
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
            Item::Hardlink(target) => {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                h.set_mode(0o644);
                b.append_link(&mut h, at, target).unwrap();
            }
            Item::RawName(f) => {
                let bytes = std::fs::read(f).unwrap();
                let mut h = tar::Header::new_gnu();
                h.as_old_mut().name[..at.len()].copy_from_slice(at.as_bytes());
                h.set_size(bytes.len() as u64);
                h.set_mode(0o644);
                h.set_entry_type(tar::EntryType::Regular);
                h.set_cksum();
                b.append(&h, bytes.as_slice()).unwrap();
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

    // The same layer's own entries under its opaque directory stay: the whiteouts of a
    // layer hide only what the layers below it hold.
    let readded = layer(
        &dir.join("readded.tar"),
        &[
            (&format!("{SITE}/nvidia/nccl/.wh..wh..opq"), Item::Empty),
            (
                &format!("{SITE}/nvidia/nccl/lib/libnccl.so.2"),
                Item::File(&f.site.join("nvidia/nccl/lib/libnccl.so.2")),
            ),
        ],
    );
    let image = over_layers(&[&f.base, &f.venv, &readded], &f.expect);
    assert_eq!(
        find(&image, "static.one-copy.libnccl.so.2").status,
        Status::Passed
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

/// NVSHMEM built with NCCL on, in `dir`: what a hostile or careless layer would slip in.
fn nccl_on_host(dir: &Path) -> PathBuf {
    shared_lib(
        dir,
        "libnvshmem_host.so.3",
        "libnvshmem_host.so.3",
        &nvshmem_like_source("ON", "3.4.5", "const char *n = \"libnccl.so.2\";"),
        &[],
    )
}

#[test]
fn a_name_with_dotdot_lands_where_docker_puts_it() {
    let f = fixture();
    let dir = f._dir.path();
    let on = nccl_on_host(&dir.join("on"));
    // `zz/../nvidia/...` is `nvidia/...` once cleaned, as Docker unpacks it: over the
    // checked library, not beside it in a directory the checks skip.
    let name = format!("{SITE}/zz/../nvidia/nvshmem/lib/libnvshmem_host.so.3");
    let over = layer(&dir.join("dotdot.tar"), &[(&name, Item::RawName(&on))]);
    let image = over_layers(&[&f.base, &f.venv, &over], &f.expect);
    let c = find(&image, "static.nvshmem-host.build-vars");
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert_eq!(
        find(&image, "static.one-copy.libnvshmem_host.so.3").status,
        Status::Passed
    );
    // A name that climbs above the root is refused, as Docker refuses it.
    let climb = layer(
        &dir.join("climb.tar"),
        &[("../../etc/libnccl.so.2", Item::RawName(&on))],
    );
    let err = index_layer(&climb, "sha256:climb").map(|_| ()).unwrap_err();
    assert!(format!("{err:#}").contains("climbs above"), "{err:#}");
}

#[test]
fn a_hard_link_is_the_file_it_names_and_not_a_second_copy() {
    let f = fixture();
    let dir = f._dir.path();
    let host = f.site.join("nvidia/nvshmem/lib/libnvshmem_host.so.3");
    let real = format!("{SITE}/nvidia/nvshmem/lib/libnvshmem_host.so.3");
    // The file's first name is outside the root (it sorts first); the name inside the
    // root is a hard link: its facts are the file's.
    let linked = layer(
        &dir.join("linked.tar"),
        &[
            ("opt/aaa/libnvshmem_host.so.3", Item::File(&host)),
            (&real, Item::Hardlink("opt/aaa/libnvshmem_host.so.3")),
            (
                &format!("{SITE}/torch/lib/libnvshmem_host.so.3"),
                Item::Hardlink("opt/aaa/libnvshmem_host.so.3"),
            ),
        ],
    );
    let image = over_layers(&[&f.base, &f.venv, &linked], &f.expect);
    for name in [
        "static.nvshmem-host.build-vars",
        "static.nvshmem-host.no-libnccl",
        // Two names inside the root, one file.
        "static.one-copy.libnvshmem_host.so.3",
    ] {
        assert_eq!(
            find(&image, name).status,
            Status::Passed,
            "{name}: {image:#?}"
        );
    }
}

#[test]
fn a_link_over_a_directory_hides_what_was_under_it() {
    let f = fixture();
    let dir = f._dir.path();
    // The lower layer lists no directory entries, only files (as some tools write them).
    let nccl = f.site.join("nvidia/nccl/lib/libnccl.so.2");
    let lower = layer(
        &dir.join("files-only.tar"),
        &[(
            &format!("{SITE}/nvidia/nccl/lib/libnccl.so.2"),
            Item::File(&nccl),
        )],
    );
    let upper = layer(
        &dir.join("link.tar"),
        &[(
            &format!("{SITE}/nvidia/nccl/lib"),
            Item::Symlink("/nowhere"),
        )],
    );
    let files = ImageFiles::new(vec![index(&lower), index(&upper)]);
    let lib = PathBuf::from(format!("/{SITE}/nvidia/nccl/lib/libnccl.so.2"));
    assert!(ImageFiles::new(vec![index(&lower)]).is_file(&lib));
    assert!(!files.is_file(&lib));
}

#[test]
fn a_root_behind_a_symbolic_link_is_read_where_it_leads() {
    let f = fixture();
    let dir = f._dir.path();
    let real = "opt/venv-real/lib/python3.11/site-packages";
    let moved = layer(&dir.join("moved.tar"), &[(real, Item::Tree(&f.site))]);
    let link = layer(
        &dir.join("venv-link.tar"),
        &[("opt/commstack/venv", Item::Symlink("../venv-real"))],
    );
    let image = over_layers(&[&f.base, &moved, &link], &f.expect);
    let here = check_static(std::slice::from_ref(&f.site), &f.expect);
    assert_eq!(image.libraries, here.libraries);
    assert_eq!(checks(&image), checks(&here));
}
