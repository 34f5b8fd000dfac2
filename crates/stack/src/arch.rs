//! CUDA architectures: one grammar for stack.toml's `nvshmem.cuda-archs`, xtask's
//! `--cuda-archs`, NVSHMEM's build options, DeepEP's build and the kernel crate's build
//! script, and every spelling they hand on (CMake, TORCH_CUDA_ARCH_LIST, nvcc).
//!
//! The grammar is CMake's CUDA_ARCHITECTURES entry: `<major><minor>[a|f][-real|-virtual]`,
//! the major one or two digits (no leading zero), the minor one digit: `90` (H100/H200),
//! `90a`, `100f`, `90-real`, `120-virtual`. Only the grammar and NVSHMEM's oldest GPU
//! (sm_70) are checked: whether the locked nvcc knows the SM is for the caller, through
//! [`CudaArch::check_known`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What an entry asks nvcc for, by its CMake suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    /// No suffix: CMake builds SASS and PTX.
    Both,
    /// `-real`: SASS only.
    Sass,
    /// `-virtual`: PTX only.
    Ptx,
}

/// The feature-set suffix of the SM (`sm_90a`, `sm_100f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// No suffix: runs on this SM and (PTX) newer ones.
    Portable,
    /// `a`: this exact SM's extra instructions (wgmma on sm_90a).
    ArchSpecific,
    /// `f`: the SM family's shared instructions (CUDA 12.9+).
    FamilySpecific,
}

/// One CUDA architecture as stack.toml and CMake write it. Serialised as that string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CudaArch {
    major: u8,
    minor: u8,
    variant: Variant,
    code: Code,
}

/// NVSHMEM 3 supports Volta (sm_70) and newer.
pub const MIN_SM: u32 = 70;

/// What to write instead of a refused entry.
pub const HINT: &str = "write <major><minor>[a|f][-real|-virtual] as CMake does: \"90\" (H100/H200), \
                        \"90a\", \"100f\" (B200 family), \"90-real\" (SASS only); not \"sm_90\" or \"9.0\"";

/// A refused entry: the text and what is wrong with it. Its message ends with [`HINT`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{arch:?} is not a CUDA architecture as CMake writes it: {why}; {HINT}")]
pub struct ArchError {
    pub arch: String,
    pub why: String,
}

impl ArchError {
    /// The message without the hint (for diagnostics that show the hint apart).
    pub fn message(&self) -> String {
        format!(
            "{:?} is not a CUDA architecture as CMake writes it: {}",
            self.arch, self.why
        )
    }
}

impl CudaArch {
    /// The SM number: 90 for `90a-real`.
    pub fn sm(&self) -> u32 {
        u32::from(self.major) * 10 + u32::from(self.minor)
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    pub fn code(&self) -> Code {
        self.code
    }

    /// Whether the build carries SASS for it (every entry but `-virtual`).
    pub fn has_sass(&self) -> bool {
        self.code != Code::Ptx
    }

    fn suffix(&self) -> &'static str {
        match self.variant {
            Variant::Portable => "",
            Variant::ArchSpecific => "a",
            Variant::FamilySpecific => "f",
        }
    }

    /// The CMAKE_CUDA_ARCHITECTURES entry: as written (`90a-real`).
    pub fn cmake(&self) -> String {
        self.to_string()
    }

    /// The SASS target nvcc names (`sm_90a`); `None` for `-virtual` (PTX only).
    pub fn sass_name(&self) -> Option<String> {
        self.has_sass()
            .then(|| format!("sm_{}{}", self.sm(), self.suffix()))
    }

    /// The virtual architecture nvcc compiles through (`compute_90a`).
    pub fn ptx_name(&self) -> String {
        format!("compute_{}{}", self.sm(), self.suffix())
    }

    /// The TORCH_CUDA_ARCH_LIST entry (`9.0a`): torch builds SASS for it, so `90` and
    /// `90-real` give the same; `None` for `-virtual`, which has no spelling there.
    pub fn torch(&self) -> Option<String> {
        self.has_sass()
            .then(|| format!("{}.{}{}", self.major, self.minor, self.suffix()))
    }

    /// Refuse an SM that `known` (e.g. the SMs the locked nvcc lists) does not hold.
    pub fn check_known(&self, known: &[u32]) -> Result<(), ArchError> {
        if known.contains(&self.sm()) {
            return Ok(());
        }
        let mut list: Vec<String> = known.iter().map(u32::to_string).collect();
        list.sort();
        Err(ArchError {
            arch: self.to_string(),
            why: format!("sm_{} is not one of {}", self.sm(), list.join(", ")),
        })
    }
}

/// The SMs nvcc builds for, by CUDA major: `nvcc --list-gpu-code` of the locked compiler
/// (13.0.88, from PyPI's nvidia-cuda-nvcc wheel). A manifest entry outside it (say "900")
/// is refused when stack.toml is read, not minutes later inside nvcc's error dump. Majors
/// not listed are checked by the build, which asks the real nvcc first.
pub const NVCC_SMS: &[(u32, &str, &[u32])] = &[(
    13,
    "13.0",
    &[75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121],
)];

