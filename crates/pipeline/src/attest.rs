//! The image's attestations (crates/attest) on the registry's side: made and attached
//! by `push --key` (cosign's `sha256-<hex>.att`), fetched and checked against the lock by
//! `verify attestations`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_attest::{BuildRecord, Check, Expected, Fetched, check_all};
use commstack_registry::attestations::{Attestation, fetch_attestations, push_attestations};
use commstack_registry::referrer::FoundThrough;
use commstack_registry::{PushOptions, Pushed, SigningKey, Target, VerifyingKey};
use serde::Serialize;

use commstack_steps::ctx::Ctx;

/// The attestations a push attached.
#[derive(Clone, Debug, Serialize)]
pub struct Attested {
    /// `host/repo:sha256-<hex>.att`.
    pub reference: String,
    pub predicate_types: Vec<String>,
}

/// The image step of this home's store whose image ID is `id` (the pushed config's
/// digest), if there is one.
fn image_step(ctx: &Ctx, id: &str) -> Option<PathBuf> {
    let steps = ctx.store_dir().join("steps");
    let layer = format!("{}-", commstack_image::assemble::LAYER_STEP);
    std::fs::read_dir(&steps)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&format!("{}-", commstack_image::assemble::IMAGE_STEP))
                    && !n.starts_with(&layer)
            })
        })
        .find(|p| commstack_image::Image::open(p).is_ok_and(|i| i.id() == id))
}

/// Makes the SBOM and provenance statements of the pushed image, signs each with `key`
/// and attaches them to its manifest. Without the image's step in this home's store
/// (a layout built elsewhere), nothing is attached and the second value says why.
pub fn attach_attestations(
    ctx: &Ctx,
    layout: &Path,
    pushed: &Pushed,
    key: &SigningKey,
    options: &PushOptions,
) -> Result<(Option<Attested>, Option<String>)> {
    let Some(dir) = image_step(ctx, &pushed.config_digest) else {
        return Ok((
            None,
            Some(format!(
                "no image step of image {} in {} (the attestations are made from what `cargo xtask build` recorded of the image: push from the home that built it)",
                pushed.config_digest,
                ctx.store_dir().display()
            )),
        ));
    };
    let summary = crate::command::stack_dir(ctx)?.join("summary.json");
    let record = BuildRecord::read(
        &ctx.stack_path,
        &ctx.lock_path(),
        commstack_image::Image::open(&dir)?,
        &summary,
        &ctx.store_dir(),
    )
    .with_context(|| {
        format!(
            "reading what the build recorded of image {}",
            pushed.config_digest
        )
    })?;
    if record.lock_sha256 != record.image.manifest.lock_sha256 {
        return Ok((
            None,
            Some(format!(
                "image {} was made from the lock with sha256 {}, and {} is now {}: the provenance would name another lock (run `cargo xtask push` without --oci to build and push this lock's image)",
                pushed.config_digest,
                record.image.manifest.lock_sha256,
                ctx.lock_path().display(),
                record.lock_sha256
            )),
        ));
    }
    let name = options.target.name();
    let digest = &pushed.manifest_digest;
    let statements = [
        commstack_attest::sbom_statement(&record, &name, digest)?,
        commstack_attest::provenance_statement(&record, &name, digest)?,
    ];
    let attestations: Vec<Attestation> = statements
        .iter()
        .map(|s| Attestation {
            predicate_type: s.predicate_type.clone(),
            envelope: commstack_attest::envelope_bytes(s, key),
        })
        .collect();
    let size = commstack_registry::attach::manifest_size(layout)?;
    let mut options = options.clone();
    options.progress = false;
    let sent = push_attestations((digest, size), &attestations, &options)?;
    Ok((
        Some(Attested {
            reference: match sent.through {
                // Tagged as well: `cosign verify-attestation` reads the tag without a flag.
                FoundThrough::Referrers => format!(
                    "{} (a referrer of the image) and {name}:{}",
                    sent.reference,
                    commstack_registry::target::attachment_tag(digest, "att")?
                ),
                FoundThrough::Tag => sent.reference,
            },
            predicate_types: attestations.into_iter().map(|a| a.predicate_type).collect(),
        }),
        None,
    ))
}

