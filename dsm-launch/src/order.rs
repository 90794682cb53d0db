//! The launcher's part of recording and replaying the synchronization order
//! (`dsmrun --record`, `--replay`): checking a record against the job before any rank
//! starts, and merging the ranks' part files into the record after the job.
//!
//! Each rank writes its own events to `<record>.part.<rank>` at `finish()`; only the
//! launcher knows the program, its arguments and N, so it writes the record's header and
//! the one file. A job that fails leaves no record (its parts are removed): an unfinished
//! script could not be replayed to the end.

use dsm_replay::{Header, Record, RecordError};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Why a record cannot be used or made.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The record file cannot be opened or read.
    #[error("cannot read the record '{}': {error}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// The file is not a usable record.
    #[error("'{}': {error}", path.display())]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: RecordError,
    },
    /// The record was made by another job.
    #[error("cannot replay '{}': {why}", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// How the job differs from the recorded one.
        why: String,
    },
    /// The ranks' parts could not be merged or the record written.
    #[error("no record written to '{}': {why}", path.display())]
    Write {
        /// The record's path.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
}

impl OrderError {
    /// dsmrun's exit status for this error: [`dsm_proto::exit_codes::REPLAY_DIVERGED`] for
    /// a record of another job, [`dsm_proto::exit_codes::CORRUPT_INPUT`] for a damaged one,
    /// 2 for one that cannot be opened (a wrong path on the command line), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            OrderError::Mismatch { .. } => dsm_proto::exit_codes::REPLAY_DIVERGED,
            OrderError::Bad { .. } => dsm_proto::exit_codes::CORRUPT_INPUT,
            OrderError::Open { .. } => 2,
            OrderError::Write { .. } => 1,
        }
    }
}

/// The header describing a job: the program's file name, its arguments and N.
pub fn header_for(
    program: &OsStr,
    args: &[OsString],
    nodes: usize,
    chaos: Option<u64>,
    race: bool,
) -> Header {
    let name = Path::new(program)
        .file_name()
        .unwrap_or(program)
        .to_string_lossy()
        .into_owned();
    Header {
        program: name,
        args: args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        nodes: nodes as u32,
        chaos,
        race,
    }
}

/// Where the ranks of a recording job write their parts (`<prefix>.<rank>`).
pub fn part_prefix(record: &Path) -> PathBuf {
    let mut p = record.as_os_str().to_owned();
    p.push(".part");
    PathBuf::from(p)
}

fn part_path(prefix: &Path, rank: usize) -> PathBuf {
    let mut p = prefix.as_os_str().to_owned();
    p.push(format!(".{rank}"));
    PathBuf::from(p)
}

/// Reads the record at `path` and checks that it was made by a job like `job` (program,
/// arguments, N); the chaos seed does not matter.
pub fn check_replay(path: &Path, job: &Header) -> Result<Record, OrderError> {
    let bytes = std::fs::read(path).map_err(|error| OrderError::Open {
        path: path.into(),
        error,
    })?;
    let record = Record::from_bytes(&bytes).map_err(|error| OrderError::Bad {
        path: path.into(),
        error,
    })?;
    let rec = &record.header;
    let mismatch = |why: String| OrderError::Mismatch {
        path: path.into(),
        why,
    };
    if rec.program != job.program {
        return Err(mismatch(format!(
            "it records program '{}', not '{}'",
            rec.program, job.program
        )));
    }
    if rec.nodes != job.nodes {
        return Err(mismatch(format!(
            "it records a job of {} nodes, not {} (dsmrun -n {})",
            rec.nodes, job.nodes, rec.nodes
        )));
    }
    match (rec.race, job.race) {
        (true, false) => {
            return Err(mismatch(
                "it was recorded with race detection: add --race to replay it".into(),
            ))
        }
        (false, true) => {
            return Err(mismatch(
                "it was recorded without race detection: drop --race (and the other race \
                 options) to replay it"
                    .into(),
            ))
        }
        _ => {}
    }
    if rec.args != job.args {
        return Err(mismatch(format!(
            "it records the arguments [{}], not [{}]",
            rec.args.join(" "),
            job.args.join(" ")
        )));
    }
    Ok(record)
}

/// What a recording job left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    /// Lock acquisitions recorded.
    pub acquisitions: usize,
    /// Size of the record file.
    pub bytes: usize,
}

