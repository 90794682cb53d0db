//! How each setting of a [`JobConfig`](super::JobConfig) is spelled in its `DSM_*` variable:
//! one value per format that both writes the text and reads it back, so that the writer
//! and the readers the settings table generates cannot disagree on a spelling.

use super::{
    ConfigError, Launcher, LocalPlacement, RacePhases, ReplayOptions, TraceMode, TransportChoice,
    DEFAULT_PUSH_PAGES, DSMRUN, MAX_SPIN_US,
};
use crate::units::{
    format_secs, format_secs_or_off, parse_seconds, parse_seconds_or_off, parse_segment_size,
};
use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How one variable's text carries a value of type `T`.
pub(super) trait VarText<T> {
    /// The text for `value`; `None` leaves the variable unset, which reads as the default.
    fn write_text(&self, value: &T) -> Option<OsString>;
    /// The value `var`'s `text` stands for; errors name `var`.
    fn read_text(&self, var: &'static str, text: String) -> Result<T, ConfigError>;
}

/// How a row of the settings table, `N` variables that carry one field together, is
/// written and read. Every single-variable format is a row format with `N = 1`.
pub(super) trait RowText<T, const N: usize> {
    /// The text of each variable for `value` (`None`: left unset).
    fn write(&self, value: &T) -> [Option<OsString>; N];
    /// The field the variables' texts (`None`: unset) give; `None` when they leave it at
    /// its default.
    fn read(
        &self,
        vars: [&'static str; N],
        texts: [Option<String>; N],
    ) -> Result<Option<T>, ConfigError>;
}

impl<T, F: VarText<T>> RowText<T, 1> for F {
    fn write(&self, value: &T) -> [Option<OsString>; 1] {
        [self.write_text(value)]
    }

