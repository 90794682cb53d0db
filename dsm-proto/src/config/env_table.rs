//! The one table of a [`JobConfig`](super::JobConfig)'s `DSM_*` variables: each row names
//! its variables once, with the field they carry, their spelling (a format of
//! [`env_format`](super::env_format)) and when they are written and read. `JobConfig::to_env`
//! and `JobConfig::from_lookup` are generated from it, so a setting cannot be written
//! without being read, nor read under another name or spelling.

use super::env_format::*;
use super::{ConfigError, JobConfig};
use crate::env_vars as vars;
use std::ffi::OsString;

/// When `JobConfig::to_env` writes a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// Always, even at its default: the rank's identity, and what scripts under dsmrun read.
    Always,
    /// When the field is not at its default (unset reads back as the default).
    IfChanged,
    /// Always, but only with race detection on.
    AlwaysWithRace,
    /// When not at its default, and only with race detection on.
    IfChangedWithRace,
    /// Never: the user's to set for a whole job, and the ranks inherit it.
    Inherited,
}

/// When `JobConfig::from_lookup` reads a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// Always.
    Always,
    /// Only with race detection on, so that a leftover setting does not fail a plain run.
    WithRace,
    /// First, by `rank_and_size` or the rendezvous: a launcher's own variables (Slurm,
    /// Open MPI, PMI) may stand in for these, with the same formats.
    Elsewhere,
}

impl Written {
    fn writes(self, race_on: bool, changed: bool, with_inherited: bool) -> bool {
        match self {
            Written::Always => true,
            Written::IfChanged => changed,
            Written::AlwaysWithRace => race_on,
            Written::IfChangedWithRace => race_on && changed,
            Written::Inherited => with_inherited && changed,
        }
    }
}

impl Read {
    fn reads(self, race_on: bool) -> bool {
        match self {
            Read::Always => true,
            Read::WithRace => race_on,
            Read::Elsewhere => false,
        }
    }
}

/// The names of a row's variables: `NAME` or `(NAME, NAME, ...)`.
macro_rules! row_vars {
    (($($var:ident),+)) => {
        [$(vars::$var),+]
    };
    ($var:ident) => {
        [vars::$var]
    };
}

/// Generates from the table: `write_rows` (for `to_env`), `read_rows` (for `from_lookup`)
/// and `rows` (every variable with when it is written and read, for tests).
macro_rules! settings_table {
    ($($vars:tt => $($field:ident).+ : $format:expr, $written:ident, $read:ident;)*) => {
        /// The rows' variables `cfg` writes: at their defaults only those written
        /// [`Written::Always`]; `with_inherited` adds the user's [`Written::Inherited`] ones.
        pub(super) fn write_rows(
            cfg: &JobConfig,
            with_inherited: bool,
        ) -> Vec<(&'static str, OsString)> {
            let default = JobConfig::single_node();
            let mut env = Vec::new();
            $(
                let changed = cfg.$($field).+ != default.$($field).+;
                if Written::$written.writes(cfg.race.enabled, changed, with_inherited) {
                    write_row(&$format, row_vars!($vars), &cfg.$($field).+, &mut env);
                }
            )*
            env
        }

        /// Reads the rows through `get` into `cfg`, in table order (so the race switch
        /// comes before what it gates); unset variables leave `cfg`'s fields as they are.
        pub(super) fn read_rows(
            get: &impl Fn(&str) -> Option<String>,
            cfg: &mut JobConfig,
        ) -> Result<(), ConfigError> {
            $(
                if Read::$read.reads(cfg.race.enabled) {
                    if let Some(value) = read_row(&$format, row_vars!($vars), get)? {
                        cfg.$($field).+ = value;
                    }
                }
            )*
            Ok(())
        }

        /// Every variable of the table with when it is written and read.
        #[cfg(test)]
        pub(super) fn rows() -> Vec<(&'static str, Written, Read)> {
            let mut rows = Vec::new();
            $(
                for var in row_vars!($vars) {
                    rows.push((var, Written::$written, Read::$read));
                }
            )*
            rows
        }
    };
}

