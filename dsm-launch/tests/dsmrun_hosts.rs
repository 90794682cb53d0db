//! `dsmrun` with a host list, without needing root or sshd: the launch agent is a small
//! script that runs the command on this machine (as `ssh HOST COMMAND` would on HOST), so
//! every rank goes through `dsmrun-agent` and its stdin protocol exactly as across hosts.
//! Checks placement, `-x`, output tagging, signal forwarding, a failing or hanging launch
//! agent named with its host, and the command-line errors. The same paths over real ssh
//! and network namespaces are apps/tests/hosts_ssh.rs.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

const WATCHDOG: Duration = Duration::from_secs(60);

fn script(dir: &TempDir, name: &str, body: &str) -> PathBuf {
    let path = dir.path().join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A launch agent that runs `COMMAND` here, recording which host it was asked for.
fn fake_agent(dir: &TempDir) -> PathBuf {
    let log = dir.path().join("agent.log");
    script(
        dir,
        "fake-ssh",
        &format!("echo \"$1\" >> {}\nshift\nexec sh -c \"$*\"", log.display()),
    )
}

fn dsmrun(args: &[&str], program: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsmrun"));
    cmd.args(args).arg(program).stdin(Stdio::null());
    cmd
}

/// `dsmrun -H HOSTS --launch-agent AGENT --bind-address 127.0.0.1 [extra] PROGRAM`: a
/// job on pretend hosts, reached through a stand-in agent on this machine.
fn dsmrun_on_hosts(hosts: &str, agent: &Path, extra: &[&str], program: &Path) -> Command {
    let agent = agent.to_str().expect("temporary paths are UTF-8");
    let mut args = vec![
        "-H",
        hosts,
        "--launch-agent",
        agent,
        "--bind-address",
        "127.0.0.1",
    ];
    args.extend_from_slice(extra);
    dsmrun(&args, program)
}

fn run(cmd: Command) -> dsm_testkit::Run {
    dsm_testkit::start_with_watchdog(cmd, WATCHDOG).finish()
}

#[test]
fn ranks_start_through_the_agent_with_their_place_and_variables() {
    let dir = tempfile::tempdir().unwrap();
    let agent = fake_agent(&dir);
    let prog = script(
        &dir,
        "env.sh",
        "echo \"rank=$DSM_RANK/$DSM_SIZE local=$DSM_LOCAL_RANK/$DSM_LOCAL_SIZE x=$X y=$Y \
         coord=${DSM_COORD%:*} secret=${#DSM_JOB_SECRET}\"; echo oops >&2",
    );
    let mut cmd = dsmrun_on_hosts(
        "alpha:2,beta",
        &agent,
        &["--map-by", "node", "-x", "X=a b", "-x", "Y"],
        &prog,
    );
    cmd.env("Y", "from-dsmrun");
    let r = run(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    // -n defaults to the slots (3); by node: alpha, beta, alpha.
    for want in [
        "[0] rank=0/3 local=0/2 x=a b y=from-dsmrun coord=127.0.0.1 secret=32",
        "[1] rank=1/3 local=0/1 x=a b y=from-dsmrun coord=127.0.0.1 secret=32",
        "[2] rank=2/3 local=1/2 x=a b y=from-dsmrun coord=127.0.0.1 secret=32",
    ] {
        assert!(r.stdout.contains(want), "{want}\n{r:?}");
    }
    assert_eq!(r.stderr.matches("] oops").count(), 3, "{r:?}");
    let mut asked: Vec<String> = fs::read_to_string(dir.path().join("agent.log"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    asked.sort();
    assert_eq!(asked, ["alpha", "alpha", "beta"]);
    // The agent protocol's ready line never reaches the output.
    assert!(!r.stdout.contains("dsmrun-agent"), "{r:?}");
}

#[test]
fn ranks_on_other_hosts_start_in_dsmruns_directory() {
    // As ssh does, the launch agent starts the command in another directory (here /).
    // The ranks still start where dsmrun runs, so a relative program path and a relative
    // input file mean what they mean there.
    let dir = tempfile::tempdir().unwrap();
    let agent = script(&dir, "cd-ssh", "shift\ncd / && exec sh -c \"$*\"");
    fs::write(dir.path().join("input.txt"), "from the input file\n").unwrap();
    script(&dir, "prog.sh", "echo \"pwd=$(pwd)\"; cat input.txt");
    let mut cmd = dsmrun_on_hosts("alpha,beta", &agent, &[], Path::new("./prog.sh"));
    cmd.current_dir(dir.path());
    let r = run(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    let here = dir.path().canonicalize().unwrap();
    for rank in 0..2 {
        assert!(
            r.stdout
                .contains(&format!("[{rank}] pwd={}", here.display())),
            "{r:?}"
        );
        assert!(
            r.stdout.contains(&format!("[{rank}] from the input file")),
            "{r:?}"
        );
    }
}

#[test]
fn the_secret_is_not_on_any_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let agent = fake_agent(&dir);
    // Each rank prints every command line on the machine that mentions dsmrun-agent.
    let prog = script(
        &dir,
        "ps.sh",
        "echo \"secret=$DSM_JOB_SECRET\"\nfor f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | grep -a dsmrun-agent | sed 's/^/cmdline: /'",
    );
    let r = run(dsmrun_on_hosts("a,b", &agent, &[], &prog));
    assert_eq!(r.code, Some(0), "{r:?}");
    let secret = r
        .stdout
        .lines()
        .find_map(|l| l.split("secret=").nth(1))
        .expect("a secret line")
        .trim()
        .to_owned();
    assert_eq!(secret.len(), 32, "{r:?}");
    assert!(r.stdout.contains("cmdline: "), "{r:?}");
    for line in r.stdout.lines().filter(|l| l.contains("cmdline: ")) {
        assert!(!line.contains(&secret), "secret on a command line: {line}");
    }
}

#[test]
fn sigint_reaches_ranks_through_their_agents() {
    let dir = tempfile::tempdir().unwrap();
    let agent = fake_agent(&dir);
    let pids = dir.path().join("pids");
    let prog = script(
        &dir,
        "wait.sh",
        &format!(
            "trap 'echo got INT; exit 5' INT\necho $$ >> {}\nwhile :; do sleep 0.05; done",
            pids.display()
        ),
    );
    let running =
        dsm_testkit::start_with_watchdog(dsmrun_on_hosts("a,b", &agent, &[], &prog), WATCHDOG);
    let until = Instant::now() + Duration::from_secs(20);
    while fs::read_to_string(&pids).map_or(0, |p| p.lines().count()) < 2 {
        assert!(Instant::now() < until, "ranks never started");
        thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(running.pid() as i32), Signal::SIGINT).unwrap();
    let r = running.finish();
    assert_eq!(r.code, Some(130), "{r:?}");
    assert_eq!(r.stdout.matches("got INT").count(), 2, "{r:?}");
    for pid in fs::read_to_string(&pids).unwrap().lines() {
        assert!(dsm_testkit::is_gone(pid.trim().parse().unwrap()), "{r:?}");
    }
}

/// The losing order for a rank that ends at once, forced: the launch agent (as ssh may)
/// exits before dsmrun has read its agent's start report, which a process it leaves
/// behind passes on 1.5 s later. dsmrun judges the exit only once the agent's output has
/// ended, so the rank counts as started and its success as a success.
#[test]
fn an_agent_that_exits_before_its_start_report_is_read_still_started_its_rank() {
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow-ssh");
    fs::write(
        &slow,
        "#!/bin/bash\nshift\nexec > >(sleep 1.5; exec cat)\nsh -c \"$*\"\n",
    )
    .unwrap();
    fs::set_permissions(&slow, fs::Permissions::from_mode(0o755)).unwrap();
    let prog = script(&dir, "quick.sh", "echo done here");
    let r = run(dsmrun_on_hosts("alpha", &slow, &[], &prog));
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("[0] done here"), "{r:?}");
    assert!(!r.stderr.contains("before the rank started"), "{r:?}");
}

#[test]
fn a_host_the_agent_cannot_reach_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(&dir, "ok.sh", "sleep 30");
    // Fails for host "down" as ssh does for an unreachable host.
    let failing = script(
        &dir,
        "failing-ssh",
        "if [ \"$1\" = down ]; then echo \"ssh: connect to host down port 22: No route to host\" >&2; exit 255; fi\nshift\nexec sh -c \"$*\"",
    );
    let started = Instant::now();
    let r = run(dsmrun_on_hosts("up,down", &failing, &[], &prog));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("[1] ssh: connect to host down"), "{r:?}");
    assert!(
        r.stderr.contains("rank 1: cannot start it on host down: '")
            && r.stderr
                .contains("exited with status 255 before the rank started"),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15), "{r:?}");

    // An agent that never answers: named when the connect timeout expires.
    let hanging = script(
        &dir,
        "hanging-ssh",
        "if [ \"$1\" = blackhole ]; then exec sleep 60; fi\nshift\nexec sh -c \"$*\"",
    );
    let started = Instant::now();
    let r = run(dsmrun_on_hosts(
        "up,blackhole",
        &hanging,
        &["--connect-timeout", "2"],
        &prog,
    ));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr
            .contains("rank 1: host blackhole did not start it within the connect timeout (2 s)"),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(12), "{r:?}");
}

