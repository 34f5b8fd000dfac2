//! The ninja front (commstack_deepep::schedule) with the real ninja 1.13 of the locked
//! toolchain's wheel, on a build.ninja written the way torch's cpp_extension writes it for
//! DeepEP (relocatable device code): the `.cu` objects (rule `cuda_compile`) first, the
//! host object (`compile`) last, all of them inputs of the device link. One job at a time,
//! so the order is ninja's choice alone.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use commstack_deepep::env::BuildEnv;
use commstack_deepep::schedule::{NINJA_FRONT_DIR, install_ninja_front};

/// torch's shape (DeepEP's build.ninja: python_api.o declared last, dlink.o of every
/// object), each object's bytes a function of its source only.
fn torch_like_build(dir: &Path) {
    torch_like_build_with(dir, "");
}

/// ninja's escapes for a path in a build line (torch writes them so).
fn esc(p: &Path) -> String {
    p.display()
        .to_string()
        .replace('$', "$$")
        .replace(' ', "$ ")
        .replace(':', "$:")
}

/// [`torch_like_build`] with `extra` lines at the end of build.ninja.
fn torch_like_build_with(dir: &Path, extra: &str) {
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    for (name, text) in [
        ("python_api.cpp", "host"),
        ("a.cu", "dev a"),
        ("b.cu", "dev b"),
    ] {
        fs::write(src.join(name), text).unwrap();
    }
    let b = dir.join("build");
    fs::create_dir_all(&b).unwrap();
    let (s, o) = (esc(&src), esc(&b));
    fs::write(
        b.join("build.ninja"),
        format!(
            "ninja_required_version = 1.3\n\n\
             rule compile\n  command = sed s/^/obj:/ $in > $out\n\n\
             rule cuda_compile\n  command = sed s/^/cuobj:/ $in > $out\n\n\
             rule cuda_devlink\n  command = cat $in > $out\n\n\
             build {o}/csrc/a.o: cuda_compile {s}/a.cu\n\
             build {o}/csrc/b.o: cuda_compile {s}/b.cu\n\
             build {o}/csrc/python_api.o: compile {s}/python_api.cpp\n\n\n\
             build {o}/dlink.o: cuda_devlink {o}/csrc/a.o {o}/csrc/b.o {o}/csrc/python_api.o\n\n{extra}"
        ),
    )
    .unwrap();
}

/// The outputs of the ninja log's jobs in the order they started.
fn started(build: &Path) -> Vec<String> {
    let log = fs::read_to_string(build.join(".ninja_log")).unwrap();
    let mut jobs: Vec<(u64, String)> = log
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (
                f[0].parse().unwrap(),
                f[3].rsplit('/').next().unwrap().to_string(),
            )
        })
        .collect();
    jobs.sort_by_key(|(start, _)| *start);
    jobs.into_iter().map(|(_, o)| o).collect()
}

