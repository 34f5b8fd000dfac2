//! `bench substitute`: a new machine with a warm registry, two ways to the image. The
//! image and every step output of this home go into the registry (`push`, `cache push`,
//! both signed); then, with the image removed from Docker, `docker pull` of the pushed
//! reference is timed against `build --substitute` in an empty COMMSTACK_HOME (no store,
//! no download cache), which ends with the image loaded and statically verified. Both
//! must give the same image ID; the target is at most 1.2x docker pull's time.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_pipeline::ctx::Ctx;
use commstack_pipeline::flow::build::SourceFetchArgs;

/// What the bench needs to know.
pub struct Request<'a> {
    pub registry: &'a str,
    pub key: &'a Path,
    pub ca_file: Option<&'a Path>,
    pub fetch: &'a SourceFetchArgs,
    /// Keep the substituting home afterwards (it holds a whole store, gigabytes).
    pub keep: bool,
    /// The registry holds this home's image and step outputs already (an earlier run):
    /// skip the push, find the image by its `lock-<sha256>` tag.
    pub pushed: bool,
}

pub fn bench_substitute(ctx: &Ctx, req: &Request) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the xtask binary")?;
    let scratch = ctx.home.join("bench").join("substitute");
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    let xtask = |home: &Path, stack: &Path| {
        let mut cmd = Command::new(&exe);
        cmd.arg("--stack")
            .arg(stack)
            .arg("--home")
            .arg(home)
            .stdin(Stdio::null());
        if let Some(ca) = req.ca_file {
            cmd.env("COMMSTACK_REGISTRY_CA", ca);
        }
        cmd
    };
    let fetch_flags = |cmd: &mut Command| {
        for m in &req.fetch.mirror {
            cmd.args(["--mirror", m]);
        }
        if req.fetch.accept_tree_match {
            cmd.arg("--accept-tree-match");
        }
        if req.fetch.offline {
            cmd.arg("--offline");
        }
    };

    // 1. This home's image as an OCI layout (built if it is not), pushed and signed.
    let (reference, image_id) = match req.pushed {
        true => pushed_image(ctx, req)?,
        false => push(ctx, req, &scratch, &xtask, &fetch_flags)?,
    };
    eprintln!("bench: pushed {reference} (image {image_id}) and the step outputs");

    // 2. docker pull, with the image (and its layers) gone from Docker first.
    remove_image(&image_id);
    let t = Instant::now();
    run(
        "docker pull",
        Command::new("docker").args(["pull", "--quiet", &reference]),
    )?;
    let pull_s = t.elapsed().as_secs_f64();
    let pulled = docker_id(&reference)?;
    eprintln!("bench: docker pull {pull_s:.1} s, image {pulled}");
    // A new machine has none of the image's layers: another image holding some would
    // have let the pull (and the load) skip them.
    let others = sharing_layers(&pulled)?;
    if !others.is_empty() {
        bail!(
            "Docker holds other images with layers of {pulled}: {}; the pull did not start from nothing. Remove them (`docker rmi {}`) and run the bench again",
            others.join(", "),
            others.join(" ")
        );
    }

    // 3. build --substitute from nothing: a copy of the stack that trusts the key, an
    //    empty home, the image removed from Docker again.
    remove_image(&image_id);
    let key = commstack_registry::sign::read_signing_key(req.key)?;
    let public = commstack_registry::sign::public_key_text(&key.verifying_key());
    let stack_dir = scratch.join("stack");
    let home = scratch.join("home");
    for dir in [&stack_dir, &home] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
    }
    let stack = stack_dir.join("stack.toml");
    let text = std::fs::read_to_string(&ctx.stack_path)?;
    if text.contains("[cache]") {
        bail!(
            "{} has a [cache] section: run the bench on a stack without one (it adds its own)",
            ctx.stack_path.display()
        );
    }
    std::fs::write(
        &stack,
        format!("{text}\n[cache]\ntrusted-keys = [\"{public}\"]\n"),
    )?;
    std::fs::copy(ctx.lock_path(), stack_dir.join("stack.lock"))?;
    std::fs::copy(
        commstack_pipeline::flow::lock::requirements_path(ctx),
        stack_dir.join("requirements.lock"),
    )?;
    let mut cmd = xtask(&home, &stack);
    cmd.args(["build", "--locked", "--json", "--substitute", req.registry]);
    fetch_flags(&mut cmd);
    let t = Instant::now();
    let summary: serde_json::Value = serde_json::from_slice(&run("build --substitute", &mut cmd)?)
        .context("build --json printed no JSON")?;
    let substitute_s = t.elapsed().as_secs_f64();
    // The image Docker holds under the tag the load step gave it.
    let tag = loaded_tag(&summary).context("build --substitute's summary names no loaded image")?;
    let built = docker_id(&tag)?;

    println!("| way to the image | seconds | image ID |");
    println!("|---|---|---|");
    println!("| `docker pull {reference}` | {pull_s:.1} | {pulled} |");
    println!(
        "| `build --substitute` in an empty home (to the loaded, statically verified image) | {substitute_s:.1} | {built} |"
    );
    println!();
    println!("| step | outcome | seconds |");
    println!("|---|---|---|");
    for row in summary["steps"].as_array().into_iter().flatten() {
        println!(
            "| {} | {} | {:.1} |",
            row["step"].as_str().unwrap_or("?"),
            row["outcome"].as_str().unwrap_or("?"),
            row["seconds"].as_f64().unwrap_or(0.0)
        );
    }
    let ratio = substitute_s / pull_s;
    println!();
    println!("ratio {ratio:.2}x docker pull (target <= 1.2x)");
    if !req.keep {
        let _ = std::fs::remove_dir_all(&home);
    }
    let mut ok = true;
    if built != pulled || pulled != image_id {
        eprintln!(
            "bench: the image IDs differ: pushed {image_id}, pulled {pulled}, substituted {built}"
        );
        ok = false;
    }
    let compiled: Vec<&str> = summary["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["outcome"] == "built")
        .filter_map(|r| r["step"].as_str())
        .filter(|s| matches!(*s, "nvshmem" | "kernels" | "deepep" | "image"))
        .collect();
    if !compiled.is_empty() {
        eprintln!(
            "bench: these steps were built, not substituted: {}",
            compiled.join(", ")
        );
        ok = false;
    }
    if ratio > 1.2 {
        eprintln!("bench: {ratio:.2}x docker pull's time is over the 1.2x target");
        ok = false;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Pushes this home's image (an OCI layout, built if it is not) and its step outputs,
/// signed; returns the image's `repo@sha256:...` and its ID.
fn push(
    ctx: &Ctx,
    req: &Request,
    scratch: &Path,
    xtask: &dyn Fn(&Path, &Path) -> Command,
    fetch_flags: &dyn Fn(&mut Command),
) -> Result<(String, String)> {
    let oci = scratch.join("oci");
    let _ = std::fs::remove_dir_all(&oci);
    let mut cmd = xtask(&ctx.home, &ctx.stack_path);
    cmd.args(["build", "image", "--locked", "--no-load", "--oci"])
        .arg(&oci);
    fetch_flags(&mut cmd);
    run("build image --oci", &mut cmd)?;
    let mut cmd = xtask(&ctx.home, &ctx.stack_path);
    cmd.args(["push", "--json", "--registry", req.registry, "--oci"])
        .arg(&oci)
        .arg("--key")
        .arg(req.key);
    let pushed: serde_json::Value =
        serde_json::from_slice(&run("push", &mut cmd)?).context("push --json printed no JSON")?;
    let _ = std::fs::remove_dir_all(&oci);
    let reference = pushed["reference"]
        .as_str()
        .context("push --json: no reference")?
        .to_string();
    let image_id = pushed["config_digest"]
        .as_str()
        .context("push --json: no config_digest")?
        .to_string();
    let mut cmd = xtask(&ctx.home, &ctx.stack_path);
    cmd.args(["cache", "push", "--registry", req.registry, "--key"])
        .arg(req.key);
    run("cache push", &mut cmd)?;
    Ok((reference, image_id))
}

/// The image an earlier run pushed for this lock: its `lock-<sha256>` tag's manifest.
fn pushed_image(ctx: &Ctx, req: &Request) -> Result<(String, String)> {
    let lock = std::fs::read(ctx.lock_path())
        .with_context(|| format!("cannot read {}", ctx.lock_path().display()))?;
    let tag = format!("lock-{}", commstack_digest::sha256_hex(&lock));
    let mut options =
        commstack_registry::PushOptions::new(commstack_registry::Target::parse(req.registry)?);
    options.ca_file = req.ca_file.map(Path::to_path_buf);
    let found = commstack_registry::pull::find_tag(&options, &tag)?.with_context(|| {
        format!(
            "{} has no {tag}: run the bench once without --pushed",
            req.registry
        )
    })?;
    let manifest: serde_json::Value = serde_json::from_slice(&found.manifest)?;
    let id = manifest["config"]["digest"]
        .as_str()
        .context("the pushed manifest has no config digest")?
        .to_string();
    Ok((format!("{}@{}", options.target.name(), found.digest), id))
}

/// Runs `cmd`, its stderr passed through; its stdout, or an error naming `what`.
fn run(what: &str, cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    Ok(out.stdout)
}

/// Removes the image and what only it used, so the next way to it starts from nothing.
fn remove_image(id: &str) {
    let _ = Command::new("docker").args(["rmi", "--force", id]).output();
    let _ = Command::new("docker")
        .args(["image", "prune", "--force"])
        .output();
}

/// The images Docker holds, other than `id`, that share a layer with it.
fn sharing_layers(id: &str) -> Result<Vec<String>> {
    let layers = |out: &[u8]| -> Vec<String> {
        serde_json::from_slice::<Vec<String>>(out).unwrap_or_default()
    };
    let inspect = |id: &str| {
        run(
            "docker inspect",
            Command::new("docker").args([
                "image",
                "inspect",
                "--format",
                "{{json .RootFS.Layers}}",
                id,
            ]),
        )
    };
    let mine = layers(&inspect(id)?);
    let all = run(
        "docker image ls",
        Command::new("docker").args(["image", "ls", "--all", "--quiet", "--no-trunc"]),
    )?;
    let mut others = Vec::new();
    for other in String::from_utf8_lossy(&all).lines().filter(|o| *o != id) {
        if layers(&inspect(other)?).iter().any(|l| mine.contains(l)) {
            others.push(other.to_string());
        }
    }
    Ok(others)
}

fn docker_id(reference: &str) -> Result<String> {
    let out = run(
        "docker inspect",
        Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", reference]),
    )?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

/// The tag the load step gave the image, from the summary's facts.
fn loaded_tag(summary: &serde_json::Value) -> Option<String> {
    summary["steps"]
        .as_array()?
        .iter()
        .find(|r| r["step"] == "load")
        .and_then(|r| r["facts"]["tag"].as_str().map(str::to_string))
}

/// The bench's own flags, for clap.
#[derive(clap::Args)]
pub struct Args {
    /// The registry (`HOST[:PORT]/REPO`, `http://` for plain HTTP) to push to and
    /// substitute from.
    #[arg(long, value_name = "HOST[:PORT]/REPO")]
    pub registry: String,
    /// The ed25519 signing key (PKCS#8 PEM: `openssl genpkey -algorithm ed25519`); the
    /// bench's stack copy trusts its public key.
    #[arg(long, value_name = "KEY.pem")]
    pub key: PathBuf,
    /// PEM CA certificates for a registry with a private CA.
    #[arg(long, value_name = "FILE", env = "COMMSTACK_REGISTRY_CA")]
    pub ca_file: Option<PathBuf>,
    /// Keep the substituting home (`<home>/bench/substitute/home`) afterwards.
    #[arg(long)]
    pub keep: bool,
    /// The registry holds this home's image and step outputs from an earlier run of the
    /// bench: skip the push (the image is found by its `lock-<sha256>` tag).
    #[arg(long)]
    pub pushed: bool,
    #[command(flatten)]
    pub fetch: SourceFetchArgs,
}
