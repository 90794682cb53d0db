//! `dsmrun --race-suppressions FILE`: a suppression file silences TSP's accepted bound race
//! by variable, line, file or function (exit 0, the races counted apart, in the summary and
//! the stats file) and nothing else; a
//! malformed file stops dsmrun before any rank starts, naming the line.

const TSP: &str = env!("CARGO_BIN_EXE_tsp");
const KERNEL: &str = env!("CARGO_BIN_EXE_race-kernel");
const TSP_ARGS: [&str; 4] = ["--random", "14", "--seed", "3"];

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The number in `; N more silenced by --race-suppressions` of the summary line.
fn silenced(stderr: &str) -> u64 {
    let at = stderr
        .find(" more silenced by --race-suppressions")
        .unwrap_or_else(|| panic!("no silenced count:\n{stderr}"));
    stderr[..at].rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn the_tsp_bound_race_is_silenced_by_variable_line_file_or_function_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    // Without suppressions: the bound race, at a line of search.rs.
    let plain = dsm_testkit::dsmrun(4, &["--timeout", "60", "--race"], TSP, &TSP_ARGS);
    assert_eq!(plain.code, Some(66), "{}", plain.all_output());
    assert!(plain.stderr.contains("DATA RACE"), "{}", plain.all_output());
    let line = plain
        .stderr
        .lines()
        .find_map(|l| {
            let at = l.find("apps/src/tsp/search.rs:")?;
            l[at..].split(':').nth(1).map(str::to_string)
        })
        .expect("the report names a line of search.rs");
    for (i, entry) in [
        "race:variable=bound".to_string(),
        format!("race:line=tsp/search.rs:{line}"),
        "race:file=search.rs".to_string(),
        "race:function=*SharedBound as apps::tsp::search::Incumbent>::*".to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        let supp = write(&dir, "tsp.supp", &format!("# accepted\n{entry}\n"));
        let stats = dir.path().join(format!("stats-{i}"));
        std::fs::create_dir(&stats).unwrap();
        let mut cmd = dsm_testkit::dsmrun_command(
            4,
            &["--timeout", "60", "--race-suppressions", &supp],
            TSP,
            &TSP_ARGS,
        );
        cmd.env("DSM_TRANSPORT", "auto")
            .env("DSM_STATS_FILE", stats.join("rank-%r.json"));
        let run = dsm_testkit::run(cmd);
        let ctx = format!("{entry}\n{}", run.all_output());
        assert_eq!(run.code, Some(0), "{ctx}");
        assert!(!run.stderr.contains("DATA RACE"), "{ctx}");
        assert!(
            run.stderr.contains("dsm: 0 data races on 0 variables; "),
            "{ctx}"
        );
        let n = silenced(&run.stderr);
        assert!(n > 0, "{ctx}");
        assert!(run.all_output().contains("verified:"), "{ctx}");
        let counter = |key| dsm_testkit::rank_counter(&stats, 0, "race", key);
        assert_eq!(counter("races_silenced"), n, "{ctx}");
        assert_eq!(counter("races_reported"), 0, "{ctx}");
    }
    // Nothing else: the same file leaves a race on another variable reported.
    let supp = write(
        &dir,
        "tsp.supp",
        "race:variable=bound\nrace:file=tsp/search.rs\n",
    );
    let other = dsm_testkit::dsmrun(
        2,
        &["--timeout", "60", "--race-suppressions", &supp],
        KERNEL,
        &["run", "write-write"],
    );
    assert_eq!(other.code, Some(66), "{}", other.all_output());
    assert!(
        other.stderr.contains("DATA RACE (write-write) on cell"),
        "{}",
        other.all_output()
    );
    assert!(!other.stderr.contains("silenced"), "{}", other.all_output());
}

#[test]
fn a_malformed_suppression_file_stops_dsmrun_before_any_rank_starts() {
    let dir = tempfile::tempdir().unwrap();
    for (text, line, says) in [
        ("race:variable=bound\nrace:var=bound\n", 2, "unknown field"),
        ("# ok\nrace:line=search.rs\n", 2, "FILE:LINE"),
        ("races:variable=bound\n", 1, "unknown class"),
    ] {
        let supp = write(&dir, "bad.supp", text);
        let run = dsm_testkit::dsmrun(2, &["--race-suppressions", &supp], TSP, &TSP_ARGS);
        let ctx = run.all_output();
        assert_eq!(run.code, Some(2), "{ctx}");
        assert!(run.stderr.contains(&format!("line {line}: ")), "{ctx}");
        assert!(run.stderr.contains(says), "{ctx}");
        assert!(run.stderr.contains("bad.supp"), "{ctx}");
        assert!(!ctx.contains("[0]"), "a rank started: {ctx}");
    }
    let missing = dir.path().join("missing.supp");
    let run = dsm_testkit::dsmrun(
        2,
        &["--race-suppressions", missing.to_str().unwrap()],
        TSP,
        &TSP_ARGS,
    );
    assert_eq!(run.code, Some(2), "{}", run.all_output());
    assert!(
        run.stderr.contains("cannot read --race-suppressions"),
        "{}",
        run.all_output()
    );
}
