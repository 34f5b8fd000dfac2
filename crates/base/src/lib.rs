//! commstack-base: the image's base root filesystem as a store step, made by mmdebstrap
//! from the lock's cached .debs only, offline.
//!
//! Step layout (`<store>/steps/base-<hash>/`):
//! ```text
//! rootfs.tar            the base layer: sorted, GNU headers, mtimes clamped to the epoch,
//!                       the packages' own numeric owners and modes, no device nodes
//! base.json             [`BaseManifest`]: packages, python, layer diff_id, every file's origin
//! logs/mmdebstrap.log   the environment, the command line and mmdebstrap's output
//! ```
//!
//! The flow: re-hash every .deb against the lock; write a flat apt repository of them in
//! the step's temp directory; run mmdebstrap on it (in a new network namespace where
//! possible) with SOURCE_DATE_EPOCH and an empty environment; check that dpkg installed
//! exactly the locked packages; claim every file for a package or a generated-file rule
//! ([`rules`]); write the normalised tar and base.json. The key holds the recipe, the
//! `[base]` lock, every deb's name/version/architecture/sha256, mmdebstrap's version and
//! the rules' version; the same key again is a no-op.

pub mod installed;
pub mod manifest;
pub mod mmdebstrap;
pub mod normalise;
pub mod provenance;
pub mod rawtar;
mod repo;
pub mod rules;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_stack::lock::{BaseLock, Deb};
use commstack_store::{Outcome, StepKey, Store};

pub use manifest::{BaseManifest, LayerInfo, MANIFEST_FILE, Package, ROOTFS_FILE};

pub const STEP: &str = "base";
pub const LOG_FILE: &str = "mmdebstrap.log";
/// Bumped when the recipe (command line, hooks, normalisation) changes what it produces.
pub const RECIPE: &str = "base-mmdebstrap-1";

/// What the base is made of: the `[base]` lock and each locked deb with its cached file.
pub struct BaseInputs<'a> {
    pub base: &'a BaseLock,
    pub debs: Vec<(&'a Deb, PathBuf)>,
}

/// The result of [`build_base`].
#[derive(Debug)]
pub struct BaseOutput {
    /// The step directory (rootfs.tar, base.json, logs/).
    pub dir: PathBuf,
    pub outcome: Outcome,
    pub manifest: BaseManifest,
}

impl BaseOutput {
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join(ROOTFS_FILE)
    }
}

/// The step's key and its inputs (without running anything but `mmdebstrap --version`).
pub fn base_key(inputs: &BaseInputs<'_>, mmdebstrap_version: &str) -> (StepKey, serde_json::Value) {
    let mut debs: Vec<serde_json::Value> = inputs
        .debs
        .iter()
        .map(|(d, _)| {
            serde_json::json!({
                "name": d.name, "version": d.version,
                "architecture": d.architecture, "sha256": d.sha256,
            })
        })
        .collect();
    debs.sort_by_key(|v| (v["name"].to_string(), v["architecture"].to_string()));
    let json = serde_json::json!({
        "recipe": RECIPE,
        "base": inputs.base,
        "debs": debs,
        "mmdebstrap": mmdebstrap_version,
        "rules_version": rules::RULES_VERSION,
    });
    (StepKey::new(STEP, &json), json)
}

/// Re-hash every given .deb and compare with the lock, before anything is built.
pub fn check_debs(debs: &[(&Deb, PathBuf)]) -> Result<()> {
    for (deb, path) in debs {
        if !path.is_file() {
            bail!(
                "deb {} {} ({}): its cached file {} is missing: run `cargo xtask fetch --only debs`",
                deb.name,
                deb.version,
                deb.architecture,
                path.display()
            );
        }
        let actual = commstack_digest::sha256_file(path)
            .with_context(|| format!("cannot hash deb {} at {}", deb.name, path.display()))?;
        if !actual.eq_ignore_ascii_case(&deb.sha256) {
            bail!(
                "deb {} {} ({}): {} has sha256 {actual}, the lock says {}: the cached file is \
                 damaged or not the locked one; run `cargo xtask fetch --verify` (it moves a \
                 damaged file to quarantine and downloads it again)",
                deb.name,
                deb.version,
                deb.architecture,
                path.display(),
                deb.sha256
            );
        }
    }
    Ok(())
}

