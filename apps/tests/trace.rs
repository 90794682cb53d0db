//! End-to-end tests of value traces (`dsmrun --trace-values`, `--compare`, `dsm-compare`):
//! traces of SOR and FFT do not depend on the node count, a bug injected into SOR at a
//! random epoch and element is reported at exactly that epoch and element, and bad trace
//! files are clear errors.

use dsm_testkit::{self as kit, Run};
use rand::Rng;
use std::path::Path;
use std::process::Command;

fn sor() -> &'static str {
    env!("CARGO_BIN_EXE_sor")
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_string()
}

fn dsm_compare(args: &[&str]) -> Run {
    let mut cmd = Command::new(kit::bin("dsm-compare"));
    cmd.args(args);
    kit::run(cmd)
}

/// Records a trace of `program args` at each node count of `record_at` and checks that
/// every trace equals the first byte for byte, that `dsm-compare` agrees, and that a
/// `--compare` run at each node count of `compare_at` passes.
fn same_trace_at(program: &str, args: &[&str], record_at: &[usize], compare_at: &[usize]) {
    let dir = tempfile::tempdir().unwrap();
    let reference = path(dir.path(), "ref.dsmtrace");
    let out = kit::dsmrun(
        1,
        &["--trace-values", &reference, "--trace-values-full"],
        program,
        args,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let ref_bytes = std::fs::read(&reference).unwrap();
    assert!(ref_bytes.starts_with(b"DSMTRACE"));
    for &n in record_at {
        let other = path(dir.path(), &format!("n{n}.dsmtrace"));
        let out = kit::dsmrun(
            n,
            &["--trace-values", &other, "--trace-values-full"],
            program,
            args,
        );
        assert_eq!(out.code, Some(0), "N={n}: {out:?}");
        let cmp = dsm_compare(&[&reference, &other]);
        assert_eq!(cmp.code, Some(0), "N={n}: {cmp:?}");
        assert!(cmp.stdout.contains("traces agree"), "{cmp:?}");
        assert!(
            std::fs::read(&other).unwrap() == ref_bytes,
            "N={n}: the trace differs from the 1-node trace byte for byte"
        );
    }
    for &n in compare_at {
        let out = kit::dsmrun(n, &["--compare", &reference], program, args);
        assert_eq!(out.code, Some(0), "N={n}: {out:?}");
        assert!(!out.all_output().contains("differ"), "N={n}: {out:?}");
    }
}

#[test]
fn sor_traces_do_not_depend_on_the_node_count() {
    same_trace_at(sor(), &["--size", "64", "--iters", "4"], &[4], &[2, 4, 8]);
}

#[test]
fn fft_traces_do_not_depend_on_the_node_count() {
    same_trace_at(
        env!("CARGO_BIN_EXE_fft"),
        &["--dims", "16x16x8"],
        &[2],
        &[2, 4],
    );
}

#[test]
fn an_injected_sor_bug_is_reported_at_its_epoch_and_element() {
    let dir = tempfile::tempdir().unwrap();
    let reference = path(dir.path(), "ref.dsmtrace");
    let (n, iters) = (48usize, 5usize);
    let args = ["--size", "48", "--iters", "5"];
    let out = kit::dsmrun(
        1,
        &["--trace-values", &reference, "--trace-vars", "grid"],
        sor(),
        &args,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let mut rng = rand::thread_rng();
    for nodes in [2, 3, 4] {
        let epoch = rng.gen_range(2..=2 * iters as u32 + 1);
        let row = rng.gen_range(0..n);
        // An element of the colour the epoch updates: no node reads it during that epoch,
        // so the perturbation itself races with nothing and is the only difference.
        let colour = (epoch as usize - 2) % 2;
        let mut col = rng.gen_range(0..n);
        if (row + col) % 2 != colour {
            col = if col + 1 < n { col + 1 } else { col - 1 };
        }
        let bug = format!("{epoch},{row},{col}");
        let mut with_bug = args.to_vec();
        with_bug.extend(["--inject-bug", &bug]);
        let out = kit::dsmrun(nodes, &["--compare", &reference], sor(), &with_bug);
        let all = out.all_output();
        assert_eq!(out.code, Some(68), "bug {bug} at N={nodes}: {out:?}");
        assert!(
            all.contains(&format!(
                "values differ from the reference trace at barrier {epoch} (epoch {epoch})"
            )),
            "bug {bug} at N={nodes}: {out:?}"
        );
        assert!(
            all.contains(&format!("'grid' element ({row}, {col})")),
            "bug {bug} at N={nodes}: {out:?}"
        );
        assert!(
            all.contains("dsmrun: values differ"),
            "dsmrun says what happened: {out:?}"
        );
        assert!(!all.contains("more elements"), "one element: {out:?}");
        // The ranks leave together: none takes rank 0's exit for a crash.
        assert!(
            !all.contains("lost rank") && !all.contains("fatal"),
            "bug {bug} at N={nodes}: {out:?}"
        );
    }
    // --compare-continue lists every later trace point too and exits 68 at the end.
    let out = kit::dsmrun(
        2,
        &["--compare", &reference, "--compare-continue"],
        sor(),
        &["--size", "48", "--iters", "5", "--inject-bug", "9,10,11"],
    );
    assert_eq!(out.code, Some(68), "{out:?}");
    let points = out
        .all_output()
        .matches("values differ from the reference trace at")
        .count();
    // Barriers 9, 10, 11 and finish.
    assert_eq!(points, 4, "{out:?}");
    // Two saved traces, the second with the bug.
    let buggy = path(dir.path(), "bug.dsmtrace");
    let out = kit::dsmrun(
        3,
        &["--trace-values", &buggy, "--trace-values-full"],
        sor(),
        &["--size", "48", "--iters", "5", "--inject-bug", "4,30,8"],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let cmp = dsm_compare(&[&reference, &buggy]);
    assert_eq!(cmp.code, Some(68), "{cmp:?}");
    assert!(
        cmp.stdout.contains("at barrier 4") && cmp.stdout.contains("'grid' element (30, 8)"),
        "{cmp:?}"
    );
}

#[test]
fn a_hashes_only_reference_names_the_block_and_suggests_values() {
    let dir = tempfile::tempdir().unwrap();
    let reference = path(dir.path(), "ref.dsmtrace");
    let args = ["--size", "64", "--iters", "2"];
    let out = kit::dsmrun(1, &["--trace-values", &reference], sor(), &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = kit::dsmrun(
        2,
        &["--compare", &reference],
        sor(),
        &["--size", "64", "--iters", "2", "--inject-bug", "3,40,5"],
    );
    assert_eq!(out.code, Some(68), "{out:?}");
    // 64 f64 per row, 512 per 4 KiB block: block 5 holds rows 40 to 47.
    assert!(
        out.all_output()
            .contains("'grid' elements 2560..3072 ((40, 0) to (47, 63)) differ")
            && out.all_output().contains("--trace-values-full"),
        "{out:?}"
    );
}

#[test]
fn bad_trace_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let reference = path(dir.path(), "ref.dsmtrace");
    let args = ["--size", "32", "--iters", "2"];
    let out = kit::dsmrun(1, &["--trace-values", &reference], sor(), &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    let bytes = std::fs::read(&reference).unwrap();
    let truncated = path(dir.path(), "cut.dsmtrace");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let garbage = path(dir.path(), "garbage.dsmtrace");
    std::fs::write(&garbage, b"this is not a trace at all").unwrap();
    let mut corrupt = bytes.clone();
    for b in &mut corrupt[20..60] {
        *b = 0xa5;
    }
    let corrupt_path = path(dir.path(), "corrupt.dsmtrace");
    std::fs::write(&corrupt_path, &corrupt).unwrap();
    // Two bytes flipped in a trace that is mostly values: every record still decodes,
    // only the checksum tells.
    let full = path(dir.path(), "full.dsmtrace");
    let out = kit::dsmrun(
        1,
        &["--trace-values", &full, "--trace-values-full"],
        sor(),
        &args,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let mut flipped = std::fs::read(&full).unwrap();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x04;
    flipped[mid + 3] ^= 0x40;
    let flipped_path = path(dir.path(), "flipped.dsmtrace");
    std::fs::write(&flipped_path, &flipped).unwrap();
    for (file, says) in [
        (&truncated, "truncated"),
        (&garbage, "not a dsm value trace"),
        (&corrupt_path, "trace"),
        (&flipped_path, "checksum"),
    ] {
        let cmp = dsm_compare(&[&reference, file]);
        assert_eq!(cmp.code, Some(65), "{cmp:?}");
        assert!(cmp.stderr.contains(says), "{says}: {cmp:?}");
        assert!(!cmp.stderr.contains("panicked"), "{cmp:?}");
        // dsmrun reads the reference whole before any rank starts: one line, status 65.
        let out = kit::dsmrun(2, &["--compare", file], sor(), &args);
        assert_eq!(out.code, Some(65), "{out:?}");
        assert!(out.all_output().contains(says), "{says}: {out:?}");
        assert_eq!(out.all_output().trim().lines().count(), 1, "{out:?}");
        assert!(!out.all_output().contains("panicked"), "{out:?}");
    }
    // A reference of another program is refused at start, before the job forms.
    let out = kit::dsmrun(
        2,
        &["--compare", &reference],
        env!("CARGO_BIN_EXE_water"),
        &["--molecules", "8", "--steps", "1"],
    );
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains("traces program 'sor', not 'water'"),
        "{out:?}"
    );
    assert_eq!(out.all_output().trim().lines().count(), 1, "{out:?}");
    // A tolerance needs values: a hashes-only reference is refused at start.
    let out = kit::dsmrun(
        2,
        &["--compare", &reference, "--tolerance", "1e-9"],
        sor(),
        &args,
    );
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("has hashes only"), "{out:?}");
    let cmp = dsm_compare(&["--tolerance", "1e-9", &reference, &reference]);
    assert_eq!(cmp.code, Some(2), "{cmp:?}");
    // A reference that cannot be opened is a wrong path on the command line.
    let out = kit::dsmrun(1, &["--compare", "/nonexistent/ref.dsmtrace"], sor(), &args);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains("cannot open the reference trace"),
        "{out:?}"
    );
}

#[test]
fn water_within_a_tolerance_and_racy_water_differs_on_forces() {
    let water = env!("CARGO_BIN_EXE_water");
    let dir = tempfile::tempdir().unwrap();
    let reference = path(dir.path(), "water.dsmtrace");
    let args = ["--molecules", "27", "--steps", "2"];
    let out = kit::dsmrun(
        1,
        &["--trace-values", &reference, "--trace-values-full"],
        water,
        &args,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let tol = [
        "--compare",
        &reference,
        "--tolerance",
        "1e-12",
        "--rel-tolerance",
        "1e-9",
    ];
    // Forces are summed under locks in arrival order: equal within rounding only.
    let out = kit::dsmrun(2, &tol, water, &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    // The racy version loses force updates (a write-write race on 'forces'); a lost update
    // is likely but not certain in any one run.
    let mut racy = args.to_vec();
    racy.push("--racy");
    let mut seen = Vec::new();
    for _ in 0..5 {
        let out = kit::dsmrun(4, &tol, water, &racy);
        if out.code == Some(68) && out.all_output().contains("'forces' element") {
            return;
        }
        seen.push(out);
    }
    panic!("racy water never differed on 'forces': {seen:?}");
}

#[test]
fn dsmrun_documents_and_checks_the_trace_options() {
    let mut help = Command::new(kit::bin("dsmrun"));
    help.arg("--help");
    let out = kit::run(help);
    assert_eq!(out.code, Some(0), "{out:?}");
    for flag in [
        "--trace-values",
        "--trace-values-full",
        "--trace-vars",
        "--compare",
        "--compare-continue",
        "--tolerance",
        "--rel-tolerance",
        "DSM_COMPARE",
        "68",
    ] {
        assert!(out.stdout.contains(flag), "--help lacks {flag}: {out:?}");
    }
    // Recording and comparing exclude each other; the compare options need --compare.
    for args in [
        &["--trace-values", "a", "--compare", "b"][..],
        &["--tolerance", "1e-9"][..],
        &["--compare", "x", "--tolerance", "-1"][..],
    ] {
        let out = kit::dsmrun(1, args, sor(), &["--size", "8", "--iters", "1"]);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
    }
}

#[test]
fn dsm_compare_names_the_files_it_compares() {
    let dir = tempfile::tempdir().unwrap();
    let with_values = path(dir.path(), "values.dsmtrace");
    let hashes = path(dir.path(), "hashes.dsmtrace");
    let args = ["--size", "64", "--iters", "2"];
    let out = kit::dsmrun(
        1,
        &["--trace-values", &with_values, "--trace-values-full"],
        sor(),
        &args,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let mut buggy = args.to_vec();
    buggy.extend(["--inject-bug", "2,40,5"]);
    let out = kit::dsmrun(1, &["--trace-values", &hashes], sor(), &buggy);
    assert_eq!(out.code, Some(0), "{out:?}");
    // The reference has values, the other file hashes only: the message says which.
    let cmp = dsm_compare(&[&with_values, &hashes]);
    assert_eq!(cmp.code, Some(68), "{cmp:?}");
    assert!(
        cmp.stdout.contains(&format!("'{hashes}' has hashes only")),
        "{cmp:?}"
    );
    assert!(!cmp.stdout.contains("this run"), "{cmp:?}");
    assert!(!cmp.stdout.contains("the reference"), "{cmp:?}");
}

/// The README's value-trace examples, as written there (`README.md`, "comparing the two
/// executions"): every `dsmrun` line of that block runs and ends as its comment says.
#[test]
fn the_readmes_trace_examples_run_as_documented() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let block: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("dsmrun -n 1 --trace-values ref.dsmtrace sor"))
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| l.starts_with("dsmrun "))
        .collect();
    assert_eq!(
        block.len(),
        4,
        "the README's trace example block changed: {block:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    for line in block {
        let command = line.split('#').next().unwrap().trim();
        let words: Vec<&str> = command.split_whitespace().collect();
        let n: usize = words[2].parse().expect("dsmrun -n N");
        let app = words
            .iter()
            .position(|w| ["sor", "water"].contains(w))
            .unwrap();
        let flags: Vec<String> = words[3..app]
            .iter()
            .map(|w| {
                if w.ends_with(".dsmtrace") {
                    path(dir.path(), w)
                } else {
                    w.to_string()
                }
            })
            .collect();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let program = match words[app] {
            "sor" => sor(),
            _ => env!("CARGO_BIN_EXE_water"),
        };
        let out = kit::dsmrun(n, &flags, program, &words[app + 1..]);
        assert_eq!(out.code, Some(0), "{line}: {out:?}");
    }
}
