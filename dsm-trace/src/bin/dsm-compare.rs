//! `dsm-compare A B`: compares two saved value traces (`dsmrun --trace-values`) and prints
//! the first trace point and element where they differ. Exit status: 0 same, 68 values
//! differ, 2 usage error or unreadable/corrupt trace.

use dsm_trace::{compare_epoch, Tolerance, TraceError, TraceReader};
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
Exit status: 0 the traces agree, 68 they differ, 2 usage error or bad trace file.";

fn open(path: &str) -> Result<TraceReader<BufReader<File>>, String> {
    let f = File::open(path).map_err(|e| format!("cannot open trace '{path}': {e}"))?;
    TraceReader::new(BufReader::new(f)).map_err(|e| format!("trace '{path}': {e}"))
}

fn run() -> Result<bool, String> {
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
            s if s.starts_with('-') => return Err(format!("unknown option {s}\n{USAGE}")),
            _ => files.push(a),
        }
    }
    let [a, b] = &files[..] else {
        return Err(USAGE.to_string());
    };
    let mut ra = open(a)?;
    let mut rb = open(b)?;
    if ra.header() != rb.header() {
        eprintln!(
            "dsm-compare: note: the traces are of different command lines: '{} {}' and '{} {}'",
            ra.header().program,
            ra.header().args.join(" "),
            rb.header().program,
            rb.header().args.join(" ")
        );
    }
    let err = |p: &str, e: TraceError| format!("trace '{p}': {e}");
    let mut differ = false;
    loop {
        let ea = ra.next_epoch().map_err(|e| err(a, e))?;
        let eb = rb.next_epoch().map_err(|e| err(b, e))?;
        let (ea, eb) = match (ea, eb) {
            (None, None) => break,
            (Some(x), None) | (None, Some(x)) => {
                println!("values differ: one trace ends before {}", x.label());
                differ = true;
                break;
            }
            (Some(x), Some(y)) => (x, y),
        };
        let diffs = compare_epoch(&ea, &eb, tol);
        if !diffs.is_empty() {
            differ = true;
            println!("values differ at {} (epoch {}):", eb.label(), eb.epoch);
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
        Ok(true) => ExitCode::from(dsm_proto::exit_codes::VALUES_DIFFER),
        Err(e) => {
            eprintln!("dsm-compare: {e}");
            ExitCode::from(2)
        }
    }
}
