//! Synchronization-order records (`dsmrun --record`, `--replay`): the file format and the
//! replay [`Schedule`] a node's protocol engine follows. No I/O beyond `Read`/`Write`.
//!
//! What makes a dsm run nondeterministic is which node gets each lock next (and, once
//! semaphores exist, which signal satisfies each wait), plus the values racy reads happen
//! to observe. As in PDT, only that choice is stored: for every acquisition, the lock and
//! its *grant number* (the how-many-th acquisition of that lock in the run, counting from
//! 0, carried with the lock's token). The program's own synchronization forces the rest:
//! the order of one rank's operations is its program order, and barriers order everything
//! around them, so a rank's events are kept as its own script, and a barrier entry carries
//! no choice, only a check (how many intervals the rank closed since the previous barrier
//! and a hash of their structure), which is how a replay notices that racy reads took the
//! program elsewhere.
//!
//! File layout (all integers in postcard's varint encoding unless said otherwise):
//!
//! ```text
//! magic        8 bytes  "DSMREC\r\n"
//! version      u32 LE   FORMAT_VERSION
//! body         postcard Body { header, locks, ranks }
//! checksum     u64 LE   FNV-1a over magic, version and body
//! ```
//!
//! `locks` is the table of lock ids (named locks hash to 64-bit ids, so events refer to a
//! lock by its index in the table); `ranks[r]` is rank r's script of [`Event`]s. The
//! [`Event`] enum is the extension point: a new kind of synchronization (semaphore
//! wait/signal pairings) is a new variant appended at the end, read by a new version.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{Read, Write};
use thiserror::Error;

/// The first 8 bytes of every record file.
pub const MAGIC: [u8; 8] = *b"DSMREC\r\n";
/// The version of the format this crate writes and reads.
pub const FORMAT_VERSION: u32 = 2;
/// The first 8 bytes of a rank's part file (what a rank writes for the launcher to merge).
pub const PART_MAGIC: [u8; 8] = *b"DSMRECP\n";

/// A lock's id, as in `dsm_proto::LockId`.
pub type LockId = u64;

/// What the record says about the job it came from; a replay must match it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The program's file name (no directory: the same binary run by another path matches).
    pub program: String,
    /// The program's arguments.
    pub args: Vec<String>,
    /// Nodes in the job.
    pub nodes: u32,
    /// The chaos seed the recorded run used, if any (informational: a replay needs no chaos).
    pub chaos: Option<u64>,
    /// Whether the recorded run detected races: race detection closes and compares
    /// intervals the replay checks, so a replay must run with it exactly when the record did.
    pub race: bool,
}

/// One synchronization event of a rank, in program order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// The rank took `lock` as its `grant`-th holder (counting acquisitions of that lock by
    /// all ranks from 0).
    Acquire {
        /// The lock.
        lock: LockId,
        /// The grant number.
        grant: u64,
    },
    /// The rank arrived at a barrier (a collective allocation, or dsm's own barriers,
    /// count too).
    Barrier {
        /// Intervals the rank closed since its previous barrier.
        intervals: u32,
        /// Hash of those intervals' structure (what began each, and with race detection
        /// the pages each read and wrote).
        hash: u64,
    },
    /// The rank finished: a digest of the values in the shared pages it homes, after the
    /// last barrier. A replay that ends with other values (a racy read that saw another
    /// value without changing the program's course) diverges here.
    Values {
        /// The digest.
        digest: u64,
    },
}

/// An [`Event`] as stored: locks by their index in the file's lock table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum StoredEvent {
    Acquire { lock: u32, grant: u64 },
    Barrier { intervals: u32, hash: u64 },
    Values { digest: u64 },
}

#[derive(Serialize, Deserialize)]
struct Body {
    header: Header,
    locks: Vec<LockId>,
    ranks: Vec<Vec<StoredEvent>>,
}

/// A whole record: the header and every rank's script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The recorded job.
    pub header: Header,
    /// `ranks[r]` is rank r's events in program order.
    pub ranks: Vec<Vec<Event>>,
}

/// Why a record (or a rank's part of one) could not be read.
#[derive(Debug, Error)]
pub enum RecordError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with the record magic.
    #[error("not a dsm synchronization record (it does not start with the record magic)")]
    NotARecord,
    /// Written by another version of the format.
    #[error("record format version {found}, but this dsm reads version {FORMAT_VERSION}")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// The file ends early.
    #[error("the record is truncated ({0})")]
    Truncated(String),
    /// The checksum does not match: the file was changed or damaged.
    #[error("the record is corrupt (checksum mismatch)")]
    Checksum,
    /// The contents do not decode or contradict each other.
    #[error("the record is corrupt: {0}")]
    Corrupt(String),
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

