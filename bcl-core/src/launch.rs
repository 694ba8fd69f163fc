//! Where a rank learns its place from the launcher that started it: torchrun, OpenMPI's
//! mpirun, MPICH's Hydra, Slurm's srun, or BCL's own variables. No cluster manager of ours.
//!
//! Rank and world size come from the first set of `BCL_RANK`/`BCL_WORLD_SIZE`, torchrun's
//! `RANK`/`WORLD_SIZE`, OpenMPI's `OMPI_COMM_WORLD_RANK/SIZE`, Hydra's `PMI_RANK/PMI_SIZE`,
//! Slurm's `SLURM_PROCID/SLURM_NTASKS`. The rendezvous, in this order:
//! 1. `BCL_UNIQUE_ID` (`bcl://IP:PORT/SECRET`, from `bclGetUniqueId` on rank 0);
//! 2. `BCL_ROOT=host:port`: rank 0 serves the store there;
//! 3. torchrun's `MASTER_ADDR`, at `MASTER_PORT + 1` (torchrun's own store holds
//!    `MASTER_PORT`), or `BCL_PORT`;
//! 4. Slurm: the first node of `SLURM_STEP_NODELIST`, at `BCL_PORT` or a port derived from the
//!    job and step ids;
//! 5. `BCL_STORE_DIR`: a directory every rank can reach (a shared file system);
//! 6. mpirun or Hydra with every rank on one host: a private directory under the temp dir,
//!    named after the job.
//!
//! Rendezvous 2–4 have no channel for a secret: unless `BCL_SECRET` is set (the same text on
//! every rank), the secret is derived from the job's identity, which keeps concurrent jobs
//! apart but is no defence against someone who can reach the ports. Directory rendezvous
//! creates the directory private to the user and passes a random secret through it.

use crate::error::{Error, Result};
use crate::unique_id::UniqueId;
use bcl_transport::Secret;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::PathBuf;

/// How the ranks of a job find each other.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rendezvous {
    /// Rank 0 serves the TCP store at the id's address.
    Root(UniqueId),
    /// The ranks meet in a directory (a file store); the secret travels through it.
    Directory(PathBuf),
}

/// Rank, world size and rendezvous as a launcher hands them over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub world: usize,
    /// The rank among those on this host, where the launcher says.
    pub local_rank: Option<usize>,
    pub rendezvous: Rendezvous,
    /// Which launcher's variables were used, for messages.
    pub launcher: &'static str,
}

type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn number(name: &str, value: &str) -> Result<usize> {
    value.trim().parse().map_err(|_| {
        Error::InvalidArgument(format!(
            "environment variable {name}='{value}' is not a number"
        ))
    })
}

/// The first of `names` that is set: (name, value).
fn first(get: Env<'_>, names: &[&'static str]) -> Option<(&'static str, String)> {
    names.iter().find_map(|n| get(n).map(|v| (*n, v)))
}

/// (rank variable, world variable, local-rank variable, launcher) in order of precedence.
const LAUNCHERS: [(&str, &str, &str, &str); 5] = [
    ("BCL_RANK", "BCL_WORLD_SIZE", "BCL_LOCAL_RANK", "bcl"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"),
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "mpirun (OpenMPI)",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "mpiexec (Hydra)"),
    (
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "srun (Slurm)",
    ),
];

impl Launch {
    /// Read the launcher's variables through `get` (see the module documentation).
    pub fn from_env(get: Env<'_>) -> Result<Self> {
        let found = LAUNCHERS
            .iter()
            .find(|(rank, world, ..)| get(rank).is_some() && get(world).is_some());
        let Some(&(rank_var, world_var, local_var, launcher)) = found else {
            let names: Vec<String> = LAUNCHERS
                .iter()
                .map(|(r, w, ..)| format!("{r}+{w}"))
                .collect();
            return Err(Error::InvalidArgument(format!(
                "rank and world size not set: none of {} is in the environment",
                names.join(", ")
            )));
        };
        let rank = number(rank_var, &get(rank_var).unwrap_or_default())?;
        let world = number(world_var, &get(world_var).unwrap_or_default())?;
        if world == 0 {
            return Err(Error::InvalidArgument(format!(
                "{world_var}=0 ({launcher}): a job needs at least one rank"
            )));
        }
        if rank >= world {
            return Err(Error::InvalidArgument(format!(
                "{rank_var}={rank} is not a rank of {world_var}={world} ({launcher}): ranks go \
                 from 0 to {}",
                world - 1
            )));
        }
        let local_rank = get(local_var).map(|v| number(local_var, &v)).transpose()?;
        let rendezvous = rendezvous(get, world)?;
        Ok(Launch {
            rank,
            world,
            local_rank,
            rendezvous,
            launcher,
        })
    }

