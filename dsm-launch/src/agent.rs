//! Ranks on other hosts: the small program `dsmrun-agent` that the launch agent (`ssh HOST`)
//! starts on each host, one per rank, and the line protocol dsmrun speaks with it over the
//! agent's standard input and output.
//!
//! dsmrun writes the rank's job configuration to the agent's stdin (so the job secret is
//! never on a command line, where `ps` on either host would show it), then `start`. The
//! agent starts the rank in its own process group with the configuration as its `DSM_*`
//! environment and a lifeline pipe (`DSM_LAUNCHER_FD`), answers with one `ready` line on
//! stdout, and from then on the rank's stdout and stderr are the agent's own (the ssh
//! session's), so dsmrun tags and forwards them as for a local rank. Further stdin lines
//! are `signal N`, which the agent sends to the rank's process group. End-of-file on stdin
//! means dsmrun (or the connection to it) is gone: the agent stops the rank, SIGTERM then
//! SIGKILL, so nothing is left running on the host. The agent exits with the rank's status,
//! or 128 + the signal that killed it.
//!
//! Rank 0's agent also binds the rendezvous socket on its host (where, is the `bind` line:
//! an address, an interface, or the address the ssh connection came in on) and hands it
//! to the rank (`DSM_COORD_FD`); its `ready` line tells dsmrun the address, which dsmrun
//! then gives the other ranks.

use std::ffi::OsString;
use std::io::{self, BufRead, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{pipe2, Pid};

use dsm_proto::env_vars;

/// The first line dsmrun writes: the protocol and its version.
pub const HELLO: &str = "dsmrun-agent 1";
/// The agent's first stdout line starts with this; dsmrun takes it out of the rank's
/// output. The leading control character keeps it from matching anything a program prints
/// by chance.
pub const READY: &str = "\u{1}dsmrun-agent ready";
/// How long the rank gets after SIGTERM, when dsmrun is gone, before SIGKILL.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);

/// Where rank 0's agent binds the rendezvous socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindTo {
    /// This address (port 0: any free port).
    Addr(SocketAddr),
    /// The first IPv4 address of this network interface on the rank's host.
    Interface(String),
    /// The address the launch connection came in on (`SSH_CONNECTION`), else what this
    /// host name resolves to on the host.
    Auto(String),
}

impl BindTo {
    fn to_line(&self) -> String {
        match self {
            BindTo::Addr(a) => format!("bind addr {a}"),
            BindTo::Interface(i) => format!("bind interface {i}"),
            BindTo::Auto(h) => format!("bind auto {h}"),
        }
    }

    fn parse(rest: &str) -> Result<BindTo, String> {
        let (kind, value) = rest.split_once(' ').unwrap_or((rest, ""));
        match kind {
            "addr" => value
                .parse()
                .map(BindTo::Addr)
                .map_err(|e| format!("bind addr {value:?}: {e}")),
            "interface" => Ok(BindTo::Interface(value.to_owned())),
            "auto" => Ok(BindTo::Auto(value.to_owned())),
            _ => Err(format!("unknown bind kind {kind:?}")),
        }
    }

    /// The address to bind on this host.
    fn resolve(&self) -> Result<SocketAddr, String> {
        match self {
            BindTo::Addr(a) => Ok(*a),
            BindTo::Interface(name) => interface_addr(name).map(|ip| SocketAddr::new(ip, 0)),
            BindTo::Auto(host) => {
                // "client_ip client_port server_ip server_port": server_ip is this host's
                // address that dsmrun's host reached, so it reaches this host.
                if let Some(ip) = std::env::var("SSH_CONNECTION")
                    .ok()
                    .and_then(|c| c.split_whitespace().nth(2).and_then(|s| s.parse().ok()))
                {
                    return Ok(SocketAddr::new(ip, 0));
                }
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                (bare, 0)
                    .to_socket_addrs()
                    .map_err(|e| format!("cannot resolve {host}: {e}"))?
                    .next()
                    .ok_or_else(|| format!("{host} resolves to no address"))
            }
        }
    }
}

