//! stack.toml's raw form ([`crate::raw`]) to the model ([`crate::model`]): every problem
//! reported at once, each with file:line:column and a hint.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;

use pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::Requirement;
use toml::Spanned;

use crate::arch::{self, CudaArch};
use crate::bases;
use crate::diag::{Diagnostic, Diagnostics, Location};
use crate::model::*;
use crate::raw::*;
use crate::rules::RuleId;

impl Stack {
    /// Parse and validate. All problems are reported at once, each with file:line:column.
    pub fn parse(path: &Path, text: &str) -> Result<Stack, Diagnostics> {
        let raw: RawManifest =
            toml::from_str(text).map_err(|err| Diagnostics(vec![toml_error(path, text, &err)]))?;
        let mut v = Validator {
            path,
            text,
            diags: Vec::new(),
            spans: BTreeMap::new(),
        };
        let stack = v.validate(raw);
        match stack {
            Some(stack) if v.diags.is_empty() => Ok(stack),
            _ => Err(Diagnostics(v.diags)),
        }
    }

    /// Whether `resolve.allow` names `rule`. Here rather than in the model because the
    /// model keeps the ids as text so as not to depend on the rules.
    pub fn is_allowed(&self, rule: RuleId) -> bool {
        self.resolve.allow.iter().any(|id| id == rule.as_str())
    }
}

struct Validator<'a> {
    path: &'a Path,
    text: &'a str,
    diags: Vec<Diagnostic>,
    spans: BTreeMap<String, Range<usize>>,
}

