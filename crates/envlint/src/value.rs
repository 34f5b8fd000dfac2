//! Whether a value reads as its variable's type, judged by how the library that reads it
//! parses text (not by what a person means): NVSHMEM's booleans look at one character,
//! NCCL's integers turn "true" into 0 without a word, DeepEP's `int()` raises.

use crate::known::Reader;

/// A problem with a value: what the library makes of it, and what to write instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub message: String,
    pub fix: String,
}

fn problem(message: String, fix: impl Into<String>) -> Option<Problem> {
    Some(Problem {
        message,
        fix: fix.into(),
    })
}

/// The problem with `value` for a variable read by `reader` (with `allowed` values when
/// the variable lists them), or None when it reads as meant.
pub fn check(reader: Reader, allowed: &[String], value: &str) -> Option<Problem> {
    match reader {
        Reader::NvshmemBool => nvshmem_bool(value),
        Reader::NvshmemInt => {
            c_integer(value, i32::MIN.into(), i32::MAX.into(), "NVSHMEM", "an int")
        }
        Reader::NvshmemLong => {
            c_integer(value, i64::MIN.into(), i64::MAX.into(), "NVSHMEM", "a long")
        }
        Reader::NvshmemSize => nvshmem_size(value),
        Reader::NcclInt => c_integer(
            value,
            i64::MIN.into(),
            i64::MAX.into(),
            "NCCL",
            "an integer",
        ),
        Reader::PythonInt => python_int(value),
        Reader::Text => one_of(allowed, value),
    }
}

fn nvshmem_bool(value: &str) -> Option<Problem> {
    let lower = value.to_ascii_lowercase();
    if ["1", "0", "true", "false", "yes", "no", "y", "n", "on"].contains(&lower.as_str()) {
        return None;
    }
    // nvshmemi_getenv_bool: set and starting with 0/N/n/F/f is false, else true.
    let means = match value.chars().next() {
        Some('0' | 'N' | 'n' | 'F' | 'f') => "false",
        _ => "true",
    };
    let said = if value.is_empty() {
        "the empty value".to_string()
    } else {
        format!("{value:?}")
    };
    problem(
        format!(
            "not a boolean: NVSHMEM reads only a boolean's first character, so {said} means {means}"
        ),
        "write 1 or 0",
    )
}

/// `strtol(s, &end, 0)`: an optional sign, then decimal, `0x` hex or `0` octal digits.
fn c_integer(value: &str, min: i128, max: i128, lib: &str, what: &str) -> Option<Problem> {
    let t = value.trim_start();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (radix, body) = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (16, h)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    let lead: String = body.chars().take_while(|c| c.is_digit(radix)).collect();
    let whole = !lead.is_empty() && lead.len() == body.len() && t.len() == value.len();
    if whole {
        let parsed = i128::from_str_radix(&lead, radix)
            .ok()
            .map(|v| if neg { -v } else { v });
        return match parsed {
            Some(v) if v < min || v > max => problem(
                format!("{value} is out of range for {what} ({min} to {max})"),
                "write a smaller number",
            ),
            Some(v) if radix == 8 => problem(
                format!(
                    "{value:?} is read as octal ({lib} reads numbers with base 0): it means {v}"
                ),
                format!(
                    "write {} without the leading zero, or {v} if octal was meant",
                    value.trim_start_matches('0')
                ),
            ),
            Some(_) => None,
            None => problem(
                format!("{value} is out of range for {what}"),
                "write a smaller number",
            ),
        };
    }
    let read = if lead.is_empty() && !(radix == 8 && body.is_empty()) {
        "0".to_string()
    } else {
        let v = i128::from_str_radix(if lead.is_empty() { "0" } else { &lead }, radix).unwrap_or(0);
        (if neg { -v } else { v }).to_string()
    };
    let consequence = match lib {
        "NCCL" => format!("NCCL reads it as {read} without a word (strtoll)"),
        _ => format!("{lib} reads it as {read} (strtol) and ignores the rest"),
    };
    problem(
        format!("not {what}: {value:?}; {consequence}"),
        "write a whole number, e.g. 1 or 0 for a switch",
    )
}

