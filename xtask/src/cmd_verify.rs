//! `cargo xtask verify`: prove a Python environment holds the stack, level by level, and
//! file the report beside the artifacts; or, as `verify attestations`, check a pushed
//! image's attestations against the lock. The environment's command line is the verify
//! crate's (`commstack_verify::cli`), shared with the `commstack-verify` binary images
//! carry; the attestations' check is the pipeline crate's.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_pipeline::attest::{VerifyAttestationsRequest, verify_attestations};

use commstack_steps::ctx::Ctx;

/// `verify --python PY ...` or `verify attestations ...`. Written out rather than derived:
/// clap's derive reads a flattened `Option<Args>` as absent when that struct flattens
/// another (verify's does), so the environment's flags would never be seen.
pub struct VerifyArgs {
    command: Option<Command>,
    environment: Option<commstack_verify::cli::Args>,
}

impl clap::FromArgMatches for VerifyArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut matches.clone())
    }

    fn from_arg_matches_mut(matches: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(match matches.subcommand_name() {
            Some(_) => VerifyArgs {
                command: Some(Command::from_arg_matches_mut(matches)?),
                environment: None,
            },
            None => VerifyArgs {
                command: None,
                environment: Some(commstack_verify::cli::Args::from_arg_matches_mut(matches)?),
            },
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for VerifyArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::Subcommand as _;
        let cmd = <commstack_verify::cli::Args as clap::Args>::augment_args(cmd);
        Command::augment_subcommands(cmd)
            .args_conflicts_with_subcommands(true)
            .subcommand_negates_reqs(true)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[derive(clap::Subcommand)]
enum Command {
    /// Check a pushed image's attestations (its SBOM and SLSA provenance, attached by
    /// `push --key`) against this stack's lock.
    Attestations(AttestationsArgs),
}

#[derive(clap::Args)]
#[command(after_help = "\
The attestations are fetched by the image's digest (the sha256-<hex>.att artifact `push --key`
attaches, cosign's format). Each DSSE envelope must verify under a trusted key, its in-toto
statement be about this manifest digest, the provenance name this stack.lock's sha256 and
exactly its locked inputs (URL and digests), and the SBOM list every locked wheel installed
and every locked .deb with its sha256. Every check is printed; a failed one names what
disagrees. Exit status: 0 every check passed, 1 one failed (or none could be made).

The same attestations verify with cosign:
  cosign verify-attestation --key key.pub --type spdxjson --insecure-ignore-tlog=true IMAGE
  cosign verify-attestation --key key.pub --type slsaprovenance1 --insecure-ignore-tlog=true IMAGE

Example:
  cargo xtask verify attestations --image registry.example.com/commstack/debian-12@sha256:9ab2... --key key.pub")]
struct AttestationsArgs {
    /// The image, by digest: HOST[:PORT]/REPO@sha256:<hex> (what `cargo xtask push` prints).
    #[arg(long, value_name = "HOST[:PORT]/REPO@sha256:HEX")]
    image: String,
    /// A public key to trust (repeatable): PEM SubjectPublicKeyInfo, as cosign takes it
    /// (`openssl pkey -in key.pem -pubout -out key.pub`), or a file holding
    /// ed25519:<base64>. Default: stack.toml's [cache] trusted-keys.
    #[arg(long = "key", value_name = "FILE")]
    keys: Vec<PathBuf>,
    /// PEM CA certificates to trust for the registry besides the system's.
    #[arg(long, value_name = "FILE", env = "COMMSTACK_REGISTRY_CA")]
    ca_file: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(ctx: &Ctx, args: VerifyArgs) -> Result<ExitCode> {
    match (args.command, args.environment) {
        (Some(Command::Attestations(a)), _) => attestations(ctx, a),
        (None, Some(environment)) => {
            commstack_verify::cli::run(environment, ctx.home.join("reports"), ctx.quiet)
        }
        (None, None) => anyhow::bail!(
            "verify what? `cargo xtask verify --python PY` (an environment) or `cargo xtask verify attestations --image HOST/REPO@sha256:...` (a pushed image)"
        ),
    }
}

fn attestations(ctx: &Ctx, args: AttestationsArgs) -> Result<ExitCode> {
    let report = verify_attestations(
        ctx,
        &VerifyAttestationsRequest {
            image: args.image,
            keys: args.keys,
            ca_file: args.ca_file,
        },
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{} against {} (sha256 {})",
            report.image, report.lock, report.lock_sha256
        );
        for c in &report.checks {
            let mark = if c.ok { "ok  " } else { "FAIL" };
            println!("{mark} {} {}: {}", c.attestation, c.check, c.detail);
        }
        let failed = report.checks.iter().filter(|c| !c.ok).count();
        match failed {
            0 => println!(
                "attestations verified: {} checks passed",
                report.checks.len()
            ),
            n => println!(
                "attestations refused: {n} of {} checks failed",
                report.checks.len()
            ),
        }
    }
    Ok(match report.ok {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}
