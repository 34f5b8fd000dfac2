//! A small Python package index served by [`TestServer`]: real wheels (zip files with
//! METADATA), PEP 691 JSON project pages, PEP 658 `.metadata` files, and the ways real
//! indexes go wrong (yanked files, missing `.metadata`, wrong announced hashes, 5xx,
//! redirects, late uploads).

use std::collections::BTreeMap;
use std::io::Write;

use sha2::{Digest, Sha256};

use crate::{Behavior, Route, TestServer};

/// One wheel to publish.
#[derive(Clone, Debug)]
pub struct WheelSpec {
    pub name: String,
    pub version: String,
    /// The tag part of the filename, e.g. `py3-none-any` or `cp312-cp312-manylinux_2_28_x86_64`.
    pub tags: String,
    pub requires_dist: Vec<String>,
    pub provides_extra: Vec<String>,
    pub requires_python: Option<String>,
    pub yanked: bool,
    /// RFC 3339.
    pub upload_time: String,
    /// Serve `<wheel>.metadata` (PEP 658). The index never announces it (like the proxy
    /// in front of PyPI here) unless `announce_metadata` is set.
    pub serve_metadata: bool,
    pub announce_metadata: Option<MetadataHash>,
    /// More files of the wheel (path inside it, bytes), e.g. `nvidia/nccl/lib/libnccl.so.2`.
    pub files: Vec<(String, Vec<u8>)>,
}

#[derive(Clone, Copy, Debug)]
pub enum MetadataHash {
    Correct,
    Wrong,
}

impl WheelSpec {
    pub fn new(name: &str, version: &str) -> WheelSpec {
        WheelSpec {
            name: name.into(),
            version: version.into(),
            tags: "py3-none-any".into(),
            requires_dist: Vec::new(),
            provides_extra: Vec::new(),
            requires_python: None,
            yanked: false,
            upload_time: "2026-01-01T00:00:00Z".into(),
            serve_metadata: true,
            announce_metadata: None,
            files: Vec::new(),
        }
    }
    /// Adds a file at `path` inside the wheel.
    pub fn file(mut self, path: &str, bytes: &[u8]) -> Self {
        self.files.push((path.into(), bytes.to_vec()));
        self
    }
    pub fn tags(mut self, tags: &str) -> Self {
        self.tags = tags.into();
        self
    }
    pub fn requires(mut self, req: &str) -> Self {
        self.requires_dist.push(req.into());
        self
    }
    pub fn extra(mut self, extra: &str) -> Self {
        self.provides_extra.push(extra.into());
        self
    }
    pub fn requires_python(mut self, spec: &str) -> Self {
        self.requires_python = Some(spec.into());
        self
    }
    pub fn yanked(mut self) -> Self {
        self.yanked = true;
        self
    }
    pub fn uploaded(mut self, time: &str) -> Self {
        self.upload_time = time.into();
        self
    }
    pub fn without_metadata_file(mut self) -> Self {
        self.serve_metadata = false;
        self
    }
    pub fn announce_metadata(mut self, hash: MetadataHash) -> Self {
        self.announce_metadata = Some(hash);
        self
    }

    pub fn filename(&self) -> String {
        let dist = self.name.replace(['-', '.'], "_");
        format!("{dist}-{}-{}.whl", self.version, self.tags)
    }

    pub fn metadata(&self) -> String {
        let mut m = format!(
            "Metadata-Version: 2.1\nName: {}\nVersion: {}\n",
            self.name, self.version
        );
        if let Some(rp) = &self.requires_python {
            m.push_str(&format!("Requires-Python: {rp}\n"));
        }
        for e in &self.provides_extra {
            m.push_str(&format!("Provides-Extra: {e}\n"));
        }
        for r in &self.requires_dist {
            m.push_str(&format!("Requires-Dist: {r}\n"));
        }
        m.push_str("\nA fixture package.\n");
        m
    }

    /// The wheel's bytes: a real zip with dist-info METADATA, WHEEL and RECORD.
    pub fn build(&self) -> Vec<u8> {
        let dist = self.name.replace(['-', '.'], "_");
        let info = format!("{dist}-{}.dist-info", self.version);
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut zip = zip::ZipWriter::new(&mut buf);
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored);
            zip.start_file(format!("{dist}/__init__.py"), opts).unwrap();
            zip.write_all(b"").unwrap();
            for (path, bytes) in &self.files {
                zip.start_file(path.as_str(), opts).unwrap();
                zip.write_all(bytes).unwrap();
            }
            zip.start_file(format!("{info}/METADATA"), opts).unwrap();
            zip.write_all(self.metadata().as_bytes()).unwrap();
            zip.start_file(format!("{info}/WHEEL"), opts).unwrap();
            zip.write_all(format!("Wheel-Version: 1.0\nGenerator: commstack-testkit\nRoot-Is-Purelib: true\nTag: {}\n", self.tags).as_bytes())
                .unwrap();
            zip.start_file(format!("{info}/RECORD"), opts).unwrap();
            zip.write_all(format!("{info}/RECORD,,\n").as_bytes())
                .unwrap();
            zip.finish().unwrap();
        }
        buf.into_inner()
    }
}

