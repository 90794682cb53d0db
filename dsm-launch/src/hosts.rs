//! Which host each rank runs on: the host lists a user gives `dsmrun` (`--hostfile FILE` in
//! Open MPI's syntax, `-H host[:slots],...`) and the mapping of ranks onto their slots
//! (`--map-by slot|node`). Pure functions, no I/O beyond reading the file.

use std::fmt;
use std::path::Path;

/// One host and how many ranks it takes before it counts as full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSlots {
    /// The name as the user wrote it: given to the launch agent (`ssh NAME`) as is.
    pub name: String,
    /// Ranks the host takes.
    pub slots: usize,
}

/// A host list that cannot be used, with where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostsError {
    /// A hostfile line does not parse.
    #[error("{file} line {line}: {why}")]
    Hostfile {
        /// The file as named on the command line.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// The hostfile cannot be read.
    #[error("cannot read the hostfile {file}: {why}")]
    Unreadable {
        /// The file as named.
        file: String,
        /// The I/O error.
        why: String,
    },
    /// An `-H` entry does not parse.
    #[error("-H {entry:?}: {why}")]
    HostList {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        why: String,
    },
    /// The list names no host at all.
    #[error("{0} names no host")]
    Empty(String),
    /// More ranks than slots, without `--oversubscribe`.
    #[error("{ranks} ranks asked for, but the hosts offer only {slots} slots ({list}); give fewer ranks, more slots (slots=K in the hostfile, host:K with -H) or --oversubscribe")]
    NotEnoughSlots {
        /// Ranks asked for.
        ranks: usize,
        /// Slots offered.
        slots: usize,
        /// `a:2, b:1`, for the message.
        list: String,
    },
}

/// How ranks are laid onto the slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapBy {
    /// Fill each host's slots in order before using the next host (Open MPI's default):
    /// neighbouring ranks share a host.
    #[default]
    Slot,
    /// One rank per host in turn, skipping full hosts: neighbouring ranks are on
    /// different hosts.
    Node,
}

impl std::str::FromStr for MapBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "slot" => Ok(MapBy::Slot),
            "node" => Ok(MapBy::Node),
            other => Err(format!("'{other}' is not slot or node")),
        }
    }
}

impl fmt::Display for HostSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.slots)
    }
}

/// Adds `slots` to `name`'s entry, or appends it: a host named twice is one host with the
/// slots of both (as in Open MPI).
fn add_host(hosts: &mut Vec<HostSlots>, name: &str, slots: usize) {
    match hosts.iter_mut().find(|h| h.name == name) {
        Some(h) => h.slots += slots,
        None => hosts.push(HostSlots {
            name: name.to_owned(),
            slots,
        }),
    }
}

fn valid_host_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty host name".into());
    }
    // Passed to the launch agent as one argument; a leading '-' would read as an option.
    if name.starts_with('-') {
        return Err(format!("host name '{name}' starts with '-'"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._@:[]%".contains(c))
    {
        return Err(format!("'{name}' is not a host name"));
    }
    // A ':' belongs only in an IPv6 address (bare or in brackets, with an optional zone):
    // 'localhost:2' in a hostfile would go to the launch agent, which looks it up.
    if name.contains(':') {
        let inner = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        let address = inner.split('%').next().unwrap_or(inner);
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "'{name}' is not a host name: ':' belongs only in an IPv6 address (slots are \
                 HOST:K with -H, HOST slots=K in a hostfile)"
            ));
        }
    }
    Ok(())
}

fn parse_slots(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(k) if k > 0 => Ok(k),
        _ => Err(format!("slots must be a positive integer, got '{text}'")),
    }
}

