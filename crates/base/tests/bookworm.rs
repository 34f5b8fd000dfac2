//! The base step on real Debian bookworm packages, through the real mmdebstrap.
//!
//! The .deb set is made here, not read from a lock (the lock's `[[deb]]` list is written
//! by `cargo xtask lock`): mmdebstrap itself, with the host's Debian mirror, resolves the
//! essential variant plus python3, libstdc++6, libibverbs1, ibverbs-providers and
//! ca-certificates, and a hook copies the downloaded .debs out. They are kept under the
//! target directory between runs. mmdebstrap must be installed (`apt-get install
//! mmdebstrap`): these tests fail, not skip, without it.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use commstack_base::{BaseInputs, BaseManifest, build_base};
use commstack_stack::lock::{BaseLock, Deb};
use commstack_store::Store;

const INCLUDE: &[&str] = &[
    "python3",
    "libstdc++6",
    "libibverbs1",
    "ibverbs-providers",
    "ca-certificates",
];
const EPOCH: u64 = 1_700_000_000;

/// Full mmdebstrap runs one at a time: two cores, and the timings mean something.
static HEAVY: Mutex<()> = Mutex::new(());

struct Fixture {
    debs: Vec<(Deb, PathBuf)>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("base-bookworm-debs");
        let done = dir.join("complete");
        if !done.is_file() {
            assert!(
                Path::new("/usr/bin/mmdebstrap").is_file(),
                "mmdebstrap is missing: `apt-get install mmdebstrap` (CI's .ci/run installs it)"
            );
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            let started = Instant::now();
            let out = Command::new("mmdebstrap")
                .args([
                    "--variant=essential",
                    &format!("--include={}", INCLUDE.join(",")),
                    "--architectures=amd64",
                    "--skip=essential/unlink",
                    "--skip=cleanup/apt/cache",
                    &format!(
                        "--customize-hook=cp \"$1\"/var/cache/apt/archives/*.deb {}/",
                        dir.display()
                    ),
                    "bookworm",
                    "/dev/null",
                ])
                .output()
                .expect("run mmdebstrap");
            assert!(
                out.status.success(),
                "mmdebstrap (online, to collect the .debs) failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!(
                "collected the bookworm .debs in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            fs::write(&done, "").unwrap();
        }
        let mut debs = Vec::new();
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "deb") {
                debs.push((deb_of(&path), path));
            }
        }
        debs.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        assert!(debs.len() > 50, "only {} .debs collected", debs.len());
        Fixture { debs }
    })
}

/// A lock entry for a real .deb, from its own control fields.
fn deb_of(path: &Path) -> Deb {
    let out = Command::new("dpkg-deb")
        .args(["-f"])
        .arg(path)
        .args(["Package", "Version", "Architecture"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let field = |n: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(n)?.strip_prefix(": "))
            .unwrap()
            .to_string()
    };
    let name = field("Package");
    let filename = format!("pool/main/{}", path.file_name().unwrap().to_string_lossy());
    Deb {
        url: format!("http://deb.debian.org/debian/{filename}"),
        filename,
        version: field("Version"),
        architecture: field("Architecture"),
        sha256: commstack_digest::sha256_file(path).unwrap(),
        size: fs::metadata(path).unwrap().len(),
        name,
    }
}

fn base_lock(include: &[&str]) -> BaseLock {
    BaseLock {
        distribution: "debian".into(),
        suite: "bookworm".into(),
        mirror: "http://deb.debian.org/debian".into(),
        architecture: "amd64".into(),
        components: vec!["main".into()],
        variant: "essential".into(),
        include: include.iter().map(|s| s.to_string()).collect(),
        release_date: "Sat, 10 Jan 2026 10:00:00 UTC".into(),
        packages_sha256: "0".repeat(64),
        epoch: EPOCH,
    }
}

fn inputs<'a>(base: &'a BaseLock, debs: &'a [(Deb, PathBuf)]) -> BaseInputs<'a> {
    BaseInputs {
        base,
        debs: debs.iter().map(|(d, p)| (d, p.clone())).collect(),
    }
}

