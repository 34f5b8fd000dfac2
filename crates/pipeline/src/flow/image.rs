//! The image's steps of the graph: the base from the locked .debs (fetch cache), the
//! self-test and verify tools, the image step (`commstack_image`), `docker load`, what runs
//! in the loaded image with no network (`import torch`; verify's GPU levels), and on
//! request the OCI layout and the `docker build` context. Nothing here opens a network
//! connection.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_image::{EarlyLoad, Image, ImageInputs, Tool};
use commstack_store::{StepKey, Store};
use xshell::{Shell, cmd};

use crate::ctx::Ctx;
use crate::settings::Settings;
use crate::util::human;

/// Where the image's own files are (see docs/image.md).
const IMAGE_BIN: &str = "/opt/commstack/bin";
pub(crate) const IMAGE_VENV: &str = "/opt/commstack/venv";

/// The base from the locked .debs in the download cache (mmdebstrap, in the store).
pub fn base_step(
    ctx: &Ctx,
    settings: &Settings,
    force: bool,
    say: &dyn Fn(&str),
) -> Result<commstack_base::BaseOutput> {
    let lock = &settings.lock;
    let base_lock = lock.base.clone().with_context(|| {
        format!(
            "{}: no [base] section although the stack has [image]: run `cargo xtask{} lock`",
            ctx.lock_path().display(),
            ctx.stack_flag()
        )
    })?;
    let store = Store::open(ctx.store_dir())?;
    let cache = commstack_fetch::Cache::new(ctx.cache_dir());
    let mut debs = Vec::new();
    let mut missing = Vec::new();
    for deb in &lock.debs {
        let file = deb.filename.rsplit('/').next().unwrap_or(&deb.filename);
        match cache.get(&deb.sha256, file)? {
            Some(path) => debs.push((deb, path)),
            None => missing.push(format!("{} {}", deb.name, deb.version)),
        }
    }
    if !missing.is_empty() {
        bail!(
            "{} of the base's {} .deb files are not in the cache ({}): run `cargo xtask{} fetch --only debs`",
            missing.len(),
            lock.debs.len(),
            missing.join(", "),
            ctx.stack_flag()
        );
    }
    let base = commstack_base::build_base(
        &store,
        &commstack_base::BaseInputs {
            base: &base_lock,
            debs,
        },
        force,
        |line| say(&format!("base: {line}")),
    )?;
    say(&format!(
        "base: {} ({} packages, {}){}",
        base.dir.display(),
        base.manifest.packages.len(),
        human(base.manifest.layer.size),
        if base.outcome.was_cached() {
            ", cached"
        } else {
            ""
        }
    ));
    Ok(base)
}

/// The self-test built against the NVSHMEM install at `nvshmem_prefix`, reproducibly and
/// stripped, in the store for the image. Its RUNPATH finds NVSHMEM where the image has it:
/// the drop-in wheel in the venv's site-packages.
pub fn selftest_tool(
    ctx: &Ctx,
    settings: &Settings,
    toolchain: &crate::options::ToolchainChoice,
    nvshmem_prefix: PathBuf,
) -> Result<Tool> {
    selftest_tool_forced(ctx, settings, toolchain, nvshmem_prefix, false)
}

/// [`selftest_tool`], built again even when the store has it when `force` (the graph's
/// `--force`, and `build --check`, whose store links to the first build's steps).
pub fn selftest_tool_forced(
    ctx: &Ctx,
    settings: &Settings,
    toolchain: &crate::options::ToolchainChoice,
    nvshmem_prefix: PathBuf,
    force: bool,
) -> Result<Tool> {
    let tc = crate::flow::toolchain::resolve(ctx, toolchain, false)?;
    let built = crate::flow::kernels::selftest_step(
        ctx,
        &crate::flow::kernels::SelftestBuild {
            root: &crate::util::workspace_root(),
            nvcc: &tc.nvcc,
            nvshmem: &crate::flow::kernels::NvshmemForKernels {
                describe: format!("the stack's NVSHMEM at {}", nvshmem_prefix.display()),
                prefix: nvshmem_prefix,
            },
            archs: &settings.cuda_archs,
            runpath: vec![image_nvshmem_runpath(settings.stack.target.python)],
            force,
        },
    )?;
    Ok(built.tool())
}

