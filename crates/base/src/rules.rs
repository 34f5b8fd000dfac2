//! The generated-file table: files in the base that no package's `.list` names, but that
//! maintainer scripts, dpkg, apt, mmdebstrap or this step write while the base is made.
//!
//! Every file of the base must be claimed, by a package (`deb:<name>`) or by one rule here
//! (`generated:<id>`); anything else fails the step. Each rule names exact paths or
//! narrow globs (`*` within one path segment, `**` any number of segments) and says who
//! writes them. The table is kept as tight as Debian bookworm's essential set plus
//! python3, libstdc++6, libibverbs1, ibverbs-providers and ca-certificates allows: a new
//! package whose scripts write elsewhere must be looked at and added here, not waved
//! through by a broad pattern. Changing the table changes the base step's key
//! ([`RULES_VERSION`]).

/// Bumped whenever [`RULES`] changes: part of the base step's key.
pub const RULES_VERSION: u32 = 1;

/// One row of the table.
#[derive(Debug)]
pub struct Rule {
    /// Recorded as `generated:<id>` in base.json.
    pub id: &'static str,
    /// Paths as in the layer tar (no leading `/`), exact or globs.
    pub paths: &'static [&'static str],
    /// When set, the entry must be a symlink whose target matches this glob.
    pub symlink_to: Option<&'static str>,
    /// Who writes these files, and why they are not in any package's file list.
    pub why: &'static str,
}

/// First match wins; the order only matters for rules that could overlap (none do today).
pub const RULES: &[Rule] = &[
    Rule {
        id: "commstack-fixed",
        paths: &["etc/hostname", "etc/resolv.conf", "etc/apt/sources.list"],
        symlink_to: None,
        why: "written by this step's customize hooks with fixed contents (hostname \
              \"commstack\", a resolv.conf comment, the lock's mirror), so no build-host \
              value reaches the image",
    },
    Rule {
        id: "mmdebstrap",
        paths: &["etc/fstab", "etc/apt/apt.conf.d/99mmdebstrap"],
        symlink_to: None,
        why: "written by mmdebstrap itself: an unconfigured fstab, and the --aptopt options",
    },
    Rule {
        id: "dpkg-database",
        paths: &["var/lib/dpkg/**"],
        symlink_to: None,
        why: "dpkg's database: status, info/<package>.{list,md5sums,conffiles,postinst,...}, \
              triggers, alternatives, locks",
    },
    Rule {
        id: "apt-state",
        paths: &[
            "var/lib/apt/extended_states",
            "var/lib/apt/lists/lock",
            "var/cache/apt/archives/lock",
        ],
        symlink_to: None,
        why: "apt's record of automatically installed packages and its lock files, left by \
              the install (mmdebstrap empties the lists and the archive cache)",
    },
    Rule {
        id: "debconf-cache",
        paths: &["var/cache/debconf/*.dat", "var/cache/debconf/*.dat-old"],
        symlink_to: None,
        why: "debconf's database, written when maintainer scripts ask their questions",
    },
    Rule {
        id: "alternatives",
        paths: &["etc/alternatives/*"],
        symlink_to: None,
        why: "update-alternatives' links (awk -> mawk, pager -> more, which, rmt, ...)",
    },
    Rule {
        id: "alternatives-generic-name",
        paths: &["usr/**"],
        symlink_to: Some("/etc/alternatives/*"),
        why: "the generic name (usr/bin/awk, its manual page) that update-alternatives \
              links to etc/alternatives",
    },
    Rule {
        id: "accounts",
        paths: &[
            "etc/passwd",
            "etc/passwd-",
            "etc/group",
            "etc/group-",
            "etc/shadow",
            "etc/shadow-",
            "etc/gshadow",
            "etc/gshadow-",
            "etc/.pwd.lock",
            "etc/subuid",
            "etc/subgid",
        ],
        symlink_to: None,
        why: "the account databases: base-passwd's update-passwd writes them from its \
              master files, shadow's tools (login's and passwd's postinst) the shadow, \
              backup, lock and subordinate-id files",
    },
    Rule {
        id: "pam-config",
        paths: &[
            "etc/pam.d/common-*",
            "var/lib/pam/*",
            "etc/environment",
            "etc/security/opasswd",
        ],
        symlink_to: None,
        why: "pam-auth-update (libpam-runtime's postinst) writes the common-* files and its \
              state; libpam-modules' postinst creates etc/environment and opasswd",
    },
    Rule {
        id: "base-files",
        paths: &[
            "etc/motd",
            "etc/profile",
            "root/.bashrc",
            "root/.profile",
            "usr/share/info/dir",
            "usr/local/man",
            "var/spool/mail",
            "etc/dpkg/origins/default",
        ],
        symlink_to: None,
        why: "base-files' postinst copies these from /usr/share/base-files (or links them), \
              so that a local edit is never overwritten",
    },
    Rule {
        id: "login-records",
        paths: &[
            "var/log/lastlog",
            "var/log/wtmp",
            "var/log/btmp",
            "var/log/faillog",
        ],
        symlink_to: None,
        why: "empty login record files created by base-files' and login's postinst",
    },
    Rule {
        id: "libc-bin",
        paths: &["etc/ld.so.cache", "etc/nsswitch.conf"],
        symlink_to: None,
        why: "ldconfig's cache (the ldconfig trigger) and the nsswitch.conf libc-bin's \
              postinst installs",
    },
    Rule {
        id: "shells",
        paths: &["etc/shells", "var/lib/shells.state"],
        symlink_to: None,
        why: "debianutils' update-shells, from the shells packages register",
    },
    Rule {
        id: "readline-inputrc",
        paths: &["etc/inputrc"],
        symlink_to: None,
        why: "readline-common's postinst installs the default inputrc",
    },
    Rule {
        id: "ca-certificates",
        paths: &["etc/ssl/certs/*", "etc/ca-certificates.conf"],
        symlink_to: None,
        why: "update-ca-certificates: the hash and .pem links and the ca-certificates.crt \
              bundle; ca-certificates' postinst writes the list of enabled certificates",
    },
    Rule {
        id: "python-bytecode",
        paths: &[
            "usr/lib/python3.*/**/__pycache__/*.pyc",
            "usr/share/python3/**/__pycache__/*.pyc",
        ],
        symlink_to: None,
        why: "py3compile in python3.X-minimal's and python3's postinst byte-compiles the \
              standard library and Debian's python helpers",
    },
    Rule {
        id: "python-state",
        paths: &[
            "var/lib/python/python3.*_installed",
            "etc/python3/debian_config",
        ],
        symlink_to: None,
        why: "python3.X-minimal's postinst marker; python3's postinst writes debian_config",
    },
    Rule {
        id: "sysv-init-links",
        paths: &["etc/rc?.d/*"],
        symlink_to: Some("../init.d/*"),
        why: "update-rc.d's start/stop links for init scripts packages ship \
              (util-linux-extra's hwclock.sh)",
    },
    Rule {
        id: "systemd-enablement",
        paths: &[
            "etc/systemd/system/*.wants/*",
            "var/lib/systemd/deb-systemd-helper-enabled/**",
        ],
        symlink_to: None,
        why: "deb-systemd-helper's enablement links and state for units packages ship \
              (dpkg-db-backup.timer, fstrim.timer); inert without systemd",
    },
];

