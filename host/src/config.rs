//! Everything rshmem reads from the environment, parsed in one place.
//!
//! This module owns the names and meaning of every environment variable rshmem reads:
//! which launcher's variables give this PE its rank and the job its size ([`LaunchInfo`]),
//! and the runtime settings ([`Settings`]). Both parse through an injectable lookup
//! function so that tests (and hosts of several PEs in one process) never have to touch
//! the process environment. It must not act on what it reads (no sockets, no allocation
//! of the heap); a malformed value is an [`Error::Env`] naming the variable and value.
use crate::error::{Error, Result};
use std::time::Duration;

mod names;
pub use names::{env_vars, is_known, unknown_vars, warn_unknown_env, UnknownVar};

/// Which launcher's variables supplied rank and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchSource {
    Rshmem,
    Torchrun,
    OpenMpi,
    Slurm,
    Pmi,
}

/// Rank, size and root address of this PE, from the first launcher variable set present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    pub source: LaunchSource,
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: Option<usize>,
    pub local_size: Option<usize>,
    /// Host of the bootstrap root (RSHMEM_MASTER_ADDR, else MASTER_ADDR).
    pub master_addr: Option<String>,
    /// Port of the bootstrap root (RSHMEM_MASTER_PORT, else MASTER_PORT).
    pub master_port: Option<u16>,
}

/// How one launcher names rank, size, local rank and local size.
struct LauncherVars {
    source: LaunchSource,
    rank: &'static str,
    size: &'static str,
    local_rank: Option<&'static str>,
    local_size: LocalSize,
}

