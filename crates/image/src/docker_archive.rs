//! The docker-archive format (what `docker load` of Docker 20.10 reads): `manifest.json`,
//! the image config as `<sha256>.json`, and each layer uncompressed as
//! `<diff_id hex>/layer.tar`. No compressor touches the identity: the image ID Docker
//! reports after a load is the sha256 of the config bytes, and the config is canonical
//! JSON (sorted keys, no whitespace, `created` from the epoch), so the same inputs give
//! the same ID on any machine.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use oci_spec::image::{
    Arch, ConfigBuilder, HistoryBuilder, ImageConfigurationBuilder, Os, RootFsBuilder,
};
use serde_json::json;

use crate::layer::Layer;

/// What the image runs as and with.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageSpec {
    /// `name:tag` recorded in manifest.json (`docker load` tags the image with it; empty:
    /// no tag, the image is loaded by ID only).
    pub tag: String,
    pub env: Vec<String>,
    pub cmd: Vec<String>,
    pub user: Option<String>,
    pub working_dir: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Seconds since 1970 for `created` and the history: the lock's epoch.
    pub epoch: u64,
    /// One line per layer for the history (`created_by`), in layer order.
    pub layer_comments: Vec<String>,
}

/// A written docker-archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DockerArchive {
    /// `sha256:<hex>` of the config bytes: the ID `docker load` gives the image.
    pub image_id: String,
    /// The canonical config JSON.
    pub config: String,
    pub diff_ids: Vec<String>,
}

/// The canonical image config for `layers` (in order, bottom first) and `spec`.
pub fn image_config(spec: &ImageSpec, layers: &[Layer]) -> Result<String> {
    let created = rfc3339(spec.epoch);
    let mut config = ConfigBuilder::default()
        .env(spec.env.clone())
        .cmd(spec.cmd.clone())
        .labels(
            spec.labels
                .clone()
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>(),
        );
    if let Some(user) = &spec.user {
        config = config.user(user.clone());
    }
    if let Some(dir) = &spec.working_dir {
        config = config.working_dir(dir.clone());
    }
    let history = layers
        .iter()
        .enumerate()
        .map(|(i, _)| {
            HistoryBuilder::default()
                .created(created.clone())
                .created_by(
                    spec.layer_comments
                        .get(i)
                        .cloned()
                        .unwrap_or_else(|| format!("commstack layer {i}")),
                )
                .build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let image = ImageConfigurationBuilder::default()
        .created(created)
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(config.build()?)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>())
                .build()?,
        )
        .history(history)
        .build()?;
    Ok(commstack_digest::canonical_json(&serde_json::to_value(
        &image,
    )?))
}

/// Writes the docker-archive of `layers` and `spec` to `out` (a tar, itself written with
/// fixed headers so the archive's own bytes are reproducible too).
pub fn write_docker_archive(
    spec: &ImageSpec,
    layers: &[Layer],
    out: &Path,
) -> Result<DockerArchive> {
    let file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut writer = BufWriter::new(file);
    let archive = write_docker_archive_to(spec, layers, &mut writer)
        .with_context(|| format!("writing {}", out.display()))?;
    writer.flush()?;
    Ok(archive)
}

/// The docker-archive's manifest.json: the config's file name, the tag (none when
/// `spec.tag` is empty) and the layer files.
pub fn archive_manifest(spec: &ImageSpec, config_hex: &str, layers: &[Layer]) -> String {
    let tags: Vec<&str> = [spec.tag.as_str()]
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect();
    commstack_digest::canonical_json(&json!([{
        "Config": format!("{config_hex}.json"),
        "RepoTags": tags,
        "Layers": layer_names(layers),
    }]))
}

fn layer_names(layers: &[Layer]) -> Vec<String> {
    layers.iter().map(|l| layer_name(&l.diff_id)).collect()
}

/// A layer's file in the archive: `<diff_id hex>/layer.tar`.
fn layer_name(diff_id: &str) -> String {
    format!("{}/layer.tar", diff_id.trim_start_matches("sha256:"))
}

/// The docker-archive as a stream (into `docker load`'s stdin, or a file): the layers as
/// they are on disk, then the config, then manifest.json.
pub fn write_docker_archive_to<W: Write>(
    spec: &ImageSpec,
    layers: &[Layer],
    out: W,
) -> Result<DockerArchive> {
    write_docker_archive_above(spec, layers, 0, out)
}

