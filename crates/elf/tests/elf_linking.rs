//! DT_NEEDED, SONAME, RPATH/RUNPATH, resolution, one copy per soname, symbol versions
//! and manylinux tags, on libraries gcc builds here and on the system's own.

use std::path::{Path, PathBuf};

use commstack_elf::{
    DottedVersion, ElfFile, ManylinuxTag, NeededVersion, manylinux_tag, newest_glibc,
    newest_glibcxx, resolve_needed, scan_tree,
};
use commstack_testkit::native::*;

const SYSTEM_DIRS: [&str; 2] = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"];

fn system_dirs() -> Vec<PathBuf> {
    SYSTEM_DIRS.iter().map(PathBuf::from).collect()
}

/// root/dep/libdep.so.1, root/gone (built, linked against, then removed), and
/// root/main/libmain.so needing both with the given dtags flag and `$ORIGIN/../dep`.
fn linked_pair(root: &Path, dtags: &str) -> PathBuf {
    let dep = shared_lib(
        &root.join("dep"),
        "libdep.so.1",
        "libdep.so.1",
        "int dep(void) { return 1; }",
        &[],
    );
    std::os::unix::fs::symlink("libdep.so.1", root.join("dep/libdep.so")).unwrap();
    let gone = shared_lib(
        &root.join("gone"),
        "libgone.so",
        "libgone.so",
        "int gone(void) { return 2; }",
        &[],
    );
    let main = shared_lib(
        &root.join("main"),
        "libmain.so",
        "libmain.so",
        "int dep(void); int gone(void); int f(void) { return dep() + gone(); }",
        &[
            "-L",
            dep.parent().unwrap().to_str().unwrap(),
            "-L",
            gone.parent().unwrap().to_str().unwrap(),
            "-Wl,--no-as-needed",
            "-ldep",
            "-lgone",
            dtags,
            "-Wl,-rpath,$ORIGIN/../dep",
        ],
    );
    std::fs::remove_file(gone).unwrap();
    main
}

#[test]
fn runpath_resolves_with_origin_and_missing_needed_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let main = linked_pair(dir.path(), "-Wl,--enable-new-dtags");
    let info = ElfFile::open(&main).unwrap().dynamic_info().unwrap();
    assert_eq!(info.soname.as_deref(), Some("libmain.so"));
    assert_eq!(info.runpath, ["$ORIGIN/../dep"]);
    assert!(info.rpath.is_empty());
    assert!(
        info.needed.iter().any(|n| n == "libdep.so.1"),
        "the linker records the SONAME: {:?}",
        info.needed
    );
    assert!(info.needed.iter().any(|n| n == "libc.so.6"));

    let resolved = resolve_needed(&main, &info, &system_dirs());
    let dep = resolved.iter().find(|r| r.needed == "libdep.so.1").unwrap();
    assert_eq!(
        dep.found.as_deref(),
        Some(dir.path().join("main/../dep/libdep.so.1").as_path())
    );
    assert_eq!(dep.via, Some("runpath"));
    let libc = resolved.iter().find(|r| r.needed == "libc.so.6").unwrap();
    assert_eq!(libc.via, Some("search-dirs"));
    let gone = resolved.iter().find(|r| r.needed == "libgone.so").unwrap();
    assert_eq!(gone.found, None);

    let tree = scan_tree(dir.path()).unwrap();
    let unresolved = tree.unresolved(&system_dirs(), &[]);
    assert_eq!(unresolved.len(), 1, "{unresolved:?}");
    assert_eq!(unresolved[0].needed, "libgone.so");
    assert_eq!(unresolved[0].library, main);
    assert!(
        tree.unresolved(&system_dirs(), &["libgone.so".into()])
            .is_empty(),
        "host-provided names are allowed"
    );
}

#[test]
fn rpath_is_read_when_there_is_no_runpath() {
    let dir = tempfile::tempdir().unwrap();
    let main = linked_pair(dir.path(), "-Wl,--disable-new-dtags");
    let info = ElfFile::open(&main).unwrap().dynamic_info().unwrap();
    assert_eq!(info.rpath, ["$ORIGIN/../dep"]);
    assert!(info.runpath.is_empty());
    let resolved = resolve_needed(&main, &info, &[]);
    assert_eq!(
        resolved
            .iter()
            .find(|r| r.needed == "libdep.so.1")
            .unwrap()
            .via,
        Some("rpath")
    );
}

#[test]
fn one_copy_per_soname_counts_files_not_links() {
    let dir = tempfile::tempdir().unwrap();
    linked_pair(dir.path(), "-Wl,--enable-new-dtags");
    // A hard link is the same file; the symlink libdep.so -> libdep.so.1 is not a copy.
    std::fs::hard_link(
        dir.path().join("dep/libdep.so.1"),
        dir.path().join("dep/libdep.so.1.0"),
    )
    .unwrap();
    let shipped = vec![
        "libdep.so.1".to_string(),
        "libmain.so".to_string(),
        "libnccl.so.2".to_string(),
    ];
    let tree = scan_tree(dir.path()).unwrap();
    assert_eq!(tree.libraries.len(), 2, "{:?}", tree.libraries);
    let wrong = tree.not_exactly_one(&shipped);
    assert_eq!(wrong.len(), 1);
    assert_eq!(wrong[0].soname, "libnccl.so.2");
    assert!(wrong[0].paths.is_empty());
    assert!(tree.duplicates().is_empty());

    // A real second copy, as a second wheel would bring.
    std::fs::create_dir_all(dir.path().join("other")).unwrap();
    std::fs::copy(
        dir.path().join("dep/libdep.so.1"),
        dir.path().join("other/libdep.so.1"),
    )
    .unwrap();
    let tree = scan_tree(dir.path()).unwrap();
    let wrong = tree.not_exactly_one(&shipped);
    assert_eq!(wrong[0].soname, "libdep.so.1");
    assert_eq!(wrong[0].paths.len(), 2);
    assert_eq!(tree.duplicates().len(), 1);
}

