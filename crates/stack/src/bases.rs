//! Base images a stack can be built on, and what each one provides. The stack's Python must
//! be the base image's Python (a second interpreter in the image would be a second
//! everything), and wheels may not need a newer glibc than the base has.

/// What we know of one base image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Base {
    /// The name used in stack.toml (`target.base`).
    pub name: &'static str,
    /// Other accepted spellings.
    pub aliases: &'static [&'static str],
    /// The distribution's own CPython (`python3`), full version.
    pub python: (u64, u64, u64),
    /// The distribution's glibc.
    pub glibc: (u32, u32),
    /// The newest GLIBCXX symbol version its libstdc++6 defines (gcc 12: 3.4.30, gcc 14:
    /// 3.4.33): a library needing a newer one does not load there.
    pub glibcxx: (u32, u32, u32),
    /// Debian/Ubuntu suite name, used to make the base image locally.
    pub suite: &'static str,
}

/// The distribution a base belongs to, as its name starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    Debian,
    Ubuntu,
}

impl Distribution {
    pub fn as_str(self) -> &'static str {
        match self {
            Distribution::Debian => "debian",
            Distribution::Ubuntu => "ubuntu",
        }
    }
}

impl Base {
    pub fn distribution(&self) -> Distribution {
        if self.name.starts_with("ubuntu-") {
            Distribution::Ubuntu
        } else {
            Distribution::Debian
        }
    }
}

pub const BASES: &[Base] = &[
    Base {
        name: "debian-12",
        aliases: &["bookworm", "debian:bookworm"],
        python: (3, 11, 2),
        glibc: (2, 36),
        glibcxx: (3, 4, 30),
        suite: "bookworm",
    },
    Base {
        name: "debian-13",
        aliases: &["trixie", "debian:trixie"],
        python: (3, 13, 5),
        glibc: (2, 41),
        glibcxx: (3, 4, 33),
        suite: "trixie",
    },
    Base {
        name: "ubuntu-22.04",
        aliases: &["jammy", "ubuntu:22.04"],
        python: (3, 10, 12),
        glibc: (2, 35),
        glibcxx: (3, 4, 30),
        suite: "jammy",
    },
    Base {
        name: "ubuntu-24.04",
        aliases: &["noble", "ubuntu:24.04"],
        python: (3, 12, 3),
        glibc: (2, 39),
        glibcxx: (3, 4, 33),
        suite: "noble",
    },
];

pub fn find(name: &str) -> Option<&'static Base> {
    BASES
        .iter()
        .find(|b| b.name == name || b.aliases.contains(&name))
}

pub fn names() -> String {
    BASES.iter().map(|b| b.name).collect::<Vec<_>>().join(", ")
}
