//! envlint against NVSHMEM-shaped sources written here (the exact macro shape of NVSHMEM
//! 3.x's env_defs headers, a few entries each, an IBGDA guard, the CMake option file),
//! read from a directory and from a .tar.gz as the cache holds the locked archive.

use std::io::Write;
use std::path::Path;

use commstack_envlint::input::{self, Place};
use commstack_envlint::{Build, Catalog, Rule, Setting, lint, source};
use commstack_stack::manifest::NvshmemTransports;

const HOST_ENV_DEFS: &str = r#"/* NVSHMEMI_ENV_DEF( name, kind, default, category, short description )
 *
 * Kinds: long, size, bool, string
 */
#include "non_abi/nvshmem_build_options.h"  // for NVSHMEM_IBGDA_SUPPORT

#ifdef NVSHMEMI_ENV_DEF

NVSHMEMI_ENV_DEF(DEBUG, string, "", NVSHMEMI_ENV_CAT_OPENSHMEM,
                 "Set to enable debugging messages.\n"
                 "Optional values: VERSION, WARN, INFO, ABORT, TRACE")
NVSHMEMI_ENV_DEF(SYMMETRIC_SIZE, size, (size_t)(SYMMETRIC_SIZE_DEFAULT), NVSHMEMI_ENV_CAT_OPENSHMEM,
                 "Specifies the size (in bytes) of the symmetric heap memory per PE.")
NVSHMEMI_ENV_DEF(BOOTSTRAP, string, "PMI", NVSHMEMI_ENV_CAT_BOOTSTRAP,
                 "Name of the default bootstrap that should be used to initialize NVSHMEM.\n"
                 "Allowed values: PMI, MPI, SHMEM, plugin, UID")
NVSHMEMI_ENV_DEF(MAX_TEAMS, long, 32l, NVSHMEMI_ENV_CAT_OTHER,
                 "Maximum number of simultaneous teams allowed")
NVSHMEMI_ENV_DEF(DISABLE_P2P, bool, false, NVSHMEMI_ENV_CAT_OTHER,
                 "Disable P2P connectivity of GPUs even when available")
#if defined(NVSHMEM_PPC64LE) || defined(NVSHMEM_ENV_ALL)
NVSHMEMI_ENV_DEF(CUDA_LIMIT_STACK_SIZE, size, (size_t)(0), NVSHMEMI_ENV_CAT_OTHER,
                 "Specify limit on stack size of each GPU thread on P9")
