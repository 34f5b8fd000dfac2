//! One of our binaries built so that the same inputs give the same bytes on any machine
//! ([`own_tool`]), kept stripped in a store step keyed by those inputs.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use commstack_store::{StepKey, Store};
use xshell::{Shell, cmd};

/// Where a tool build's own lines go: None for quiet.
pub type Say<'a> = Option<&'a dyn Fn(&str)>;

/// Bumped when [`own_tool`] changes what it produces.
const TOOL_RECIPE: &str = "reproducible-tool-1";

/// How one of our binaries is built by [`own_tool`].
pub struct ToolRecipe<'a> {
    /// The workspace whose sources are built (a copy is built, never this tree).
    pub root: &'a Path,
    pub package: &'a str,
    pub bin: &'a str,
    /// Cargo features of `package` the binary needs (`cuda` for the self-test's kernels).
    pub features: &'a [&'a str],
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
    /// How it was made, for an image's provenance.
    pub fn made_by(&self) -> String {
        format!(
            "cargo build --release -p {} in {}, stripped (sha256 {})",
            self.package,
            tool_build_dir(&self.name).display(),
            self.sha256
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
/// `say`: where its lines go (None: quiet, and cargo with `--quiet`; else cargo's own
/// progress goes to the terminal as it comes).
pub fn own_tool(store: &Store, say: Say, recipe: &ToolRecipe) -> Result<OwnTool> {
    let (key, inputs) = tool_key(recipe)?;
    let outcome = store.run(&key, &inputs, recipe.force, |dir| {
        build_tool_at_fixed_path(say, recipe, &kept_env(), &dir.out)
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

/// The store step name of a tool this workspace builds (the self-test, the verify tool).
pub const TOOL_STEP: &str = "tool";

/// [`own_tool`]'s store key and its inputs: no path of this machine in them.
pub fn tool_key(recipe: &ToolRecipe) -> Result<(StepKey, serde_json::Value)> {
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
    for file in crate::workspace::WORKSPACE_CONFIG {
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
        "features": recipe.features,
        "sources": crate::workspace::sources_hash(root, recipe.dir)?,
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
pub fn tool_build_dir(bin: &str) -> PathBuf {
    Path::new(commstack_store::FIXED_BUILD_ROOT).join(tool_build_key(bin).dir_name())
}

/// [`own_tool`]'s build: the workspace copied into the fixed directory, built there, the
/// binary stripped into `out`.
fn build_tool_at_fixed_path(
    say: Say,
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
    crate::workspace::copy_workspace(recipe.root, &src)?;
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
    if let Some(say) = say {
        say(&format!(
            "building {} (release) in {} ...",
            recipe.bin,
            build.display()
        ));
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
        .args(recipe.features.iter().flat_map(|f| ["--features", f]))
        .current_dir(&src)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("CARGO_HOME", &cargo_home)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_INCREMENTAL", "0")
        .env("RUSTFLAGS", rustflags)
        .env("LC_ALL", "C")
        .env("TZ", "UTC");
    if say.is_none() {
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