    /// The IP to listen on when `BCL_BIND_IP` is not set: the address this host uses to reach
    /// the root, unless the root is on this host's loopback.
    pub fn bind_ip(&self) -> Option<IpAddr> {
        let Rendezvous::Root(id) = &self.rendezvous else {
            return None;
        };
        if id.addr.ip().is_loopback() {
            return None;
        }
        let probe = UdpSocket::bind(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0)).ok()?;
        probe.connect(id.addr).ok()?;
        probe.local_addr().ok().map(|a| a.ip())
    }
}

fn resolve(what: &str, host: &str, port: u16) -> Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("{what}: cannot resolve '{host}': {e}")))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| Error::InvalidArgument(format!("{what}: '{host}' has no IPv4 address")))
}

fn port(name: &str, value: &str) -> Result<u16> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("{name}='{value}' is not a port number")))
}

/// `BCL_SECRET` if set, else a secret derived from `identity`.
fn secret(get: Env<'_>, identity: &str) -> Secret {
    Secret::derive(&get("BCL_SECRET").unwrap_or_else(|| identity.to_string()))
}

fn rendezvous(get: Env<'_>, world: usize) -> Result<Rendezvous> {
    if let Some(id) = get("BCL_UNIQUE_ID") {
        return Ok(Rendezvous::Root(id.parse()?));
    }
    if let Some(root) = get("BCL_ROOT") {
        let (host, p) = root
            .rsplit_once(':')
            .ok_or_else(|| Error::InvalidArgument(format!("BCL_ROOT='{root}' is not host:port")))?;
        let addr = resolve("BCL_ROOT", host, port("BCL_ROOT", p)?)?;
        let s = secret(get, &format!("root {addr} world {world}"));
        return Ok(Rendezvous::Root(UniqueId { addr, secret: s }));
    }
    if let (Some(host), Some(master_port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
        let p = match get("BCL_PORT") {
            Some(v) => port("BCL_PORT", &v)?,
            None => port("MASTER_PORT", &master_port)?
                .checked_add(1)
                .ok_or_else(|| {
                    Error::InvalidArgument(
                        "MASTER_PORT=65535 leaves no port for BCL: set BCL_PORT".into(),
                    )
                })?,
        };
        let addr = resolve("MASTER_ADDR", &host, p)?;
        let run = get("TORCHELASTIC_RUN_ID").unwrap_or_default();
        let s = secret(get, &format!("torchrun {addr} world {world} run {run}"));
        return Ok(Rendezvous::Root(UniqueId { addr, secret: s }));
    }
    if let Some((_, nodes)) = first(get, &["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"]) {
        let job = get("SLURM_JOB_ID").unwrap_or_default();
        let step = get("SLURM_STEP_ID").unwrap_or_default();
        let host = first_host(&nodes).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "cannot read the first node of Slurm's node list '{nodes}'"
            ))
        })?;
        let p = match get("BCL_PORT") {
            Some(v) => port("BCL_PORT", &v)?,
            None => slurm_port(&job, &step),
        };
        let addr = resolve("Slurm's first node", &host, p)?;
        let s = secret(get, &format!("slurm job {job} step {step} world {world}"));
        return Ok(Rendezvous::Root(UniqueId { addr, secret: s }));
    }
    if let Some(dir) = get("BCL_STORE_DIR") {
        return Ok(Rendezvous::Directory(dir.into()));
    }
    let one_host =
        |size_var: &str| get(size_var).and_then(|v| v.trim().parse::<usize>().ok()) == Some(world);
    let job = first(
        get,
        &[
            "PMIX_NAMESPACE",
            "OMPI_MCA_ess_base_jobid",
            "PMI_KVS_NAME",
            "PMI_ID",
        ],
    );
    if (one_host("OMPI_COMM_WORLD_LOCAL_SIZE") || one_host("MPI_LOCALNRANKS"))
        && let Some((_, job)) = job
    {
        let safe: String = job
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        return Ok(Rendezvous::Directory(
            std::env::temp_dir().join(format!("bcl-rendezvous-{safe}")),
        ));
    }
    Err(Error::InvalidArgument(
        "no rendezvous: set BCL_UNIQUE_ID, BCL_ROOT=host:port (e.g. mpirun -x BCL_ROOT=node1:29500), \
         torchrun's MASTER_ADDR/MASTER_PORT, or BCL_STORE_DIR (a shared directory)"
            .into(),
    ))
}

