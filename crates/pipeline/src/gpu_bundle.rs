//! `gpu-bundle DIR`: everything a GPU machine with no Rust toolchain and no network needs
//! to run the GPU checks in `gpu/run.sh`: release binaries built here, the locked sources
//! from the cache (or a mirror), optional rdma-core headers, and the resolved settings the
//! GPU side must build and verify with (`build-flags`, `verify-flags`), so that an override
//! given here (`--cuda-archs`, `--no-ibgda`) is what is built and expected there; and the
//! image's doctor with the expectations an image of these settings carries
//! (`bin/commstack-doctor`, `preflight.json`: the preflight run against the GPU host).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use commstack_steps::ctx::Ctx;
use commstack_steps::flow::fetch::base_options;
use commstack_steps::flow::kernels::nvshmem_prefix;
use commstack_steps::flow::lock::{artifacts_of_parts, read_lock};
use commstack_steps::flow::toolchain::resolve;
use commstack_steps::options::BuildOptions;
use commstack_steps::options::Part;
use commstack_steps::settings::Settings;
use commstack_tools::{NvshmemForKernels, build_selftest};

/// What travels to a GPU machine is limited (64 MiB for the device tool here); stay under.
const LIMIT: u64 = 60 * 1024 * 1024;

/// What `gpu-bundle` is asked for.
pub struct GpuBundleRequest {
    /// The bundle directory (replaced whole at the end).
    pub dir: PathBuf,
    /// The NVSHMEM install the self-test compiles against (None: NVIDIA's wheel of
    /// torch's pin).
    pub nvshmem: Option<PathBuf>,
    /// Leave the self-test out (no CUDA compile).
    pub no_selftest: bool,
    /// The build settings: the GPU side builds and verifies with the same (its stack
    /// file, plus the overrides resolved here). `fetch` gives the sources' mirrors,
    /// `rdma_core` a `dpkg -x` tree of libibverbs-dev + ibverbs-providers to ship.
    pub build: BuildOptions,
}

/// The settings the GPU side reads from the bundle: flags for `xtask build nvshmem` and for
/// `xtask verify`, one per line in `build-flags` and `verify-flags`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BundleSettings {
    pub build_flags: Vec<String>,
    pub verify_flags: Vec<String>,
}

/// From the resolved settings: the archs and IBGDA built (an override included), and
/// what verify must find (the expectations the image's verify uses, but the NVSHMEM
/// prefix, which is the GPU machine's environment's).
pub fn bundle_settings(settings: &Settings) -> Result<BundleSettings> {
    let archs: Vec<String> = settings.cuda_archs.iter().map(|a| a.cmake()).collect();
    let mut build_flags = vec!["--cuda-archs".to_string(), archs.join(",")];
    if !settings.nvshmem.switches.is_on("ibgda") {
        build_flags.push("--no-ibgda".into());
    }
    let mut expect =
        commstack_steps::flow::verify_report::image_expectations(settings, Path::new("/"))?;
    expect.nvshmem_prefix = None;
    Ok(BundleSettings {
        build_flags,
        verify_flags: commstack_verify::cli::expect_args(&expect),
    })
}

/// Makes the bundle: every input checked (and the sources fetched) before the long release
/// builds, so a missing one fails in seconds; written beside `dir` and renamed over it at
/// the end, so a failure leaves no half bundle.
pub fn gpu_bundle(ctx: &Ctx, req: &GpuBundleRequest) -> Result<()> {
    let settings = Settings::resolve(ctx, &req.build)?;
    settings.print_notes();
    let dir = std::path::absolute(&req.dir)?;
    if let Some(rdma) = &req.build.rdma_core
        && !rdma.join("usr/include/infiniband/mlx5dv.h").is_file()
    {
        bail!(
            "--rdma-core {} has no usr/include/infiniband/mlx5dv.h: give a `dpkg -x` tree of libibverbs-dev and ibverbs-providers (see gpu/README.md)",
            rdma.display()
        );
    }
    let artifacts = artifacts_of_parts(&read_lock(ctx)?, &[Part::Sources])?;
    let fetch = &req.build.fetch;
    let options = base_options(ctx, &fetch.mirror, fetch.offline, fetch.accept_tree_match)?;
    let fetched = commstack_fetch::fetch_all(&artifacts, &options).context(
        "the locked sources: give the mirror that holds them (--mirror DIR --accept-tree-match, see gpu/README.md)",
    )?;
    let selftest = match req.no_selftest {
        true => None,
        false => Some((
            resolve(ctx, &req.build.toolchain, false, &|l| ctx.say(l))?,
            nvshmem_prefix(ctx, req.nvshmem.as_deref())?,
        )),
    };
    let name = dir
        .file_name()
        .context("the bundle directory has no name")?;
    let temp = dir.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = Bundle {
        ctx,
        settings: &settings,
        dir: &temp,
        rdma_core: req.build.rdma_core.as_deref(),
    }
    .write(&fetched, selftest);
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&temp);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    std::fs::rename(&temp, &dir)
        .with_context(|| format!("renaming {} to {}", temp.display(), dir.display()))?;
    commstack_steps::out!("bundle {} ready", dir.display());
    Ok(())
}

