//! Real `docker load` and `docker run` of an image the tool wrote: a static binary built
//! by gcc in a layer of its own, a second layer of data with awkward modes, hard links,
//! symlinks and times. The image ID Docker reports is the config's sha256, and the same
//! tree written again from another directory, under another umask and with other mtimes
//! gives the same bytes and the same ID.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use commstack_image::{ImageSpec, write_docker_archive, write_layer};

const EPOCH: u64 = 1_764_547_200; // 2025-12-01T00:00:00Z

fn docker(args: &[&str]) -> std::process::Output {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker is needed for this test (Debian's docker.io; its daemon must run)");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Two trees: bin/hello (static, prints a line), and data with odd modes and links.
fn make_trees(root: &Path, mtime_offset: i64) -> (std::path::PathBuf, std::path::PathBuf) {
    let bin = root.join("bin-layer");
    let data = root.join("data-layer");
    std::fs::create_dir_all(bin.join("bin")).unwrap();
    std::fs::create_dir_all(data.join("opt/commstack/sub")).unwrap();
    let src = root.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void){puts(\"hello from a commstack layer\");return 0;}\n",
    )
    .unwrap();
    let status = Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(bin.join("bin/hello"))
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(status.success());
    let d = data.join("opt/commstack");
    std::fs::write(d.join("a.txt"), "a\n").unwrap();
    std::fs::set_permissions(d.join("a.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(d.join("sub/run.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::set_permissions(d.join("sub/run.sh"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::hard_link(d.join("a.txt"), d.join("a-hard.txt")).unwrap();
    std::os::unix::fs::symlink("sub/run.sh", d.join("run")).unwrap();
    for p in [d.join("a.txt"), d.join("sub/run.sh")] {
        let t = std::time::SystemTime::now()
            .checked_add(std::time::Duration::from_secs(mtime_offset.unsigned_abs()))
            .unwrap();
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(t).unwrap();
    }
    (bin, data)
}

#[test]
fn docker_loads_and_runs_the_image_with_the_config_digest_as_its_id() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let (bin1, data1) = make_trees(one.path(), 10);
    let (bin2, data2) = make_trees(two.path(), 99_999);
    // The same binary in both trees (the compiler is not under test here).
    std::fs::copy(bin1.join("bin/hello"), bin2.join("bin/hello")).unwrap();

    let tag = format!("commstack-image-test:{}", std::process::id());
    let spec = ImageSpec {
        tag: tag.clone(),
        env: vec!["PATH=/bin".into()],
        cmd: vec!["/bin/hello".into()],
        user: Some("1000:1000".into()),
        epoch: EPOCH,
        labels: [(
            "org.opencontainers.image.title".to_string(),
            "test".to_string(),
        )]
        .into(),
        layer_comments: vec!["bin".into(), "data".into()],
        ..ImageSpec::default()
    };
    let write = |dir: &Path, bin: &Path, data: &Path| {
        let layers = vec![
            write_layer(bin, &dir.join("bin.tar"), EPOCH).unwrap(),
            write_layer(data, &dir.join("data.tar"), EPOCH).unwrap(),
        ];
        let out = dir.join("image.tar");
        let archive = write_docker_archive(&spec, &layers, &out).unwrap();
        (archive, std::fs::read(out).unwrap())
    };
    let (a, bytes_a) = write(one.path(), &bin1, &data1);
    let (b, bytes_b) = write(two.path(), &bin2, &data2);
    assert_eq!(a, b, "same trees, other directory and mtimes: same image");
    assert!(bytes_a == bytes_b, "the docker-archive bytes differ");

    let load = docker(&["load", "-i", one.path().join("image.tar").to_str().unwrap()]);
    let said = String::from_utf8_lossy(&load.stdout);
    assert!(said.contains(&format!("Loaded image: {tag}")), "{said}");
    let id = docker(&["image", "inspect", "--format", "{{.Id}}", &tag]);
    let id = String::from_utf8_lossy(&id.stdout).trim().to_string();
    let run = docker(&["run", "--rm", "--network=none", &tag]);
    let inside = docker(&[
        "run",
        "--rm",
        "--network=none",
        "--entrypoint",
        "/bin/hello",
        &tag,
    ]);
    docker(&["rmi", "-f", &tag]);
    assert_eq!(id, a.image_id, "Docker's image ID is the config's sha256");
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "hello from a commstack layer\n"
    );
    assert!(inside.status.success());
}

#[test]
fn layer_entries_are_sorted_clamped_owned_by_root_and_keep_hard_links() {
    let dir = tempfile::tempdir().unwrap();
    let (_, data) = make_trees(dir.path(), 10);
    let layer = write_layer(&data, &dir.path().join("l.tar"), EPOCH).unwrap();
    let mut archive = tar::Archive::new(std::fs::File::open(&layer.path).unwrap());
    let mut seen = Vec::new();
    for e in archive.entries().unwrap() {
        let e = e.unwrap();
        let h = e.header();
        assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
        assert!(h.mtime().unwrap() <= EPOCH);
        let path = e.path().unwrap().display().to_string();
        seen.push((path, h.entry_type(), h.mode().unwrap()));
    }
    let names: Vec<&str> = seen.iter().map(|(p, _, _)| p.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    let find = |p: &str| seen.iter().find(|(n, _, _)| n == p).unwrap().clone();
    // Sorted by bytes, a-hard.txt comes first: it holds the data, a.txt links to it.
    assert_eq!(find("opt/commstack/a-hard.txt").1, tar::EntryType::Regular);
    assert_eq!(find("opt/commstack/a-hard.txt").2, 0o644, "0600 normalised");
    assert_eq!(find("opt/commstack/a.txt").1, tar::EntryType::Link);
    assert_eq!(find("opt/commstack/sub/run.sh").2, 0o755);
    assert_eq!(find("opt/commstack/run").1, tar::EntryType::Symlink);
    assert_eq!(layer.size, std::fs::metadata(&layer.path).unwrap().len());
}

fn tool(program: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("{program} is needed for this test (apt-get install {program}): {e}")
        });
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The OCI layout, read by independent tools: umoci and skopeo accept it, and skopeo's
/// conversion to a docker-archive loads into Docker under the same image ID (the config
/// bytes travel unchanged). Written twice from different trees' copies: same digests.
#[test]
fn the_oci_layout_is_reproducible_and_read_by_skopeo_and_umoci() {
    use commstack_image::write_oci_layout;
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let (bin1, data1) = make_trees(one.path(), 10);
    let (bin2, data2) = make_trees(two.path(), 500);
    std::fs::copy(bin1.join("bin/hello"), bin2.join("bin/hello")).unwrap();
    let tag = format!("commstack-oci-test:{}", std::process::id());
    let spec = ImageSpec {
        tag: tag.clone(),
        env: vec!["PATH=/bin".into()],
        cmd: vec!["/bin/hello".into()],
        epoch: EPOCH,
        ..ImageSpec::default()
    };
    let write = |dir: &Path, bin: &Path, data: &Path| {
        let layers = vec![
            write_layer(bin, &dir.join("bin.tar"), EPOCH).unwrap(),
            write_layer(data, &dir.join("data.tar"), EPOCH).unwrap(),
        ];
        let docker = write_docker_archive(&spec, &layers, &dir.join("image.tar")).unwrap();
        let oci = write_oci_layout(&spec, &layers, &dir.join("oci")).unwrap();
        (docker, oci)
    };
    let (docker_a, oci_a) = write(one.path(), &bin1, &data1);
    let (_, oci_b) = write(two.path(), &bin2, &data2);
    assert_eq!(
        oci_a, oci_b,
        "same trees: same manifest, config and layer digests"
    );
    assert_eq!(oci_a.config_digest, docker_a.image_id);
    assert_eq!(oci_a.layer_digests.len(), 2);

    let layout = one.path().join("oci");
    let reference = format!(
        "oci:{}:{}",
        layout.display(),
        tag.rsplit_once(':').unwrap().1
    );
    let raw = tool("skopeo", &["inspect", "--raw", &reference]);
    let manifest: serde_json::Value = serde_json::from_slice(&raw.stdout).unwrap();
    assert_eq!(manifest["config"]["digest"], oci_a.config_digest.as_str());
    tool(
        "umoci",
        &[
            "stat",
            "--image",
            &format!("{}:{}", layout.display(), tag.rsplit_once(':').unwrap().1),
        ],
    );
    let converted = one.path().join("from-skopeo.tar");
    tool(
        "skopeo",
        &[
            "copy",
            &reference,
            &format!("docker-archive:{}:{tag}", converted.display()),
        ],
    );
    docker(&["load", "-i", converted.to_str().unwrap()]);
    let id = docker(&["image", "inspect", "--format", "{{.Id}}", &tag]);
    docker(&["rmi", "-f", &tag]);
    assert_eq!(
        String::from_utf8_lossy(&id.stdout).trim(),
        oci_a.config_digest
    );
}
