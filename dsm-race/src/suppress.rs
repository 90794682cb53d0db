//! Race suppressions (`dsmrun --race-suppressions FILE`): known, accepted races that a
//! report should not print nor count for the exit status (as ThreadSanitizer's and
//! Valgrind's suppression files do). Suppressed races are still counted apart, so a run
//! says how many it silenced.
//!
//! One entry a line, `CLASS:FIELD=VALUE`; `#` starts a comment, blank lines are skipped.
//! CLASS is `race` (data races) or `lock-order` (lock-order dependences of schedule mode).
//! FIELD is one of
//! - `variable`: the allocation's name, exactly;
//! - `file`: either side's source file, as the compiler names it, or any trailing part of
//!   it made of whole path components (`search.rs`, `src/tsp/search.rs`);
//! - `line`: either side's `file:line`, the file matched as for `file`;
//! - `function`: either side's function, as reports name it, as a pattern where `*`
//!   stands for any run of characters (`*SharedBound*::bound`); the reporter then names
//!   functions as it goes.
//!
//! An entry matches a race when the race is of its class and its field matches; a race is
//! suppressed when any entry matches it.

use crate::detect::{Race, RaceClass};
use crate::pinpoint::Hit;
use thiserror::Error;

/// A suppression file that could not be read as one.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("line {line}: {reason}: {text:?} (entries are CLASS:FIELD=VALUE, CLASS race or lock-order, FIELD variable, file, line or function)")]
pub struct SuppressionError {
    /// The line (from 1).
    pub line: usize,
    /// The line as written.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

/// What an entry matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Matcher {
    Variable(String),
    File(String),
    Line(String, u32),
    Function(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    class: RaceClass,
    matcher: Matcher,
    /// The entry as written, without its comment.
    text: String,
}

/// The parsed entries of a suppression file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Suppressions {
    entries: Vec<Entry>,
}

impl Suppressions {
    /// Parses a suppression file's text; the first malformed or unknown entry is an error
    /// naming its line.
    pub fn parse(text: &str) -> Result<Self, SuppressionError> {
        let mut entries = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fail = |reason: &str| SuppressionError {
                line: i + 1,
                text: raw.trim().to_string(),
                reason: reason.to_string(),
            };
            let (class, rest) = line.split_once(':').ok_or_else(|| fail("no CLASS:"))?;
            let class = match class.trim() {
                "race" => RaceClass::DataRace,
                "lock-order" => RaceClass::LockOrder,
                _ => return Err(fail("unknown class (race or lock-order)")),
            };
            let (field, value) = rest.split_once('=').ok_or_else(|| fail("no FIELD=VALUE"))?;
            let value = value.trim();
            if value.is_empty() {
                return Err(fail("empty value"));
            }
            let matcher = match field.trim() {
                "variable" => Matcher::Variable(value.into()),
                "file" => Matcher::File(value.into()),
                "function" => Matcher::Function(value.into()),
                "line" => {
                    let (file, n) = value
                        .rsplit_once(':')
                        .ok_or_else(|| fail("a line entry is FILE:LINE"))?;
                    let n = n
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| n > 0 && !file.is_empty())
                        .ok_or_else(|| fail("a line entry is FILE:LINE, LINE a number from 1"))?;
                    Matcher::Line(file.into(), n)
                }
                _ => return Err(fail("unknown field (variable, file, line or function)")),
            };
            entries.push(Entry {
                class,
                matcher,
                text: line.to_string(),
            });
        }
        Ok(Suppressions { entries })
    }

    /// The entries as written, one a line, without comments and blank lines: what the
    /// ranks are given to parse again.
    pub fn entries(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.text.clone()).collect()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether an entry matches by function (reports then name functions as they go).
    pub fn by_function(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.matcher, Matcher::Function(_)))
    }

    /// Whether an entry suppresses `race`, whose sides were made at `sides` (each side's
    /// source locations, as the report gives them; empty where unknown).
    pub fn suppresses(&self, race: &Race, sides: [&[Hit]; 2]) -> bool {
        let located = || sides.iter().flat_map(|s| s.iter());
        self.entries
            .iter()
            .filter(|e| e.class == race.class)
            .any(|e| match &e.matcher {
                Matcher::Variable(v) => *v == race.variable,
                Matcher::File(f) => located().any(|h| same_file(&h.file, f)),
                Matcher::Line(f, n) => located().any(|h| h.line == *n && same_file(&h.file, f)),
                Matcher::Function(pattern) => located()
                    .filter_map(|h| h.function.as_deref())
                    .any(|func| glob(pattern, func)),
            })
    }
}

