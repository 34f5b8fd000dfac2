//! `bench substitute`: a new machine with a warm registry, two ways to the image. The
//! image and every step output of this home go into the registry (`push`, `cache push`,
//! both signed); then, with the image removed from Docker, `docker pull` of the pushed
//! reference is timed against `build --substitute` in an empty COMMSTACK_HOME (no store,
//! no download cache) to the image loaded and statically verified: the whole build less
//! its last step, runtime (`import torch` in the loaded image), which docker pull does not
//! do either. Both must give the same image ID; the target is at most 1.2x docker pull's
//! time. With
//! `--then STACK`, an update follows: STACK's image (a change that moves some layers) is
//! pushed from this home and reached both ways again from that machine, whose home and
//! Docker hold the first image, so only the layers that moved travel.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_steps::ctx::Ctx;
use commstack_steps::options::{GlobalOptions, SourceFetch};

use crate::stats::median;

/// What the bench needs to know.
pub struct Request {
    /// `HOST[:PORT]/REPO` (`http://` for plain HTTP): pushed to and substituted from.
    pub registry: String,
    /// The ed25519 signing key (PKCS#8 PEM); the bench's stack copy trusts its public key.
    pub key: PathBuf,
    /// PEM CA certificates for a registry with a private CA.
    pub ca_file: Option<PathBuf>,
    /// Where the locked sources come from, for each build the bench runs.
    pub fetch: SourceFetch,
    /// Keep the substituting home afterwards (it holds a whole store, gigabytes).
    pub keep: bool,
    /// The registry holds this home's image and step outputs already (an earlier run):
    /// skip the push, find the image by its `lock-<sha256>` tag.
    pub pushed: bool,
    /// Then an update: this stack's image (another lock, some layers the same) pushed
    /// and reached from the first substitution's home and Docker.
    pub then: Option<PathBuf>,
    /// How many times each part runs both ways, from the same start each time: the
    /// verdict is the median of the trials' ratios (a 2 s docker pull varies by a quarter
    /// between runs).
    pub trials: usize,
}

/// An image in the registry: `repo@sha256:...` and its ID.
struct Pushed {
    reference: String,
    id: String,
}

/// One way to the image, timed.
struct Timed {
    seconds: f64,
    /// The image ID Docker holds afterwards.
    id: String,
    /// build's JSON summary (None for docker pull).
    summary: Option<serde_json::Value>,
}

/// The bench's fixed parts: the xtask binary, its scratch directory, the flags it passes.
struct Bench<'a> {
    req: &'a Request,
    exe: &'a Path,
    scratch: PathBuf,
    /// `ed25519:<base64>` of the signing key: the stack copies trust it.
    public: String,
}

