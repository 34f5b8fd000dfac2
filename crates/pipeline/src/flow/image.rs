//! The image's steps of the graph: the base from the locked .debs (fetch cache), the
//! self-test and verify tools, the image step (`commstack_image`), `docker load`, verify
//! inside the image with no network, and on request the OCI layout and the `docker build`
//! context. Nothing here opens a network connection.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_image::{Image, ImageInputs, Tool};
use commstack_stack::{Lock, Stack};
use commstack_store::{StepKey, Store};
use xshell::{Shell, cmd};

use crate::ctx::Ctx;
use crate::settings::Settings;
use crate::util::human;

/// Where the image's own files are (see docs/image.md).
const IMAGE_BIN: &str = "/opt/commstack/bin";
const IMAGE_VENV: &str = "/opt/commstack/venv";

/// The base from the locked .debs in the download cache (mmdebstrap, in the store).
pub fn base_step(
    ctx: &Ctx,
    settings: &Settings,
    say: &dyn Fn(&str),
) -> Result<commstack_base::BaseOutput> {
    let lock = &settings.lock;
    let base_lock = lock.base.clone().with_context(|| {
        format!(
            "{}: no [base] section although the stack has [image]: run `cargo xtask{} lock`",
            ctx.lock_path().display(),
            ctx.stack_flag()
        )
    })?;
    let store = Store::open(ctx.store_dir())?;
    let cache = commstack_fetch::Cache::new(ctx.cache_dir());
    let mut debs = Vec::new();
    let mut missing = Vec::new();
    for deb in &lock.debs {
        let file = deb.filename.rsplit('/').next().unwrap_or(&deb.filename);
        match cache.get(&deb.sha256, file)? {
            Some(path) => debs.push((deb, path)),
            None => missing.push(format!("{} {}", deb.name, deb.version)),
        }
    }
    if !missing.is_empty() {
        bail!(
            "{} of the base's {} .deb files are not in the cache ({}): run `cargo xtask{} fetch --only debs`",
            missing.len(),
            lock.debs.len(),
            missing.join(", "),
            ctx.stack_flag()
        );
    }
    let base = commstack_base::build_base(
        &store,
        &commstack_base::BaseInputs {
            base: &base_lock,
            debs,
        },
        |line| say(&format!("base: {line}")),
    )?;
    say(&format!(
        "base: {} ({} packages, {}){}",
        base.dir.display(),
        base.manifest.packages.len(),
        human(base.manifest.layer.size),
        if base.outcome.was_cached() {
            ", cached"
        } else {
            ""
        }
    ));
    Ok(base)
}

/// The self-test built against the NVSHMEM install at `nvshmem_prefix`, stripped into
/// the store for the image.
pub fn selftest_tool(
    ctx: &Ctx,
    settings: &Settings,
    toolchain: &crate::flow::toolchain::ToolchainArgs,
    nvshmem_prefix: PathBuf,
) -> Result<Tool> {
    let tc = crate::flow::toolchain::resolve(ctx, toolchain, false)?;
    let selftest = crate::flow::kernels::build_selftest(
        ctx,
        &tc.nvcc,
        &crate::flow::kernels::NvshmemForKernels {
            describe: format!("the stack's NVSHMEM at {}", nvshmem_prefix.display()),
            prefix: nvshmem_prefix,
        },
        &settings.cuda_archs,
    )?;
    let store = Store::open(ctx.store_dir())?;
    own_tool(
        &store,
        "commstack-selftest",
        &selftest,
        "cargo build --release -p commstack-kernels",
    )
}

/// The verify tool, built and stripped into the store for the image.
pub fn verify_tool(ctx: &Ctx) -> Result<Tool> {
    let verify_bin = build_verify_tool(ctx)?;
    let store = Store::open(ctx.store_dir())?;
    own_tool(
        &store,
        "commstack-verify",
        &verify_bin,
        "cargo build --release -p commstack-verify",
    )
}

