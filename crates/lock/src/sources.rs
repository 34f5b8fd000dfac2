//! The stack's sources (NVSHMEM, DeepEP, DeepEP's submodules), each locked with its
//! hashes and where the trust in them comes from (docs/sources.md):
//!
//! - `known-...`: commstack's known table (crates/stack/src/known-sources.toml). Nothing
//!   is fetched. A hash the user gives for a known source must agree with it.
//! - `stack.toml (<field>)`: the user gave a hash (`nvshmem.sha256`, `deepep.tree`, a
//!   submodule's `tree`); the source is fetched, held to it, and hashed the other way.
//! - `first-use <where> <date>`: nothing vouches for it; the bytes the first source gave
//!   (a mirror first, then upstream) are recorded, and `lock` says so loudly.
//!
//! Fetching is a later stage than locking (xtask/tests/flow_order.rs): the caller hands
//! in a [`SourceFetcher`]. A source the previous lock recorded (same name, URL, file and
//! commit) is not fetched again: its hashes and origin are kept.

use std::future::Future;
use std::pin::Pin;

use anyhow::{Result, anyhow, bail};
use commstack_stack::gitmodules;
use commstack_stack::lock::Source;
use commstack_stack::manifest::{git_archive_filename, git_archive_url};
use commstack_stack::model::{NCCL_SOURCE, NcclSource};
use commstack_stack::{Lock, Stack, known};
use pep440_rs::Version;

/// A source `lock` needs hashes of: what is expected of it, if anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceRequest {
    /// The lock's name: `nvshmem`, `deepep`, `deepep:<submodule path>`.
    pub name: String,
    pub url: String,
    /// The name a mirror holds it under.
    pub filename: String,
    /// A sha256 the bytes must have (the user's).
    pub sha256: Option<String>,
    /// A tree hash the unpacked bytes must have (the user's).
    pub tree: Option<String>,
}

/// What fetching a [`SourceRequest`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceSeen {
    pub sha256: String,
    pub tree: String,
    /// Where the bytes came from (a URL, `file:///...` for a mirror directory, `cache`).
    pub from: String,
    /// The tree's `.gitmodules`, if it has one.
    pub gitmodules: Option<String>,
}

pub type SeenFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<SourceSeen>>> + 'a>>;

/// Fetches and hashes sources for `lock`, one [`SourceSeen`] per request, in order.
pub trait SourceFetcher {
    fn fetch<'a>(&'a self, requests: &'a [SourceRequest]) -> SeenFuture<'a>;
}

/// For callers that lock only what the known table and the previous lock hold.
pub struct NoFetch;

impl SourceFetcher for NoFetch {
    fn fetch<'a>(&'a self, requests: &'a [SourceRequest]) -> SeenFuture<'a> {
        let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
        Box::pin(async move {
            bail!(
                "sources neither known nor in the previous lock need fetching ({}): run `cargo xtask lock` (with --mirror DIR where upstream is out of reach)",
                names.join(", ")
            )
        })
    }
}

/// Where the trust in a planned source comes from.
#[derive(Clone, Debug)]
enum Trust {
    /// The known table: the origin text to record.
    Known(String),
    /// The user's hash, by its stack.toml field.
    User(String),
    FirstUse,
}

/// The versions the resolution chose for the sources built from them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SourceVersions<'a> {
    pub nvshmem: &'a Version,
    /// The environment's NCCL (torch's pin, or `[nccl] version`).
    pub nccl: &'a Version,
}

/// A source before its missing hashes are known.
struct Planned {
    source: Source,
    trust: Trust,
}

