//! Shipping an image step: [`docker_load`] streams the docker-archive into `docker load`
//! (no archive file is written), checks that Docker's ID is the config digest, and only
//! then tags it; an image Docker already has is only tagged (the no-op). [`export_oci`]
//! writes the OCI layout beside the target and renames it into place when complete.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};

use crate::assemble::Image;
use crate::docker_archive::{ArchiveWriter, DockerArchive, ImageSpec, write_docker_archive_above};
use crate::layer::Layer;
use crate::oci_layout::{OciImage, write_oci_layout_with};
use commstack_store::Store;

pub(crate) fn docker(args: &[&str]) -> Result<std::process::Output> {
    Command::new("docker").args(args).output().with_context(|| {
        format!(
            "cannot run `docker {}`: is Docker installed?",
            args.join(" ")
        )
    })
}

/// `docker ARGS`, which must succeed: a failure is a [`commstack_exec::CommandFailed`].
pub(crate) fn docker_ok(what: &str, args: &[&str]) -> Result<std::process::Output> {
    commstack_exec::output(what, Command::new("docker").args(args))
}

/// What a load sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// `sha256:<hex>`: the image ID.
    pub id: String,
    /// Layers whose tars went into `docker load`.
    pub sent: usize,
    /// Bottom layers Docker had already (another image starts with them): not sent.
    pub kept: usize,
    /// Of those sent, the layers that went in during the pull (an [`EarlyLoad`]).
    pub early: usize,
    /// Why the early load was given up for the usual one (its error), if it was.
    pub fallback: Option<String>,
}

/// Loads `image` into Docker and tags it; returns the image ID and what was sent (nothing
/// when Docker has the image).
pub fn docker_load(image: &Image) -> Result<Loaded> {
    docker_load_with(image, None)
}

/// As [`docker_load`], finishing `early` (a load that already holds some of the layers)
/// where there is one.
pub fn docker_load_with(image: &Image, early: Option<EarlyLoad>) -> Result<Loaded> {
    let id = image.id();
    let have = docker(&["image", "inspect", "--format", "{{.Id}}", id])?;
    let mut loaded = Loaded {
        id: id.to_string(),
        ..Loaded::default()
    };
    if have.status.success() && String::from_utf8_lossy(&have.stdout).trim() == id {
        // `early` is dropped unfinished: that load ends and registers nothing.
    } else {
        match early.map(|early| early.finish(image)) {
            Some(Ok(early)) => loaded = early,
            // What failed may be the early input alone (Docker dropped the chain it
            // counted on): the usual load says what is wrong if it fails too.
            failed => {
                loaded.fallback = failed.and_then(Result::err).map(|e| format!("{e:#}"));
                (loaded.sent, loaded.kept) =
                    load(&image.manifest.spec, &image.layers(), id, &image.dir)?;
            }
        }
    }
    tag(id, image.tag())?;
    Ok(loaded)
}

fn tag(id: &str, tag: &str) -> Result<()> {
    docker_ok("docker tag", &["tag", id, tag])?;
    Ok(())
}

/// What goes to an early load's writer: a layer tar's diff_id, its open file and size.
type Part = (String, File, u64);

/// The writer of an early load, when its input ends: the archive so far and the layers
/// in it.
type Written = Result<(ArchiveWriter<BufWriter<ChildStdin>>, BTreeSet<String>)>;

/// A `docker load` started while the image's layer tars are still arriving (pulled from
/// the binary cache): each goes into it as soon as it is complete, so Docker unpacks the
/// archive while the rest downloads, and [`EarlyLoad::finish`] sends only what is left.
/// Docker 20.10's load unpacks its whole input into a temporary directory before it reads
/// manifest.json, and registers nothing before that: the entries may come in any order,
/// and a load dropped before `finish` (the pull failed) loads nothing.
pub struct EarlyLoad {
    parts: Option<mpsc::Sender<Part>>,
    writer: Option<JoinHandle<Written>>,
    child: Option<Child>,
}

