//! `cargo xtask cache ls|verify|gc|hash`: the download cache (<home>/cache); `cache push`:
//! the store's step outputs into a registry, signed (the binary cache).

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;

use anyhow::{Context, Result};
use commstack_fetch::{Artifact, Cache};

use commstack_binary_cache::push::{CachePushRequest, cache_push};
use commstack_steps::ctx::Ctx;
use commstack_steps::flow::lock::locked_artifacts;
use commstack_steps::util::human;

#[derive(clap::Subcommand)]
pub enum Command {
    /// List the cached files: sha256, size, file name, and which locked artifact each is
    /// (or that the lock no longer names it).
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every cached file and report those whose bytes no longer match their
    /// sha256 (disk or hand damage). Exit status 1 when any is found.
    Verify {
        /// Delete the damaged files, so that the next `cargo xtask fetch` downloads them again.
        #[arg(long)]
        remove: bool,
    },
    /// Delete cached files the lock does not name, and interrupted downloads. Files that
    /// another running fetch holds are left alone.
    Gc {
        /// Only say what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Delete every cached file, whatever the lock says (no lock needed).
        #[arg(long)]
        all: bool,
    },
    /// Push every step output of the store that ships something (nvshmem, dropin, kernels,
    /// deepep, wheelhouse, base, image) to an OCI registry as a signed artifact tagged
    /// `<step>-<key>`: the binary cache another machine substitutes from. See
    /// docs/registry.md.
    #[command(after_help = "\
Each output becomes an OCI artifact (artifactType application/vnd.dev.commstack.step.v1):
its config the step's provenance (store key, inputs, result, the manifest of every shipped
file with sha256 and mode), its layer a tar of exactly those files, checked against that
manifest before anything is sent (a damaged store output is refused); the image's also
carries its layer steps (image-layer-<hash>: layer.tar, layer.json), so that a substituting
home writes no layer and compiles nothing for it. The manifest digest
is signed with the ed25519 key given (`openssl genpkey -algorithm ed25519 -out key.pem`) in
cosign's format: pushed as an OCI 1.1 referrer of the output where the registry has the
referrers API, else under cosign's tag sha256-<hex>.sig (`cosign verify --key cosign.pub
--insecure-ignore-tlog=true` verifies it; cosign.pub from `openssl pkey -in key.pem -pubout`).
A puller's [cache] trusted-keys take `ed25519:<base64>` or that PEM file. Credentials, CA
and retries as for `cargo xtask push`.")]
    Push {
        /// The cache repository: HOST[:PORT]/REPO.
        #[arg(long, value_name = "HOST[:PORT]/REPO")]
        registry: String,
        /// The ed25519 private key that signs (PKCS#8 PEM).
        #[arg(long, value_name = "FILE", env = "COMMSTACK_SIGNING_KEY")]
        key: std::path::PathBuf,
        /// Only this step's outputs (repeatable; default: every step that ships).
        #[arg(long = "step", value_parser = crate::args::step_parser(), value_name = "STEP")]
        steps: Vec<commstack_steps::graph::StepId>,
        /// PEM file of CA certificates to trust besides the system's.
        #[arg(long, value_name = "FILE", env = "COMMSTACK_REGISTRY_CA")]
        ca_file: Option<std::path::PathBuf>,
        /// Blobs uploaded at once.
        #[arg(long, default_value_t = 4, value_name = "N")]
        jobs: usize,
        /// On a registry with the referrers API, put each signature under cosign's tag
        /// sha256-<hex>.sig as well as a referrer (for verifiers that read only the tag
        /// scheme: `cosign verify` without --experimental-oci11, the policy controller).
        #[arg(long)]
        signature_tag: bool,
        /// Print the pushed outputs as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the sha256 and the commstack tree hash of a source archive or directory: the
    /// two values a known-source entry (crates/stack/src/known-sources.toml) records.
    Hash {
        /// A .tar.gz / .tgz / .tar / .zip archive, or a directory of unpacked sources.
        path: std::path::PathBuf,
    },
}

pub fn run(ctx: &Ctx, cmd: Command) -> Result<ExitCode> {
    let cache = Cache::new(ctx.cache_dir());
    match cmd {
        Command::Ls { json } => ls(ctx, &cache, json),
        Command::Verify { remove } => verify(&cache, remove),
        Command::Gc { dry_run, all } => gc(ctx, &cache, dry_run, all),
        Command::Hash { path } => hash(&path),
        Command::Push {
            registry,
            key,
            steps,
            ca_file,
            jobs,
            signature_tag,
            json,
        } => {
            let request = CachePushRequest {
                registry,
                key,
                steps,
                ca_file,
                jobs,
                credentials: None,
                signature_tag,
            };
            // With --json the lines go to stderr: stdout is the JSON alone.
            let say = |line: &str| match json {
                true => eprintln!("{line}"),
                false => println!("{line}"),
            };
            let pushed = cache_push(ctx, &request, &say)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&pushed)?);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn ls(ctx: &Ctx, cache: &Cache, json: bool) -> Result<ExitCode> {
    let entries = cache
        .ls()
        .with_context(|| format!("listing {}", cache.root().display()))?;
    // The lock is optional here: without one, entries are listed without their names.
    let (artifacts, unnamed) = match locked_artifacts(ctx) {
        Ok(artifacts) => (artifacts, "(not in the lock)"),
        Err(_) => (Vec::new(), "(no lock read)"),
    };
    let names = names_by_digest(cache, &artifacts)?;
    if json {
        let rows: Vec<_> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "sha256": e.sha256, "filename": e.filename, "size": e.size,
                    "path": e.path, "locked_as": names.get(&e.sha256),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut total = 0;
    for e in &entries {
        total += e.size;
        let name = names.get(&e.sha256).map(String::as_str).unwrap_or(unnamed);
        println!(
            "{}  {:>10}  {}  {name}",
            &e.sha256[..12],
            human(e.size),
            e.filename
        );
    }
    println!(
        "{} files, {} in {}",
        entries.len(),
        human(total),
        cache.root().display()
    );
    Ok(ExitCode::SUCCESS)
}

/// sha256 -> the locked artifact names whose bytes it is.
fn names_by_digest(cache: &Cache, artifacts: &[Artifact]) -> Result<HashMap<String, String>> {
    let mut names: HashMap<String, String> = HashMap::new();
    for artifact in artifacts {
        for digest in cache.digests_in_use(std::slice::from_ref(artifact))? {
            names
                .entry(digest)
                .and_modify(|n| *n = format!("{n}, {}", artifact.name))
                .or_insert(artifact.name.clone());
        }
    }
    Ok(names)
}

fn verify(cache: &Cache, remove: bool) -> Result<ExitCode> {
    let (checked, corrupt) = cache
        .verify(remove)
        .with_context(|| format!("verifying {}", cache.root().display()))?;
    for bad in &corrupt {
        println!(
            "DAMAGED {}: expected sha256 {}, found {}{}",
            bad.entry.path.display(),
            bad.entry.sha256,
            bad.actual_sha256,
            if bad.removed { " (removed)" } else { "" }
        );
    }
    println!("{checked} files checked, {} damaged", corrupt.len());
    if corrupt.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    if !remove {
        println!(
            "run `cargo xtask cache verify --remove`, then `cargo xtask fetch` to download them again"
        );
    }
    Ok(ExitCode::FAILURE)
}

fn gc(ctx: &Ctx, cache: &Cache, dry_run: bool, all: bool) -> Result<ExitCode> {
    let keep: HashSet<String> = match all {
        true => HashSet::new(),
        false => {
            let artifacts = locked_artifacts(ctx)
                .context("gc keeps what the lock names (pass --all to delete everything)")?;
            cache.digests_in_use(&artifacts)?
        }
    };
    let report = cache
        .gc(&keep, dry_run)
        .with_context(|| format!("cleaning {}", cache.root().display()))?;
    let verb = if dry_run { "would delete" } else { "deleted" };
    for entry in &report.removed {
        println!("{verb} {}  {}", entry.filename, human(entry.size));
    }
    for partial in &report.partials {
        println!("{verb} {} (interrupted download)", partial.display());
    }
    println!(
        "{verb} {} files and {} partial downloads: {}",
        report.removed.len(),
        report.partials.len(),
        human(report.bytes_freed)
    );
    Ok(ExitCode::SUCCESS)
}

fn hash(path: &std::path::Path) -> Result<ExitCode> {
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let tree = commstack_fetch::tree::tree_sha256(path, &name)
        .with_context(|| format!("hashing {}", path.display()))?;
    if path.is_file() {
        use sha2::Digest;
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        println!("sha256 = \"{}\"", hex::encode(sha2::Sha256::digest(&bytes)));
    }
    println!("tree = \"{tree}\"");
    Ok(ExitCode::SUCCESS)
}