fn entries_of(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn cold_build_is_deterministic_offline_and_a_rerun_is_a_no_op() {
    let fx = fixture();
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let base = base_lock(INCLUDE);
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store-a")).unwrap();

    let started = Instant::now();
    let first = build_base(&store, &inputs(&base, &fx.debs), false, |l| {
        eprintln!("{l}")
    })
    .unwrap();
    let cold = started.elapsed().as_secs_f64();
    assert!(!first.outcome.was_cached());
    let m = &first.manifest;
    eprintln!(
        "cold: {cold:.1} s; rootfs.tar {} bytes, {} packages, {} files; rules {:?}",
        m.layer.size,
        m.packages.len(),
        m.files.len(),
        m.generated_rules
    );

    // base.json as the contract says.
    assert_eq!(m, &BaseManifest::open(&first.dir).unwrap());
    assert_eq!(m.schema, 1);
    assert_eq!(m.python, "3.11.2");
    assert_eq!(
        m.network_isolation, "unshare --net",
        "mmdebstrap must run with no network"
    );
    assert_eq!(m.packages.len(), fx.debs.len());
    assert_eq!(m.files["usr/bin/bash"], "deb:bash");
    assert_eq!(m.files["etc/hostname"], "generated:commstack-fixed");
    assert_eq!(m.files["etc/passwd"], "generated:accounts");
    assert!(m.generated_rules["ca-certificates"] > 100);
    assert_eq!(
        m.layer.diff_id,
        format!(
            "sha256:{}",
            commstack_digest::sha256_file(&first.rootfs()).unwrap()
        )
    );
    assert_eq!(m.layer.size, fs::metadata(first.rootfs()).unwrap().len());
    assert!(first.dir.join("logs/mmdebstrap.log").is_file());
    assert!(
        !first.dir.join("work").exists(),
        "the work directory is removed"
    );

    // The tar: relative sorted paths, GNU headers only, clamped times, numeric owners,
    // the packages' modes, fixed hostname and resolv.conf, no devices, every file claimed.
    let mut archive = tar::Archive::new(fs::File::open(first.rootfs()).unwrap());
    let mut paths = Vec::new();
    let mut hostname = String::new();
    let mut resolv = String::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let h = entry.header();
        assert!(h.as_gnu().is_some(), "not a GNU header");
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        assert!(!path.starts_with("./") && !path.starts_with('/'), "{path}");
        assert!(h.mtime().unwrap() <= EPOCH, "{path}");
        assert!(h.username_bytes().is_none_or(|u| u.is_empty()), "{path}");
        let et = h.entry_type();
        assert!(
            et.is_dir() || et.is_file() || et.is_symlink() || et.is_hard_link(),
            "{path}: {et:?}"
        );
        if !et.is_dir() {
            assert!(m.files.contains_key(&path), "{path} has no origin");
        }
        match path.as_str() {
            "usr/bin/su" => assert_eq!(h.mode().unwrap(), 0o4755),
            "etc/shadow" => assert_eq!(h.gid().unwrap(), 42), // group shadow
            "etc/hostname" => {
                entry.read_to_string(&mut hostname).unwrap();
            }
            "etc/resolv.conf" => {
                entry.read_to_string(&mut resolv).unwrap();
            }
            _ => {}
        }
        paths.push(path);
    }
    let mut sorted = paths.clone();
    sorted.sort_by(|a, b| commstack_base::normalise::path_order(a, b));
    assert_eq!(paths, sorted, "entries are in path order");
    assert!(!paths.iter().any(|p| p.starts_with("dev/")));
    assert_eq!(hostname, "commstack\n");
    assert!(resolv.starts_with('#'), "{resolv:?}");
    assert_eq!(
        paths.len(),
        paths
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );

    // The same inputs again: nothing runs.
    let started = Instant::now();
    let again = build_base(&store, &inputs(&base, &fx.debs), false, |_| {}).unwrap();
    let noop = started.elapsed().as_secs_f64();
    eprintln!("no-op: {noop:.2} s");
    assert!(again.outcome.was_cached());
    assert_eq!(again.manifest, first.manifest);

    // A fresh store (another path, another temp directory): the same bytes.
    let store_b = Store::open(tmp.path().join("elsewhere/store-b")).unwrap();
    let second = build_base(&store_b, &inputs(&base, &fx.debs), false, |_| {}).unwrap();
    assert!(!second.outcome.was_cached());
    assert_eq!(
        second.manifest.layer, first.manifest.layer,
        "rootfs.tar differs between two cold builds"
    );
    assert_eq!(second.manifest, first.manifest);
}

