//! The verify step: the static level over the image's layer tars on this machine, with no
//! container and no Docker, so it runs while `docker load` loads the same bytes. Each
//! layer's index (its entries and the facts the checks read) is a store step keyed by the
//! layer's diff_id (`verify-layer-<hash>`): a layer read once, by a build or a pull, is not
//! read again, and an update reads only the layers that moved. The image's ID is the
//! digest of a config naming these diff_ids: what is checked is what Docker holds.

use std::path::PathBuf;

use anyhow::{Context, Result};
use commstack_image::Image;
use commstack_image::layer::Layer;
use commstack_store::{StepKey, Store};
use commstack_verify::environment::PythonEnv;
use commstack_verify::facts::FACTS_SCHEMA;
use commstack_verify::layers::{ImageFiles, LayerIndex, index_layer};
use commstack_verify::report::{ImageEnvironment, LayerRead};
use serde_json::json;

use crate::ctx::Ctx;
use crate::flow::image::IMAGE_VENV;
use crate::flow::verify_report::{
    image_expectations, image_site_packages, print_verdicts, report_dir,
};
use crate::settings::Settings;

/// The store step of one layer's index.
pub const LAYER_INDEX_STEP: &str = "verify-layer";
const INDEX_FILE: &str = "index.json";

/// The static level's outcome: `exit` 0 when every check passed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StaticVerdict {
    pub exit: u8,
    /// `<home>/reports/image-<id12>/verify-static.json`
    pub report: PathBuf,
    /// (level, status), as the verify report has them.
    pub levels: Vec<(String, String)>,
    /// Layers read here, and layers whose index an earlier verify kept.
    pub layers_read: usize,
    pub layers_reused: usize,
}

/// The index of each of `layers` (bottom first, of image `image_id`): from `store` where
/// an earlier verify kept it, else read from the layer's tar and kept. `code` names the
/// code that reads them (the verify tool's sources): an index made by other code is not
/// taken, since what a fix to a reader would find is what it is for.
pub fn layer_indexes(
    store: &Store,
    layers: &[Layer],
    image_id: &str,
    code: &str,
) -> Result<(Vec<LayerIndex>, Vec<LayerRead>)> {
    let mut indexes = Vec::new();
    let mut seen = Vec::new();
    for layer in layers {
        let inputs = json!({ "diff_id": layer.diff_id, "schema": FACTS_SCHEMA, "code": code });
        let key = StepKey::new(LAYER_INDEX_STEP, &inputs);
        let mut read = false;
        let outcome = store.run(&key, &inputs, false, |dir| {
            read = true;
            let index = index_layer(&layer.path, &layer.diff_id).with_context(|| {
                format!(
                    "reading layer {} ({}) of image {}",
                    layer.diff_id,
                    layer.path.display(),
                    image_id
                )
            })?;
            std::fs::write(dir.out.join(INDEX_FILE), serde_json::to_vec(&index)?)?;
            Ok(())
        })?;
        let file = outcome.path().join(INDEX_FILE);
        let text =
            std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let index: LayerIndex = serde_json::from_slice(&text).with_context(|| {
            format!(
                "{} is not a layer index: remove {} and verify again",
                file.display(),
                outcome.path().display()
            )
        })?;
        if index.diff_id != layer.diff_id {
            anyhow::bail!(
                "{} indexes layer {}, not {}: remove {} and verify again",
                file.display(),
                index.diff_id,
                layer.diff_id,
                outcome.path().display()
            );
        }
        seen.push(LayerRead {
            diff_id: layer.diff_id.clone(),
            read,
        });
        indexes.push(index);
    }
    Ok((indexes, seen))
}

/// Runs `work` on a thread of its own at nice 10 (Linux: the priority is per thread;
/// best effort: a failure leaves it as it was), for work that runs beside something the
/// build waits on longer.
fn at_lower_priority<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // Safety: plain system calls on the calling thread's own id.
                unsafe {
                    let tid = libc::gettid();
                    let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
                }
                work()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Runs the static level over `image`'s layers and writes its report where the image's
