//! The labelled C race kernels (`tests/c/*.c`), compiled with gcc through `dsmcc` (real
//! ThreadSanitizer instrumentation, linked against this crate's `libdsm.a`) and run under
//! `dsmrun --race` with 2, 4 and 8 ranks. Each kernel names the variables that race in an
//! `EXPECT:` comment (`none` for race-free ones) and marks every line whose access takes
//! part in a race with `// RACE`; a kernel may also give the number of racing elements
//! (`RACES: n`). A run must report exactly the expected variables (and that many
//! elements), name both sides of every race by a marked line of the kernel's file, name
//! every marked line at least once, and exit with the race status (0 for race-free
//! kernels, which must report nothing).

use dsm_testkit::capi::{self, build_app, have};
use dsm_testkit::{dsmrun_command, run, skip};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const KERNELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c");

/// A kernel's labels: the variables it races on, its `// RACE` lines and, if it says,
/// how many elements race.
struct Labels {
    vars: BTreeSet<String>,
    lines: BTreeSet<u32>,
    elements: Option<u64>,
}

fn labels(source: &str) -> Labels {
    let expect = source
        .lines()
        .find_map(|l| l.split("EXPECT:").nth(1))
        .expect("every kernel has an EXPECT: comment")
        .trim()
        .trim_end_matches("*/")
        .trim();
    let vars = if expect == "none" {
        BTreeSet::new()
    } else {
        expect.split(',').map(|v| v.trim().to_string()).collect()
    };
    let lines = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with("// RACE"))
        .map(|(i, _)| i as u32 + 1)
        .collect();
    let elements = source.lines().find_map(|l| {
        let n = l.split("RACES:").nth(1)?.split_whitespace().next()?;
        Some(n.parse().expect("RACES: is followed by a number"))
    });
    Labels {
        vars,
        lines,
        elements,
    }
}

/// The number of racing elements the run's summary line (`dsm: N data races on ...`)
/// gives.
fn elements_reported(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|l| {
        let (n, _) = l.split("dsm: ").nth(1)?.split_once(" data race")?;
        n.parse().ok()
    })
}

/// One reported race: its variable and its sides' `file:line`.
#[derive(Debug)]
struct Reported {
    var: String,
    sides: Vec<(String, u32)>,
}

/// The races of a report's text blocks: a `DATA RACE ... on VAR[...]` line, then each
/// side's `at FILE:LINE:COL`.
fn reported(stderr: &str) -> Vec<Reported> {
    let mut out: Vec<Reported> = Vec::new();
    for line in stderr.lines() {
        let text = line.split_once("] ").map_or(line, |(_, t)| t).trim_start();
        if let Some(rest) = text.strip_prefix("dsm: DATA RACE") {
            let on = rest.split(" on ").nth(1).unwrap_or_default();
            let var = on.split('[').next().unwrap_or_default().to_string();
            out.push(Reported {
                var,
                sides: Vec::new(),
            });
        } else if let (Some(at), Some(r)) = (text.strip_prefix("at "), out.last_mut()) {
            let mut parts = at.rsplitn(3, ':');
            let (_col, line, file) = (parts.next(), parts.next(), parts.next());
            if let (Some(line), Some(file)) = (line.and_then(|l| l.parse().ok()), file) {
                r.sides.push((file.to_string(), line));
            }
        }
    }
    out
}

/// Compiles `kernel` with `dsmcc` into `dir`, against the `libdsm.a` of this build.
fn build(kernel: &Path, dir: &Path) -> PathBuf {
    build_with("gcc", kernel, dir)
}

/// [`build`] with compiler `cc`.
fn build_with(cc: &str, kernel: &Path, dir: &Path) -> PathBuf {
    capi::build(cc, &["-O2"], kernel, dir)
}