/// Runs the bench with the xtask binary `xtask` (the caller's `std::env::current_exe()`):
/// prints the tables and ratios; exit status 1 when a target is missed, the image IDs
/// differ or a step compiled.
pub fn bench_substitute(ctx: &Ctx, req: &Request, xtask: &Path) -> Result<ExitCode> {
    let scratch = ctx.home.join("bench").join("substitute");
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    let key = commstack_registry::sign::read_signing_key(&req.key)?;
    let bench = Bench {
        req,
        exe: xtask,
        scratch,
        public: commstack_registry::sign::public_key_text(&key.verifying_key()),
    };

    // 1. This home's image and step outputs in the registry.
    let first = match req.pushed {
        true => pushed_image(ctx, req)?,
        false => bench.push(ctx)?,
    };
    eprintln!(
        "bench: pushed {} (image {}) and the step outputs",
        first.reference, first.id
    );

    // 2. and 3., `trials` times: docker pull, with the image (and its layers) gone from
    //    Docker first; then build --substitute from nothing: an empty home, the image
    //    removed from Docker again.
    let home = bench.scratch.join("home");
    let mut trials = Vec::new();
    for _ in 0..req.trials.max(1) {
        remove_image(&first.id)?;
        let pull = time_pull(&first)?;
        // A new machine has none of the image's layers: another image holding some would
        // have let the pull (and the load) skip them.
        let others = sharing_layers(&pull.id)?;
        if !others.is_empty() {
            bail!(
                "Docker holds other images with layers of {}: {}; the pull did not start from nothing. Remove them (`docker rmi {}`) and run the bench again",
                pull.id,
                others.join(", "),
                others.join(" ")
            );
        }
        remove_image(&first.id)?;
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home)?;
        trials.push((pull, bench.time_substitute(ctx, &home)?));
    }
    let mut ok = report(
        "A new machine: an empty home, no layer of the image in Docker",
        &first,
        &trials,
    );

    // 4. The update: another stack's image (only some layers differ) pushed from this
    //    home, then reached from the machine of 2 and 3 (its home, its Docker holding the
    //    first image) both ways, each trial from that same state.
    if let Some(then) = &req.then {
        let next_ctx = Ctx::new(GlobalOptions {
            stack: Some(then.to_path_buf()),
            home: Some(ctx.home.clone()),
            quiet: ctx.quiet,
        })?;
        let next = bench.push(&next_ctx)?;
        eprintln!(
            "bench: pushed the update {} (image {})",
            next.reference, next.id
        );
        let steps = home.join("store").join("steps");
        let before = step_names(&steps)?;
        let mut trials = Vec::new();
        let mut moved = String::new();
        for _ in 0..req.trials.max(1) {
            remove_image(&next.id)?;
            let pull = time_pull(&next)?;
            moved = layers_moved(&first.id, &next.id)?;
            // The update's own layers go; the first image keeps the ones they share. The
            // steps the last trial made go too: each substitutes the same.
            remove_image(&next.id)?;
            for name in step_names(&steps)?.difference(&before) {
                std::fs::remove_dir_all(steps.join(name))
                    .with_context(|| format!("cannot remove {}", steps.join(name).display()))?;
            }
            trials.push((pull, bench.time_substitute(&next_ctx, &home)?));
        }
        println!();
        ok &= report(
            &format!(
                "The update to {}: the home and Docker of the new machine above, {moved}",
                then.display()
            ),
            &next,
            &trials,
        );
    }
    if !req.keep {
        let _ = std::fs::remove_dir_all(&home);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

impl Bench<'_> {
    fn xtask(&self, home: &Path, stack: &Path) -> Command {
        let mut cmd = Command::new(self.exe);
        cmd.arg("--stack")
            .arg(stack)
            .arg("--home")
            .arg(home)
            .stdin(Stdio::null());
        if let Some(ca) = &self.req.ca_file {
            cmd.env("COMMSTACK_REGISTRY_CA", ca);
        }
        cmd
    }

    fn fetch_flags(&self, cmd: &mut Command) {
        for m in &self.req.fetch.mirror {
            cmd.args(["--mirror", m]);
        }
        if self.req.fetch.accept_tree_match {
            cmd.arg("--accept-tree-match");
        }
        if self.req.fetch.offline {
            cmd.arg("--offline");
        }
    }

    /// `ctx`'s image (an OCI layout, built if it is not) and its step outputs, pushed and
    /// signed.
    fn push(&self, ctx: &Ctx) -> Result<Pushed> {
        let oci = self.scratch.join("oci");
        let _ = std::fs::remove_dir_all(&oci);
        let mut cmd = self.xtask(&ctx.home, &ctx.stack_path);
        cmd.args(["build", "image", "--locked", "--no-load", "--oci"])
            .arg(&oci);
        self.fetch_flags(&mut cmd);
        run("build image --oci", &mut cmd)?;
        let mut cmd = self.xtask(&ctx.home, &ctx.stack_path);
        cmd.args(["push", "--json", "--registry", &self.req.registry, "--oci"])
            .arg(&oci)
            .arg("--key")
            .arg(&self.req.key);
        let pushed: serde_json::Value = serde_json::from_slice(&run("push", &mut cmd)?)
            .context("push --json printed no JSON")?;
        let _ = std::fs::remove_dir_all(&oci);
        let mut cmd = self.xtask(&ctx.home, &ctx.stack_path);
        cmd.args(["cache", "push", "--registry", &self.req.registry, "--key"])
            .arg(&self.req.key);
        run("cache push", &mut cmd)?;
        Ok(Pushed {
            reference: pushed["reference"]
                .as_str()
                .context("push --json: no reference")?
                .to_string(),
            id: pushed["config_digest"]
                .as_str()
                .context("push --json: no config_digest")?
                .to_string(),
        })
    }

    /// `build --substitute --locked` of a copy of `ctx`'s stack that trusts the key, in
    /// `home`, timed: the whole build (to the runtime step).
    fn time_substitute(&self, ctx: &Ctx, home: &Path) -> Result<Timed> {
        let stack_dir = self.scratch.join("stack");
        let _ = std::fs::remove_dir_all(&stack_dir);
        std::fs::create_dir_all(&stack_dir)?;
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
            format!("{text}\n[cache]\ntrusted-keys = [\"{}\"]\n", self.public),
        )?;
        std::fs::copy(ctx.lock_path(), stack_dir.join("stack.lock"))?;
        std::fs::copy(
            commstack_steps::flow::lock::requirements_path(ctx),
            stack_dir.join("requirements.lock"),
        )?;
        let mut cmd = self.xtask(home, &stack);
        cmd.args([
            "build",
            "--locked",
            "--json",
            "--substitute",
            &self.req.registry,
        ]);
        self.fetch_flags(&mut cmd);
        settle();
        let t = Instant::now();
        let summary: serde_json::Value =
            serde_json::from_slice(&run("build --substitute", &mut cmd)?)
                .context("build --json printed no JSON")?;
        let seconds = t.elapsed().as_secs_f64();
        // The image Docker holds under the tag the load step gave it.
        let tag =
            loaded_tag(&summary).context("build --substitute's summary names no loaded image")?;
        Ok(Timed {
            seconds,
            id: docker_id(&tag)?,
            summary: Some(summary),
        })
    }
}

