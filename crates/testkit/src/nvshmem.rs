//! An NVSHMEM-shaped source tree for tests: the env_defs header written in NVSHMEM 3.x's
//! exact macro shape (the real source is not in the repository), with the variables the
//! deploy fixtures and their renders set, and an IBGDA-guarded one. What `deploy render
//! --nvshmem-source` reads NVSHMEM's variables from.

use std::path::{Path, PathBuf};

/// Where [`ENV_DEFS`] lies in an NVSHMEM source tree.
pub const ENV_DEFS_PATH: &str = "src/modules/transport/common/env_defs.h";

pub const ENV_DEFS: &str = r#"/* NVSHMEMI_ENV_DEF( name, kind, default, category, short description ) */
#ifdef NVSHMEMI_ENV_DEF

NVSHMEMI_ENV_DEF(DEBUG, string, "", NVSHMEMI_ENV_CAT_OPENSHMEM,
                 "Set to enable debugging messages.\n"
                 "Optional values: VERSION, WARN, INFO, ABORT, TRACE")
NVSHMEMI_ENV_DEF(REMOTE_TRANSPORT, string, NVSHMEMI_ENV_TRANSPORT_DEFAULT,
                 NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Selected transport for remote operations: ibrc, ucx, libfabric, ibdevx, none")
NVSHMEMI_ENV_DEF(BOOTSTRAP_UID_SOCK_IFNAME, string, "", NVSHMEMI_ENV_CAT_BOOTSTRAP,
                 "Name of the UID bootstrap socket interface name")
NVSHMEMI_ENV_DEF(IB_GID_INDEX, int, -1, NVSHMEMI_ENV_CAT_TRANSPORT, "Source GID Index for ROCE")
NVSHMEMI_ENV_DEF(DISABLE_GDRCOPY, bool, false, NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Disable use of GDRCopy in IB RC Transport")

#if defined(NVSHMEM_IBGDA_SUPPORT) || defined(NVSHMEM_ENV_ALL)
NVSHMEMI_ENV_DEF(IBGDA_NUM_RC_PER_PE, int, 2, NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Number of RC QPs per peer PE used in GPU-initiated communication transport.")
NVSHMEMI_ENV_DEF(IB_ENABLE_IBGDA, bool, false, NVSHMEMI_ENV_CAT_TRANSPORT,
                 "Set to enable GPU-initiated communication transport.")
#endif

#endif
"#;

/// `dir/nvshmem_src`, an NVSHMEM-shaped source tree holding [`ENV_DEFS`] at
/// [`ENV_DEFS_PATH`].
pub fn source_tree(dir: &Path) -> PathBuf {
    let src = dir.join("nvshmem_src");
    let header = src.join(ENV_DEFS_PATH);
    std::fs::create_dir_all(header.parent().unwrap()).unwrap();
    std::fs::write(&header, ENV_DEFS).unwrap();
    src
}