/// The locked sources and the warnings `lock` must print (trust on first use), given the
/// NVSHMEM version to build and the previous lock, if any.
pub(crate) async fn lock_sources(
    stack: &Stack,
    versions: SourceVersions<'_>,
    previous: Option<&Lock>,
    fetcher: &dyn SourceFetcher,
    today: &str,
) -> Result<(Vec<Source>, Vec<String>)> {
    let mut planned = vec![plan_nvshmem(stack, versions.nvshmem)?, plan_deepep(stack)?];
    for sub in &stack.deepep.submodules {
        planned.push(Planned {
            source: Source {
                name: format!("deepep:{}", sub.path),
                version: format!("0+g{}", &sub.rev[..12]),
                rev: Some(sub.rev.clone()),
                path: Some(sub.path.clone()),
                url: git_archive_url(&sub.repo, &sub.rev),
                filename: git_archive_filename(&sub.repo, &sub.rev),
                sha256: None,
                tree: sub.tree.clone(),
                origin: String::new(),
            },
            trust: match sub.tree {
                Some(_) => Trust::User(format!("deepep.submodule[{}].tree", sub.path)),
                None => Trust::FirstUse,
            },
        });
    }
    if let Some(nccl) = &stack.nccl.source {
        planned.push(plan_nccl(nccl, versions.nccl));
    }
    let mut out = Vec::new();
    let mut requests = Vec::new();
    for p in &mut planned {
        if let Trust::Known(origin) = &p.trust {
            p.source.origin = origin.clone();
        } else if let Some(old) = recorded(previous, &p.source) {
            p.source.sha256 = old.sha256.clone();
            p.source.tree = old.tree.clone();
            p.source.origin = match &p.trust {
                Trust::User(field) => format!("stack.toml ({field})"),
                _ => old.origin.clone(),
            };
        } else {
            requests.push(SourceRequest {
                name: p.source.name.clone(),
                url: p.source.url.clone(),
                filename: p.source.filename.clone(),
                sha256: p.source.sha256.clone(),
                tree: p.source.tree.clone(),
            });
        }
    }
    let seen = match requests.is_empty() {
        true => Vec::new(),
        false => fetcher.fetch(&requests).await?,
    };
    let mut warnings = Vec::new();
    let mut seen = requests.iter().zip(seen);
    for p in planned {
        let mut source = p.source;
        if source.origin.is_empty() {
            let (request, got) = seen
                .next()
                .ok_or_else(|| anyhow!("the fetcher answered fewer sources than asked"))?;
            check_seen(request, &got)?;
            if source.name == "deepep" {
                check_gitmodules(stack, got.gitmodules.as_deref())?;
            }
            source.sha256 = Some(request.sha256.clone().unwrap_or(got.sha256.clone()));
            source.tree = Some(got.tree.clone());
            source.origin = match &p.trust {
                Trust::User(field) => format!("stack.toml ({field})"),
                _ => {
                    warnings.push(first_use_warning(&source, &got));
                    format!("first-use {} {today}", got.from)
                }
            };
        }
        out.push(source);
    }
    Ok((out, warnings))
}

/// The previous lock's record of the same source (name, URL, file, commit and path),
/// when it has both hashes and agrees with what the user gives now.
fn recorded<'a>(previous: Option<&'a Lock>, wanted: &Source) -> Option<&'a Source> {
    let old = previous?.sources.iter().find(|s| {
        s.name == wanted.name
            && s.url == wanted.url
            && s.filename == wanted.filename
            && s.rev == wanted.rev
            && s.path == wanted.path
    })?;
    let agrees = |mine: &Option<String>, theirs: &Option<String>| mine.is_none() || mine == theirs;
    let complete = old.sha256.is_some() && old.tree.is_some();
    (complete && agrees(&wanted.sha256, &old.sha256) && agrees(&wanted.tree, &old.tree))
        .then_some(old)
}

/// The fetcher held pinned sources to their pins; this says so again, naming the source.
fn check_seen(request: &SourceRequest, got: &SourceSeen) -> Result<()> {
    if let Some(tree) = &request.tree
        && *tree != got.tree
    {
        bail!(
            "{} ({}) from {} has the tree {}, not the {tree} stack.toml gives: refused",
            request.name,
            request.filename,
            got.from,
            got.tree
        );
    }
    Ok(())
}