impl Validator<'_> {
    fn err(&mut self, span: Range<usize>, message: impl Into<String>, hint: Option<String>) {
        let mut d = Diagnostic::at(self.path, self.text, span, message);
        d.hint = hint;
        self.diags.push(d);
    }

    fn span<T>(&mut self, field: &str, value: &Spanned<T>) {
        self.spans.insert(field.to_string(), value.span());
    }

    fn validate(&mut self, raw: RawManifest) -> Option<Stack> {
        let target = self.target(raw.target);
        let torch = self.torch(raw.torch);
        let cuda_major = torch.as_ref().map(|t| t.cuda_major);
        let nvshmem = self.nvshmem(raw.nvshmem, cuda_major);
        let nccl = self.nccl(raw.nccl);
        let deepep = self.deepep(raw.deepep);
        let toolchain = self.toolchain(raw.toolchain);
        let resolve = self.resolve(raw.resolve);
        let base = target.as_ref().map(|t| t.base);
        let v2 = deepep.as_ref().is_some_and(|d| d.api == DeepEpApi::V2);
        let image = match raw.image {
            None => Some(None),
            Some(raw) => self.image(raw, base, v2).map(Some),
        };
        let cache = self.cache(raw.cache);
        let deploy = match raw.deploy {
            None => Some(None),
            Some(raw) => {
                let checked = crate::deploy_check::check(self.path, self.text, raw);
                self.diags.extend(checked.diags);
                self.spans.extend(checked.spans);
                checked.deploy.map(Some)
            }
        };
        Some(Stack {
            target: target?,
            torch: torch?,
            nvshmem: nvshmem?,
            nccl: nccl?,
            deepep: deepep?,
            toolchain: toolchain?,
            resolve: resolve?,
            image: image?,
            cache: cache?,
            deploy: deploy?,
            path: self.path.to_path_buf(),
            text: self.text.to_string(),
            spans: std::mem::take(&mut self.spans),
        })
    }

    fn target(&mut self, raw: RawTarget) -> Option<Target> {
        self.span("target.python", &raw.python);
        self.span("target.base", &raw.base);
        let base = bases::find(raw.base.get_ref());
        if base.is_none() {
            self.err(
                raw.base.span(),
                format!("unknown base image {:?}", raw.base.get_ref()),
                Some(format!("known bases: {}", bases::names())),
            );
        }
        let python = match parse_minor(raw.python.get_ref()) {
            Some((3, minor)) if (9..=14).contains(&minor) => Some((3, minor)),
            _ => {
                self.err(
                    raw.python.span(),
                    format!(
                        "target.python must be a CPython minor version like \"3.12\", got {:?}",
                        raw.python.get_ref()
                    ),
                    Some("commstack targets CPython 3.9 to 3.14".into()),
                );
                None
            }
        };
        let arch = match raw.arch.as_ref().map(|a| a.get_ref().as_str()) {
            None | Some("x86_64") => Some(Arch::X86_64),
            Some("aarch64") => Some(Arch::Aarch64),
            Some(other) => {
                let span = raw.arch.as_ref().unwrap().span();
                self.err(
                    span,
                    format!("unknown arch {other:?}"),
                    Some("use \"x86_64\" or \"aarch64\"".into()),
                );
                None
            }
        };
        if let Some(a) = &raw.arch {
            self.span("target.arch", a);
        }
        let glibc = match &raw.glibc {
            Some(g) => {
                self.span("target.glibc", g);
                match parse_minor(g.get_ref()) {
                    Some((2, minor)) if (17..=60).contains(&minor) => Some((2, minor as u32)),
                    _ => {
                        self.err(
                            g.span(),
                            format!("target.glibc must be a glibc version like \"2.36\", got {:?}", g.get_ref()),
                            Some("it is the newest glibc the target has; manylinux wheels up to it are allowed".into()),
                        );
                        None
                    }
                }
            }
            None => base.map(|b| b.glibc),
        };
        Some(Target {
            python: python?,
            arch: arch?,
            glibc: glibc?,
            base: base?,
        })
    }

    fn torch(&mut self, raw: RawTorch) -> Option<Torch> {
        self.span("torch.version", &raw.version);
        self.span("torch.cuda", &raw.cuda);
        let version = self.exact_version(&raw.version, "torch.version");
        let cuda = *raw.cuda.get_ref();
        let cuda_major = if cuda == 12 || cuda == 13 {
            Some(cuda as u64)
        } else {
            self.err(
                raw.cuda.span(),
                format!("torch.cuda must be a CUDA major version, 12 or 13; got {cuda}"),
                Some("this is the CUDA major of torch's wheels and of the whole stack".into()),
            );
            None
        };
        Some(Torch {
            version: version?,
            cuda_major: cuda_major?,
        })
    }

    fn exact_version(&mut self, value: &Spanned<String>, field: &str) -> Option<Version> {
        let text = value.get_ref().trim();
        if text.starts_with(['=', '<', '>', '~', '!']) {
            self.err(
                value.span(),
                format!("{field} must be one exact version, not a specifier: {text:?}"),
                Some(format!(
                    "write e.g. {field} = \"{}\"",
                    text.trim_start_matches(['=', '<', '>', '~', '!']).trim()
                )),
            );
            return None;
        }
        match Version::from_str(text) {
            Ok(v) => Some(v),
            Err(err) => {
                self.err(
                    value.span(),
                    format!("{field}: {text:?} is not a version: {err}"),
                    None,
                );
                None
            }
        }
    }

    fn nvshmem(&mut self, raw: RawNvshmem, cuda_major: Option<u64>) -> Option<Nvshmem> {
        self.span("nvshmem.version", &raw.version);
        self.span("nvshmem.cuda-archs", &raw.cuda_archs);
        let version = if raw.version.get_ref() == "match-torch" {
            Some(NvshmemVersion::MatchTorch)
        } else {
            let v = self.exact_version(&raw.version, "nvshmem.version");
            if v.is_none() {
                self.diags.last_mut().unwrap().hint =
                    Some("use \"match-torch\" (the version torch pins) or one exact version like \"3.4.5\"".into());
            }
            v.map(NvshmemVersion::Exact)
        };
        let mut archs = Vec::new();
        let mut ok = true;
        if raw.cuda_archs.get_ref().is_empty() {
            self.err(
                raw.cuda_archs.span(),
                "nvshmem.cuda-archs is empty",
                Some("list the GPUs you deploy on, e.g. [\"90\"] for H100/H200".into()),
            );
            ok = false;
        }
        for arch in raw.cuda_archs.get_ref() {
            match arch.get_ref().parse::<CudaArch>() {
                Ok(a) if archs.contains(&a) => {
                    self.err(
                        arch.span(),
                        format!("CUDA arch {:?} is listed twice", arch.get_ref()),
                        None,
                    );
                    ok = false;
                }
                Ok(a) => {
                    let known = cuda_major.and_then(|m| arch::nvcc_sms(m.try_into().ok()?));
                    if let Some((nvcc, sms)) = known
                        && a.check_known(sms).is_err()
                    {
                        let list: Vec<String> = sms.iter().map(u32::to_string).collect();
                        self.err(
                            arch.span(),
                            format!(
                                "CUDA arch {:?}: nvcc {nvcc} (torch.cuda = {}) cannot build for sm_{}",
                                arch.get_ref(),
                                cuda_major.unwrap_or_default(),
                                a.sm()
                            ),
                            Some(format!(
                                "nvcc {nvcc} builds for SMs {}: e.g. \"90\" for H100/H200, \"100\" for B200",
                                list.join(", ")
                            )),
                        );
                        ok = false;
                    }
                    archs.push(a);
                }
                Err(e) => {
                    self.err(arch.span(), e.message(), Some(arch::HINT.into()));
                    ok = false;
                }
            }
        }
        let mut transports = NvshmemTransports::default();
        for (switch, value) in &raw.switches {
            transports.set(switch.key, *value.get_ref());
            self.spans
                .insert(format!("nvshmem.{}", switch.key), value.span());
        }
        let static_lib = raw.static_lib.as_ref().is_some_and(|v| *v.get_ref());
        if let Some(v) = &raw.static_lib {
            self.spans.insert("nvshmem.static-lib".into(), v.span());
        }
        let mut pass_env = Vec::new();
        for var in &raw.pass_env {
            let name = var.get_ref();
            if let Some(why) = crate::pass_env::refusal(name) {
                self.err(
                    var.span(),
                    format!("nvshmem.pass-env: {why}"),
                    Some("the NVSHMEM build starts from an empty environment and passes every option with -D; list only variables it does not read as settings (e.g. a proxy or license variable)".into()),
                );
                ok = false;
            } else {
                pass_env.push(name.clone());
            }
        }
        let source = self.nvshmem_source(raw.url.as_ref(), raw.sha256.as_ref());
        if !ok {
            return None;
        }
        Some(Nvshmem {
            version: version?,
            cuda_archs: archs,
            transports,
            pass_env,
            static_lib,
            source: source?,
        })
    }

    fn nccl(&mut self, raw: Option<RawNccl>) -> Option<Nccl> {
        let Some(raw) = raw else {
            return Some(Nccl {
                version: NcclVersion::MatchTorch,
                source: None,
            });
        };
        self.span("nccl.version", &raw.version);
        let source = self.nccl_source(&raw);
        if raw.version.get_ref() == "match-torch" {
            return Some(Nccl {
                version: NcclVersion::MatchTorch,
                source: source?,
            });
        }
        let v = self.exact_version(&raw.version, "nccl.version");
        if v.is_none() {
            self.diags.last_mut().unwrap().hint = Some(
                "use \"match-torch\" (the NCCL torch pins) or one exact version of the nvidia-nccl-cuXX wheel like \"2.30.7\"".into(),
            );
        }
        Some(Nccl {
            version: NcclVersion::Exact(v?),
            source: source?,
        })
    }

    /// `nccl.from-source` and `nccl.tree` (a tree without from-source is an error: it
    /// would vouch for nothing).
    fn nccl_source(&mut self, raw: &RawNccl) -> Option<Option<NcclSource>> {
        let on = raw.from_source.as_ref().is_some_and(|f| *f.get_ref());
        if let Some(f) = &raw.from_source {
            self.span("nccl.from-source", f);
        }
        let tree = raw.tree.as_ref().map(|t| self.tree_hash(t, "nccl.tree"));
        if let (Some(t), false) = (&raw.tree, on) {
            self.err(
                t.span(),
                "nccl.tree is set but nccl.from-source is not: the tree hash is of the NCCL source a from-source build uses".to_string(),
                Some("add `from-source = true` to [nccl], or remove `tree`".into()),
            );
            return None;
        }
        if !on {
            return Some(None);
        }
        Some(Some(NcclSource {
            tree: tree.map_or(Some(None), |t| t.map(Some))?,
        }))
    }

    fn deepep(&mut self, raw: RawDeepEp) -> Option<DeepEp> {
        self.span("deepep.rev", &raw.rev);
        self.span("deepep.api", &raw.api);
        let rev = raw.rev.get_ref().to_ascii_lowercase();
        let rev_ok = (7..=40).contains(&rev.len()) && rev.chars().all(|c| c.is_ascii_hexdigit());
        if !rev_ok {
            self.err(
                raw.rev.span(),
                format!("deepep.rev must be a git commit id (7 to 40 hex digits), got {:?}", raw.rev.get_ref()),
                Some("branch and tag names move; pin the commit, e.g. \"567632d\" (the last V1 commit)".into()),
            );
        }
        let api = match raw.api.get_ref().as_str() {
            "v1" => Some(DeepEpApi::V1),
            "v2" => Some(DeepEpApi::V2),
            other => {
                self.err(
                    raw.api.span(),
                    format!("deepep.api must be \"v1\" or \"v2\", got {other:?}"),
                    Some("v1: NVSHMEM-based DeepEP (up to 567632d); v2: NCCL device API (DeepEP main since 2026)".into()),
                );
                None
            }
        };
        let repo = match &raw.repo {
            Some(r) => self.repo_url(r, "deepep.repo"),
            None => Some(DEFAULT_DEEPEP_REPO.to_string()),
        };
        let tree = raw.tree.as_ref().map(|t| self.tree_hash(t, "deepep.tree"));
        let mut submodules = Vec::new();
        for (i, sub) in raw.submodule.iter().enumerate() {
            submodules.push(self.submodule(sub, i, &submodules));
        }
        if !rev_ok {
            return None;
        }
        Some(DeepEp {
            repo: repo?,
            rev,
            api: api?,
            tree: tree.map_or(Some(None), |t| t.map(Some))?,
            submodules: submodules.into_iter().collect::<Option<Vec<_>>>()?,
        })
    }

    /// One `[[deepep.submodule]]`; `before` are the ones read so far (a path twice is an
    /// error).
    fn submodule(
        &mut self,
        raw: &RawSubmodule,
        index: usize,
        before: &[Option<Submodule>],
    ) -> Option<Submodule> {
        let field = |k: &str| format!("deepep.submodule[{index}].{k}");
        self.span(&field("path"), &raw.path);
        let path = raw.path.get_ref().trim_matches('/').to_string();
        let path_ok = !path.is_empty()
            && path
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && c != ".git");
        if !path_ok {
            self.err(
                raw.path.span(),
                format!(
                    "{}: {:?} is not a relative path inside the DeepEP tree",
                    field("path"),
                    raw.path.get_ref()
                ),
                Some(
                    "write the path as the source's .gitmodules does, e.g. \"third-party/fmt\""
                        .into(),
                ),
            );
        }
        if before.iter().flatten().any(|s| s.path == path) {
            self.err(
                raw.path.span(),
                format!("{}: submodule {path:?} is declared twice", field("path")),
                None,
            );
            return None;
        }
        let repo = self.repo_url(&raw.repo, &field("repo"));
        let rev = raw.rev.get_ref().to_ascii_lowercase();
        if rev.len() != 40 || !rev.chars().all(|c| c.is_ascii_hexdigit()) {
            self.err(
                raw.rev.span(),
                format!("{}: a submodule is pinned by its full commit (40 hex digits), got {:?}", field("rev"), raw.rev.get_ref()),
                Some("the commit the DeepEP revision's gitlink names: `git ls-tree <deepep rev> <path>` in a clone of DeepEP".into()),
            );
            return None;
        }
        let tree = raw.tree.as_ref().map(|t| self.tree_hash(t, &field("tree")));
        if !path_ok {
            return None;
        }
        Some(Submodule {
            path,
            repo: repo?,
            rev,
            tree: tree.map_or(Some(None), |t| t.map(Some))?,
        })
    }

    /// `[nvshmem] url` and `sha256`: both or neither.
    fn nvshmem_source(
        &mut self,
        url: Option<&Spanned<String>>,
        sha256: Option<&Spanned<String>>,
    ) -> Option<Option<NvshmemSource>> {
        match (url, sha256) {
            (None, None) => Some(None),
            (Some(url), Some(sha256)) => {
                self.span("nvshmem.url", url);
                self.span("nvshmem.sha256", sha256);
                let checked = self.repo_url(url, "nvshmem.url");
                let hex = sha256
                    .get_ref()
                    .trim_start_matches("sha256:")
                    .to_ascii_lowercase();
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    self.err(
                        sha256.span(),
                        format!(
                            "nvshmem.sha256: {:?} is not a sha256 (64 hex digits)",
                            sha256.get_ref()
                        ),
                        Some("the archive's published sha256 (`sha256sum FILE`)".into()),
                    );
                    return None;
                }
                Some(Some(NvshmemSource {
                    url: checked?,
                    sha256: hex,
                }))
            }
            (Some(one), None) | (None, Some(one)) => {
                self.err(
                    one.span(),
                    "[nvshmem] names its source with both url and sha256, or neither",
                    Some("url = \"https://.../nvshmem_src_....tar.gz\" and sha256 = \"<its sha256>\"; without them the known table's release of nvshmem.version is used".into()),
                );
                None
            }
        }
    }

    /// An http(s) URL, without a trailing slash.
    fn repo_url(&mut self, value: &Spanned<String>, field: &str) -> Option<String> {
        self.span(field, value);
        let text = value.get_ref().trim_end_matches('/');
        let rest = text
            .strip_prefix("https://")
            .or_else(|| text.strip_prefix("http://"));
        match rest {
            Some(rest) if !rest.is_empty() && !rest.contains(char::is_whitespace) => {
                Some(text.to_string())
            }
            _ => {
                self.err(
                    value.span(),
                    format!("{field}: {:?} is not an http(s) URL", value.get_ref()),
                    Some("e.g. \"https://github.com/deepseek-ai/DeepEP\"; a machine that cannot reach it locks from a mirror (`cargo xtask lock --mirror DIR`)".into()),
                );
                None
            }
        }
    }

    /// `sha256:<64 lowercase hex>`, as `cargo xtask cache hash` prints a tree hash.
    fn tree_hash(&mut self, value: &Spanned<String>, field: &str) -> Option<String> {
        self.span(field, value);
        let text = value.get_ref();
        let ok = text.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64 && h.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
        });
        if !ok {
            self.err(
                value.span(),
                format!(
                    "{field}: {text:?} is not a tree hash (`sha256:` and 64 lowercase hex digits)"
                ),
                Some(
                    "`cargo xtask cache hash PATH` prints the tree hash of a directory or archive"
                        .into(),
                ),
            );
            return None;
        }
        Some(text.clone())
    }

    fn specifiers(
        &mut self,
        value: Option<&Spanned<String>>,
        field: &str,
        default: &str,
    ) -> Option<VersionSpecifiers> {
        let Some(value) = value else {
            return Some(VersionSpecifiers::from_str(default).expect("default specifiers parse"));
        };
        self.span(field, value);
        match VersionSpecifiers::from_str(value.get_ref()) {
            Ok(s) => Some(s),
            Err(err) => {
                self.err(
                    value.span(),
                    format!("{field}: not a version specifier: {err}"),
                    Some("e.g. \"==3.31.*\" or \">=3.28,<4.2\"".into()),
                );
                None
            }
        }
    }

    fn toolchain(&mut self, raw: RawToolchain) -> Option<Toolchain> {
        let cmake = self.specifiers(raw.cmake.as_ref(), "toolchain.cmake", DEFAULT_CMAKE);
        let ninja = self.specifiers(raw.ninja.as_ref(), "toolchain.ninja", DEFAULT_NINJA);
        let host_glibc = match &raw.host_glibc {
            None => Some(DEFAULT_HOST_GLIBC),
            Some(g) => {
                self.span("toolchain.host-glibc", g);
                match parse_minor(g.get_ref()) {
                    Some((2, minor)) if (17..=60).contains(&minor) => Some((2, minor as u32)),
                    _ => {
                        self.err(
                            g.span(),
                            format!(
                                "toolchain.host-glibc must look like \"2.28\", got {:?}",
                                g.get_ref()
                            ),
                            None,
                        );
                        None
                    }
                }
            }
        };
        Some(Toolchain {
            cmake: cmake?,
            ninja: ninja?,
            host_glibc: host_glibc?,
        })
    }

    fn resolve(&mut self, raw: RawResolve) -> Option<Resolve> {
        let mut ok = true;
        let index_url = match &raw.index_url {
            None => DEFAULT_INDEX.to_string(),
            Some(u) => {
                self.span("resolve.index-url", u);
                let url = u.get_ref().trim_end_matches('/').to_string();
                if !(url.starts_with("https://")
                    || url.starts_with("http://")
                    || url.starts_with("file://"))
                {
                    self.err(
                        u.span(),
                        format!("resolve.index-url must be an http(s) or file URL, got {url:?}"),
                        None,
                    );
                    ok = false;
                }
                url
            }
        };
        let exclude_newer = match &raw.exclude_newer {
            None => None,
            Some(t) => {
                self.span("resolve.exclude-newer", t);
                match parse_timestamp(t.get_ref()) {
                    Some(ts) => Some(ts),
                    None => {
                        self.err(
                            t.span(),
                            format!(
                                "resolve.exclude-newer must be a date or RFC 3339 time, got {:?}",
                                t.get_ref()
                            ),
                            Some("e.g. \"2026-12-01\" or \"2026-12-01T00:00:00Z\"".into()),
                        );
                        ok = false;
                        None
                    }
                }
            }
        };
        let mut extra = Vec::new();
        for req in &raw.extra_requirements {
            match Requirement::from_str(req.get_ref()) {
                Ok(r) => extra.push(r),
                Err(err) => {
                    self.err(
                        req.span(),
                        format!("not a PEP 508 requirement: {err}"),
                        None,
                    );
                    ok = false;
                }
            }
        }
        let mut allow = Vec::new();
        for id in &raw.allow {
            match RuleId::from_str(id.get_ref()) {
                Ok(rule) if !rule.waivable() => {
                    self.err(
                        id.span(),
                        format!("rule {} cannot be allowed in resolve.allow", rule.as_str()),
                        Some(format!(
                            "fix what it names instead. Why the rule exists: {}",
                            rule.reason()
                        )),
                    );
                    ok = false;
                }
                Ok(rule) => allow.push(rule.as_str().to_string()),
                Err(()) => {
                    self.err(
                        id.span(),
                        format!("unknown rule {:?} in resolve.allow", id.get_ref()),
                        Some(format!(
                            "rules resolve.allow can waive: {}",
                            RuleId::ALL
                                .iter()
                                .filter(|r| r.waivable())
                                .map(|r| r.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(Resolve {
            index_url,
            exclude_newer,
            extra_requirements: extra,
            allow,
        })
    }
}

impl Validator<'_> {
    /// `[cache]`: the registry's form (`HOST[:PORT]/REPO`, no tag) and each trusted key's
    /// (`ed25519:` and base64 of 32 bytes); the registry crate checks the key itself.
    fn cache(&mut self, raw: RawCache) -> Option<Cache> {
        let mut ok = true;
        if let Some(r) = &raw.registry {
            self.span("cache.registry", r);
            let text = r.get_ref();
            let rest = text
                .strip_prefix("https://")
                .or_else(|| text.strip_prefix("http://"))
                .unwrap_or(text);
            let good = match rest.trim_end_matches('/').split_once('/') {
                Some((host, repo)) => {
                    !host.is_empty()
                        && !repo.is_empty()
                        && !repo.contains([':', '@'])
                        && repo.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c)
                        })
                }
                None => false,
            };
            if !good {
                self.err(
                    r.span(),
                    format!("cache.registry {text:?} is not HOST[:PORT]/REPO"),
                    Some("the registry and a lower-case repository without a tag, e.g. \"registry.example.com/commstack/cache\"".into()),
                );
                ok = false;
            }
        }
        let mut keys = Vec::new();
        for (i, key) in raw.trusted_keys.iter().enumerate() {
            self.span(&format!("cache.trusted-keys.{i}"), key);
            let text = key.get_ref().trim();
            // `ed25519:<base64>`, or the path of a PEM public key file (what `cosign verify
            // --key` reads), relative to stack.toml: read when a pull needs it.
            let good = match text.strip_prefix("ed25519:") {
                Some(encoded) => base64_32(encoded).is_some(),
                None => {
                    (text.ends_with(".pub") || text.ends_with(".pem"))
                        && !text.contains(['\n', '\0'])
                }
            };
            if !good {
                self.err(
                    key.span(),
                    format!("cache.trusted-keys[{i}] {text:?} is not an ed25519 public key nor a public key file (.pub or .pem)"),
                    Some("write ed25519:<base64 of the 32-byte key> (`cargo xtask cache push` prints the key it signs with), or the path of its PEM file relative to stack.toml (`openssl pkey -in KEY.pem -pubout -out cosign.pub`)".into()),
                );
                ok = false;
            }
            keys.push(text.to_string());
        }
        ok.then(|| Cache {
            registry: raw
                .registry
                .map(|r| r.into_inner().trim_end_matches('/').to_string()),
            trusted_keys: keys,
        })
    }

    fn image(
        &mut self,
        raw: RawImage,
        base: Option<&'static bases::Base>,
        deepep_v2: bool,
    ) -> Option<Image> {
        let mut ok = true;
        let distribution = base.map(|b| b.distribution());
        let name = self.image_name(&raw, base, &mut ok);
        let mirror = self.image_mirror(&raw, distribution, &mut ok);
        let keyring = self.image_keyring(&raw, distribution, &mut ok);
        let include = self.image_include(&raw, &mut ok);
        if deepep_v2 && !include.iter().any(|p| p == JIT_HOST_COMPILER) {
            let span = raw.include.as_ref().map_or(0..0, |l| l.span());
            self.err(
                span,
                format!(
                    "image.include lacks {JIT_HOST_COMPILER:?}: DeepEP V2 (deepep.api = \"v2\") compiles its kernels at run time with nvcc, which runs the host g++"
                ),
                Some(format!(
                    "add \"{JIT_HOST_COMPILER}\" to [image] include (it brings gcc, cpp and the C++ headers nvcc needs), then `cargo xtask lock`"
                )),
            );
            ok = false;
        }
        let user = self.image_user(&raw, &mut ok);
        let index_max_age_days = self.image_index_max_age(&raw, &mut ok);
        if !ok {
            return None;
        }
        Some(Image {
            name: name?,
            mirror,
            keyring: keyring?,
            include,
            user,
            index_max_age_days,
        })
    }

    /// image.index-max-age-days: 1 to 36500 (the default when absent).
    fn image_index_max_age(&mut self, raw: &RawImage, ok: &mut bool) -> u32 {
        match &raw.index_max_age_days {
            None => DEFAULT_INDEX_MAX_AGE_DAYS,
            Some(days) => {
                self.span("image.index-max-age-days", days);
                match u32::try_from(*days.get_ref()) {
                    Ok(d) if (1..=36_500).contains(&d) => d,
                    _ => {
                        self.err(
                            days.span(),
                            format!(
                                "image.index-max-age-days must be a number of days from 1 to 36500, got {}",
                                days.get_ref()
                            ),
                            Some(format!(
                                "the oldest a mirror's signed index without Valid-Until may be; the default is {DEFAULT_INDEX_MAX_AGE_DAYS} (docs/bounds.md)"
                            )),
                        );
                        *ok = false;
                        0
                    }
                }
            }
        }
    }

    /// image.name: a Docker repository path (default `commstack/<base>`).
    fn image_name(
        &mut self,
        raw: &RawImage,
        base: Option<&'static bases::Base>,
        ok: &mut bool,
    ) -> Option<String> {
        match &raw.name {
            None => base.map(|b| format!("commstack/{}", b.name)),
            Some(n) => {
                self.span("image.name", n);
                let name = n.get_ref();
                // Docker's reference grammar for a repository path: lowercase components
                // of [a-z0-9] joined by '.', '_', '__' or '-', separated by '/'.
                let good = !name.is_empty()
                    && name.split('/').all(|part| {
                        !part.is_empty()
                            && part
                                .starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                            && part
                                .ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                            && part.chars().all(|c| {
                                c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c)
                            })
                    });
                if !good {
                    self.err(
                        n.span(),
                        format!("image.name {name:?} is not a Docker image name"),
                        Some("lowercase letters, digits and . _ - in components separated by /, without a tag, e.g. \"commstack/debian-12\"".into()),
                    );
                    *ok = false;
                }
                Some(name.clone())
            }
        }
    }

    /// image.mirror: an http(s) URL (Debian's by default).
    fn image_mirror(
        &mut self,
        raw: &RawImage,
        distribution: Option<bases::Distribution>,
        ok: &mut bool,
    ) -> Option<String> {
        match &raw.mirror {
            Some(m) => {
                self.span("image.mirror", m);
                let url = m.get_ref().trim_end_matches('/').to_string();
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    self.err(
                        m.span(),
                        format!("image.mirror must be an http(s) URL of a Debian or Ubuntu mirror, got {url:?}"),
                        Some(format!("e.g. \"{DEFAULT_DEBIAN_MIRROR}\" (it has dists/ and pool/)")),
                    );
                    *ok = false;
                }
                Some(url)
            }
            None => match distribution {
                Some(bases::Distribution::Debian) => Some(DEFAULT_DEBIAN_MIRROR.to_string()),
                // No default: `lock` says why (archive.ubuntu.com is not reachable here).
                _ => None,
            },
        }
    }

    /// image.keyring: an absolute path (the distribution's by default).
    fn image_keyring(
        &mut self,
        raw: &RawImage,
        distribution: Option<bases::Distribution>,
        ok: &mut bool,
    ) -> Option<String> {
        match &raw.keyring {
            Some(k) => {
                self.span("image.keyring", k);
                if !k.get_ref().starts_with('/') {
                    self.err(
                        k.span(),
                        format!(
                            "image.keyring must be an absolute path, got {:?}",
                            k.get_ref()
                        ),
                        Some(format!(
                            "e.g. \"{DEBIAN_KEYRING}\" (apt-get install debian-archive-keyring)"
                        )),
                    );
                    *ok = false;
                }
                Some(k.get_ref().clone())
            }
            None => distribution.map(|d| match d {
                bases::Distribution::Debian => DEBIAN_KEYRING.to_string(),
                bases::Distribution::Ubuntu => UBUNTU_KEYRING.to_string(),
            }),
        }
    }

    /// image.include: Debian package names, each once (for DeepEP V2 with
    /// [`JIT_HOST_COMPILER`], checked by the caller).
    fn image_include(&mut self, raw: &RawImage, ok: &mut bool) -> Vec<String> {
        match &raw.include {
            None => DEFAULT_INCLUDE.iter().map(|s| s.to_string()).collect(),
            Some(list) => {
                self.span("image.include", list);
                let mut out: Vec<String> = Vec::new();
                for pkg in list.get_ref() {
                    let p = pkg.get_ref();
                    // Debian policy 5.6.7: [a-z0-9][a-z0-9+.-]+
                    let good = p.len() >= 2
                        && p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                        && p.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || "+.-".contains(c)
                        });
                    if !good {
                        self.err(
                            pkg.span(),
                            format!("image.include: {p:?} is not a Debian package name"),
                            Some("list binary package names only (no versions: the lock pins them), e.g. \"python3\"".into()),
                        );
                        *ok = false;
                    } else if out.contains(p) {
                        self.err(pkg.span(), format!("image.include lists {p:?} twice"), None);
                        *ok = false;
                    } else {
                        out.push(p.clone());
                    }
                }
                out
            }
        }
    }

    /// image.user: a non-root user name.
    fn image_user(&mut self, raw: &RawImage, ok: &mut bool) -> String {
        match &raw.user {
            None => DEFAULT_USER.to_string(),
            Some(u) => {
                self.span("image.user", u);
                let name = u.get_ref();
                let good = (1..=32).contains(&name.len())
                    && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c));
                if !good || name == "root" {
                    self.err(
                        u.span(),
                        format!("image.user {name:?} is not a usable non-root user name"),
                        Some("lowercase letters, digits, _ and -, starting with a letter, at most 32 characters; not root".into()),
                    );
                    *ok = false;
                }
                name.clone()
            }
        }
    }
}

