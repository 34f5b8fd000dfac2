//! The little of the C preprocessor NVSHMEM's env_defs.h headers need: comments out,
//! backslash continuations joined, and `#if`/`#ifdef`/`#elif`/`#else`/`#endif` conditions
//! kept as expressions over `defined(MACRO)`, so a variable can be tied to the build
//! option that guards it.

use std::collections::BTreeSet;
use std::fmt;

/// A preprocessor condition over macros being defined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    True,
    Defined(String),
    Not(Box<Cond>),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
    /// Text this reader does not evaluate (`#if X > 3`): taken as possibly true.
    Opaque(String),
}

/// What a condition comes to for a build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truth {
    Yes,
    No,
    /// It names a macro the build does not say anything about.
    Unknown,
}

/// Which macros a build defines, and which it is known not to define; any other macro
/// evaluates as [`Truth::Unknown`].
pub struct Macros<'a> {
    pub defined: &'a BTreeSet<String>,
    pub undefined: &'a BTreeSet<String>,
}

impl Cond {
    pub fn and(a: Cond, b: Cond) -> Cond {
        match (a, b) {
            (Cond::True, c) | (c, Cond::True) => c,
            (a, b) => Cond::And(Box::new(a), Box::new(b)),
        }
    }

    pub fn negate(c: Cond) -> Cond {
        match c {
            Cond::Not(inner) => *inner,
            c => Cond::Not(Box::new(c)),
        }
    }

    pub fn eval(&self, m: &Macros) -> Truth {
        use Truth::*;
        match self {
            Cond::True => Yes,
            Cond::Defined(name) if m.defined.contains(name) => Yes,
            Cond::Defined(name) if m.undefined.contains(name) => No,
            Cond::Defined(_) | Cond::Opaque(_) => Unknown,
            Cond::Not(c) => match c.eval(m) {
                Yes => No,
                No => Yes,
                Unknown => Unknown,
            },
            Cond::And(a, b) => match (a.eval(m), b.eval(m)) {
                (No, _) | (_, No) => No,
                (Yes, Yes) => Yes,
                _ => Unknown,
            },
            Cond::Or(a, b) => match (a.eval(m), b.eval(m)) {
                (Yes, _) | (_, Yes) => Yes,
                (No, No) => No,
                _ => Unknown,
            },
        }
    }

    /// The macros it names, in order.
    pub fn macros(&self) -> Vec<&str> {
        let mut out = Vec::new();
        fn walk<'a>(c: &'a Cond, out: &mut Vec<&'a str>) {
            match c {
                Cond::Defined(n) => {
                    if !out.contains(&n.as_str()) {
                        out.push(n)
                    }
                }
                Cond::Not(c) => walk(c, out),
                Cond::And(a, b) | Cond::Or(a, b) => {
                    walk(a, out);
                    walk(b, out)
                }
                Cond::True | Cond::Opaque(_) => {}
            }
        }
        walk(self, &mut out);
        out
    }
}

impl fmt::Display for Cond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cond::True => f.write_str("1"),
            Cond::Defined(n) => write!(f, "defined({n})"),
            Cond::Not(c) => write!(f, "!({c})"),
            Cond::And(a, b) => write!(f, "({a} && {b})"),
            Cond::Or(a, b) => write!(f, "({a} || {b})"),
            Cond::Opaque(t) => f.write_str(t),
        }
    }
}

/// `text` with `/* */` and `//` comments replaced by spaces (newlines kept, so line numbers
/// stay right) and string literals left intact.
pub fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            out.push(c as char);
            if c == b'\\' && i + 1 < b.len() {
                out.push(b[i + 1] as char);
                i += 2;
                continue;
            }
            if c == b'"' || c == b'\n' {
                in_str = false;
            }
            i += 1;
        } else if c == b'"' {
            in_str = true;
            out.push('"');
            i += 1;
        } else if text[i..].starts_with("/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            for ch in text[i..end].chars() {
                out.push(if ch == '\n' { '\n' } else { ' ' });
            }
            i = end;
        } else if text[i..].starts_with("//") {
            let end = text[i..].find('\n').map_or(b.len(), |e| i + e);
            out.extend(std::iter::repeat_n(' ', text[i..end].chars().count()));
            i = end;
        } else {
            // Copy one whole character (the text may hold UTF-8 outside literals).
            let ch = text[i..]
                .chars()
                .next()
                .expect("i is on a character boundary");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// A preprocessor directive: its keyword and the rest of its (joined) line.
pub fn directive(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .unwrap_or(rest.len());
    Some((&rest[..end], rest[end..].trim()))
}

/// The condition of `#if EXPR` / `#elif EXPR`.
pub fn parse_condition(expr: &str) -> Cond {
    let tokens = tokenize(expr);
    let mut p = Parser { t: &tokens, i: 0 };
    match p.or() {
        Some(c) if p.i == tokens.len() => c,
        _ => Cond::Opaque(expr.trim().to_string()),
    }
}

fn tokenize(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    word.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(word);
        } else {
            chars.next();
            let two: String = [c, chars.peek().copied().unwrap_or(' ')].iter().collect();
            if two == "&&" || two == "||" {
                chars.next();
                out.push(two);
            } else {
                out.push(c.to_string());
            }
        }
    }
    out
}

