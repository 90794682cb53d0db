//! `dsmrun --hostfile` over real ssh: three "hosts", each a network namespace joined by a
//! veth pair to a bridge in the root namespace (no default route anywhere), each running
//! its own sshd (Debian's openssh-server, installed here if missing; host and user keys
//! made by the test). dsmrun, in the root namespace, starts SOR, TSP under `--race` and
//! race kernels across them and the results are verified; a rank killed in one namespace
//! is named with its host, an unreachable host is named within the connect timeout, and
//! after every job, including one whose dsmrun was killed with SIGKILL, no process of the
//! job is left in any namespace. Also: `--interface`, and the segment base agreement when
//! the default base is taken on one host. A second test does the same with two hosts for
//! the C apps built with `dsmcc`: C SOR and C Water verified and race-free, C Water's
//! seeded race found between ranks on different hosts. Needs root; without it (or without
//! sshd, or gcc for the C apps) a test says so and checks nothing else. Everything a test
//! started is removed, even on failure.

use apps::kernels::{self, Expect};
use dsm_testkit::{self as kit, Run};
use dsm_testkit::{capi, ip};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The namespaces, their sshds and keys; all removed on drop.
struct Cluster {
    hosts: usize,
    tag: String,
    subnet: String,
    dir: tempfile::TempDir,
    sshds: Vec<Child>,
}

impl Cluster {
    /// `hosts` namespaces, each with its sshd.
    fn new(hosts: usize) -> Result<Cluster, String> {
        // Tests of this file run in parallel in one process: each gets its own names and
        // subnet.
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = std::process::id();
        let tag = format!("dh{}{made}", id % 100_000);
        let subnet = format!("10.{}.{}", 79 + made, id % 250);
        let mut c = Cluster {
            hosts,
            tag,
            subnet,
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
            sshds: Vec::new(),
        };
        c.network()?;
        c.keys()?;
        for k in 0..hosts {
            c.start_sshd(k)?;
        }
        Ok(c)
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }

    fn ns(&self, k: usize) -> String {
        format!("{}-{k}", self.tag)
    }

    fn addr(&self, k: usize) -> String {
        format!("{}.{}", self.subnet, k + 1)
    }

