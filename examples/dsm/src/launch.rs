//! Who this process is: rank, node count and the rendezvous address, from the built-in
//! launcher's variables, Slurm's, or an MPI launcher's (docs/dsm.md, "Launch"); and the
//! configuration shared by every node.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::error::{Error, Result};

/// The port of the rendezvous when only its host is known (Slurm without `DSM_RENDEZVOUS`);
/// `DSM_PORT` overrides it.
pub const DEFAULT_PORT: u16 = 17171;

/// Where this process stands in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This node's rank, `0..size`.
    pub rank: u16,
    /// The number of nodes.
    pub size: u16,
    /// Rank 0 listens here; the others connect to it.
    pub rendezvous: SocketAddr,
    /// Which launcher's variables gave rank and size (`dsm`, `slurm`, `pmi`, `openmpi`).
    pub source: &'static str,
}

impl Launch {
    /// Reads the process environment (see [`Launch::from_vars`]).
    pub fn from_env() -> Result<Launch> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads rank and size from, in this order: `DSM_RANK`/`DSM_SIZE` (the built-in launcher),
    /// `SLURM_PROCID`/`SLURM_NTASKS` (`srun`), `PMI_RANK`/`PMI_SIZE` (MPICH's and Intel MPI's
    /// `mpirun`), `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE` (Open MPI's `mpirun`). The
    /// rendezvous is `DSM_RENDEZVOUS` (`host:port`) if set; under Slurm it defaults to the
    /// first host of `SLURM_JOB_NODELIST` at `DSM_PORT` (default [`DEFAULT_PORT`]). MPI
    /// launchers name no host, so there `DSM_RENDEZVOUS` is required.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let sources: [(&str, &str, &'static str); 4] = [
            ("DSM_RANK", "DSM_SIZE", "dsm"),
            ("SLURM_PROCID", "SLURM_NTASKS", "slurm"),
            ("PMI_RANK", "PMI_SIZE", "pmi"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"),
        ];
        let (rank_var, size_var, source) = sources
            .into_iter()
            .find(|(r, _, _)| get(r).is_some())
            .ok_or_else(|| {
            Error::Config(
                "no rank in the environment: start under `dsm run`, srun or mpirun, or set \
                     DSM_RANK, DSM_SIZE and DSM_RENDEZVOUS"
                    .into(),
            )
        })?;
        let number = |var: &str| -> Result<u16> {
            let text = get(var).ok_or_else(|| Error::Config(format!("{var} is not set")))?;
            text.trim()
                .parse::<u16>()
                .map_err(|_| Error::Config(format!("{var}={text:?} is not a number below 65536")))
        };
        let rank = number(rank_var)?;
        let size = number(size_var)?;
        if size == 0 || rank >= size {
            return Err(Error::Config(format!(
                "rank {rank} of {size} nodes ({rank_var}, {size_var})"
            )));
        }
        let port = match get("DSM_PORT") {
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|_| Error::Config(format!("DSM_PORT={p:?} is not a port number")))?,
            None => DEFAULT_PORT,
        };
        let target = match get("DSM_RENDEZVOUS") {
            Some(r) => r,
            None if source == "slurm" => {
                let list = get("SLURM_JOB_NODELIST")
                    .or_else(|| get("SLURM_NODELIST"))
                    .ok_or_else(|| {
                        Error::Config("neither DSM_RENDEZVOUS nor SLURM_JOB_NODELIST is set".into())
                    })?;
                format!("{}:{port}", first_host(&list)?)
            }
            None => {
                return Err(Error::Config(format!(
                    "DSM_RENDEZVOUS (host:port of rank 0) is not set; {source} names no host"
                )));
            }
        };
        let rendezvous = resolve(&target)?;
        Ok(Launch {
            rank,
            size,
            rendezvous,
            source,
        })
    }
}

/// Resolves `host:port`, preferring IPv4.
pub(crate) fn resolve(target: &str) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| Error::Config(format!("rendezvous {target:?}: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Error::Config(format!("rendezvous {target:?} resolves to nothing")))
}

/// The first host of a Slurm node list: `node[01-04,07],gpu1` gives `node01`.
pub fn first_host(list: &str) -> Result<String> {
    let bad = || Error::Config(format!("cannot read the Slurm node list {list:?}"));
    let list = list.trim();
    let end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..end];
    if prefix.is_empty() {
        return Err(bad());
    }
    if list[end..].starts_with('[') {
        let inner = &list[end + 1..];
        let close = inner.find(']').ok_or_else(bad)?;
        let first = inner[..close]
            .split([',', '-'])
            .next()
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(bad)?;
        return Ok(format!("{prefix}{first}"));
    }
    Ok(prefix.to_string())
}