/// The rule that claims `path` (a symlink to `link_target` when given), if any.
pub fn rule_for(path: &str, link_target: Option<&str>) -> Option<&'static Rule> {
    RULES.iter().find(|rule| {
        rule.paths.iter().any(|p| glob_match(p, path))
            && match rule.symlink_to {
                None => true,
                Some(target) => link_target.is_some_and(|t| glob_match(target, t)),
            }
    })
}

/// `/`-separated glob: `**` matches any number of whole segments (zero included), `*`
/// any run of characters within a segment, `?` one character.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let pat: Vec<&str> = pattern.split('/').collect();
    let segs: Vec<&str> = path.split('/').collect();
    match_segments(&pat, &segs)
}

fn match_segments(pat: &[&str], segs: &[&str]) -> bool {
    match pat.split_first() {
        None => segs.is_empty(),
        Some((&"**", rest)) => (0..=segs.len()).any(|skip| match_segments(rest, &segs[skip..])),
        Some((first, rest)) => match segs.split_first() {
            Some((seg, more)) => {
                match_one(first.as_bytes(), seg.as_bytes()) && match_segments(rest, more)
            }
            None => false,
        },
    }
}

fn match_one(pat: &[u8], s: &[u8]) -> bool {
    match pat.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|skip| match_one(rest, &s[skip..])),
        Some((b'?', rest)) => !s.is_empty() && match_one(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && match_one(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_segments() {
        assert!(glob_match("var/lib/dpkg/**", "var/lib/dpkg/info/bash.list"));
        assert!(glob_match("var/lib/dpkg/**", "var/lib/dpkg/status"));
        assert!(!glob_match("var/lib/dpkg/**", "var/lib/dpkgx/status"));
        assert!(glob_match(
            "etc/ssl/certs/*",
            "etc/ssl/certs/ISRG_Root_X1.pem"
        ));
        assert!(!glob_match("etc/ssl/certs/*", "etc/ssl/certs/sub/x.pem"));
        assert!(glob_match(
            "usr/lib/python3.*/**/__pycache__/*.pyc",
            "usr/lib/python3.11/__pycache__/os.cpython-311.pyc"
        ));
        assert!(glob_match(
            "usr/lib/python3.*/**/__pycache__/*.pyc",
            "usr/lib/python3.11/xml/dom/__pycache__/minidom.cpython-311.pyc"
        ));
        assert!(!glob_match(
            "usr/lib/python3.*/**/__pycache__/*.pyc",
            "usr/lib/python3.11/os.py"
        ));
        assert!(glob_match("etc/rc?.d/*", "etc/rcS.d/S01hwclock.sh"));
    }

    #[test]
    fn symlink_rules_need_the_target() {
        let r = rule_for("usr/bin/awk", Some("/etc/alternatives/awk")).unwrap();
        assert_eq!(r.id, "alternatives-generic-name");
        // The same path as a regular file is no alternative.
        assert!(rule_for("usr/bin/awk", None).is_none());
        assert!(rule_for("usr/bin/evil", Some("/tmp/x")).is_none());
        assert_eq!(rule_for("etc/passwd", None).unwrap().id, "accounts");
        assert!(rule_for("etc/passwd.bak", None).is_none());
        assert!(rule_for("usr/bin/bash", None).is_none());
    }

    #[test]
    fn rule_ids_are_unique_and_explained() {
        let mut ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), RULES.len());
        assert!(
            RULES
                .iter()
                .all(|r| !r.why.is_empty() && !r.paths.is_empty())
        );
    }
}
