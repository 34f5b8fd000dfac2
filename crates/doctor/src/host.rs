//! Reading the host's /proc, /sys and /dev under a root prefix, so a recorded tree stands in.

use std::io;
use std::path::{Path, PathBuf};

/// The host's files, all read below `root` (`/` for the live host).
#[derive(Debug, Clone)]
pub struct HostFs {
    root: PathBuf,
}

impl HostFs {
    pub fn new(root: impl Into<PathBuf>) -> HostFs {
        HostFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// `/proc/modules` -> `<root>/proc/modules`.
    pub fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }

    /// The file's text, or `None` when it does not exist. Other read errors are returned.
    pub fn read(&self, absolute: &str) -> io::Result<Option<String>> {
        match std::fs::read(self.path(absolute)) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A file's text trimmed, or `None` if absent or unreadable (sysfs attributes).
    pub fn read_attr(&self, absolute: &str) -> Option<String> {
        self.read(absolute)
            .ok()
            .flatten()
            .map(|s| s.trim().to_string())
    }

    /// Names in a directory, sorted; empty when it does not exist.
    pub fn list(&self, absolute: &str) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.path(absolute)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort_by_key(|n| natural_key(n));
        names
    }

    pub fn exists(&self, absolute: &str) -> bool {
        self.path(absolute).exists()
    }

    /// Total bytes of the filesystem holding `absolute` (statvfs).
    pub fn filesystem_size(&self, absolute: &str) -> io::Result<u64> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let path = CString::new(self.path(absolute).as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is NUL-terminated and `stat` is a valid out-pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stat.f_blocks as u64 * stat.f_frsize as u64)
    }
}

/// `mlx5_10` after `mlx5_9`.
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = name.split_at(name.len() - digits);
    (stem.to_string(), number.parse().unwrap_or(0))
}