/// The RUNPATH entry from the image's tools to its NVSHMEM, the drop-in wheel's
/// `nvidia/nvshmem/lib` in the venv (`$ORIGIN/../venv/lib/python3.11/...`), so that the
/// self-test needs no LD_LIBRARY_PATH there.
pub fn image_nvshmem_runpath(python: (u64, u64)) -> String {
    let lib = format!(
        "{IMAGE_VENV}/lib/python{}.{}/site-packages/nvidia/nvshmem/lib",
        python.0, python.1
    );
    format!(
        "$ORIGIN/{}",
        relative_to(Path::new(IMAGE_BIN), Path::new(&lib))
    )
}

/// `to` relative to the directory `from`, both absolute and without `..`.
fn relative_to(from: &Path, to: &Path) -> String {
    let (a, b): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = vec!["..".to_string(); a.len() - common];
    parts.extend(
        b[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// The verify tool, built reproducibly and stripped into the store for the image.
pub fn verify_tool(ctx: &Ctx) -> Result<Tool> {
    verify_tool_forced(ctx, false)
}

/// [`verify_tool`], built again even when the store has it when `force` (as
/// [`selftest_tool_forced`]).
pub fn verify_tool_forced(ctx: &Ctx, force: bool) -> Result<Tool> {
    Ok(build_verify_tool(ctx, &crate::util::workspace_root(), force)?.tool())
}

/// The image step (its layers reused when their inputs are unchanged), printed.
pub fn image_step(
    ctx: &Ctx,
    settings: &Settings,
    say: &dyn Fn(&str),
    base_dir: &Path,
    wheelhouse_dir: &Path,
    tools: Vec<Tool>,
    force: bool,
) -> Result<Image> {
    let image_settings = settings.stack.image.clone().with_context(|| {
        format!(
            "{}: no [image] section, so this stack is not made into an image (the default \
             stack.toml has one: `cargo xtask build image` with no --stack). Add an [image] \
             section (docs/image.md) and run `cargo xtask lock`",
            settings.stack.path().display()
        )
    })?;
    let store = Store::open(ctx.store_dir())?;
    let (source_url, revision) = git_identity();
    let image = commstack_image::assemble_image_reporting(
        &store,
        &ImageInputs {
            lock: settings.lock.clone(),
            lock_path: ctx.lock_path(),
            lock_sha256: settings.lock_sha256.clone(),
            base_dir: base_dir.to_path_buf(),
            wheelhouse_dir: wheelhouse_dir.to_path_buf(),
            tools,
            name: image_settings.name.clone(),
            user: image_settings.user.clone(),
            source_url,
            revision,
            large_wheel_bytes: commstack_image::LARGE_WHEEL_BYTES,
        },
        force,
        say,
    )?;
    print_image(&image);
    Ok(image)
}

/// The image in Docker under its tag (loaded unless Docker has it), finishing the load
/// `early` started while the image was pulled, where there is one.
pub fn load_step(image: &Image, early: Option<EarlyLoad>) -> Result<String> {
    let t = Instant::now();
    let loaded = commstack_image::docker_load_with(image, early)?;
    if let Some(why) = &loaded.fallback {
        crate::out!("the load begun during the pull failed ({why}); loaded again from the store");
    }
    let early = match loaded.early {
        0 => String::new(),
        n => format!(", {n} of them during the pull"),
    };
    let sent = match (loaded.sent, loaded.kept) {
        (0, 0) => "Docker had it".to_string(),
        (sent, 0) => format!("{sent} layers sent{early}"),
        (sent, kept) => format!("{sent} layers sent{early}, {kept} Docker had"),
    };
    crate::out!(
        "loaded: {} as {} ({sent}; {:.1} s)",
        loaded.id,
        image.tag(),
        t.elapsed().as_secs_f64()
    );
    Ok(loaded.id)
}

/// The image's layer tars, as the binary cache lands them, into a `docker load` started
/// then ([`EarlyLoad`]): Docker unpacks them while the rest of the image downloads, and
/// the load step finishes that load instead of starting one after the pull. Armed only
/// for a run that pulls the image step and then loads it.
#[derive(Default)]
pub struct EarlyLoadFeed {
    armed: std::sync::atomic::AtomicBool,
    load: std::sync::Mutex<Option<EarlyLoad>>,
}

impl EarlyLoadFeed {
    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The layer tar of `diff_id` is whole at `path`: into the load (started by the first
    /// one). A load that cannot start or take it is dropped, said, and the load step loads
    /// the usual way.
    pub fn landed(&self, diff_id: &str, path: &Path, say: &dyn Fn(&str)) {
        if !self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        let sent = match &*load {
            Some(early) => early.layer(diff_id, path),
            None => EarlyLoad::start().and_then(|early| {
                say("docker load started: the layers go into it as they arrive");
                early.layer(diff_id, path)?;
                *load = Some(early);
                Ok(())
            }),
        };
        if let Err(err) = sent {
            say(&format!(
                "the early docker load stopped ({err:#}): the load step loads the image after the pull"
            ));
            *load = None;
            self.armed.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// The load started, for the load step to finish.
    pub fn take(&self) -> Option<EarlyLoad> {
        self.load.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Whether Docker has the image `id` under `tag` (`docker image inspect`).
pub fn docker_has(id: &str, tag: &str) -> bool {
    Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}} {{json .RepoTags}}",
            id,
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            let text = String::from_utf8_lossy(&o.stdout);
            text.starts_with(id) && text.contains(&format!("\"{tag}\""))
        })
}

/// `--oci DIR` and `--context DIR`: the image as an OCI layout, and docker/Dockerfile's
/// build context.
pub fn export(
    store: &commstack_store::Store,
    image: &Image,
    oci: Option<&Path>,
    context: Option<&Path>,
) -> Result<()> {
    if let Some(dir) = oci {
        let oci = commstack_image::export_oci(image, dir, Some(store))?;
        crate::out!(
            "OCI layout: {} (manifest {})",
            dir.display(),
            oci.manifest_digest
        );
    }
    if let Some(dir) = context {
        let context = commstack_image::write_docker_context(image, dir)?;
        crate::out!(
            "docker build context: {} (base {}): DOCKER_BUILDKIT=0 docker build -f docker/Dockerfile $(cat {}/build-args) -t NAME {}",
            dir.display(),
            context.base_tag,
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The verify tool for inside the image: a release build of `commstack-verify` from the
/// workspace at `root`.
pub(crate) fn build_verify_tool(ctx: &Ctx, root: &Path, force: bool) -> Result<OwnTool> {
    own_tool(ctx, &verify_recipe(root, force))
}

/// How [`build_verify_tool`] builds: the crate alone, nothing outside the workspace.
pub(crate) fn verify_recipe(root: &Path, force: bool) -> ToolRecipe<'_> {
    ToolRecipe {
        root,
        package: "commstack-verify",
        bin: "commstack-verify",
        dir: "crates/verify",
        links: Vec::new(),
        env: Vec::new(),
        inputs: serde_json::Value::Null,
        force,
    }
}

/// One of our stripped binaries in the store, as the image step takes it.
pub fn tool_at(name: &str, version: &str, host_path: PathBuf, source: String) -> Tool {
    Tool {
        name: name.to_string(),
        version: version.to_string(),
        image_path: format!("{IMAGE_BIN}/{name}"),
        host_path,
        source,
    }
}

/// Bumped when [`own_tool`] changes what it produces.
const TOOL_RECIPE: &str = "reproducible-tool-1";

/// How one of our binaries is built by [`own_tool`].
pub(crate) struct ToolRecipe<'a> {
    /// The workspace whose sources are built (a copy is built, never this tree).
    pub root: &'a Path,
    pub package: &'a str,
    pub bin: &'a str,
    /// The package's directory in `root`: its sources and those of the workspace crates
    /// it depends on are hashed into the key.
    pub dir: &'a str,
    /// Links made in the build directory, `(name, target)`: what the build reads outside
    /// the workspace (a toolchain, a library), seen at a fixed path. Each target's
    /// identity (not its path) must be in `inputs`.
    pub links: Vec<(&'a str, PathBuf)>,
    /// Environment of the build; `{build}` in a value stands for the build directory.
    pub env: Vec<(&'a str, String)>,
    /// Everything else the bytes depend on (toolchain, libraries, options).
    pub inputs: serde_json::Value,
    /// Build even when the store has the key.
    pub force: bool,
}

/// A binary [`own_tool`] made: stripped, in the store.
pub struct OwnTool {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    /// Reused from the store (nothing was built).
    pub cached: bool,
    pub package: String,
}

impl OwnTool {
    pub fn tool(&self) -> Tool {
        tool_at(
            &self.name,
            env!("CARGO_PKG_VERSION"),
            self.path.clone(),
            format!(
                "cargo build --release -p {} in {}, stripped (sha256 {})",
                self.package,
                tool_build_dir(&self.name).display(),
                self.sha256
            ),
        )
    }
}

/// Environment variables the tool builds keep from ours: what cargo and rustup need to
/// find the toolchain and the registry, and the number of jobs. Everything else (RUSTFLAGS,
/// CFLAGS, CC, NVCC_*, CARGO_PROFILE_*, LANG, TZ, SOURCE_DATE_EPOCH, ...) is dropped: it
/// could change the bytes without changing the key.
const TOOL_ENV_KEPT: &[&str] = &[
    "PATH",
    "HOME",
    "TMPDIR",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "CARGO_BUILD_JOBS",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];
/// Prefixes of the cargo variables kept: the network and registry settings, the terminal.
const TOOL_ENV_KEPT_PREFIXES: &[&str] = &[
    "CARGO_HTTP_",
    "CARGO_NET_",
    "CARGO_REGISTRIES_",
    "CARGO_REGISTRY_",
    "CARGO_TERM_",
];
/// Files of the workspace root a build reads besides the members (Cargo.toml and
/// Cargo.lock are in the sources hash).
const WORKSPACE_CONFIG: &[&str] = &[
    "rust-toolchain.toml",
    "rust-toolchain",
    ".cargo/config.toml",
    ".cargo/config",
];

/// Builds `recipe.bin` so that the same inputs give the same bytes on any machine, and
/// keeps it stripped in a store step keyed by those inputs.
///
/// What a cargo build records and how each is made constant: the build runs in a copy of
/// the workspace at a fixed path ([`FixedDir`]: nvcc hashes each source's absolute path
/// into module ids; rustc records the paths of the workspace, the target directory and
/// the registry in panic messages), with CARGO_HOME seen through a link in it and
/// `--remap-path-prefix` for the three; the environment is cleared but for
/// [`TOOL_ENV_KEPT`], with `LC_ALL=C` and `TZ=UTC`; the binary is stripped and given mode
/// 0755 whatever the umask. The key holds the sources' hash, rustc, cargo, the host
/// compilers, strip and `recipe.inputs`, never a path of this machine.
///
/// [`FixedDir`]: commstack_store::FixedDir
pub(crate) fn own_tool(ctx: &Ctx, recipe: &ToolRecipe) -> Result<OwnTool> {
    let (key, inputs) = tool_key(recipe)?;
    let store = Store::open(ctx.store_dir())?;
    let outcome = store.run(&key, &inputs, recipe.force, |dir| {
        build_tool_at_fixed_path(ctx, recipe, &kept_env(), &dir.out)
    })?;
    let path = outcome.path().join(recipe.bin);
    let sha256 = commstack_digest::sha256_file(&path)
        .with_context(|| format!("hashing {}", path.display()))?;
    Ok(OwnTool {
        name: recipe.bin.to_string(),
        path,
        sha256,
        cached: outcome.was_cached(),
        package: recipe.package.to_string(),
    })
}

/// [`own_tool`]'s store key and its inputs: no path of this machine in them.
/// The store step name of a tool this workspace builds (the self-test, the verify tool).
pub(crate) const TOOL_STEP: &str = "tool";

pub(crate) fn tool_key(recipe: &ToolRecipe) -> Result<(StepKey, serde_json::Value)> {
    let root = recipe.root;
    let env = kept_env();
    let probe = |program: &str, args: &[&str]| -> Result<String> {
        let out = Command::new(program)
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(root)
            .output()
            .with_context(|| format!("cannot run {program}"))?;
        if !out.status.success() {
            bail!(
                "`{program} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let first_line = |program: &str| -> Result<String> {
        Ok(probe(program, &["--version"])?
            .lines()
            .next()
            .unwrap_or_default()
            .to_string())
    };
    let mut config = serde_json::Map::new();
    for file in WORKSPACE_CONFIG {
        let path = root.join(file);
        if path.is_file() {
            config.insert(
                file.to_string(),
                commstack_digest::sha256_file(&path)
                    .with_context(|| format!("hashing {}", path.display()))?
                    .into(),
            );
        }
    }
    let inputs = serde_json::json!({
        "recipe": TOOL_RECIPE,
        "package": recipe.package,
        "bin": recipe.bin,
        "sources": crate::stack_steps::sources_hash(root, recipe.dir)?,
        "workspace_config": config,
        "rustc": probe("rustc", &["-vV"])?,
        "cargo": probe("cargo", &["-V"])?,
        // The linker rustc calls, and nvcc's host compilers.
        "cc": first_line("cc")?,
        "gcc": first_line("gcc")?,
        "g++": first_line("g++")?,
        "strip": first_line("strip")
            .context("strip (binutils) is needed for the image's binaries")?,
        "inputs": recipe.inputs,
    });
    Ok((StepKey::new(TOOL_STEP, &inputs), inputs))
}

/// Our environment, filtered to [`TOOL_ENV_KEPT`] and [`TOOL_ENV_KEPT_PREFIXES`].
fn kept_env() -> Vec<(String, std::ffi::OsString)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
        .filter(|(k, _)| {
            TOOL_ENV_KEPT.contains(&k.as_str())
                || TOOL_ENV_KEPT_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .collect()
}

/// The key of the fixed directory `bin` is built in: one per tool (not per input), so that
/// the path, and what nvcc records of it (nvlink's `-L` options, in the device code), stay
/// the same when an unrelated input changes. Builds of one tool take turns.
fn tool_build_key(bin: &str) -> StepKey {
    StepKey::new(
        &format!("tool-{bin}"),
        &serde_json::json!({ "recipe": TOOL_RECIPE }),
    )
}

/// Where [`own_tool`] builds `bin`: `/var/tmp/commstack-build/tool-<bin>-<hash>`, the same on
/// every machine.
pub(crate) fn tool_build_dir(bin: &str) -> PathBuf {
    Path::new(commstack_store::FIXED_BUILD_ROOT).join(tool_build_key(bin).dir_name())
}

/// [`own_tool`]'s build: the workspace copied into the fixed directory, built there, the
/// binary stripped into `out`.
fn build_tool_at_fixed_path(
    ctx: &Ctx,
    recipe: &ToolRecipe,
    env: &[(String, std::ffi::OsString)],
    out: &Path,
) -> Result<()> {
    let fixed = commstack_store::FixedDir::acquire(&tool_build_key(recipe.bin))?;
    let build = fixed.path();
    let (src, target, cargo_home) = (
        build.join("src"),
        build.join("target"),
        build.join("cargo-home"),
    );
    copy_workspace(recipe.root, &src)?;
    let real_cargo_home = match std::env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => dirs::home_dir()
            .context("no CARGO_HOME and no home directory")?
            .join(".cargo"),
    };
    let mut links = vec![("cargo-home", real_cargo_home)];
    links.extend(recipe.links.iter().cloned());
    for (name, to) in &links {
        let to = std::path::absolute(to)?;
        std::os::unix::fs::symlink(&to, build.join(name)).with_context(|| {
            format!(
                "cannot link {} to {}",
                build.join(name).display(),
                to.display()
            )
        })?;
    }
    if !ctx.quiet {
        eprintln!(
            "building {} (release) in {} ...",
            recipe.bin,
            build.display()
        );
    }
    // Later prefixes win in rustc: the specific ones come last.
    let rustflags = format!(
        "--remap-path-prefix={}=/build --remap-path-prefix={}=/commstack \
         --remap-path-prefix={}=/target --remap-path-prefix={}=/cargo",
        build.display(),
        src.display(),
        target.display(),
        cargo_home.display()
    );
    let mut cargo = Command::new("cargo");
    cargo
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            recipe.package,
            "--bin",
            recipe.bin,
        ])
        .current_dir(&src)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("CARGO_HOME", &cargo_home)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_INCREMENTAL", "0")
        .env("RUSTFLAGS", rustflags)
        .env("LC_ALL", "C")
        .env("TZ", "UTC");
    if ctx.quiet {
        cargo.arg("--quiet");
    }
    for (name, value) in &recipe.env {
        cargo.env(name, value.replace("{build}", &build.display().to_string()));
    }
    let status = cargo
        .status()
        .with_context(|| format!("cannot run cargo to build {}", recipe.bin))?;
    if !status.success() {
        bail!(
            "building {} failed ({status}); its build directory was {}",
            recipe.bin,
            build.display()
        );
    }
    let to = out.join(recipe.bin);
    let built = target.join("release").join(recipe.bin);
    std::fs::copy(&built, &to).with_context(|| format!("copying {}", built.display()))?;
    let sh = Shell::new()?;
    cmd!(sh, "strip {to}")
        .run()
        .context("strip (binutils) is needed for the image's binaries")?;
    // Not the umask's mode: the store's copy is what the image ships.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot set the mode of {}", to.display()))?;
    Ok(())
}

/// The workspace at `root` as cargo reads it, into `dest`: the root's Cargo.toml and
/// Cargo.lock, [`WORKSPACE_CONFIG`], and every member (cargo loads each member's manifest
/// even to build one), without their `target` directories.
pub(crate) fn copy_workspace(root: &Path, dest: &Path) -> Result<()> {
    let manifest = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("cannot read {}", manifest.display()))?;
    let toml: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not TOML", manifest.display()))?;
    let patterns = toml
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .with_context(|| format!("{} has no [workspace] members", manifest.display()))?;
    let mut members = Vec::new();
    for pattern in patterns.iter().filter_map(|p| p.as_str()) {
        match pattern.strip_suffix("/*") {
            Some(parent) => {
                let dir = root.join(parent);
                let mut found: Vec<String> = std::fs::read_dir(&dir)
                    .with_context(|| format!("cannot read {}", dir.display()))?
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().join("Cargo.toml").is_file())
                    .map(|e| format!("{parent}/{}", e.file_name().to_string_lossy()))
                    .collect();
                found.sort();
                members.extend(found);
            }
            None if pattern.contains('*') => bail!(
                "{}: the member pattern {pattern:?} is not `dir` or `dir/*`, which is all the \
                 tool build copies",
                manifest.display()
            ),
            None => members.push(pattern.to_string()),
        }
    }
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    for file in ["Cargo.toml", "Cargo.lock"].iter().chain(WORKSPACE_CONFIG) {
        let from = root.join(file);
        if from.is_file() {
            let to = dest.join(file);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    for member in &members {
        let to = dest.join(member);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        commstack_archive::copy_tree_except(&root.join(member), &to, |rel| {
            rel.file_name()
                .is_some_and(|n| n == "target" || n == ".git")
        })?;
    }
    Ok(())
}

/// The repository's origin URL (credentials removed; a local path or another non-URL
/// origin is left out: it names a host's directory) and commit, for the image's labels.
pub fn git_identity() -> (String, String) {
    let git = |args: &[&str]| -> String {
        Command::new("git")
            .args(args)
            .current_dir(crate::util::workspace_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let origin = url::Url::parse(&git(&["remote", "get-url", "origin"]))
        .ok()
        .filter(|u| matches!(u.scheme(), "https" | "http" | "ssh" | "git"))
        .map(|mut u| {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        })
        .unwrap_or_default();
    (origin, git(&["rev-parse", "HEAD"]))
}

fn print_image(image: &Image) {
    let m = &image.manifest;
    let total: u64 = m.layers.iter().map(|l| l.size).sum();
    crate::out!(
        "image: {}{}",
        image.id(),
        if image.cached { " (cached)" } else { "" }
    );
    crate::out!("tag:   {}", image.tag());
    crate::out!("size:  {} in {} layers", human(total), m.layers.len());
    for (i, l) in m.layers.iter().enumerate() {
        crate::out!("  {i:>2} {:>10}  {}", human(l.size), l.holds);
    }
    crate::out!(
        "files: {} (image.json, config.json, sbom.spdx.json, provenance.json)",
        image.dir.display()
    );
}

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
}

/// `<home>/reports/image-<first 12 hex of the ID>/`: the image's verify reports (what
/// `push` attaches).
pub fn report_dir(ctx: &Ctx, image: &Image) -> PathBuf {
    let hex = image.id().trim_start_matches("sha256:");
    ctx.home
        .join("reports")
        .join(format!("image-{}", &hex[..12.min(hex.len())]))
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
        )),
        false => None,
    };
    let imports = finish_import_without_gpu(import, &report_dir)?;
    let import_file = report_dir.join("import-torch.txt");
    let Some(gpu_levels) = gpu_levels else {
        return Ok(RuntimeVerdict {
            exit: u8::from(!imports),
            report: import_file,
            levels: Vec::new(),
            import_torch: imports,
        });
    };
    let GpuLevels {
        code,
        report,
        levels,
    } = gpu_levels?;
    Ok(RuntimeVerdict {
        exit: match (code, imports) {
            (0, true) => 0,
            (c, true) => u8::try_from(c).unwrap_or(1),
            (_, false) => 1,
        },
        report,
        levels,
        import_torch: imports,
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
) -> Result<GpuLevels> {
    let site = crate::flow::verify_static::image_site_packages(python_full);
    // The same expectations as the static level's, as the verify tool's flags.
    let expect = crate::flow::verify_static::image_expectations(settings, &site)?;
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
    crate::util::write_all_atomically(&[(&report_file, &stdout)])?;
    let code = out.status.code().unwrap_or(1);
    let value: Option<serde_json::Value> = serde_json::from_str(&stdout).ok();
    let levels = match &value {
        Some(v) => print_verdicts(v),
        None => bail!(
            "the verify tool in the image gave no report (exit {code}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    };
    crate::out!("verify report: {} (exit {code})", report_file.display());
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
    let script = "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda}))";
    Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network=none",
            "-e",
            "CUDA_VISIBLE_DEVICES=",
        ])
        .args(["--entrypoint", &format!("{IMAGE_VENV}/bin/python")])
        .args([image.id(), "-c", script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot run `docker run`")
}

fn finish_import_without_gpu(child: std::process::Child, report_dir: &Path) -> Result<bool> {
    let out = child
        .wait_with_output()
        .context("docker run (import torch)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let file = report_dir.join("import-torch.txt");
    crate::util::write_all_atomically(&[(&file, &text)])?;
    let ok = out.status.success();
    let stdout = String::from_utf8_lossy(&out.stdout);
    crate::out!(
        "import torch (no GPU, no network): {} {}",
        if ok { "passed" } else { "FAILED" },
        stdout.lines().last().unwrap_or("").trim()
    );
    if !ok {
        crate::out!("  output: {}", file.display());
    }
    Ok(ok)
}

/// One line per check of the verify report; returns each level's status.
pub(crate) fn print_verdicts(report: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(levels) = report.get("levels").and_then(|l| l.as_array()) else {
        return out;
    };
    for level in levels {
        let name = level.get("level").and_then(|v| v.as_str()).unwrap_or("?");
        let status = level.get("status").and_then(|v| v.as_str()).unwrap_or("?");
        out.push((name.to_string(), status.to_string()));
        crate::out!("verify {name}: {status}");
        for check in level
            .get("checks")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
        {
            crate::out!(
                "  {:<8} {:<40} {}",
                check.get("status").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("name").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("detail").and_then(|v| v.as_str()).unwrap_or("")
            );
        }
    }
    out
}