fn check(kernel: &Path, exe: &Path, n: usize) {
    let name = kernel.file_name().unwrap().to_string_lossy().to_string();
    let want = labels(&std::fs::read_to_string(kernel).expect("kernel source"));
    let r = run(dsmrun_command(n, &["--race"], exe.to_str().unwrap(), &[]));
    let races = reported(&r.stderr);
    let context = format!("{name} at N={n}:\n{}", r.stderr);
    let vars: BTreeSet<String> = races.iter().map(|r| r.var.clone()).collect();
    assert_eq!(vars, want.vars, "reported variables of {context}");
    if want.vars.is_empty() {
        assert_eq!(r.code, Some(0), "exit status of {context}");
        return;
    }
    assert_ne!(r.code, Some(0), "a racy kernel's exit status, {context}");
    if let Some(n) = want.elements {
        assert_eq!(
            elements_reported(&r.stderr),
            Some(n),
            "racing elements of {context}"
        );
    }
    let mut named = BTreeSet::new();
    for race in &races {
        assert_eq!(
            race.sides.len(),
            2,
            "both sides of {race:?} named, {context}"
        );
        for (file, line) in &race.sides {
            assert!(
                file.ends_with(&format!("tests/c/{name}")),
                "side {file}:{line} of {race:?} is not in the kernel, {context}"
            );
            assert!(
                want.lines.contains(line),
                "line {line} of {race:?} is not marked RACE, {context}"
            );
            named.insert(*line);
        }
    }
    assert_eq!(
        named, want.lines,
        "marked lines named by the races of {context}"
    );
}

/// The kernels' sources, sorted.
fn kernels() -> Vec<PathBuf> {
    let mut kernels: Vec<PathBuf> = std::fs::read_dir(KERNELS)
        .expect("tests/c")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    kernels.sort();
    assert!(kernels.len() >= 8, "the kernels are in {KERNELS}");
    kernels
}

#[test]
fn c_race_kernels_report_exactly_their_labels() {
    if !have("gcc", "c_race_kernels_report_exactly_their_labels") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    for kernel in &kernels() {
        let exe = build(kernel, dir.path());
        for n in [2, 4, 8] {
            check(kernel, &exe, n);
        }
    }
}