/// Where a launcher puts the number of PEs on this node.
enum LocalSize {
    None,
    /// A plain number.
    Var(&'static str),
    /// Slurm's SLURM_NTASKS_PER_NODE: a plain number, or a compressed list such as
    /// `2(x3),1` on heterogeneous allocations, which says nothing about this node.
    NumberIfPlain(&'static str),
}

/// Launcher variable sets in order of precedence: the first whose rank variable is set wins.
/// PMI comes before Slurm: a PMI process manager (MPICH's or Intel MPI's `mpiexec`) run
/// inside a Slurm allocation starts processes that inherit the batch script's
/// `SLURM_PROCID` (0 on every one of them), and `PMI_RANK` is the one set for each
/// process; under `srun --mpi=pmi2` both are set and agree. (Before 2026-12-07 Slurm came
/// first, and every process of such a job took rank 0.)
const LAUNCHERS: [LauncherVars; 5] = [
    LauncherVars {
        source: LaunchSource::Rshmem,
        rank: "RSHMEM_RANK",
        size: "RSHMEM_WORLD_SIZE",
        local_rank: Some("RSHMEM_LOCAL_RANK"),
        local_size: LocalSize::Var("RSHMEM_LOCAL_SIZE"),
    },
    LauncherVars {
        source: LaunchSource::Torchrun,
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: Some("LOCAL_RANK"),
        local_size: LocalSize::Var("LOCAL_WORLD_SIZE"),
    },
    LauncherVars {
        source: LaunchSource::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size: LocalSize::Var("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    LauncherVars {
        source: LaunchSource::Pmi,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: None,
        local_size: LocalSize::None,
    },
    LauncherVars {
        source: LaunchSource::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: Some("SLURM_LOCALID"),
        local_size: LocalSize::NumberIfPlain("SLURM_NTASKS_PER_NODE"),
    },
];

/// Most PEs in one job (2^20).
pub const MAX_WORLD_SIZE: usize = 1 << 20;

fn env_err(var: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::Env {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Runs a parser over the process environment: `f` gets a lookup of variables, and a
/// variable whose value is not valid UTF-8 is an [`Error::Env`] naming it (taken as unset,
/// its default was used without a word).
fn with_process_env<T>(f: impl FnOnce(&dyn Fn(&str) -> Option<String>) -> Result<T>) -> Result<T> {
    let bad: std::cell::RefCell<Option<(String, String)>> = Default::default();
    let get = |k: &str| match std::env::var(k) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => {
            bad.borrow_mut()
                .get_or_insert_with(|| (k.to_string(), v.to_string_lossy().into_owned()));
            None
        }
    };
    let r = f(&get);
    match bad.into_inner() {
        Some((var, value)) => Err(env_err(&var, &value, "not valid UTF-8")),
        None => r,
    }
}

/// One variable of the process environment: `Ok(None)` when unset, an [`Error::Env`] when
/// its value is not valid UTF-8.
pub fn env_text(var: &str) -> Result<Option<String>> {
    with_process_env(|get| Ok(get(var)))
}

/// Parses a non-negative decimal integer (surrounding whitespace allowed).
fn parse_count(var: &str, value: &str) -> Result<usize> {
    let v = value.trim();
    // Digits only: `parse` would take "+3" too, which the sizes refuse.
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(env_err(var, value, "expected a non-negative integer"));
    }
    v.parse::<usize>()
        .map_err(|_| env_err(var, value, "expected a non-negative integer"))
}

fn lookup_count(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<usize>> {
    get(var).map(|v| parse_count(var, &v)).transpose()
}

impl LaunchInfo {
    /// Reads the process environment. `Ok(None)`: no launcher variables at all.
    pub fn from_env() -> Result<Option<LaunchInfo>> {
        with_process_env(|get| Self::from_lookup(get))
    }

    /// Same, with an injectable lookup (for tests).
    ///
    /// The first launcher set (rshmem, torchrun, Open MPI, PMI, Slurm) whose rank variable
    /// is set supplies rank, size, local rank and local size; the root address comes from
    /// `RSHMEM_MASTER_ADDR`/`RSHMEM_MASTER_PORT`, else `MASTER_ADDR`/`MASTER_PORT`, whatever
    /// the launcher. An empty address counts as unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
        let Some((vars, rank_value)) = LAUNCHERS.iter().find_map(|l| get(l.rank).map(|v| (l, v)))
        else {
            // rshmem's own job variables without a rank: a launcher rshmem does not know,
            // or a script that forgot RSHMEM_RANK. Running alone would make N one-PE jobs
            // that all succeed; refused instead (before 2026-12-07 they were ignored).
            let blank = |v: &str| v.trim().is_empty();
            for var in [
                "RSHMEM_WORLD_SIZE",
                "RSHMEM_MASTER_ADDR",
                "RSHMEM_MASTER_PORT",
                "RSHMEM_ROOT",
            ] {
                if let Some(v) = get(var).filter(|v| !blank(v)) {
                    // The values that say nothing about other PEs.
                    if (var == "RSHMEM_WORLD_SIZE" && v.trim() == "1")
                        || (var == "RSHMEM_ROOT" && v.trim() == "self")
                    {
                        continue;
                    }
                    let ranks: Vec<&str> = LAUNCHERS.iter().map(|l| l.rank).collect();
                    return Err(env_err(
                        var,
                        &v,
                        format!(
                            "is set, but no rank variable is ({}): this process would run \
                             alone as a 1-PE job; set RSHMEM_RANK and RSHMEM_WORLD_SIZE for \
                             every PE (or start the job with rshmem run), or unset {var}",
                            ranks.join(", ")
                        ),
                    ));
                }
            }
            return Ok(None);
        };
        let rank = parse_count(vars.rank, &rank_value)?;
        let size_value = get(vars.size).ok_or_else(|| {
            env_err(
                vars.size,
                "",
                format!(
                    "not set, but {}={} is; both are needed (the number of PEs and this PE's rank)",
                    vars.rank, rank_value
                ),
            )
        })?;
        let world_size = parse_count(vars.size, &size_value)?;
        if world_size == 0 {
            return Err(env_err(
                vars.size,
                &size_value,
                "the job must have at least one PE",
            ));
        }
        if world_size > MAX_WORLD_SIZE {
            // The root keeps a record per PE: a mistyped size would allocate gigabytes.
            return Err(env_err(
                vars.size,
                &size_value,
                format!("more PEs than one job supports (at most {MAX_WORLD_SIZE})"),
            ));
        }
        if rank >= world_size {
            return Err(env_err(
                vars.rank,
                &rank_value,
                format!("rank must be less than {}={world_size}", vars.size),
            ));
        }
        let local_rank = match vars.local_rank {
            Some(var) => lookup_count(&get, var)?,
            None => None,
        };
        let local_size = match vars.local_size {
            LocalSize::None => None,
            LocalSize::Var(var) => {
                let n = lookup_count(&get, var)?;
                if n == Some(0) {
                    return Err(env_err(var, "0", "a node must have at least one PE"));
                }
                n
            }
            LocalSize::NumberIfPlain(var) => get(var)
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0),
        };
        if let (Some(lr), Some(ls), Some(var)) = (local_rank, local_size, vars.local_rank) {
            if lr >= ls {
                return Err(env_err(
                    var,
                    &lr.to_string(),
                    format!("local rank must be less than the local size {ls}"),
                ));
            }
        }
        // A blank RSHMEM_MASTER_ADDR (`RSHMEM_MASTER_ADDR=$HEAD` with HEAD unset) falls
        // back to MASTER_ADDR like an unset one.
        let addr_of = |var: &'static str| {
            get(var)
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .map(|a| (var, a))
        };
        let master_addr = match addr_of("RSHMEM_MASTER_ADDR").or_else(|| addr_of("MASTER_ADDR")) {
            // One colon, and not an IPv6 address, or a bracketed IPv6 address followed by
            // a port: host:port, which would be taken for a bare IPv6 address (or given a
            // second port) and fail to resolve on every PE.
            Some((var, a))
                if (a.matches(':').count() == 1 && !a.starts_with('['))
                    || (a.starts_with('[') && a.contains("]:")) =>
            {
                return Err(env_err(
                    var,
                    &a,
                    "holds host:port; give the host alone and the port in RSHMEM_MASTER_PORT \
                     (or MASTER_PORT)",
                ));
            }
            other => other.map(|(_, a)| a),
        };
        let master_port = match first_set(&get, &["RSHMEM_MASTER_PORT", "MASTER_PORT"]) {
            None => None,
            // torchrun's agent on node 0 holds MASTER_PORT itself (its rendezvous store, which
            // the workers connect to), so rank 0 could not listen there: the root takes the
            // next port unless RSHMEM_MASTER_PORT names one.
            Some(("MASTER_PORT", value)) if vars.source == LaunchSource::Torchrun => {
                let p = parse_port("MASTER_PORT", &value)?;
                Some(p.checked_add(1).ok_or_else(|| {
                    env_err(
                        "MASTER_PORT",
                        &value,
                        "under torchrun the bootstrap root listens on MASTER_PORT + 1, past \
                         65535 here: set RSHMEM_MASTER_PORT",
                    )
                })?)
            }
            Some((var, value)) => Some(parse_port(var, &value)?),
        };
        Ok(Some(LaunchInfo {
            source: vars.source,
            rank,
            world_size,
            local_rank,
            local_size,
            master_addr,
            master_port,
        }))
    }
}

fn first_set(
    get: &impl Fn(&str) -> Option<String>,
    vars: &[&'static str],
) -> Option<(&'static str, String)> {
    vars.iter().find_map(|&v| get(v).map(|value| (v, value)))
}

fn parse_port(var: &str, value: &str) -> Result<u16> {
    match value.trim().parse::<u16>() {
        Ok(0) => Err(env_err(var, value, "port 0 cannot be connected to")),
        Ok(p) => Ok(p),
        Err(_) => Err(env_err(var, value, "expected a TCP port number (1-65535)")),
    }
}

/// How a PE reaches its peers (RSHMEM_TRANSPORT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportMode {
    /// p2p to node-local peers, proxy (soft HCA over libfabric) to peers on other nodes.
    #[default]
    Auto,
    /// Loads and stores into node-local peers' heaps only (peers on other nodes are
    /// unreachable).
    P2p,
    /// Everything, node-local peers and this PE itself included, through the soft HCA.
    Proxy,
    /// GPU PEs only: every peer (this PE's own atomics too) through a ConnectX NIC's
    /// queues that GPU threads write (IBGDA on real hardware; docs/ibgda.md).
    Ibgda,
}

impl TransportMode {
    pub fn name(self) -> &'static str {
        match self {
            TransportMode::Auto => "auto",
            TransportMode::P2p => "p2p",
            TransportMode::Proxy => "proxy",
            TransportMode::Ibgda => "ibgda",
        }
    }
}

