//! Pinpointing the source lines of races (`dsmrun --pinpoint VAR[INDEX]@EPOCH`,
//! `--pinpoint-log FILE`): storing the instruction of every access is prohibitive (the
//! paper's section 6.1), so a second run, with the same synchronization order
//! (`--replay`), watches only the named elements in the named epochs. Each node notes the
//! source location of every access to a watched element (`Hit`, from `#[track_caller]`
//! on the view accessors) and writes its hits of an epoch to a file before it arrives at
//! the barrier that ends it; the barrier master reads every node's file when it analyses
//! that epoch and prints both sides of each race on a watched element with their code.

use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

/// An element to watch: `variable[index]` in epoch `epoch` (counted like race reports).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PinTarget {
    /// The allocation's name.
    pub variable: String,
    /// The element index (row-major for 2-D arrays, as in the race log).
    pub index: usize,
    /// The epoch.
    pub epoch: u32,
}

impl std::str::FromStr for PinTarget {
    type Err = String;

    /// Parses `VAR[INDEX]@EPOCH`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not VAR[INDEX]@EPOCH (e.g. bound[0]@3)");
        let (elem, epoch) = s.trim().rsplit_once('@').ok_or_else(bad)?;
        let (var, rest) = elem.split_once('[').ok_or_else(bad)?;
        let index = rest.strip_suffix(']').ok_or_else(bad)?;
        // `;` separates targets in DSM_PINPOINT: a name holding one would split there.
        if var.is_empty() || var.contains(';') {
            return Err(bad());
        }
        let epoch = epoch.trim().parse().map_err(|_| bad())?;
        if epoch == 0 {
            return Err(format!(
                "'{s}': epochs are numbered from 1 (the accesses before the first barrier)"
            ));
        }
        Ok(PinTarget {
            variable: var.to_string(),
            index: index.trim().parse().map_err(|_| bad())?,
            epoch,
        })
    }
}

impl std::fmt::Display for PinTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]@{}", self.variable, self.index, self.epoch)
    }
}

/// The targets of an earlier run's race log: every (variable, index, epoch) of its data
/// races (lock-order dependences too), without duplicates, in the log's order.
pub fn targets_from_log(log: impl BufRead) -> io::Result<Vec<PinTarget>> {
    let mut out: Vec<PinTarget> = Vec::new();
    for (n, line) in log.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("line {} of the race log: {why}", n + 1),
            )
        };
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| bad(&e.to_string()))?;
        let t = PinTarget {
            variable: v["variable"]
                .as_str()
                .ok_or_else(|| bad("no variable"))?
                .to_string(),
            index: v["index"].as_u64().ok_or_else(|| bad("no index"))? as usize,
            epoch: v["epoch"].as_u64().ok_or_else(|| bad("no epoch"))? as u32,
        };
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

/// One access to a watched element, with its source location.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hit {
    /// The element.
    pub variable: String,
    /// Its index.
    pub index: usize,
    /// The epoch.
    pub epoch: u32,
    /// The node that accessed it.
    pub rank: u16,
    /// The node's interval (as in race reports).
    pub interval: u32,
    /// A write (else a read).
    pub write: bool,
    /// Source file, as the compiler names it.
    pub file: String,
    /// Line (from 1).
    pub line: u32,
    /// Column (from 1).
    pub column: u32,
    /// The function containing the access, when a backtrace could name it.
    pub function: Option<String>,
}

impl Hit {
    /// `file:line:column`.
    pub fn location(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.column)
    }
}

/// The file where `rank` writes its hits of `epoch`.
pub fn hits_path(dir: &Path, rank: usize, epoch: u32) -> PathBuf {
    dir.join(format!("hits.{epoch}.{rank}.jsonl"))
}

