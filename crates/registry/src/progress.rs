//! Progress bars on stderr, only when a person can see them.

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Blobs smaller than this get no bar: the config, small layers.
const BAR_MIN_BYTES: u64 = 8 << 20;

pub(crate) struct Progress {
    multi: MultiProgress,
    visible: bool,
}

impl Progress {
    /// Bars are drawn when `wanted` and stderr is a terminal (logs and CI get none).
    pub fn new(wanted: bool) -> Progress {
        let visible = wanted && std::io::stderr().is_terminal();
        let target = match visible {
            true => ProgressDrawTarget::stderr(),
            false => ProgressDrawTarget::hidden(),
        };
        Progress {
            multi: MultiProgress::with_draw_target(target),
            visible,
        }
    }

    /// A line on stderr, above the bars when they are drawn.
    pub fn println(&self, line: &str) {
        match self.visible {
            true => {
                let _ = self.multi.println(line);
            }
            false => eprintln!("{line}"),
        }
    }

    /// A bar of `size` bytes named `name` (hidden for small blobs).
    pub fn bar(&self, name: &str, size: u64) -> ProgressBar {
        if !self.visible || size < BAR_MIN_BYTES {
            return ProgressBar::hidden();
        }
        let style = ProgressStyle::with_template(
            "{prefix:20!} [{bar:30}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12}",
        )
        .expect("a valid progress template")
        .progress_chars("=> ");
        let bar = self.multi.add(ProgressBar::new(size).with_style(style));
        bar.set_prefix(name.to_string());
        bar
    }
}
