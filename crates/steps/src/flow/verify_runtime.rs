//! The runtime step: what runs in the loaded image, with no network: `import torch`
//! without GPUs (and for DeepEP V2 its JIT toolchain: [`crate::flow::jit_check`]), and
//! with `gpus` the verify tool's runtime and selftest levels (`docker run --gpus all`),
//! with the same expectations as the static level.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use commstack_image::Image;
use commstack_verify::runtime::{IMPORT_CHECK_PY, NUMPY_MISSING, NUMPY_MISSING_FIX};

use crate::ctx::Ctx;
use crate::flow::image::{IMAGE_BIN, IMAGE_VENV};
use crate::flow::in_image::{keep_output, python_without_gpu};
use crate::flow::verify_report::{
    image_expectations, image_site_packages, print_verdicts, report_dir,
};
use crate::settings::Settings;

/// What the runtime step found in the loaded image.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RuntimeVerdict {
    /// 0 when torch imported and, with --gpus, every GPU level passed.
    pub exit: u8,
    /// `verify-gpus.json` with --gpus, else `import-torch.txt`.
    pub report: PathBuf,
    /// (level, status) as the verify tool reported them: runtime and selftest with
    /// --gpus, none without.
    pub levels: Vec<(String, String)>,
    pub import_torch: bool,
    /// DeepEP V2: whether its JIT toolchain check passed in the image (None for V1).
    #[serde(default)]
    pub jit_toolchain: Option<bool>,
}

/// What runs in the loaded image, with no network: `import torch` without GPUs, and with
/// `gpus` the verify tool's runtime and selftest levels (`docker run --gpus all`). The
/// static level is not run here: [`crate::flow::verify_static`] reads it from the image's
/// layers on this machine. Reports under [`report_dir`].
pub fn runtime_in_container(
    ctx: &Ctx,
    settings: &Settings,
    image: &Image,
    python_full: &str,
    gpus: bool,
    say: &dyn Fn(&str),
) -> Result<RuntimeVerdict> {
    let report_dir = report_dir(ctx, image);
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("cannot create {}", report_dir.display()))?;
    // `import torch` in a container of its own meanwhile: each is mostly one core's work.
    let import = start_import_without_gpu(image)?;
    let gpu_levels = match gpus {
        true => Some(verify_gpu_levels(
            ctx,
            settings,
            image,
            python_full,
            &report_dir,
            say,
        )),
        false => None,
    };
    let imports = finish_import_without_gpu(import, &report_dir, say)?;
    let jit_toolchain = match settings.stack.deepep.api {
        commstack_stack::manifest::DeepEpApi::V2 => Some(
            crate::flow::jit_check::jit_toolchain_in_image(image, &report_dir, say)?,
        ),
        commstack_stack::manifest::DeepEpApi::V1 => None,
    };
    // Without GPUs, the JIT check counts as the import does.
    let imports_ok = imports && jit_toolchain != Some(false);
    let import_file = report_dir.join("import-torch.txt");
    let Some(gpu_levels) = gpu_levels else {
        return Ok(RuntimeVerdict {
            exit: u8::from(!imports_ok),
            report: import_file,
            levels: Vec::new(),
            import_torch: imports,
            jit_toolchain,
        });
    };
    let GpuLevels {
        code,
        report,
        levels,
    } = gpu_levels?;
    Ok(RuntimeVerdict {
        exit: match (code, imports_ok) {
            (0, true) => 0,
            (c, true) => u8::try_from(c).unwrap_or(1),
            (_, false) => 1,
        },
        report,
        levels,
        import_torch: imports,
        jit_toolchain,
    })
}

/// What the verify tool's GPU levels gave: its exit code, its report, each level's status.
struct GpuLevels {
    code: i32,
    report: PathBuf,
    levels: Vec<(String, String)>,
}

/// The verify tool's runtime and selftest levels in the image, with the GPUs and no
/// network; its report is `verify-gpus.json` in `report_dir`.
fn verify_gpu_levels(
    ctx: &Ctx,
    settings: &Settings,
    image: &Image,
    python_full: &str,
    report_dir: &Path,
    say: &dyn Fn(&str),
) -> Result<GpuLevels> {
    let site = image_site_packages(python_full);
    // The same expectations as the static level's, as the verify tool's flags.
    let expect = image_expectations(settings, &site)?;
    let mut argv: Vec<String> = vec![
        "run".into(),
        "--rm".into(),
        "--network=none".into(),
        "--entrypoint".into(),
        format!("{IMAGE_BIN}/commstack-verify"),
        "--gpus".into(),
        "all".into(),
    ];
    argv.push(image.id().to_string());
    argv.extend(
        [
            "--python",
            &format!("{IMAGE_VENV}/bin/python"),
            "--level",
            "runtime,selftest",
            "--json",
            "--quiet",
            "--report",
            "/tmp/commstack-verify",
        ]
        .map(String::from),
    );
    argv.extend(commstack_verify::cli::expect_args(&expect));
    argv.extend([
        "--selftest".into(),
        format!("{IMAGE_BIN}/commstack-selftest"),
    ]);
    if !ctx.quiet {
        eprintln!("verify in the image: docker {}", argv.join(" "));
    }
    let out = Command::new("docker")
        .args(&argv)
        .output()
        .context("cannot run `docker run`: is Docker installed and its daemon running?")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report_file = report_dir.join("verify-gpus.json");
    commstack_store::write_all_atomically(&[(&report_file, &stdout)])?;
    let code = out.status.code().unwrap_or(1);
    let value: Option<serde_json::Value> = serde_json::from_str(&stdout).ok();
    let levels = match &value {
        Some(v) => print_verdicts(v, say),
        None => bail!(
            "the verify tool in the image gave no report (exit {code}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    };
    say(&format!(
        "verify report: {} (exit {code})",
        report_file.display()
    ));
    Ok(GpuLevels {
        code,
        report: report_file,
        levels,
    })
}

/// `import torch` inside the image with no network and no GPU: the Python side that needs
/// no driver. (deep_ep's extension needs the driver's libcuda.so.1: `--gpus`.) Started
/// here, its verdict taken by [`finish_import_without_gpu`].
fn start_import_without_gpu(image: &Image) -> Result<std::process::Child> {
    // A clean import warns of nothing: verify's runtime probe and this check import
    // through the same Python (commstack_verify::runtime::IMPORT_CHECK_PY); every warning
    // is recorded, printed, and fails the step (exit 3).
    python_without_gpu(image, IMPORT_CHECK_PY)
        .arg("torch")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot run `docker run`")
}

fn finish_import_without_gpu(
    child: std::process::Child,
    report_dir: &Path,
    say: &dyn Fn(&str),
) -> Result<bool> {
    let out = child
        .wait_with_output()
        .context("docker run (import torch)")?;
    let file = report_dir.join("import-torch.txt");
    let text = keep_output(&out, &file)?;
    let ok = out.status.success();
    let stdout = String::from_utf8_lossy(&out.stdout);
    say(&format!(
        "import torch (no GPU, no network): {} {}",
        if ok { "passed" } else { "FAILED" },
        stdout.lines().last().unwrap_or("").trim()
    ));
    if !ok {
        if out.status.code() == Some(3) {
            say("  `import torch` warned: a clean import warns of nothing");
            if text.contains(NUMPY_MISSING) {
                say(&format!("  {NUMPY_MISSING_FIX}"));
            }
        }
        say(&format!("  output: {}", file.display()));
    }
    Ok(ok)
}