/// What `verify attestations` checks.
#[derive(Clone, Debug)]
pub struct VerifyAttestationsRequest {
    /// `HOST[:PORT]/REPO@sha256:<hex>`.
    pub image: String,
    /// Public keys to trust (PEM or `ed25519:<base64>` files); none: stack.toml's
    /// `[cache] trusted-keys`.
    pub keys: Vec<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// The verdict: every check, passed or not.
#[derive(Clone, Debug, Serialize)]
pub struct AttestationsReport {
    pub image: String,
    pub lock: String,
    pub lock_sha256: String,
    pub trusted: Vec<String>,
    pub checks: Vec<Check>,
    pub ok: bool,
}

/// `HOST/REPO@sha256:<hex>` split into the target and the digest; a tag is refused.
fn parse_reference(image: &str) -> Result<(Target, String)> {
    let Some((repo, digest)) = image.split_once('@') else {
        bail!(
            "--image {image:?}: give the image by digest, HOST[:PORT]/REPO@sha256:<hex> (what `cargo xtask push` prints last); a tag can move"
        );
    };
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--image {image:?}: {digest:?} is not sha256:<64 hex digits>");
    }
    Ok((Target::parse(repo)?, digest.to_string()))
}

fn trusted_keys(ctx: &Ctx, files: &[PathBuf]) -> Result<Vec<VerifyingKey>> {
    if !files.is_empty() {
        return files
            .iter()
            .map(|f| commstack_attest::read_public_key(f))
            .collect();
    }
    let stack = commstack_steps::util::read_stack(&ctx.stack_path)?;
    let keys = &stack.cache.trusted_keys;
    if keys.is_empty() {
        bail!(
            "no key to trust: give the signer's public key with --key FILE (`openssl pkey -in key.pem -pubout -out key.pub`), or list it in {}'s [cache] trusted-keys",
            ctx.stack_path.display()
        );
    }
    // `ed25519:<base64>`, or the path of a PEM public key file relative to the stack file.
    let beside = ctx.stack_path.parent().unwrap_or(Path::new("."));
    keys.iter()
        .map(|k| match k.starts_with("ed25519:") {
            true => commstack_attest::parse_public_key(k),
            false => commstack_attest::read_public_key(&beside.join(k)),
        })
        .collect::<Result<_>>()
        .with_context(|| format!("{}: [cache] trusted-keys", ctx.stack_path.display()))
}

/// Fetches the attestations of `request.image` and checks them against this stack's lock.
pub fn verify_attestations(
    ctx: &Ctx,
    request: &VerifyAttestationsRequest,
) -> Result<AttestationsReport> {
    let (target, digest) = parse_reference(&request.image)?;
    let trusted = trusted_keys(ctx, &request.keys)?;
    let lock_path = ctx.lock_path();
    let text = std::fs::read_to_string(&lock_path).with_context(|| {
        format!("cannot read {} (the lock the image is checked against; make it with `cargo xtask lock`)", lock_path.display())
    })?;
    let lock =
        commstack_stack::Lock::parse(&lock_path, &text).map_err(|d| anyhow::anyhow!("{d}"))?;
    let lock_sha256 = commstack_digest::sha256_hex(text.as_bytes());
    let mut options = PushOptions::new(target);
    options.ca_file = request.ca_file.clone();
    options.progress = false;
    let Some(fetched) = fetch_attestations(&options, &digest)? else {
        bail!(
            "{}: no attestations are attached (none among its referrers, no {}:{}): push the image with `cargo xtask push --registry {} --key KEY.pem`",
            request.image,
            options.target.name(),
            commstack_registry::target::attachment_tag(&digest, "att")?,
            options.target.name()
        );
    };
    let fetched: Vec<Fetched> = fetched
        .into_iter()
        .map(|f| Fetched {
            predicate_type: f.predicate_type,
            layer: f.layer,
            envelope: f.envelope,
        })
        .collect();
    let checks = check_all(
        &fetched,
        &Expected {
            digest: &digest,
            lock: &lock,
            lock_sha256: &lock_sha256,
            trusted: &trusted,
        },
    );
    Ok(AttestationsReport {
        image: request.image.clone(),
        lock: lock_path.display().to_string(),
        lock_sha256,
        trusted: trusted
            .iter()
            .map(commstack_attest::dsse::key_text)
            .collect(),
        ok: checks.iter().all(|c| c.ok),
        checks,
    })
}
