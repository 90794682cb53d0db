//! `dsm-compare A B`: compares two saved value traces (`dsmrun --trace-values`) and prints
//! the first trace point and element where they differ. Exit status: 0 same, 68 values
//! differ, 65 a damaged trace, 2 usage error or a file that cannot be opened.

use dsm_proto::exit_codes;
use dsm_trace::{check_whole, compare_epoch, Sides, Tolerance, TraceError, TraceReader};
use std::fs::File;
use std::io::BufReader;
use std::process::ExitCode;

const USAGE: &str =
    "usage: dsm-compare [--all] [--tolerance ABS] [--rel-tolerance REL] REFERENCE OTHER

Compares two value traces written by `dsmrun --trace-values FILE` (whatever node
counts they ran on) trace point by trace point, and reports the first barrier
epoch where they differ: allocation, element ((row, col) for 2-D arrays) and both
values when the traces hold values, else the range of the differing block.
  --all               report every differing trace point, not only the first
  --tolerance ABS     f64/f32 elements within ABS count as equal (needs values)
  --rel-tolerance REL f64/f32 elements within REL * max(|a|, |b|) count as equal
Exit status: 0 the traces agree, 68 they differ, 65 a trace is damaged (not a
trace, truncated, another version, or changed: checked whole before comparing),
2 usage error or a file that cannot be opened.";

/// Why dsm-compare stops without a comparison.
enum Failure {
    /// Usage, or a file that cannot be opened (exit status 2).
    Usage(String),
    /// A damaged trace (exit status 65).
    Corrupt(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure::Usage(s)
    }
}

fn file(path: &str) -> Result<BufReader<File>, Failure> {
    // A directory opens, and fails at the first read as if the trace were damaged.
    if std::path::Path::new(path).is_dir() {
        return Err(format!("cannot open trace '{path}': it is a directory").into());
    }
    let f = File::open(path).map_err(|e| format!("cannot open trace '{path}': {e}"))?;
    Ok(BufReader::new(f))
}

/// Checks a trace whole (see `dsm_trace::check_whole`) and opens it for the comparison;
/// says whether it holds values.
fn open(path: &str) -> Result<(TraceReader<BufReader<File>>, bool), Failure> {
    let whole =
        check_whole(file(path)?).map_err(|e| Failure::Corrupt(format!("trace '{path}': {e}")))?;
    let reader = TraceReader::new(file(path)?)
        .map_err(|e| Failure::Corrupt(format!("trace '{path}': {e}")))?;
    Ok((reader, whole.has_values))
}

fn run() -> Result<bool, Failure> {
    let mut all = false;
    let mut tol: Option<Tolerance> = None;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> Result<f64, String> {
            let v = args.next().ok_or(format!("{what} needs a value"))?;
            v.parse::<f64>()
                .ok()
                .filter(|x| *x >= 0.0)
                .ok_or(format!("{what} '{v}' is not a non-negative number"))
        };
        match a.as_str() {
            "--all" => all = true,
            "--tolerance" => tol.get_or_insert_with(Tolerance::default).abs = num("--tolerance")?,
            "--rel-tolerance" => {
                tol.get_or_insert_with(Tolerance::default).rel = num("--rel-tolerance")?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}\n{USAGE}").into()),
            _ => files.push(a),
        }
    }
    let [a, b] = &files[..] else {
        return Err(USAGE.to_string().into());
    };
    let (mut ra, a_values) = open(a)?;
    let (mut rb, b_values) = open(b)?;
    if tol.is_some() && !(a_values && b_values) {
        let hashes_only = if a_values { b } else { a };
        return Err(format!(
            "--tolerance and --rel-tolerance need values in both traces, and '{hashes_only}' \
             has hashes only: record it with --trace-values-full (or --trace-vars NAMES)"
        )
        .into());
    }
    let (name_a, name_b) = (format!("'{a}'"), format!("'{b}'"));
    let sides = Sides {
        reference: &name_a,
        other: &name_b,
    };
    if ra.header() != rb.header() {
        eprintln!(
            "dsm-compare: note: the traces are of different command lines: '{} {}' and '{} {}'",
            ra.header().program,
            ra.header().args.join(" "),
            rb.header().program,
            rb.header().args.join(" ")
        );
    }
    let err = |p: &str, e: TraceError| Failure::Corrupt(format!("trace '{p}': {e}"));
    let mut differ = false;
    loop {
        let ea = ra.next_epoch().map_err(|e| err(a, e))?;
        let eb = rb.next_epoch().map_err(|e| err(b, e))?;
        let (ea, eb) = match (ea, eb) {
            (None, None) => break,
            (Some(x), None) => {
                println!("values differ: {name_b} ends before {}", x.label());
                differ = true;
                break;
            }
            (None, Some(x)) => {
                println!("values differ: {name_a} ends before {}", x.label());
                differ = true;
                break;
            }
            (Some(x), Some(y)) => (x, y),
        };
        let diffs = compare_epoch(&ea, &eb, tol, sides);
        if !diffs.is_empty() {
            differ = true;
            println!(
                "values differ at {} (epoch {}):",
                eb.label(),
                eb.ended_epoch()
            );
            for d in &diffs {
                println!("  {d}");
            }
            if !all {
                break;
            }
        }
    }
    if !differ {
        println!("traces agree");
    }
    Ok(differ)
}

fn main() -> ExitCode {
    match run() {
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) => ExitCode::from(exit_codes::VALUES_DIFFER),
        Err(Failure::Usage(e)) => {
            eprintln!("dsm-compare: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Corrupt(e)) => {
            eprintln!("dsm-compare: {e}");
            ExitCode::from(exit_codes::CORRUPT_INPUT)
        }
    }
}