impl EarlyLoad {
    /// Starts `docker load`, its input fed from a thread of its own (a layer is sent
    /// without waiting for Docker to take it).
    pub fn start() -> Result<EarlyLoad> {
        let mut child = start_docker_load()?;
        let stdin = child.stdin.take().expect("piped");
        let (parts, arriving) = mpsc::channel::<Part>();
        let writer = std::thread::Builder::new()
            .name("early-docker-load".into())
            .spawn(move || -> Written {
                // The archive's own bytes are not kept: the entries' mtime does not matter.
                let mut archive = ArchiveWriter::new(buffered(stdin), 0);
                let mut sent = BTreeSet::new();
                loop {
                    let (diff_id, mut file, size) = match arriving.try_recv() {
                        Ok(part) => part,
                        // Nothing waiting: Docker gets the end of the last layer now.
                        Err(mpsc::TryRecvError::Empty) => {
                            archive.flush()?;
                            match arriving.recv() {
                                Ok(part) => part,
                                Err(_) => break,
                            }
                        }
                        Err(mpsc::TryRecvError::Disconnected) => break,
                    };
                    archive.layer(&diff_id, size, &mut file)?;
                    sent.insert(diff_id);
                }
                Ok((archive, sent))
            });
        let writer = match writer {
            Ok(writer) => writer,
            Err(err) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err).context("cannot start a thread");
            }
        };
        Ok(EarlyLoad {
            parts: Some(parts),
            writer: Some(writer),
            child: Some(child),
        })
    }

    /// Sends the layer tar of `diff_id` at `path` (whole, its sha256 checked) into the
    /// load. The file is opened now: it may be moved into its step directory meanwhile.
    pub fn layer(&self, diff_id: &str, path: &Path) -> Result<()> {
        let file = File::open(path)
            .with_context(|| format!("cannot read the layer {}", path.display()))?;
        let size = file.metadata()?.len();
        // A writer that stopped (Docker failed) is reported by `finish`.
        if let Some(parts) = &self.parts {
            let _ = parts.send((diff_id.to_string(), file, size));
        }
        Ok(())
    }

    /// Ends the load as `image`: the layers Docker has neither as a chain nor from this
    /// load's input, then the config and manifest.json; checks the ID and returns what
    /// was sent (the early layers among it).
    pub fn finish(mut self, image: &Image) -> Result<Loaded> {
        drop(self.parts.take());
        let (child, writer) = (self.child.take(), self.writer.take());
        let (child, writer) = (child.expect("not finished"), writer.expect("not finished"));
        let written = writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let layers = image.layers();
        let kept = chain_docker_has(&layers);
        let mut early = BTreeSet::new();
        let written = written.and_then(|(mut archive, sent)| {
            early = sent;
            for layer in layers.iter().skip(kept) {
                if !early.contains(&layer.diff_id) {
                    archive.layer_file(layer)?;
                }
            }
            archive.finish(&untagged(&image.manifest.spec), &layers)
        });
        ended(child, written, image.id(), &image.dir)?;
        Ok(Loaded {
            id: image.id().to_string(),
            sent: layers.len() - kept,
            kept,
            early: layers[kept..]
                .iter()
                .filter(|l| early.contains(&l.diff_id))
                .count(),
            fallback: None,
        })
    }
}