/// The index. Publish wheels with [`FixtureIndex::add`], then [`FixtureIndex::serve`].
pub struct FixtureIndex {
    wheels: BTreeMap<String, Vec<(WheelSpec, Vec<u8>)>>,
    pages: std::sync::Mutex<BTreeMap<String, Vec<u8>>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Default for FixtureIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl FixtureIndex {
    pub fn new() -> FixtureIndex {
        FixtureIndex {
            wheels: BTreeMap::new(),
            pages: Default::default(),
        }
    }

    pub fn add(&mut self, spec: WheelSpec) -> &mut Self {
        let bytes = spec.build();
        let project = normalize(&spec.name);
        self.wheels.entry(project).or_default().push((spec, bytes));
        self
    }

    /// The bytes and sha256 of a published wheel, by filename.
    pub fn wheel(&self, filename: &str) -> Option<(&[u8], String)> {
        self.wheels
            .values()
            .flatten()
            .find(|(s, _)| s.filename() == filename)
            .map(|(_, b)| (b.as_slice(), sha256_hex(b)))
    }

    /// Register every page, wheel and metadata file on `server`, under `/simple/` and
    /// `/files/`. Returns the index URL (`http://127.0.0.1:PORT/simple`).
    pub fn serve(&self, server: &TestServer) -> String {
        for (project, wheels) in &self.wheels {
            let mut files = Vec::new();
            for (spec, bytes) in wheels {
                let filename = spec.filename();
                let path = format!("/files/{filename}");
                server.route(&path, Route::ok(bytes.clone()));
                let metadata = spec.metadata().into_bytes();
                if spec.serve_metadata {
                    server.route(&format!("{path}.metadata"), Route::ok(metadata.clone()));
                }
                let mut file = serde_json::json!({
                    "filename": filename,
                    // Relative, as PyPI mirrors often write them: resolved against the page URL.
                    "url": format!("../../files/{filename}"),
                    "hashes": {"sha256": sha256_hex(bytes)},
                    "upload-time": spec.upload_time,
                    "size": bytes.len(),
                    "yanked": spec.yanked,
                });
                if let Some(rp) = &spec.requires_python {
                    file["requires-python"] = rp.clone().into();
                }
                match spec.announce_metadata {
                    Some(MetadataHash::Correct) => {
                        file["core-metadata"] = serde_json::json!({"sha256": sha256_hex(&metadata)})
                    }
                    Some(MetadataHash::Wrong) => {
                        file["core-metadata"] = serde_json::json!({"sha256": "0".repeat(64)})
                    }
                    None => {}
                }
                files.push(file);
            }
            let page = serde_json::json!({
                "meta": {"api-version": "1.1"},
                "name": project,
                "files": files,
            });
            let body = serde_json::to_vec_pretty(&page).unwrap();
            let path = format!("/simple/{project}/");
            server.route(
                &path,
                Route::ok(body.clone())
                    .header("Content-Type", "application/vnd.pypi.simple.v1+json"),
            );
            self.pages.lock().unwrap().insert(path, body);
        }
        server.url("/simple")
    }

    /// A page as served (after [`FixtureIndex::serve`]), to serve it elsewhere too.
    pub fn page(&self, path: &str) -> Option<Vec<u8>> {
        self.pages.lock().unwrap().get(path).cloned()
    }

    /// Make a project's page misbehave (e.g. fail the first request with 500).
    pub fn misbehave(&self, server: &TestServer, project: &str, behavior: Behavior) {
        let path = format!("/simple/{}/", normalize(project));
        let body = self
            .pages
            .lock()
            .unwrap()
            .get(&path)
            .cloned()
            .unwrap_or_else(|| panic!("no page {path}: serve() first"));
        server.route(
            &path,
            Route::ok(body)
                .header("Content-Type", "application/vnd.pypi.simple.v1+json")
                .behavior(behavior),
        );
    }
}

/// PEP 503 normalisation.
pub fn normalize(name: &str) -> String {
    let mut out = String::new();
    let mut last_sep = false;
    for c in name.chars() {
        if c == '-' || c == '_' || c == '.' {
            if !last_sep {
                out.push('-');
            }
            last_sep = true;
        } else {
            out.push(c.to_ascii_lowercase());
            last_sep = false;
        }
    }
    out
}