/// The first IPv4 (else IPv6) address of interface `name` on this host.
pub fn interface_addr(name: &str) -> Result<IpAddr, String> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
    let mut found: Vec<IpAddr> = addrs
        .filter(|a| a.interface_name == name)
        .filter_map(|a| {
            let addr = a.address?;
            addr.as_sockaddr_in()
                .map(|s| IpAddr::V4(s.ip()))
                .or_else(|| addr.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
        })
        .collect();
    found.sort_by_key(|ip| ip.is_ipv6());
    found
        .into_iter()
        .next()
        .ok_or_else(|| format!("interface '{name}' has no IP address on this host"))
}

/// What dsmrun tells one agent before `start`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentOrder {
    /// Environment variables for the rank (its `DSM_*` configuration and `-x` variables).
    pub env: Vec<(String, String)>,
    /// Rank 0 only: where to bind the rendezvous socket.
    pub bind: Option<BindTo>,
    /// dsmrun's working directory: the rank starts there if this host has it (a shared
    /// or mirrored file system), as `mpirun` does, so relative program and input paths
    /// mean what they mean where dsmrun runs; otherwise where the launch agent left it.
    pub cwd: Option<String>,
}

/// `\` and newline escaped, so that every value fits on one line.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl AgentOrder {
    /// The order as dsmrun writes it, `start` included.
    pub fn to_text(&self) -> String {
        let mut text = format!("{HELLO}\n");
        for (k, v) in &self.env {
            text.push_str(&format!("env {k}={}\n", escape(v)));
        }
        if let Some(bind) = &self.bind {
            text.push_str(&bind.to_line());
            text.push('\n');
        }
        if let Some(cwd) = &self.cwd {
            text.push_str(&format!("cwd {}\n", escape(cwd)));
        }
        text.push_str("start\n");
        text
    }

    /// Reads an order up to and including `start`.
    pub fn read(input: &mut impl BufRead) -> Result<AgentOrder, String> {
        let mut line = String::new();
        let mut order = AgentOrder::default();
        let mut first = true;
        loop {
            line.clear();
            match input.read_line(&mut line) {
                Ok(0) => return Err("dsmrun closed the connection before 'start'".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("reading from dsmrun: {e}")),
            }
            let l = line.trim_end_matches('\n');
            if first {
                if l != HELLO {
                    return Err(format!(
                        "expected {HELLO:?} from dsmrun, got {l:?}: dsmrun and dsmrun-agent \
                         of different versions?"
                    ));
                }
                first = false;
                continue;
            }
            if l == "start" {
                return Ok(order);
            }
            if let Some(kv) = l.strip_prefix("env ") {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("bad env line {l:?}"))?;
                order.env.push((k.to_owned(), unescape(v)));
            } else if let Some(rest) = l.strip_prefix("bind ") {
                order.bind = Some(BindTo::parse(rest)?);
            } else if let Some(dir) = l.strip_prefix("cwd ") {
                order.cwd = Some(unescape(dir));
            } else {
                return Err(format!("unexpected line from dsmrun: {l:?}"));
            }
        }
    }
}

/// The agent's `ready` line, written before the rank starts so that it comes before
/// anything the rank prints: for rank 0, with the rendezvous address.
pub fn ready_line(coord: Option<SocketAddr>) -> String {
    match coord {
        Some(c) => format!("{READY} coord={c}\n"),
        None => format!("{READY}\n"),
    }
}

/// Parses a `ready` line (without its newline): the rendezvous address it carries, if any.
/// `None` if the line is not a ready line.
pub fn parse_ready(line: &str) -> Option<Option<SocketAddr>> {
    let rest = line.strip_prefix(READY)?;
    Some(
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix("coord="))
            .and_then(|c| c.parse().ok()),
    )
}