/// Runtime settings (RSHMEM_SYMMETRIC_SIZE, RSHMEM_TIMEOUT_MS, RSHMEM_TOKEN, RSHMEM_NODE_ID,
/// RSHMEM_ROOT, RSHMEM_TRANSPORT).
#[derive(Debug, Clone)]
pub struct Settings {
    pub symmetric_size: usize,
    pub timeout: Duration,
    pub token: Option<String>,
    pub node_id: String,
    /// RSHMEM_ROOT=external: the bootstrap root already runs (hosted by the launcher);
    /// rank 0 must not host it.
    pub root_external: bool,
    /// RSHMEM_TRANSPORT: `auto` (default), `p2p` or `proxy`.
    pub transport: TransportMode,
    /// RSHMEM_PROXY_BACKEND: how the soft HCA reaches node-local peers under
    /// `RSHMEM_TRANSPORT=proxy`: `local` (default, memory mapped here) or `fabric`
    /// (libfabric, as for peers on other nodes; for testing the network path on one node).
    /// Peers on other nodes always use libfabric.
    pub proxy_fabric: bool,
    /// RSHMEM_FABRIC_CHUNK: staging bytes per SQ slot of a soft-HCA QP to a peer reached
    /// through libfabric (the largest WRITE/READ one WQE carries; 128 per QP are
    /// registered). A power of two from 8 KiB to 1 MiB; default 256 KiB.
    pub fabric_chunk: usize,
    /// How the libfabric backend of the soft HCA runs (docs/multinode.md, "Defaults").
    pub fabric: FabricSwitches,
    /// RSHMEM_DEBUG_QUEUES: publish the live state of this process's soft-HCA queues to
    /// `/dev/shm/rshmem-<job>-queues-<pid>` every period, for `rshmem doctor --queues`.
    /// `0` (default) off, `1` every 100 ms, or a period in ms from 10 to 60000.
    pub debug_queues: Option<Duration>,
    /// RSHMEM_P2P_ASSIST: whether a PE waiting inside rshmem helps copy the large p2p puts
    /// other PEs make into its heap (`assist.rs`): `auto` (default: on unless the node's
    /// PEs outnumber its cores), `1` on, `0` off.
    pub p2p_assist: crate::assist::AssistMode,
    /// RSHMEM_BIND: `auto` (default: each CPU PE's thread on its own CPU when the node's
    /// 2 or more PEs fit in the CPUs it may use and reach each other by load/store),
    /// `core` (one CPU each, shared round-robin when they do not fit) or `none`
    /// (affinity.rs).
    pub bind: crate::affinity::BindMode,
    /// RSHMEM_HCA: the NIC of `RSHMEM_TRANSPORT=ibgda` (`mlx5_0` or `mlx5_0:1`); unset, the
    /// mlx5 device with an active port nearest the GPU on PCIe (`gpu::nic::choose_port`).
    pub hca: Option<String>,
    /// RSHMEM_IBGDA_DOORBELL: `auto` (default: GPU threads ring the NIC's doorbell; a CPU
    /// thread relays it when the driver cannot map the doorbell page into the GPU) or
    /// `cpu` (always the CPU thread).
    pub ibgda_cpu_doorbell: bool,
    /// RSHMEM_DEVICE_CHECKS: GPU PEs' device-side PE and heap-range checks, `1` (default)
    /// or `0` (benchmarks).
    pub device_checks: bool,
    /// The RC connection settings of `RSHMEM_TRANSPORT=ibgda` (RSHMEM_IB_*).
    pub ib: IbSettings,
}

/// RC connection settings a fabric may need set (what NVSHMEM's `NVSHMEM_IB_GID_INDEX`,
/// `NVSHMEM_IB_TRAFFIC_CLASS` and `NVSHMEM_IB_SL` set). Lossless RoCE usually carries RDMA
/// on one priority (e.g. DSCP 26: traffic class 104 or 106); traffic on another one may be
/// dropped under load, and drops end in retry-exceeded errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbSettings {
    /// RSHMEM_IB_GID_INDEX: the source GID table index; unset, the first RoCE v2 entry
    /// holding an IPv4 address (`verbs::qp::choose_gid`).
    pub gid_index: Option<u16>,
    /// RSHMEM_IB_TC: the GRH traffic class (0..=255, default 0).
    pub traffic_class: u8,
    /// RSHMEM_IB_SL: the service level (0..=15, default 0).
    pub sl: u8,
    /// RSHMEM_IB_TIMEOUT: the local ACK timeout exponent, 4.096 µs · 2^t (1..=31, default
    /// 19 ≈ 2.1 s; with 7 retries a congested fabric has about 17 s, inside the default
    /// RSHMEM_TIMEOUT_MS: `RcParams::timeout`).
    pub timeout: u8,
}

impl Default for IbSettings {
    fn default() -> Self {
        IbSettings {
            gid_index: None,
            traffic_class: 0,
            sl: 0,
            timeout: 19,
        }
    }
}

impl IbSettings {
    /// From the process environment.
    pub fn from_env() -> Result<IbSettings> {
        with_process_env(|get| Self::from_lookup(&get))
    }

    fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<IbSettings> {
        let num = |var: &str, lo: usize, hi: usize, what: &str| -> Result<Option<usize>> {
            // Blank counts as unset, as for RSHMEM_HCA.
            match get(var).filter(|v| !v.trim().is_empty()) {
                None => Ok(None),
                Some(v) => match parse_count(var, &v) {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(env_err(
                        var,
                        &v,
                        format!("expected {what} from {lo} to {hi}"),
                    )),
                },
            }
        };
        let d = IbSettings::default();
        Ok(IbSettings {
            // ibv_ah_attr's sgid_index has 8 bits.
            gid_index: num("RSHMEM_IB_GID_INDEX", 0, 255, "a GID table index")?.map(|n| n as u16),
            traffic_class: num("RSHMEM_IB_TC", 0, 255, "a traffic class")?
                .map_or(d.traffic_class, |n| n as u8),
            sl: num("RSHMEM_IB_SL", 0, 15, "a service level")?.map_or(d.sl, |n| n as u8),
            timeout: num(
                "RSHMEM_IB_TIMEOUT",
                1,
                31,
                "an ACK timeout exponent (4.096 us * 2^t)",
            )?
            .map_or(d.timeout, |n| n as u8),
        })
    }
}