/// Parses a hostfile in Open MPI's syntax: one host per line, optionally followed by
/// `slots=K` (default 1) and `max_slots=M` (or `max-slots=M`, accepted and checked to be at
/// least the slots; dsmrun never places more than `slots` ranks on a host unless told to
/// `--oversubscribe`). `#` starts a comment; blank lines are ignored; a host named on several
/// lines gets the sum of their slots. `file` names the file in errors.
pub fn parse_hostfile(text: &str, file: &str) -> Result<Vec<HostSlots>, HostsError> {
    let mut hosts = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let err = |why: String| HostsError::Hostfile {
            file: file.to_owned(),
            line: i + 1,
            why,
        };
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let name = words.next().expect("a non-empty line has a word");
        valid_host_name(name).map_err(err)?;
        let mut slots = None;
        let mut max_slots = None;
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| err(format!("expected KEY=VALUE after the host, got '{word}'")))?;
            let twice = || err(format!("{key} is given twice"));
            match key {
                "slots" if slots.is_some() => return Err(twice()),
                "slots" => slots = Some(parse_slots(value).map_err(err)?),
                "max_slots" | "max-slots" if max_slots.is_some() => return Err(twice()),
                "max_slots" | "max-slots" => max_slots = Some(parse_slots(value).map_err(err)?),
                _ => {
                    return Err(err(format!(
                        "unknown key '{key}' (dsmrun knows slots and max_slots)"
                    )))
                }
            }
        }
        let slots = slots.unwrap_or(1);
        if let Some(max) = max_slots.filter(|&m| m < slots) {
            return Err(err(format!("max_slots={max} is below slots={slots}")));
        }
        add_host(&mut hosts, name, slots);
    }
    if hosts.is_empty() {
        return Err(HostsError::Empty(format!("the hostfile {file}")));
    }
    Ok(hosts)
}

/// Reads and parses a hostfile ([`parse_hostfile`]).
pub fn read_hostfile(path: &Path) -> Result<Vec<HostSlots>, HostsError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| HostsError::Unreadable {
        file: file.clone(),
        why: e.to_string(),
    })?;
    parse_hostfile(&text, &file)
}

/// Parses `-H host[:slots],...` (slots default to 1; a host named twice adds up).
pub fn parse_host_list(spec: &str) -> Result<Vec<HostSlots>, HostsError> {
    let mut hosts = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let err = |why: String| HostsError::HostList {
            entry: entry.to_owned(),
            why,
        };
        // An IPv6 literal is written in brackets: [fe80::1]:2.
        let (name, slots) = match entry.rsplit_once(':') {
            Some((name, k)) if !k.contains(']') && (!name.contains(':') || name.ends_with(']')) => {
                (name, parse_slots(k).map_err(err)?)
            }
            _ => (entry, 1),
        };
        valid_host_name(name).map_err(err)?;
        add_host(&mut hosts, name, slots);
    }
    if hosts.is_empty() {
        return Err(HostsError::Empty(format!("-H {spec:?}")));
    }
    Ok(hosts)
}

/// Total slots of `hosts`.
pub fn total_slots(hosts: &[HostSlots]) -> usize {
    hosts.iter().map(|h| h.slots).sum()
}

