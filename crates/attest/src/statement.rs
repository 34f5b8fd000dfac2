//! The in-toto Statement v1 (https://in-toto.io/Statement/v1) and the SLSA provenance v1
//! predicate (https://slsa.dev/provenance/v1), as serde types of the fields commstack
//! writes and reads. Written here: the maintained crates either model older versions
//! (in-toto 0.4: Statement v0.1, SLSA v0.1/v0.2, with ring and chrono) or keep their types
//! private (sigstore 0.15's `InTotoStatementV1` is `pub(crate)`); these are ~60 lines.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `_type` of an in-toto Statement v1.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The predicate type of an SPDX document (what `cosign attest --type spdxjson` writes).
pub const SPDX_PREDICATE: &str = "https://spdx.dev/Document";
/// The predicate type of SLSA provenance v1 (`cosign ... --type slsaprovenance1`).
pub const SLSA_PREDICATE: &str = "https://slsa.dev/provenance/v1";

/// An in-toto Statement v1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Value,
}

/// What a statement is about: a name and its digests (`sha256` -> hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

/// SLSA provenance v1's predicate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    pub build_definition: BuildDefinition,
    pub run_details: RunDetails,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildDefinition {
    pub build_type: String,
    pub external_parameters: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub internal_parameters: Value,
    #[serde(default)]
    pub resolved_dependencies: Vec<ResourceDescriptor>,
}

/// in-toto's ResourceDescriptor (the fields used here).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDescriptor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub digest: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub annotations: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunDetails {
    pub builder: Builder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BuildMetadata>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub byproducts: Vec<ResourceDescriptor>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Builder {
    pub id: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub version: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_on: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_on: Option<String>,
}

impl Statement {
    /// A statement about the manifest `digest` (`sha256:<hex>`) of `name` (`HOST/REPO`).
    pub fn about(name: &str, digest: &str, predicate_type: &str, predicate: Value) -> Statement {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        Statement {
            type_: STATEMENT_TYPE.to_string(),
            subject: vec![Subject {
                name: name.to_string(),
                digest: [("sha256".to_string(), hex.to_string())].into(),
            }],
            predicate_type: predicate_type.to_string(),
            predicate,
        }
    }

    /// The statement's JSON: canonical (sorted keys, no whitespace), so the same statement
    /// is the same bytes, and so the same signature, on any machine.
    pub fn to_bytes(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("a statement is JSON");
        commstack_digest::canonical_json(&value).into_bytes()
    }
}