/// The libfabric backend's switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricSwitches {
    /// RSHMEM_ENGINE_HANDOVER: `1` (default) the engine thread parks while a waiting PE
    /// drives progress itself; `0` it keeps running rounds.
    pub handover: bool,
    /// RSHMEM_FABRIC_CONFIRM: `lazy` (default) flush READs only when a completion is
    /// needed; `eager` after every round's writes.
    pub lazy_confirm: bool,
    /// RSHMEM_FABRIC_DELIVERY: `flush` (default) confirm writes with READs; `complete` ask
    /// the provider for delivery-complete writes.
    pub delivery_complete: bool,
}

/// The value of `var` when it is one of `allowed`, `default` when unset; anything else is
/// an `Error::Env` naming the allowed values.
fn choice(
    get: &impl Fn(&str) -> Option<String>,
    var: &str,
    allowed: &[&'static str],
    default: &'static str,
) -> Result<&'static str> {
    match get(var) {
        None => Ok(default),
        Some(v) => allowed
            .iter()
            .copied()
            .find(|a| *a == v.trim())
            .ok_or_else(|| env_err(var, &v, format!("expected one of: {}", allowed.join(", ")))),
    }
}

/// Default RSHMEM_FABRIC_CHUNK (docs/multinode.md: each WQE is one network operation with
/// a fixed cost, so bandwidth grows with it).
pub const DEFAULT_FABRIC_CHUNK: usize = 256 << 10;

pub const DEFAULT_SYMMETRIC_SIZE: usize = 256 << 20;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The smallest symmetric heap accepted (RSHMEM_SYMMETRIC_SIZE).
pub const MIN_SYMMETRIC_SIZE: usize = 1 << 20;

/// The longest `RSHMEM_TIMEOUT_MS` (about 31 years): deadlines are `now + timeout` plus
/// margins, and a longer one (`Duration::MAX` as "no timeout") would overflow `Instant`.
pub const MAX_TIMEOUT_MS: u64 = 1_000_000_000_000;