struct Bundle<'a> {
    ctx: &'a Ctx,
    settings: &'a Settings,
    dir: &'a Path,
    rdma_core: Option<&'a Path>,
}

impl Bundle<'_> {
    fn write(
        &self,
        fetched: &[commstack_fetch::Fetched],
        selftest: Option<(commstack_toolchain::Toolchain, NvshmemForKernels)>,
    ) -> Result<()> {
        let dir = self.dir;
        std::fs::create_dir_all(dir.join("bin"))?;
        let sh = Shell::new()?;
        sh.change_dir(commstack_tools::workspace_root());
        let mut manifest = serde_json::Map::new();

        commstack_steps::out!("building xtask (release)");
        cmd!(sh, "cargo build --release --locked -p xtask")
            .run()
            .context("building xtask")?;
        copy_stripped(
            &sh,
            &commstack_tools::cargo_target_dir().join("release/xtask"),
            &dir.join("bin/xtask"),
        )?;
        if let Some((tc, nvshmem)) = selftest {
            let store = commstack_store::Store::open(self.ctx.store_dir())?;
            let bin = build_selftest(
                &store,
                (!self.ctx.quiet).then_some(&|l: &str| self.ctx.say(l)),
                &tc.nvcc,
                &nvshmem,
                &self.settings.cuda_archs,
            )?;
            copy_stripped(&sh, &bin, &dir.join("bin/commstack-selftest"))?;
            manifest.insert("selftest-nvshmem".into(), nvshmem.describe.clone().into());
            manifest.insert("toolchain".into(), tc.describe().into());
        }
        // The doctor the image carries, and the expectations the image would carry for
        // these settings: gpu/run.sh's doctor step runs its preflight against the host.
        let store = commstack_store::Store::open(self.ctx.store_dir())?;
        let doctor = commstack_tools::build_doctor_tool(
            &store,
            (!self.ctx.quiet).then_some(&|l: &str| self.ctx.say(l)),
            &commstack_tools::workspace_root(),
            false,
        )?;
        std::fs::copy(&doctor.path, dir.join("bin/commstack-doctor"))
            .with_context(|| format!("copying {}", doctor.path.display()))?;
        let expectations =
            commstack_steps::flow::image::preflight_expectations(self.settings)?.to_json();
        std::fs::write(dir.join("preflight.json"), expectations)
            .with_context(|| format!("writing {}", dir.join("preflight.json").display()))?;
        let settings = bundle_settings(self.settings)?;
        for (file, flags) in [
            ("build-flags", &settings.build_flags),
            ("verify-flags", &settings.verify_flags),
        ] {
            std::fs::write(dir.join(file), flags.join("\n") + "\n")
                .with_context(|| format!("writing {}", dir.join(file).display()))?;
        }
        manifest.insert("settings".into(), serde_json::to_value(&settings)?);

        // The locked sources, named as the lock names them (what `--mirror DIR` reads).
        std::fs::create_dir_all(dir.join("mirror"))?;
        for f in fetched {
            if let Some(d) = f.deviation() {
                commstack_steps::out!("WARNING {d}");
            }
            std::fs::copy(&f.path, dir.join("mirror").join(&f.filename))
                .with_context(|| format!("copying {}", f.path.display()))?;
        }
        manifest.insert("sources".into(), serde_json::to_value(fetched)?);
        if let Some(rdma) = self.rdma_core {
            commstack_archive::copy_tree(rdma, &dir.join("rdma-core"))?;
        }
        let total = binaries_into(dir, &mut manifest)?;
        std::fs::write(
            dir.join("bundle.json"),
            serde_json::to_string_pretty(&manifest)?,
        )?;
        commstack_steps::out!("bundle: {}", commstack_steps::util::human(total));
        if total > LIMIT {
            bail!(
                "the bundle is {} MiB, over the {} MiB a GPU run can carry",
                total >> 20,
                LIMIT >> 20
            );
        }
        Ok(())
    }
}

/// The sha256 of every binary under `dir/bin` into `manifest`; the bundle's total bytes.
fn binaries_into(
    dir: &Path,
    manifest: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<u64> {
    let mut total = 0u64;
    let mut files = serde_json::Map::new();
    for entry in walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
    {
        total += entry.metadata()?.len();
        if entry.path().starts_with(dir.join("bin")) {
            files.insert(
                entry.path().strip_prefix(dir)?.display().to_string(),
                commstack_digest::sha256_file(entry.path())?.into(),
            );
        }
    }
    manifest.insert("binaries".into(), files.into());
    manifest.insert("bytes".into(), total.into());
    Ok(total)
}

fn copy_stripped(sh: &Shell, from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    // Debug info is most of a release binary's size and useless on the GPU machine.
    cmd!(sh, "strip {to}")
        .run()
        .context("strip (binutils) is needed to make the bundle small")?;
    Ok(())
}
