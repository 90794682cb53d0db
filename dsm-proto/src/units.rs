//! One parser per unit: byte sizes (`512M`, `1G`), seconds (`0.5`) and deadlines that can be
//! turned off (`10`, `off`), shared by dsmrun's command line and the ranks' reading of their
//! job configuration, and the matching formatters so that what dsmrun writes is exactly
//! what the ranks read back.

use std::time::Duration;

/// A size or duration that does not parse, from [`parse_size`] or [`parse_seconds`]. The
/// message says what was expected, so dsmrun and the ranks print it as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// The size was empty or only whitespace.
    #[error("empty size; expected a byte count such as 4096, 512M or 1G")]
    EmptySize,
    /// The text does not start with a digit (e.g. `G`, `-1G`); carries the input.
    #[error("'{0}' is not a size; expected a byte count, optionally followed by K, M, G or T (powers of 1024), e.g. 512M")]
    NotASize(String),
    /// A decimal point or comma follows the digits (`1.5G`): sizes are whole numbers of
    /// their unit. Carries the input.
    #[error("'{0}': fractional sizes are not supported; use a smaller unit (e.g. 1536M instead of 1.5G)")]
    FractionalSize(String),
    /// The suffix after the number is not one of the binary units.
    #[error(
        "'{input}': unknown unit '{unit}'; use K, M, G or T (powers of 1024), or no unit for bytes"
    )]
    UnknownUnit {
        /// The whole text as given.
        input: String,
        /// The unrecognised suffix, with leading whitespace removed.
        unit: String,
    },
    /// The number, or the number times its unit, overflows a `u64` byte count; carries
    /// the input.
    #[error("'{0}' is too large")]
    SizeTooLarge(String),
    /// A shared segment larger than [`MAX_SEGMENT_BYTES`](crate::MAX_SEGMENT_BYTES) (16
    /// TiB, once rounded up to whole pages); carries the input.
    #[error("'{0}' is larger than the largest shared segment, 16T (page numbers are 32-bit)")]
    SegmentTooLarge(String),
    /// The size is zero bytes (`0`, `0M`); every size dsm reads must be positive.
    #[error("the size must be greater than zero")]
    ZeroSize,
    /// Not a finite number of seconds greater than zero that fits a [`Duration`] (`0`,
    /// `-1`, `inf`, `NaN`, text); carries the input.
    #[error("'{0}' is not a number of seconds greater than zero")]
    InvalidSeconds(String),
    /// More seconds than a [`Duration`] holds (`1e30`, `inf`); carries the input.
    #[error("'{0}' is more seconds than a duration can hold (at most about 1.8e19)")]
    SecondsTooLarge(String),
    /// Neither a number of seconds greater than zero nor `0`/`off` (from
    /// [`parse_seconds_or_off`]); carries the input.
    #[error("'{0}' is not a deadline; expected seconds greater than zero (e.g. 10 or 0.5), or 0 or off for none")]
    InvalidDeadline(String),
}

/// Parses a size such as `1G`, `512M`, `4096K`, `65536` (bytes) into bytes.
/// Units are binary (K = 1024) and case-insensitive; `KB`/`KiB` spellings are
/// accepted as the same unit, and whitespace may separate number and unit (`64 KiB`).
///
/// Fails with the [`ValueError`] naming the problem: empty text, no leading digits, a
/// fraction, an unknown unit, overflow of `u64`, or zero.
pub fn parse_size(text: &str) -> Result<u64, ValueError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(ValueError::EmptySize);
    }
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    // `64 KiB` is how people write sizes, and the ranks' own parser takes it.
    let unit = unit.trim_start();
    if number.is_empty() {
        return Err(ValueError::NotASize(text.to_owned()));
    }
    if unit.starts_with(['.', ',']) {
        return Err(ValueError::FractionalSize(text.to_owned()));
    }
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(ValueError::UnknownUnit {
                input: text.to_owned(),
                unit: unit.to_owned(),
            })
        }
    };
    // Only ASCII digits are left, so a parse failure can only be overflow.
    let value: u64 = number
        .parse()
        .map_err(|_| ValueError::SizeTooLarge(text.to_owned()))?;
    let bytes = value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| ValueError::SizeTooLarge(text.to_owned()))?;
    if bytes == 0 {
        return Err(ValueError::ZeroSize);
    }
    Ok(bytes)
}

/// [`parse_size`] for a shared segment size (`--segment`, `DSM_SEGMENT`): also fails with
/// [`ValueError::SegmentTooLarge`] above [`MAX_SEGMENT_BYTES`](crate::MAX_SEGMENT_BYTES)
/// once rounded up to whole pages.
pub fn parse_segment_size(text: &str) -> Result<u64, ValueError> {
    let bytes = parse_size(text)?;
    if bytes.div_ceil(crate::PAGE_SIZE as u64) > crate::MAX_SEGMENT_BYTES / crate::PAGE_SIZE as u64
    {
        return Err(ValueError::SegmentTooLarge(text.to_owned()));
    }
    Ok(bytes)
}