/// Build (or find) the base; `force` builds it again even when it is in the store. `log`
/// gets one line per phase.
pub fn build_base(
    store: &Store,
    inputs: &BaseInputs<'_>,
    force: bool,
    mut log: impl FnMut(&str),
) -> Result<BaseOutput> {
    if inputs.debs.is_empty() {
        bail!("the lock has no [[deb]] entries: relock with `cargo xtask lock --force`");
    }
    commstack_stack::lock::check_epoch_past(inputs.base.epoch)
        .map_err(|e| anyhow::anyhow!("the lock's [base] {e}"))?;
    let tool = mmdebstrap::find()?;
    log(&format!(
        "checking {} .deb files against the lock ...",
        inputs.debs.len()
    ));
    check_debs(&inputs.debs)?;
    let (key, json) = base_key(inputs, &tool.version);
    let result = store.run(&key, &json, force, |dir| {
        make_base(&dir.out, &dir.logs, &key, inputs, &tool, &mut log)
    });
    let outcome = match result {
        Ok(o) => o,
        Err(err) => {
            // The step's directory moved to failed/: name the log where it is now.
            let log_path = store.failed_path(&key).join("logs").join(LOG_FILE);
            return Err(if log_path.is_file() {
                err.context(format!("mmdebstrap's log: {}", log_path.display()))
            } else {
                err
            });
        }
    };
    let dir = outcome.path().to_path_buf();
    let manifest = BaseManifest::open(&dir)?;
    Ok(BaseOutput {
        dir,
        outcome,
        manifest,
    })
}

fn make_base(
    out: &Path,
    logs: &Path,
    key: &StepKey,
    inputs: &BaseInputs<'_>,
    tool: &mmdebstrap::Mmdebstrap,
    log: &mut impl FnMut(&str),
) -> Result<()> {
    let base = inputs.base;
    let work = out.join("work");
    let (repo_dir, home, tmp) = (work.join("repo"), work.join("home"), work.join("tmp"));
    for d in [&home, &tmp] {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    log("writing the local apt repository ...");
    let source = repo::write_repo(&repo_dir, base, &inputs.debs)?;
    let raw_tar = work.join("rootfs-raw.tar");
    let cut_network = mmdebstrap::can_cut_network();
    log(&format!(
        "running mmdebstrap {} ({} variant, {} packages{}) ...",
        tool.version,
        base.variant,
        inputs.debs.len(),
        if cut_network { ", no network" } else { "" }
    ));
    let sources_list = format!(
        "deb {} {} {}",
        base.mirror,
        base.suite,
        base.components.join(" ")
    );
    mmdebstrap::run(&mmdebstrap::Run {
        tool,
        variant: &base.variant,
        include: &base.include,
        architecture: &base.architecture,
        suite: &base.suite,
        source: &source,
        sources_list: &sources_list,
        epoch: base.epoch,
        out_tar: &raw_tar,
        home: &home,
        tmp: &tmp,
        cut_network,
        log: &logs.join(LOG_FILE),
    })?;
    // The repository is no longer needed; the raw tar stays until the end (a failed
    // step keeps it beside the log for a look).
    fs::remove_dir_all(&repo_dir).ok();

    log("reading the root filesystem ...");
    let raw = rawtar::read_raw(&raw_tar)?;
    let status = raw
        .status
        .as_deref()
        .context("mmdebstrap's tar has no var/lib/dpkg/status")?;
    let installed = installed::parse_status(status);
    let locked: BTreeMap<(String, String), String> = inputs
        .debs
        .iter()
        .map(|(d, _)| ((d.name.clone(), d.architecture.clone()), d.version.clone()))
        .collect();
    installed::compare(&installed, &locked)?;
    let python = installed::python_version(&installed)?;
    let provenance = provenance::claim(&raw.entries, &raw.lists)?;

    log("writing rootfs.tar ...");
    let written =
        normalise::write_rootfs(&raw_tar, &raw.entries, &out.join(ROOTFS_FILE), base.epoch)?;
    let mut packages: Vec<Package> = inputs
        .debs
        .iter()
        .map(|(d, _)| Package {
            name: d.name.clone(),
            version: d.version.clone(),
            architecture: d.architecture.clone(),
            sha256: d.sha256.clone(),
        })
        .collect();
    packages.sort_by(|a, b| (&a.name, &a.architecture).cmp(&(&b.name, &b.architecture)));
    let manifest = BaseManifest {
        schema: 1,
        key: key.hash.clone(),
        epoch: base.epoch,
        suite: base.suite.clone(),
        architecture: base.architecture.clone(),
        python,
        mmdebstrap: tool.version.clone(),
        network_isolation: if cut_network { "unshare --net" } else { "none" }.to_string(),
        layer: LayerInfo {
            diff_id: written.diff_id,
            size: written.size,
        },
        packages,
        files: provenance.files,
        generated_rules: provenance.rule_counts,
    };
    manifest.write(out)?;
    fs::remove_dir_all(&work).with_context(|| format!("cannot remove {}", work.display()))?;
    Ok(())
}