#[test]
fn host_list_mistakes_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(&dir, "ok.sh", "true");
    let hostfile = dir.path().join("hosts");
    fs::write(&hostfile, "# two hosts\na slots=2\nb slots=two\n").unwrap();
    let r = run(dsmrun(&["--hostfile", hostfile.to_str().unwrap()], &prog));
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr
            .contains("line 3: slots must be a positive integer"),
        "{r:?}"
    );

    let r = run(dsmrun(&["-n", "4", "-H", "a:2,b"], &prog));
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr
            .contains("4 ranks asked for, but the hosts offer only 3 slots"),
        "{r:?}"
    );

    let r = run(dsmrun(&["--launch-agent", "rsh"], &prog));
    assert_eq!(r.code, Some(2), "{r:?}");

    // A command-line error like any other (exit 2), found before anything starts.
    let r = run(dsmrun(&["-x", "DSM_NO_SUCH_VARIABLE_HERE"], &prog));
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr.contains("not set in dsmrun's environment"),
        "{r:?}"
    );

    // Neither reaches a launch agent (which would look the name up): a ':' outside an
    // IPv6 address, an agent that is no command, an interface this host lacks.
    fs::write(&hostfile, "localhost:2\n").unwrap();
    let hostfile = hostfile.to_str().unwrap();
    for (args, why) in [
        (
            &["--hostfile", hostfile][..],
            "belongs only in an IPv6 address",
        ),
        (
            &["-n", "2", "-H", "localhost::2"][..],
            "belongs only in an IPv6 address",
        ),
        (&["-H", "a,b", "--launch-agent", ""][..], "is not a command"),
        (
            &["-n", "2", "--interface", "nosuch0"][..],
            "has no IP address on this host",
        ),
    ] {
        let r = run(dsmrun(args, &prog));
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.stderr.contains(why), "{args:?}: {r:?}");
    }

    // Every host this machine: no agent involved, the ranks start as usual.
    let r = run(dsmrun(&["-H", "localhost:2,127.0.0.1"], &prog));
    assert_eq!(r.code, Some(0), "{r:?}");
}

#[test]
fn the_agent_answers_help_and_usage_mistakes_without_waiting_for_a_job() {
    let agent = env!("CARGO_BIN_EXE_dsmrun-agent");
    let help = Command::new(agent)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&help.stdout);
    assert_eq!(help.status.code(), Some(0), "{help:?}");
    assert!(out.contains("not meant to be run by hand"), "{out}");
    assert!(out.contains("Usage: dsmrun-agent"), "{out}");
    for args in [&[][..], &["--bogus"][..]] {
        let r = Command::new(agent)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("Usage: dsmrun-agent"), "{args:?}: {err}");
        assert!(!err.contains("connection"), "{args:?}: {err}");
    }
}