#endif
NVSHMEMI_ENV_DEF(REMOTE_TRANSPORT, string, NVSHMEMI_ENV_TRANSPORT_DEFAULT,
                 NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Selected transport for remote operations: ibrc, ucx, libfabric, ibdevx, none")
NVSHMEMI_ENV_DEF(NVTX, string, "off", NVSHMEMI_ENV_CAT_NVTX,
                 "Set to enable NVTX instrumentation.")

#if defined(NVSHMEM_IBGDA_SUPPORT) || defined(NVSHMEM_ENV_ALL)
/** GPU-initiated communication **/
NVSHMEMI_ENV_DEF(IB_ENABLE_IBGDA, bool, false, NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Set to enable GPU-initiated communication transport.")
#endif

#endif
"#;

const TRANSPORT_ENV_DEFS: &str = r#"#include "non_abi/nvshmem_build_options.h"  // IWYU pragma: keep

#ifdef NVSHMEMI_ENV_DEF

NVSHMEMI_ENV_DEF(DISABLE_GDRCOPY, bool, false, NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Disable use of GDRCopy in IB RC Transport")
NVSHMEMI_ENV_DEF(IB_GID_INDEX, int, -1, NVSHMEMI_ENV_CAT_TRANSPORT, "Source GID Index for ROCE")
NVSHMEMI_ENV_DEF(QP_DEPTH, int, 1024, NVSHMEMI_ENV_CAT_HIDDEN, "Number of WRs in QP")
NVSHMEMI_ENV_DEF(LIBFABRIC_PROVIDER, string, "cxi", NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Set the feature set provider for the libfabric transport: cxi, efa, verbs")

#if defined(NVSHMEM_IBGDA_SUPPORT) || defined(NVSHMEM_ENV_ALL)
NVSHMEMI_ENV_DEF(IBGDA_NUM_RC_PER_PE, int, 2, NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Number of RC QPs per peer PE used in GPU-initiated communication transport.")
NVSHMEMI_ENV_DEF(IB_ENABLE_IBGDA, bool, false, NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Set to enable GPU-initiated communication transport.")
#endif

#endif
"#;

const ENV_CMAKE: &str = r#"message( "\n__TRANSPORT__\n")
nvshmem_add_default_on_option(NVSHMEM_IBRC_SUPPORT "Enable compilation of the IBRC remote transport")
nvshmem_add_default_off_option(NVSHMEM_IBGDA_SUPPORT "Enable compilation of the IBGDA remote transport")
nvshmem_add_default_off_option(NVSHMEM_UCX_SUPPORT "Enable compilation of the UCX remote transport")
nvshmem_add_default_environment_path(UCX_HOME "/usr/local/ucx" "path to UCX installation")
"#;

/// An NVSHMEM-shaped source tree under `root` (top directory `nvshmem_src`).
fn write_source(root: &Path) -> std::path::PathBuf {
    let src = root.join("nvshmem_src");
    for (rel, text) in [
        ("src/include/host/env/env_defs.h", HOST_ENV_DEFS),
        (
            "src/modules/transport/common/env_defs.h",
            TRANSPORT_ENV_DEFS,
        ),
        ("cmake_config/NVSHMEMEnv.cmake", ENV_CMAKE),
        (
            "src/host/init/init.cu",
            "NVSHMEMI_ENV_DEF(NOT_A_HEADER, int, 0, C, \"x\")\n",
        ),
    ] {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    src
}

/// The same tree as a .tar.gz, as NVIDIA ships the source.
fn write_archive(root: &Path, src: &Path) -> std::path::PathBuf {
    let path = root.join("nvshmem_src_cuda12-all-all-3.4.5.tar.gz");
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::default(),
    );
    let mut tar = tar::Builder::new(gz);
    tar.append_dir_all("nvshmem_src", src).unwrap();
    tar.into_inner().unwrap().finish().unwrap().flush().unwrap();
    path
}

/// The shipped stack's build: IBGDA on, every other transport off.
fn catalog_for(tables: &commstack_envlint::NvshmemTables, ibgda: bool) -> Catalog {
    let mut t = NvshmemTransports::default();
    t.set("ibgda", ibgda);
    Catalog::new(tables, Build::from_transports(&t))
}

fn settings(text: &str) -> Vec<Setting> {
    input::env_file("deploy.env", text)
}

#[test]
fn directory_and_archive_give_the_same_tables() {
    let dir = tempfile::tempdir().unwrap();
    let src = write_source(dir.path());
    let archive = write_archive(dir.path(), &src);
    let a = source::read(&src).unwrap();
    let b = source::read(&archive).unwrap();
    assert_eq!(a.env, b.env);
    assert_eq!(
        a.headers,
        [
            "src/include/host/env/env_defs.h",
            "src/modules/transport/common/env_defs.h"
        ]
    );
    let names: Vec<&str> = a.env.iter().map(|d| d.name.as_str()).collect();
    assert!(names.contains(&"NVSHMEM_IB_ENABLE_IBGDA"));
    // Only env_defs headers are read: an entry elsewhere is not a definition.
    assert!(!names.contains(&"NVSHMEM_NOT_A_HEADER"));
    assert_eq!(a.build_options.len(), 4);
    let gid = a
        .env
        .iter()
        .find(|d| d.name == "NVSHMEM_IB_GID_INDEX")
        .unwrap();
    assert_eq!(
        (gid.file.as_str(), gid.line),
        ("src/modules/transport/common/env_defs.h", 7)
    );
}

#[test]
fn not_an_nvshmem_source_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), "x").unwrap();
    let err = source::read(dir.path()).unwrap_err().to_string();
    assert!(err.contains("no NVSHMEMI_ENV_DEF entries"), "{err}");
}

/// The four findings the issue names, each with its fix, in env files.
#[test]
fn misspelled_build_time_unbuilt_and_mistyped_are_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let tables = source::read(&write_source(dir.path())).unwrap();
    let catalog = catalog_for(&tables, true);
    let found = lint(
        &catalog,
        &settings(
            "NVSHMEM_DISABLED_GDRCOPY=true\nNVSHMEM_IBGDA_SUPPORT=1\nUCX_NET_DEVICES=mlx5_0:1\nNVSHMEM_REMOTE_TRANSPORT=ucx\nNVSHMEM_QP_DEPTH=1k\nNVSHMEM_DISABLE_P2P=off\nNCCL_IB_DISABLE=true\nEP_BUFFER_DEBUG=yes\nNVSHMEM_SYMMETRIC_SIZE=2 GB\nNVSHMEM_BOOTSTRAP=pmix\n",
        ),
    );
    let by_line = |line: usize| {
        found
            .iter()
            .find(|f| f.place.line == Some(line))
            .unwrap_or_else(|| panic!("no finding on line {line}: {found:#?}"))
    };
    let f = by_line(1);
    assert_eq!(f.rule, Rule::Unknown);
    assert!(
        f.message
            .contains("nearest known name is NVSHMEM_DISABLE_GDRCOPY"),
        "{}",
        f.message
    );
    assert_eq!(f.fix, "did you mean NVSHMEM_DISABLE_GDRCOPY?");
    let f = by_line(2);
    assert_eq!(f.rule, Rule::BuildTime);
    assert!(
        f.message.contains("cmake_config/NVSHMEMEnv.cmake:3"),
        "{}",
        f.message
    );
    assert!(
        f.message
            .contains("built with it ON (stack.toml [nvshmem] ibgda = true)"),
        "{}",
        f.message
    );
    let f = by_line(3);
    assert_eq!(f.rule, Rule::NotBuilt);
    assert!(
        f.message.contains("read by UCX") && f.message.contains("ucx = false"),
        "{}",
        f.message
    );
    assert!(
        f.fix.contains("`ucx = true`") && f.fix.contains("cargo xtask lock"),
        "{}",
        f.fix
    );
    let f = by_line(4);
    assert_eq!(f.rule, Rule::NotBuilt);
    assert!(f.message.contains("chooses ucx"), "{}", f.message);
    let f = by_line(5);
    assert_eq!(f.rule, Rule::Type);
    assert!(
        f.message.contains("NVSHMEM reads it as 1 (strtol)"),
        "{}",
        f.message
    );
    assert!(
        f.message
            .contains("src/modules/transport/common/env_defs.h:8"),
        "{}",
        f.message
    );
    assert!(by_line(6).message.contains("\"off\" means true"));
    assert!(
        by_line(7)
            .message
            .contains("NCCL reads it as 0 without a word")
    );
    assert!(by_line(8).message.contains("ValueError"));
    assert!(by_line(9).message.contains("not a size"));
    let f = by_line(10);
    assert_eq!(f.rule, Rule::Type);
    assert!(
        f.message.contains("PMI, MPI, SHMEM, plugin, UID"),
        "{}",
        f.message
    );
    assert_eq!(found.len(), 10, "{found:#?}");
}

/// A variable that exists only under a build option's guard is named as not built when
/// the stack turns that option off, and is fine when it is on.
#[test]
fn guarded_variables_follow_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let tables = source::read(&write_source(dir.path())).unwrap();
    let env = settings("NVSHMEM_IB_ENABLE_IBGDA=1\nNVSHMEM_IBGDA_NUM_RC_PER_PE=4\n");
    assert!(lint(&catalog_for(&tables, true), &env).is_empty());
    let found = lint(&catalog_for(&tables, false), &env);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found.iter().all(|f| f.rule == Rule::NotBuilt));
    assert!(
        found[0]
            .message
            .contains("built with NVSHMEM_IBGDA_SUPPORT or NVSHMEM_ENV_ALL"),
        "{}",
        found[0].message
    );
    assert!(found[0].fix.contains("`ibgda = true`"), "{}", found[0].fix);
    // A platform guard (ppc64le) is never met on commstack's targets.
    let found = lint(
        &catalog_for(&tables, true),
        &settings("NVSHMEM_CUDA_LIMIT_STACK_SIZE=1m\n"),
    );
    assert_eq!(found[0].rule, Rule::NotBuilt);
    assert!(found[0].fix.contains("never builds"), "{}", found[0].fix);
}