/// `nvshmemi_atol_scaled`: a non-negative decimal number (a fraction allowed) and one
/// optional multiplier k/m/g/t (binary: 2^10 ...); NVSHMEM ignores what follows it.
fn nvshmem_size(value: &str) -> Option<Problem> {
    let num_end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, rest) = value.split_at(num_end);
    let number_ok = !number.is_empty()
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    let mut suffix = rest.chars();
    let suffix_ok = match suffix.next() {
        None => true,
        Some('k' | 'K' | 'm' | 'M' | 'g' | 'G' | 't' | 'T') => {
            matches!(suffix.as_str(), "" | "i" | "B" | "iB" | "b")
        }
        Some(_) => false,
    };
    if number_ok && suffix_ok {
        return None;
    }
    problem(
        format!(
            "not a size: {value:?} (NVSHMEM reads a number and one of k, m, g, t: binary multiples; it stops at an error or ignores what follows)"
        ),
        "write e.g. 1073741824, 1024m or 1g",
    )
}

/// Python's `int(text)`: optional whitespace and sign, decimal digits (underscores between).
fn python_int(value: &str) -> Option<Problem> {
    let t = value.trim();
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    let ok = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_');
    if ok {
        return None;
    }
    problem(
        format!("not an integer: {value:?}; it is read with int(), which raises ValueError on it"),
        "write a whole number, e.g. 1 or 0 for a switch",
    )
}

fn one_of(allowed: &[String], value: &str) -> Option<Problem> {
    if allowed.is_empty() || allowed.iter().any(|a| a.eq_ignore_ascii_case(value)) {
        return None;
    }
    problem(
        format!("{value:?} is not one of its values: {}", allowed.join(", ")),
        format!("write one of {}", allowed.join(", ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(reader: Reader, v: &str) -> String {
        check(reader, &[], v).map(|p| p.message).unwrap_or_default()
    }

    #[test]
    fn nvshmem_booleans_are_judged_by_their_first_character() {
        for ok in ["1", "0", "true", "FALSE", "yes", "n"] {
            assert_eq!(check(Reader::NvshmemBool, &[], ok), None, "{ok}");
        }
        assert!(bad(Reader::NvshmemBool, "off").contains("\"off\" means true"));
        assert!(bad(Reader::NvshmemBool, "").contains("the empty value means true"));
        assert!(bad(Reader::NvshmemBool, "fast").contains("means false"));
    }

    #[test]
    fn integers_as_strtol_reads_them() {
        for ok in ["0", "-1", "1024", "0x10", "+3"] {
            assert_eq!(check(Reader::NvshmemInt, &[], ok), None, "{ok}");
        }
        assert!(bad(Reader::NvshmemInt, "010").contains("octal"));
        assert!(bad(Reader::NvshmemInt, "3000000000").contains("out of range"));
        assert!(bad(Reader::NvshmemInt, "1k").contains("reads it as 1 (strtol)"));
        assert!(bad(Reader::NcclInt, "true").contains("NCCL reads it as 0 without a word"));
        assert_eq!(check(Reader::NcclInt, &[], "3000000000"), None);
    }

    #[test]
    fn sizes_python_ints_and_lists() {
        for ok in ["1024", "20m", "3.1M", ".5g", "1G", "2Gi", "1GiB"] {
            assert_eq!(check(Reader::NvshmemSize, &[], ok), None, "{ok}");
        }
        for b in ["-1", "1 G", "1Q", "", "m"] {
            assert!(bad(Reader::NvshmemSize, b).contains("not a size"), "{b}");
        }
        assert_eq!(check(Reader::PythonInt, &[], " 1_000 "), None);
        assert!(bad(Reader::PythonInt, "true").contains("ValueError"));
        let allowed = vec!["PMI".to_string(), "UID".to_string()];
        assert_eq!(check(Reader::Text, &allowed, "uid"), None);
        assert!(
            check(Reader::Text, &allowed, "pmix")
                .unwrap()
                .message
                .contains("PMI, UID")
        );
    }
}