#[test]
fn newest_glibc_follows_the_symbols_used() {
    let dir = tempfile::tempdir().unwrap();
    // getrandom appeared in glibc 2.25.
    let lib = shared_lib(
        dir.path(),
        "librand.so",
        "librand.so",
        "#include <sys/random.h>\nlong r(void *b) { return getrandom(b, 8, 0); }",
        &[],
    );
    let needs = ElfFile::open(&lib).unwrap().needed_versions().unwrap();
    let mut ours: Vec<(String, String)> = needs
        .iter()
        .map(|n| (n.file.clone(), n.name.clone()))
        .collect();
    let mut theirs = readelf_needed_versions(&lib);
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs, "same reading as readelf -V");
    assert_eq!(newest_glibc(&needs), Some("2.25".parse().unwrap()));
    assert_eq!(
        manylinux_tag(&needs, "x86_64").pep600(),
        "manylinux_2_25_x86_64"
    );
    assert_eq!(newest_glibcxx(&needs), None);
}

#[test]
fn newest_glibcxx_of_a_cxx_library_and_of_the_system_libstdcxx() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libcxx.so");
    // std::string with the C++11 ABI needs GLIBCXX_3.4.21.
    compile(
        dir.path(),
        "cxx.cpp",
        "#include <string>\nstd::string f(const char *s) { std::string x(s); x += s; return x; }",
        &lib,
        &["-shared", "-fPIC", "-O1"],
    );
    let needs = ElfFile::open(&lib).unwrap().needed_versions().unwrap();
    let newest = newest_glibcxx(&needs).unwrap();
    assert!(newest >= "3.4.21".parse().unwrap(), "{newest}");
    let theirs = readelf_needed_versions(&lib);
    let readelf_newest = theirs
        .iter()
        .filter_map(|(_, v)| v.strip_prefix("GLIBCXX_")?.parse::<DottedVersion>().ok())
        .max()
        .unwrap();
    assert_eq!(newest, readelf_newest);

    // libstdc++ itself needs only glibc versions; its reading matches readelf's too.
    let stdcxx = Path::new("/lib/x86_64-linux-gnu/libstdc++.so.6");
    let needs = ElfFile::open(stdcxx).unwrap().needed_versions().unwrap();
    assert_eq!(needs.len(), readelf_needed_versions(stdcxx).len());
    assert_eq!(newest_glibcxx(&needs), None);
    assert!(newest_glibc(&needs).unwrap() >= "2.17".parse().unwrap());
}

#[test]
fn manylinux_tags_and_aliases() {
    let need = |v: &str| NeededVersion {
        file: "libc.so.6".into(),
        name: v.into(),
    };
    let needs = [
        need("GLIBC_2.2.5"),
        need("GLIBC_2.17"),
        need("GLIBC_2.3.4"),
        need("GLIBC_PRIVATE"),
    ];
    let tag = manylinux_tag(&needs, "x86_64");
    assert_eq!(tag.pep600(), "manylinux_2_17_x86_64");
    assert_eq!(tag.legacy_alias().as_deref(), Some("manylinux2014_x86_64"));
    assert_eq!(
        tag.wheel_platform_tag(),
        "manylinux2014_x86_64.manylinux_2_17_x86_64"
    );
    assert_eq!(
        manylinux_tag(&[need("GLIBC_2.28")], "x86_64").wheel_platform_tag(),
        "manylinux_2_28_x86_64"
    );
    assert_eq!(
        manylinux_tag(&[], "x86_64").pep600(),
        "manylinux_2_5_x86_64"
    );
    assert_eq!(
        manylinux_tag(&[need("GLIBC_2.12")], "x86_64")
            .legacy_alias()
            .as_deref(),
        Some("manylinux2010_x86_64")
    );
    assert_eq!(
        ManylinuxTag::parse("manylinux2014_x86_64")
            .unwrap()
            .pep600(),
        "manylinux_2_17_x86_64"
    );
    assert_eq!(
        ManylinuxTag::parse("manylinux_2_28_aarch64")
            .unwrap()
            .glibc(),
        "2.28".parse().unwrap()
    );
    assert!(ManylinuxTag::parse("linux_x86_64").is_none());
    // 2.17 == 2.17.0, and 2.9 < 2.17 numerically.
    assert_eq!(
        "2.17".parse::<DottedVersion>().unwrap(),
        "2.17.0".parse().unwrap()
    );
    assert!("2.9".parse::<DottedVersion>().unwrap() < "2.17".parse().unwrap());
}

#[test]
#[ignore = "needs NVIDIA's nvidia-nvshmem-cu13 3.4.5 wheel unpacked (see tests/common nvidia_nvshmem_lib); run with --ignored"]
fn nvidia_wheel_symbol_versions_and_tree() {
    let lib_dir = nvidia_nvshmem_lib();
    let needs = ElfFile::open(&lib_dir.join("libnvshmem_host.so.3"))
        .unwrap()
        .needed_versions()
        .unwrap();
    assert_eq!(newest_glibc(&needs), Some("2.17".parse().unwrap()));
    assert_eq!(newest_glibcxx(&needs), Some("3.4.21".parse().unwrap()));
    assert_eq!(
        manylinux_tag(&needs, "x86_64").wheel_platform_tag(),
        "manylinux2014_x86_64.manylinux_2_17_x86_64"
    );
    let tree = scan_tree(&lib_dir).unwrap();
    assert_eq!(tree.copies("libnvshmem_host.so.3").len(), 1);
    assert!(tree.duplicates().is_empty());
}