fn write_row<T, const N: usize>(
    format: &impl RowText<T, N>,
    vars: [&'static str; N],
    value: &T,
    env: &mut Vec<(&'static str, OsString)>,
) {
    for (var, text) in vars.into_iter().zip(format.write(value)) {
        if let Some(text) = text {
            env.push((var, text));
        }
    }
}

fn read_row<T, const N: usize>(
    format: &impl RowText<T, N>,
    vars: [&'static str; N],
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<T>, ConfigError> {
    format.read(vars, vars.map(get))
}

/// Exit statuses.
const EXIT_STATUS: Number = Number {
    why: "expected an exit status 0..=255",
};

/// The incremental analysis's batch.
const BATCH: Positive = Positive {
    why: "expected a number of intervals, at least 1",
};

/// The fast fault path's switch.
const FAST_FAULTS: ZeroOrOne = ZeroOrOne {
    why: "expected 0 (faults through the comm thread) or 1 (the default)",
};

/// One memory per host's switch.
const HOST_MEMORY_SWITCH: ZeroOrOne = ZeroOrOne {
    why: "expected 1 (one memory per host) or 0 (the default: each rank its own copy)",
};

// Rows are read in this order, which also decides which of several bad variables is
// reported. `Elsewhere` rows are read before all others.
settings_table! {
//  variable(s)                  field                     format                   written            read
    RANK                      => rank                    : COUNT,                   Always,            Elsewhere;
    SIZE                      => size                    : COUNT,                   Always,            Elsewhere;
    JOB_SECRET                => secret                  : Verbatim,                Always,            Elsewhere;
    LAUNCHER                  => launcher                : LauncherName,            IfChanged,         Elsewhere;
    COORD                     => coord                   : Optional(HostPort),      IfChanged,         Elsewhere;
    CONNECT_TIMEOUT           => connect_timeout         : Seconds,                 IfChanged,         Always;
    LIVENESS                  => liveness                : SecondsOrOff,            IfChanged,         Always;
    TRANSPORT                 => transport               : Transport,               Inherited,         Always;
    SEGMENT                   => segment_bytes           : Optional(SegmentSize),   IfChanged,         Always;
    SEGMENT_ADDR              => segment_addr            : Optional(HexAddr),       Inherited,         Always;
    RACE                      => race.enabled            : Flag,                    IfChanged,         Always;
    RACE_EXIT_CODE            => race.exit_code          : EXIT_STATUS,             AlwaysWithRace,    Always;
    RACE_PHASES               => race.phases             : Phases,                  Inherited,         WithRace;
    RACE_LOG                  => race.log                : NonEmpty(PathText),      IfChangedWithRace, Always;
    RACE_FIRST                => race.first_only         : Flag,                    IfChangedWithRace, Always;
    RACE_STATS                => race.stats              : Flag,                    IfChangedWithRace, Always;
    RACE_MODE                 => race.schedule           : Choice { off: "race", on: "schedule" },
                                                                                    IfChangedWithRace, WithRace;
    SCHEDULE_IGNORE           => race.schedule_ignore    : NameList { separator: ',' },
                                                                                    IfChangedWithRace, WithRace;
    CHECK                     => race.check              : Flag,                    IfChangedWithRace, WithRace;
    RACE_BATCH                => race.batch_intervals    : BATCH,                   Inherited,         WithRace;
    RACE_VERIFY_INCREMENTAL   => race.verify_incremental : Flag,                    Inherited,         WithRace;
    RACE_SARIF                => race.sarif              : NonEmpty(PathText),      IfChangedWithRace, WithRace;
    RACE_SUPPRESSIONS         => race.suppressions       : Lines,                   IfChangedWithRace, WithRace;
    RACE_STARTED              => race.started_marker     : NonEmpty(PathText),      IfChangedWithRace, WithRace;
    PINPOINT                  => race.pinpoint           : NameList { separator: ';' },
                                                                                    IfChangedWithRace, WithRace;
    PINPOINT_DIR              => race.pinpoint_dir       : NonEmpty(PathText),      IfChangedWithRace, WithRace;
    SEM_ORDER                 => race.sem_order_safe     : Choice { off: "observed", on: "safe" },
                                                                                    IfChangedWithRace, WithRace;
    (TRACE_VALUES, COMPARE)   => trace.mode              : TraceOutput,             IfChanged,         Always;
    TRACE_FULL                => trace.full              : Flag,                    IfChanged,         Always;
    TRACE_VARS                => trace.vars              : NameList { separator: ',' },
                                                                                    IfChanged,         Always;
    COMPARE_CONTINUE          => trace.continue_all      : Flag,                    IfChanged,         Always;
    TOLERANCE                 => trace.abs_tolerance_bits: Tolerance,               IfChanged,         Always;
    REL_TOLERANCE             => trace.rel_tolerance_bits: Tolerance,               IfChanged,         Always;
    (RECORD, REPLAY, CHAOS)   => replay                  : ReplayRow,               IfChanged,         Always;
    (LOCAL_RANK, LOCAL_SIZE)  => local                   : Placement,               IfChanged,         Always;
    PIN                       => pin                     : ExactlyOne,              Inherited,         Always;
    HOST_MEMORY               => host_memory             : HOST_MEMORY_SWITCH,      Inherited,         Always;
    STATS_FILE                => stats_file              : NonEmpty(PathText),      Inherited,         Always;
    PUSH                      => push_pages              : PushPages,               Inherited,         Always;
    SPIN                      => spin                    : SpinBudget,              Inherited,         Always;
    SEM_TRACE                 => sem_trace               : NonEmpty(PathText),      IfChanged,         Always;
    COORD_FD                  => coord_fd                : Optional(Fd),            IfChanged,         Always;
    LAUNCHER_FD               => launcher_fd             : Optional(Fd),            IfChanged,         Always;
    FAST_FAULTS               => debug.fast_faults       : FAST_FAULTS,             Inherited,         Always;
    TRACE_STATS               => debug.trace_stats       : AnyValue,                Inherited,         Always;
    TEST_OCCUPY_BASE          => debug.occupy_base_on_rank: Optional(COUNT),        Inherited,         Always;
}