    fn network(&self) -> Result<(), String> {
        let br = self.bridge();
        let ok = ip(&["link", "add", &br, "type", "bridge"])
            && ip(&[
                "addr",
                "add",
                &format!("{}.254/24", self.subnet),
                "dev",
                &br,
            ])
            && ip(&["link", "set", &br, "up"]);
        if !ok {
            return Err("cannot create a bridge (iproute2 missing?)".into());
        }
        for k in 0..self.hosts {
            let ns = self.ns(k);
            let (inside, outside) = (format!("{}i{k}", self.tag), format!("{}o{k}", self.tag));
            let ok = ip(&["netns", "add", &ns])
                && ip(&[
                    "link", "add", &outside, "type", "veth", "peer", "name", &inside,
                ])
                && ip(&["link", "set", &inside, "netns", &ns])
                && ip(&["link", "set", &outside, "master", &br])
                && ip(&["link", "set", &outside, "up"])
                && ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/24", self.addr(k)),
                    "dev",
                    &inside,
                ])
                && ip(&["-n", &ns, "link", "set", &inside, "up"])
                && ip(&["-n", &ns, "link", "set", "lo", "up"]);
            if !ok {
                return Err(format!("cannot set up namespace {ns}"));
            }
        }
        Ok(())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn keys(&self) -> Result<(), String> {
        for key in ["id", "host"] {
            let ok = quiet(Command::new("ssh-keygen").args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-f",
                self.path(key).to_str().unwrap(),
            ]));
            if !ok {
                return Err("ssh-keygen failed".into());
            }
        }
        std::fs::copy(self.path("id.pub"), self.path("authorized_keys"))
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn start_sshd(&mut self, k: usize) -> Result<(), String> {
        // sshd insists on its privilege-separation directory.
        std::fs::create_dir_all("/run/sshd").map_err(|e| e.to_string())?;
        let config = self.path(&format!("sshd-{k}.conf"));
        std::fs::write(
            &config,
            format!(
                "ListenAddress {addr}\nPort 22\nHostKey {host}\nAuthorizedKeysFile {auth}\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\n\
                 PidFile {pid}\n",
                addr = self.addr(k),
                host = self.path("host").display(),
                auth = self.path("authorized_keys").display(),
                pid = self.path(&format!("sshd-{k}.pid")).display(),
            ),
        )
        .map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(k),
                "/usr/sbin/sshd",
                "-D",
                "-e",
                "-f",
            ])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start sshd: {e}"))?;
        self.sshds.push(child);
        let addr: SocketAddr = format!("{}:22", self.addr(k)).parse().unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if Instant::now() > until {
                return Err(format!("sshd in {} never listened on {addr}", self.ns(k)));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The launch agent: ssh with the test's key, no host-key checks, no config files.
    fn agent(&self) -> String {
        format!(
            "ssh -F /dev/null -i {} -o BatchMode=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5",
            self.path("id").display()
        )
    }

    fn hostfile(&self, slots: &[usize]) -> PathBuf {
        let mut text = String::from("# made by the hosts_ssh test\n");
        for (k, s) in slots.iter().enumerate() {
            text.push_str(&format!("{} slots={s}\n", self.addr(k)));
        }
        let path = self.path("hosts");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `dsmrun --hostfile HOSTFILE --launch-agent AGENT [flags] PROGRAM ARGS`, PROGRAM a
    /// workspace binary's name or a path.
    fn dsmrun(&self, hostfile: &Path, flags: &[&str], program: &str, args: &[&str]) -> Command {
        let mut cmd = kit::command("dsmrun");
        cmd.arg("--hostfile")
            .arg(hostfile)
            .arg("--launch-agent")
            .arg(self.agent())
            .args(flags)
            .arg(kit::program_path(program))
            .args(args);
        cmd
    }

    /// Processes in namespace `k` other than its sshd listener (zombies count as gone).
    fn leftovers(&self, k: usize) -> Vec<String> {
        let sshd = self.sshds.get(k).map(|c| c.id() as i32);
        let out = Command::new("ip")
            .args(["netns", "pids", &self.ns(k)])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        out.split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .filter(|&pid| !kit::is_gone(pid))
            .filter(|&pid| {
                // The listener is `ip netns exec` turned sshd: same pid.
                Some(pid) != sshd
            })
            .map(|pid| {
                let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " ");
                format!("{pid} {cmd}")
            })
            .collect()
    }

    /// Waits (bounded) until no namespace holds a process of a job; panics naming them.
    fn assert_clean(&self, what: &str) {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let left: Vec<String> = (0..self.hosts).flat_map(|k| self.leftovers(k)).collect();
            let ssh_clients = ssh_clients_of(self.path("id").to_str().unwrap());
            if left.is_empty() && ssh_clients.is_empty() {
                return;
            }
            if Instant::now() > until {
                panic!("{what}: processes left behind: {left:?}, ssh clients {ssh_clients:?}");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Live ssh client processes using the key at `key` (dsmrun's launch agents).
fn ssh_clients_of(key: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with("ssh\0") && c.contains(key))
        })
        .filter(|&pid| !kit::is_gone(pid))
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for k in 0..self.hosts {
            // Everything in the namespaces is the test's.
            let out = Command::new("ip")
                .args(["netns", "pids", &self.ns(k)])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        for sshd in &mut self.sshds {
            let _ = sshd.kill();
            let _ = sshd.wait();
        }
        for k in 0..self.hosts {
            ip(&["netns", "del", &self.ns(k)]);
        }
        ip(&["link", "del", &self.bridge()]);
    }
}

/// The JSON objects of a `--race-log` file, one per line (none when the job wrote none).
fn race_log(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn check_kernel(c: &Cluster, hostfile: &Path, name: &str, n: usize, expect: &Expect) {
    let log = c.path(&format!("races-{name}.jsonl"));
    let r = kit::run(c.dsmrun(
        hostfile,
        &[
            "-n",
            &n.to_string(),
            "--timeout",
            "90",
            "--race",
            "--race-log",
            log.to_str().unwrap(),
        ],
        "race-kernel",
        &["run", name],
    ));
    let ctx = format!("kernel {name} at N={n} across hosts: {r:?}");
    assert!(r.stdout.contains(&format!("kernel {name} done")), "{ctx}");
    let mut found: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for v in race_log(&log) {
        assert_eq!(v["class"], "data-race", "{ctx}");
        found
            .entry(v["variable"].as_str().unwrap().to_string())
            .or_default()
            .insert(v["index"].as_u64().unwrap() as usize);
    }
    match expect {
        Expect::NoRace => {
            assert_eq!(r.code, Some(0), "{ctx}");
            assert!(found.is_empty(), "false positives {found:?}\n{ctx}");
        }
        Expect::Races(want) => {
            assert_eq!(r.code, Some(66), "{ctx}");
            let want_vars: BTreeSet<&str> = want.iter().map(|w| w.0).collect();
            let got: BTreeSet<&str> = found.keys().map(String::as_str).collect();
            assert_eq!(got, want_vars, "{ctx}");
            for (var, indices) in want {
                if let Some(indices) = indices {
                    assert_eq!(&found[*var], indices, "indices of {var}\n{ctx}");
                }
            }
        }
    }
}

fn tsp_length(r: &Run) -> i64 {
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("verified: tsp "))
        .unwrap_or_else(|| panic!("no verified line: {r:?}"));
    assert!(line.contains("(Held-Karp agrees)"), "{line}");
    let rest = &line[line.find("optimal length ").expect("length") + "optimal length ".len()..];
    rest.split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no length in {line}"))
}

/// The pid of a live process named `comm` in namespace `ns`, waiting for it (bounded).
fn wait_for_process(c: &Cluster, k: usize, comm: &str) -> i32 {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("ip")
            .args(["netns", "pids", &c.ns(k)])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let found = out
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
            });
        if let Some(pid) = found {
            return pid;
        }
        assert!(
            Instant::now() < until,
            "no {comm} in {} after 30 s",
            c.ns(k)
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A cluster of `hosts` namespaces for `test`, or `None` after a visible skip saying why
/// there cannot be one (not root, no sshd, no namespaces).
fn cluster_or_skip(test: &str, hosts: usize) -> Option<Cluster> {
    if !is_root() {
        kit::skip(test, "needs root to create network namespaces and run sshd");
        return None;
    }
    if let Err(why) = kit::ensure_installed(
        &["/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/ssh-keygen"],
        &["openssh-server", "openssh-client"],
    ) {
        kit::skip(test, &format!("cannot install openssh-server: {why}"));
        return None;
    }
    Cluster::new(hosts)
        .inspect_err(|why| kit::skip(test, &format!("cannot set up the namespace hosts: {why}")))
        .ok()
}

#[test]
fn dsmrun_hostfile_over_ssh_across_namespaces() {
    let Some(c) = cluster_or_skip("dsmrun_hostfile_over_ssh_across_namespaces", 3) else {
        return;
    };

    // SOR on 4 ranks: two on the first host, one on each of the others.
    let hostfile = c.hostfile(&[2, 1, 1]);
    let r = kit::run(c.dsmrun(
        &hostfile,
        &["--timeout", "90"],
        "sor",
        &["--size", "256", "--iters", "10"],
    ));
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("[0] verified: sor 256x256"), "{r:?}");
    assert!(r.stdout.contains("4 nodes"), "{r:?}");
    c.assert_clean("after SOR");

    // dsm-bench between hosts: every measurement of its 2-rank job, rank 0 and rank 1 on
    // different hosts (--map-by node), its own round-trip socket included (it used to bind
    // to loopback, and the job hung).
    let mut cmd = kit::command("dsm-bench");
    cmd.args(["--reps", "50", "--barrier-nodes", "2", "--", "--hostfile"])
        .arg(&hostfile)
        .arg("--launch-agent")
        .arg(c.agent())
        .args(["--map-by", "node"]);
    let r = kit::run(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    let figures: serde_json::Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"));
    for key in [
        "rtt_us",
        "remote_fault_us",
        "write_fault_us",
        "lock_acquire_us",
        "sem_handoff_us",
    ] {
        let median = figures[key]["median"]
            .as_f64()
            .or_else(|| figures[key]["mean"].as_f64());
        assert!(median.is_some_and(|m| m > 0.0), "{key}: {figures}");
    }
    assert!(
        figures["barrier_us"]["2"]["median"].as_f64().is_some(),
        "{figures}"
    );
    c.assert_clean("after dsm-bench");

    // TSP under --race, one rank per host (--map-by node), with a forwarded variable.
    let r = kit::run(c.dsmrun(
        &hostfile,
        &["-n", "3", "--map-by", "node", "--timeout", "90", "--race"],
        "tsp",
        &["--random", "11", "--seed", "3"],
    ));
    assert_eq!(r.code, Some(66), "{r:?}");
    assert!(
        r.stderr.contains("DATA RACE (read-write) on bound"),
        "{r:?}"
    );
    for line in r.stderr.lines().filter(|l| l.contains("DATA RACE")) {
        assert!(line.contains(" on bound["), "{line}\n{r:?}");
    }
    assert_eq!(
        tsp_length(&r),
        apps::tsp::heldkarp::held_karp(&apps::tsp::input::random(11, 3, false))
    );
    c.assert_clean("after TSP");

    // Race kernels with known answers: a racy one with exact indices, a lock-ordered
    // race-free one, and a false-sharing one.
    let all = kernels::all();
    for name in ["missing-barrier", "third-node-lock", "false-sharing"] {
        let k = all.iter().find(|k| k.name == name).expect("kernel exists");
        check_kernel(&c, &hostfile, name, 3, &(k.expect)(3));
    }
    c.assert_clean("after the race kernels");

    // -x reaches ranks on other hosts; the environment of a remote rank has its place.
    let script = c.path("env.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"rank=$DSM_RANK local=$DSM_LOCAL_RANK/$DSM_LOCAL_SIZE x=$DSM_TEST_X \
         secret_len=${#DSM_JOB_SECRET}\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = kit::command("dsmrun");
    cmd.args(["--hostfile", hostfile.to_str().unwrap(), "--launch-agent"])
        .arg(c.agent())
        .args(["-x", "DSM_TEST_X=hello world"])
        .arg(&script);
    let r = kit::run(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    for want in [
        "[0] rank=0 local=0/2 x=hello world secret_len=32",
        "[1] rank=1 local=1/2 x=hello world secret_len=32",
        "[2] rank=2 local=0/1 x=hello world secret_len=32",
        "[3] rank=3 local=0/1 x=hello world secret_len=32",
    ] {
        assert!(r.stdout.contains(want), "{want}\n{r:?}");
    }
    c.assert_clean("after the environment check");

    // Rank 0 listens on the interface named by --interface (its host's veth), and the
    // segment base taken on one host moves the whole job to one free on every host.
    let iface = format!("{}i0", c.tag);
    let mut cmd = c.dsmrun(
        &hostfile,
        &[
            "-n",
            "3",
            "--map-by",
            "node",
            "--interface",
            &iface,
            "-x",
            "DSM_TEST_OCCUPY_BASE=2",
            "-x",
            "DSM_LOG=warn",
        ],
        "sor",
        &["--size", "128", "--iters", "4"],
    );
    cmd.env_remove("DSM_SEGMENT_ADDR");
    let r = kit::run(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("[0] verified: sor 128x128"), "{r:?}");
    assert!(
        r.stderr.contains("rank 2 (host ") && r.stderr.contains("at 0x2d0000000000 instead"),
        "{r:?}"
    );
    // A base the user chose is not moved: the job stops naming the rank and the way out.
    let r = kit::run(c.dsmrun(
        &hostfile,
        &[
            "-n",
            "3",
            "--map-by",
            "node",
            "--segment-base",
            "0x3d0000000000",
            "-x",
            "DSM_TEST_OCCUPY_BASE=1",
        ],
        "sor",
        &["--size", "128", "--iters", "4"],
    ));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr.contains("rank 1 (host ")
            && r.stderr.contains("0x3d0000000000")
            && r.stderr.contains("--segment-base"),
        "{r:?}"
    );
    c.assert_clean("after the segment base runs");

    // Kill the rank in the third namespace mid-run: dsmrun names it and its host.
    let long = ["--size", "1024", "--iters", "100000"];
    let running = kit::start(c.dsmrun(
        &hostfile,
        &["-n", "3", "--map-by", "node", "--timeout", "90"],
        "sor",
        &long,
    ));
    let victim = wait_for_process(&c, 2, "sor");
    thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let r = running.finish();
    assert_eq!(r.code, Some(137), "{r:?}");
    let named = format!(
        "rank 2 (host {}) was killed by signal 9 (SIGKILL)",
        c.addr(2)
    );
    assert!(r.stderr.contains(&named), "{named}\n{r:?}");
    c.assert_clean("after a rank was killed");

    // kill -9 of dsmrun itself: the ssh sessions close and the agents stop their ranks.
    let mut running = kit::start(c.dsmrun(
        &hostfile,
        &["-n", "3", "--map-by", "node", "--timeout", "90"],
        "sor",
        &long,
    ));
    for k in 0..c.hosts {
        wait_for_process(&c, k, "sor");
    }
    running.child().kill().unwrap();
    let _ = running.finish();
    c.assert_clean("after dsmrun was killed with SIGKILL");

    // A host nobody answers at is named, within the connect timeout.
    let dead = c.path("dead-hosts");
    std::fs::write(&dead, format!("{}\n{}.77 slots=1\n", c.addr(0), c.subnet)).unwrap();
    let r = kit::run(c.dsmrun(
        &dead,
        &["--connect-timeout", "10"],
        "sor",
        &["--size", "64", "--iters", "2"],
    ));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr
            .contains(&format!("rank 1: cannot start it on host {}.77", c.subnet))
            || r.stderr
                .contains(&format!("rank 1: host {}.77 did not start it", c.subnet)),
        "{r:?}"
    );
    assert!(r.elapsed < Duration::from_secs(25), "{r:?}");
    c.assert_clean("after the unreachable host");
}

/// C SOR and C Water (`dsm-capi/c-apps`), compiled by gcc through `dsmcc` (ThreadSanitizer
/// instrumentation, linked against libdsm), across two namespace hosts: one rank on each
/// (`--map-by node`), then two on each. Under `--race` both verify against rank 0's
/// sequential run and report no race. C Water `--racy` (the force sums added without their
/// locks) on two ranks per host exits with the race status, every race it reports is on
/// `forces` with both sides at the line of water.c that adds into it, and some of them are
/// between ranks on different hosts.
#[test]
fn c_apps_across_namespaces() {
    const TEST: &str = "c_apps_across_namespaces";
    if !capi::have("gcc", TEST) {
        return;
    }
    let Some(c) = cluster_or_skip(TEST, 2) else {
        return;
    };
    let sor = capi::build_app("sor", c.dir.path());
    let water = capi::build_app("water", c.dir.path());
    let (sor, water) = (sor.to_str().unwrap(), water.to_str().unwrap());
    // Ranks 0 and 1 on the first host, 2 and 3 on the second (by slot), unless by node.
    let hostfile = c.hostfile(&[2, 2]);
    for (n, placement) in [(2, &["--map-by", "node"][..]), (4, &[])] {
        let n_arg = n.to_string();
        let mut flags = vec!["-n", &n_arg, "--timeout", "90", "--race"];
        flags.extend(placement);
        let r = kit::run(c.dsmrun(&hostfile, &flags, sor, &["67", "5"]));
        let ctx = format!("c sor at N={n} {placement:?} across hosts: {r:?}");
        assert_eq!(r.code, Some(0), "{ctx}");
        assert!(
            r.stdout.contains("[0] verified: c sor 67x67, 5 iterations"),
            "{ctx}"
        );
        assert!(r.stderr.contains("dsm: 0 data races"), "{ctx}");
        let r = kit::run(c.dsmrun(
            &hostfile,
            &flags,
            water,
            &["--molecules", "27", "--steps", "2"],
        ));
        let ctx = format!("c water at N={n} {placement:?} across hosts: {r:?}");
        assert_eq!(r.code, Some(0), "{ctx}");
        assert!(
            r.stdout.contains(&format!(
                "[0] verified: c water 27 molecules, 2 steps, {n} ranks"
            )),
            "{ctx}"
        );
        assert!(r.stderr.contains("dsm: 0 data races"), "{ctx}");
    }
    c.assert_clean("after the race-free C apps");

    let add_line = capi::water_force_add_line();
    let log = c.path("races-c-water.jsonl");
    let r = kit::run(c.dsmrun(
        &hostfile,
        &[
            "-n",
            "4",
            "--timeout",
            "90",
            "--race",
            "--race-log",
            log.to_str().unwrap(),
        ],
        water,
        &["--molecules", "27", "--steps", "2", "--racy"],
    ));
    let ctx = format!("c water --racy at N=4 across hosts: {r:?}");
    assert_eq!(r.code, Some(66), "the race exit status, {ctx}");
    let races = race_log(&log);
    assert!(!races.is_empty(), "no race logged, {ctx}");
    let host = |side: &serde_json::Value| side["rank"].as_u64().expect("a rank") / 2;
    let mut across = 0;
    for race in &races {
        assert_eq!(race["variable"], "forces", "{race}\n{ctx}");
        assert_eq!(race["kind"], "write-write", "{race}\n{ctx}");
        for side in [&race["first"], &race["second"]] {
            let at = side["locations"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            assert!(
                !at.is_empty()
                    && at.iter().all(|l| {
                        l["file"]
                            .as_str()
                            .is_some_and(|f| f.ends_with("c-apps/water.c"))
                            && l["line"] == add_line
                    }),
                "a side of {race} is not at water.c:{add_line}\n{ctx}"
            );
        }
        if host(&race["first"]) != host(&race["second"]) {
            across += 1;
        }
    }
    assert!(
        across > 0,
        "no race between ranks on different hosts in {races:?}\n{ctx}"
    );
    c.assert_clean("after C Water --racy");
}