/// The image step (its layers reused when their inputs are unchanged), printed.
pub fn image_step(
    ctx: &Ctx,
    settings: &Settings,
    say: &dyn Fn(&str),
    base_dir: &Path,
    wheelhouse_dir: &Path,
    tools: Vec<Tool>,
    force: bool,
) -> Result<Image> {
    let image_settings = settings.stack.image.clone().with_context(|| {
        format!(
            "{}: no [image] section, so this stack is not made into an image (the default \
             stack.toml has one: `cargo xtask build image` with no --stack). Add an [image] \
             section (docs/image.md) and run `cargo xtask lock`",
            settings.stack.path().display()
        )
    })?;
    let store = Store::open(ctx.store_dir())?;
    let (source_url, revision) = git_identity();
    let image = commstack_image::assemble_image_reporting(
        &store,
        &ImageInputs {
            lock: settings.lock.clone(),
            lock_path: ctx.lock_path(),
            lock_sha256: settings.lock_sha256.clone(),
            base_dir: base_dir.to_path_buf(),
            wheelhouse_dir: wheelhouse_dir.to_path_buf(),
            tools,
            name: image_settings.name.clone(),
            user: image_settings.user.clone(),
            source_url,
            revision,
            large_wheel_bytes: commstack_image::LARGE_WHEEL_BYTES,
        },
        force,
        say,
    )?;
    print_image(&image);
    Ok(image)
}

/// The image in Docker under its tag (loaded unless Docker has it).
pub fn load_step(image: &Image) -> Result<String> {
    let t = Instant::now();
    let id = commstack_image::docker_load(image)?;
    crate::out!(
        "loaded: {id} as {} ({:.1} s)",
        image.tag(),
        t.elapsed().as_secs_f64()
    );
    Ok(id)
}

/// Whether Docker has the image `id` under `tag` (`docker image inspect`).
pub fn docker_has(id: &str, tag: &str) -> bool {
    Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}} {{json .RepoTags}}",
            id,
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            let text = String::from_utf8_lossy(&o.stdout);
            text.starts_with(id) && text.contains(&format!("\"{tag}\""))
        })
}

