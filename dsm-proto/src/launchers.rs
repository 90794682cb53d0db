//! Jobs started by a cluster launcher without dsmrun: how a rank finds rank 0's rendezvous
//! address and the job secret from what `mpirun` (Open MPI 4) or `srun` (Slurm) already
//! put in its environment, so that no `DSM_*` variable has to be set by hand. Pure
//! functions of the variables; [`crate::config`] calls them when `DSM_COORD` or
//! `DSM_JOB_SECRET` is not set.
//!
//! * **Open MPI 4** (`mpirun`): every rank has `OMPI_MCA_orte_hnp_uri`, the contact URI of
//!   mpirun itself (`JOBID;tcp://IP[,IP...]:PORT;tcp6://...`), `OMPI_MCA_ess_base_jobid`
//!   (the job's id, the same in every rank, new for every mpirun) and
//!   `OMPI_MCA_orte_precondition_transports`, 128 bits mpirun reads from `/dev/urandom`
//!   for each job. Rank 0 listens on mpirun's host: at 127.0.0.1 when the job has one node
//!   and it is mpirun's own (`OMPI_MCA_orte_num_nodes=1` and this rank's daemon is mpirun:
//!   `OMPI_MCA_orte_local_daemon_uri` equals the HNP URI), else at the first IPv4 address
//!   of the HNP URI, so rank 0 must run on mpirun's host (the usual case: mpirun runs on
//!   the allocation's first node, and rank 0 is placed there first). The port is
//!   [`derived_port`] of the job id. The secret is the transports key with the job id: it
//!   is never sent by dsm (the handshake proves knowledge of it without sending it).
//! * **Slurm** (`srun`): rank 0 listens on the first host of the step's node list
//!   (`SLURM_STEP_NODELIST`, hostlist syntax expanded by [`slurm::expand_hostlist`]), at
//!   127.0.0.1 when the step has one node, at the port [`slurm::step_port`] of the job and
//!   step ids; Slurm places task 0 on the step's first node. Slurm gives the tasks nothing
//!   secret, so the secret is derived from the user's key file (`DSM_KEY_FILE`, default
//!   `~/.config/dsm/job-key`: 128 random bits, mode 0600, made on first use), mixed with
//!   the job and step ids: only the user (and root) can read it, and it never crosses the
//!   network; a job across nodes needs the same file on every node (a shared home
//!   directory, as Slurm clusters usually have).

use crate::config_error::ConfigError;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The rendezvous and secret a launcher's environment gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// Rank 0's rendezvous address.
    pub coord: SocketAddr,
    /// The job secret.
    pub secret: String,
}

/// Lowest port [`derived_port`] returns.
pub const DERIVED_PORT_BASE: u16 = 20_000;
/// How many ports [`derived_port`] spreads over: 20000..32000, below Linux's ephemeral
/// range (32768..60999), so an outgoing connection rarely holds the port already.
pub const DERIVED_PORT_SPAN: u16 = 12_000;

/// The rendezvous port of a job known by `id` (e.g. Slurm's `JOBID.STEPID`): a hash of the
/// id spread over [`DERIVED_PORT_BASE`]`..+`[`DERIVED_PORT_SPAN`], so that every rank
/// computes the same port and concurrent jobs most likely get different ones. If another
/// process holds it, rank 0 cannot listen and says so; `DSM_COORD` then overrides it.
pub fn derived_port(id: &str) -> u16 {
    // FNV-1a: stable across versions and platforms, unlike std's hasher.
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    DERIVED_PORT_BASE + (h % u64::from(DERIVED_PORT_SPAN)) as u16
}

fn invalid(var: &'static str, value: &str, why: &str) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        why: why.to_owned(),
    }
}

/// The first IPv4 address of the first `tcp://` entry of an Open MPI contact URI
/// (`JOBID;tcp://10.0.0.1,172.17.0.1:41235;tcp6://[fd00::2]:39509`).
pub fn hnp_address(uri: &str) -> Option<Ipv4Addr> {
    uri.split(';')
        .filter_map(|part| part.strip_prefix("tcp://"))
        .find_map(|addrs| {
            let (list, _port) = addrs.rsplit_once(':')?;
            list.split(',').find_map(|ip| ip.trim().parse().ok())
        })
}