/// The exit status of the agent, and so of the launch agent (`ssh` passes it on), for a
/// rank that ended with `status`.
fn agent_exit_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        _ => 1,
    }
}

fn signal_rank(pgid: Pid, signal: Signal, reaped: &AtomicBool) {
    // Once the rank is reaped its pid (the group id) may be reused: never signal it then.
    if !reaped.load(Ordering::Acquire) {
        let _ = killpg(pgid, signal);
    }
}

/// Says why the agent cannot go on, naming its host; the agent's exit status for that.
fn fail(msg: String) -> i32 {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    eprintln!("dsmrun-agent on {host}: {msg}");
    1
}

/// Runs the agent: reads the order from stdin, starts `program args` as the rank and
/// supervises it as described in the module documentation. Returns the exit status.
pub fn agent_main(program: OsString, args: Vec<OsString>) -> i32 {
    // Stdin's buffer is shared by all its handles: what follows `start` stays for the
    // watcher thread below.
    let order = match AgentOrder::read(&mut io::stdin().lock()) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let mut command = Command::new(&program);
    command.args(&args);
    let here = order.cwd.as_deref().filter(|d| Path::new(d).is_dir());
    if let Some(dir) = here {
        command.current_dir(dir);
    }
    for var in env_vars::LAUNCHER_OWNED {
        command.env_remove(var);
    }
    for (k, v) in &order.env {
        command.env(k, v);
    }
    let mut coord = None;
    let mut listener = None;
    if let Some(bind) = &order.bind {
        let (l, bound) = match rendezvous_listener(bind) {
            Ok(bound) => bound,
            Err(msg) => return fail(msg),
        };
        command.env(env_vars::COORD, bound.to_string());
        command.env(env_vars::COORD_FD, l.as_raw_fd().to_string());
        coord = Some(bound);
        listener = Some(l);
    }
    // The lifeline: if this agent dies (even by SIGKILL), the rank reads end-of-file and
    // stops on its own.
    let lifeline = pipe2(OFlag::O_CLOEXEC).and_then(|(r, w)| {
        fcntl(r.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
        Ok((r, w))
    });
    let (lifeline_read, _lifeline_write) = match lifeline {
        Ok(p) => p,
        Err(e) => return fail(format!("cannot make the lifeline pipe: {e}")),
    };
    command
        .env(env_vars::LAUNCHER_FD, lifeline_read.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .process_group(0);
    {
        let mut out = io::stdout().lock();
        let _ = out.write_all(ready_line(coord).as_bytes());
        let _ = out.flush();
    }
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => return spawn_failed(&e, &program, order.cwd.as_deref(), here),
    };
    drop(lifeline_read);
    drop(listener);
    let pgid = Pid::from_raw(child.id() as i32);
    let reaped = Arc::new(AtomicBool::new(false));
    watch_dsmrun(pgid, Arc::clone(&reaped));
    let status = child.wait();
    // Whatever the rank left in its group is part of the finished job.
    let _ = killpg(pgid, Signal::SIGKILL);
    reaped.store(true, Ordering::Release);
    match status {
        Ok(status) => agent_exit_code(status),
        Err(e) => fail(format!("waiting for the rank: {e}")),
    }
}

/// Rank 0's rendezvous socket, bound where `bind` says and left open across exec for the
/// rank, with its address.
fn rendezvous_listener(bind: &BindTo) -> Result<(TcpListener, SocketAddr), String> {
    let addr = bind
        .resolve()
        .map_err(|e| format!("cannot choose the rendezvous address: {e}"))?;
    let l = TcpListener::bind(addr)
        .map_err(|e| format!("cannot listen on {addr} for the rendezvous: {e}"))?;
    let bound = l
        .local_addr()
        .map_err(|e| format!("rendezvous socket: {e}"))?;
    fcntl(l.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))
        .map_err(|e| format!("rendezvous socket: {e}"))?;
    Ok((l, bound))
}