/// `--oci DIR` and `--context DIR`: the image as an OCI layout, and docker/Dockerfile's
/// build context.
pub fn export(image: &Image, oci: Option<&Path>, context: Option<&Path>) -> Result<()> {
    if let Some(dir) = oci {
        let oci = commstack_image::export_oci(image, dir)?;
        crate::out!(
            "OCI layout: {} (manifest {})",
            dir.display(),
            oci.manifest_digest
        );
    }
    if let Some(dir) = context {
        let context = commstack_image::write_docker_context(image, dir)?;
        crate::out!(
            "docker build context: {} (base {}): DOCKER_BUILDKIT=0 docker build -f docker/Dockerfile $(cat {}/build-args) -t NAME {}",
            dir.display(),
            context.base_tag,
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The verify tool for inside the image: a release build of `commstack-verify`.
fn build_verify_tool(ctx: &Ctx) -> Result<PathBuf> {
    let sh = Shell::new()?;
    sh.change_dir(crate::util::workspace_root());
    if !ctx.quiet {
        eprintln!("building commstack-verify (release) ...");
    }
    // A target directory of its own: built beside the self-test in one directory, the two
    // -p builds unify dependency features differently and each rebuild the other's
    // crates, so the self-test would be compiled (and its bytes changed) on every run.
    let target = crate::util::cargo_target_dir().join("image-tools");
    // Paths of this machine (the workspace, cargo's registry) would reach the binary's
    // panic messages; remapped, the bytes do not depend on where the checkout is.
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cargo")))
        .context("no CARGO_HOME and no home directory")?;
    let rustflags = format!(
        "--remap-path-prefix={}=/cargo --remap-path-prefix={}=/commstack",
        cargo_home.display(),
        crate::util::workspace_root().display()
    );
    cmd!(
        sh,
        "cargo build --release --locked --quiet --target-dir {target} -p commstack-verify --bin commstack-verify"
    )
    .env("RUSTFLAGS", rustflags)
    .run()
    .context("building commstack-verify failed")?;
    Ok(target.join("release/commstack-verify"))
}

/// One of our stripped binaries in the store, as the image step takes it.
pub fn tool_at(name: &str, version: &str, host_path: PathBuf, source: String) -> Tool {
    Tool {
        name: name.to_string(),
        version: version.to_string(),
        image_path: format!("{IMAGE_BIN}/{name}"),
        host_path,
        source,
    }
}

/// A stripped copy of one of our binaries, in a store step keyed by the binary's sha256:
/// debug info is most of a release binary and the image has no use for it.
fn own_tool(store: &Store, name: &str, built: &Path, how: &str) -> Result<Tool> {
    let sha = commstack_digest::sha256_file(built)
        .with_context(|| format!("hashing {}", built.display()))?;
    let inputs = serde_json::json!({ "recipe": "stripped-tool-1", "name": name, "sha256": sha });
    let key = StepKey::new("tool", &inputs);
    let outcome = store.run(&key, &inputs, false, |dir| {
        let to = dir.out.join(name);
        std::fs::copy(built, &to).with_context(|| format!("copying {}", built.display()))?;
        let sh = Shell::new()?;
        cmd!(sh, "strip {to}")
            .run()
            .context("strip (binutils) is needed for the image's binaries")?;
        Ok(())
    })?;
    Ok(tool_at(
        name,
        env!("CARGO_PKG_VERSION"),
        outcome.path().join(name),
        format!("{how} (sha256 {sha} before strip)"),
    ))
}

/// The repository's origin URL (credentials removed; a local path or another non-URL
/// origin is left out: it names a host's directory) and commit, for the image's labels.
pub fn git_identity() -> (String, String) {
    let git = |args: &[&str]| -> String {
        Command::new("git")
            .args(args)
            .current_dir(crate::util::workspace_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let origin = url::Url::parse(&git(&["remote", "get-url", "origin"]))
        .ok()
        .filter(|u| matches!(u.scheme(), "https" | "http" | "ssh" | "git"))
        .map(|mut u| {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        })
        .unwrap_or_default();
    (origin, git(&["rev-parse", "HEAD"]))
}

fn print_image(image: &Image) {
    let m = &image.manifest;
    let total: u64 = m.layers.iter().map(|l| l.size).sum();
    crate::out!(
        "image: {}{}",
        image.id(),
        if image.cached { " (cached)" } else { "" }
    );
    crate::out!("tag:   {}", image.tag());
    crate::out!("size:  {} in {} layers", human(total), m.layers.len());
    for (i, l) in m.layers.iter().enumerate() {
        crate::out!("  {i:>2} {:>10}  {}", human(l.size), l.holds);
    }
    crate::out!(
        "files: {} (image.json, config.json, sbom.spdx.json, provenance.json)",
        image.dir.display()
    );
}

/// What verify inside the image found.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    /// 0 when every level that ran passed and torch imported.
    pub exit: u8,
    pub report: PathBuf,
    /// (level, status) as the verify tool reported them.
    pub levels: Vec<(String, String)>,
    pub import_torch: bool,
}

/// Runs the verify tool inside the image with no network; keeps its report under
/// `<home>/reports/image-<id>/`.
pub fn verify_in_container(
    ctx: &Ctx,
    stack: &Stack,
    lock: &Lock,
    image: &Image,
    python_full: &str,
    gpus: bool,
) -> Result<Verdict> {
    let minor = python_full.split('.').take(2).collect::<Vec<_>>().join(".");
    let site = format!("{IMAGE_VENV}/lib/python{minor}/site-packages");
    let mut argv: Vec<String> = vec![
        "run".into(),
        "--rm".into(),
        "--network=none".into(),
        "--entrypoint".into(),
        format!("{IMAGE_BIN}/commstack-verify"),
    ];
    if gpus {
        argv.extend(["--gpus".into(), "all".into()]);
    }
    argv.push(image.id().to_string());
    let levels = if gpus {
        "static,runtime,selftest"
    } else {
        "static"
    };
    argv.extend(
        [
            "--python",
            &format!("{IMAGE_VENV}/bin/python"),
            "--level",
            levels,
            "--json",
            "--quiet",
            "--report",
            "/tmp/commstack-verify",
            "--expect-nccl",
            &lock.resolved.nccl.version.to_string(),
            "--expect-nvshmem",
            &lock.resolved.nvshmem,
            "--nvshmem-prefix",
            &format!("{site}/nvidia/nvshmem"),
            "--target-glibc",
            &format!(
                "{}.{}",
                stack.target.base.glibc.0, stack.target.base.glibc.1
            ),
            "--target-glibcxx",
            &{
                let (a, b, c) = stack.target.base.glibcxx;
                format!("{a}.{b}.{c}")
            },
        ]
        .map(String::from),
    );
    for (switch, on) in stack.nvshmem.transports.iter() {
        argv.push("--nvshmem-option".into());
        argv.push(format!(
            "{}={}",
            switch.cmake,
            if on { "ON" } else { "OFF" }
        ));
    }
    let sms: Vec<String> = stack
        .nvshmem
        .cuda_archs
        .iter()
        .filter(|a| a.has_sass())
        .map(|a| a.sm().to_string())
        .collect();
    if !sms.is_empty() {
        argv.extend(["--cuda-arch".into(), sms.join(",")]);
    }
    if gpus {
        argv.extend([
            "--selftest".into(),
            format!("{IMAGE_BIN}/commstack-selftest"),
        ]);
    }
    if !ctx.quiet {
        eprintln!("verify in the image: docker {}", argv.join(" "));
    }
    let out = Command::new("docker")
        .args(&argv)
        .output()
        .context("cannot run `docker run`: is Docker installed and its daemon running?")?;
    let report_dir = ctx.home.join("reports").join(format!(
        "image-{}",
        &image.id().trim_start_matches("sha256:")[..12]
    ));
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("cannot create {}", report_dir.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report_file = report_dir.join(if gpus {
        "verify-gpus.json"
    } else {
        "verify-static.json"
    });
    crate::util::write_all_atomically(&[(&report_file, &stdout)])?;
    let code = out.status.code().unwrap_or(1);
    let value: Option<serde_json::Value> = serde_json::from_str(&stdout).ok();
    let levels = match &value {
        Some(v) => print_verdicts(v),
        None => bail!(
            "the verify tool in the image gave no report (exit {code}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    };
    crate::out!("verify report: {} (exit {code})", report_file.display());
    let imports = import_without_gpu(image, &report_dir)?;
    Ok(Verdict {
        exit: match (code, imports) {
            (0, true) => 0,
            (c, true) => u8::try_from(c).unwrap_or(1),
            (_, false) => 1,
        },
        report: report_file,
        levels,
        import_torch: imports,
    })
}

/// `import torch` inside the image with no network and no GPU: the Python side that needs
/// no driver. (deep_ep's extension needs the driver's libcuda.so.1: `--gpus`.)
fn import_without_gpu(image: &Image, report_dir: &Path) -> Result<bool> {
    let script = "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda}))";
    let out = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network=none",
            "-e",
            "CUDA_VISIBLE_DEVICES=",
        ])
        .args(["--entrypoint", &format!("{IMAGE_VENV}/bin/python")])
        .args([image.id(), "-c", script])
        .output()
        .context("cannot run `docker run`")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let file = report_dir.join("import-torch.txt");
    crate::util::write_all_atomically(&[(&file, &text)])?;
    let ok = out.status.success();
    let stdout = String::from_utf8_lossy(&out.stdout);
    crate::out!(
        "import torch (no GPU, no network): {} {}",
        if ok { "passed" } else { "FAILED" },
        stdout.lines().last().unwrap_or("").trim()
    );
    if !ok {
        crate::out!("  output: {}", file.display());
    }
    Ok(ok)
}

/// One line per check of the verify report; returns each level's status.
fn print_verdicts(report: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(levels) = report.get("levels").and_then(|l| l.as_array()) else {
        return out;
    };
    for level in levels {
        let name = level.get("level").and_then(|v| v.as_str()).unwrap_or("?");
        let status = level.get("status").and_then(|v| v.as_str()).unwrap_or("?");
        out.push((name.to_string(), status.to_string()));
        crate::out!("verify {name}: {status}");
        for check in level
            .get("checks")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
        {
            crate::out!(
                "  {:<8} {:<40} {}",
                check.get("status").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("name").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("detail").and_then(|v| v.as_str()).unwrap_or("")
            );
        }
    }
    out
}
