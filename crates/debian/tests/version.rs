//! Debian version comparison against a table: every row's answer is what `dpkg
//! --compare-versions` (dpkg 1.21, Debian 12) says. The cases are dpkg's and apt's classic
//! ones (policy 5.6.12: `~`, epochs, revisions, zeros, `+bN` binNMUs) plus versions of
//! bookworm's own packages.

use std::cmp::Ordering;

use commstack_debian::version::{DebVersion, Relation};

const TABLE: &[(&str, &str, i8)] = &[
    ("1.0", "1.0", 0),
    ("0:1.0", "1.0", 0),
    ("1.0", "1.0-0", 0),
    ("1.0", "0:1.0-0", 0),
    ("0", "00", 0),
    ("009", "9", 0),
    ("009ab5", "9ab5", 0),
    ("1.2.3", "1.2.3", 0),
    ("4.4.3-2", "4.4.3-2", 0),
    ("1:2ab:5", "1:2ab:5", 0),
    ("7:1-a:b-5", "7:1-a:b-5", 0),
    ("57:1.2.3abYZ+~-4-5", "57:1.2.3abYZ+~-4-5", 0),
    ("1.0~rc1", "1.0", -1),
    ("1.0~rc1", "1.0~rc2", -1),
    ("1.0~~", "1.0~", -1),
    ("1.0~", "1.0", -1),
    ("1.0", "1.0+b1", -1),
    ("1.0", "1.0-0+b1", -1),
    ("1.0", "1.0-0~", 1),
    ("1.0", "1.0a", -1),
    ("1.0a", "1.0+", -1),
    ("1.0.", "1.0+", 1),
    ("2:1", "1:9", 1),
    ("1:0.4", "10.3", 1),
    ("1:1.25-4", "1:1.25-8", -1),
    ("0:1.18.36", "1.18.36", 0),
    ("1.18.36", "1.18.35", 1),
    ("9:1.18.36:5.4-20", "10:0.5.1-22", -1),
    ("9:1.18.36:5.4-20", "9:1.18.36:5.5-1", -1),
    ("9:1.18.36:5.4-20", "9:1.18.37:4.3-22", -1),
    ("1.18.36-0.17.35-18", "1.18.36-19", 1),
    ("1:1.2.13-3", "1:1.2.13-3.1", -1),
    ("2.0.7pre1-4", "2.0.7r-1", -1),
    ("0-pre", "0-pre", 0),
    ("0-pre", "0-pree", -1),
    ("1.1.6r2-2", "1.1.6r-1", 1),
    ("2.6b2-1", "2.6b-2", 1),
    ("98.1p5-1", "98.1-pre2-b6-2", -1),
    ("0.4a6-2", "0.4-1", 1),
    ("1:3.0.5-2", "1:3.0.5.1", -1),
    ("3.0~rc1-1", "3.0-1", -1),
    ("0.2", "1.0-0", -1),
    ("0:0-0-0", "0-0", 1),
    ("7.6p2-4", "7.6-0", 1),
    ("1.0.3-3", "1.0-1", 1),
    ("1.3", "1.2.2-2", 1),
    ("0.4", "0.4-1", -1),
    ("2.36-9+deb12u13", "2.36-9+deb12u9", 1),
    ("3.11.2-1+b1", "3.11.2-1", 1),
    ("12.4+deb12u15", "12.4+deb12u2", 1),
    ("1:2.38.1-5+deb12u3", "2.39", 1),
    ("5.2.15-2+b8", "5.2.15-2+b10", -1),
    ("10", "9", 1),
    ("1.10", "1.9", 1),
    ("1.0-1", "1.0-1.1", -1),
];

#[test]
fn versions_order_as_dpkg_orders_them() {
    let mut wrong = Vec::new();
    for &(a, b, want) in TABLE {
        let (va, vb) = (DebVersion::parse(a).unwrap(), DebVersion::parse(b).unwrap());
        let want = want.cmp(&0);
        if va.cmp(&vb) != want || vb.cmp(&va) != want.reverse() {
            wrong.push(format!("{a} vs {b}: want {want:?}, got {:?}", va.cmp(&vb)));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn relations_hold_as_dpkg_reads_them() {
    let v = |s: &str| DebVersion::parse(s).unwrap();
    let (have, want) = (v("2.36-9+deb12u13"), v("2.36"));
    for (op, holds) in [
        (">=", true),
        (">>", true),
        ("=", false),
        ("<=", false),
        ("<<", false),
        // The obsolete spellings: `>` is `>=`, `<` is `<=`.
        (">", true),
        ("<", false),
    ] {
        assert_eq!(
            Relation::parse(op).unwrap().holds(&have, &want),
            holds,
            "{have} {op} {want}"
        );
    }
    assert!(Relation::Eq.holds(&v("1.0"), &v("1.0-0")));
    assert!(Relation::parse("~=").is_none());
}

#[test]
fn bad_versions_are_refused() {
    assert!(DebVersion::parse("").is_err());
    assert!(DebVersion::parse("x:1.0").is_err());
    assert!(DebVersion::parse("1:-1").is_err());
    assert_eq!(
        DebVersion::parse("1:2.0-3")
            .unwrap()
            .cmp(&DebVersion::parse("1:2.0-3").unwrap()),
        Ordering::Equal
    );
}
