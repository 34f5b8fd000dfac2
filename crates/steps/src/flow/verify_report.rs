//! What verify expects of an image (from the resolved settings) and where an image's
//! verify reports go: shared by the static level on this machine
//! ([`crate::flow::verify_static`]) and the levels run in the loaded image
//! ([`crate::flow::verify_runtime`]).

use std::path::{Path, PathBuf};

use anyhow::Result;
use commstack_image::Image;
use commstack_verify::Expectations;

use crate::ctx::Ctx;
use crate::flow::image::IMAGE_VENV;
use crate::settings::Settings;

/// The image's site-packages, for the Python of the base (`3.11.2` -> python3.11).
pub fn image_site_packages(python_full: &str) -> PathBuf {
    let minor = python_full.split('.').take(2).collect::<Vec<_>>().join(".");
    PathBuf::from(format!("{IMAGE_VENV}/lib/python{minor}/site-packages"))
}

/// What the image must hold, from the resolved settings (the stack, its lock and the
/// command line's overrides: `--no-ibgda` and `--cuda-archs` change what is built, so
/// they change what is expected): one place for the static level here and the levels run
/// in the container (`commstack_verify::cli::expect_args`).
pub fn image_expectations(settings: &Settings, site: &Path) -> Result<Expectations> {
    let (stack, lock) = (&settings.stack, &settings.lock);
    let mut e = Expectations::new();
    // The one NCCL the image must hold (static.nccl.one; the runtime's ncclGetVersion).
    e.nccl_version = Some(
        settings
            .nccl
            .version
            .to_string()
            .parse()
            .map_err(|e: String| anyhow::anyhow!("the lock's NCCL version: {e}"))?,
    );
    e.nvshmem_version = Some(
        lock.resolved
            .nvshmem
            .parse()
            .map_err(|e: String| anyhow::anyhow!("the lock's NVSHMEM version: {e}"))?,
    );
    e.nvshmem_prefix = Some(site.join("nvidia/nvshmem"));
    for switch in commstack_stack::switches::in_stack() {
        let on = settings.nvshmem.switches.is_on(switch.key);
        e.nvshmem_build_vars.insert(
            switch.cmake.to_string(),
            if on { "ON" } else { "OFF" }.to_string(),
        );
    }
    let sms: std::collections::BTreeSet<u32> = settings
        .cuda_archs
        .iter()
        .filter(|a| a.has_sass())
        .map(|a| a.sm())
        .collect();
    if !sms.is_empty() {
        e.cuda_archs = Some(sms);
    }
    let (major, minor) = stack.target.base.glibc;
    e.target_glibc = Some(commstack_elf::DottedVersion(vec![major, minor]));
    let (a, b, c) = stack.target.base.glibcxx;
    e.target_glibcxx = Some(commstack_elf::DottedVersion(vec![a, b, c]));
    Ok(e)
}

/// `<home>/reports/image-<first 12 hex of the ID>/`: the image's verify reports (what
/// `push` attaches).
pub fn report_dir(ctx: &Ctx, image: &Image) -> PathBuf {
    let hex = image.id().trim_start_matches("sha256:");
    ctx.home
        .join("reports")
        .join(format!("image-{}", &hex[..12.min(hex.len())]))
}

/// One line per check of the verify report; returns each level's status.
pub fn print_verdicts(report: &serde_json::Value, say: &dyn Fn(&str)) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(levels) = report.get("levels").and_then(|l| l.as_array()) else {
        return out;
    };
    for level in levels {
        let name = level.get("level").and_then(|v| v.as_str()).unwrap_or("?");
        let status = level.get("status").and_then(|v| v.as_str()).unwrap_or("?");
        out.push((name.to_string(), status.to_string()));
        say(&format!("verify {name}: {status}"));
        for check in level
            .get("checks")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
        {
            say(&format!(
                "  {:<8} {:<40} {}",
                check.get("status").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("name").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("detail").and_then(|v| v.as_str()).unwrap_or("")
            ));
        }
    }
    out
}