/// Writes what earlier steps left dirty in the page cache (a push writes gigabytes into
/// the registry's storage) before a way is timed, so neither way pays for it.
fn settle() {
    let _ = Command::new("sync").status();
}

/// `docker pull` of the pushed reference, timed.
fn time_pull(pushed: &Pushed) -> Result<Timed> {
    settle();
    let t = Instant::now();
    run(
        "docker pull",
        Command::new("docker").args(["pull", "--quiet", &pushed.reference]),
    )?;
    let seconds = t.elapsed().as_secs_f64();
    let id = docker_id(&pushed.reference)?;
    eprintln!("bench: docker pull {seconds:.1} s, image {id}");
    Ok(Timed {
        seconds,
        id,
        summary: None,
    })
}

/// Prints the two ways and the steps of each trial, and with several the medians; false
/// when the IDs differ or a step compiled in any trial, or the ratio (with several trials
/// the median of theirs) is over the target.
fn report(title: &str, pushed: &Pushed, trials: &[(Timed, Timed)]) -> bool {
    let mut ok = true;
    let mut rows = Vec::new();
    for (i, (pull, substituted)) in trials.iter().enumerate() {
        match trials.len() {
            1 => println!("{title}:"),
            n => println!("{title}, trial {} of {n}:", i + 1),
        }
        let (milestone, fine) = trial(pushed, pull, substituted);
        ok &= fine;
        rows.push((pull.seconds, milestone));
        println!();
    }
    let ratio = match rows.as_slice() {
        [(pull, milestone)] => milestone / pull,
        _ => {
            println!("{title}, {} trials:", rows.len());
            println!();
            println!("| trial | `docker pull` | `build --substitute` | ratio |");
            println!("|---|---|---|---|");
            for (i, (pull, milestone)) in rows.iter().enumerate() {
                println!(
                    "| {} | {pull:.1} | {milestone:.1} | {:.2}x |",
                    i + 1,
                    milestone / pull
                );
            }
            // Each trial's two ways ran one after the other, so the machine's drift
            // across trials (a slow disk for a minute) moves both: the verdict is the
            // median of the trials' own ratios.
            let ratio = median(rows.iter().map(|(pull, milestone)| milestone / pull));
            println!(
                "| median | {:.1} | {:.1} | {ratio:.2}x |",
                median(rows.iter().map(|r| r.0)),
                median(rows.iter().map(|r| r.1))
            );
            println!();
            ratio
        }
    };
    println!(
        "ratio {ratio:.2}x docker pull to the loaded, statically verified image{} (target <= 1.2x)",
        if rows.len() > 1 {
            ", the median of the trials' ratios"
        } else {
            ""
        }
    );
    if ratio > 1.2 {
        eprintln!("bench: {ratio:.2}x docker pull's time is over the 1.2x target");
        ok = false;
    }
    ok
}