/// Appends hits to their node's file for their epoch.
pub fn append_hits(dir: &Path, rank: usize, hits: &[Hit]) -> io::Result<()> {
    let mut by_epoch: std::collections::BTreeMap<u32, Vec<&Hit>> = Default::default();
    for h in hits {
        by_epoch.entry(h.epoch).or_default().push(h);
    }
    for (epoch, hs) in by_epoch {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(hits_path(dir, rank, epoch))?;
        let mut text = String::new();
        for h in hs {
            text.push_str(&serde_json::to_string(h).map_err(io::Error::other)?);
            text.push('\n');
        }
        f.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// Every node's hits of `epoch` (a node without hits has no file).
pub fn read_hits(dir: &Path, nodes: usize, epoch: u32) -> Vec<Hit> {
    let mut out = Vec::new();
    for rank in 0..nodes {
        let Ok(text) = std::fs::read_to_string(hits_path(dir, rank, epoch)) else {
            continue;
        };
        out.extend(text.lines().filter_map(|l| serde_json::from_str(l).ok()));
    }
    out
}

/// The text of line `line` of `file`, looked up relative to the current directory and
/// then to each of `roots` (the compiler names workspace files relative to the
/// workspace root).
pub fn source_line(file: &str, line: u32, roots: &[PathBuf]) -> Option<String> {
    let candidates = std::iter::once(PathBuf::from(file)).chain(roots.iter().map(|r| r.join(file)));
    for path in candidates {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return text
                .lines()
                .nth(line.checked_sub(1)? as usize)
                .map(|l| l.trim().to_string());
        }
    }
    None
}

/// The function whose frame is at `file:line` in a backtrace's text (as
/// `std::backtrace::Backtrace` prints it), without the hash suffix.
pub fn function_in_backtrace(backtrace: &str, file: &str, line: u32) -> Option<String> {
    // A frame's path is as the compiler named it, absolute, or relative to the current
    // directory (`./src/x.rs` for `apps/src/x.rs` when run from `apps`): compare tails.
    let same_file = |path: &str| {
        let path = path.trim_start_matches("./");
        path.ends_with(file) || file.ends_with(path)
    };
    let lines: Vec<&str> = backtrace.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let Some(at) = l.trim().strip_prefix("at ") else {
            continue;
        };
        let mut parts = at.rsplitn(3, ':');
        let (_col, frame_line, path) = (parts.next(), parts.next(), parts.next());
        let (Some(frame_line), Some(path)) = (frame_line, path) else {
            continue;
        };
        if i == 0 || frame_line.parse::<u32>().ok() != Some(line) || !same_file(path) {
            continue;
        }
        let f = lines[i - 1].trim();
        let f = f.split_once(": ").map_or(f, |(_, name)| name);
        let f = match f.rfind("::h") {
            Some(at) if f[at + 3..].chars().all(|c| c.is_ascii_hexdigit()) => &f[..at],
            _ => f,
        };
        return Some(f.to_string());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print() {
        let t: PinTarget = "bound[0]@3".parse().unwrap();
        assert_eq!(
            t,
            PinTarget {
                variable: "bound".into(),
                index: 0,
                epoch: 3
            }
        );
        assert_eq!(t.to_string(), "bound[0]@3");
        for bad in [
            "bound",
            "bound[0]",
            "bound[x]@3",
            "[1]@2",
            "b[1]@",
            "b1]@2",
            "a;b[0]@1",
        ] {
            assert!(bad.parse::<PinTarget>().is_err(), "{bad}");
        }
        let e = "bound[0]@0".parse::<PinTarget>().unwrap_err();
        assert!(e.contains("numbered from 1"), "{e}");
    }

    #[test]
    fn log_targets_are_unique_and_bad_lines_are_errors() {
        let log = "{\"variable\":\"a\",\"index\":3,\"epoch\":1}\n{\"variable\":\"a\",\"index\":3,\"epoch\":1}\n{\"variable\":\"b\",\"index\":0,\"epoch\":2}\n";
        let t = targets_from_log(log.as_bytes()).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].to_string(), "b[0]@2");
        let e = targets_from_log("{\"variable\":\"a\"}\n".as_bytes()).unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn hits_round_trip_through_files_and_backtraces_name_functions() {
        let dir = std::env::temp_dir().join(format!("dsm-pin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hit = Hit {
            variable: "bound".into(),
            index: 0,
            epoch: 3,
            rank: 1,
            interval: 10,
            write: false,
            file: "src/x.rs".into(),
            line: 4,
            column: 9,
            function: Some("x::f".into()),
        };
        append_hits(&dir, 1, std::slice::from_ref(&hit)).unwrap();
        append_hits(&dir, 1, std::slice::from_ref(&hit)).unwrap();
        assert_eq!(read_hits(&dir, 2, 3), vec![hit.clone(), hit]);
        assert!(read_hits(&dir, 2, 4).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        let bt = "   3: apps::tsp::search::SharedBound::bound::h0123abcd\n             at ./apps/src/tsp/search.rs:712:21\n";
        assert_eq!(
            function_in_backtrace(bt, "apps/src/tsp/search.rs", 712).as_deref(),
            Some("apps::tsp::search::SharedBound::bound")
        );
        assert_eq!(
            function_in_backtrace(bt, "apps/src/tsp/search.rs", 713),
            None
        );
    }
}
