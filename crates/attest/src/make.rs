//! The two statements about a pushed image: its SPDX SBOM as written by the image step,
//! and its SLSA v1 provenance from the build's record ([`crate::record`]).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use commstack_stack::lock::{ArtifactRef, Role};
use serde_json::{Value, json};

use crate::record::BuildRecord;
use crate::statement::{
    BuildDefinition, BuildMetadata, Builder, Provenance, ResourceDescriptor, RunDetails,
    SLSA_PREDICATE, SPDX_PREDICATE, Statement,
};

/// The provenance's buildType: a commstack image from a lock (docs/registry.md,
/// "Attestations", says what its parameters mean).
pub const BUILD_TYPE: &str = "https://commstack.invalid/build-types/image/v1";
/// The builder's id; its version map names commstack's version and commit.
pub const BUILDER_ID: &str = "https://commstack.invalid/builder/cargo-xtask";
/// The label of the commit the image was built from.
const REVISION_LABEL: &str = "org.opencontainers.image.revision";

/// The SBOM statement: the image step's `sbom.spdx.json` as the predicate, about the
/// manifest `digest` of `name` (`HOST/REPO`).
pub fn sbom_statement(record: &BuildRecord, name: &str, digest: &str) -> Result<Statement> {
    let path = record.image.dir.join("sbom.spdx.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the image's SBOM {}", path.display()))?;
    let sbom: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(Statement::about(name, digest, SPDX_PREDICATE, sbom))
}

/// The SLSA v1 provenance statement about the manifest `digest` of `name`.
pub fn provenance_statement(record: &BuildRecord, name: &str, digest: &str) -> Result<Statement> {
    let labels = labels(record)?;
    let revision = labels.get(REVISION_LABEL).cloned().unwrap_or_default();
    let steps: Vec<Value> = record
        .steps
        .iter()
        .map(|s| json!({"step": s.step, "outcome": s.outcome, "key": s.key, "inputs": s.inputs}))
        .collect();
    let manifest = &record.image.manifest;
    let provenance = Provenance {
        build_definition: BuildDefinition {
            build_type: BUILD_TYPE.into(),
            external_parameters: json!({
                "stack": {"file": record.stack_file, "sha256": record.stack_sha256},
                "lock": {"file": record.lock_file, "sha256": record.lock_sha256},
            }),
            internal_parameters: json!({
                "image": {
                    "id": manifest.id,
                    "tag": manifest.tag,
                    "layers": manifest.layers.iter().map(|l| json!({"holds": l.holds, "diffId": l.diff_id})).collect::<Vec<_>>(),
                },
                "steps": steps,
            }),
            resolved_dependencies: record.lock.artifacts().iter().map(dependency).collect(),
        },
        run_details: RunDetails {
            builder: Builder {
                id: BUILDER_ID.into(),
                version: [
                    (
                        "commstack".to_string(),
                        env!("CARGO_PKG_VERSION").to_string(),
                    ),
                    ("commit".to_string(), revision),
                ]
                .into(),
            },
            metadata: record.run.as_ref().map(|r| BuildMetadata {
                invocation_id: None,
                started_on: Some(r.started.clone()),
                finished_on: Some(r.finished.clone()),
            }),
            byproducts: byproducts(record)?,
        },
    };
    let predicate = serde_json::to_value(&provenance)?;
    Ok(Statement::about(name, digest, SLSA_PREDICATE, predicate))
}

/// One locked input as a resolved dependency: its file name and URL, its digests (the
/// file's sha256; a git source's commit and commstack's tree hash of the unpacked tree),
/// and what it is.
pub fn dependency(a: &ArtifactRef) -> ResourceDescriptor {
    let mut digest = BTreeMap::new();
    if let Some(sha) = &a.sha256 {
        digest.insert("sha256".to_string(), sha.clone());
    }
    if let Some(tree) = &a.tree {
        let hex = tree.strip_prefix("sha256:").unwrap_or(tree);
        digest.insert(TREE_DIGEST.to_string(), hex.to_string());
    }
    let role = match a.role {
        Role::Package => "package",
        Role::Replaced => "replaced",
        Role::Toolchain => "toolchain",
        Role::Source => "source",
        Role::Deb => "deb",
    };
    ResourceDescriptor {
        name: Some(a.filename.clone()),
        uri: Some(a.url.clone()),
        digest,
        annotations: json!({"role": role, "package": a.name, "version": a.version}),
    }
}

/// The digest key of commstack's tree hash of an unpacked source (docs/sources.md).
pub const TREE_DIGEST: &str = "commstackTreeSha256";

/// The image config's labels.
fn labels(record: &BuildRecord) -> Result<BTreeMap<String, String>> {
    let config: Value = serde_json::from_str(&record.image.config()?)
        .with_context(|| format!("{}/config.json is not JSON", record.image.dir.display()))?;
    Ok(config["config"]["Labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default())
}

/// What the build made besides the image's layers: its config, the SBOM and every
/// file's provenance, each by digest.
fn byproducts(record: &BuildRecord) -> Result<Vec<ResourceDescriptor>> {
    let dir = &record.image.dir;
    let mut out = vec![ResourceDescriptor {
        name: Some("config.json".into()),
        digest: [(
            "sha256".to_string(),
            record.image.id().trim_start_matches("sha256:").to_string(),
        )]
        .into(),
        ..Default::default()
    }];
    for file in ["sbom.spdx.json", "provenance.json"] {
        let path = dir.join(file);
        let sha = commstack_digest::sha256_file(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        out.push(ResourceDescriptor {
            name: Some(file.into()),
            digest: [("sha256".to_string(), sha)].into(),
            ..Default::default()
        });
    }
    Ok(out)
}