/// The nvcc version and SMs listed for a CUDA major, if known.
pub fn nvcc_sms(cuda_major: u32) -> Option<(&'static str, &'static [u32])> {
    NVCC_SMS
        .iter()
        .find(|(major, _, _)| *major == cuda_major)
        .map(|(_, version, sms)| (*version, *sms))
}

impl fmt::Display for CudaArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = match self.code {
            Code::Both => "",
            Code::Sass => "-real",
            Code::Ptx => "-virtual",
        };
        write!(f, "{}{}{code}", self.sm(), self.suffix())
    }
}

impl FromStr for CudaArch {
    type Err = ArchError;

    fn from_str(s: &str) -> Result<CudaArch, ArchError> {
        let fail = |why: String| ArchError {
            arch: s.to_string(),
            why,
        };
        if s.starts_with("sm_") || s.starts_with("compute_") {
            return Err(fail("the sm_/compute_ prefix is nvcc's spelling".into()));
        }
        if s.contains('.') {
            return Err(fail(
                "the dotted form is TORCH_CUDA_ARCH_LIST's spelling".into(),
            ));
        }
        let (base, code) = match s.split_once('-') {
            None => (s, Code::Both),
            Some((b, "real")) => (b, Code::Sass),
            Some((b, "virtual")) => (b, Code::Ptx),
            Some((_, other)) => {
                return Err(fail(format!(
                    "unknown suffix -{other} (CMake knows -real and -virtual)"
                )));
            }
        };
        let (digits, variant) = if let Some(d) = base.strip_suffix('a') {
            (d, Variant::ArchSpecific)
        } else if let Some(d) = base.strip_suffix('f') {
            (d, Variant::FamilySpecific)
        } else {
            (base, Variant::Portable)
        };
        if !(2..=3).contains(&digits.len())
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || digits.starts_with('0')
        {
            return Err(fail(
                "expected the SM number (a one- or two-digit major, then the one-digit minor) \
                 with an optional a or f"
                    .into(),
            ));
        }
        let (major, minor) = digits.split_at(digits.len() - 1);
        let arch = CudaArch {
            major: major.parse().expect("one or two ASCII digits"),
            minor: minor.parse().expect("one ASCII digit"),
            variant,
            code,
        };
        if arch.sm() < MIN_SM {
            return Err(fail(format!(
                "sm_{} is older than sm_{MIN_SM}, the oldest GPU NVSHMEM supports",
                arch.sm()
            )));
        }
        Ok(arch)
    }
}

impl TryFrom<String> for CudaArch {
    type Error = ArchError;
    fn try_from(s: String) -> Result<CudaArch, ArchError> {
        s.parse()
    }
}

impl From<CudaArch> for String {
    fn from(a: CudaArch) -> String {
        a.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(s: &str) -> CudaArch {
        s.parse().unwrap()
    }

    /// The one behaviour every place pins: (entry, CMake, SM, SASS, TORCH_CUDA_ARCH_LIST).
    #[test]
    fn the_pinned_entries_render_everywhere() {
        let cases = [
            ("90", 90, Some("sm_90"), Some("9.0")),
            ("90a", 90, Some("sm_90a"), Some("9.0a")),
            ("100f", 100, Some("sm_100f"), Some("10.0f")),
            ("90-real", 90, Some("sm_90"), Some("9.0")),
            ("120-virtual", 120, None, None),
        ];
        for (text, sm, sass, torch) in cases {
            let a = arch(text);
            assert_eq!(a.cmake(), text);
            assert_eq!(a.sm(), sm, "{text}");
            assert_eq!(a.sass_name().as_deref(), sass, "{text}");
            assert_eq!(a.torch().as_deref(), torch, "{text}");
        }
        assert_eq!(arch("100f").ptx_name(), "compute_100f");
    }

    #[test]
    fn garbage_is_refused_with_the_reason_and_the_hint() {
        for (bad, why) in [
            ("9x0", "expected the SM number"),
            ("9", "expected the SM number"),
            ("1000", "expected the SM number"),
            ("090", "expected the SM number"),
            ("90b", "expected the SM number"),
            ("90A", "expected the SM number"),
            ("", "expected the SM number"),
            ("sm_90", "nvcc's spelling"),
            ("9.0", "TORCH_CUDA_ARCH_LIST's spelling"),
            ("90-ptx", "unknown suffix -ptx"),
            ("60", "older than sm_70"),
        ] {
            let e = bad.parse::<CudaArch>().unwrap_err();
            let text = e.to_string();
            assert!(text.contains(why) && text.ends_with(HINT), "{bad}: {text}");
        }
    }

    #[test]
    fn serde_is_the_cmake_string() {
        let v: Vec<CudaArch> = serde_json::from_str(r#"["90","100f-real"]"#).unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"["90","100f-real"]"#);
        assert!(serde_json::from_str::<CudaArch>(r#""9x0""#).is_err());
    }

    #[test]
    fn a_known_list_can_be_checked() {
        assert!(arch("90a").check_known(&[80, 90, 100]).is_ok());
        let e = arch("900").check_known(&[90, 80]).unwrap_err().to_string();
        assert!(e.contains("sm_900 is not one of 80, 90"), "{e}");
    }
}