impl Drop for EarlyLoad {
    /// Not finished: Docker is stopped before its input ends, so it registers nothing.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(self.parts.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// How many of `layers`, from the bottom, Docker has as a chain already: the longest
/// prefix of their diff_ids that some image it holds starts with (a layer's identity in
/// Docker is its chain, the diff_ids up to it). 0 when Docker cannot say.
fn chain_docker_has(layers: &[Layer]) -> usize {
    let Ok(ids) = docker(&["image", "ls", "--all", "--quiet", "--no-trunc"]) else {
        return 0;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return 0;
    }
    let mut args = vec!["image", "inspect", "--format", "{{json .RootFS.Layers}}"];
    args.extend(ids.iter().map(String::as_str));
    let Ok(out) = docker(&args) else { return 0 };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Vec<String>>(line).ok())
        .map(|held| {
            held.iter()
                .zip(layers)
                .take_while(|(h, l)| **h == l.diff_id)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Streams the archive of `spec` and `layers` (with no tag: the tag comes after the check)
/// into `docker load`, leaving out the layers Docker has already; `id` is the ID it must
/// get, `what` names the step in errors. Returns the layers sent and those kept.
pub(crate) fn load(
    spec: &ImageSpec,
    layers: &[Layer],
    id: &str,
    what: &Path,
) -> Result<(usize, usize)> {
    let kept = chain_docker_has(layers);
    match load_above(spec, layers, kept, id, what) {
        Ok(()) => Ok((layers.len() - kept, kept)),
        // The image that held them was removed since we looked: send everything.
        Err(err) if kept > 0 => {
            eprintln!(
                "docker load without the {kept} layer(s) Docker had failed ({err:#}); loading every layer"
            );
            load_above(spec, layers, 0, id, what)?;
            Ok((layers.len(), 0))
        }
        Err(err) => Err(err),
    }
}

fn load_above(
    spec: &ImageSpec,
    layers: &[Layer],
    kept: usize,
    id: &str,
    what: &Path,
) -> Result<()> {
    let mut child = start_docker_load()?;
    let stdin = child.stdin.take().expect("piped");
    let written = write_docker_archive_above(&untagged(spec), layers, kept, buffered(stdin));
    ended(child, written, id, what)
}

/// `spec` with no tag: an image is tagged only after its ID is checked.
fn untagged(spec: &ImageSpec) -> ImageSpec {
    ImageSpec {
        tag: String::new(),
        ..spec.clone()
    }
}

/// `docker load`'s input, written in large pieces.
fn buffered(stdin: ChildStdin) -> BufWriter<ChildStdin> {
    BufWriter::with_capacity(1 << 20, stdin)
}

fn start_docker_load() -> Result<Child> {
    Command::new("docker")
        .args(["load"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run `docker load`: is Docker installed and its daemon running?")
}

/// Waits for the `docker load` whose input `written` ended (its stdin closed with it) and
/// checks that it loaded `id`; an image it loaded under another ID is removed.
fn ended(child: Child, written: Result<DockerArchive>, id: &str, what: &Path) -> Result<()> {
    let out = child.wait_with_output().context("docker load")?;
    let said = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let what = format!("docker load of {}", what.display());
        let failed = commstack_exec::CommandFailed::from_output(
            &what,
            Command::new("docker").arg("load"),
            &out,
        );
        return Err(match written {
            // What writing its input met may be why (or a consequence): said under it.
            Err(e) => e.context("writing its input").context(failed),
            Ok(_) => failed.into(),
        });
    }
    let loaded = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("Loaded image ID: "))
        .map(str::to_string);
    // Untagged, so nothing would name it: an image loaded under another ID goes.
    if let Some(other) = loaded.as_deref().filter(|other| *other != id) {
        let _ = docker(&["rmi", other]);
    }
    let written =
        written.with_context(|| format!("streaming {} into docker load", what.display()))?;
    if written.image_id != id {
        bail!(
            "{}: the config's digest is {}, image.json says {id}: the image step is damaged; remove it and run `cargo xtask build image` again",
            what.display(),
            written.image_id
        );
    }
    if loaded.as_deref() != Some(id) {
        bail!("docker load reported {said:?}, expected the image ID {id}");
    }
    Ok(())
}

/// Writes `image` as an OCI layout at `dir` (which must not exist): written into a
/// sibling directory, renamed when complete. With a `store`, the compressed layers are kept
/// there as steps of their own and reused (see [`write_oci_layout_with`]).
pub fn export_oci(image: &Image, dir: &Path, store: Option<&Store>) -> Result<OciImage> {
    if dir.exists() {
        bail!(
            "{} exists: remove it or give another --oci directory",
            dir.display()
        );
    }
    let name = dir
        .file_name()
        .with_context(|| format!("{} has no file name", dir.display()))?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let temp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))?;
    let layout = temp.path().join("oci");
    let oci = write_oci_layout_with(&image.manifest.spec, &image.layers(), &layout, store)?;
    if oci.config_digest != image.id() {
        bail!(
            "the OCI config digest {} is not the image ID {}: the image step {} is damaged",
            oci.config_digest,
            image.id(),
            image.dir.display()
        );
    }
    std::fs::rename(&layout, dir)
        .with_context(|| format!("cannot move the OCI layout into {}", dir.display()))?;
    Ok(oci)
}