/// `[nccl] from-source`: the release tag's archive of the locked NCCL version, held to
/// the user's tree hash or trusted on first use.
fn plan_nccl(nccl: &NcclSource, version: &Version) -> Planned {
    let v = version.to_string();
    let (url, filename) = NcclSource::archive(&v);
    Planned {
        source: Source {
            name: NCCL_SOURCE.into(),
            version: v.clone(),
            rev: Some(NcclSource::tag(&v)),
            path: None,
            url,
            filename,
            sha256: None,
            tree: nccl.tree.clone(),
            origin: String::new(),
        },
        trust: match nccl.tree {
            Some(_) => Trust::User("nccl.tree".into()),
            None => Trust::FirstUse,
        },
    }
}

/// The NVSHMEM source: the known table's release of the version, or the user's url and
/// sha256 (which must agree with the table where it knows the version).
fn plan_nvshmem(stack: &Stack, version: &Version) -> Result<Planned> {
    let v = version.to_string();
    let user = stack.nvshmem.source.as_ref();
    let loc = |field: &str| {
        stack
            .locate(field)
            .map(|l| format!("{l}: "))
            .unwrap_or_default()
    };
    let filename_of = |url: &str| url.rsplit('/').next().unwrap_or_default().to_string();
    let mut source = Source {
        name: "nvshmem".into(),
        version: v.clone(),
        rev: None,
        path: None,
        url: String::new(),
        filename: String::new(),
        sha256: None,
        tree: None,
        origin: String::new(),
    };
    match (known::nvshmem_release(&v), user) {
        (Some(release), user) => {
            if let Some(u) = user
                && u.sha256 != release.sha256
            {
                bail!(
                    "{}nvshmem.sha256 {} is not the sha256 of NVSHMEM {v} in commstack's known table ({}, from {}): refused. \
                     Drop url and sha256 from [nvshmem] to build the known release (a mirror's git archive of the tag is \
                     accepted by its tree with `--mirror DIR --accept-tree-match`), or check where your archive came from",
                    loc("nvshmem.sha256"),
                    u.sha256,
                    release.sha256,
                    release.sha256_from
                );
            }
            source.url = user.map_or(release.url.clone(), |u| u.url.clone());
            source.filename = filename_of(&source.url);
            source.sha256 = Some(release.sha256.clone());
            source.tree = release.tree.clone();
            let origin = match &release.tree_from {
                Some(from) => format!(
                    "known-hash table: sha256 from {}; tree hash from {from}",
                    release.sha256_from
                ),
                None => format!("known-hash table: sha256 from {}", release.sha256_from),
            };
            Ok(Planned {
                source,
                trust: Trust::Known(origin),
            })
        }
        (None, Some(u)) => {
            source.url = u.url.clone();
            source.filename = filename_of(&u.url);
            source.sha256 = Some(u.sha256.clone());
            Ok(Planned {
                source,
                trust: Trust::User("nvshmem.sha256".into()),
            })
        }
        (None, None) => bail!(
            "{}NVSHMEM {v} is not in commstack's known table (known: {}): name its source in {}'s [nvshmem] with \
             url = \"<the source archive>\" and sha256 = \"<its published sha256>\" (docs/sources.md), or choose a known version",
            loc("nvshmem.version"),
            known::nvshmem_versions().join(", "),
            stack.path().display()
        ),
    }
}

