//! What dpkg says is installed (`var/lib/dpkg/status`), compared with the lock's
//! `[[deb]]` list: the base is exactly the locked packages, no more, no fewer, at the
//! locked versions.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

/// One installed package, as dpkg's status file records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub name: String,
    pub version: String,
    pub architecture: String,
    pub status: String,
}

/// Every paragraph of a dpkg status file.
pub fn parse_status(text: &str) -> Vec<Installed> {
    let mut out = Vec::new();
    for para in text.split("\n\n") {
        let field = |name: &str| {
            para.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        if let Some(name) = field("Package") {
            out.push(Installed {
                name,
                version: field("Version").unwrap_or_default(),
                architecture: field("Architecture").unwrap_or_default(),
                status: field("Status").unwrap_or_default(),
            });
        }
    }
    out
}

/// `locked`: (name, architecture) -> version. Fails naming every difference.
pub fn compare(installed: &[Installed], locked: &BTreeMap<(String, String), String>) -> Result<()> {
    let mut problems = Vec::new();
    let mut seen = BTreeMap::new();
    for p in installed {
        if p.status != "install ok installed" {
            problems.push(format!(
                "{} {} ({}) is not installed cleanly: Status: {}",
                p.name, p.version, p.architecture, p.status
            ));
            continue;
        }
        let key = (p.name.clone(), p.architecture.clone());
        match locked.get(&key) {
            None => problems.push(format!(
                "extra: {} {} ({}) is installed but not in the lock",
                p.name, p.version, p.architecture
            )),
            Some(v) if *v != p.version => problems.push(format!(
                "other version: {} ({}) is installed at {}, the lock has {v}",
                p.name, p.architecture, p.version
            )),
            Some(_) => {}
        }
        seen.insert(key, ());
    }
    for ((name, arch), version) in locked {
        if !seen.contains_key(&(name.clone(), arch.clone())) {
            problems.push(format!(
                "missing: {name} {version} ({arch}) is in the lock but was not installed"
            ));
        }
    }
    if !problems.is_empty() {
        bail!(
            "the base's installed packages differ from the lock's [[deb]] list:\n  {}\n\
             The lock must hold exactly the closure of the variant plus [image] include: \
             relock with `cargo xtask lock --force`",
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// The Python version of the base: from the installed `python3.X` package's version,
/// `3.11.2-6+deb12u6` -> `3.11.2` (epoch and Debian revision dropped, then the leading
/// dotted number).
pub fn python_version(installed: &[Installed]) -> Result<String> {
    let mut found: Vec<&Installed> = installed
        .iter()
        .filter(|p| {
            p.name
                .strip_prefix("python3.")
                .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    let Some(p) = found.first() else {
        bail!(
            "the base has no python3.X package: add python3 to [image] include in the stack \
             file and relock (`cargo xtask lock --force`)"
        );
    };
    if found.len() > 1 {
        bail!(
            "the base holds more than one Python ({}): the image's venv needs exactly one",
            found
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(upstream_number(&p.version))
}

fn upstream_number(version: &str) -> String {
    let no_epoch = version.split_once(':').map_or(version, |(_, v)| v);
    let upstream = no_epoch.rsplit_once('-').map_or(no_epoch, |(u, _)| u);
    let end = upstream
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(upstream.len());
    upstream[..end].trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Package: bash\nStatus: install ok installed\nPriority: required\n\
Architecture: amd64\nVersion: 5.2.15-2+b8\n\nPackage: python3.11\nStatus: install ok installed\n\
Architecture: amd64\nVersion: 3.11.2-6+deb12u6\nDescription: x\n more\n\n";

    fn locked(list: &[(&str, &str, &str)]) -> BTreeMap<(String, String), String> {
        list.iter()
            .map(|(n, a, v)| ((n.to_string(), a.to_string()), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_status_and_python() {
        let i = parse_status(STATUS);
        assert_eq!(i.len(), 2);
        assert_eq!(i[0].name, "bash");
        assert_eq!(i[0].version, "5.2.15-2+b8");
        assert_eq!(python_version(&i).unwrap(), "3.11.2");
        assert_eq!(upstream_number("1:3.12.3-1ubuntu0.1"), "3.12.3");
        assert!(python_version(&i[..1]).is_err());
    }

    #[test]
    fn equal_sets_pass_and_differences_are_named() {
        let i = parse_status(STATUS);
        compare(
            &i,
            &locked(&[
                ("bash", "amd64", "5.2.15-2+b8"),
                ("python3.11", "amd64", "3.11.2-6+deb12u6"),
            ]),
        )
        .unwrap();
        let err = compare(
            &i,
            &locked(&[
                ("bash", "amd64", "5.2.15-2+b7"),
                ("zlib1g", "amd64", "1:1.2.13"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("extra: python3.11 3.11.2-6+deb12u6"), "{err}");
        assert!(
            err.contains(
                "other version: bash (amd64) is installed at 5.2.15-2+b8, the lock has 5.2.15-2+b7"
            ),
            "{err}"
        );
        assert!(err.contains("missing: zlib1g 1:1.2.13"), "{err}");
        assert!(err.contains("cargo xtask lock --force"), "{err}");
    }

    #[test]
    fn half_installed_is_refused() {
        let text = STATUS.replace(
            "install ok installed\nPriority",
            "install ok half-configured\nPriority",
        );
        let err = compare(
            &parse_status(&text),
            &locked(&[
                ("bash", "amd64", "5.2.15-2+b8"),
                ("python3.11", "amd64", "3.11.2-6+deb12u6"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("bash 5.2.15-2+b8 (amd64) is not installed cleanly"),
            "{err}"
        );
    }
}