/// reports go (`verify-static.json`, which `push` attaches). At a lower CPU priority: it
/// runs beside `docker load` (dockerd and its storage driver), which the build waits on
/// longer.
pub fn verify_image_static(
    ctx: &Ctx,
    settings: &Settings,
    image: &Image,
    python_full: &str,
    verify_sources: &str,
    say: &dyn Fn(&str),
) -> Result<StaticVerdict> {
    // Said here once the thread is done: `say` is this thread's.
    let lines = std::sync::Mutex::new(Vec::<String>::new());
    let verdict = at_lower_priority(|| {
        let say = |line: &str| lines.lock().expect("lines lock").push(line.to_string());
        let site = image_site_packages(python_full);
        let expect = image_expectations(settings, &site)?;
        let store = Store::open(ctx.store_dir())?;
        let (indexes, seen) = layer_indexes(&store, &image.layers(), image.id(), verify_sources)?;
        let layers_read = seen.iter().filter(|l| l.read).count();
        let layers_reused = seen.len() - layers_read;
        say(&format!(
            "verify (static, from the image's {} layers): {layers_read} read, {layers_reused} known from an earlier verify",
            seen.len()
        ));
        let files = ImageFiles::new(indexes);
        let python = format!("{IMAGE_VENV}/bin/python");
        let report = commstack_verify::verify_image_static(
            &files,
            PythonEnv {
                python: python.clone().into(),
                executable: python.into(),
                version: python_full.to_string(),
                prefix: IMAGE_VENV.into(),
                site_packages: vec![site],
            },
            ImageEnvironment {
                id: image.id().to_string(),
                layers: seen,
            },
            &expect,
        );
        let dir = report_dir(ctx, image);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let file = dir.join("verify-static.json");
        let text = report.to_json();
        commstack_store::write_all_atomically(&[(&file, &text)])?;
        let value: serde_json::Value = serde_json::from_str(&text)?;
        let levels = print_verdicts(&value, &say);
        let exit = report.exit_code();
        say(&format!("verify report: {} (exit {exit})", file.display()));
        Ok(StaticVerdict {
            exit,
            report: file,
            levels,
            layers_read,
            layers_reused,
        })
    });
    for line in lines.into_inner().expect("lines lock") {
        say(&line);
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two real layer tars (the image crate's writer): read once, then known; an index
    /// damaged in the store is an error naming what to remove.
    #[test]
    fn a_layer_is_read_once_and_its_index_kept_by_diff_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let mut layers = Vec::new();
        for (i, text) in ["one", "two"].iter().enumerate() {
            let tree = dir.path().join(format!("tree{i}"));
            std::fs::create_dir_all(tree.join("opt")).unwrap();
            std::fs::write(tree.join("opt").join(format!("{text}.txt")), text).unwrap();
            layers.push(
                commstack_image::layer::write_layer(
                    &tree,
                    &dir.path().join(format!("layer{i}.tar")),
                    0,
                )
                .unwrap(),
            );
        }
        let (first, seen) = layer_indexes(&store, &layers, "sha256:test", "code-1").unwrap();
        assert!(seen.iter().all(|l| l.read), "{seen:?}");
        assert!(first[1].entries.contains_key("/opt/two.txt"));
        let (again, seen) = layer_indexes(&store, &layers, "sha256:test", "code-1").unwrap();
        assert!(seen.iter().all(|l| !l.read), "{seen:?}");
        assert_eq!(again, first);
        // Only the new layer is read.
        let tree = dir.path().join("tree2");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("three.txt"), "three").unwrap();
        layers.push(
            commstack_image::layer::write_layer(&tree, &dir.path().join("layer2.tar"), 0).unwrap(),
        );
        let (_, seen) = layer_indexes(&store, &layers, "sha256:test", "code-1").unwrap();
        let read: Vec<bool> = seen.iter().map(|l| l.read).collect();
        assert_eq!(read, [false, false, true]);

        // Another version of the code reads every layer again.
        let (_, seen) = layer_indexes(&store, &layers, "sha256:test", "code-2").unwrap();
        assert!(seen.iter().all(|l| l.read), "{seen:?}");

        let inputs =
            json!({ "diff_id": layers[0].diff_id, "schema": FACTS_SCHEMA, "code": "code-1" });
        let kept = store
            .lookup(&StepKey::new(LAYER_INDEX_STEP, &inputs))
            .unwrap();
        std::fs::write(kept.join(INDEX_FILE), "{").unwrap();
        let err = layer_indexes(&store, &layers, "sha256:test", "code-1").unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("is not a layer index: remove"), "{text}");
        assert!(text.contains(&kept.display().to_string()), "{text}");
    }
}