    fn read(
        &self,
        [var]: [&'static str; 1],
        [text]: [Option<String>; 1],
    ) -> Result<Option<T>, ConfigError> {
        text.map(|text| self.read_text(var, text)).transpose()
    }
}

/// The error for `var`'s `value`, which does not parse: `why`.
pub(super) fn invalid(var: &'static str, value: &str, why: String) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        why,
    }
}

/// A switch that is on when set to anything but empty or `0`; written as `1`.
pub(super) struct Flag;

impl VarText<bool> for Flag {
    fn write_text(&self, on: &bool) -> Option<OsString> {
        on.then(|| "1".into())
    }
    fn read_text(&self, _: &'static str, text: String) -> Result<bool, ConfigError> {
        Ok(text != "0" && !text.is_empty())
    }
}

/// A switch that is on only when set to exactly `1`.
pub(super) struct ExactlyOne;

impl VarText<bool> for ExactlyOne {
    fn write_text(&self, on: &bool) -> Option<OsString> {
        on.then(|| "1".into())
    }
    fn read_text(&self, _: &'static str, text: String) -> Result<bool, ConfigError> {
        Ok(text == "1")
    }
}

/// A switch that is on when the variable is set at all, whatever its value.
pub(super) struct AnyValue;

impl VarText<bool> for AnyValue {
    fn write_text(&self, on: &bool) -> Option<OsString> {
        on.then(|| "1".into())
    }
    fn read_text(&self, _: &'static str, _: String) -> Result<bool, ConfigError> {
        Ok(true)
    }
}

/// A switch spelled `0` or `1` and nothing else; `why` says what each means.
pub(super) struct ZeroOrOne {
    pub why: &'static str,
}

impl VarText<bool> for ZeroOrOne {
    fn write_text(&self, on: &bool) -> Option<OsString> {
        Some(if *on { "1" } else { "0" }.into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<bool, ConfigError> {
        match text.as_str() {
            "1" => Ok(true),
            "0" => Ok(false),
            _ => Err(invalid(var, &text, self.why.into())),
        }
    }
}

/// A switch spelled as one of two words, `off` (or empty) and `on`.
pub(super) struct Choice {
    pub off: &'static str,
    pub on: &'static str,
}

impl VarText<bool> for Choice {
    fn write_text(&self, on: &bool) -> Option<OsString> {
        Some(if *on { self.on } else { self.off }.into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<bool, ConfigError> {
        match text.trim() {
            word if word.is_empty() || word == self.off => Ok(false),
            word if word == self.on => Ok(true),
            _ => Err(invalid(
                var,
                &text,
                format!("expected {} or {}", self.off, self.on),
            )),
        }
    }
}

/// A decimal number, blanks around it allowed; `why` names what is expected.
pub(super) struct Number {
    pub why: &'static str,
}

/// A count of ranks or a rank.
pub(super) const COUNT: Number = Number {
    why: "expected a non-negative integer",
};

impl<T: FromStr + ToString> VarText<T> for Number {
    fn write_text(&self, value: &T) -> Option<OsString> {
        Some(value.to_string().into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<T, ConfigError> {
        text.trim()
            .parse()
            .map_err(|_| invalid(var, &text, self.why.into()))
    }
}

/// A decimal number of at least 1.
pub(super) struct Positive {
    pub why: &'static str,
}

impl VarText<u32> for Positive {
    fn write_text(&self, value: &u32) -> Option<OsString> {
        Some(value.to_string().into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<u32, ConfigError> {
        text.trim()
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid(var, &text, self.why.into()))
    }
}

/// An inherited file descriptor: above the standard streams.
pub(super) struct Fd;

impl VarText<i32> for Fd {
    fn write_text(&self, fd: &i32) -> Option<OsString> {
        Some(fd.to_string().into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<i32, ConfigError> {
        match text.trim().parse::<i32>() {
            Ok(fd) if fd > 2 => Ok(fd),
            _ => Err(invalid(
                var,
                &text,
                "expected a file descriptor above 2".into(),
            )),
        }
    }
}

/// Text kept as it is (the job secret).
pub(super) struct Verbatim;

impl VarText<String> for Verbatim {
    fn write_text(&self, text: &String) -> Option<OsString> {
        Some(text.into())
    }
    fn read_text(&self, _: &'static str, text: String) -> Result<String, ConfigError> {
        Ok(text)
    }
}

/// A path, as it is.
pub(super) struct PathText;

impl VarText<PathBuf> for PathText {
    fn write_text(&self, path: &PathBuf) -> Option<OsString> {
        Some(path.clone().into_os_string())
    }
    fn read_text(&self, _: &'static str, text: String) -> Result<PathBuf, ConfigError> {
        Ok(PathBuf::from(text))
    }
}

/// `host:port`, resolved to its first address.
pub(super) struct HostPort;

impl VarText<SocketAddr> for HostPort {
    fn write_text(&self, addr: &SocketAddr) -> Option<OsString> {
        Some(addr.to_string().into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<SocketAddr, ConfigError> {
        text.to_socket_addrs()
            .map_err(|e| invalid(var, &text, format!("expected host:port ({e})")))?
            .next()
            .ok_or_else(|| invalid(var, &text, "resolves to no address".into()))
    }
}

/// An address in hexadecimal, with or without `0x`.
pub(super) struct HexAddr;

impl VarText<usize> for HexAddr {
    fn write_text(&self, addr: &usize) -> Option<OsString> {
        Some(format!("{addr:#x}").into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<usize, ConfigError> {
        usize::from_str_radix(text.trim().trim_start_matches("0x"), 16)
            .map_err(|_| invalid(var, &text, "expected a hex address".into()))
    }
}

/// A segment size: bytes with an optional `K`/`M`/`G`/`T` suffix, at most the largest
/// segment.
pub(super) struct SegmentSize;

impl VarText<u64> for SegmentSize {
    fn write_text(&self, bytes: &u64) -> Option<OsString> {
        Some(bytes.to_string().into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<u64, ConfigError> {
        parse_segment_size(&text).map_err(|e| invalid(var, &text, e.to_string()))
    }
}

/// Seconds, fractions allowed.
pub(super) struct Seconds;

impl VarText<Duration> for Seconds {
    fn write_text(&self, duration: &Duration) -> Option<OsString> {
        Some(format_secs(*duration).into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<Duration, ConfigError> {
        parse_seconds(&text).map_err(|e| invalid(var, &text, e.to_string()))
    }
}

/// Seconds, or `off`/`0` for never.
pub(super) struct SecondsOrOff;

impl VarText<Option<Duration>> for SecondsOrOff {
    fn write_text(&self, deadline: &Option<Duration>) -> Option<OsString> {
        Some(format_secs_or_off(*deadline).into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<Option<Duration>, ConfigError> {
        parse_seconds_or_off(&text).map_err(|e| invalid(var, &text, e.to_string()))
    }
}

/// A floating-point tolerance, kept as its bit pattern: a finite number, at least 0,
/// written as Rust's `{:?}` spelling so that it reads back to the same bits.
pub(super) struct Tolerance;

impl VarText<u64> for Tolerance {
    fn write_text(&self, bits: &u64) -> Option<OsString> {
        Some(format!("{:?}", f64::from_bits(*bits)).into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<u64, ConfigError> {
        text.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| *x >= 0.0 && x.is_finite())
            .map(f64::to_bits)
            .ok_or_else(|| invalid(var, &text, "expected a non-negative number".into()))
    }
}

/// Names separated by `separator`, blanks around them and empty names dropped.
pub(super) struct NameList {
    pub separator: char,
}

impl VarText<Vec<String>> for NameList {
    fn write_text(&self, names: &Vec<String>) -> Option<OsString> {
        (!names.is_empty()).then(|| names.join(&self.separator.to_string()).into())
    }
    fn read_text(&self, _: &'static str, text: String) -> Result<Vec<String>, ConfigError> {
        Ok(text
            .split(self.separator)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect())
    }
}

/// Entries one a line, kept as they are.
pub(super) struct Lines;

impl VarText<Vec<String>> for Lines {
    fn write_text(&self, lines: &Vec<String>) -> Option<OsString> {
        (!lines.is_empty()).then(|| lines.join("\n").into())
    }
    fn read_text(&self, _: &'static str, text: String) -> Result<Vec<String>, ConfigError> {
        Ok(text.lines().map(str::to_string).collect())
    }
}

/// `Some` value in `F`'s spelling; unset for `None`.
pub(super) struct Optional<F>(pub F);

impl<T, F: VarText<T>> VarText<Option<T>> for Optional<F> {
    fn write_text(&self, value: &Option<T>) -> Option<OsString> {
        value.as_ref().and_then(|v| self.0.write_text(v))
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<Option<T>, ConfigError> {
        self.0.read_text(var, text).map(Some)
    }
}

/// As [`Optional`], and set but empty also means `None`.
pub(super) struct NonEmpty<F>(pub F);

impl<T, F: VarText<T>> VarText<Option<T>> for NonEmpty<F> {
    fn write_text(&self, value: &Option<T>) -> Option<OsString> {
        value.as_ref().and_then(|v| self.0.write_text(v))
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<Option<T>, ConfigError> {
        if text.is_empty() {
            return Ok(None);
        }
        self.0.read_text(var, text).map(Some)
    }
}

/// `dsmrun` for [`Launcher::Dsmrun`]; the others are not written (a rank finds Slurm or
/// MPI from their own variables), and any other text reads as a standalone start.
pub(super) struct LauncherName;

impl VarText<Launcher> for LauncherName {
    fn write_text(&self, launcher: &Launcher) -> Option<OsString> {
        (*launcher == Launcher::Dsmrun).then(|| DSMRUN.into())
    }
    fn read_text(&self, _: &'static str, text: String) -> Result<Launcher, ConfigError> {
        Ok(if text == DSMRUN {
            Launcher::Dsmrun
        } else {
            Launcher::Standalone
        })
    }
}

/// `auto` (or empty), `rings` or `tcp`.
pub(super) struct Transport;

impl VarText<TransportChoice> for Transport {
    fn write_text(&self, choice: &TransportChoice) -> Option<OsString> {
        Some(
            match choice {
                TransportChoice::Auto => "auto",
                TransportChoice::Rings => "rings",
                TransportChoice::Tcp => "tcp",
            }
            .into(),
        )
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<TransportChoice, ConfigError> {
        match text.trim() {
            "" | "auto" => Ok(TransportChoice::Auto),
            "rings" => Ok(TransportChoice::Rings),
            "tcp" => Ok(TransportChoice::Tcp),
            other => Err(invalid(
                var,
                other,
                "expected `auto` (shared memory between ranks on one host, TCP between \
                 hosts), `rings` (shared-memory messages, but every rank its own copy of \
                 the pages) or `tcp`"
                    .into(),
            )),
        }
    }
}

/// `record`, `notices`, `compare` or `full`.
pub(super) struct Phases;

impl VarText<RacePhases> for Phases {
    fn write_text(&self, phases: &RacePhases) -> Option<OsString> {
        Some(phases.as_str().into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<RacePhases, ConfigError> {
        RacePhases::parse(text.trim()).ok_or_else(|| {
            invalid(
                var,
                &text,
                "expected record, notices, compare or full".into(),
            )
        })
    }
}

/// `on` (the default count), `off`, or a page count (`0` is `off`).
pub(super) struct PushPages;

impl VarText<u32> for PushPages {
    fn write_text(&self, pages: &u32) -> Option<OsString> {
        Some(pages.to_string().into())
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<u32, ConfigError> {
        match text.trim() {
            "on" => Ok(DEFAULT_PUSH_PAGES),
            "off" => Ok(0),
            n => n
                .parse::<u32>()
                .map_err(|_| invalid(var, &text, "expected on, off or a page count".into())),
        }
    }
}

/// `auto` (or empty: `None`), `off`, or microseconds up to [`MAX_SPIN_US`] (`0` is `off`).
pub(super) struct SpinBudget;

impl VarText<Option<Duration>> for SpinBudget {
    fn write_text(&self, budget: &Option<Duration>) -> Option<OsString> {
        Some(match budget {
            None => "auto".into(),
            Some(budget) => budget.as_micros().to_string().into(),
        })
    }
    fn read_text(&self, var: &'static str, text: String) -> Result<Option<Duration>, ConfigError> {
        match text.trim() {
            "" | "auto" => Ok(None),
            "off" => Ok(Some(Duration::ZERO)),
            n => n
                .parse::<u64>()
                .ok()
                .filter(|&us| us <= MAX_SPIN_US)
                .map(|us| Some(Duration::from_micros(us)))
                .ok_or_else(|| {
                    invalid(
                        var,
                        &text,
                        format!("expected auto, off or microseconds (0 to {MAX_SPIN_US})"),
                    )
                }),
        }
    }
}

/// Value tracing's two variables, the trace to record and the reference to compare with,
/// which exclude each other (even empty: setting both is a mistake worth stopping for).
pub(super) struct TraceOutput;

impl RowText<TraceMode, 2> for TraceOutput {
    fn write(&self, mode: &TraceMode) -> [Option<OsString>; 2] {
        match mode {
            TraceMode::Off => [None, None],
            TraceMode::Record(p) => [Some(p.clone().into_os_string()), None],
            TraceMode::Compare(p) => [None, Some(p.clone().into_os_string())],
        }
    }

    fn read(
        &self,
        [record_var, compare_var]: [&'static str; 2],
        texts: [Option<String>; 2],
    ) -> Result<Option<TraceMode>, ConfigError> {
        Ok(match texts {
            [Some(_), Some(_)] => {
                return Err(invalid(
                    compare_var,
                    "",
                    format!("{record_var} and {compare_var} exclude each other"),
                ))
            }
            [Some(p), None] if !p.is_empty() => Some(TraceMode::Record(PathBuf::from(p))),
            [None, Some(p)] if !p.is_empty() => Some(TraceMode::Compare(PathBuf::from(p))),
            _ => None,
        })
    }
}

/// A rank's place on its host: index and count, read only when both are set.
pub(super) struct Placement;

impl RowText<Option<LocalPlacement>, 2> for Placement {
    fn write(&self, local: &Option<LocalPlacement>) -> [Option<OsString>; 2] {
        match local {
            None => [None, None],
            Some(local) => [COUNT.write_text(&local.rank), COUNT.write_text(&local.size)],
        }
    }

    fn read(
        &self,
        [rank_var, size_var]: [&'static str; 2],
        texts: [Option<String>; 2],
    ) -> Result<Option<Option<LocalPlacement>>, ConfigError> {
        let [Some(rank), Some(size)] = texts else {
            return Ok(None);
        };
        let local = LocalPlacement {
            rank: COUNT.read_text(rank_var, rank.clone())?,
            size: COUNT.read_text(size_var, size.clone())?,
        };
        if local.rank >= local.size {
            return Err(invalid(
                rank_var,
                &rank,
                format!("must be below {size_var} {size}"),
            ));
        }
        Ok(Some(Some(local)))
    }
}

/// Recording, replay and chaos: two paths that exclude each other and a seed.
pub(super) struct ReplayRow;

/// Chaos mode's seed.
const SEED: Number = Number {
    why: "expected a seed 0..=2^64-1",
};

impl RowText<ReplayOptions, 3> for ReplayRow {
    fn write(&self, replay: &ReplayOptions) -> [Option<OsString>; 3] {
        [
            NonEmpty(PathText).write_text(&replay.record),
            NonEmpty(PathText).write_text(&replay.replay),
            NonEmpty(SEED).write_text(&replay.chaos),
        ]
    }

    fn read(
        &self,
        [record_var, replay_var, chaos_var]: [&'static str; 3],
        [record, replay, chaos]: [Option<String>; 3],
    ) -> Result<Option<ReplayOptions>, ConfigError> {
        let options = ReplayOptions {
            record: read_unset_as_none(&NonEmpty(PathText), record_var, record)?,
            replay: read_unset_as_none(&NonEmpty(PathText), replay_var, replay)?,
            chaos: read_unset_as_none(&NonEmpty(SEED), chaos_var, chaos)?,
        };
        if options.record.is_some() && options.replay.is_some() {
            return Err(invalid(
                replay_var,
                "",
                format!("{record_var} and {replay_var} exclude each other"),
            ));
        }
        Ok(Some(options))
    }
}

/// `var`'s `text` read with `format`, `None` when unset.
fn read_unset_as_none<T>(
    format: &impl VarText<Option<T>>,
    var: &'static str,
    text: Option<String>,
) -> Result<Option<T>, ConfigError> {
    Ok(text
        .map(|text| format.read_text(var, text))
        .transpose()?
        .flatten())
}