/// The transports (docs/dsm.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    /// Kernel TCP sockets: requests and replies as messages.
    Tcp,
    /// RDMA SEND/RECV: requests and replies as messages on RC queue pairs.
    RdmaSend,
    /// RDMA READ of pages straight from the home's registered memory; the rest as SENDs.
    RdmaRead,
}

impl TransportKind {
    /// The name used on the command line and in `DSM_TRANSPORT`.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::RdmaSend => "rdma-send",
            TransportKind::RdmaRead => "rdma-read",
        }
    }

    fn parse(text: &str) -> Result<TransportKind> {
        match text {
            "tcp" => Ok(TransportKind::Tcp),
            "rdma-send" => Ok(TransportKind::RdmaSend),
            "rdma-read" => Ok(TransportKind::RdmaRead),
            other => Err(Error::Config(format!(
                "transport {other:?} (tcp, rdma-send or rdma-read)"
            ))),
        }
    }
}

/// How a touch of a page with no valid copy is caught (docs/dsm.md, "The fault path").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultMechanism {
    /// A `SIGSEGV` handler; window pages opened and closed with `mprotect`, a write to a
    /// read-only copy faults once more (its twin is made then).
    #[default]
    Sigsegv,
    /// `userfaultfd` minor faults (Linux 5.14 or later, where permitted): the kernel holds the
    /// faulting thread and the fault thread maps the page; every copy is writable and twinned
    /// when it is mapped, so writes take no fault and releases diff every cached copy.
    Userfaultfd,
}

impl FaultMechanism {
    /// The name used on the command line and in `DSM_FAULTS`.
    pub fn name(self) -> &'static str {
        match self {
            FaultMechanism::Sigsegv => "sigsegv",
            FaultMechanism::Userfaultfd => "userfaultfd",
        }
    }

    fn parse(text: &str) -> Result<FaultMechanism> {
        match text {
            "sigsegv" => Ok(FaultMechanism::Sigsegv),
            "userfaultfd" => Ok(FaultMechanism::Userfaultfd),
            other => Err(Error::Config(format!(
                "fault mechanism {other:?} (sigsegv or userfaultfd)"
            ))),
        }
    }
}

/// Settings every node must share (except `faults`, which each node may choose).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// How nodes talk.
    pub transport: TransportKind,
    /// The window's address, the same on every node.
    pub window_base: usize,
    /// The window's size in bytes (a page multiple).
    pub window_bytes: usize,
    /// Bound on joining and on each reply from a peer.
    pub timeout: Duration,
    /// Bound on waits for locks and barriers (other nodes may compute for a while).
    pub sync_timeout: Duration,
    /// Pages fetched after a faulting one from the same home (0: none).
    pub prefetch: u16,
    /// Pages after a faulting one examined for prefetch (pages with a copy here or another
    /// home are skipped); below `prefetch` (0 by default) it counts as `prefetch`.
    pub max_checking: u16,
    /// The RDMA device (the first one if `None`).
    pub device: Option<String>,
    /// The GID index for RoCE.
    pub gid_index: u8,
    /// How faults are caught on this node.
    pub faults: FaultMechanism,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            transport: TransportKind::Tcp,
            window_base: 0x2000_0000_0000,
            window_bytes: 64 << 20,
            timeout: Duration::from_secs(30),
            sync_timeout: Duration::from_secs(300),
            prefetch: 0,
            max_checking: 0,
            device: None,
            gid_index: 1,
            faults: FaultMechanism::Sigsegv,
        }
    }
}