impl Record {
    /// Encodes the record (see the module documentation for the layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut locks: Vec<LockId> = Vec::new();
        let mut index: HashMap<LockId, u32> = HashMap::new();
        let ranks = self
            .ranks
            .iter()
            .map(|events| {
                events
                    .iter()
                    .map(|e| match *e {
                        Event::Acquire { lock, grant } => {
                            let i = *index.entry(lock).or_insert_with(|| {
                                locks.push(lock);
                                (locks.len() - 1) as u32
                            });
                            StoredEvent::Acquire { lock: i, grant }
                        }
                        Event::Barrier { intervals, hash } => {
                            StoredEvent::Barrier { intervals, hash }
                        }
                        Event::Values { digest } => StoredEvent::Values { digest },
                    })
                    .collect()
            })
            .collect();
        let body = Body {
            header: self.header.clone(),
            locks,
            ranks,
        };
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend(postcard::to_stdvec(&body).expect("records always serialize"));
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes a record, checking magic, version, length and checksum, and that every
    /// lock's grant numbers form one sequence `0..n` over the ranks.
    pub fn from_bytes(bytes: &[u8]) -> Result<Record, RecordError> {
        if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
            if MAGIC.starts_with(bytes) {
                return Err(RecordError::Truncated("it ends inside the magic".into()));
            }
            return Err(RecordError::NotARecord);
        }
        if bytes.len() < 12 {
            return Err(RecordError::Truncated("it ends inside the version".into()));
        }
        let found = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if found != FORMAT_VERSION {
            return Err(RecordError::Version { found });
        }
        if bytes.len() < 12 + 8 {
            return Err(RecordError::Truncated("it has no body".into()));
        }
        let (content, sum) = bytes.split_at(bytes.len() - 8);
        let body: Result<(Body, &[u8]), _> = postcard::take_from_bytes(&content[12..]);
        let stored = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
        let body = match body {
            Ok((body, [])) => {
                if fnv1a(content) != stored {
                    return Err(RecordError::Checksum);
                }
                body
            }
            Ok(_) => {
                return Err(RecordError::Corrupt(
                    "bytes follow the body before the checksum".into(),
                ))
            }
            Err(postcard::Error::DeserializeUnexpectedEnd) => {
                return Err(RecordError::Truncated("it ends inside the body".into()))
            }
            Err(e) => {
                // A damaged body usually fails to decode; a file cut short inside the
                // checksum also lands here, so tell the two apart by the checksum.
                return Err(if fnv1a(content) != stored {
                    RecordError::Checksum
                } else {
                    RecordError::Corrupt(e.to_string())
                });
            }
        };
        if body.header.nodes as usize != body.ranks.len() {
            return Err(RecordError::Corrupt(format!(
                "the header says {} nodes but the record has {} ranks",
                body.header.nodes,
                body.ranks.len()
            )));
        }
        let mut ranks = Vec::with_capacity(body.ranks.len());
        for events in body.ranks {
            let mut out = Vec::with_capacity(events.len());
            for e in events {
                out.push(match e {
                    StoredEvent::Acquire { lock, grant } => Event::Acquire {
                        lock: *body.locks.get(lock as usize).ok_or_else(|| {
                            RecordError::Corrupt(format!("lock index {lock} is not in the table"))
                        })?,
                        grant,
                    },
                    StoredEvent::Barrier { intervals, hash } => Event::Barrier { intervals, hash },
                    StoredEvent::Values { digest } => Event::Values { digest },
                });
            }
            ranks.push(out);
        }
        let record = Record {
            header: body.header,
            ranks,
        };
        record.grant_table()?;
        Ok(record)
    }

    /// Reads a record from `r`.
    pub fn read(mut r: impl Read) -> Result<Record, RecordError> {
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes)?;
        Self::from_bytes(&bytes)
    }

    /// Writes the record to `w`.
    pub fn write(&self, mut w: impl Write) -> Result<(), RecordError> {
        w.write_all(&self.to_bytes())?;
        Ok(())
    }

    /// Per lock, the rank of each grant number in order.
    fn grant_table(&self) -> Result<HashMap<LockId, Vec<u32>>, RecordError> {
        let mut slots: HashMap<LockId, Vec<Option<u32>>> = HashMap::new();
        for (rank, events) in self.ranks.iter().enumerate() {
            for e in events {
                if let Event::Acquire { lock, grant } = *e {
                    let list = slots.entry(lock).or_default();
                    let g = usize::try_from(grant)
                        .ok()
                        .filter(|&g| g < 1 << 40)
                        .ok_or_else(|| {
                            RecordError::Corrupt(format!("grant number {grant} of lock {lock}"))
                        })?;
                    if list.len() <= g {
                        list.resize(g + 1, None);
                    }
                    if let Some(other) = list[g] {
                        return Err(RecordError::Corrupt(format!(
                            "grant {g} of lock {lock} is claimed by ranks {other} and {rank}"
                        )));
                    }
                    list[g] = Some(rank as u32);
                }
            }
        }
        slots
            .into_iter()
            .map(|(lock, list)| {
                let ranks = list
                    .iter()
                    .enumerate()
                    .map(|(g, r)| {
                        r.ok_or_else(|| {
                            RecordError::Corrupt(format!("grant {g} of lock {lock} is missing"))
                        })
                    })
                    .collect::<Result<Vec<u32>, _>>()?;
                Ok((lock, ranks))
            })
            .collect()
    }

    /// The schedule rank `me` follows when replaying this record.
    pub fn schedule(&self, me: u32) -> Result<Schedule, RecordError> {
        let script = self
            .ranks
            .get(me as usize)
            .cloned()
            .ok_or_else(|| RecordError::Corrupt(format!("the record has no rank {me}")))?;
        Ok(Schedule {
            me,
            script,
            pos: 0,
            grants: self.grant_table()?,
        })
    }

    /// Lock acquisitions in the whole record.
    pub fn acquisitions(&self) -> usize {
        self.ranks
            .iter()
            .flatten()
            .filter(|e| matches!(e, Event::Acquire { .. }))
            .count()
    }
}

