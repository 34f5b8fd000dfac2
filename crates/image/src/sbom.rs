//! The SBOM: SPDX 2.3 JSON (https://spdx.github.io/spdx-spec/v2.3/), the subset an image
//! needs, modelled here with serde_json rather than an SPDX crate (the maintained ones
//! bring whole SPDX 2/3 models and parsers for the ~40 lines written here). One package
//! per Debian package (purl `pkg:deb/debian/..`, SHA256 of the .deb), per wheel
//! (`pkg:pypi/..`, SHA256 of the wheel), per own build (the NVSHMEM drop-in, DeepEP, the
//! tools: SHA256, no purl, since an index's package of that name is another build), all
//! contained in the image package. `created` is the lock's epoch and the namespace derives
//! from the lock's sha256, so the bytes are the same on every run.

use serde_json::{Value, json};

use crate::docker_archive::rfc3339;

/// What a component is, for its purl and purpose.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ComponentKind {
    Deb {
        architecture: String,
    },
    Wheel,
    /// Built by commstack (`LIBRARY` or `APPLICATION`).
    Own {
        application: bool,
    },
}

/// One SBOM package.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Component {
    pub kind: ComponentKind,
    pub name: String,
    pub version: String,
    pub sha256: String,
    /// Where it was downloaded from, if it was.
    pub download: Option<String>,
}

/// The document's identity and the image it describes.
pub struct SbomDocument<'a> {
    /// Image name (`commstack`) and tag (`<12 hex>`).
    pub image: &'a str,
    pub tag: &'a str,
    pub lock_sha256: &'a str,
    pub epoch: u64,
    pub components: Vec<Component>,
}

/// The SPDX JSON bytes (canonical JSON: sorted keys, no whitespace).
pub fn spdx_json(doc: &SbomDocument) -> String {
    let mut components = doc.components.clone();
    components.sort();
    let mut packages = vec![json!({
        "SPDXID": "SPDXRef-image",
        "name": doc.image,
        "versionInfo": doc.tag,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "primaryPackagePurpose": "CONTAINER",
        "comment": format!("container image made by commstack from the lock with sha256 {}", doc.lock_sha256),
    })];
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": "SPDXRef-image",
    })];
    for c in &components {
        let (prefix, purpose, purl) = match &c.kind {
            ComponentKind::Deb { architecture } => (
                "deb",
                "LIBRARY",
                Some(format!(
                    "pkg:deb/debian/{}@{}?arch={}",
                    purl_escape(&c.name),
                    purl_escape(&c.version),
                    purl_escape(architecture)
                )),
            ),
            ComponentKind::Wheel => (
                "pypi",
                "LIBRARY",
                Some(format!(
                    "pkg:pypi/{}@{}",
                    purl_escape(&c.name.to_lowercase().replace('_', "-")),
                    purl_escape(&c.version)
                )),
            ),
            ComponentKind::Own { application } => (
                "commstack",
                if *application {
                    "APPLICATION"
                } else {
                    "LIBRARY"
                },
                None,
            ),
        };
        let id = format!("SPDXRef-{prefix}-{}", spdx_id(&c.name));
        let mut package = json!({
            "SPDXID": id,
            "name": c.name,
            "versionInfo": c.version,
            "downloadLocation": c.download.as_deref().unwrap_or("NOASSERTION"),
            "filesAnalyzed": false,
            "primaryPackagePurpose": purpose,
            "checksums": [{ "algorithm": "SHA256", "checksumValue": c.sha256 }],
        });
        if let Some(purl) = purl {
            package["externalRefs"] = json!([{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": purl,
            }]);
        } else {
            package["comment"] = Value::from("built by commstack from locked sources");
        }
        packages.push(package);
        relationships.push(json!({
            "spdxElementId": "SPDXRef-image",
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": id,
        }));
    }
    let document = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}:{}", doc.image, doc.tag),
        "documentNamespace": format!("https://commstack.invalid/spdx/{}/{}", spdx_id(doc.image), doc.lock_sha256),
        "creationInfo": {
            "created": rfc3339(doc.epoch),
            "creators": [format!("Tool: commstack-image-{}", env!("CARGO_PKG_VERSION"))],
        },
        "packages": packages,
        "relationships": relationships,
    });
    commstack_digest::canonical_json(&document)
}

/// SPDX identifiers allow letters, digits, `.` and `-`.
fn spdx_id(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Percent-encodes what a purl segment may not hold raw (`+` in `2.36-9+deb12u4`, the
/// `:` of a Debian epoch).
fn purl_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_versions_and_names_are_escaped_in_purls_and_ids() {
        assert_eq!(purl_escape("1:2.36-9+deb12u4"), "1%3A2.36-9%2Bdeb12u4");
        assert_eq!(spdx_id("nvidia_nccl+cu13"), "nvidia-nccl-cu13");
        let doc = SbomDocument {
            image: "commstack",
            tag: "0123456789ab",
            lock_sha256: "ab",
            epoch: 1_764_547_200,
            components: vec![
                Component {
                    kind: ComponentKind::Wheel,
                    name: "Torch_X".into(),
                    version: "2.11.0".into(),
                    sha256: "00".into(),
                    download: None,
                },
                Component {
                    kind: ComponentKind::Deb {
                        architecture: "amd64".into(),
                    },
                    name: "libc6".into(),
                    version: "2.36-9+deb12u4".into(),
                    sha256: "11".into(),
                    download: Some("http://deb.debian.org/x.deb".into()),
                },
            ],
        };
        let text = spdx_json(&doc);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["creationInfo"]["created"], "2025-12-01T00:00:00Z");
        assert_eq!(
            v["packages"][1]["externalRefs"][0]["referenceLocator"],
            "pkg:deb/debian/libc6@2.36-9%2Bdeb12u4?arch=amd64"
        );
        assert_eq!(
            v["packages"][2]["externalRefs"][0]["referenceLocator"],
            "pkg:pypi/torch-x@2.11.0"
        );
        assert_eq!(v["relationships"].as_array().unwrap().len(), 3);
    }
}