/// Someone else's manifest (a Deployment with a ConfigMap), and an sbatch script.
#[test]
fn manifests_and_scripts_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let tables = source::read(&write_source(dir.path())).unwrap();
    let catalog = catalog_for(&tables, true);
    let yaml = dir.path().join("overlay.yaml");
    std::fs::write(
        &yaml,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: nv}\ndata:\n  NVSHMEM_DEBUG: INFO\n  NVSHMEM_HCA_PE_MAPING: mlx5_0:1:8\n---\napiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: sglang, namespace: ep}\nspec:\n  leaderWorkerTemplate:\n    workerTemplate:\n      spec:\n        containers:\n        - name: worker\n          envFrom: [{configMapRef: {name: nv}}]\n          env:\n          - {name: NVSHMEM_DISABLED_GDRCOPY, value: \"true\"}\n          - {name: NVSHMEM_IB_GID_INDEX, value: $(GID)}\n          - {name: NCCL_DEBUG, value: INFO}\n          - {name: NCCL_DEBUG, value: WARN}\n",
    )
    .unwrap();
    let found = lint(&catalog, &commstack_envlint::read_file(&yaml).unwrap());
    let rules: Vec<(Rule, &str)> = found.iter().map(|f| (f.rule, f.name.as_str())).collect();
    assert_eq!(
        rules,
        [
            (Rule::Unknown, "NVSHMEM_HCA_PE_MAPING"),
            (Rule::Unknown, "NVSHMEM_DISABLED_GDRCOPY"),
            (Rule::Duplicate, "NCCL_DEBUG"),
        ],
        "{found:#?}"
    );
    assert_eq!(
        found[1].place,
        Place {
            file: yaml.display().to_string(),
            line: None,
            context: Some(
                "LeaderWorkerSet ep/sglang spec.leaderWorkerTemplate.workerTemplate.spec.containers container worker".into()
            ),
        }
    );
    let script = dir.path().join("job.sbatch");
    std::fs::write(
        &script,
        "#!/bin/bash\n#SBATCH --nodes=2\nexport NVSHMEM_IBGDA_SUPPORT=ON\nexport NODE_RANK=$SLURM_NODEID\nsrun true\n",
    )
    .unwrap();
    let found = lint(&catalog, &commstack_envlint::read_file(&script).unwrap());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        (found[0].rule, found[0].place.line),
        (Rule::BuildTime, Some(3))
    );
}

/// A clean environment passes, and names outside the stack's namespaces are left alone
/// unless they are a near miss of a known one.
#[test]
fn clean_environments_pass_and_near_misses_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    let tables = source::read(&write_source(dir.path())).unwrap();
    let catalog = catalog_for(&tables, true);
    let clean = settings(
        "NVSHMEM_DEBUG=warn\nNVSHMEM_SYMMETRIC_SIZE=4g\nNVSHMEM_BOOTSTRAP=UID\nNVSHMEM_REMOTE_TRANSPORT=none\nNVSHMEM_IB_GID_INDEX=3\nNCCL_DEBUG=INFO\nNCCL_IB_GID_INDEX=3\nEP_JIT_CACHE_DIR=/var/cache/deep_ep\nMASTER_PORT=29500\nHF_TOKEN=x\nPATH=/usr/bin\n",
    );
    assert_eq!(lint(&catalog, &clean), []);
    let found = lint(&catalog, &settings("NVHSMEM_DEBUG=INFO\n"));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].fix, "did you mean NVSHMEM_DEBUG?");
}