/// Runs `ninja -v -j1` in `build` with `path` as PATH (torch finds ninja on PATH), which
/// must pass; its output.
fn ninja_on(path: &str, build: &Path) -> std::process::Output {
    let out = Command::new("ninja")
        .args(["-v", "-j1"])
        .current_dir(build)
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ninja failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn objects(build: &Path) -> BTreeMap<String, Vec<u8>> {
    ["csrc/python_api.o", "csrc/a.o", "csrc/b.o", "dlink.o"]
        .into_iter()
        .map(|o| (o.to_string(), fs::read(build.join(o)).unwrap()))
        .collect()
}

#[test]
fn the_front_starts_the_host_compile_first_and_builds_the_same_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let ninja_dir = tmp.path().join("tools");
    commstack_testkit::build_tools::ninja(&ninja_dir);
    let path = format!("{}:/usr/bin:/bin", ninja_dir.display());

    // ninja alone: every compile weighs the same, so torch's order: the host compile last.
    let plain = tmp.path().join("plain");
    torch_like_build(&plain);
    ninja_on(&path, &plain.join("build"));
    let order = started(&plain.join("build"));
    assert_eq!(
        order.last().map(String::as_str),
        Some("dlink.o"),
        "{order:?}"
    );
    assert_eq!(order[2], "python_api.o", "ninja 1.13 alone: {order:?}");

    // Through the front, as the DeepEP step installs it on the build's PATH.
    let root = tmp.path().join("fixed");
    let mut env = BuildEnv {
        vars: [("PATH".to_string(), path.clone())].into_iter().collect(),
        notes: Vec::new(),
    };
    let real = install_ninja_front(&mut env, &root, Path::new("/usr/bin/python3"))
        .unwrap()
        .expect("PATH has a ninja");
    assert_eq!(real, ninja_dir.join("ninja"));
    let front = root.join(NINJA_FRONT_DIR);
    assert_eq!(env.vars["PATH"], format!("{}:{path}", front.display()));
    assert!(
        env.notes.iter().any(|n| n.contains("host compiles")),
        "{:?}",
        env.notes
    );
    let ordered = tmp.path().join("ordered");
    torch_like_build(&ordered);
    ninja_on(&env.vars["PATH"], &ordered.join("build"));
    let order = started(&ordered.join("build"));
    assert_eq!(order[0], "python_api.o", "through the front: {order:?}");
    // The same objects, byte for byte; torch's build.ninja untouched.
    assert_eq!(
        objects(&plain.join("build")),
        objects(&ordered.join("build"))
    );
    assert_eq!(
        fs::read_to_string(plain.join("build/build.ninja"))
            .unwrap()
            .replace("plain", "ordered"),
        fs::read_to_string(ordered.join("build/build.ninja")).unwrap()
    );

    // What torch asks besides a build goes to ninja as it is.
    let version = |ninja: &Path| {
        Command::new(ninja)
            .arg("--version")
            .output()
            .unwrap()
            .stdout
    };
    assert_eq!(version(&front.join("ninja")), version(&real));
    assert!(String::from_utf8_lossy(&version(&real)).starts_with("1.13.0"));
    // A second build through the front has nothing to do, as ninja alone.
    let again = Command::new("ninja")
        .arg("-j1")
        .current_dir(ordered.join("build"))
        .env("PATH", &env.vars["PATH"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("no work to do"),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
}

#[test]
fn without_a_ninja_on_path_there_is_no_front_and_the_note_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let mut env = BuildEnv {
        vars: [("PATH".to_string(), tmp.path().display().to_string())]
            .into_iter()
            .collect(),
        notes: Vec::new(),
    };
    let before = env.vars.clone();
    let real = install_ninja_front(&mut env, tmp.path(), Path::new("/usr/bin/python3")).unwrap();
    assert_eq!(real, None);
    assert_eq!(env.vars, before);
    assert!(!tmp.path().join(NINJA_FRONT_DIR).exists());
    assert!(env.notes[0].contains("no ninja"), "{:?}", env.notes);
}

/// The front installed in `root` for the ninja of `ninja_dir`: the build's PATH.
fn front_path(root: &Path, ninja_dir: &Path) -> String {
    let mut env = BuildEnv {
        vars: [(
            "PATH".to_string(),
            format!("{}:/usr/bin:/bin", ninja_dir.display()),
        )]
        .into_iter()
        .collect(),
        notes: Vec::new(),
    };
    install_ninja_front(&mut env, root, Path::new("/usr/bin/python3"))
        .unwrap()
        .expect("PATH has a ninja");
    assert!(
        env.notes.iter().any(|n| n.contains("(ninja 1.13.0")),
        "the note names the ninja that runs: {:?}",
        env.notes
    );
    env.vars["PATH"].clone()
}

#[test]
fn paths_with_spaces_and_a_default_statement_keep_the_order() {
    let tmp = tempfile::tempdir().unwrap();
    let ninja_dir = tmp.path().join("tools");
    commstack_testkit::build_tools::ninja(&ninja_dir);
    let path = front_path(&tmp.path().join("fixed"), &ninja_dir);
    // A directory with a space (escaped `$ ` in build.ninja) and a `default` line naming
    // torch's targets: ninja builds only what `default` names, so the stamps must be there.
    let dir = tmp.path().join("with space");
    let o = esc(&dir.join("build"));
    torch_like_build_with(&dir, &format!("default {o}/dlink.o\n"));
    ninja_on(&path, &dir.join("build"));
    let order = started(&dir.join("build"));
    assert_eq!(order[0], "python_api.o", "{order:?}");
    assert!(order.contains(&"dlink.o".to_string()), "{order:?}");
    let ours = fs::read_to_string(dir.join("build/build.commstack.ninja")).unwrap();
    assert!(ours.contains("with$ space"), "{ours}");
    assert!(ours.lines().any(|l| l.starts_with("default ")), "{ours}");
}

#[test]
fn what_the_front_does_not_follow_runs_in_torchs_order_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let ninja_dir = tmp.path().join("tools");
    commstack_testkit::build_tools::ninja(&ninja_dir);
    let path = front_path(&tmp.path().join("fixed"), &ninja_dir);
    // A variable in a build line: the front does not expand variables, so it leaves the
    // order alone (a stamp after a misread name would stop the build).
    let dir = tmp.path().join("var");
    torch_like_build_with(&dir, "extra = x\nbuild $extra.stamp: compile ../src/a.cu\n");
    let out = ninja_on(&path, &dir.join("build"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("commstack ninja front: a variable in a build line")
            && stderr.contains("torch's order"),
        "{stderr}"
    );
    assert!(!dir.join("build/build.commstack.ninja").exists());
    let order = started(&dir.join("build"));
    assert_eq!(order[0], "a.o", "torch's order: {order:?}");
}
