//! Parsers for the /proc files the checks read. Formats as the kernel and the NVIDIA driver
//! write them (see the fixture trees under tests/fixtures for real examples).

use std::collections::BTreeMap;

/// `/proc/driver/nvidia/version`: the kernel module's version from its first line, either
/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  ...` or
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ...`.
pub fn kernel_module_version(text: &str) -> Option<String> {
    let first = text.lines().next()?;
    let after = &first[first.find("Kernel Module")?..];
    after
        .split_whitespace()
        .find(|t| {
            t.contains('.')
                && t.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// `/proc/driver/nvidia/params`: `Key: value` lines; string values are quoted.
pub fn nvidia_params(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

/// `RegistryDwords: "PeerMappingOverride=1;RMForceStaticBar1=1"` -> key -> value (keys as
/// written; the driver matches them case-insensitively, so look up with [`registry_value`]).
pub fn registry_dwords(value: &str) -> BTreeMap<String, String> {
    value
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A RegistryDwords value as a number (decimal or 0x hex).
pub fn registry_value(dwords: &BTreeMap<String, String>, key: &str) -> Option<u64> {
    let (_, v) = dwords.iter().find(|(k, _)| k.eq_ignore_ascii_case(key))?;
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// `/proc/modules`: the names of loaded modules (first field of each line).
pub fn loaded_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// A resource limit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    Bytes(u64),
}

/// `/proc/self/limits`: the soft and hard "Max locked memory" limits.
pub fn memlock_limits(text: &str) -> Option<(Limit, Limit)> {
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let mut values = line["Max locked memory".len()..].split_whitespace();
    let parse = |v: &str| {
        if v == "unlimited" {
            Some(Limit::Unlimited)
        } else {
            v.parse().ok().map(Limit::Bytes)
        }
    };
    Some((parse(values.next()?)?, parse(values.next()?)?))
}

/// One line of `/proc/mounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub device: String,
    pub mount_point: String,
    pub fs_type: String,
    pub options: Vec<String>,
}

pub fn mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(Mount {
                device: f.next()?.to_string(),
                mount_point: f.next()?.replace("\\040", " "),
                fs_type: f.next()?.to_string(),
                options: f.next()?.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// A tmpfs `size=` option in bytes: `size=65536k`, `size=2g`, `size=1073741824`.
pub fn tmpfs_size(options: &[String]) -> Option<u64> {
    let value = options.iter().find_map(|o| o.strip_prefix("size="))?;
    let (digits, unit) = value.split_at(
        value
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(value.len()),
    );
    let n: u64 = digits.parse().ok()?;
    let factor = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return None,
    };
    Some(n * factor)
}

/// `/proc/meminfo` MemTotal in bytes.
pub fn mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Binary units ("64.00 GiB"), as every commstack command prints sizes.
pub fn human_bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kernel_module_spellings() {
        assert_eq!(
            kernel_module_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  Tue Jan 1\nGCC version: gcc 13.3.0"
            ),
            Some("550.163.01".into())
        );
        assert_eq!(
            kernel_module_version(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-B17-02-5)  Tue Sep 23 09:55:41 UTC 2025"
            ),
            Some("580.95.05".into())
        );
        assert_eq!(
            kernel_module_version("GCC version:  gcc version 13.3.0"),
            None
        );
    }

    #[test]
    fn params_and_registry_dwords() {
        let p = nvidia_params(
            "EnableStreamMemOPs: 0\nRegistryDwords: \"PeerMappingOverride=1;RMForceStaticBar1=0x1\"\n",
        );
        assert_eq!(p["EnableStreamMemOPs"], "0");
        let d = registry_dwords(&p["RegistryDwords"]);
        assert_eq!(registry_value(&d, "peermappingoverride"), Some(1));
        assert_eq!(registry_value(&d, "RMForceStaticBar1"), Some(1));
        assert_eq!(
            registry_value(&registry_dwords(""), "PeerMappingOverride"),
            None
        );
    }

    #[test]
    fn limits_mounts_sizes() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max locked memory         8388608              unlimited            bytes     \n";
        assert_eq!(
            memlock_limits(limits),
            Some((Limit::Bytes(8388608), Limit::Unlimited))
        );
        let m = mounts("shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k 0 0\n");
        assert_eq!(m[0].mount_point, "/dev/shm");
        assert_eq!(tmpfs_size(&m[0].options), Some(64 << 20));
        assert_eq!(tmpfs_size(&["size=2g".into()]), Some(2 << 30));
        assert_eq!(tmpfs_size(&["size=50%".into()]), None);
        assert_eq!(
            mem_total("MemTotal:       24576000 kB\n"),
            Some(24576000 * 1024)
        );
    }
}
