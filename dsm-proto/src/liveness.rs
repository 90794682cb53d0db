//! Liveness: how the ranks of a job notice a peer that is still a process but has gone
//! silent (stopped with `SIGSTOP`, wedged, or unreachable), and how they tell the launcher
//! which rank it was.
//!
//! Every rank's comm thread sends a [`Msg::Heartbeat`](crate::Msg::Heartbeat) on each link
//! it has sent nothing else on for a [`heartbeat_period`], and a rank that has received
//! nothing at all from a peer for the deadline ([`JobConfig::liveness`], default
//! [`DEFAULT_LIVENESS`]) stops with the peer-lost exit status
//! ([`exit_codes::PEER_LOST`](crate::exit_codes::PEER_LOST)) after printing a [`Silence`]
//! line on stderr. Heartbeats come from the comm thread, never from the program, so a rank
//! that computes for a long time without touching the network keeps its links alive. dsmrun
//! recognizes the line ([`Silence::parse`]), names the silent rank and kills it: a stopped
//! process never exits by itself.
//!
//! A rank that loses a peer outright (its connection closes or breaks) prints a
//! [`PeerLoss`] line instead, which dsmrun reads to name the rank that failed rather than
//! the survivors that stopped because of it.
//!
//! [`JobConfig::liveness`]: crate::JobConfig::liveness

use crate::units::format_secs;
use std::fmt;
use std::time::Duration;

/// The liveness deadline unless the job sets another (`dsmrun --liveness`,
/// `DSM_LIVENESS`).
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(10);

/// How often a rank's comm thread looks at its links under a liveness `deadline`: a link
/// that carried nothing outgoing during the last period gets a heartbeat, so a live peer
/// is never silent for more than about two periods, half the deadline.
pub fn heartbeat_period(deadline: Duration) -> Duration {
    deadline / 4
}

/// What a rank prints (after `dsm: fatal: `) when a peer has been silent for the liveness
/// deadline, and what dsmrun reads back to name the silent rank. Its [`Display`] form is
/// the message; [`Silence::parse`] reads it.
///
/// [`Display`]: fmt::Display
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// The rank that noticed and is stopping.
    pub reporter: usize,
    /// The peer that sent nothing.
    pub silent: usize,
    /// How long it had sent nothing, to a tenth of a second.
    pub after: Duration,
    /// The deadline in force.
    pub deadline: Duration,
}

const SENT_NOTHING: &str = " has sent nothing for ";
const DEADLINE: &str = " s (liveness deadline ";

impl Silence {
    /// `silent` has sent `reporter` nothing for `after` (rounded to a tenth of a second,
    /// as it is printed) under `deadline`.
    pub fn new(reporter: usize, silent: usize, after: Duration, deadline: Duration) -> Silence {
        let tenths = (after.as_millis() + 50) / 100;
        Silence {
            reporter,
            silent,
            after: Duration::from_millis(u64::try_from(tenths * 100).unwrap_or(u64::MAX)),
            deadline,
        }
    }

    /// Reads a line a rank printed: the [`Display`](fmt::Display) form, optionally after
    /// `dsm: fatal: ` and with trailing whitespace. `None` for any other line.
    pub fn parse(line: &str) -> Option<Silence> {
        let rest = line.trim_end();
        let rest = rest.strip_prefix("dsm: fatal: ").unwrap_or(rest);
        let rest = rest.strip_prefix("rank ")?;
        let (reporter, rest) = rest.split_once(": rank ")?;
        let (silent, rest) = rest.split_once(SENT_NOTHING)?;
        let (after, rest) = rest.split_once(DEADLINE)?;
        let (deadline, _) = rest.split_once(" s)")?;
        let secs = |s: &str| -> Option<Duration> {
            let v: f64 = s.parse().ok()?;
            Duration::try_from_secs_f64(v).ok()
        };
        Some(Silence {
            reporter: reporter.parse().ok()?,
            silent: silent.parse().ok()?,
            after: secs(after)?,
            deadline: secs(deadline)?,
        })
    }
}

impl fmt::Display for Silence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {}: rank {}{SENT_NOTHING}{}{DEADLINE}{} s): it is stopped, wedged or \
             unreachable; stopping the job (dsmrun --liveness or DSM_LIVENESS sets the \
             deadline, 0 turns the check off, e.g. to debug a rank)",
            self.reporter,
            self.silent,
            format_secs(self.after),
            format_secs(self.deadline)
        )
    }
}

