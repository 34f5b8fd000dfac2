//! NVSHMEM for the stack: the locked source unpacked into the store, then built into the
//! store with its drop-in wheel (`build nvshmem`, and `build kernels` on the way).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_fetch::tree::Strip;
use commstack_nvshmem::{BuildRequest, Built, DropIn, build, build_dropin_wheel, compare_wheels};
use commstack_store::{Outcome, Store};

use crate::ctx::Ctx;
use crate::flow::fetch::base_options;
use crate::flow::lock::{artifacts_of_parts, read_lock};
use crate::flow::toolchain::resolve;
use crate::options::Part;
use crate::options::{BuildOptions, SourceFetch};
use crate::settings::Settings;

/// `cargo xtask build nvshmem`: NVSHMEM and its drop-in wheel (and on request the CMake
/// configure alone, or a comparison with NVIDIA's wheel). Returns the exit code and the
/// install prefix.
pub fn nvshmem_build(ctx: &Ctx, args: &BuildOptions) -> Result<(ExitCode, PathBuf)> {
    let started = Instant::now();
    let settings = Settings::resolve(ctx, args)?;
    settings.print_notes();
    let say = |line: &str| ctx.say(line);
    if let Some(work) = &args.configure_only {
        let (source, tree) = nvshmem_source(ctx, args, &|l| crate::out!("{l}"))?;
        let tc = resolve(ctx, &args.toolchain, false, &say)?;
        let python3 = Settings::python3(args)?;
        let req = request(&settings, &source, &tree, &tc, python3, &say);
        let cache = commstack_nvshmem::configure_only(&req, work)?;
        for (k, v) in &cache {
            crate::out!("{k}={v}");
        }
        crate::out!(
            "configured in {}: log {}",
            work.display(),
            work.join("logs/configure.log").display()
        );
        return Ok((ExitCode::SUCCESS, work.clone()));
    }
    let built = nvshmem_step(ctx, &settings, args, &say, &|l: &str| crate::out!("{l}"))?;
    let dropin = dropin_step(ctx, &settings, args, &built, &|l: &str| crate::out!("{l}"))?;
    let mut code = ExitCode::SUCCESS;
    if let Some(theirs) = &args.compare_with {
        let cmp = compare_wheels(&dropin.wheel, theirs, &settings.nvshmem)?;
        print!("{}", cmp.render());
        if !cmp.passed() {
            eprintln!(
                "error: {} unexplained difference(s) with {}",
                cmp.unexplained().len(),
                theirs.display()
            );
            code = ExitCode::FAILURE;
        }
    }
    say(&format!("done in {:.2} s", started.elapsed().as_secs_f64()));
    Ok((code, built.prefix.clone()))
}

/// The source to build: `--source DIR` (an override, hashed here) or the locked one.
fn nvshmem_source(ctx: &Ctx, args: &BuildOptions, say: &dyn Fn(&str)) -> Result<(PathBuf, String)> {
    match &args.source {
        Some(dir) => {
            let dir = dir
                .canonicalize()
                .with_context(|| format!("no source tree at {}", dir.display()))?;
            let tree = commstack_fetch::tree::tree_sha256_dir(&dir)
                .with_context(|| format!("cannot hash {}", dir.display()))?;
            crate::util::warn_once(
                say,
                &format!(
                    "WARNING nvshmem: OVERRIDE: building {} (tree {tree}), not the locked source",
                    dir.display()
                ),
            );
            Ok((dir, tree))
        }
        None => locked_source(ctx, &args.fetch, "nvshmem", say),
    }
}

fn request<'a>(
    settings: &'a Settings,
    source: &'a std::path::Path,
    tree: &'a str,
    tc: &'a commstack_toolchain::Toolchain,
    python3: PathBuf,
    say: &'a dyn Fn(&str),
) -> BuildRequest<'a> {
    BuildRequest {
        source_dir: source,
        source_tree_sha256: tree,
        options: &settings.nvshmem,
        toolchain: tc,
        python3,
        passthrough: settings.passthrough.clone(),
        jobs: settings.jobs,
        progress: say,
    }
}