struct Parser<'a> {
    t: &'a [String],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.t.get(self.i).map(String::as_str)
    }
    fn eat(&mut self, s: &str) -> bool {
        if self.peek() == Some(s) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn or(&mut self) -> Option<Cond> {
        let mut c = self.and()?;
        while self.eat("||") {
            c = Cond::Or(Box::new(c), Box::new(self.and()?));
        }
        Some(c)
    }
    fn and(&mut self) -> Option<Cond> {
        let mut c = self.unary()?;
        while self.eat("&&") {
            c = Cond::And(Box::new(c), Box::new(self.unary()?));
        }
        Some(c)
    }
    fn unary(&mut self) -> Option<Cond> {
        if self.eat("!") {
            return Some(Cond::negate(self.unary()?));
        }
        if self.eat("(") {
            let c = self.or()?;
            return self.eat(")").then_some(c);
        }
        if self.eat("defined") {
            let paren = self.eat("(");
            let name = self.peek()?.to_string();
            if !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                return None;
            }
            self.i += 1;
            if paren && !self.eat(")") {
                return None;
            }
            return Some(Cond::Defined(name));
        }
        match self.peek()? {
            "1" => {
                self.i += 1;
                Some(Cond::True)
            }
            "0" => {
                self.i += 1;
                Some(Cond::negate(Cond::True))
            }
            _ => None,
        }
    }
}

/// The conditions open at a point of a header: one frame per `#if` level.
#[derive(Default)]
pub struct CondStack {
    /// Each frame: the conditions of the earlier branches, and the current branch's.
    frames: Vec<(Vec<Cond>, Cond)>,
}

impl CondStack {
    /// Applies one directive; Err names what is wrong (an `#endif` without `#if`).
    pub fn apply(&mut self, keyword: &str, rest: &str) -> Result<(), String> {
        match keyword {
            "if" => self.frames.push((Vec::new(), parse_condition(rest))),
            "ifdef" => self
                .frames
                .push((Vec::new(), Cond::Defined(first_word(rest)))),
            "ifndef" => self
                .frames
                .push((Vec::new(), Cond::negate(Cond::Defined(first_word(rest))))),
            "elif" | "else" => {
                let (earlier, current) = self
                    .frames
                    .last_mut()
                    .ok_or_else(|| format!("#{keyword} without #if"))?;
                earlier.push(current.clone());
                *current = if keyword == "elif" {
                    parse_condition(rest)
                } else {
                    Cond::True
                };
            }
            "endif" => {
                self.frames.pop().ok_or("#endif without #if")?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The condition under which the current point is compiled.
    pub fn current(&self) -> Cond {
        let mut all = Cond::True;
        for (earlier, current) in &self.frames {
            for e in earlier {
                all = Cond::and(all, Cond::negate(e.clone()));
            }
            all = Cond::and(all, current.clone());
        }
        all
    }

    pub fn depth(&self) -> usize {
        self.frames.len()
    }
}

fn first_word(s: &str) -> String {
    s.split_whitespace().next().unwrap_or("").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_and_evaluate() {
        let c = parse_condition("defined(NVSHMEM_IBGDA_SUPPORT) || defined(NVSHMEM_ENV_ALL)");
        assert_eq!(c.macros(), ["NVSHMEM_IBGDA_SUPPORT", "NVSHMEM_ENV_ALL"]);
        let on: BTreeSet<String> = ["NVSHMEM_IBGDA_SUPPORT".to_string()].into();
        let off: BTreeSet<String> = ["NVSHMEM_ENV_ALL".to_string()].into();
        let none = BTreeSet::new();
        let m = Macros {
            defined: &on,
            undefined: &off,
        };
        assert_eq!(c.eval(&m), Truth::Yes);
        let m = Macros {
            defined: &none,
            undefined: &off,
        };
        assert_eq!(c.eval(&m), Truth::Unknown);
        let both: BTreeSet<String> = [
            "NVSHMEM_IBGDA_SUPPORT".to_string(),
            "NVSHMEM_ENV_ALL".to_string(),
        ]
        .into();
        let m = Macros {
            defined: &none,
            undefined: &both,
        };
        assert_eq!(c.eval(&m), Truth::No);
        assert!(matches!(parse_condition("X > 3"), Cond::Opaque(_)));
        assert_eq!(
            parse_condition("!defined X"),
            Cond::negate(Cond::Defined("X".into()))
        );
    }

    #[test]
    fn elif_and_else_negate_the_earlier_branches() {
        let mut s = CondStack::default();
        s.apply("ifdef", "A").unwrap();
        s.apply("elif", "defined(B)").unwrap();
        assert_eq!(s.current().to_string(), "(!(defined(A)) && defined(B))");
        s.apply("else", "").unwrap();
        assert_eq!(s.current().to_string(), "(!(defined(A)) && !(defined(B)))");
        s.apply("endif", "").unwrap();
        assert_eq!(s.current(), Cond::True);
        assert!(s.apply("endif", "").is_err());
    }

    #[test]
    fn comments_go_and_lines_stay() {
        let t = "a /* x\ny */ b // c \"d\"\n\"/* kept */\"\n";
        let s = strip_comments(t);
        assert_eq!(s.lines().count(), 3);
        assert!(s.contains("\"/* kept */\""));
        assert!(!s.contains('x') && !s.contains('c'));
    }
}