/// `path` is `entry`, or ends with it after a `/`.
fn same_file(path: &str, entry: &str) -> bool {
    path == entry
        || path
            .strip_suffix(entry)
            .is_some_and(|head| head.ends_with('/'))
}

/// `text` matches `pattern`, in which `*` stands for any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = parts.split_first().expect("split yields a part");
    let Some(mut tail) = text.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return tail.is_empty();
    };
    for part in middle {
        match tail.find(part) {
            Some(at) => tail = &tail[at + part.len()..],
            None => return false,
        }
    }
    tail.len() >= last.len() && tail.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{Access, RaceKind};
    use dsm_proto::SyncCause;

    fn race(class: RaceClass) -> Race {
        let side = |node| Access {
            node,
            interval: 3,
            write: true,
            began_with: SyncCause::Start,
        };
        Race {
            epoch: 1,
            variable: "bound".into(),
            index: 0,
            row_col: None,
            addr: 0,
            bytes: (0, 8),
            kind: RaceKind::WriteWrite,
            first: side(0),
            second: side(1),
            class,
            sites: Default::default(),
        }
    }

    fn at(file: &str, line: u32, function: Option<&str>) -> Hit {
        Hit {
            variable: "bound".into(),
            index: 0,
            epoch: 1,
            rank: 0,
            interval: 3,
            write: true,
            file: file.into(),
            line,
            column: 5,
            function: function.map(Into::into),
        }
    }

    #[test]
    fn entries_match_by_variable_file_line_and_function() {
        let s = Suppressions::parse(
            "# accepted races\n\
             race:variable=bound\n\
             \n\
             race:file=tsp/search.rs   # trailing components\n\
             race:line=apps/src/k.rs:12\n\
             race:function=apps::tsp::*::read_bound\n\
             lock-order:variable=energy\n",
        )
        .unwrap();
        let data = race(RaceClass::DataRace);
        let other = Race {
            variable: "grid".into(),
            ..data.clone()
        };
        let none: [&[Hit]; 2] = [&[], &[]];
        assert!(s.suppresses(&data, none));
        assert!(!s.suppresses(&other, none));
        let search = [at("apps/src/tsp/search.rs", 697, None)];
        assert!(s.suppresses(&other, [&[], &search]));
        // Whole components only: `xtsp/search.rs` is another file.
        let near = [at("apps/src/xtsp/search.rs", 697, None)];
        assert!(!s.suppresses(&other, [&near, &[]]));
        assert!(s.suppresses(&other, [&[at("apps/src/k.rs", 12, None)], &[]]));
        assert!(!s.suppresses(&other, [&[at("apps/src/k.rs", 13, None)], &[]]));
        let f = [at(
            "x.rs",
            1,
            Some("apps::tsp::search::Searcher::read_bound"),
        )];
        assert!(s.suppresses(&other, [&f, &[]]));
        let g = [at(
            "x.rs",
            1,
            Some("apps::tsp::search::Searcher::read_bounds"),
        )];
        assert!(!s.suppresses(&other, [&g, &[]]));
        // Classes are apart.
        let order = Race {
            variable: "energy".into(),
            ..race(RaceClass::LockOrder)
        };
        assert!(s.suppresses(&order, none));
        assert!(!s.suppresses(
            &Race {
                class: RaceClass::DataRace,
                ..order.clone()
            },
            none
        ));
    }

    #[test]
    fn malformed_entries_name_their_line() {
        for (text, line, reason) in [
            ("race:variable=a\nrace variable=b\n", 2, "no CLASS:"),
            ("data:variable=a", 1, "unknown class"),
            ("race:var=a", 1, "unknown field"),
            ("# c\n\nrace:variable=", 3, "empty value"),
            ("race:variable", 1, "no FIELD=VALUE"),
            ("race:line=search.rs", 1, "FILE:LINE"),
            ("race:line=search.rs:0", 1, "a number from 1"),
            ("race:line=:5", 1, "a number from 1"),
        ] {
            let e = Suppressions::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text}");
            assert!(e.reason.contains(reason), "{text}: {e}");
            assert!(e.to_string().starts_with(&format!("line {line}: ")), "{e}");
        }
    }

    #[test]
    fn glob_patterns() {
        assert!(glob("a::*", "a::b::c"));
        assert!(glob("*::c", "a::b::c"));
        assert!(glob("a*c", "abc"));
        assert!(glob("a*b*c", "a1b2c"));
        assert!(!glob("a*b*c", "a1c2b"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(!glob("ab*ba", "aba"));
        assert!(glob("*", ""));
    }
}