/// The Debian package of the host compiler DeepEP V2's JIT needs in the image: nvcc runs
/// `gcc`/`g++` for its front end (`g++` depends on gcc, cpp, g++-12, libstdc++-12-dev,
/// libc6-dev and binutils: the smallest set that compiles a .cu file).
pub const JIT_HOST_COMPILER: &str = "g++";

fn toml_error(path: &Path, text: &str, err: &toml::de::Error) -> Diagnostic {
    let location = err.span().map(|s| Location::of_offset(path, text, s.start));
    let message = err.message().trim().to_string();
    let hint = if message.starts_with("unknown field") {
        Some("see stack.toml in the commstack repository for every key, with comments".to_string())
    } else if message.starts_with("invalid type") {
        Some(
            "check the value's type: strings are quoted, booleans are true/false, lists use [ ]"
                .to_string(),
        )
    } else if message.starts_with("missing field")
        && ["`nodes`", "`gpus-per-node`", "`network`", "`command`"]
            .iter()
            .any(|f| message.contains(f))
    {
        Some("[deploy] needs nodes, gpus-per-node, network and command; see stack.toml's [deploy] and docs/deploy.md".to_string())
    } else if message.starts_with("missing field") {
        Some(
            "every stack names target, torch, nvshmem and deepep; see stack.toml for an example"
                .to_string(),
        )
    } else {
        None
    };
    let mut d = Diagnostic::new(location, message);
    d.hint = hint;
    d
}

fn parse_minor(s: &str) -> Option<(u64, u64)> {
    let (a, b) = s.trim().split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// `2026-12-01` (midnight UTC) or a full RFC 3339 timestamp.
pub fn parse_timestamp(s: &str) -> Option<jiff::Timestamp> {
    if let Ok(ts) = s.parse::<jiff::Timestamp>() {
        return Some(ts);
    }
    let date: jiff::civil::Date = s.parse().ok()?;
    date.to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

/// Standard base64 (with padding) of exactly 32 bytes: an ed25519 public key. Written here
/// (44 characters, the alphabet and one '=') so the stack crate needs no base64 crate.
fn base64_32(text: &str) -> Option<()> {
    let body = text.strip_suffix('=')?;
    let ok = body.len() == 43
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
        // 32 bytes leave 4 bits over in the last character: they must be zero.
        && body
            .bytes()
            .last()
            .is_some_and(|b| b"AEIMQUYcgkosw048".contains(&b));
    ok.then_some(())
}