/// Encodes one rank's events for its launcher to merge ([`merge_parts`]).
pub fn part_to_bytes(rank: u32, events: &[Event]) -> Vec<u8> {
    let mut out = PART_MAGIC.to_vec();
    out.extend(postcard::to_stdvec(&(rank, events)).expect("events always serialize"));
    out
}

/// Decodes a rank's part file: the rank and its events.
pub fn part_from_bytes(bytes: &[u8]) -> Result<(u32, Vec<Event>), RecordError> {
    if bytes.len() < PART_MAGIC.len() || bytes[..PART_MAGIC.len()] != PART_MAGIC {
        return Err(RecordError::NotARecord);
    }
    match postcard::from_bytes::<(u32, Vec<Event>)>(&bytes[PART_MAGIC.len()..]) {
        Ok(v) => Ok(v),
        Err(postcard::Error::DeserializeUnexpectedEnd) => {
            Err(RecordError::Truncated("a rank's part ends early".into()))
        }
        Err(e) => Err(RecordError::Corrupt(e.to_string())),
    }
}

/// Builds the job's record from every rank's part (in any order; one per rank).
pub fn merge_parts(header: Header, parts: Vec<(u32, Vec<Event>)>) -> Result<Record, RecordError> {
    let n = header.nodes as usize;
    let mut ranks: Vec<Option<Vec<Event>>> = vec![None; n];
    for (rank, events) in parts {
        let slot = ranks
            .get_mut(rank as usize)
            .ok_or_else(|| RecordError::Corrupt(format!("a part for rank {rank} of {n}")))?;
        if slot.replace(events).is_some() {
            return Err(RecordError::Corrupt(format!("two parts for rank {rank}")));
        }
    }
    let ranks = ranks
        .into_iter()
        .enumerate()
        .map(|(r, e)| e.ok_or_else(|| RecordError::Corrupt(format!("no part for rank {r}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let record = Record { header, ranks };
    record.grant_table()?;
    Ok(record)
}

/// What a replaying node follows: its own script (checked event by event) and, for every
/// lock, which rank holds each grant number.
#[derive(Clone, Debug)]
pub struct Schedule {
    me: u32,
    script: Vec<Event>,
    pos: usize,
    grants: HashMap<LockId, Vec<u32>>,
}

impl Schedule {
    /// This node's next event in the record, if any remain.
    pub fn next_event(&self) -> Option<Event> {
        self.script.get(self.pos).copied()
    }

    /// How many of this node's events have been replayed.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Moves past the next event.
    pub fn advance(&mut self) {
        self.pos += 1;
    }

    /// The rank that holds grant `grant` of `lock` in the record.
    pub fn holder(&self, lock: LockId, grant: u64) -> Option<u32> {
        self.grants
            .get(&lock)
            .and_then(|g| g.get(usize::try_from(grant).ok()?))
            .copied()
    }

    /// Grants of `lock` in the whole record.
    pub fn grants_of(&self, lock: LockId) -> u64 {
        self.grants.get(&lock).map_or(0, |g| g.len() as u64)
    }

    /// The order in which the lock's token moves between ranks: the holders of the record's
    /// runs of consecutive grants to one rank, without the first run when `initial` (the
    /// rank that holds the token before any grant: the lock's manager) took it without a
    /// transfer. The manager accepts requests in this order.
    pub fn transfers(&self, lock: LockId, initial: u32) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        let mut last = initial;
        for &r in self.grants.get(&lock).map_or(&[][..], Vec::as_slice) {
            if r != last {
                out.push(r);
                last = r;
            }
        }
        out
    }

    /// The grant numbers of `lock` the record gives to `rank`, in order.
    pub fn grants_to(&self, lock: LockId, rank: u32) -> Vec<u64> {
        self.grants.get(&lock).map_or_else(Vec::new, |g| {
            g.iter()
                .enumerate()
                .filter(|(_, &r)| r == rank)
                .map(|(i, _)| i as u64)
                .collect()
        })
    }

    /// How many times this node has acquired `lock` so far in the replay.
    pub fn acquired_so_far(&self, lock: LockId) -> usize {
        self.script[..self.pos]
            .iter()
            .filter(|e| matches!(e, Event::Acquire { lock: l, .. } if *l == lock))
            .count()
    }

    /// This node's rank.
    pub fn rank(&self) -> u32 {
        self.me
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            header: Header {
                program: "tsp".into(),
                args: vec!["--random".into(), "16".into()],
                nodes: 2,
                chaos: Some(7),
                race: true,
            },
            ranks: vec![
                vec![
                    Event::Acquire { lock: 5, grant: 0 },
                    Event::Acquire { lock: 5, grant: 1 },
                    Event::Barrier {
                        intervals: 4,
                        hash: 99,
                    },
                    Event::Acquire {
                        lock: 1 << 63 | 77,
                        grant: 1,
                    },
                ],
                vec![
                    Event::Acquire {
                        lock: 1 << 63 | 77,
                        grant: 0,
                    },
                    Event::Acquire { lock: 5, grant: 2 },
                    Event::Barrier {
                        intervals: 3,
                        hash: 1,
                    },
                ],
            ],
        }
    }

    #[test]
    fn round_trip_and_schedule() {
        let r = sample();
        let bytes = r.to_bytes();
        let back = Record::from_bytes(&bytes).unwrap();
        assert_eq!(back, r);
        let s = back.schedule(1).unwrap();
        assert_eq!(s.holder(5, 0), Some(0));
        assert_eq!(s.holder(5, 2), Some(1));
        assert_eq!(s.holder(5, 3), None);
        assert_eq!(s.grants_of(5), 3);
        assert_eq!(s.transfers(5, 0), vec![1]);
        assert_eq!(s.transfers(5, 1), vec![0, 1]);
        assert_eq!(r.acquisitions(), 5);
    }

    #[test]
    fn every_truncation_and_flip_is_an_error() {
        let bytes = sample().to_bytes();
        for len in 0..bytes.len() {
            let e = Record::from_bytes(&bytes[..len]).unwrap_err();
            assert!(
                matches!(
                    e,
                    RecordError::Truncated(_) | RecordError::Checksum | RecordError::Corrupt(_)
                ),
                "length {len}: {e}"
            );
        }
        for i in 12..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(Record::from_bytes(&b).is_err(), "flip at {i} accepted");
        }
        assert!(matches!(
            Record::from_bytes(b"hello world, this is text"),
            Err(RecordError::NotARecord)
        ));
        let mut v = bytes.clone();
        v[8] = 9;
        assert!(matches!(
            Record::from_bytes(&v),
            Err(RecordError::Version { found: 9 })
        ));
    }

    #[test]
    fn inconsistent_grants_are_refused() {
        let mut r = sample();
        r.ranks[1][1] = Event::Acquire { lock: 5, grant: 1 };
        assert!(matches!(
            Record::from_bytes(&r.to_bytes()),
            Err(RecordError::Corrupt(_))
        ));
        let mut r = sample();
        r.ranks[1][1] = Event::Acquire { lock: 5, grant: 4 };
        let e = Record::from_bytes(&r.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn parts_merge_into_the_record() {
        let r = sample();
        let parts = vec![
            part_from_bytes(&part_to_bytes(1, &r.ranks[1])).unwrap(),
            part_from_bytes(&part_to_bytes(0, &r.ranks[0])).unwrap(),
        ];
        assert_eq!(merge_parts(r.header.clone(), parts).unwrap(), r);
        let e = merge_parts(r.header.clone(), vec![(0, r.ranks[0].clone())]).unwrap_err();
        assert!(e.to_string().contains("no part for rank 1"), "{e}");
        let bytes = part_to_bytes(0, &r.ranks[0]);
        assert!(part_from_bytes(&bytes[..bytes.len() - 1]).is_err());
    }
}
