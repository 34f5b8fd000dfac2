//! The running kernel's version against the floor the stack needs (DeepEP V2's ranks on
//! one node exchange memory through `pidfd_getfd`: Linux >= 5.6).

use crate::host::HostFs;
use crate::report::{Check, Status};

const ID: &str = "kernel";
const TITLE: &str = "Linux kernel version";

/// `6.8.0-49-generic` -> (6, 8).
pub(crate) fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// `minimum` is `(major, minor, why)`; `None` when the stack needs no floor.
pub(crate) fn check(fs: &HostFs, minimum: Option<((u32, u32), &str)>) -> Check {
    let release = fs.read_attr("/proc/sys/kernel/osrelease");
    let Some(((min_major, min_minor), why)) = minimum else {
        return Check::new(
            ID,
            TITLE,
            Status::Skip,
            format!(
                "no kernel floor for this stack (running {})",
                release.as_deref().unwrap_or("an unknown kernel")
            ),
        );
    };
    let Some(release) = release else {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            "cannot read /proc/sys/kernel/osrelease",
        )
        .fix("run the preflight with /proc mounted (any container has it)");
    };
    let Some((major, minor)) = parse_release(&release) else {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("/proc/sys/kernel/osrelease is {release:?}: not a kernel version"),
        );
    };
    if (major, minor) < (min_major, min_minor) {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("Linux {release} is older than {min_major}.{min_minor}, which {why}"),
        )
        .fix(format!(
            "run on nodes with Linux >= {min_major}.{min_minor}, or build the stack with deepep.api = \"v1\""
        ));
    }
    Check::new(
        ID,
        TITLE,
        Status::Pass,
        format!("Linux {release}: at least {min_major}.{min_minor}, which {why}"),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn releases() {
        assert_eq!(super::parse_release("6.8.0-49-generic\n"), Some((6, 8)));
        assert_eq!(super::parse_release("5.4.0"), Some((5, 4)));
        assert_eq!(
            super::parse_release("5.15.167.4-microsoft-standard-WSL2"),
            Some((5, 15))
        );
        assert_eq!(super::parse_release("garbage"), None);
    }
}
