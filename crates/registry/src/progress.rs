//! Progress bars: the fetch's (crates/fetch), with no bar for small blobs.

use indicatif::ProgressBar;

pub(crate) use commstack_fetch::Progress;

/// Blobs smaller than this get no bar: the config, small layers.
const BAR_MIN_BYTES: u64 = 8 << 20;

/// A bar of `size` bytes named `name`, hidden for small blobs.
pub(crate) fn blob_bar(progress: &Progress, name: &str, size: u64) -> ProgressBar {
    if size < BAR_MIN_BYTES {
        return ProgressBar::hidden();
    }
    progress.bar(name, Some(size))
}
