//! A real headless browser for tests: Debian's `chromium` opens a file (an HTML page, an
//! SVG) and gives back what it drew (a screenshot, decoded to RGBA pixels) and the DOM
//! after it rendered (`--dump-dom`), so that a test checks what a person would see.
//!
//! The browser is `$COMMSTACK_CHROMIUM`, else `chromium` on PATH (`apt-get install -y
//! chromium`; .ci/run installs it). A missing browser fails the test, saying so.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the browser showed of one file.
pub struct Shown {
    pub width: u32,
    pub height: u32,
    /// RGBA, row by row.
    pub rgba: Vec<u8>,
    /// The serialized DOM after rendering.
    pub dom: String,
    /// The screenshot's PNG file (kept for a person to look at while the test's
    /// directory lives).
    pub png: PathBuf,
}

impl Shown {
    /// The colour at (x, y).
    pub fn at(&self, x: u32, y: u32) -> [u8; 3] {
        let i = ((y * self.width + x) * 4) as usize;
        [self.rgba[i], self.rgba[i + 1], self.rgba[i + 2]]
    }

    /// How many pixels have `colour` (each channel within `tolerance`).
    pub fn count(&self, colour: [u8; 3], tolerance: u8) -> usize {
        self.rgba
            .chunks_exact(4)
            .filter(|p| close([p[0], p[1], p[2]], colour, tolerance))
            .count()
    }

    /// How many pixels of the rows `rows` have `colour` (within `tolerance`).
    pub fn count_in_rows(
        &self,
        rows: std::ops::Range<u32>,
        colour: [u8; 3],
        tolerance: u8,
    ) -> usize {
        let w = self.width as usize * 4;
        let (a, b) = (
            rows.start as usize * w,
            (rows.end.min(self.height)) as usize * w,
        );
        self.rgba[a..b]
            .chunks_exact(4)
            .filter(|p| close([p[0], p[1], p[2]], colour, tolerance))
            .count()
    }

    /// The rows (top first) that hold at least `min` pixels of `colour`.
    pub fn rows_with(&self, colour: [u8; 3], tolerance: u8, min: usize) -> Vec<u32> {
        (0..self.height)
            .filter(|y| self.count_in_rows(*y..*y + 1, colour, tolerance) >= min)
            .collect()
    }
}

fn close(a: [u8; 3], b: [u8; 3], tolerance: u8) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= tolerance)
}

/// `#rrggbb` as RGB.
pub fn rgb(hex: &str) -> [u8; 3] {
    let h = hex.trim_start_matches('#');
    let c = |i: usize| u8::from_str_radix(&h[i..i + 2], 16).expect("a #rrggbb colour");
    [c(0), c(2), c(4)]
}

fn browser() -> PathBuf {
    if let Some(b) = std::env::var_os("COMMSTACK_CHROMIUM") {
        return PathBuf::from(b);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        for name in ["chromium", "chromium-browser"] {
            if dir.join(name).is_file() {
                return dir.join(name);
            }
        }
    }
    panic!(
        "no headless browser: this test opens its output in chromium (install it with `apt-get install -y chromium`, or set COMMSTACK_CHROMIUM to its path)"
    );
}

/// Runs the browser with `args` on `file` (its own profile in `scratch`), at most 120 s;
/// returns its stdout.
fn run(scratch: &Path, args: &[String], file: &Path) -> Vec<u8> {
    let url = format!(
        "file://{}",
        std::path::absolute(file)
            .expect("an absolute path")
            .display()
    );
    let out = scratch.join("stdout");
    let mut child = Command::new(browser())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            "--force-device-scale-factor=1",
        ])
        .arg(format!(
            "--user-data-dir={}",
            scratch.join("profile").display()
        ))
        .args(args)
        .arg(&url)
        .env("HOME", scratch)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("the browser's stdout file"))
        .stderr(std::fs::File::create(scratch.join("stderr")).expect("its stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the browser: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the browser") {
            break s;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the browser did not finish in 120 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(scratch.join("stderr")).unwrap_or_default();
    assert!(
        status.success(),
        "the browser failed ({status}) on {url}:\n{stderr}"
    );
    std::fs::read(&out).expect("the browser's stdout")
}

/// Opens `file` in the headless browser at `width` x `height` pixels: its screenshot
/// (PNG, in `scratch`) decoded, and its DOM after rendering.
pub fn show(file: &Path, width: u32, height: u32, scratch: &Path) -> Shown {
    std::fs::create_dir_all(scratch).expect("the browser's scratch directory");
    let png = scratch.join("screenshot.png");
    let _ = std::fs::remove_file(&png);
    run(
        scratch,
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size={width},{height}"),
        ],
        file,
    );
    let dom = String::from_utf8(run(scratch, &["--dump-dom".to_string()], file))
        .expect("the DOM is UTF-8");
    // To look at what a test saw: COMMSTACK_KEEP_SCREENSHOTS=DIR keeps each screenshot
    // there, named after the file shown.
    if let Some(keep) = std::env::var_os("COMMSTACK_KEEP_SCREENSHOTS") {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(&png, Path::new(&keep).join(format!("{name}.png")));
    }
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png)
            .unwrap_or_else(|e| panic!("no screenshot {}: {e}", png.display())),
    ));
    let mut decoder = decoder;
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    buf.truncate(info.buffer_size());
    let rgba = match info.color_type {
        png::ColorType::Rgba => buf,
        png::ColorType::Rgb => buf
            .chunks_exact(3)
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect(),
        other => panic!("a screenshot of colour type {other:?}"),
    };
    Shown {
        width: info.width,
        height: info.height,
        rgba,
        dom,
        png,
    }
}
