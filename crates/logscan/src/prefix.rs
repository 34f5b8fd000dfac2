//! `kubectl logs --prefix` puts `[pod/NAME/CONTAINER] ` before each line of a pod's log.
//! A job's collected logs are classified as a node's own log is: the prefix is taken off
//! before matching (signatures and glog-style levels anchored at the line's start must
//! still match) and kept as the place the line came from.

/// The prefix (without its brackets) and the line after it, or None when the line does
/// not start with kubectl's exact form.
pub fn split(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = line.strip_prefix(b"[pod/")?;
    let close = memchr::memchr(b']', rest)?;
    let inside = &rest[..close];
    // pod/NAME/CONTAINER: two names of a DNS label's alphabet (kubectl prints nothing else).
    let mut parts = inside.split(|&b| b == b'/');
    let (Some(name), Some(container), None) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    let ok = |p: &[u8]| {
        !p.is_empty()
            && p.len() <= 253
            && p.iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(b))
    };
    if !ok(name) || !ok(container) {
        return None;
    }
    let after = rest[close + 1..].strip_prefix(b" ")?;
    Some((&line[1..5 + close], after))
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn kubectls_prefix_only() {
        let (p, rest) = split(b"[pod/a-0-x7k2p/main] NCCL WARN x").unwrap();
        assert_eq!((p, rest), (&b"pod/a-0-x7k2p/main"[..], &b"NCCL WARN x"[..]));
        for other in [
            &b"[pod/a] x"[..],
            b"[pod/a/b/c] x",
            b"[pod/a/b]x",
            b"[rank0]:[W1218 x",
            b"[pod/a b/c] x",
        ] {
            assert_eq!(split(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
