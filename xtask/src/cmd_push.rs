//! `cargo xtask push`: the image into an OCI registry by digest. Parse, then one call into
//! the pipeline crate (which makes the layout when none is given, and pushes through
//! crates/registry).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_pipeline::push::{PushRequest, push};
use commstack_steps::ctx::Ctx;
use commstack_steps::util::human;

use crate::args::{BuildArgs, CacheArgs};

#[derive(clap::Args)]
#[command(after_help = "\
Blobs go first, only those the registry lacks (HEAD), each checked against its sha256
before any is sent; then the manifest, by its digest, as the layout's bytes; then the tags:
lock-<the lock's sha256> (from the image's dev.commstack.lock.sha256 label) and a readable
one (--tag, else torch<v>-cuda<v>-nvshmem<v>-deepep<v> from the image's labels). The last
line printed is the reference deploys pull: HOST[:PORT]/REPO@sha256:<manifest digest>.

Credentials: $COMMSTACK_REGISTRY_USER and $COMMSTACK_REGISTRY_PASSWORD, else the auths
entry `docker login HOST` wrote into $DOCKER_CONFIG/config.json (or ~/.docker/config.json),
else none. HTTP basic and bearer-token registries both work with a user and password.
Connection failures, timeouts, 5xx and 429 are retried with backoff; a rerun skips the
blobs already uploaded (--upload-jobs at once). Without --oci the graph runs until the image
with build's flags (fetch: --mirror, --offline, --accept-tree-match; the binary cache:
--substitute, --allow-unsigned, --no-substitute; the build settings). With --key the manifest digest is signed in cosign's
format (a simple-signing payload, ed25519): as an OCI 1.1 referrer of the image where the
registry has the referrers API, else under cosign's tag sha256-<hex>.sig; `cosign verify
--key cosign.pub --insecure-ignore-tlog=true HOST/REPO@sha256:...` verifies it (add
--experimental-oci11 for a referrer), cosign.pub from `openssl pkey -in KEY.pem -pubout`.

The image's verify report travels with it: when this home has one for the image (what
`cargo xtask build`'s verify and runtime steps write under <home>/reports/image-<id>/),
it is pushed as an artifact whose subject is the image's manifest, tagged
sha256-<hex>.verify (signed too with --key), with the builder (commstack version and
commit, host) in its config; without one the push says so.

With --key the image's attestations go with it too, as `cosign attest` stores them
(sha256-<hex>.att, one DSSE envelope per layer): its SPDX SBOM and an SLSA v1 provenance
(the lock's sha256, every locked input with its digest, each step's store key and inputs,
the run's start and finish from summary.json, commstack's version and commit), in-toto
statements about the image's manifest digest, signed with the same key. Check them with
`cargo xtask verify attestations --image REF --key key.pub`, or with
`cosign verify-attestation --key key.pub --type spdxjson|slsaprovenance1
--insecure-ignore-tlog=true REF` (key.pub: `openssl pkey -in key.pem -pubout`). See
docs/registry.md.

Examples:
  cargo xtask push --registry registry.example.com/commstack/debian-12
  cargo xtask push --registry 127.0.0.1:5000/ci/image --oci out/oci --ca-file ca.pem --tag nightly
  cargo xtask push --registry HOST/REPO --mirror /srv/mirror --accept-tree-match --substitute HOST/cache")]
pub struct Args {
    /// Where to push: HOST[:PORT]/REPO (https; write http://HOST[:PORT]/REPO for a
    /// plain-HTTP registry on a trusted network).
    #[arg(long, value_name = "HOST[:PORT]/REPO")]
    pub registry: String,
    /// The OCI image layout to push (what `build image --oci DIR` wrote). Default: the
    /// stack's image; the graph runs until the image step (reusing every step whose inputs
    /// are unchanged) and writes its layout under <home>/push/ for this push.
    #[arg(long, value_name = "DIR")]
    pub oci: Option<PathBuf>,
    /// The readable tag, instead of the one made from the image's labels.
    #[arg(long, value_name = "NAME")]
    pub tag: Option<String>,
    /// Blobs uploaded at once.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub upload_jobs: usize,
    /// Refuse to change stack.lock while making the image (CI; see `build --help`).
    #[arg(long)]
    pub locked: bool,
    /// Sign the image's manifest digest with this ed25519 private key (PKCS#8 PEM, e.g.
    /// `openssl genpkey -algorithm ed25519 -out key.pem`) in cosign's format; the
    /// signature is pushed as a referrer of the image, or under the tag sha256-<hex>.sig
    /// where the registry has no referrers API; the image's SBOM and provenance are
    /// attested with it (a referrer, and sha256-<hex>.att).
    #[arg(long, value_name = "FILE", env = "COMMSTACK_SIGNING_KEY")]
    pub key: Option<PathBuf>,
    /// On a registry with the referrers API, put the signature under cosign's tag
    /// sha256-<hex>.sig as well as a referrer, for verifiers that read only the tag scheme
    /// (`cosign verify` without --experimental-oci11, the sigstore policy controller).
    #[arg(long, requires = "key")]
    pub signature_tag: bool,
    /// Print the result as JSON (reference, digests, tags, blobs sent and found).
    #[arg(long)]
    pub json: bool,
    /// Print the plan of the graph until the image (each step reused, substituted or
    /// run, and why) and push nothing. Not with --oci.
    #[arg(long, conflicts_with = "oci")]
    pub dry_run: bool,
    /// The binary cache the graph substitutes from, as `build`'s; --ca-file is also
    /// trusted for the registry pushed to.
    #[command(flatten)]
    pub cache: CacheArgs,
    /// The build settings and fetch flags, as `build`'s (--mirror, --accept-tree-match,
    /// --offline, --cuda-archs, --jobs for compiles, ...): they make the image when no
    /// --oci is given.
    #[command(flatten)]
    pub build: BuildArgs,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let pushed = push(
        ctx,
        &PushRequest {
            registry: args.registry,
            oci: args.oci,
            tag: args.tag,
            jobs: args.upload_jobs,
            locked: args.locked,
            key: args.key,
            signature_tag: args.signature_tag,
            dry_run: args.dry_run,
            cache: args.cache.into(),
            build: args.build.into(),
        },
    )?;
    let Some(pushed) = pushed else {
        return Ok(ExitCode::SUCCESS);
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&pushed)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let (Some(signature), Some(key)) = (&pushed.signature, &pushed.signed_by) {
        println!("signed by {key}: {signature}");
    }
    match (&pushed.verify_report, &pushed.verify_report_missing) {
        (Some(report), _) => println!(
            "verify report attached: {}{}",
            report.reference,
            report
                .signature
                .as_deref()
                .map(|s| format!(" (signed: {s})"))
                .unwrap_or_default()
        ),
        (None, Some(why)) => eprintln!("no verify report attached: {why}"),
        (None, None) => {}
    }
    match (&pushed.attestations, &pushed.attestations_missing) {
        (Some(a), _) => println!(
            "attestations attached (signed in-toto statements, cosign's format): {} ({})",
            a.reference,
            a.predicate_types.join(", ")
        ),
        (None, Some(why)) => eprintln!("no attestations attached: {why}"),
        (None, None) => {}
    }
    let pushed = &pushed.pushed;
    println!(
        "blobs: {} uploaded ({}), {} already in the registry",
        pushed.uploaded.len(),
        human(pushed.bytes_uploaded),
        pushed.present.len()
    );
    println!("image ID (config): {}", pushed.config_digest);
    println!("tags: {}", pushed.tags.join(", "));
    println!("{}", pushed.reference);
    Ok(ExitCode::SUCCESS)
}