/// A port for a Slurm step, the same on every node: (job, step) hashed into 20000..32768,
/// below Linux's ephemeral range (32768..61000) so that no outgoing connection holds it.
fn slurm_port(job: &str, step: &str) -> u16 {
    let h = format!("{job}.{step}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    20000 + (h % 12768) as u16
}

/// The first host of a Slurm node list: `gpu[07-12,20],cpu1` → `gpu07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list
        .char_indices()
        .scan(0i32, |depth, (i, c)| {
            match c {
                '[' => *depth += 1,
                // An unmatched ']' does not open a level below the top.
                ']' => *depth = (*depth - 1).max(0),
                _ => {}
            }
            Some((i, c, *depth))
        })
        .find(|&(_, c, depth)| c == ',' && depth == 0)
        .map_or(list.len(), |(i, ..)| i);
    let first = &list[..end];
    match first.split_once('[') {
        None if !first.is_empty() => Some(first.to_string()),
        None => None,
        Some((prefix, rest)) => {
            let range = rest.split([',', ']']).next()?;
            let start = range.split('-').next()?;
            (!start.is_empty()).then(|| format!("{prefix}{start}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env;

    fn root(l: &Launch) -> UniqueId {
        match &l.rendezvous {
            Rendezvous::Root(id) => *id,
            other => panic!("expected a root, got {other:?}"),
        }
    }

    #[test]
    fn torchrun_uses_master_addr_at_the_next_port_and_its_local_rank() {
        let vars = [
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let l = Launch::from_env(&env(&vars)).expect("launch");
        assert_eq!(
            (l.rank, l.world, l.local_rank, l.launcher),
            (3, 8, Some(1), "torchrun")
        );
        let id = root(&l);
        assert_eq!(id.addr.to_string(), "127.0.0.1:29501");
        // Every rank derives the same secret; another job derives another.
        let again = root(&Launch::from_env(&env(&vars)).expect("launch"));
        assert_eq!(again.secret, id.secret);
        let mut other = vars.to_vec();
        other.push(("TORCHELASTIC_RUN_ID", "job2"));
        assert_ne!(
            root(&Launch::from_env(&env(&other)).expect("launch")).secret,
            id.secret
        );
        let mut shared = vars.to_vec();
        shared.push(("BCL_SECRET", "s3cret"));
        assert_eq!(
            root(&Launch::from_env(&env(&shared)).expect("launch")).secret,
            Secret::derive("s3cret")
        );
    }

    #[test]
    fn openmpi_on_one_host_meets_in_a_directory_and_elsewhere_needs_a_root() {
        let one_host = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("PMIX_NAMESPACE", "prterun-vm-1234@1"),
        ];
        let l = Launch::from_env(&env(&one_host)).expect("launch");
        assert_eq!(l.launcher, "mpirun (OpenMPI)");
        assert_eq!(
            l.rendezvous,
            Rendezvous::Directory(std::env::temp_dir().join("bcl-rendezvous-prterun-vm-1234-1"))
        );
        let mut two_hosts = one_host.to_vec();
        two_hosts[3] = ("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
        let e = Launch::from_env(&env(&two_hosts)).expect_err("no root");
        assert!(e.to_string().contains("BCL_ROOT=host:port"), "{e}");
        two_hosts.push(("BCL_ROOT", "127.0.0.1:29555"));
        assert_eq!(
            root(&Launch::from_env(&env(&two_hosts)).expect("launch"))
                .addr
                .to_string(),
            "127.0.0.1:29555"
        );
    }

    #[test]
    fn slurm_uses_the_first_node_of_the_step_and_a_port_from_the_job() {
        let vars = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "localhost"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
        ];
        let l = Launch::from_env(&env(&vars)).expect("launch");
        assert_eq!((l.rank, l.world, l.local_rank), (5, 16, Some(1)));
        let id = root(&l);
        assert!(id.addr.ip().is_loopback());
        assert_eq!(id.addr.port(), slurm_port("4242", "0"));
        assert!((20000..32768).contains(&id.addr.port()));
    }

    #[test]
    fn slurm_node_lists_give_their_first_host() {
        assert_eq!(first_host("gpu[07-12,20],cpu1").as_deref(), Some("gpu07"));
        assert_eq!(first_host("node3,node4").as_deref(), Some("node3"));
        assert_eq!(first_host("a[1,3]").as_deref(), Some("a1"));
        assert_eq!(first_host("single").as_deref(), Some("single"));
        assert_eq!(first_host("").as_deref(), None);
        assert_eq!(first_host("x[]").as_deref(), None);
    }

    #[test]
    fn explicit_ids_win_and_bad_values_are_named() {
        let id = "bcl://127.0.0.1:29500/000102030405060708090a0b0c0d0e0f";
        let l = Launch::from_env(&env(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("BCL_UNIQUE_ID", id),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "1"),
        ]))
        .expect("launch");
        assert_eq!(root(&l).to_string(), id);
        let e = Launch::from_env(&env(&[
            ("RANK", "x"),
            ("WORLD_SIZE", "2"),
            ("BCL_UNIQUE_ID", id),
        ]))
        .expect_err("bad rank");
        assert!(e.to_string().contains("RANK='x'"), "{e}");
        let e = Launch::from_env(&env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("BCL_ROOT", "nohostport"),
        ]))
        .expect_err("bad root");
        assert!(e.to_string().contains("BCL_ROOT='nohostport'"), "{e}");
        let e = Launch::from_env(&env(&[])).expect_err("nothing");
        assert!(e.to_string().contains("OMPI_COMM_WORLD_RANK"), "{e}");
    }
}
