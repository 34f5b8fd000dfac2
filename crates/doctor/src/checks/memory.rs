//! Locked-memory limit (RDMA registration) and /dev/shm (NCCL's shared-memory transport).

use crate::host::HostFs;
use crate::proc_files::{Limit, human_bytes, mem_total, memlock_limits, mounts, tmpfs_size};
use crate::report::{Check, Status};

const MEMLOCK_FIX: &str = "raise it to unlimited: `ulimit -l unlimited` (limits.conf: `* - memlock unlimited`), `docker run --ulimit memlock=-1`";

pub(crate) fn memlock(fs: &HostFs, has_rdma: bool) -> Check {
    const ID: &str = "memlock";
    const TITLE: &str = "Locked-memory limit (ulimit -l)";
    let text = match fs.read("/proc/self/limits") {
        Ok(Some(t)) => t,
        Ok(None) => return Check::new(ID, TITLE, Status::Warn, "no /proc/self/limits"),
        Err(e) => {
            return Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!("cannot read /proc/self/limits: {e}"),
            );
        }
    };
    let Some((soft, hard)) = memlock_limits(&text) else {
        return Check::new(
            ID,
            TITLE,
            Status::Warn,
            "no \"Max locked memory\" line in /proc/self/limits",
        );
    };
    let show = |l: Limit| match l {
        Limit::Unlimited => "unlimited".to_string(),
        Limit::Bytes(b) => human_bytes(b),
    };
    let details = vec![format!("soft {}, hard {}", show(soft), show(hard))];
    match soft {
        Limit::Unlimited => Check::new(ID, TITLE, Status::Pass, "memlock unlimited").details(details),
        Limit::Bytes(b) if has_rdma => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("memlock limited to {}: registering NCCL / NVSHMEM buffers with the RDMA NICs will fail", human_bytes(b)),
        )
        .fix(MEMLOCK_FIX)
        .details(details),
        Limit::Bytes(b) => Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("memlock limited to {}: fine without RDMA; NCCL / NVSHMEM over RDMA need it unlimited", human_bytes(b)),
        )
        .fix(MEMLOCK_FIX)
        .details(details),
    }
}

/// Docker's default /dev/shm is 64 MiB; NCCL needs ~9.6 MB per shared-memory connection.
const SHM_FAIL_BELOW: u64 = 256 << 20;
const SHM_WARN_BELOW: u64 = 1 << 30;
const SHM_FIX: &str = "give the container more shared memory: `docker run --shm-size=16g` (or `--ipc=host`); on Kubernetes a memory-backed emptyDir at /dev/shm";

pub(crate) fn dev_shm(fs: &HostFs) -> Check {
    const ID: &str = "dev-shm";
    const TITLE: &str = "/dev/shm size (NCCL shared-memory transport)";
    let mounts_text = match fs.read("/proc/mounts") {
        Ok(Some(t)) => t,
        Ok(None) => return Check::new(ID, TITLE, Status::Warn, "no /proc/mounts"),
        Err(e) => {
            return Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!("cannot read /proc/mounts: {e}"),
            );
        }
    };
    let Some(mount) = mounts(&mounts_text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == "/dev/shm")
    else {
        return Check::new(ID, TITLE, Status::Warn, "no /dev/shm mount in /proc/mounts")
            .fix(SHM_FIX);
    };
    // The mount options say the size when it was set; a tmpfs without `size=` gets half of RAM.
    let (size, source) = if let Some(size) = tmpfs_size(&mount.options) {
        (size, "size= option in /proc/mounts".to_string())
    } else if fs.is_live() {
        match fs.filesystem_size("/dev/shm") {
            Ok(size) => (size, "statvfs(/dev/shm)".to_string()),
            Err(e) => {
                return Check::new(
                    ID,
                    TITLE,
                    Status::Warn,
                    format!("statvfs(/dev/shm) failed: {e}"),
                );
            }
        }
    } else {
        match fs
            .read("/proc/meminfo")
            .ok()
            .flatten()
            .as_deref()
            .and_then(mem_total)
        {
            Some(total) => (
                total / 2,
                "tmpfs default: half of MemTotal in /proc/meminfo".to_string(),
            ),
            None => {
                return Check::new(
                    ID,
                    TITLE,
                    Status::Warn,
                    "/dev/shm has no size= option and there is no /proc/meminfo",
                );
            }
        }
    };
    let details = vec![format!(
        "{} {} {} ({source})",
        mount.device,
        mount.mount_point,
        mount.options.join(",")
    )];
    let shown = human_bytes(size);
    if size < SHM_FAIL_BELOW {
        Check::new(ID, TITLE, Status::Fail, format!("/dev/shm is {shown}: NCCL's shared-memory segments between local ranks will not fit"))
            .fix(SHM_FIX)
            .details(details)
    } else if size < SHM_WARN_BELOW {
        Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("/dev/shm is {shown}: tight for 8 local ranks"),
        )
        .fix(SHM_FIX)
        .details(details)
    } else {
        Check::new(ID, TITLE, Status::Pass, format!("/dev/shm is {shown}")).details(details)
    }
}