/// The DeepEP source: the known table's revision (whose api and tree a user's must agree
/// with), or any full commit of the stack's repository.
fn plan_deepep(stack: &Stack) -> Result<Planned> {
    let d = &stack.deepep;
    let loc = |field: &str| {
        stack
            .locate(field)
            .map(|l| format!("{l}: "))
            .unwrap_or_default()
    };
    let (rev, trust, tree) = match known::deepep_rev(&d.rev) {
        Some(k) => {
            if k.api() != d.api {
                bail!(
                    "{}deepep.api is {} but DeepEP {} is a {} revision ({})",
                    loc("deepep.api"),
                    d.api.as_str(),
                    &k.rev[..7],
                    k.api().as_str(),
                    k.note
                );
            }
            if let (Some(mine), Some(theirs)) = (&d.tree, &k.tree)
                && mine != theirs
            {
                bail!(
                    "{}deepep.tree {mine} is not the tree of DeepEP {} in commstack's known table ({theirs}): refused; \
                     check the hash (`cargo xtask cache hash` of the source), or drop deepep.tree to use the table's",
                    loc("deepep.tree"),
                    &k.rev[..7]
                );
            }
            let origin = format!("known-source table: {}", k.note);
            (k.rev.clone(), Trust::Known(origin), k.tree.clone())
        }
        None => {
            if d.rev.len() != 40 {
                bail!(
                    "{}DeepEP revision {} is not in commstack's known table, so it must be the full commit (40 hex digits): \
                     an abbreviation could name another commit tomorrow",
                    loc("deepep.rev"),
                    d.rev
                );
            }
            let trust = match d.tree {
                Some(_) => Trust::User("deepep.tree".into()),
                None => Trust::FirstUse,
            };
            (d.rev.clone(), trust, d.tree.clone())
        }
    };
    Ok(Planned {
        source: Source {
            name: "deepep".into(),
            version: format!("0+g{}", &rev[..12]),
            rev: Some(rev.clone()),
            path: None,
            url: git_archive_url(&d.repo, &rev),
            filename: git_archive_filename(&d.repo, &rev),
            sha256: None,
            tree,
            origin: String::new(),
        },
        trust,
    })
}

/// Every `.gitmodules` path of the fetched DeepEP has a `[[deepep.submodule]]` (a git
/// archive leaves it empty), and every declared one is in `.gitmodules`.
fn check_gitmodules(stack: &Stack, text: Option<&str>) -> Result<()> {
    let listed = gitmodules::parse(text.unwrap_or_default())
        .map_err(|e| anyhow!("DeepEP {}: {e}", stack.deepep.rev))?;
    let declared = &stack.deepep.submodules;
    let missing: Vec<String> = listed
        .iter()
        .filter(|g| !declared.iter().any(|d| d.path == g.path))
        .map(|g| {
            format!(
                "[[deepep.submodule]]\npath = \"{}\"\nrepo = \"{}\"\nrev = \"<the commit DeepEP {} names: `git ls-tree {} {}` in a clone>\"",
                g.path,
                g.url.trim_end_matches(".git"),
                &stack.deepep.rev[..7],
                stack.deepep.rev,
                g.path
            )
        })
        .collect();
    if !missing.is_empty() {
        bail!(
            "DeepEP {}'s .gitmodules lists submodules {} declares no commit for; a git archive leaves their paths empty, \
             so the build would miss them. Add to {}:\n{}",
            &stack.deepep.rev[..7],
            stack.path().display(),
            stack.path().display(),
            missing.join("\n\n")
        );
    }
    if let Some(extra) = declared
        .iter()
        .find(|d| !listed.iter().any(|g| g.path == d.path))
    {
        let paths: Vec<&str> = listed.iter().map(|g| g.path.as_str()).collect();
        bail!(
            "{}: [[deepep.submodule]] path {:?} is not in DeepEP {}'s .gitmodules (it lists: {}): refused, it would fill \
             a path the source does not leave for it",
            stack.path().display(),
            extra.path,
            &stack.deepep.rev[..7],
            if paths.is_empty() {
                "nothing".into()
            } else {
                paths.join(", ")
            }
        );
    }
    Ok(())
}

/// The loud line for a source trusted on first use.
fn first_use_warning(source: &Source, got: &SourceSeen) -> String {
    format!(
        "WARNING {}: TRUST ON FIRST USE: nothing vouched for {} but this download from {}; stack.lock records \
         sha256 {} and tree {}, and every later fetch is held to them. Check them now (e.g. `cargo xtask cache hash` \
         of a clone at that commit gives the tree), or give the tree in stack.toml to have it checked",
        source.name, source.filename, got.from, got.sha256, got.tree
    )
}
