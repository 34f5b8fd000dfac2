//! `cargo xtask push`: the image as an OCI layout into a registry, by digest
//! (crates/registry). Without a layout given, the graph runs until the image step (every
//! step reused when unchanged) and writes the layout, as `build image --no-load --oci`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use commstack_registry::{PushOptions, Pushed, Target};
use serde::Serialize;

use crate::command::{CacheArgs, GraphArgs};
use crate::ctx::Ctx;
use crate::graph::StepId;

/// What to push where.
#[derive(Clone, Debug)]
pub struct PushRequest {
    /// `HOST[:PORT]/REPO`.
    pub registry: String,
    /// An OCI layout to push; None: the stack's image, its layout written for this push.
    pub oci: Option<PathBuf>,
    pub tag: Option<String>,
    /// Blobs uploaded at once.
    pub jobs: usize,
    /// Refuse to change stack.lock while making the image (`build --locked`).
    pub locked: bool,
    /// Print the plan of the graph until the image, push nothing (without `oci`).
    pub dry_run: bool,
    /// The binary cache the graph substitutes from; its `ca_file` is also the CA trusted
    /// for the registry pushed to.
    pub cache: CacheArgs,
    /// The build settings and fetch flags the graph takes, as `build`'s (`--mirror`,
    /// `--accept-tree-match`, `--offline`, `--cuda-archs`, ...).
    pub build: crate::flow::build::Args,
    /// Sign the pushed manifest with this ed25519 key (PKCS#8 PEM).
    pub key: Option<PathBuf>,
}

/// What a push did, and its signature when it was signed.
#[derive(Clone, Debug, Serialize)]
pub struct PushReport {
    #[serde(flatten)]
    pub pushed: Pushed,
    /// `host/repo:sha256-<hex>.sig`.
    pub signature: Option<String>,
    /// `ed25519:<base64>` of the key that signed.
    pub signed_by: Option<String>,
}

/// Pushes (and signs) and says what was sent; None for a dry run (the plan printed).
pub fn push(ctx: &Ctx, request: &PushRequest) -> Result<Option<PushReport>> {
    // A bad target or key fails before anything is built.
    let target = Target::parse(&request.registry)?;
    let key = match &request.key {
        Some(file) => Some(commstack_registry::sign::read_signing_key(file)?),
        None => None,
    };
    let mut options = PushOptions::new(target);
    options.tag = request.tag.clone();
    options.ca_file = request.cache.ca_file.clone();
    options.jobs = request.jobs.max(1);
    options.progress = !ctx.quiet;
    if let Some(tag) = &request.tag
        && !commstack_registry::valid_tag(tag)
    {
        bail!(
            "--tag {tag:?} is not a valid tag: up to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'"
        );
    }
    let send = |dir: &std::path::Path| -> Result<PushReport> {
        Ok(match &key {
            None => PushReport {
                pushed: commstack_registry::push_layout(dir, &options)?,
                signature: None,
                signed_by: None,
            },
            Some(key) => {
                let signed = commstack_registry::push_signed(dir, key, &options)?;
                PushReport {
                    pushed: signed.pushed,
                    signature: Some(signed.signature),
                    signed_by: Some(signed.signed_by),
                }
            }
        })
    };
    match &request.oci {
        Some(_) if request.dry_run => {
            bail!("--dry-run plans the graph until the image: not with --oci (nothing to plan)")
        }
        Some(dir) => send(dir).map(Some),
        None if request.dry_run => {
            let graph = GraphArgs {
                until: Some(StepId::Image),
                locked: request.locked,
                dry_run: true,
                cache: request.cache.clone(),
                ..GraphArgs::default()
            };
            crate::command::build(ctx, &graph, &request.build)?;
            Ok(None)
        }
        None => {
            // The layout is removed after the push: its gzip layers are made again
            // (deterministically) by the next push that needs them.
            let parent = ctx.home.join("push");
            std::fs::create_dir_all(&parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
            let temp = tempfile::Builder::new()
                .prefix("oci-")
                .tempdir_in(&parent)
                .with_context(|| format!("cannot create a directory in {}", parent.display()))?;
            let dir = temp.path().join("oci");
            let graph = GraphArgs {
                until: Some(StepId::Image),
                oci: Some(dir.clone()),
                locked: request.locked,
                cache: request.cache.clone(),
                ..GraphArgs::default()
            };
            let built = crate::command::build(ctx, &graph, &request.build)?;
            if built.exit != ExitCode::SUCCESS {
                bail!(
                    "the image could not be made (the failed step is above; summary: {}): nothing was pushed",
                    built.summary_file.display()
                );
            }
            send(&dir).map(Some)
        }
    }
}
