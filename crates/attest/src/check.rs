//! An image's attestations checked against a lock: each envelope's signature under the
//! trusted keys, its statement's subject (the image's manifest digest), and what each
//! predicate says: the provenance names this lock's sha256 and exactly its locked inputs,
//! the SBOM lists the locked packages. Every check is reported, passed or failed, named.

use std::collections::BTreeMap;

use commstack_stack::Lock;
use ed25519_dalek::VerifyingKey;
use serde::Serialize;
use serde_json::Value;

use crate::dsse::{Envelope, key_text};
use crate::make::{BUILD_TYPE, dependency};
use crate::statement::{
    PAYLOAD_TYPE, Provenance, ResourceDescriptor, SLSA_PREDICATE, SPDX_PREDICATE, STATEMENT_TYPE,
    Statement,
};

/// What the attestations must agree with.
pub struct Expected<'a> {
    /// `sha256:<hex>` of the image's manifest.
    pub digest: &'a str,
    pub lock: &'a Lock,
    pub lock_sha256: &'a str,
    pub trusted: &'a [VerifyingKey],
}

/// One attestation as fetched: the layer's `predicateType` annotation, its digest (to
/// name it), and the envelope's bytes.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub predicate_type: String,
    pub layer: String,
    pub envelope: Vec<u8>,
}

/// One check's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The predicate type of the attestation it is about.
    pub attestation: String,
    /// signature, statement, subject, lock, inputs, packages, present.
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

/// Checks every fetched attestation, and that both an SBOM and a provenance are there.
pub fn check_all(fetched: &[Fetched], expected: &Expected) -> Vec<Check> {
    let mut out = Vec::new();
    for wanted in [SPDX_PREDICATE, SLSA_PREDICATE] {
        let n = fetched
            .iter()
            .filter(|f| f.predicate_type == wanted)
            .count();
        out.push(Check {
            attestation: wanted.into(),
            check: "present".into(),
            ok: n > 0,
            detail: match n {
                0 => "no attestation of this predicate type is attached to the image".into(),
                n => format!("{n} attached"),
            },
        });
    }
    for f in fetched {
        out.extend(check_one(f, expected));
    }
    out
}

fn verdict(f: &Fetched, check: &str, result: Result<String, String>) -> Check {
    let (ok, detail) = match result {
        Ok(d) => (true, d),
        Err(d) => (false, d),
    };
    Check {
        // The annotation is the registry's word: shown escaped and cut.
        attestation: commstack_digest::terminal_safe_capped(&f.predicate_type, 80),
        check: check.into(),
        ok,
        detail: format!(
            "{} (layer {})",
            detail,
            f.layer.get(..19).unwrap_or(&f.layer)
        ),
    }
}

/// The checks of one attestation; a failed signature or statement ends its checks (an
/// unsigned predicate is not read).
pub fn check_one(f: &Fetched, expected: &Expected) -> Vec<Check> {
    let opened = open(f, expected.trusted);
    let mut out = vec![verdict(
        f,
        "signature",
        opened
            .as_ref()
            .map(|(_, d)| d.clone())
            .map_err(Clone::clone),
    )];
    let Ok((body, _)) = opened else { return out };
    let statement = parse_statement(&body, &f.predicate_type);
    out.push(verdict(
        f,
        "statement",
        statement
            .as_ref()
            .map(|_| "an in-toto Statement v1 of the annotated predicate type".to_string())
            .map_err(Clone::clone),
    ));
    let Ok(statement) = statement else { return out };
    out.push(verdict(f, "subject", subject(&statement, expected.digest)));
    match statement.predicate_type.as_str() {
        SLSA_PREDICATE => out.extend(
            provenance_checks(&statement.predicate, expected)
                .into_iter()
                .map(|(c, r)| verdict(f, c, r)),
        ),
        SPDX_PREDICATE => out.extend(
            sbom_checks(&statement.predicate, expected)
                .into_iter()
                .map(|(c, r)| verdict(f, c, r)),
        ),
        _ => {}
    }
    out
}

