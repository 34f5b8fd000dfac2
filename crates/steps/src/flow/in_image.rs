//! Python run in the loaded image with no network and no GPU (the runtime step's checks),
//! and what such a run printed, kept beside the report.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::Result;
use commstack_image::Image;

use crate::flow::image::IMAGE_VENV;

/// `docker run` of the image's own Python on `script`: no network, no GPU, no stdin.
pub fn python_without_gpu(image: &Image, script: &str) -> Command {
    let mut command = Command::new("docker");
    command
        .args([
            "run",
            "--rm",
            "--network=none",
            "-e",
            "CUDA_VISIBLE_DEVICES=",
        ])
        .args(["--entrypoint", &format!("{IMAGE_VENV}/bin/python")])
        .args([image.id(), "-c", script])
        .stdin(Stdio::null());
    command
}

/// What the run printed (stdout, then stderr), written to `file` whole; returned.
pub fn keep_output(out: &Output, file: &Path) -> Result<String> {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    commstack_store::write_all_atomically(&[(file, &text)])?;
    Ok(text)
}
