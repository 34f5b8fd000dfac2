//! `cargo xtask push`: the image as an OCI layout into a registry, by digest
//! (crates/registry). Without a layout given, the graph runs until the image step (every
//! step reused when unchanged) and writes the layout, as `build image --no-load --oci`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use commstack_registry::{PushOptions, Pushed, Target};
use serde::Serialize;

use commstack_steps::ctx::Ctx;
use commstack_steps::graph::StepId;
use commstack_steps::options::{CacheOptions, GraphOptions};

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
    pub cache: CacheOptions,
    /// The build settings and fetch flags the graph takes, as `build`'s (`--mirror`,
    /// `--accept-tree-match`, `--offline`, `--cuda-archs`, ...).
    pub build: commstack_steps::options::BuildOptions,
    /// Sign the pushed manifest with this ed25519 key (PKCS#8 PEM).
    pub key: Option<PathBuf>,
    /// Where the registry has the referrers API, put the signature under cosign's tag too.
    pub signature_tag: bool,
}

/// What a push did, and its signature when it was signed.
#[derive(Clone, Debug, Serialize)]
pub struct PushReport {
    #[serde(flatten)]
    pub pushed: Pushed,
    /// Where the signature went: `host/repo@sha256:...` (a referrer) or
    /// `host/repo:sha256-<hex>.sig`.
    pub signature: Option<String>,
    /// `ed25519:<base64>` of the key that signed.
    pub signed_by: Option<String>,
    /// The image's verify report from this home, attached to the pushed manifest
    /// (`sha256-<hex>.verify`); None when this home has none for the image (then
    /// `verify_report_missing` says where it looked).
    pub verify_report: Option<commstack_registry::attach::Attached>,
    pub verify_report_missing: Option<String>,
    /// The image's SBOM and provenance as signed in-toto statements, attached with
    /// `--key` (`sha256-<hex>.att`, cosign's format); None unsigned, or when this home
    /// has not the image's step (then `attestations_missing` says why).
    pub attestations: Option<crate::attest::Attested>,
    pub attestations_missing: Option<String>,
}

/// The artifact type of the verify report attached to a pushed image.
pub const VERIFY_REPORT_ARTIFACT_TYPE: &str = "application/vnd.dev.commstack.verify-report.v1";
const VERIFY_REPORT_CONFIG_MEDIA_TYPE: &str =
    "application/vnd.dev.commstack.verify-report.config.v1+json";

/// The verify report files of image `id` in this home (`reports/image-<12 hex>/`), as
/// `build` wrote them: the static level's JSON (the verify step, on this machine), the GPU
/// levels' JSON and `import torch`'s output (the runtime step, in the loaded image).
fn verify_report_files(ctx: &Ctx, id: &str) -> (PathBuf, Vec<(String, PathBuf)>) {
    let hex = id.trim_start_matches("sha256:");
    let dir = ctx
        .home
        .join("reports")
        .join(format!("image-{}", &hex[..12.min(hex.len())]));
    let files = [
        ("verify-static.json", "application/json"),
        ("verify-gpus.json", "application/json"),
        ("import-torch.txt", "text/plain"),
    ]
    .into_iter()
    .map(|(name, media)| (media.to_string(), dir.join(name)))
    .filter(|(_, path)| path.is_file())
    .collect();
    (dir, files)
}

/// Attaches the image's verify report (when this home has one) to the manifest pushed
/// from the layout at `dir`: the provenance that travels with the image.
fn attach_verify_report(
    ctx: &Ctx,
    dir: &std::path::Path,
    pushed: &Pushed,
    key: Option<&commstack_registry::SigningKey>,
    options: &PushOptions,
) -> Result<(Option<commstack_registry::attach::Attached>, Option<String>)> {
    let (report_dir, files) = verify_report_files(ctx, &pushed.config_digest);
    if !files.iter().any(|(m, _)| m == "application/json") {
        return Ok((
            None,
            Some(format!(
                "no verify report of image {} in {} (`cargo xtask build` loads and verifies the image and writes it there)",
                pushed.config_digest,
                report_dir.display()
            )),
        ));
    }
    let config = serde_json::json!({
        "image": pushed.config_digest,
        "manifest": pushed.manifest_digest,
        "files": files.iter().map(|(_, p)| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect::<Vec<_>>(),
        "builder": commstack_steps::util::builder(),
    });
    let attached = commstack_registry::attach::push_attached(
        (
            &pushed.manifest_digest,
            commstack_registry::attach::manifest_size(dir)?,
        ),
        &commstack_registry::attach::Attachment {
            kind: "verify".into(),
            artifact_type: VERIFY_REPORT_ARTIFACT_TYPE.into(),
            config_media_type: VERIFY_REPORT_CONFIG_MEDIA_TYPE.into(),
            config: commstack_digest::canonical_json(&config).into_bytes(),
            files,
        },
        key,
        options,
    )?;
    Ok((Some(attached), None))
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
    options.tag_referrers = request.signature_tag;
    if let Some(tag) = &request.tag
        && !commstack_registry::valid_tag(tag)
    {
        bail!(
            "--tag {tag:?} is not a valid tag: up to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'"
        );
    }
    let send = |dir: &std::path::Path| -> Result<PushReport> {
        let (pushed, signature, signed_by) = match &key {
            None => (commstack_registry::push_layout(dir, &options)?, None, None),
            Some(key) => {
                let signed = commstack_registry::push_signed(dir, key, &options)?;
                (
                    signed.pushed,
                    Some(signed.signature),
                    Some(signed.signed_by),
                )
            }
        };
        let (verify_report, verify_report_missing) =
            attach_verify_report(ctx, dir, &pushed, key.as_ref(), &options)?;
        let (attestations, attestations_missing) = match &key {
            Some(key) => crate::attest::attach_attestations(ctx, dir, &pushed, key, &options)?,
            None => (None, None),
        };
        Ok(PushReport {
            pushed,
            signature,
            signed_by,
            verify_report,
            verify_report_missing,
            attestations,
            attestations_missing,
        })
    };
    match &request.oci {
        Some(_) if request.dry_run => {
            bail!("--dry-run plans the graph until the image: not with --oci (nothing to plan)")
        }
        Some(dir) => send(dir).map(Some),
        None if request.dry_run => {
            let graph = GraphOptions {
                until: Some(StepId::Image),
                locked: request.locked,
                dry_run: true,
                cache: request.cache.clone(),
                ..GraphOptions::default()
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
            let graph = GraphOptions {
                until: Some(StepId::Image),
                oci: Some(dir.clone()),
                locked: request.locked,
                cache: request.cache.clone(),
                ..GraphOptions::default()
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