impl Config {
    /// Reads `DSM_TRANSPORT`, `DSM_WINDOW_BASE` (hex with `0x` or decimal), `DSM_WINDOW_MIB`,
    /// `DSM_TIMEOUT_MS`, `DSM_SYNC_TIMEOUT_MS`, `DSM_PREFETCH`, `DSM_MAX_CHECKING`,
    /// `DSM_DEVICE`, `DSM_GID_INDEX`, `DSM_FAULTS`; each unset one keeps its default.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Config::from_env`], reading variables through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        fn num<T: std::str::FromStr>(var: &str, text: &str) -> Result<T> {
            text.trim()
                .parse()
                .map_err(|_| Error::Config(format!("{var}={text:?} is not a valid number")))
        }
        let mut c = Config::default();
        if let Some(t) = get("DSM_TRANSPORT") {
            c.transport = TransportKind::parse(t.trim())?;
        }
        if let Some(t) = get("DSM_WINDOW_BASE") {
            let t = t.trim();
            c.window_base = match t.strip_prefix("0x") {
                Some(hex) => usize::from_str_radix(hex, 16)
                    .map_err(|_| Error::Config(format!("DSM_WINDOW_BASE={t:?} is not a number")))?,
                None => num("DSM_WINDOW_BASE", t)?,
            };
        }
        if let Some(t) = get("DSM_WINDOW_MIB") {
            let mib: usize = num("DSM_WINDOW_MIB", &t)?;
            c.window_bytes = mib
                .checked_mul(1 << 20)
                .filter(|b| *b > 0)
                .ok_or_else(|| Error::Config(format!("DSM_WINDOW_MIB={t:?} is out of range")))?;
        }
        if let Some(t) = get("DSM_TIMEOUT_MS") {
            c.timeout = Duration::from_millis(num("DSM_TIMEOUT_MS", &t)?);
        }
        if let Some(t) = get("DSM_SYNC_TIMEOUT_MS") {
            c.sync_timeout = Duration::from_millis(num("DSM_SYNC_TIMEOUT_MS", &t)?);
        }
        if let Some(t) = get("DSM_PREFETCH") {
            c.prefetch = num("DSM_PREFETCH", &t)?;
        }
        if let Some(t) = get("DSM_MAX_CHECKING") {
            c.max_checking = num("DSM_MAX_CHECKING", &t)?;
        }
        c.device = get("DSM_DEVICE").filter(|d| !d.is_empty());
        if let Some(t) = get("DSM_GID_INDEX") {
            c.gid_index = num("DSM_GID_INDEX", &t)?;
        }
        if let Some(t) = get("DSM_FAULTS") {
            c.faults = FaultMechanism::parse(t.trim())?;
        }
        c.check()?;
        Ok(c)
    }

    /// The variables that give this configuration to [`Config::from_env`] (the launcher sets
    /// them for its children).
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("DSM_TRANSPORT", self.transport.name().to_string()),
            ("DSM_WINDOW_BASE", format!("{:#x}", self.window_base)),
            ("DSM_WINDOW_MIB", (self.window_bytes >> 20).to_string()),
            ("DSM_TIMEOUT_MS", self.timeout.as_millis().to_string()),
            (
                "DSM_SYNC_TIMEOUT_MS",
                self.sync_timeout.as_millis().to_string(),
            ),
            ("DSM_PREFETCH", self.prefetch.to_string()),
            ("DSM_MAX_CHECKING", self.max_checking.to_string()),
            ("DSM_GID_INDEX", self.gid_index.to_string()),
            ("DSM_FAULTS", self.faults.name().to_string()),
        ];
        if let Some(d) = &self.device {
            vars.push(("DSM_DEVICE", d.clone()));
        }
        vars
    }

    /// Checks the ranges: timeouts from 1 ms to a day, a window up to 1 TiB, prefetch and
    /// checked pages up to 1024.
    pub fn check(&self) -> Result<()> {
        let day = Duration::from_secs(86_400);
        for (name, t) in [
            ("timeout", self.timeout),
            ("sync timeout", self.sync_timeout),
        ] {
            if t < Duration::from_millis(1) || t > day {
                return Err(Error::Config(format!(
                    "a {name} of {t:?} (from 1 ms to a day)"
                )));
            }
        }
        if self.window_bytes == 0 || self.window_bytes > 1 << 40 {
            return Err(Error::Config(format!(
                "a window of {} bytes (1 page to 1 TiB)",
                self.window_bytes
            )));
        }
        if self.prefetch > 1024 {
            return Err(Error::Config(format!(
                "prefetch of {} pages (at most 1024)",
                self.prefetch
            )));
        }
        if self.max_checking > 1024 {
            return Err(Error::Config(format!(
                "{} pages checked for prefetch (at most 1024)",
                self.max_checking
            )));
        }
        Ok(())
    }

    /// A digest of the settings every node must share (checked when the nodes meet).
    pub(crate) fn digest(&self) -> u64 {
        let text = format!(
            "{}|{:#x}|{}|{}",
            self.transport.name(),
            self.window_base,
            self.window_bytes,
            self.prefetch
        );
        fnv1a(text.as_bytes())
    }
}