/// The page size the symmetric heap is rounded up to: the system's, and at least 4096.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions; it only reads a constant.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ps > 0 {
        (ps as usize).max(4096)
    } else {
        4096
    }
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        with_process_env(|get| Self::from_lookup(get))
    }

    /// The checks [`Settings::from_lookup`] makes on each value, for settings built or
    /// changed in code (every PE start runs them): the heap holds the runtime region and
    /// is whole pages, the timeout is from 1 ms to [`MAX_TIMEOUT_MS`], the fabric chunk a
    /// power of two from 8 KiB to 1 MiB, the queue-state period from 10 ms to 60 s.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("Settings: {what}")));
        let size = self.symmetric_size;
        if size < MIN_SYMMETRIC_SIZE || size % page_size() != 0 {
            return bad(format!(
                "symmetric heap size {size} bytes: it must be at least {MIN_SYMMETRIC_SIZE} \
                 bytes (1 MiB, which holds the {}-byte runtime region) and a multiple of the \
                 page size ({}) (RSHMEM_SYMMETRIC_SIZE)",
                crate::heap::RESERVED_BYTES,
                page_size()
            ));
        }
        if self.timeout < Duration::from_millis(1)
            || self.timeout > Duration::from_millis(MAX_TIMEOUT_MS)
        {
            return bad(format!(
                "timeout {:?}: it must be from 1 ms to 10^12 ms (RSHMEM_TIMEOUT_MS; no wait is \
                 unbounded)",
                self.timeout
            ));
        }
        let c = self.fabric_chunk;
        if !c.is_power_of_two() || !(8 << 10..=1 << 20).contains(&c) {
            return bad(format!(
                "fabric chunk {c} bytes: it must be a power of two from 8 KiB to 1 MiB \
                 (RSHMEM_FABRIC_CHUNK)"
            ));
        }
        if let Some(p) = self.debug_queues {
            if !(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&p) {
                return bad(format!(
                    "queue-state period {p:?}: it must be from 10 ms to 60 s, or None \
                     (RSHMEM_DEBUG_QUEUES)"
                ));
            }
        }
        Ok(())
    }

    /// Parses the settings through `get`. Defaults: heap [`DEFAULT_SYMMETRIC_SIZE`], timeout
    /// [`DEFAULT_TIMEOUT_MS`], no token, node id [`default_node_id`], root hosted by rank 0.
    /// The heap size is rounded up to [`page_size`] silently.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        const SIZE: &str = "RSHMEM_SYMMETRIC_SIZE";
        let symmetric_size = match get(SIZE) {
            None => DEFAULT_SYMMETRIC_SIZE,
            Some(v) => {
                let n = parse_size(&v).map_err(|reason| env_err(SIZE, &v, reason))?;
                if n < MIN_SYMMETRIC_SIZE {
                    return Err(env_err(
                        SIZE,
                        &v,
                        "the symmetric heap must be at least 1 MiB",
                    ));
                }
                let page = page_size();
                n.checked_next_multiple_of(page)
                    .ok_or_else(|| env_err(SIZE, &v, "too large to round up to the page size"))?
            }
        };
        const TIMEOUT: &str = "RSHMEM_TIMEOUT_MS";
        let timeout_ms = match get(TIMEOUT) {
            None => DEFAULT_TIMEOUT_MS,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(0) => return Err(env_err(TIMEOUT, &v, "the timeout must be at least 1 ms")),
                Ok(ms) if ms > MAX_TIMEOUT_MS => {
                    return Err(env_err(
                        TIMEOUT,
                        &v,
                        "the timeout must be at most 10^12 ms (about 31 years)",
                    ))
                }
                Ok(ms) => ms,
                Err(_) => return Err(env_err(TIMEOUT, &v, "expected milliseconds as an integer")),
            },
        };
        let token = get("RSHMEM_TOKEN");
        let node_id = match get("RSHMEM_NODE_ID") {
            Some(v) if v.trim().is_empty() => {
                return Err(env_err("RSHMEM_NODE_ID", &v, "must not be empty"))
            }
            Some(v) => v.trim().to_string(),
            None => default_node_id(),
        };
        let root_external = match get("RSHMEM_ROOT") {
            None => false,
            Some(v) => match v.trim() {
                "self" => false,
                "external" => true,
                _ => {
                    return Err(env_err(
                        "RSHMEM_ROOT",
                        &v,
                        "expected \"self\" (rank 0 hosts the bootstrap root) or \"external\" \
                         (the launcher hosts it)",
                    ))
                }
            },
        };
        let transport = match get("RSHMEM_TRANSPORT") {
            None => TransportMode::Auto,
            Some(v) => match v.trim() {
                "auto" => TransportMode::Auto,
                "p2p" => TransportMode::P2p,
                "proxy" => TransportMode::Proxy,
                "ibgda" => TransportMode::Ibgda,
                _ => return Err(env_err(
                    "RSHMEM_TRANSPORT",
                    &v,
                    "expected \"auto\" (p2p to node-local peers, proxy to the others), \"p2p\", \
                         \"proxy\" (everything through the soft HCA) or \"ibgda\" (GPU PEs: \
                         everything through a ConnectX NIC)",
                )),
            },
        };
        let proxy_fabric = match get("RSHMEM_PROXY_BACKEND") {
            None => false,
            Some(v) => match v.trim() {
                "local" => false,
                "fabric" => true,
                _ => {
                    return Err(env_err(
                        "RSHMEM_PROXY_BACKEND",
                        &v,
                        "expected \"local\" (node-local peers through memory mapped here) or \
                         \"fabric\" (through libfabric, as peers on other nodes)",
                    ))
                }
            },
        };
        let fabric_chunk = match get("RSHMEM_FABRIC_CHUNK") {
            None => DEFAULT_FABRIC_CHUNK,
            Some(v) => match parse_size(v.trim()) {
                Ok(n) if n.is_power_of_two() && (8 << 10..=1 << 20).contains(&n) => n,
                _ => {
                    return Err(env_err(
                        "RSHMEM_FABRIC_CHUNK",
                        &v,
                        "expected a power of two from 8K to 1M (bytes per soft-HCA WQE to a \
                         libfabric peer)",
                    ))
                }
            },
        };
        let debug_queues = match get("RSHMEM_DEBUG_QUEUES") {
            None => None,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(0) => None,
                Ok(1) => Some(Duration::from_millis(100)),
                Ok(ms) if (10..=60_000).contains(&ms) => Some(Duration::from_millis(ms)),
                _ => {
                    return Err(env_err(
                        "RSHMEM_DEBUG_QUEUES",
                        &v,
                        "expected 0 (off), 1 (publish queue state every 100 ms) or a period \
                         in ms from 10 to 60000",
                    ))
                }
            },
        };
        let fabric = FabricSwitches {
            handover: choice(&get, "RSHMEM_ENGINE_HANDOVER", &["0", "1"], "1")? == "1",
            lazy_confirm: choice(&get, "RSHMEM_FABRIC_CONFIRM", &["eager", "lazy"], "lazy")?
                == "lazy",
            delivery_complete: choice(
                &get,
                "RSHMEM_FABRIC_DELIVERY",
                &["flush", "complete"],
                "flush",
            )? == "complete",
        };
        let p2p_assist = match choice(&get, "RSHMEM_P2P_ASSIST", &["auto", "1", "0"], "auto")? {
            "1" => crate::assist::AssistMode::On,
            "0" => crate::assist::AssistMode::Off,
            _ => crate::assist::AssistMode::Auto,
        };
        let bind = match choice(&get, "RSHMEM_BIND", &["auto", "core", "none"], "auto")? {
            "core" => crate::affinity::BindMode::Core,
            "none" => crate::affinity::BindMode::None,
            _ => crate::affinity::BindMode::Auto,
        };
        let hca = get("RSHMEM_HCA")
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let ibgda_cpu_doorbell =
            choice(&get, "RSHMEM_IBGDA_DOORBELL", &["auto", "cpu"], "auto")? == "cpu";
        // Strict, as every other switch: `off` or `false` used to leave the checks on.
        let device_checks = choice(&get, "RSHMEM_DEVICE_CHECKS", &["1", "0"], "1")? == "1";
        let ib = IbSettings::from_lookup(&get)?;
        Ok(Settings {
            ib,
            hca,
            ibgda_cpu_doorbell,
            device_checks,
            p2p_assist,
            bind,
            debug_queues,
            fabric_chunk,
            fabric,
            symmetric_size,
            timeout: Duration::from_millis(timeout_ms),
            token,
            node_id,
            root_external,
            transport,
            proxy_fabric,
        })
    }
}

/// This machine's default node id: `hostname:` followed by the first 8 characters of
/// `/proc/sys/kernel/random/boot_id` (just the host name where that file is unreadable).
///
/// PEs with equal node ids are assumed to share memory. Containers or network namespaces
/// on one host that must not share memory set RSHMEM_NODE_ID instead.
pub fn default_node_id() -> String {
    let host = hostname().unwrap_or_else(|| "localhost".to_string());
    match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        Ok(id) => {
            let id: String = id.trim().chars().take(8).collect();
            format!("{host}:{id}")
        }
        Err(_) => host,
    }
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is a valid writable buffer of buf.len() bytes; gethostname writes at
    // most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    // POSIX leaves truncated names possibly unterminated; take up to the first NUL or all.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