/// What a rank prints (after `dsm: fatal: `) when it stops because it lost a peer: the
/// connection to it closed or broke, whether a receive saw the end of the stream or a send
/// failed first. dsmrun reads it back ([`PeerLoss::parse`]) to follow a chain of such exits
/// to the rank that actually failed, whatever order the exits reach it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLoss {
    /// The rank that noticed and is stopping.
    pub reporter: usize,
    /// The peer it lost.
    pub lost: usize,
    /// How it noticed (`connection closed`, `cannot send barrier-arrive: ...`).
    pub why: String,
}

const LOST: &str = ": lost rank ";
const LOST_END: &str = "); it probably exited or crashed";

impl PeerLoss {
    /// Reads a line a rank printed: the [`Display`](fmt::Display) form, optionally after
    /// `dsm: fatal: ` and with trailing whitespace. `None` for any other line.
    pub fn parse(line: &str) -> Option<PeerLoss> {
        let rest = line.trim_end();
        let rest = rest.strip_prefix("dsm: fatal: ").unwrap_or(rest);
        let rest = rest.strip_prefix("rank ")?;
        let (reporter, rest) = rest.split_once(LOST)?;
        let (lost, rest) = rest.split_once(" (")?;
        let why = rest.strip_suffix(LOST_END)?;
        Some(PeerLoss {
            reporter: reporter.parse().ok()?,
            lost: lost.parse().ok()?,
            why: why.to_owned(),
        })
    }
}

impl fmt::Display for PeerLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {}{LOST}{} ({}{LOST_END}",
            self.reporter, self.lost, self.why
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_reads_back_from_what_a_rank_prints() {
        let s = Silence::new(0, 2, Duration::from_millis(10_240), Duration::from_secs(10));
        assert_eq!(s.after, Duration::from_millis(10_200));
        let text = s.to_string();
        assert!(
            text.starts_with("rank 0: rank 2 has sent nothing for 10.2 s (liveness deadline 10 s): it is stopped, wedged or unreachable"),
            "{text}"
        );
        assert_eq!(Silence::parse(&text), Some(s));
        assert_eq!(Silence::parse(&format!("dsm: fatal: {text}\n")), Some(s));
        let short = Silence::new(3, 1, Duration::from_millis(2460), Duration::from_secs(2));
        assert_eq!(Silence::parse(&short.to_string()), Some(short));
    }

    #[test]
    fn other_lines_are_not_silences() {
        for line in [
            "",
            "dsm: fatal: rank 0: lost rank 1 (connection closed); it probably exited or crashed",
            "rank 0: rank x has sent nothing for 2 s (liveness deadline 2 s)",
            "rank 0: rank 1 has sent nothing for soon s (liveness deadline 2 s)",
            "[0] rank 0: rank 1 has sent nothing for 2 s (liveness deadline 2 s)",
            "rank 0: rank 1 has sent nothing for 2 s",
        ] {
            assert_eq!(Silence::parse(line), None, "{line:?}");
        }
    }

    #[test]
    fn heartbeats_leave_room_for_two_missed_periods() {
        let d = Duration::from_secs(10);
        assert_eq!(heartbeat_period(d), Duration::from_millis(2500));
        assert!(heartbeat_period(d) * 2 < d);
    }

    #[test]
    fn peer_loss_reads_back_from_what_a_rank_prints() {
        let loss = PeerLoss {
            reporter: 0,
            lost: 1,
            why: "cannot send barrier-arrive: Connection reset by peer (os error 104)".into(),
        };
        let text = loss.to_string();
        assert_eq!(
            text,
            "rank 0: lost rank 1 (cannot send barrier-arrive: Connection reset by peer (os error 104)); it probably exited or crashed"
        );
        assert_eq!(PeerLoss::parse(&text), Some(loss.clone()));
        assert_eq!(
            PeerLoss::parse(&format!("dsm: fatal: {text}\n")),
            Some(loss)
        );
        for line in [
            "",
            "rank 0: rank 1 has sent nothing for 2 s (liveness deadline 2 s)",
            "rank 0: lost rank x (connection closed); it probably exited or crashed",
            "rank 0: lost rank 1 (connection closed)",
            "[0] rank 0: lost rank 1 (connection closed); it probably exited or crashed",
        ] {
            assert_eq!(PeerLoss::parse(line), None, "{line:?}");
        }
    }
}