/// Rendezvous and secret under Open MPI 4's `mpirun` (see the module documentation);
/// `None` when the environment is not Open MPI 4's (e.g. Open MPI 5, which exports no
/// mpirun address, or MPICH).
pub fn open_mpi(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Derived>, ConfigError> {
    const URI: &str = "OMPI_MCA_orte_hnp_uri";
    const JOBID: &str = "OMPI_MCA_ess_base_jobid";
    const KEY: &str = "OMPI_MCA_orte_precondition_transports";
    let Some(uri) = get(URI) else {
        return Ok(None);
    };
    let jobid = get(JOBID).ok_or(ConfigError::Missing(URI, JOBID))?;
    let key = get(KEY).ok_or(ConfigError::Missing(URI, KEY))?;
    if key.trim().len() < 16 {
        return Err(invalid(KEY, &key, "expected mpirun's random key"));
    }
    let on_mpirun_host_alone = get("OMPI_MCA_orte_num_nodes").as_deref() == Some("1")
        && get("OMPI_MCA_orte_local_daemon_uri").as_deref() == Some(uri.as_str());
    let ip = if on_mpirun_host_alone {
        Ipv4Addr::LOCALHOST
    } else {
        hnp_address(&uri).ok_or_else(|| invalid(URI, &uri, "no tcp:// address of mpirun in it"))?
    };
    Ok(Some(Derived {
        coord: SocketAddr::new(IpAddr::V4(ip), derived_port(&format!("ompi:{jobid}"))),
        secret: format!("ompi:{}:{jobid}", key.trim()),
    }))
}

/// Slurm: the node list syntax and the rendezvous of a step.
pub mod slurm {
    use super::*;

    /// Expands a Slurm hostlist (`node[01-03,7],login1,gpu[1-2]-ib`) into host names, in
    /// order. Ranges keep the width of their zero-padded lower bound (`[08-10]` gives
    /// `08 09 10`). Fails on unbalanced brackets, bad ranges or more than `limit` hosts.
    pub fn expand_hostlist(list: &str, limit: usize) -> Result<Vec<String>, String> {
        let mut hosts = Vec::new();
        for item in split_top_level(list)? {
            let mut expanded = vec![String::new()];
            let mut rest = item.as_str();
            while !rest.is_empty() {
                match rest.find('[') {
                    None => {
                        for h in &mut expanded {
                            h.push_str(rest);
                        }
                        rest = "";
                    }
                    Some(open) => {
                        let close = rest[open..]
                            .find(']')
                            .map(|c| c + open)
                            .ok_or_else(|| format!("unbalanced '[' in {item:?}"))?;
                        let prefix = &rest[..open];
                        let choices = expand_ranges(&rest[open + 1..close])
                            .map_err(|e| format!("{item:?}: {e}"))?;
                        if expanded.len().saturating_mul(choices.len()) > limit {
                            return Err(format!("{list:?} names more than {limit} hosts"));
                        }
                        expanded = expanded
                            .iter()
                            .flat_map(|h| choices.iter().map(move |c| format!("{h}{prefix}{c}")))
                            .collect();
                        rest = &rest[close + 1..];
                    }
                }
            }
            if expanded.iter().any(|h| h.is_empty() || h.contains(']')) {
                return Err(format!("bad host name in {item:?}"));
            }
            hosts.extend(expanded);
            if hosts.len() > limit {
                return Err(format!("{list:?} names more than {limit} hosts"));
            }
        }
        if hosts.is_empty() {
            return Err("empty host list".into());
        }
        Ok(hosts)
    }

    /// Splits at commas outside brackets.
    fn split_top_level(list: &str) -> Result<Vec<String>, String> {
        let mut items = Vec::new();
        let mut depth = 0u32;
        let mut cur = String::new();
        for c in list.trim().chars() {
            match c {
                '[' => {
                    if depth > 0 {
                        return Err(format!("nested '[' in {list:?}"));
                    }
                    depth = 1;
                }
                ']' => {
                    if depth == 0 {
                        return Err(format!("unbalanced ']' in {list:?}"));
                    }
                    depth = 0;
                }
                ',' if depth == 0 => {
                    if !cur.is_empty() {
                        items.push(std::mem::take(&mut cur));
                    }
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        if depth > 0 {
            return Err(format!("unbalanced '[' in {list:?}"));
        }
        if !cur.is_empty() {
            items.push(cur);
        }
        Ok(items)
    }

    /// `01-03,7` → `01 02 03 7`.
    fn expand_ranges(spec: &str) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for part in spec.split(',') {
            let part = part.trim();
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if !digits(lo) || !digits(hi) {
                return Err(format!("bad range {part:?}"));
            }
            let (a, b): (u64, u64) = (
                lo.parse().map_err(|_| format!("bad range {part:?}"))?,
                hi.parse().map_err(|_| format!("bad range {part:?}"))?,
            );
            if b < a || b - a > 100_000 {
                return Err(format!("bad range {part:?}"));
            }
            let width = lo.len();
            out.extend((a..=b).map(|n| format!("{n:0width$}")));
        }
        Ok(out)
    }

    /// Rendezvous and secret of a Slurm step (see the module documentation); `None` when
    /// the Slurm variables are incomplete. `user_key` is read only when `need_secret`.
    pub fn rendezvous(
        get: &impl Fn(&str) -> Option<String>,
        need_secret: bool,
        user_key: impl FnOnce() -> Result<String, String>,
    ) -> Result<Option<Derived>, ConfigError> {
        let first = |names: &[&'static str]| {
            names
                .iter()
                .find_map(|&n| get(n).filter(|v| !v.trim().is_empty()).map(|v| (n, v)))
        };
        let (Some((list_var, list)), Some((_, job)), Some((_, step))) = (
            first(&[
                "SLURM_STEP_NODELIST",
                "SLURM_JOB_NODELIST",
                "SLURM_NODELIST",
            ]),
            first(&["SLURM_JOB_ID", "SLURM_JOBID"]),
            first(&["SLURM_STEP_ID", "SLURM_STEPID"]),
        ) else {
            return Ok(None);
        };
        let port = step_port(job.trim(), step.trim());
        let one_node =
            first(&["SLURM_STEP_NUM_NODES", "SLURM_NNODES"]).is_some_and(|(_, n)| n.trim() == "1");
        let coord = if one_node {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
        } else {
            let hosts = expand_hostlist(&list, crate::MAX_NODES)
                .map_err(|why| invalid(list_var, &list, &why))?;
            let host = &hosts[0];
            let addrs: Vec<SocketAddr> =
                std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                    .map_err(|e| {
                        invalid(
                            list_var,
                            &list,
                            &format!("cannot resolve its first host {host}: {e}"),
                        )
                    })?
                    .collect();
            *addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or(addrs.first())
                .ok_or_else(|| {
                    invalid(list_var, &list, &format!("{host} resolves to no address"))
                })?
        };
        let secret = if need_secret {
            let key = user_key().map_err(|why| ConfigError::Invalid {
                var: crate::env_vars::KEY_FILE,
                value: String::new(),
                why,
            })?;
            format!("slurm:{}:{}.{}", key.trim(), job.trim(), step.trim())
        } else {
            String::new()
        };
        Ok(Some(Derived { coord, secret }))
    }

    /// The rendezvous port of Slurm step `job.step`.
    pub fn step_port(job: &str, step: &str) -> u16 {
        derived_port(&format!("slurm:{job}.{step}"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn hostlists_expand_like_slurm() {
            let x = |s: &str| expand_hostlist(s, 1000).unwrap();
            assert_eq!(x("node1"), ["node1"]);
            assert_eq!(x("a,b"), ["a", "b"]);
            assert_eq!(x("node[1-3]"), ["node1", "node2", "node3"]);
            assert_eq!(x("n[08-10,12]"), ["n08", "n09", "n10", "n12"]);
            assert_eq!(
                x("rack[1-2]-n[1-2],login"),
                ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2", "login"]
            );
            assert_eq!(x("gpu[3]-ib"), ["gpu3-ib"]);
            assert_eq!(x("vm"), ["vm"]);
            for bad in ["n[1-", "n]1", "n[3-1]", "n[a-b]", "", "n[[1]]", "n[1-2"] {
                assert!(expand_hostlist(bad, 1000).is_err(), "{bad:?}");
            }
            assert!(expand_hostlist("n[1-2000]", 1024).is_err());
        }

        #[test]
        fn a_step_names_its_first_node_and_keys_the_job() {
            let vars: std::collections::HashMap<&str, &str> = [
                ("SLURM_STEP_NODELIST", "localhost,other[1-2]"),
                ("SLURM_JOB_ID", "42"),
                ("SLURM_STEP_ID", "3"),
                ("SLURM_STEP_NUM_NODES", "3"),
            ]
            .into();
            let get = |k: &str| vars.get(k).map(|v| v.to_string());
            let d = rendezvous(&get, true, || Ok("k3y".into()))
                .unwrap()
                .unwrap();
            assert!(d.coord.ip().is_loopback(), "localhost resolves to loopback");
            assert_eq!(d.coord.port(), step_port("42", "3"));
            assert_eq!(d.secret, "slurm:k3y:42.3");
            let err = rendezvous(&get, true, || Err("no key file".into())).unwrap_err();
            assert!(err.to_string().contains("DSM_KEY_FILE"), "{err}");
            // With DSM_JOB_SECRET set, the key is not read at all.
            let d = rendezvous(&get, false, || panic!("read the key"))
                .unwrap()
                .unwrap();
            assert!(d.secret.is_empty());
            let none = |_: &str| None;
            assert_eq!(rendezvous(&none, true, || Ok("k".into())).unwrap(), None);
        }

        #[test]
        fn step_ports_are_stable_and_in_range() {
            let p = step_port("42", "0");
            assert_eq!(p, step_port("42", "0"));
            assert_ne!(p, step_port("42", "1"));
            assert!((DERIVED_PORT_BASE..DERIVED_PORT_BASE + DERIVED_PORT_SPAN).contains(&p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const URI: &str = "1983512576.0;tcp://192.0.2.2,172.17.0.1:43997;tcp6://[fd00::2]:39509";

    #[test]
    fn open_mpi_on_one_node_rendezvous_on_loopback() {
        let get = lookup(&[
            ("OMPI_MCA_orte_hnp_uri", URI),
            ("OMPI_MCA_orte_local_daemon_uri", URI),
            ("OMPI_MCA_orte_num_nodes", "1"),
            ("OMPI_MCA_ess_base_jobid", "1983512577"),
            (
                "OMPI_MCA_orte_precondition_transports",
                "9dd6c6bec1cf5dcf-c519b12ced3f9744",
            ),
        ]);
        let d = open_mpi(&get).unwrap().unwrap();
        assert_eq!(d.coord.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(d.coord.port(), derived_port("ompi:1983512577"));
        assert!(d.secret.contains("9dd6c6bec1cf5dcf-c519b12ced3f9744"));
    }

    #[test]
    fn open_mpi_across_nodes_rendezvous_at_mpiruns_host() {
        let get = lookup(&[
            ("OMPI_MCA_orte_hnp_uri", URI),
            (
                "OMPI_MCA_orte_local_daemon_uri",
                "1983512576.1;tcp://10.0.0.9:4000",
            ),
            ("OMPI_MCA_orte_num_nodes", "2"),
            ("OMPI_MCA_ess_base_jobid", "7"),
            (
                "OMPI_MCA_orte_precondition_transports",
                "0123456789abcdef-0",
            ),
        ]);
        let d = open_mpi(&get).unwrap().unwrap();
        assert_eq!(d.coord.ip(), "192.0.2.2".parse::<IpAddr>().unwrap());
        assert_eq!(open_mpi(&lookup(&[])).unwrap(), None);
        let no_key = lookup(&[
            ("OMPI_MCA_orte_hnp_uri", URI),
            ("OMPI_MCA_ess_base_jobid", "7"),
        ]);
        assert!(open_mpi(&no_key).is_err());
        assert_eq!(hnp_address("1.0;tcp6://[::1]:5"), None);
    }
}