/// The host (an index into `hosts`) of each of `ranks` ranks. Ranks beyond the slots are an
/// error unless `oversubscribe`, in which case they go round-robin over the hosts.
pub fn map_ranks(
    hosts: &[HostSlots],
    ranks: usize,
    by: MapBy,
    oversubscribe: bool,
) -> Result<Vec<usize>, HostsError> {
    let slots = total_slots(hosts);
    if ranks > slots && !oversubscribe {
        return Err(HostsError::NotEnoughSlots {
            ranks,
            slots,
            list: hosts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let mut placed = Vec::with_capacity(ranks);
    match by {
        MapBy::Slot => {
            for (h, host) in hosts.iter().enumerate() {
                placed.extend(std::iter::repeat_n(h, host.slots));
            }
        }
        MapBy::Node => {
            let mut used = vec![0; hosts.len()];
            while placed.len() < slots {
                for (h, host) in hosts.iter().enumerate() {
                    if used[h] < host.slots {
                        used[h] += 1;
                        placed.push(h);
                    }
                }
            }
        }
    }
    placed.truncate(ranks);
    let mut next = 0;
    while placed.len() < ranks {
        placed.push(next % hosts.len());
        next += 1;
    }
    Ok(placed)
}

/// Whether `name` is this machine itself (`localhost`, a loopback address, or this host's
/// name): its ranks start without the launch agent.
pub fn is_local_host(name: &str, this_host: Option<&str>) -> bool {
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    name == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
        || this_host.is_some_and(|h| h == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(list: &[(&str, usize)]) -> Vec<HostSlots> {
        list.iter()
            .map(|&(name, slots)| HostSlots {
                name: name.into(),
                slots,
            })
            .collect()
    }

    #[test]
    fn hostfiles_in_open_mpi_syntax() {
        let text = "# the cluster\n\
                    node1 slots=2\n\
                    \n\
                    node2   # one slot\n\
                    10.0.0.3 slots=4 max_slots=8\n\
                    node1 slots=1   # adds up\n";
        assert_eq!(
            parse_hostfile(text, "h").unwrap(),
            hs(&[("node1", 3), ("node2", 1), ("10.0.0.3", 4)])
        );
    }

    #[test]
    fn bad_hostfiles_name_the_line() {
        for (text, line, needle) in [
            ("a\nb slots=0\n", 2, "positive"),
            ("a slots=x\n", 1, "positive"),
            ("a cpus=2\n", 1, "unknown key 'cpus'"),
            ("a slots=4 max_slots=2\n", 1, "below"),
            ("a 2\n", 1, "KEY=VALUE"),
            ("-oProxyCommand=x\n", 1, "starts with '-'"),
            ("a;rm\n", 1, "not a host name"),
            // Open MPI's -H syntax in a hostfile would reach the launch agent as a name.
            ("localhost:2\n", 1, "belongs only in an IPv6 address"),
            ("a slots=2 slots=3\n", 1, "slots is given twice"),
        ] {
            let err = parse_hostfile(text, "hosts").unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("hosts line {line}:")) && msg.contains(needle),
                "{text:?}: {msg}"
            );
        }
        assert!(parse_hostfile("# nothing\n\n", "h")
            .unwrap_err()
            .to_string()
            .contains("names no host"));
    }

    #[test]
    fn host_lists_on_the_command_line() {
        assert_eq!(
            parse_host_list("a:2,b,a,[::1]:3,10.1.1.1:2").unwrap(),
            hs(&[("a", 3), ("b", 1), ("[::1]", 3), ("10.1.1.1", 2)])
        );
        assert!(parse_host_list("a:0").is_err());
        assert!(parse_host_list("localhost::2")
            .unwrap_err()
            .to_string()
            .contains("belongs only in an IPv6 address"));
        assert_eq!(
            parse_host_list("fe80::1%eth0,[::1]").unwrap(),
            hs(&[("fe80::1%eth0", 1), ("[::1]", 1)])
        );
        assert!(parse_hostfile("::1 slots=2\n[fe80::2]\n", "h").is_ok());
        assert!(parse_host_list("a:x").is_err());
        assert!(parse_host_list(",").is_err());
    }

    #[test]
    fn ranks_fill_slots_or_go_round_robin() {
        let hosts = hs(&[("a", 2), ("b", 2), ("c", 1)]);
        assert_eq!(
            map_ranks(&hosts, 5, MapBy::Slot, false).unwrap(),
            [0, 0, 1, 1, 2]
        );
        assert_eq!(
            map_ranks(&hosts, 5, MapBy::Node, false).unwrap(),
            [0, 1, 2, 0, 1]
        );
        assert_eq!(map_ranks(&hosts, 3, MapBy::Slot, false).unwrap(), [0, 0, 1]);
        assert_eq!(map_ranks(&hosts, 3, MapBy::Node, false).unwrap(), [0, 1, 2]);
        let err = map_ranks(&hosts, 6, MapBy::Slot, false).unwrap_err();
        assert!(
            err.to_string().contains("only 5 slots (a:2, b:2, c:1)"),
            "{err}"
        );
        assert_eq!(
            map_ranks(&hosts, 8, MapBy::Slot, true).unwrap(),
            [0, 0, 1, 1, 2, 0, 1, 2]
        );
    }

    #[test]
    fn local_hosts_are_recognised() {
        assert!(is_local_host("localhost", None));
        assert!(is_local_host("127.0.0.1", None));
        assert!(is_local_host("[::1]", None));
        assert!(is_local_host("me", Some("me")));
        assert!(!is_local_host("10.0.0.1", Some("me")));
    }
}
