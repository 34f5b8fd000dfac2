//! A copy of libstdc++ linked into a shared object (`-static-libstdc++`, or a compiler
//! that finds only `libstdc++.a`). In a process that has loaded `libstdc++.so.6` already
//! (torch does, before any extension), two copies break `std::locale`: with
//! `-Bsymbolic-functions` the copy's functions bind inside the object while its data
//! (locale ids, the classic locale) binds to the first-loaded `libstdc++.so.6`, so one
//! copy's code runs on the other's data. DeepEP V2's JIT died that way in `std::regex`
//! (docs/deepep-v2.md).

use goblin::elf::sym::{STB_GLOBAL, STB_GNU_UNIQUE};

use super::{ElfError, ElfFile};

/// Mangled-name prefixes of classes only libstdc++ itself defines out of line:
/// `std::locale`, `std::ios_base`, `std::ctype`, the `codecvt` family. A program or
/// extension instantiates templates and inline functions as weak definitions; a strong
/// (global or unique) definition of these comes from libstdc++'s own objects.
pub const LIBSTDCXX_INTERNAL_PREFIXES: [&str; 4] = ["6locale", "8ios_base", "5ctype", "7codecvt"];

/// The dynamic symbols `name` defines strongly that belong to libstdc++'s internals.
pub fn is_libstdcxx_internal(name: &str) -> bool {
    let rest = name
        .strip_prefix("_ZNSt")
        .or_else(|| name.strip_prefix("_ZNKSt"))
        .or_else(|| name.strip_prefix("_ZTVSt"))
        .or_else(|| name.strip_prefix("_ZTISt"));
    let Some(rest) = rest else {
        return false;
    };
    if LIBSTDCXX_INTERNAL_PREFIXES
        .iter()
        .any(|p| rest.starts_with(p))
    {
        return true;
    }
    // `std::__codecvt_utf8_base`, `std::__codecvt_utf16_base`, ...: <length>__codecvt_
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with("__codecvt_")
}

impl ElfFile {
    /// Every symbol of libstdc++'s internals this object defines and exports (global or
    /// unique binding, in its dynamic symbol table), sorted: empty for an object linked
    /// against `libstdc++.so.6`.
    pub fn libstdcxx_internals(&self) -> Result<Vec<String>, ElfError> {
        let elf = self.parse()?;
        let mut names: Vec<String> = elf
            .dynsyms
            .iter()
            .filter(|s| s.st_shndx != 0)
            .filter(|s| matches!(s.st_bind(), STB_GLOBAL | STB_GNU_UNIQUE))
            .filter_map(|s| elf.dynstrtab.get_at(s.st_name))
            .filter(|n| is_libstdcxx_internal(n))
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_libstdcxx_classes_count_and_templates_of_others_do_not() {
        for internal in [
            "_ZNSt6locale7classicEv",
            "_ZNKSt6locale4nameB5cxx11Ev",
            "_ZNSt8ios_base4InitC1Ev",
            "_ZTVSt7codecvtIcc11__mbstate_tE",
            "_ZNKSt19__codecvt_utf16_baseIDsE10do_unshiftER11__mbstate_tPcS3_RS3_",
        ] {
            assert!(is_libstdcxx_internal(internal), "{internal}");
        }
        for other in [
            "_ZNSt6vectorIiSaIiEE9push_backERKi",
            "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEED1Ev",
            "_ZN6deepep8dispatchEv",
            "_ZNSt10__codecvt",
            "PyInit__C",
        ] {
            assert!(!is_libstdcxx_internal(other), "{other}");
        }
    }
}
