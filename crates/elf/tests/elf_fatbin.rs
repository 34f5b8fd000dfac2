//! Fatbin headers: byte fixtures written from the documented layout, the same bytes placed
//! in `.nv_fatbin` / `__nv_relfatbin` sections of gcc-built objects and archives, and
//! NVIDIA's libnvshmem_device.a / .bc / libnvshmem_host.so.3 when unpacked.

use std::collections::BTreeSet;
use std::process::Command;

use commstack_elf::{DeviceCodeFormat, FatbinKind, parse_fatbin_section, read_device_code};
use commstack_testkit::native::*;

/// One entry header (64 bytes) and a payload of `payload` bytes.
fn entry(kind: u16, arch: u32, payload: usize) -> Vec<u8> {
    let mut e = Vec::new();
    e.extend(kind.to_le_bytes());
    e.extend(0x0101u16.to_le_bytes());
    e.extend(64u32.to_le_bytes()); // header size
    e.extend((payload as u64).to_le_bytes());
    e.extend((payload as u32).to_le_bytes()); // compressed size
    e.extend(0u32.to_le_bytes()); // options offset
    e.extend(8u16.to_le_bytes()); // minor
    e.extend(1u16.to_le_bytes()); // major
    e.extend(arch.to_le_bytes());
    e.extend(0u32.to_le_bytes()); // name offset
    e.extend(0u32.to_le_bytes()); // name length
    e.extend(0x11u64.to_le_bytes()); // flags: 64-bit, linux
    e.extend(0u64.to_le_bytes());
    e.extend((payload as u64).to_le_bytes());
    assert_eq!(e.len(), 64);
    e.extend(std::iter::repeat_n(0xAB, payload));
    e
}

fn container(entries: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = entries.concat();
    let mut c = Vec::new();
    c.extend(0xBA55_ED50u32.to_le_bytes());
    c.extend(1u16.to_le_bytes());
    c.extend(16u16.to_le_bytes());
    c.extend((body.len() as u64).to_le_bytes());
    c.extend(body);
    c
}

/// Two containers, zero-padded to 8 bytes between them: sm_80 + sm_90 cubins and
/// compute_90 PTX, then an sm_90 cubin alone.
fn fixture() -> Vec<u8> {
    let mut bytes = container(&[entry(2, 80, 13), entry(2, 90, 40), entry(1, 90, 7)]);
    while !bytes.len().is_multiple_of(8) {
        bytes.push(0);
    }
    bytes.extend(container(&[entry(2, 90, 16)]));
    bytes
}

fn set(v: &[u32]) -> BTreeSet<u32> {
    v.iter().copied().collect()
}

#[test]
fn parses_containers_from_the_documented_layout() {
    let containers = parse_fatbin_section(&fixture()).unwrap();
    assert_eq!(containers.len(), 2);
    let kinds: Vec<(FatbinKind, u32)> = containers[0].iter().map(|e| (e.kind, e.arch)).collect();
    assert_eq!(
        kinds,
        [
            (FatbinKind::Cubin, 80),
            (FatbinKind::Cubin, 90),
            (FatbinKind::Ptx, 90)
        ]
    );
    assert_eq!(containers[0][1].payload_size, 40);
    assert_eq!(containers[1].len(), 1);
}