/// Parses a positive number of seconds, fractions allowed (`1`, `0.5`). Fails with
/// [`ValueError::InvalidSeconds`] for zero, negative, NaN or unparsable text, and with
/// [`ValueError::SecondsTooLarge`] for values too large for a [`Duration`] (`inf`).
pub fn parse_seconds(text: &str) -> Result<Duration, ValueError> {
    let invalid = || ValueError::InvalidSeconds(text.to_owned());
    let secs: f64 = text.trim().parse().map_err(|_| invalid())?;
    if secs.is_nan() || secs <= 0.0 {
        return Err(invalid());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| ValueError::SecondsTooLarge(text.to_owned()))
}

/// Seconds the way a user would write them (`1`, `0.5`); [`parse_seconds`] reads it back.
pub fn format_secs(duration: Duration) -> String {
    duration.as_secs_f64().to_string()
}

/// Parses a deadline that can be turned off: `0` or `off` (any case) is `None`, anything
/// else must be what [`parse_seconds`] accepts. Fails with [`ValueError::InvalidDeadline`].
pub fn parse_seconds_or_off(text: &str) -> Result<Option<Duration>, ValueError> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("off") || trimmed.parse::<f64>() == Ok(0.0) {
        return Ok(None);
    }
    parse_seconds(trimmed)
        .map(Some)
        .map_err(|_| ValueError::InvalidDeadline(text.to_owned()))
}

/// A deadline as [`parse_seconds_or_off`] reads it back: seconds, or `off`.
pub fn format_secs_or_off(deadline: Option<Duration>) -> String {
    deadline.map_or_else(|| "off".to_owned(), format_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096K"), Ok(4096 * 1024));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("3MB"), Ok(3 << 20));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size(" 64k "), Ok(64 << 10));
        assert_eq!(parse_size("10b"), Ok(10));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
    }

    #[test]
    fn bad_sizes_are_rejected_with_a_reason() {
        assert_eq!(parse_size(""), Err(ValueError::EmptySize));
        assert_eq!(parse_size("G"), Err(ValueError::NotASize("G".into())));
        assert_eq!(parse_size("-1G"), Err(ValueError::NotASize("-1G".into())));
        assert_eq!(parse_size("0"), Err(ValueError::ZeroSize));
        assert_eq!(parse_size("0M"), Err(ValueError::ZeroSize));
        assert_eq!(
            parse_size("1.5G"),
            Err(ValueError::FractionalSize("1.5G".into()))
        );
        assert!(matches!(
            parse_size("12X"),
            Err(ValueError::UnknownUnit { ref unit, .. }) if unit == "X"
        ));
        assert!(matches!(
            parse_size("1 G B"),
            Err(ValueError::UnknownUnit { .. })
        ));
        assert_eq!(
            parse_size("99999999999999999999"),
            Err(ValueError::SizeTooLarge("99999999999999999999".into()))
        );
        assert_eq!(
            parse_size("16777216T"),
            Err(ValueError::SizeTooLarge("16777216T".into()))
        );
        assert!(parse_size("12X").unwrap_err().to_string().contains("'X'"));
    }

    #[test]
    fn segment_sizes_stop_at_16_tib() {
        assert_eq!(parse_segment_size("1G"), Ok(1 << 30));
        assert_eq!(parse_segment_size("16T"), Ok(16 << 40));
        assert_eq!(parse_segment_size("16T"), Ok(crate::MAX_SEGMENT_BYTES));
        for big in ["17T", "17592186044417", "1024T"] {
            assert_eq!(
                parse_segment_size(big),
                Err(ValueError::SegmentTooLarge(big.into()))
            );
        }
        assert!(parse_segment_size("17T")
            .unwrap_err()
            .to_string()
            .contains("16T"));
        assert_eq!(parse_segment_size("0"), Err(ValueError::ZeroSize));
    }

    #[test]
    fn seconds_parse_positive_numbers_only() {
        assert_eq!(parse_seconds("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "abc", "", "NaN"] {
            assert_eq!(
                parse_seconds(bad),
                Err(ValueError::InvalidSeconds(bad.into()))
            );
        }
        for big in ["inf", "1e300", "99999999999999999999"] {
            assert_eq!(
                parse_seconds(big),
                Err(ValueError::SecondsTooLarge(big.into()))
            );
        }
    }

    #[test]
    fn deadlines_are_seconds_or_off() {
        assert_eq!(
            parse_seconds_or_off("10"),
            Ok(Some(Duration::from_secs(10)))
        );
        assert_eq!(
            parse_seconds_or_off(" 0.25 "),
            Ok(Some(Duration::from_millis(250)))
        );
        for off in ["0", "0.0", "off", "OFF", " Off "] {
            assert_eq!(parse_seconds_or_off(off), Ok(None), "{off:?}");
        }
        for bad in ["-1", "", "never", "inf", "NaN", "-0.5"] {
            assert_eq!(
                parse_seconds_or_off(bad),
                Err(ValueError::InvalidDeadline(bad.into())),
                "{bad:?}"
            );
        }
        for d in [
            None,
            Some(Duration::from_secs(10)),
            Some(Duration::from_millis(1500)),
        ] {
            assert_eq!(parse_seconds_or_off(&format_secs_or_off(d)), Ok(d));
        }
    }

    #[test]
    fn formatted_seconds_parse_back() {
        for d in [
            Duration::from_secs(30),
            Duration::from_millis(1500),
            Duration::from_micros(7),
        ] {
            assert_eq!(parse_seconds(&format_secs(d)), Ok(d));
        }
    }
}
