//! End-to-end tests of the `water` app under `dsmrun`: verified runs at 1, 2, 4 and 8
//! nodes on small systems, the same per-step energies at 4 nodes as at 1, a clear error
//! for a molecule count that is not a cube, and the race detector's verdicts on the
//! correct program (no races) and on `--racy` (write-write races on `forces`).

use dsm_testkit as common;

use dsm_testkit::Run;
use std::process::Command;

fn dsmrun(nodes: usize, race: bool, args: &[&str]) -> Run {
    let flags: &[&str] = if race {
        &["--timeout", "120", "--race"]
    } else {
        &["--timeout", "120"]
    };
    common::dsmrun(nodes, flags, env!("CARGO_BIN_EXE_water"), args)
}

fn assert_verified(r: &Run, molecules: usize, steps: usize, nodes: usize) {
    assert_eq!(r.code, Some(0), "{r:?}");
    let want = format!(
        "[0] verified: water {molecules} molecules, {steps} steps, {}: energies match sequential",
        apps::nodes(nodes)
    );
    assert!(r.stdout.lines().any(|l| l.starts_with(&want)), "{r:?}");
}

/// (kinetic, potential, total) in kJ/mol of every printed step.
fn energies(r: &Run) -> Vec<(f64, f64, f64)> {
    let field = |line: &str, name: &str| -> f64 {
        let at = line.find(&format!("{name} ")).unwrap() + name.len() + 1;
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    r.stdout
        .lines()
        .filter(|l| l.starts_with("[0] step "))
        .map(|l| {
            (
                field(l, "kinetic"),
                field(l, "potential"),
                field(l, "total"),
            )
        })
        .collect()
}

#[test]
fn verified_at_every_node_count() {
    for (nodes, molecules, steps) in [(1, 27, 3), (2, 27, 3), (4, 8, 2), (8, 27, 2)] {
        let r = dsmrun(
            nodes,
            false,
            &[
                "--molecules",
                &molecules.to_string(),
                "--steps",
                &steps.to_string(),
            ],
        );
        assert_verified(&r, molecules, steps, nodes);
        assert_eq!(energies(&r).len(), steps + 1, "{r:?}");
    }
}

#[test]
fn energies_at_four_nodes_equal_those_at_one() {
    let args = ["--molecules", "27", "--steps", "3"];
    let one = dsmrun(1, false, &args);
    let four = dsmrun(4, false, &args);
    assert_verified(&one, 27, 3, 1);
    assert_verified(&four, 27, 3, 4);
    let (a, b) = (energies(&one), energies(&four));
    assert_eq!(a.len(), 4);
    assert_eq!(a.len(), b.len());
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        // Relative to the step's energy scale, plus the printing precision (1e-9 kJ/mol).
        let tol = 1e-9 * (x.0.abs() + x.1.abs()) + 2e-9;
        for (u, v) in [(x.0, y.0), (x.1, y.1), (x.2, y.2)] {
            assert!((u - v).abs() <= tol, "step {step}: {x:?} vs {y:?}");
        }
    }
    // Something happened: the kinetic energy changed over the run.
    assert_ne!(a[0].0, a[3].0);
}

#[test]
fn per_block_locks_verify_too() {
    let r = dsmrun(
        4,
        true,
        &["--molecules", "27", "--steps", "2", "--locks", "block"],
    );
    assert_verified(&r, 27, 2, 4);
    assert!(r.stderr.contains("dsm: 0 data races"), "{r:?}");
}

#[test]
fn non_cube_molecule_count_is_a_clear_error() {
    let r = dsmrun(2, false, &["--molecules", "100"]);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(r.stderr.contains("perfect cube"), "{r:?}");
    assert!(r.stderr.contains("64 or 125"), "{r:?}");
    assert!(!r.stdout.contains("verified:"), "{r:?}");
}

#[test]
fn correct_program_has_no_races() {
    let r = dsmrun(4, true, &["--molecules", "27", "--steps", "2"]);
    assert_verified(&r, 27, 2, 4);
    assert!(r.stderr.contains("dsm: 0 data races"), "{r:?}");
    assert!(!r.stderr.contains("DATA RACE"), "{r:?}");
}

#[test]
fn racy_force_sums_are_reported_as_write_write_races_on_forces() {
    let r = dsmrun(4, true, &["--racy", "--molecules", "27", "--steps", "2"]);
    assert_eq!(r.code, Some(66), "{r:?}");
    assert!(
        r.stderr.contains("DATA RACE (write-write) on forces"),
        "{r:?}"
    );
    // Only the seeded bug: every reported race is on forces.
    for line in r.stderr.lines().filter(|l| l.contains("DATA RACE")) {
        assert!(line.contains(" on forces["), "{line}\n{r:?}");
    }
    assert!(r.stderr.contains("on 1 variable"), "{r:?}");
    assert!(r.stdout.contains("verification skipped"), "{r:?}");
}

#[test]
fn help_describes_the_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_water"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--molecules",
        "--steps",
        "--racy",
        "--locks",
        "perfect cube",
    ] {
        assert!(text.contains(opt), "{opt}: {text}");
    }
}