#[test]
fn malformed_fatbins_are_errors_not_panics() {
    let good = fixture();
    let err = parse_fatbin_section(&good[..good.len() - 3]).unwrap_err();
    assert!(err.contains("past the end of its section"), "{err}");
    let mut bad_magic = good.clone();
    bad_magic[0] = 0x51;
    assert!(
        parse_fatbin_section(&bad_magic)
            .unwrap_err()
            .contains("no fatbin magic at offset 0x0")
    );
    let mut bad_entry = good.clone();
    bad_entry[16 + 4] = 8; // entry header size 8
    assert!(
        parse_fatbin_section(&bad_entry)
            .unwrap_err()
            .contains("8-byte header")
    );
    let mut huge = good;
    huge[16 + 8..16 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(
        parse_fatbin_section(&huge)
            .unwrap_err()
            .contains("runs past its container")
    );
    assert!(parse_fatbin_section(&[0x50, 0xED]).is_err());
    assert_eq!(
        parse_fatbin_section(&[0; 32]).unwrap().len(),
        0,
        "padding only"
    );
}

/// C source defining `bytes` as a const array placed in `section`.
fn section_source(section: &str, bytes: &[u8]) -> String {
    let list: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
    format!(
        "__attribute__((section(\"{section}\"), used, aligned(8))) const unsigned char fatbin_{}[] = {{{}}};\n",
        section.trim_start_matches(['.', '_']),
        list.join(",")
    )
}

#[test]
fn reads_fatbins_from_a_shared_object_and_a_static_archive() {
    let dir = tempfile::tempdir().unwrap();
    let so = shared_lib(
        dir.path(),
        "libdev.so",
        "libdev.so",
        &section_source(".nv_fatbin", &fixture()),
        &[],
    );
    let code = read_device_code(&so).unwrap();
    assert_eq!(code.format, DeviceCodeFormat::Elf);
    assert_eq!(code.sass_archs(), set(&[80, 90]));
    assert_eq!(code.ptx_archs(), set(&[90]));
    assert_eq!(code.containers.len(), 2);

    // An archive of two -rdc style objects, like libnvshmem_device.a.
    let a = dir.path().join("a.o");
    let b = dir.path().join("b.o");
    let sm100 = container(&[entry(2, 100, 9), entry(1, 100, 5)]);
    compile(
        dir.path(),
        "a.c",
        &section_source("__nv_relfatbin", &fixture()),
        &a,
        &["-c", "-fPIC"],
    );
    compile(
        dir.path(),
        "b.c",
        &section_source("__nv_relfatbin", &sm100),
        &b,
        &["-c", "-fPIC"],
    );
    let archive = dir.path().join("libdev.a");
    assert!(
        Command::new("ar")
            .arg("rcs")
            .arg(&archive)
            .arg(&a)
            .arg(&b)
            .status()
            .unwrap()
            .success()
    );
    let code = read_device_code(&archive).unwrap();
    assert_eq!(code.format, DeviceCodeFormat::Archive);
    assert_eq!(code.sass_archs(), set(&[80, 90, 100]));
    assert_eq!(code.ptx_archs(), set(&[90, 100]));
    let members: BTreeSet<_> = code
        .containers
        .iter()
        .map(|c| c.member.clone().unwrap())
        .collect();
    assert_eq!(
        members,
        ["a.o", "b.o"].iter().map(|s| s.to_string()).collect()
    );
    assert!(
        code.containers
            .iter()
            .all(|c| c.section == "__nv_relfatbin")
    );

    // A library with no device code at all.
    let none = read_device_code("/lib/x86_64-linux-gnu/libstdc++.so.6".as_ref()).unwrap();
    assert!(none.sass_archs().is_empty() && none.containers.is_empty());

    // A corrupt fatbin section names the section.
    let mut broken = fixture();
    broken.truncate(40);
    let so = shared_lib(
        dir.path(),
        "libbad.so",
        "libbad.so",
        &section_source(".nv_fatbin", &broken),
        &[],
    );
    let err = read_device_code(&so).unwrap_err().to_string();
    assert!(
        err.contains("libbad.so") && err.contains(".nv_fatbin"),
        "{err}"
    );
}

#[test]
fn text_is_not_device_code() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("notes.txt");
    std::fs::write(&f, "hello").unwrap();
    assert!(
        read_device_code(&f)
            .unwrap_err()
            .to_string()
            .contains("neither ELF")
    );
}

#[test]
#[ignore = "needs NVIDIA's nvidia-nvshmem-cu13 3.4.5 wheel unpacked (see tests/common nvidia_nvshmem_lib); run with --ignored"]
fn nvidia_device_library_archs() {
    let lib = nvidia_nvshmem_lib();
    // NVSHMEM 3.4.5's default CUDA 13 archs: 75-real;80-real;89-real;90-real;100-real;120.
    let archive = read_device_code(&lib.join("libnvshmem_device.a")).unwrap();
    assert_eq!(archive.format, DeviceCodeFormat::Archive);
    assert_eq!(archive.sass_archs(), set(&[75, 80, 89, 90, 100, 120]));
    assert_eq!(archive.ptx_archs(), set(&[120]));
    let host = read_device_code(&lib.join("libnvshmem_host.so.3")).unwrap();
    assert_eq!(host.sass_archs(), set(&[75, 80, 89, 90, 100, 120]));
    assert!(host.containers.iter().any(|c| c.section == ".nv_fatbin"));
    assert!(
        host.containers
            .iter()
            .any(|c| c.section == "__nv_relfatbin")
    );
    let bc = read_device_code(&lib.join("libnvshmem_device.bc")).unwrap();
    assert_eq!(bc.format, DeviceCodeFormat::LlvmBitcode);
    assert!(bc.nvptx_bitcode);
    assert!(bc.sass_archs().is_empty());
}