/// NVSHMEM built (or found) in the store, with its proof printed.
pub fn nvshmem_step(
    ctx: &Ctx,
    settings: &Settings,
    args: &BuildOptions,
    say: &dyn Fn(&str),
    result: &dyn Fn(&str),
) -> Result<Built> {
    let (source, tree) = nvshmem_source(ctx, args, say)?;
    let tc = resolve(ctx, &args.toolchain, false, say)?;
    say(&format!("toolchain: {}", tc.describe()));
    let python3 = Settings::python3(args)?;
    let req = request(settings, &source, &tree, &tc, python3, say);
    let store = Store::open(ctx.store_dir())?;
    let built = build(&store, &req, args.force)?;
    match &built.outcome {
        Outcome::Cached { path } => result(&format!(
            "nvshmem: already built with these inputs, nothing to do: {}",
            path.display()
        )),
        Outcome::Built { path, seconds } => result(&format!(
            "nvshmem: built in {seconds:.1} s: {}",
            path.display()
        )),
    }
    let p = &built.report.proof;
    result(&format!(
        "proof: NVSHMEM_USE_NCCL={}, {} option(s) as asked, {} libnccl name(s), NVSHMEM {}, SASS {:?}, GLIBC {} / GLIBCXX {} -> {}",
        p.use_nccl,
        built
            .report
            .cmake_defines
            .iter()
            .filter(|(k, _)| k.starts_with("NVSHMEM_"))
            .count(),
        p.libnccl_hits.len(),
        p.version.as_deref().unwrap_or("?"),
        p.sass_found
            .get("lib/libnvshmem_device.a")
            .cloned()
            .unwrap_or_default(),
        p.newest_glibc.as_deref().unwrap_or("-"),
        p.newest_glibcxx.as_deref().unwrap_or("-"),
        p.manylinux
    ));
    result(&format!(
        "report: {}",
        built
            .outcome
            .path()
            .join(commstack_nvshmem::REPORT_FILE)
            .display()
    ));
    Ok(built)
}

/// The drop-in wheel made (or found) from an NVSHMEM build, its notes printed.
pub fn dropin_step(
    ctx: &Ctx,
    settings: &Settings,
    args: &BuildOptions,
    built: &Built,
    result: &dyn Fn(&str),
) -> Result<DropIn> {
    let store = Store::open(ctx.store_dir())?;
    let spec = settings.dropin_spec(
        settings
            .torch_pin
            .clone()
            .unwrap_or_else(|| built.report.source.version.clone()),
    );
    let (dropin, outcome) = build_dropin_wheel(&store, built, &spec, args.force)?;
    result(&format!(
        "wheel{}: {}",
        if outcome.was_cached() {
            " (cached)"
        } else {
            ""
        },
        dropin.wheel.display()
    ));
    for note in &dropin.notes {
        result(&format!("  note: {note}"));
    }
    Ok(dropin)
}

/// The locked source `name`: fetched (or found in the cache), verified, and unpacked into
/// a store step keyed by its tree hash. Returns the source directory and its tree hash.
pub fn locked_source(
    ctx: &Ctx,
    fetch: &SourceFetch,
    name: &str,
    say: &dyn Fn(&str),
) -> Result<(PathBuf, String)> {
    let lock = read_lock(ctx)?;
    let artifacts: Vec<_> = artifacts_of_parts(&lock, &[Part::Sources])?
        .into_iter()
        .filter(|a| a.name == name)
        .collect();
    if artifacts.is_empty() {
        bail!("{} has no source named {name}", ctx.lock_path().display());
    }
    let options = base_options(ctx, &fetch.mirror, fetch.offline, fetch.accept_tree_match)?;
    let fetched = commstack_fetch::fetch_all(&artifacts, &options)?;
    let f = &fetched[0];
    if let Some(d) = f.deviation() {
        crate::util::warn_once(say, &format!("WARNING {d}"));
    }
    let tree = artifacts[0]
        .tree_sha256
        .clone()
        .with_context(|| format!("the lock has no tree hash for {name}: run `cargo xtask lock`"))?;
    let store = Store::open(ctx.store_dir())?;
    let inputs = serde_json::json!({ "source": name, "tree": tree });
    let key = commstack_store::StepKey::new(&format!("{name}-source"), &inputs);
    let archive = f.path.clone();
    // Which archive the tree came from, by its own sha256 (the key is the tree's).
    let record = serde_json::json!({
        "filename": f.filename,
        "sha256": f.sha256(),
        "provenance": f.provenance,
    });
    let outcome = store.run(&key, &inputs, false, |dir| {
        // The one unpacker (not GNU tar, which stores links pointing outside as a
        // success); TopDir is --strip-components=1 that insists on one top directory. The
        // tree it writes is hashed before it is moved into place (as DeepEP's source is).
        let src = dir.out.join("src");
        commstack_fetch::tree::place_verified(&archive, &src, Strip::TopDir, &tree)?;
        std::fs::write(
            dir.out.join("archive.json"),
            serde_json::to_string_pretty(&record)?,
        )?;
        Ok(())
    })?;
    Ok((outcome.path().join("src"), tree))
}
