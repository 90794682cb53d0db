//! Counting semaphores in the API: collective creation by name, `wait` (an acquire),
//! `signal` (a release) and `try_wait`. Like every synchronization call they take the node
//! handle mutably, so no view can be held across them. With `--sem-trace` every completed
//! operation, and every barrier the program passes (`Dsm::barrier`), is appended to this
//! rank's part of the semaphore trace.

use super::{fnv, Dsm, FNV_OFFSET};
use crate::engine::{Command, Reply, SemDone};
use crate::error::DsmError;
use dsm_ahb::format::PartWriter;
use dsm_ahb::Op;
use dsm_proto::{SemId, SyncPoint};
use dsm_race::Point;

/// A counting semaphore made by [`Dsm::semaphore`]: a small handle naming it, valid for
/// the node that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Semaphore {
    id: SemId,
}

impl Semaphore {
    /// The semaphore's id: the hash of its name, the same on every node.
    pub fn id(&self) -> SemId {
        self.id
    }
}

/// The id a semaphore name hashes to (distinct from every lock id's hash by its prefix).
pub fn semaphore_id(name: &str) -> SemId {
    fnv(fnv(FNV_OFFSET, b"semaphore\0"), name.as_bytes())
}

/// Opens this rank's part of the semaphore trace, `FILE.rank<R>` (dsmrun merges the parts
/// into `FILE` after the run).
pub(super) fn open_trace(
    env: &dsm_proto::JobConfig,
) -> Result<Option<PartWriter<std::io::BufWriter<std::fs::File>>>, DsmError> {
    let Some(path) = env.sem_trace.as_ref() else {
        return Ok(None);
    };
    let part = dsm_ahb::format::part_path(path, env.rank);
    let file = std::fs::File::create(&part).map_err(|e| {
        DsmError::Config(format!(
            "cannot create the semaphore trace part {}: {e}",
            part.display()
        ))
    })?;
    PartWriter::new(std::io::BufWriter::new(file), env.size, env.rank)
        .map(Some)
        .map_err(|e| DsmError::Config(format!("semaphore trace: {e}")))
}

impl Dsm {
    /// Creates the counting semaphore `name` with `initial` tokens. Collective: every rank
    /// calls it with the same name and count (a mismatch stops the job at this call, as a
    /// differing allocation does), and it synchronizes like an allocation, so no rank can
    /// use the semaphore before every rank, its manager included, has created it.
    pub fn semaphore(&mut self, name: &str, initial: u32) -> Result<Semaphore, DsmError> {
        if name.is_empty() {
            return Err(DsmError::Config("semaphores need a name".into()));
        }
        let id = semaphore_id(name);
        if self.semaphores.contains_key(&id) {
            return Err(DsmError::Config(format!(
                "semaphore '{name}' was already created (names must be unique)"
            )));
        }
        match self.comm().call(Command::SemCreate { sem: id, initial }) {
            Reply::Done => {}
            other => {
                return Err(DsmError::Protocol(format!(
                    "unexpected reply to semaphore creation: {other:?}"
                )))
            }
        }
        self.semaphores.insert(id, (name.to_string(), initial));
        if let Some(r) = self.race.as_mut() {
            r.sem_tokens.insert(id, initial);
        }
        if let Some(mut m) = self.race.as_ref().and_then(|r| r.master()) {
            m.reporter.name_lock(id, name);
        }
        if let Some(t) = self.sem_trace.as_mut() {
            t.create(name, initial)
                .map_err(|e| DsmError::Config(format!("semaphore trace: {e}")))?;
        }
        let digest = fnv(
            fnv(FNV_OFFSET, format!("semaphore {name}").as_bytes()),
            &initial.to_le_bytes(),
        );
        let race = self.close_race_interval()?;
        self.sync_point = Point::Allocation {
            name: format!("semaphore {name}"),
            after: self.barriers_called,
        };
        let at = SyncPoint::Allocation {
            name: format!("semaphore {name}"),
            after: self.barriers_called,
        };
        self.sync(Command::Alloc {
            homes: Vec::new(),
            digest,
            race,
            at,
        })?;
        Ok(Semaphore { id })
    }

    /// Waits (P) until the semaphore has a token and takes it. An acquire: everything the
    /// signaller of the consumed token wrote before its `signal` is visible afterwards, and
    /// the race detector orders this node after that signal (and no other).
    pub fn wait(&mut self, sem: &Semaphore) -> Result<(), DsmError> {
        self.sem_wait(sem, false).map(|_| ())
    }

    /// Takes a token if one is available now; `Ok(false)` without waiting otherwise. A
    /// successful try-wait is an acquire, like [`Dsm::wait`].
    pub fn try_wait(&mut self, sem: &Semaphore) -> Result<bool, DsmError> {
        self.sem_wait(sem, true)
    }

    /// Signals (V) the semaphore: adds a token. A release: writes before it are visible to
    /// the node whose wait consumes this token. Never blocks.
    pub fn signal(&mut self, sem: &Semaphore) -> Result<(), DsmError> {
        self.check_semaphore(sem)?;
        let race = self.close_race_interval()?;
        let done = self.sem_call(Command::SemSignal { sem: sem.id, race })?;
        self.trace_sem(Op::Signal, sem, &done)
    }

    fn sem_wait(&mut self, sem: &Semaphore, try_only: bool) -> Result<bool, DsmError> {
        self.check_semaphore(sem)?;
        let race = self.close_race_interval()?;
        let done = self.sem_call(Command::SemWait {
            sem: sem.id,
            try_only,
            race,
        })?;
        if done.acquired {
            self.trace_sem(Op::Wait, sem, &done)?;
        }
        Ok(done.acquired)
    }

    fn check_semaphore(&self, sem: &Semaphore) -> Result<(), DsmError> {
        if self.semaphores.contains_key(&sem.id) {
            Ok(())
        } else {
            Err(DsmError::Config(format!(
                "semaphore #{:x} was not created by this node",
                sem.id
            )))
        }
    }

    fn sem_call(&mut self, cmd: Command) -> Result<SemDone, DsmError> {
        match self.comm().call(cmd) {
            Reply::Sem(done) => Ok(done),
            other => Err(DsmError::Protocol(format!(
                "unexpected reply to a semaphore operation: {other:?}"
            ))),
        }
    }

    fn trace_sem(&mut self, op: Op, sem: &Semaphore, done: &SemDone) -> Result<(), DsmError> {
        let Some(t) = self.sem_trace.as_mut() else {
            return Ok(());
        };
        let name = &self.semaphores[&sem.id].0;
        let signal = done.signal.map(|(node, seq)| (node as usize, seq));
        t.op(op, name, signal, done.vt.0.to_vec())
            .map_err(|e| DsmError::Config(format!("semaphore trace: {e}")))
    }
}