/// Says why the rank could not be started; the agent's exit status for that, as a shell's.
fn spawn_failed(e: &io::Error, program: &OsString, cwd: Option<&str>, here: Option<&str>) -> i32 {
    let code = match e.kind() {
        io::ErrorKind::NotFound => 127,
        io::ErrorKind::PermissionDenied => 126,
        _ => 1,
    };
    let relative = Path::new(program).is_relative() && program.as_bytes().contains(&b'/');
    let hint = match (cwd, here) {
        (Some(dir), None) if relative => {
            format!(" (dsmrun's directory {dir} does not exist on this host)")
        }
        _ => String::new(),
    };
    fail(format!(
        "cannot start {}: {e}{hint}",
        program.to_string_lossy()
    ));
    code
}

/// Carries out dsmrun's commands until end-of-file, which means dsmrun is gone: then stops
/// the rank, SIGTERM and, after the grace, SIGKILL.
fn watch_dsmrun(pgid: Pid, reaped: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new()
        .name("dsmrun-agent-stdin".into())
        .stack_size(64 << 10)
        .spawn(move || {
            let mut line = String::new();
            let input = io::stdin();
            loop {
                line.clear();
                match input.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let signal = line
                    .trim()
                    .strip_prefix("signal ")
                    .and_then(|n| n.parse::<i32>().ok())
                    .and_then(|n| Signal::try_from(n).ok());
                if let Some(signal) = signal {
                    signal_rank(pgid, signal, &reaped);
                }
            }
            signal_rank(pgid, Signal::SIGTERM, &reaped);
            let until = Instant::now() + ORPHAN_GRACE;
            while Instant::now() < until && !reaped.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
            }
            signal_rank(pgid, Signal::SIGKILL, &reaped);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_read_back_equal() {
        let order = AgentOrder {
            env: vec![
                ("DSM_RANK".into(), "3".into()),
                ("ODD".into(), "a=b\\c\nd".into()),
            ],
            bind: Some(BindTo::Auto("node1".into())),
            cwd: Some("/home/me/odd\ndir".into()),
        };
        let text = order.to_text();
        assert_eq!(text.lines().count(), 6, "{text}");
        let back = AgentOrder::read(&mut io::Cursor::new(text.into_bytes())).unwrap();
        assert_eq!(back, order);
        for bind in [
            BindTo::Addr("10.0.0.1:0".parse().unwrap()),
            BindTo::Interface("eth0".into()),
        ] {
            let order = AgentOrder {
                env: vec![],
                bind: Some(bind),
                cwd: None,
            };
            let back =
                AgentOrder::read(&mut io::Cursor::new(order.to_text().into_bytes())).unwrap();
            assert_eq!(back, order);
        }
    }

    #[test]
    fn bad_orders_are_refused() {
        for text in [
            "",
            "hello\nstart\n",
            "dsmrun-agent 1\nenv X\nstart\n",
            "dsmrun-agent 1\nfrobnicate\nstart\n",
            "dsmrun-agent 1\nenv A=1\n",
            "dsmrun-agent 1\nbind sideways x\nstart\n",
        ] {
            assert!(
                AgentOrder::read(&mut io::Cursor::new(text.as_bytes())).is_err(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn ready_lines_carry_the_rendezvous() {
        let c: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let line = ready_line(Some(c));
        assert_eq!(parse_ready(line.trim_end()), Some(Some(c)));
        assert_eq!(parse_ready(ready_line(None).trim_end()), Some(None));
        assert_eq!(parse_ready("dsmrun-agent ready"), None);
    }

    #[test]
    fn loopback_interface_has_an_address() {
        assert!(interface_addr("lo").unwrap().is_loopback());
        assert!(interface_addr("no-such-if0")
            .unwrap_err()
            .contains("no-such-if0"));
    }
}