fn open(f: &Fetched, trusted: &[VerifyingKey]) -> Result<(Vec<u8>, String), String> {
    let envelope: Envelope =
        serde_json::from_slice(&f.envelope).map_err(|e| format!("not a DSSE envelope ({e})"))?;
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(format!(
            "payloadType {:?}, not {PAYLOAD_TYPE}",
            commstack_digest::terminal_safe_capped(&envelope.payload_type, 80)
        ));
    }
    let (body, key) = envelope.open(trusted).map_err(|e| e.to_string())?;
    Ok((body, format!("signed by {}", key_text(&key))))
}

fn parse_statement(body: &[u8], annotated: &str) -> Result<Statement, String> {
    let statement: Statement = serde_json::from_slice(body)
        .map_err(|e| format!("the payload is not an in-toto statement ({e})"))?;
    if statement.type_ != STATEMENT_TYPE {
        return Err(format!("_type is not {STATEMENT_TYPE}"));
    }
    if statement.predicate_type != annotated {
        return Err(format!(
            "the signed predicateType {:?} is not the layer's annotation {annotated:?}",
            commstack_digest::terminal_safe_capped(&statement.predicate_type, 80)
        ));
    }
    Ok(statement)
}

fn subject(statement: &Statement, digest: &str) -> Result<String, String> {
    let hex = digest.trim_start_matches("sha256:");
    match statement
        .subject
        .iter()
        .any(|s| s.digest.get("sha256").is_some_and(|d| d == hex))
    {
        true => Ok(format!("about {digest}")),
        false => Err(format!(
            "the statement is about {}, not this image's manifest {digest}",
            statement
                .subject
                .iter()
                .map(|s| format!(
                    "{}@sha256:{}",
                    s.name,
                    s.digest.get("sha256").map_or("?", |d| d)
                ))
                .map(|s| commstack_digest::terminal_safe_capped(&s, 120))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

type Verdicts = Vec<(&'static str, Result<String, String>)>;

/// The provenance names this lock (its sha256) and exactly its locked inputs.
fn provenance_checks(predicate: &Value, expected: &Expected) -> Verdicts {
    let provenance: Provenance = match serde_json::from_value(predicate.clone()) {
        Ok(p) => p,
        Err(e) => {
            return vec![(
                "provenance",
                Err(format!("not an SLSA v1 provenance ({e})")),
            )];
        }
    };
    let definition = &provenance.build_definition;
    let build_type = match definition.build_type == BUILD_TYPE {
        true => Ok(format!("buildType {BUILD_TYPE}")),
        false => Err(format!(
            "buildType {:?} is not commstack's {BUILD_TYPE}",
            commstack_digest::terminal_safe_capped(&definition.build_type, 80)
        )),
    };
    let named = definition.external_parameters["lock"]["sha256"]
        .as_str()
        .unwrap_or("");
    let lock = match named == expected.lock_sha256 {
        true => Ok(format!("made from the lock with sha256 {named}")),
        false => Err(format!(
            "made from the lock with sha256 {:?}, not this lock ({}): an attestation of another lock",
            commstack_digest::terminal_safe_capped(named, 80),
            expected.lock_sha256
        )),
    };
    vec![
        ("build-type", build_type),
        ("lock", lock),
        (
            "inputs",
            inputs(&definition.resolved_dependencies, expected.lock),
        ),
    ]
}

/// Every locked artifact is a resolved dependency with its digests, and nothing else is.
fn inputs(resolved: &[ResourceDescriptor], lock: &Lock) -> Result<String, String> {
    let by_uri: BTreeMap<Option<&str>, &ResourceDescriptor> =
        resolved.iter().map(|d| (d.uri.as_deref(), d)).collect();
    let wanted: Vec<ResourceDescriptor> = lock.artifacts().iter().map(dependency).collect();
    let mut wrong = Vec::new();
    for w in &wanted {
        match by_uri.get(&w.uri.as_deref()) {
            None => wrong.push(format!("{} is missing", w.name.as_deref().unwrap_or("?"))),
            Some(d) if d.digest != w.digest => wrong.push(format!(
                "{} has digests {:?}, the lock {:?}",
                w.name.as_deref().unwrap_or("?"),
                d.digest,
                w.digest
            )),
            Some(_) => {}
        }
    }
    let known: Vec<Option<&str>> = wanted.iter().map(|w| w.uri.as_deref()).collect();
    for d in resolved
        .iter()
        .filter(|d| !known.contains(&d.uri.as_deref()))
    {
        wrong.push(format!(
            "{} is not in the lock",
            commstack_digest::terminal_safe_capped(d.uri.as_deref().unwrap_or("(no uri)"), 120)
        ));
    }
    match wrong.is_empty() {
        true => Ok(format!(
            "the {} locked inputs, each with its digest",
            wanted.len()
        )),
        false => Err(format!(
            "{} of the resolved dependencies disagree with the lock: {}{}",
            wrong.len(),
            wrong.iter().take(5).cloned().collect::<Vec<_>>().join("; "),
            if wrong.len() > 5 { "; ..." } else { "" }
        )),
    }
}

/// The SBOM describes an image of this lock and lists each locked wheel installed and
/// each locked .deb with its sha256.
fn sbom_checks(predicate: &Value, expected: &Expected) -> Verdicts {
    let namespace = predicate["documentNamespace"].as_str().unwrap_or("");
    let lock = match namespace.ends_with(&format!("/{}", expected.lock_sha256)) {
        true => Ok(format!(
            "the SBOM of an image of the lock {}",
            expected.lock_sha256
        )),
        false => Err(format!(
            "the SBOM's documentNamespace {:?} is not of this lock ({}): an SBOM of another lock",
            commstack_digest::terminal_safe_capped(namespace, 120),
            expected.lock_sha256
        )),
    };
    vec![
        ("lock", lock),
        ("packages", packages(predicate, expected.lock)),
    ]
}

fn packages(sbom: &Value, lock: &Lock) -> Result<String, String> {
    // PEP 503's normalization, so a wheel's `nvidia_nccl_cu13` is the lock's `nvidia-nccl-cu13`.
    let normal = |n: &str| n.to_lowercase().replace(['_', '.'], "-");
    let listed: Vec<(String, String, String)> = sbom["packages"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let sha = p["checksums"].as_array().and_then(|cs| {
                        cs.iter().find(|c| c["algorithm"] == "SHA256")?["checksumValue"].as_str()
                    });
                    (
                        normal(p["name"].as_str().unwrap_or("")),
                        p["versionInfo"].as_str().unwrap_or("").to_string(),
                        sha.unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let wheels = lock.packages.iter().filter(|w| w.replaced_by.is_none());
    let wanted: Vec<(String, String, String)> = wheels
        .map(|w| (normal(&w.name), w.version.clone(), w.sha256.clone()))
        .chain(
            lock.debs
                .iter()
                .map(|d| (normal(&d.name), d.version.clone(), d.sha256.clone())),
        )
        .collect();
    let missing: Vec<String> = wanted
        .iter()
        .filter(|w| !listed.contains(w))
        .map(|(n, v, _)| format!("{n} {v}"))
        .collect();
    let replaced: Vec<String> = lock
        .packages
        .iter()
        .filter(|w| w.replaced_by.is_some() && listed.iter().any(|l| l.2 == w.sha256))
        .map(|w| {
            format!(
                "{} {} (replaced by {})",
                w.name,
                w.version,
                w.replaced_by.as_deref().unwrap_or("")
            )
        })
        .collect();
    if missing.is_empty() && replaced.is_empty() {
        return Ok(format!(
            "lists the {} locked packages with their sha256",
            wanted.len()
        ));
    }
    let mut why = Vec::new();
    if !missing.is_empty() {
        why.push(format!(
            "{} locked packages are not listed with their version and sha256: {}{}",
            missing.len(),
            missing
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if missing.len() > 5 { ", ..." } else { "" }
        ));
    }
    if !replaced.is_empty() {
        why.push(format!(
            "it lists wheels the stack replaces: {}",
            replaced.join(", ")
        ));
    }
    Err(why.join("; "))
}