/// Parses sizes like `512M`, `2G`, `64k`, `1GiB`, `4096`.
///
/// Suffixes are case-insensitive powers of 1024: `k`/`kb`/`kib`, `m`, `g`, `t` (and `b`
/// for bytes). Whitespace around the value and between number and suffix is allowed.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty size".to_string());
    }
    if t.starts_with('-') {
        return Err("a size cannot be negative".to_string());
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, rest) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!("{t:?} does not start with a number"));
    }
    if rest.starts_with(['.', ',']) {
        return Err("fractional sizes are not supported; use a smaller unit (e.g. 1536M)".into());
    }
    let n: usize = num
        .parse()
        .map_err(|_| format!("{num} is too large for this machine"))?;
    let shift = match rest.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size suffix {other:?} (expected k, M, G or T, optionally with B or iB)"
            ))
        }
    };
    n.checked_mul(1usize << shift)
        .ok_or_else(|| format!("{t} is too large for this machine"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn launch(pairs: &[(&str, &str)]) -> Result<Option<LaunchInfo>> {
        LaunchInfo::from_lookup(env(pairs))
    }

    #[test]
    fn fabric_switches_default_parse_and_refuse() {
        let d = Settings::from_lookup(env(&[])).unwrap().fabric;
        assert_eq!(
            d,
            FabricSwitches {
                handover: true,
                lazy_confirm: true,
                delivery_complete: false
            }
        );
        let s = Settings::from_lookup(env(&[
            ("RSHMEM_ENGINE_HANDOVER", "0"),
            ("RSHMEM_FABRIC_CONFIRM", "eager"),
            ("RSHMEM_FABRIC_DELIVERY", "complete"),
        ]))
        .unwrap()
        .fabric;
        assert_eq!(
            s,
            FabricSwitches {
                handover: false,
                lazy_confirm: false,
                delivery_complete: true
            }
        );
        for (var, value, allowed) in [
            ("RSHMEM_ENGINE_HANDOVER", "yes", "0, 1"),
            ("RSHMEM_FABRIC_CONFIRM", "later", "eager, lazy"),
            ("RSHMEM_FABRIC_DELIVERY", "now", "flush, complete"),
        ] {
            let e = Settings::from_lookup(env(&[(var, value)])).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(allowed), "{text}");
            assert_eq!(env_var_of(e), (var.to_string(), value.to_string()));
        }
    }

    fn env_var_of(e: Error) -> (String, String) {
        match e {
            Error::Env { var, value, .. } => (var, value),
            other => panic!("expected Error::Env, got {other:?}"),
        }
    }

    #[test]
    fn no_launcher_is_none() {
        assert_eq!(launch(&[("MASTER_ADDR", "x")]).unwrap(), None);
    }

    #[test]
    fn rshmem_vars() {
        let info = launch(&[
            ("RSHMEM_RANK", "3"),
            ("RSHMEM_WORLD_SIZE", "8"),
            ("RSHMEM_LOCAL_RANK", "1"),
            ("RSHMEM_LOCAL_SIZE", "4"),
            ("RSHMEM_MASTER_ADDR", "10.0.0.1"),
            ("RSHMEM_MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            info,
            LaunchInfo {
                source: LaunchSource::Rshmem,
                rank: 3,
                world_size: 8,
                local_rank: Some(1),
                local_size: Some(4),
                master_addr: Some("10.0.0.1".into()),
                master_port: Some(29500),
            }
        );
    }

    #[test]
    fn torchrun_vars() {
        let info = launch(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "5"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(info.source, LaunchSource::Torchrun);
        assert_eq!((info.rank, info.world_size), (5, 16));
        assert_eq!((info.local_rank, info.local_size), (Some(5), Some(8)));
        assert_eq!(info.master_addr.as_deref(), Some("node0"));
        // torchrun's agent listens on MASTER_PORT: the root takes the next one...
        assert_eq!(info.master_port, Some(1235));
        // ...unless RSHMEM_MASTER_PORT names one.
        let with = |extra: (&'static str, &'static str)| {
            launch(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "2"),
                ("MASTER_PORT", "65535"),
                extra,
            ])
        };
        let info = with(("RSHMEM_MASTER_PORT", "29600")).unwrap().unwrap();
        assert_eq!(info.master_port, Some(29600));
        let e = with(("MASTER_ADDR", "node0")).unwrap_err().to_string();
        assert!(
            e.contains("MASTER_PORT + 1") && e.contains("RSHMEM_MASTER_PORT"),
            "{e}"
        );
        // A count with a sign is refused, as the sizes are.
        let e = launch(&[("RANK", "+1"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(env_var_of(e), ("RANK".to_string(), "+1".to_string()));
    }

    #[test]
    fn openmpi_vars() {
        let info = launch(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(info.source, LaunchSource::OpenMpi);
        assert_eq!((info.rank, info.world_size), (2, 4));
        assert_eq!((info.local_rank, info.local_size), (Some(0), Some(2)));
        assert_eq!((info.master_addr, info.master_port), (None, None));
    }

    #[test]
    fn slurm_vars() {
        let info = launch(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "12"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NTASKS_PER_NODE", "4"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(info.source, LaunchSource::Slurm);
        assert_eq!((info.rank, info.world_size), (7, 12));
        assert_eq!((info.local_rank, info.local_size), (Some(3), Some(4)));

        // A compressed per-node list says nothing about this node: no local size.
        let info = launch(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "12"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "4(x2),2(x2)"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((info.local_rank, info.local_size), (Some(1), None));
    }

    #[test]
    fn pmi_vars() {
        let info = launch(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")])
            .unwrap()
            .unwrap();
        assert_eq!(info.source, LaunchSource::Pmi);
        assert_eq!((info.rank, info.world_size), (0, 1));
        assert_eq!((info.local_rank, info.local_size), (None, None));
    }

    #[test]
    fn precedence() {
        // rshmem beats torchrun; torchrun beats Open MPI beats Slurm beats PMI.
        let info = launch(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("RSHMEM_RANK", "0"),
            ("RSHMEM_WORLD_SIZE", "3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (info.source, info.rank, info.world_size),
            (LaunchSource::Rshmem, 0, 3)
        );
        let info = launch(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("RANK", "4"),
            ("WORLD_SIZE", "5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((info.source, info.rank), (LaunchSource::Torchrun, 4));
        let info = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "9"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((info.source, info.world_size), (LaunchSource::OpenMpi, 9));
        let info = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((info.source, info.world_size), (LaunchSource::Pmi, 5));
        let info = launch(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")])
            .unwrap()
            .unwrap();
        assert_eq!((info.source, info.world_size), (LaunchSource::Slurm, 2));
        // rshmem's job variables without any rank variable are refused, naming the
        // variable and the rank variables; RSHMEM_WORLD_SIZE=1 and blank ones are not.
        for (var, value) in [
            ("RSHMEM_WORLD_SIZE", "4"),
            ("RSHMEM_MASTER_ADDR", "head"),
            ("RSHMEM_MASTER_PORT", "29500"),
            ("RSHMEM_ROOT", "external"),
        ] {
            let e = launch(&[(var, value)]).unwrap_err().to_string();
            assert!(
                e.contains(var)
                    && e.contains(value)
                    && e.contains("no rank variable is (RSHMEM_RANK, RANK, OMPI_COMM_WORLD_RANK")
                    && e.contains("would run alone"),
                "{e}"
            );
        }
        assert!(launch(&[("RSHMEM_WORLD_SIZE", "1")]).unwrap().is_none());
        assert!(launch(&[("RSHMEM_ROOT", "self")]).unwrap().is_none());
        assert!(launch(&[("RSHMEM_MASTER_ADDR", " ")]).unwrap().is_none());
        // A size variable alone does not make a set present.
        let info = launch(&[
            ("RSHMEM_WORLD_SIZE", "4"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(info.source, LaunchSource::Pmi);
    }

    #[test]
    fn master_addr_blank_falls_back_and_host_port_is_refused() {
        let base = [("PMI_RANK", "0"), ("PMI_SIZE", "1"), ("MASTER_PORT", "1")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            launch(&v)
        };
        let info = with(&[("RSHMEM_MASTER_ADDR", " "), ("MASTER_ADDR", "node0")])
            .unwrap()
            .unwrap();
        assert_eq!(info.master_addr.as_deref(), Some("node0"));
        for a in ["node0:29500", "[fe80::1]:29500"] {
            let e = with(&[("RSHMEM_MASTER_ADDR", a)]).unwrap_err();
            assert_eq!(env_var_of(e), ("RSHMEM_MASTER_ADDR".into(), a.into()));
        }
        // IPv6 addresses, bare or bracketed, stay addresses.
        for a in ["fe80::1", "[fe80::1]", "::1"] {
            let v = [
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "1"),
                ("MASTER_PORT", "1"),
                ("MASTER_ADDR", a),
            ];
            let info = launch(&v).unwrap().unwrap();
            assert_eq!(info.master_addr.as_deref(), Some(a));
        }
    }

    #[test]
    fn a_world_size_past_the_limit_is_refused() {
        let e = launch(&[("RANK", "0"), ("WORLD_SIZE", "4000000000")]).unwrap_err();
        assert_eq!(env_var_of(e), ("WORLD_SIZE".into(), "4000000000".into()));
        assert!(launch(&[("RANK", "0"), ("WORLD_SIZE", "1048576")]).is_ok());
    }

    #[test]
    fn master_addr_precedence() {
        let info = launch(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "1"),
            ("MASTER_ADDR", "a"),
            ("MASTER_PORT", "1"),
            ("RSHMEM_MASTER_ADDR", "b"),
            ("RSHMEM_MASTER_PORT", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(info.master_addr.as_deref(), Some("b"));
        assert_eq!(info.master_port, Some(2));
    }

    #[test]
    fn launch_errors() {
        let e = launch(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(env_var_of(e), ("RANK".into(), "x".into()));
        let e = launch(&[("RANK", "0"), ("WORLD_SIZE", "two")]).unwrap_err();
        assert_eq!(env_var_of(e), ("WORLD_SIZE".into(), "two".into()));
        let e = launch(&[("RANK", "-1"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(env_var_of(e), ("RANK".into(), "-1".into()));
        let e = launch(&[("RANK", "2"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(env_var_of(e), ("RANK".into(), "2".into()));
        let e = launch(&[("RANK", "0"), ("WORLD_SIZE", "0")]).unwrap_err();
        assert_eq!(env_var_of(e), ("WORLD_SIZE".into(), "0".into()));
        let e = launch(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "a")]).unwrap_err();
        assert_eq!(env_var_of(e), ("LOCAL_RANK".into(), "a".into()));
        let e = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ])
        .unwrap_err();
        assert_eq!(env_var_of(e).0, "LOCAL_RANK");
        let e = launch(&[("RSHMEM_RANK", "0")]).unwrap_err();
        assert_eq!(env_var_of(e), ("RSHMEM_WORLD_SIZE".into(), "".into()));
        for bad in ["70000", "http", "0", "-5"] {
            let e =
                launch(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", bad)]).unwrap_err();
            assert_eq!(env_var_of(e), ("MASTER_PORT".into(), bad.into()));
        }
        let e = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("RSHMEM_MASTER_PORT", "x"),
        ])
        .unwrap_err();
        assert_eq!(env_var_of(e), ("RSHMEM_MASTER_PORT".into(), "x".into()));
    }

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings> {
        Settings::from_lookup(env(pairs))
    }

    #[test]
    fn settings_defaults() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.symmetric_size, DEFAULT_SYMMETRIC_SIZE);
        assert_eq!(s.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert_eq!(s.token, None);
        assert_eq!(s.node_id, default_node_id());
        assert!(!s.root_external);
        assert_eq!(s.transport, TransportMode::Auto);
    }

    #[test]
    fn transport_setting() {
        for (v, m) in [
            ("auto", TransportMode::Auto),
            ("p2p", TransportMode::P2p),
            (" proxy ", TransportMode::Proxy),
            ("ibgda", TransportMode::Ibgda),
        ] {
            assert_eq!(settings(&[("RSHMEM_TRANSPORT", v)]).unwrap().transport, m);
        }
        let s = settings(&[]).unwrap();
        assert_eq!((s.hca, s.ibgda_cpu_doorbell), (None, false));
        assert!(s.device_checks);
        assert!(
            !settings(&[("RSHMEM_DEVICE_CHECKS", " 0 ")])
                .unwrap()
                .device_checks
        );
        let e = settings(&[("RSHMEM_DEVICE_CHECKS", "off")]).unwrap_err();
        assert!(e.to_string().contains("RSHMEM_DEVICE_CHECKS"), "{e}");
        assert_eq!(s.ib, IbSettings::default());
        assert_eq!(
            settings(&[("RSHMEM_IB_SL", " "), ("RSHMEM_IB_GID_INDEX", "")])
                .unwrap()
                .ib,
            IbSettings::default()
        );
        assert_eq!(s.ib.timeout, 19);
        let ib = settings(&[
            ("RSHMEM_IB_GID_INDEX", "3"),
            ("RSHMEM_IB_TC", " 106 "),
            ("RSHMEM_IB_SL", "3"),
            ("RSHMEM_IB_TIMEOUT", "18"),
        ])
        .unwrap()
        .ib;
        assert_eq!(
            ib,
            IbSettings {
                gid_index: Some(3),
                traffic_class: 106,
                sl: 3,
                timeout: 18
            }
        );
        for (var, v, want) in [
            (
                "RSHMEM_IB_SL",
                "16",
                "expected a service level from 0 to 15",
            ),
            (
                "RSHMEM_IB_TC",
                "256",
                "expected a traffic class from 0 to 255",
            ),
            ("RSHMEM_IB_TIMEOUT", "0", "expected an ACK timeout exponent"),
            (
                "RSHMEM_IB_GID_INDEX",
                "-1",
                "expected a GID table index from 0 to 255",
            ),
            (
                "RSHMEM_IB_GID_INDEX",
                "256",
                "expected a GID table index from 0 to 255",
            ),
        ] {
            let e = settings(&[(var, v)]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(want), "{e}");
        }
        let s = settings(&[
            ("RSHMEM_HCA", " mlx5_1:1 "),
            ("RSHMEM_IBGDA_DOORBELL", "cpu"),
        ])
        .unwrap();
        assert_eq!(
            (s.hca.as_deref(), s.ibgda_cpu_doorbell),
            (Some("mlx5_1:1"), true)
        );
        assert!(
            !settings(&[("RSHMEM_IBGDA_DOORBELL", "auto")])
                .unwrap()
                .ibgda_cpu_doorbell
        );
        assert_eq!(settings(&[]).unwrap().debug_queues, None);
        assert_eq!(
            settings(&[("RSHMEM_DEBUG_QUEUES", "0")])
                .unwrap()
                .debug_queues,
            None
        );
        assert_eq!(
            settings(&[("RSHMEM_DEBUG_QUEUES", "1")])
                .unwrap()
                .debug_queues,
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            settings(&[("RSHMEM_DEBUG_QUEUES", " 250 ")])
                .unwrap()
                .debug_queues,
            Some(Duration::from_millis(250))
        );
        for bad in ["5", "yes", "60001", "-1"] {
            let e = settings(&[("RSHMEM_DEBUG_QUEUES", bad)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("RSHMEM_DEBUG_QUEUES") && e.contains("0 (off)"),
                "{e}"
            );
        }
        let e = settings(&[("RSHMEM_TRANSPORT", "ibverbs")]).unwrap_err();
        assert!(
            e.to_string().contains("RSHMEM_TRANSPORT") && e.to_string().contains("\"ibgda\""),
            "{e}"
        );
        let e = settings(&[("RSHMEM_IBGDA_DOORBELL", "gpu")]).unwrap_err();
        assert!(e.to_string().contains("RSHMEM_IBGDA_DOORBELL"), "{e}");
    }

    #[test]
    fn settings_values() {
        let s = settings(&[
            ("RSHMEM_SYMMETRIC_SIZE", "2G"),
            ("RSHMEM_TIMEOUT_MS", "1500"),
            ("RSHMEM_TOKEN", "s3cret"),
            ("RSHMEM_NODE_ID", "ns-a"),
            ("RSHMEM_ROOT", "external"),
        ])
        .unwrap();
        assert_eq!(s.symmetric_size, 2 << 30);
        assert_eq!(s.timeout, Duration::from_millis(1500));
        assert_eq!(s.token.as_deref(), Some("s3cret"));
        assert_eq!(s.node_id, "ns-a");
        assert!(s.root_external);
        assert!(!settings(&[("RSHMEM_ROOT", "self")]).unwrap().root_external);
    }

    #[test]
    fn symmetric_size_rounds_up_to_page() {
        let page = page_size();
        let s = settings(&[("RSHMEM_SYMMETRIC_SIZE", "1048577")]).unwrap();
        assert_eq!(s.symmetric_size, (1 << 20) + page);
        let s = settings(&[("RSHMEM_SYMMETRIC_SIZE", "1M")]).unwrap();
        assert_eq!(s.symmetric_size, 1 << 20);
    }

    #[test]
    fn settings_errors() {
        for (var, value) in [
            ("RSHMEM_SYMMETRIC_SIZE", "0"),
            ("RSHMEM_SYMMETRIC_SIZE", "lots"),
            ("RSHMEM_SYMMETRIC_SIZE", "1023K"),
            ("RSHMEM_SYMMETRIC_SIZE", "1.5G"),
            ("RSHMEM_TIMEOUT_MS", "0"),
            ("RSHMEM_TIMEOUT_MS", "5s"),
            ("RSHMEM_TIMEOUT_MS", "1000000000001"),
            ("RSHMEM_NODE_ID", " "),
            ("RSHMEM_ROOT", "rank0"),
        ] {
            let e = settings(&[(var, value)]).unwrap_err();
            assert_eq!(env_var_of(e), (var.to_string(), value.to_string()));
        }
    }

    #[test]
    fn default_node_id_shape() {
        let id = default_node_id();
        assert!(!id.is_empty());
        if std::path::Path::new("/proc/sys/kernel/random/boot_id").exists() {
            let (_, boot) = id.rsplit_once(':').unwrap();
            assert_eq!(boot.len(), 8);
        }
    }

    #[test]
    fn parse_size_accepts() {
        let cases: &[(&str, usize)] = &[
            ("4096", 4096),
            ("0", 0),
            ("64k", 64 << 10),
            ("64K", 64 << 10),
            ("64KiB", 64 << 10),
            ("64KB", 64 << 10),
            ("64kb", 64 << 10),
            ("512M", 512 << 20),
            ("512MiB", 512 << 20),
            ("2G", 2 << 30),
            ("1GiB", 1 << 30),
            ("1T", 1 << 40),
            ("  8m \n", 8 << 20),
            ("3 G", 3 << 30),
            ("100B", 100),
        ];
        for &(s, n) in cases {
            assert_eq!(parse_size(s), Ok(n), "{s:?}");
        }
    }

    #[test]
    fn parse_size_rejects() {
        for s in [
            "",
            "   ",
            "-1",
            "-4K",
            "1.5G",
            "0.5",
            "12X",
            "10 PB",
            "G",
            "k64",
            "99999999999999999999999",
            "16777216T",
            "1_000",
            "+5",
        ] {
            assert!(parse_size(s).is_err(), "{s:?} should be rejected");
        }
    }
}