/// Merges the ranks' parts under `prefix` into the record at `path` (written whole, then
/// renamed into place, through a symlink to the file it names) and removes the parts.
pub fn collect_record(
    path: &Path,
    prefix: &Path,
    header: Header,
) -> Result<RecordSummary, OrderError> {
    let n = header.nodes as usize;
    let fail = |why: String| OrderError::Write {
        path: path.into(),
        why,
    };
    let mut parts = Vec::with_capacity(n);
    let mut problem = None;
    for rank in 0..n {
        let part = part_path(prefix, rank);
        match std::fs::read(&part) {
            Ok(bytes) => match dsm_replay::part_from_bytes(&bytes) {
                Ok(p) => parts.push(p),
                Err(e) => problem = problem.or(Some(format!("rank {rank}'s part: {e}"))),
            },
            Err(e) => {
                problem = problem.or(Some(format!(
                    "rank {rank} wrote no part ('{}': {e})",
                    part.display()
                )))
            }
        }
    }
    discard_parts(prefix, n);
    if let Some(why) = problem {
        return Err(fail(why));
    }
    let record = dsm_replay::merge_parts(header, parts).map_err(|e| fail(e.to_string()))?;
    let bytes = record.to_bytes();
    // Through a symlink to the file it names: the rename below would replace the link.
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            fail(e.to_string())
        })?;
    Ok(RecordSummary {
        acquisitions: record.acquisitions(),
        bytes: bytes.len(),
    })
}

/// Removes whatever parts the ranks under `prefix` wrote.
pub fn discard_parts(prefix: &Path, nodes: usize) {
    for rank in 0..nodes {
        let _ = std::fs::remove_file(part_path(prefix, rank));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsm_replay::Event;

    #[test]
    fn replay_checks_program_args_and_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.dsmrec");
        let job = header_for(
            OsStr::new("/x/target/release/tsp"),
            &["--random".into(), "16".into()],
            2,
            None,
            false,
        );
        assert_eq!(job.program, "tsp");
        let prefix = part_prefix(&path);
        for rank in 0..2 {
            let events = vec![Event::Acquire {
                lock: 3,
                grant: rank as u64,
            }];
            std::fs::write(
                part_path(&prefix, rank),
                dsm_replay::part_to_bytes(rank as u32, &events),
            )
            .unwrap();
        }
        let summary = collect_record(&path, &prefix, job.clone()).unwrap();
        assert_eq!(summary.acquisitions, 2);
        assert!(!part_path(&prefix, 0).exists(), "parts are removed");
        assert!(check_replay(&path, &job).is_ok());
        let mut other = job.clone();
        other.nodes = 4;
        let e = check_replay(&path, &other).unwrap_err();
        assert_eq!(e.exit_code(), 67);
        assert!(e.to_string().contains("2 nodes, not 4"), "{e}");
        other = job.clone();
        other.args[1] = "17".into();
        let e = check_replay(&path, &other).unwrap_err();
        assert!(e.to_string().contains("--random 16"), "{e}");
        other = job.clone();
        other.program = "water".into();
        assert!(check_replay(&path, &other).is_err());
        // Race detection on one side only: refused, saying which flag to add or drop.
        other = job.clone();
        other.race = true;
        let e = check_replay(&path, &other).unwrap_err();
        assert_eq!(e.exit_code(), 67);
        assert!(e.to_string().contains("drop --race"), "{e}");
        // A damaged file is an error of its own.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&path, &bytes).unwrap();
        let e = check_replay(&path, &job).unwrap_err();
        assert_eq!(e.exit_code(), 65);
        assert!(
            e.to_string().contains("truncated") || e.to_string().contains("corrupt"),
            "{e}"
        );
        // A missing part means no record.
        let e = collect_record(&path, &prefix, job.clone()).unwrap_err();
        assert!(e.to_string().contains("rank 0 wrote no part"), "{e}");
        // Recorded through a symlink: the file it names gets the record, the link stays.
        let target = dir.path().join("kept.dsmrec");
        let link = dir.path().join("link.dsmrec");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        std::fs::write(&target, b"old").unwrap();
        let prefix = part_prefix(&link);
        for rank in 0..2 {
            std::fs::write(
                part_path(&prefix, rank),
                dsm_replay::part_to_bytes(rank as u32, &[]),
            )
            .unwrap();
        }
        collect_record(&link, &prefix, job.clone()).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert!(check_replay(&target, &job).is_ok());
    }
}