#[test]
fn a_deb_whose_sha256_is_not_the_locks_is_refused_before_anything_runs() {
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let mut debs = fx.debs.clone();
    let (victim, path) = debs.iter_mut().find(|(d, _)| d.name == "bash").unwrap();
    let damaged = tmp.path().join("bash.deb");
    let mut bytes = fs::read(&*path).unwrap();
    bytes.push(0);
    fs::write(&damaged, bytes).unwrap();
    *path = damaged.clone();
    let expected = victim.sha256.clone();

    let store_root = tmp.path().join("store");
    let store = Store::open(&store_root).unwrap();
    let base = base_lock(INCLUDE);
    let err = format!(
        "{:#}",
        build_base(&store, &inputs(&base, &debs), false, |_| {}).unwrap_err()
    );
    assert!(err.contains("deb bash"), "{err}");
    assert!(err.contains(&damaged.display().to_string()), "{err}");
    assert!(err.contains(&expected), "{err}");
    assert!(
        err.contains(&commstack_digest::sha256_file(&damaged).unwrap()),
        "{err}"
    );
    assert!(err.contains("cargo xtask fetch --verify"), "{err}");
    for sub in ["steps", "tmp", "failed"] {
        assert!(
            entries_of(&store_root.join(sub)).is_empty(),
            "{sub} is not empty"
        );
    }

    // A missing cached file names the package and the fetch command.
    let mut gone = fx.debs.clone();
    gone[0].1 = tmp.path().join("not-there.deb");
    let err = format!(
        "{:#}",
        build_base(&store, &inputs(&base, &gone), false, |_| {}).unwrap_err()
    );
    assert!(err.contains(&format!("deb {}", gone[0].0.name)), "{err}");
    assert!(err.contains("cargo xtask fetch --only debs"), "{err}");
}

#[test]
fn a_package_set_without_a_dependency_fails_and_keeps_the_log() {
    let fx = fixture();
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let store_root = tmp.path().join("store");
    let store = Store::open(&store_root).unwrap();
    // libstdc++6 is asked for in include, but its .deb is not in the set.
    let debs: Vec<(Deb, PathBuf)> = fx
        .debs
        .iter()
        .filter(|(d, _)| d.name != "libstdc++6")
        .cloned()
        .collect();
    let base = base_lock(INCLUDE);
    let err = format!(
        "{:#}",
        build_base(&store, &inputs(&base, &debs), false, |_| {}).unwrap_err()
    );
    assert!(err.contains("mmdebstrap failed"), "{err}");
    let log = store_root.join("failed");
    let failed = entries_of(&log);
    assert_eq!(failed.len(), 1, "{failed:?}");
    let log = log.join(&failed[0]).join("logs/mmdebstrap.log");
    assert!(err.contains(&log.display().to_string()), "{err}");
    assert!(fs::read_to_string(&log).unwrap().contains("libstdc++6"));
    assert!(entries_of(&store_root.join("steps")).is_empty());
}

/// A real .deb (made with dpkg-deb) whose postinst writes a file no package lists and no
/// rule claims: the step must fail naming it, and keep nothing.
#[test]
fn a_file_no_package_and_no_rule_claims_fails_the_step() {
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("pkg");
    fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    fs::create_dir_all(pkg.join("usr/share/doc/commstack-stray")).unwrap();
    fs::write(pkg.join("usr/share/doc/commstack-stray/README"), "stray\n").unwrap();
    fs::write(
        pkg.join("DEBIAN/control"),
        "Package: commstack-stray\nVersion: 1.0\nArchitecture: all\n\
         Maintainer: commstack tests <tests@invalid>\nDescription: writes an unlisted file\n",
    )
    .unwrap();
    fs::write(
        pkg.join("DEBIAN/postinst"),
        "#!/bin/sh\nset -e\nmkdir -p /usr/local/share/stray\necho x > /usr/local/share/stray/made-by-postinst\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(
        pkg.join("DEBIAN/postinst"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let deb_path = tmp.path().join("commstack-stray_1.0_all.deb");
    let st = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&pkg)
        .arg(&deb_path)
        .env("SOURCE_DATE_EPOCH", EPOCH.to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let mut debs = fx.debs.clone();
    debs.push((deb_of(&deb_path), deb_path));
    let mut include = INCLUDE.to_vec();
    include.push("commstack-stray");
    let base = base_lock(&include);

    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let store_root = tmp.path().join("store");
    let store = Store::open(&store_root).unwrap();
    let err = format!(
        "{:#}",
        build_base(&store, &inputs(&base, &debs), false, |_| {}).unwrap_err()
    );
    assert!(
        err.contains("1 file(s) of the base are claimed by no package"),
        "{err}"
    );
    assert!(
        err.contains("usr/local/share/stray/made-by-postinst"),
        "{err}"
    );
    assert!(entries_of(&store_root.join("steps")).is_empty());
}