/// The same kernels compiled by clang, whose instrumentation differs (clang 14 makes
/// `struct_copy.c`'s copy `__tsan_write16` and `__tsan_write8` where gcc 12 calls
/// `__tsan_write_range`), at N = 2.
#[test]
fn c_race_kernels_compiled_by_clang() {
    const TEST: &str = "c_race_kernels_compiled_by_clang";
    // Debian's clang is not installed by default: install it, as CI must.
    if let Err(why) = dsm_testkit::ensure_installed(&["/usr/bin/clang"], &["clang"]) {
        skip(TEST, &format!("cannot install clang: {why}"));
        return;
    }
    if !have("clang", TEST) {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    for kernel in &kernels() {
        let exe = build_with("clang", kernel, dir.path());
        check(kernel, &exe, 2);
    }
}

#[test]
fn c_sor_is_bitwise_the_sequential_run_and_race_free() {
    if !have("gcc", "c_sor_is_bitwise_the_sequential_run_and_race_free") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = build_app("sor", dir.path());
    for (n, race) in [(1, false), (2, true), (3, false), (4, true)] {
        let flags: &[&str] = if race { &["--race"] } else { &[] };
        let r = run(dsmrun_command(
            n,
            flags,
            exe.to_str().unwrap(),
            &["67", "5"],
        ));
        let context = format!("c sor at N={n}, race {race}:\n{}{}", r.stdout, r.stderr);
        assert_eq!(r.code, Some(0), "exit status of {context}");
        assert!(
            r.stdout.contains("verified: c sor 67x67, 5 iterations"),
            "{context}"
        );
        if race {
            assert!(r.stderr.contains("dsm: 0 data races"), "{context}");
        }
    }
}

#[test]
fn cpp_program_with_virtual_calls_runs_race_free() {
    if !have("g++", "cpp_program_with_virtual_calls_runs_race_free") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpp/shapes.cpp");
    let exe = build_with("g++", &source, dir.path());
    let r = run(dsmrun_command(2, &["--race"], exe.to_str().unwrap(), &[]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(0), "{context}");
    // Squares of sides 1 and 2.
    assert_eq!(r.stdout.matches("total 5").count(), 2, "{context}");
    assert!(r.stderr.contains("dsm: 0 data races"), "{context}");
}

#[test]
fn c_api_errors_are_codes_and_messages() {
    if !have("gcc", "c_api_errors_are_codes_and_messages") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/capi/errors.c");
    let exe = build(&source, dir.path());
    for n in [1, 2] {
        let r = run(dsmrun_command(n, &["--race"], exe.to_str().unwrap(), &[]));
        let context = format!("N={n}:\n{}{}", r.stdout, r.stderr);
        assert_eq!(r.code, Some(0), "{context}");
        assert_eq!(r.stdout.matches("api errors: ok").count(), n, "{context}");
    }
}

/// C Water at 2 and 4 ranks under `--race`: rank 0's sequential rerun on private memory
/// agrees with every step's energies (relative 1e-9) and the total energy is conserved (the
/// `verified:` line), and the per-molecule force locks leave no race.
#[test]
fn c_water_matches_the_sequential_run_and_is_race_free() {
    if !have("gcc", "c_water_matches_the_sequential_run_and_is_race_free") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = build_app("water", dir.path());
    for (n, molecules) in [(2, "27"), (4, "64")] {
        let r = run(dsmrun_command(
            n,
            &["--race"],
            exe.to_str().unwrap(),
            &["--molecules", molecules, "--steps", "3"],
        ));
        let context = format!("c water at N={n}:\n{}{}", r.stdout, r.stderr);
        assert_eq!(r.code, Some(0), "exit status of {context}");
        assert!(
            r.stdout.contains(&format!(
                "verified: c water {molecules} molecules, 3 steps, {n} ranks"
            )),
            "{context}"
        );
        assert!(r.stderr.contains("dsm: 0 data races"), "{context}");
    }
}

/// C Water `--racy` adds the force sums without their locks: `--race` reports the
/// write-write race on `forces` (and nothing else), both sides at the line of water.c that
/// adds into the shared array, and the run exits with the race status.
#[test]
fn c_water_racy_reports_the_force_race_at_its_line() {
    if !have("gcc", "c_water_racy_reports_the_force_race_at_its_line") {
        return;
    }
    let add_line = capi::water_force_add_line();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = build_app("water", dir.path());
    let r = run(dsmrun_command(
        2,
        &["--race"],
        exe.to_str().unwrap(),
        &["--molecules", "27", "--steps", "2", "--racy"],
    ));
    let context = format!("c water --racy at N=2:\n{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(66), "the race exit status, {context}");
    let races = reported(&r.stderr);
    assert!(!races.is_empty(), "no race reported, {context}");
    for race in &races {
        assert_eq!(race.var, "forces", "{race:?}, {context}");
        assert_eq!(race.sides.len(), 2, "both sides of {race:?}, {context}");
        for (file, line) in &race.sides {
            assert!(
                file.ends_with("c-apps/water.c") && *line == add_line,
                "side {file}:{line} of {race:?} is not water.c:{add_line}, {context}"
            );
        }
    }
}

/// C TSP at 2 and 4 ranks under `--race`: the parallel branch and bound finds the optimal
/// length of rank 0's sequential search over all tours (the `verified:` line, the same
/// length at both sizes), with a queue big enough for every split tour and with one so
/// small that ranks keep children for themselves, and without races (the queue and the
/// best tour are only touched under their locks).
#[test]
fn c_tsp_finds_the_sequential_optimum_and_is_race_free() {
    if !have("gcc", "c_tsp_finds_the_sequential_optimum_and_is_race_free") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = build_app("tsp", dir.path());
    for seed in ["5", "8"] {
        let mut lengths = BTreeSet::new();
        for (n, queue) in [(2, None), (4, None), (4, Some("3"))] {
            let mut args = vec!["--cities", "11", "--seed", seed];
            if let Some(q) = queue {
                args.extend(["--queue", q]);
            }
            let r = run(dsmrun_command(n, &["--race"], exe.to_str().unwrap(), &args));
            let context = format!("c tsp {args:?} at N={n}:\n{}{}", r.stdout, r.stderr);
            assert_eq!(r.code, Some(0), "exit status of {context}");
            let verified = r
                .stdout
                .lines()
                .find_map(|l| {
                    l.split_once(&format!(
                        "verified: c tsp 11 cities (seed {seed}), {n} ranks: optimal length "
                    ))
                })
                .unwrap_or_else(|| panic!("no verified line, {context}"));
            let length: u64 = verified
                .1
                .split(',')
                .next()
                .and_then(|l| l.parse().ok())
                .unwrap_or_else(|| panic!("no length in the verified line, {context}"));
            lengths.insert(length);
            assert!(r.stderr.contains("dsm: 0 data races"), "{context}");
            if queue.is_some() {
                // The small queue really made ranks keep children.
                let kept: u64 = r
                    .stdout
                    .lines()
                    .filter_map(|l| l.split(" complete tours reached, ").nth(1))
                    .filter_map(|k| k.trim_end_matches(" kept").parse::<u64>().ok())
                    .sum();
                assert!(kept > 0, "no rank kept children with --queue 3, {context}");
            }
        }
        assert_eq!(lengths.len(), 1, "seed {seed}: lengths {lengths:?}");
    }
}

/// The C apps' shared option parsing (`c-apps/options.h`): a value that is not wholly a
/// number or is out of range, a missing value and an unknown argument each exit 2 before
/// dsm starts, naming the argument and printing the usage. The binaries run without
/// dsmrun: they stop before `dsm_init`.
#[test]
fn c_apps_reject_bad_arguments_by_name() {
    if !have("gcc", "c_apps_reject_bad_arguments_by_name") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cases: [(&str, &[&str], &str); 8] = [
        (
            "sor",
            &["12x"],
            "sor: N must be an integer in 3..32768, not '12x'",
        ),
        ("sor", &["64", "-1"], "sor: ITERS must be an integer in 0.."),
        ("sor", &["64", "5", "7"], "sor: too many arguments"),
        (
            "tsp",
            &["--cities", "17"],
            "tsp: --cities must be an integer in 1..16, not '17'",
        ),
        (
            "tsp",
            &["--seed", "-3"],
            "tsp: --seed must be an unsigned 64-bit integer, not '-3'",
        ),
        ("tsp", &["--queue"], "tsp: --queue needs a value"),
        (
            "water",
            &["--molecules", "10"],
            "water: --molecules must be a cube",
        ),
        (
            "water",
            &["--steps", "2", "--fast"],
            "water: unknown argument '--fast'",
        ),
    ];
    let mut built = std::collections::HashMap::new();
    for (app, args, want) in cases {
        let exe = built
            .entry(app)
            .or_insert_with(|| build_app(app, dir.path()));
        let out = std::process::Command::new(&*exe)
            .args(args)
            .output()
            .expect("the app runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let context = format!("{app} {args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(2), "{context}");
        assert!(stderr.contains(want), "{context}");
        assert!(stderr.contains(&format!("usage: {app}")), "{context}");
    }
}

/// A C program that returns from `main` without `dsm_finish` finishes at exit, as a Rust
/// program's `Dsm` does when dropped: the last epoch is analysed and a racy run exits with
/// the race status (it exited 0 with its races printed); finishing while holding a lock a
/// peer waits for fails with a message instead of hanging.
#[test]
fn a_c_program_that_skips_dsm_finish_is_finished_at_exit() {
    if !have(
        "gcc",
        "a_c_program_that_skips_dsm_finish_is_finished_at_exit",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/capi/unfinished.c");
    let exe = build(&source, dir.path());
    let exe = exe.to_str().unwrap();
    let r = run(dsmrun_command(2, &["--race"], exe, &["race"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(66), "{context}");
    let races = reported(&r.stderr);
    assert!(races.len() >= 2, "both epochs' races: {context}");
    assert!(
        r.stderr.contains("dsm: 2 data races on 1 variable"),
        "{context}"
    );
    assert_eq!(
        r.stdout.matches("returns without dsm_finish").count(),
        2,
        "{context}"
    );
    let r = run(dsmrun_command(2, &["--race"], exe, &["clean"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(0), "{context}");
    assert!(r.stderr.contains("dsm: 0 data races"), "{context}");
    let r = run(dsmrun_command(2, &["--timeout", "60"], exe, &["holding"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert!(!matches!(r.code, Some(0) | Some(124)), "{context}");
    assert!(
        r.stderr
            .contains("dsm_finish failed: dsm_finish with lock(s) [9] still held"),
        "{context}"
    );
}

/// `--race` refuses a program compiled without `-fsanitize=thread` (none of its accesses
/// would be recorded: it reported "0 data races"), before the job forms; the same program
/// runs without `--race`. dsmcc keeps `-fsanitize=thread` off the link, which would bring
/// libtsan's runtime in place of dsm's hooks.
#[test]
fn race_detection_refuses_an_uninstrumented_c_program() {
    if !have("gcc", "race_detection_refuses_an_uninstrumented_c_program") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/capi/unfinished.c");
    let plain = dir.path().join("plain");
    let include = capi::capi_dir().join("include");
    let out = std::process::Command::new("gcc")
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg(dsm_testkit::bin_dir().join("libdsm.a"))
        .args(["-lpthread", "-ldl", "-lm", "-lrt", "-o"])
        .arg(&plain)
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = plain.to_str().unwrap();
    let r = run(dsmrun_command(2, &["--race"], plain, &["clean"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(1), "{context}");
    assert!(
        r.stderr
            .contains("needs a program compiled with ThreadSanitizer"),
        "{context}"
    );
    assert!(!r.stderr.contains("data races"), "{context}");
    let r = run(dsmrun_command(2, &[], plain, &["clean"]));
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    // dsmcc given -fsanitize=thread by habit still links dsm's runtime, not libtsan.
    let linked = capi::build("gcc", &["-O1", "-fsanitize=thread"], &source, dir.path());
    let ldd = std::process::Command::new("ldd")
        .arg(&linked)
        .output()
        .expect("ldd runs");
    let deps = String::from_utf8_lossy(&ldd.stdout);
    assert!(!deps.contains("libtsan"), "{deps}");
    let r = run(dsmrun_command(
        2,
        &["--race"],
        linked.to_str().unwrap(),
        &["race"],
    ));
    assert_eq!(r.code, Some(66), "{}{}", r.stdout, r.stderr);
}

/// `dsm_assume_initialised` is `--check`'s way for a C program to rely on the zero fill: a
/// counter read before anybody wrote it is an uninitialised read without it and none with
/// it; an address that is not an allocation's start is `DSM_EINVAL` with a message.
/// `dsm_declare_region` declares each rank's band: a write outside it is reported.
#[test]
fn a_c_program_declares_its_zero_fill_initial() {
    if !have("gcc", "a_c_program_declares_its_zero_fill_initial") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/capi/assume.c");
    let exe = build(&source, dir.path());
    let exe = exe.to_str().unwrap();
    let r = run(dsmrun_command(2, &["--check"], exe, &["none"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(66), "{context}");
    assert!(
        r.stderr.contains("UNINITIALISED READ of count[0]"),
        "{context}"
    );
    assert!(
        r.stderr.contains("--check: 2 uninitialised reads"),
        "{context}"
    );
    let r = run(dsmrun_command(2, &["--check"], exe, &["assume"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(0), "{context}");
    assert!(r.stdout.contains("count 0"), "{context}");
    assert!(
        r.stderr.contains("--check: 0 uninitialised reads"),
        "{context}"
    );
    let r = run(dsmrun_command(2, &["--check"], exe, &["bad"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("bad pointer: -1 dsm_assume_initialised: 0x"),
        "{context}"
    );
    assert!(
        r.stdout.contains("is not the start of a shared allocation"),
        "{context}"
    );
    // Regions: the last rank's write into rank 0's band is reported with the band.
    let r = run(dsmrun_command(3, &["--check"], exe, &["region"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(66), "{context}");
    assert!(
        r.stderr.contains("WRITE OUTSIDE REGION of band[0]"),
        "{context}"
    );
    assert!(
        r.stderr
            .contains("rank 2's declared region of band is elements 8..12"),
        "{context}"
    );
    assert!(
        r.stderr.contains("1 access outside declared regions"),
        "{context}"
    );
    let r = run(dsmrun_command(2, &["--check"], exe, &["badrule"]));
    let context = format!("{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("declare: -1 dsm_declare_region: rule 7 is neither"),
        "{context}"
    );
}