/// As [`write_docker_archive_to`], with the tars of the bottom `kept` layers left out
/// (manifest.json still names them): for a `docker load` into an engine that has that
/// chain of layers already. Docker 20.10's load looks each layer's chain up first and
/// opens its tar only when the chain is missing, so the archive holds only what is new
/// (a DeepEP change sends DeepEP's layers, not torch's).
pub fn write_docker_archive_above<W: Write>(
    spec: &ImageSpec,
    layers: &[Layer],
    kept: usize,
    out: W,
) -> Result<DockerArchive> {
    let mut archive = ArchiveWriter::new(out, spec.epoch);
    for layer in layers.iter().skip(kept) {
        archive.layer_file(layer)?;
    }
    archive.finish(spec, layers)
}

/// A docker-archive written in parts: layer tars first, in any order (Docker 20.10's load
/// unpacks the whole archive before it reads manifest.json), then [`ArchiveWriter::finish`]
/// writes the config and manifest.json. Every entry has fixed headers (`epoch` the mtime),
/// so the same parts in the same order give the same bytes.
pub struct ArchiveWriter<W: Write> {
    tar: tar::Builder<W>,
    epoch: u64,
}

impl<W: Write> ArchiveWriter<W> {
    pub fn new(out: W, epoch: u64) -> ArchiveWriter<W> {
        ArchiveWriter {
            tar: tar::Builder::new(out),
            epoch,
        }
    }

    fn put(&mut self, name: &str, size: u64, data: &mut dyn std::io::Read) -> Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(self.epoch);
        h.set_size(size);
        h.set_entry_type(tar::EntryType::Regular);
        // tar pads what it reads to the header's size without comparing the two: a file
        // that is not `size` bytes (changed since it was measured) would shift every
        // entry after it.
        let mut counted = Counted {
            inner: data.take(size),
            read: 0,
        };
        self.tar
            .append_data(&mut h, name, &mut counted)
            .with_context(|| format!("writing {name} into the docker-archive"))?;
        if counted.read != size {
            bail!(
                "{name}: {} bytes read where {size} were expected: the file changed while it was written into the docker-archive; run the command again",
                counted.read
            );
        }
        Ok(())
    }

    /// Hands on what is buffered (the writer keeps its place).
    pub fn flush(&mut self) -> Result<()> {
        self.tar.get_mut().flush()?;
        Ok(())
    }

    /// The layer tar of `diff_id` (`size` bytes of `data`), as `<hex>/layer.tar`.
    pub fn layer(&mut self, diff_id: &str, size: u64, data: &mut dyn std::io::Read) -> Result<()> {
        self.put(&layer_name(diff_id), size, data)
    }

    /// `layer`'s tar, read from its file.
    pub fn layer_file(&mut self, layer: &Layer) -> Result<()> {
        let mut f = File::open(&layer.path)
            .with_context(|| format!("cannot read the layer {}", layer.path.display()))?;
        self.layer(&layer.diff_id, layer.size, &mut f)
    }

    /// The config of `spec` and `layers` and manifest.json (naming every layer, sent or
    /// not), and the end of the tar.
    pub fn finish(mut self, spec: &ImageSpec, layers: &[Layer]) -> Result<DockerArchive> {
        let config = image_config(spec, layers)?;
        let config_hex = commstack_digest::sha256_hex(config.as_bytes());
        let manifest = archive_manifest(spec, &config_hex, layers);
        self.put(
            &format!("{config_hex}.json"),
            config.len() as u64,
            &mut config.as_bytes(),
        )?;
        self.put(
            "manifest.json",
            manifest.len() as u64,
            &mut manifest.as_bytes(),
        )?;
        self.tar.into_inner()?.flush()?;
        Ok(DockerArchive {
            image_id: format!("sha256:{config_hex}"),
            config,
            diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
        })
    }
}

/// A reader that counts what it gave.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// `epoch` seconds since 1970 as RFC 3339 in UTC (`2025-12-01T00:00:00Z`).
pub(crate) fn rfc3339(epoch: u64) -> String {
    let seconds = i64::try_from(epoch).unwrap_or(i64::MAX);
    jiff::Timestamp::from_second(seconds)
        .unwrap_or(jiff::Timestamp::MAX)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_shorter_than_its_size_is_an_error_not_a_shifted_archive() {
        let mut archive = ArchiveWriter::new(Vec::new(), 0);
        let err = archive
            .layer("sha256:ab", 10, &mut &b"short"[..])
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("ab/layer.tar: 5 bytes read where 10 were expected"),
            "{err:#}"
        );
        let mut archive = ArchiveWriter::new(Vec::new(), 0);
        archive.layer("sha256:ab", 5, &mut &b"short"[..]).unwrap();
    }

    #[test]
    fn epochs_render_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_547_200), "2025-12-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400 + 3661), "2000-02-29T01:01:01Z");
    }
}
