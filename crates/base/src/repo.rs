//! The flat apt repository mmdebstrap installs from: the cached .debs (hard links, or
//! copies across file systems), a `Packages` index made from each .deb's own control
//! fields, and a `Release` naming the suite (mmdebstrap picks the essential set with
//! `?archive(^suite$)` / `?codename(^suite$)`, so an index without a suite yields none).
//! apt reads it through `copy://`: nothing leaves the machine.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use commstack_stack::lock::{BaseLock, Deb};

/// Write the repository into `dir` (created). Returns the `sources.list` line.
pub fn write_repo(dir: &Path, base: &BaseLock, debs: &[(&Deb, PathBuf)]) -> Result<String> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut sorted: Vec<&(&Deb, PathBuf)> = debs.iter().collect();
    sorted.sort_by(|a, b| (&a.0.name, &a.0.architecture).cmp(&(&b.0.name, &b.0.architecture)));
    let mut packages = String::new();
    for (deb, cached) in sorted {
        let name = repo_file_name(deb)?;
        let linked = dir.join(&name);
        if fs::hard_link(cached, &linked).is_err() {
            fs::copy(cached, &linked).with_context(|| {
                format!("cannot copy {} to {}", cached.display(), linked.display())
            })?;
        }
        let control = commstack_exec::output(
            "dpkg-deb (Debian's dpkg package: it reads each .deb's control fields)",
            Command::new("dpkg-deb")
                .arg("-f")
                .arg(&linked)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .env("LC_ALL", "C.UTF-8"),
        )
        .map_err(|e| match commstack_exec::CommandFailed::in_chain(&e) {
            // It ran and refused the file: the file, not the tool, is at fault.
            Some(_) => e.context(format!(
                "deb {} ({}) has no readable control fields: the cached file may be damaged: \
                 run `cargo xtask fetch --verify`",
                deb.name,
                cached.display()
            )),
            None => e,
        })?;
        let text = String::from_utf8(control.stdout)
            .with_context(|| format!("{}: the control fields are not UTF-8", cached.display()))?;
        packages.push_str(text.trim_end_matches('\n'));
        packages.push_str(&format!(
            "\nFilename: ./{name}\nSize: {}\nSHA256: {}\n\n",
            deb.size, deb.sha256
        ));
    }
    fs::write(dir.join("Packages"), &packages)?;
    let release = format!(
        "Origin: commstack\nLabel: commstack\nSuite: {suite}\nCodename: {suite}\n\
         Architectures: {arch} all\nComponents: main\nSHA256:\n {sha} {size} Packages\n",
        suite = base.suite,
        arch = base.architecture,
        sha = commstack_digest::sha256_hex(packages.as_bytes()),
        size = packages.len(),
    );
    fs::write(dir.join("Release"), release)?;
    Ok(format!("deb [trusted=yes] copy://{} ./", dir.display()))
}

/// `<name>_<version, ':' as %3a>_<arch>.deb`, Debian's own naming; refuses anything that
/// could leave the directory.
fn repo_file_name(deb: &Deb) -> Result<String> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+.~:-".contains(&b))
    };
    if !ok(&deb.name) || !ok(&deb.version) || !ok(&deb.architecture) {
        bail!(
            "deb {:?} {:?} ({:?}): not a Debian package name, version or architecture",
            deb.name,
            deb.version,
            deb.architecture
        );
    }
    Ok(format!(
        "{}_{}_{}.deb",
        deb.name,
        deb.version.replace(':', "%3a"),
        deb.architecture
    ))
}