/// FNV-1a, 64 bits: digests of collective calls and settings.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = list
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn ranks_come_from_each_launcher() {
        let l = Launch::from_vars(vars(&[
            ("DSM_RANK", "1"),
            ("DSM_SIZE", "4"),
            ("DSM_RENDEZVOUS", "127.0.0.1:5000"),
        ]))
        .unwrap();
        assert_eq!((l.rank, l.size, l.source), (1, 4, "dsm"));
        assert_eq!(l.rendezvous, "127.0.0.1:5000".parse().unwrap());

        let l = Launch::from_vars(vars(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_NODELIST", "localhost,n2"),
            ("DSM_PORT", "6000"),
        ]))
        .unwrap();
        assert_eq!((l.rank, l.size, l.source), (3, 8, "slurm"));
        assert_eq!(l.rendezvous.port(), 6000);
        assert!(l.rendezvous.ip().is_loopback());

        let l = Launch::from_vars(vars(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("DSM_RENDEZVOUS", "127.0.0.1:7000"),
        ]))
        .unwrap();
        assert_eq!(l.source, "pmi");
        let l = Launch::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("DSM_RENDEZVOUS", "127.0.0.1:7000"),
        ]))
        .unwrap();
        assert_eq!((l.rank, l.source), (1, "openmpi"));
    }

    #[test]
    fn bad_launch_environments_are_named() {
        let err = |list: &[(&str, &str)]| Launch::from_vars(vars(list)).unwrap_err().to_string();
        assert!(err(&[]).contains("no rank in the environment"));
        assert!(
            err(&[
                ("DSM_RANK", "2"),
                ("DSM_SIZE", "2"),
                ("DSM_RENDEZVOUS", "127.0.0.1:1")
            ])
            .contains("rank 2 of 2 nodes")
        );
        assert!(err(&[("DSM_RANK", "x"), ("DSM_SIZE", "2")]).contains("DSM_RANK=\"x\""));
        assert!(err(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]).contains("DSM_RENDEZVOUS"));
        assert!(
            err(&[
                ("DSM_RANK", "0"),
                ("DSM_SIZE", "2"),
                ("DSM_RENDEZVOUS", "nocolon")
            ])
            .contains("rendezvous \"nocolon\"")
        );
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("node[01-04,07],gpu1").unwrap(), "node01");
        assert_eq!(first_host("a,b").unwrap(), "a");
        assert_eq!(first_host("single").unwrap(), "single");
        assert_eq!(first_host("n[3]").unwrap(), "n3");
        assert!(first_host("[1-2]").is_err());
        assert!(first_host("n[").is_err());
        assert!(first_host("n[x]").is_err());
    }

    #[test]
    fn configs_round_trip_through_variables() {
        let c = Config {
            transport: TransportKind::RdmaRead,
            window_base: 0x3000_0000_0000,
            window_bytes: 8 << 20,
            timeout: Duration::from_millis(1500),
            sync_timeout: Duration::from_secs(9),
            prefetch: 4,
            max_checking: 9,
            device: Some("rxe0".into()),
            gid_index: 0,
            faults: FaultMechanism::Userfaultfd,
        };
        let list: Vec<(String, String)> = c
            .to_vars()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let map: HashMap<String, String> = list.into_iter().collect();
        assert_eq!(Config::from_vars(|n| map.get(n).cloned()).unwrap(), c);
        assert!(Config::from_vars(vars(&[("DSM_TRANSPORT", "udp")])).is_err());
        assert_eq!(
            Config::from_vars(vars(&[("DSM_FAULTS", "uffd")]))
                .unwrap_err()
                .to_string(),
            "configuration: fault mechanism \"uffd\" (sigsegv or userfaultfd)"
        );
        assert!(Config::from_vars(vars(&[("DSM_WINDOW_MIB", "0")])).is_err());
        assert!(Config::from_vars(vars(&[("DSM_TIMEOUT_MS", "0")])).is_err());
        assert!(Config::from_vars(vars(&[("DSM_PREFETCH", "1025")])).is_err());
        assert!(Config::from_vars(vars(&[("DSM_MAX_CHECKING", "1025")])).is_err());
        assert!(Config::from_vars(vars(&[("DSM_SYNC_TIMEOUT_MS", "86400001")])).is_err());
        let huge = Config {
            timeout: Duration::MAX,
            ..Config::default()
        };
        assert!(
            huge.check().is_err(),
            "no Instant + Duration::MAX overflow later"
        );
    }
}
