//! The locked closure equals uv's for the same target (uv is the oracle, pinned in CI).
//! Needs the network and a uv binary: `COMMSTACK_UV=/path/to/uv cargo test -p commstack-lock
//! --test uv_oracle -- --ignored` (ci/test.sh installs uv==0.13.9 and runs it).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use commstack_stack::Stack;

fn oracle(stack_file: &str) {
    let uv =
        std::env::var("COMMSTACK_UV").expect("set COMMSTACK_UV to a uv binary (ci/test.sh does)");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join(stack_file);
    let stack = Stack::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ours = rt
        .block_on(commstack_lock::lock(&stack, None, None, &|_: &str| {}))
        .unwrap()
        .lock;
    let ours: BTreeSet<String> = ours
        .packages
        .iter()
        .map(|p| format!("{}=={}", p.name, p.version))
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    // What commstack resolves: torch and the stack's extra requirements, with an [nccl]
    // override given to uv as an override (uv's --override is what commstack follows).
    let mut requirements = format!("torch=={}\n", stack.torch.version);
    for extra in &stack.resolve.extra_requirements {
        requirements.push_str(&format!("{extra}\n"));
    }
    std::fs::write(&input, requirements).unwrap();
    let overrides = dir.path().join("overrides.txt");
    let mut override_args: Vec<String> = Vec::new();
    if let commstack_stack::manifest::NcclVersion::Exact(v) = &stack.nccl.version {
        let line = format!("nvidia-nccl-cu{}=={v}\n", stack.torch.cuda_major);
        std::fs::write(&overrides, line).unwrap();
        override_args = vec!["--override".into(), overrides.display().to_string()];
    }
    let t = &stack.target;
    let out = Command::new(uv)
        .args(&override_args)
        .args([
            "pip",
            "compile",
            "--quiet",
            "--no-header",
            "--no-annotate",
            "--no-cache",
        ])
        .arg(&input)
        .args([
            "--python-version",
            &format!("{}.{}", t.python.0, t.python.1),
        ])
        .args([
            "--python-platform",
            &format!("x86_64-manylinux_{}_{}", t.glibc.0, t.glibc.1),
        ])
        .args(["--index-url", &stack.resolve.index_url])
        .args([
            "--exclude-newer",
            &stack.resolve.exclude_newer.unwrap().to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "uv failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    assert_eq!(ours, theirs, "commstack and uv disagree for {stack_file}");
    eprintln!("{stack_file}: {} pins, equal to uv's", ours.len());
}

#[test]
#[ignore = "needs the network (pypi.org) and COMMSTACK_UV"]
fn default_stack_matches_uv() {
    oracle("stack.toml");
}

#[test]
#[ignore = "needs the network (pypi.org) and COMMSTACK_UV"]
fn gpu_adopt_stack_matches_uv() {
    oracle("stacks/gpu-adopt.toml");
}
