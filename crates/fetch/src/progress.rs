//! Progress bars on stderr, only when a person can see them.

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shared with the registry's pushes and pulls (crates/registry), which draw the same bars.
pub struct Progress {
    multi: MultiProgress,
    visible: bool,
}

impl Progress {
    /// Bars are drawn when `wanted` and stderr is a terminal; otherwise they are hidden
    /// (logs and CI get no control characters).
    pub fn new(wanted: bool) -> Progress {
        let visible = wanted && std::io::stderr().is_terminal();
        let target = if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Progress {
            multi: MultiProgress::with_draw_target(target),
            visible,
        }
    }

    /// A warning line on stderr, above the bars when they are drawn.
    pub fn println(&self, line: &str) {
        match self.visible {
            true => {
                let _ = self.multi.println(line);
            }
            false => eprintln!("{line}"),
        }
    }

    /// A bar for one artifact (a spinner when its size is unknown).
    pub fn bar(&self, name: &str, size: Option<u64>) -> ProgressBar {
        if !self.visible {
            return ProgressBar::hidden();
        }
        let bar = match size {
            Some(size) => ProgressBar::new(size).with_style(
                ProgressStyle::with_template(
                    "{prefix:24!} [{bar:30}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {msg}",
                )
                .expect("a valid progress template")
                .progress_chars("=> "),
            ),
            None => ProgressBar::no_length().with_style(
                ProgressStyle::with_template("{prefix:24!} {spinner} {bytes:>10} {bytes_per_sec:>12} {msg}")
                    .expect("a valid progress template"),
            ),
        };
        let bar = self.multi.add(bar);
        bar.set_prefix(name.to_string());
        bar
    }
}