/// Prints one trial's two ways and steps; returns the time to the loaded, statically
/// verified image and false when the IDs differ or a step compiled.
fn trial(pushed: &Pushed, pull: &Timed, substituted: &Timed) -> (f64, bool) {
    let summary = substituted.summary.clone().unwrap_or_default();
    println!();
    println!("| way to the image | seconds | image ID |");
    println!("|---|---|---|");
    println!(
        "| `docker pull {}` | {:.1} | {} |",
        pushed.reference, pull.seconds, pull.id
    );
    // The milestone is the loaded, statically verified image: the build runs its runtime
    // step (in the loaded image) after it, last and alone, so it ends that step's time
    // before the build's end.
    let runtime: f64 = summary["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["step"] == "runtime")
        .filter_map(|r| r["seconds"].as_f64())
        .sum();
    let milestone = substituted.seconds - runtime;
    println!(
        "| `build --substitute` (to the loaded, statically verified image) | {milestone:.1} | {} |",
        substituted.id
    );
    println!(
        "| `build --substitute` (the whole build, with the runtime step's {runtime:.1} s) | {:.1} | {} |",
        substituted.seconds, substituted.id
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
    println!();
    println!(
        "ratio {:.2}x docker pull to the loaded, statically verified image; the whole build, with runtime: {:.1} s, {:.2}x docker pull",
        milestone / pull.seconds,
        substituted.seconds,
        substituted.seconds / pull.seconds
    );
    let mut ok = true;
    if substituted.id != pull.id || pull.id != pushed.id {
        eprintln!(
            "bench: the image IDs differ: pushed {}, pulled {}, substituted {}",
            pushed.id, pull.id, substituted.id
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
    (milestone, ok)
}

/// The names in a store's `steps/`.
fn step_names(steps: &Path) -> Result<std::collections::BTreeSet<String>> {
    std::fs::read_dir(steps)
        .with_context(|| format!("cannot read {}", steps.display()))?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect()
}

/// "k of n layers moved" from image `from` to `to` (both in Docker).
fn layers_moved(from: &str, to: &str) -> Result<String> {
    let (old, new) = (rootfs_layers(from)?, rootfs_layers(to)?);
    let moved = new.iter().filter(|l| !old.contains(l)).count();
    Ok(format!("{moved} of {} layers moved", new.len()))
}

/// The diff_ids of image `id`, bottom first, as Docker holds it.
fn rootfs_layers(id: &str) -> Result<Vec<String>> {
    let out = run(
        "docker inspect",
        Command::new("docker").args([
            "image",
            "inspect",
            "--format",
            "{{json .RootFS.Layers}}",
            id,
        ]),
    )?;
    serde_json::from_slice(&out).with_context(|| format!("docker's layers of {id}"))
}

/// The image an earlier run pushed for this lock: its `lock-<sha256>` tag's manifest.
fn pushed_image(ctx: &Ctx, req: &Request) -> Result<Pushed> {
    let lock = std::fs::read(ctx.lock_path())
        .with_context(|| format!("cannot read {}", ctx.lock_path().display()))?;
    let tag = format!("lock-{}", commstack_digest::sha256_hex(&lock));
    let mut options =
        commstack_registry::PushOptions::new(commstack_registry::Target::parse(&req.registry)?);
    options.ca_file = req.ca_file.clone();
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
    Ok(Pushed {
        reference: format!("{}@{}", options.target.name(), found.digest),
        id,
    })
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

/// Removes the image and what only it used, so the next way to it starts from nothing;
/// an image Docker still holds afterwards (a container uses it) ends the bench.
fn remove_image(id: &str) -> Result<()> {
    let _ = Command::new("docker").args(["rmi", "--force", id]).output();
    let _ = Command::new("docker")
        .args(["image", "prune", "--force"])
        .output();
    let held = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", id])
        .output()
        .context("cannot run docker image inspect")?;
    if held.status.success() {
        bail!(
            "Docker still holds {id} after `docker rmi --force`: the next way to it would not start from nothing. Remove what uses it (`docker ps -a --filter ancestor={id}`) and run the bench again"
        );
    }
    Ok(())
}

/// The images Docker holds, other than `id`, that share a layer with it.
fn sharing_layers(id: &str) -> Result<Vec<String>> {
    let mine = rootfs_layers(id)?;
    let all = run(
        "docker image ls",
        Command::new("docker").args(["image", "ls", "--all", "--quiet", "--no-trunc"]),
    )?;
    let mut others = Vec::new();
    for other in String::from_utf8_lossy(&all).lines().filter(|o| *o != id) {
        if rootfs_layers(other)?.iter().any(|l| mine.contains(l)) {
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
