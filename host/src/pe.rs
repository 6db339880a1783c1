//! The processing element: a handle that owns one PE's bootstrap connection, symmetric heap
//! and peer mappings.
//!
//! A [`Pe`] is a value, not process-global state: a process may host one PE (the usual
//! case, started by `rshmem run`, torchrun, mpirun or srun) or several, one thread each
//! ([`run_threads`]), all with their own heap and bootstrap connection.
//!
//! Thread use: RMA, atomics, signals and waits take `&self` and may be called from any
//! thread that can reach the `Pe` (it is `Sync`). Collective calls (allocation, team
//! creation, barriers) must be made by one thread at a time per PE, in the same order on
//! every PE of the team — as in OpenSHMEM.

use crate::atomic::AtomicWord;
use crate::bootstrap::{Bootstrap, Group, JoinParams, Liveness, Root};
use crate::config::{LaunchInfo, Settings, TransportMode};
use crate::error::{Error, Result};
use crate::fabric::RemoteRegion;
use crate::heap::{
    self, psync_offset, Allocator, Segment, AGREE_WORD0, AGREE_WORDS, MAX_ALIGN, RESERVED_BYTES,
};
use crate::softhca::fabric::FabricPeer;
use crate::softhca::mr::{Access, MrTable};
use crate::softhca::proxy::{
    insert_fabric_peer, install_fabric, PeerKind, Proxy, ProxyBackend, ProxyPeer,
};
use crate::softhca::LocalPeer;
use crate::team::Team;
use crate::types::{Element, SymPtr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where rank 0 listens for the root that the other PEs reach at `root_addr` (`host:port`
/// made of `host` and `port`): every interface of the address's family at that port, as
/// torch's TCPStore and NCCL's bootstrap do — the host name can resolve to a loopback
/// address on the root's own host (Debian's `127.0.1.1` entry), where a bind to it would
/// refuse every other host. The token still decides who joins. A loopback address written
/// as such (or `localhost`) stays loopback-only: the job is on one host.
fn root_listen_addr(root_addr: &str, host: &str, port: u16) -> Result<String> {
    use std::net::ToSocketAddrs;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback_literal = host
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback());
    if loopback_literal || host.eq_ignore_ascii_case("localhost") {
        return Ok(root_addr.to_string());
    }
    let first = root_addr
        .to_socket_addrs()
        .map_err(|e| {
            Error::bootstrap(
                format!("resolving the bootstrap root address {root_addr}"),
                e,
            )
        })?
        .next()
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the bootstrap root address {root_addr} resolves to no address"
            ))
        })?;
    Ok(match first {
        std::net::SocketAddr::V4(_) => format!("0.0.0.0:{port}"),
        std::net::SocketAddr::V6(_) => format!("[::]:{port}"),
    })
}

/// Whether `[offset, offset + len)` starts in the user heap, or is the empty allocation
/// (`malloc(0)`: offset 0, nothing in it), on which zero-length operations succeed as
/// OpenSHMEM's do with nelems 0 (a put_signal still signals).
#[inline]
fn in_heap(offset: usize, len: usize) -> bool {
    offset >= RESERVED_BYTES || (offset == 0 && len == 0)
}

/// Source of `Pe::team_owner` (1, 2, ...: 0 is no PE).
static NEXT_TEAM_OWNER: AtomicU64 = AtomicU64::new(1);

/// Everything needed to start one PE explicitly (instead of from the environment).
#[derive(Debug, Clone)]
pub struct PeConfig {
    pub rank: usize,
    pub world_size: usize,
    /// `host:port` of the bootstrap root.
    pub root_addr: String,
    pub token: String,
    pub settings: Settings,
}

/// How a PE reaches one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerPath {
    /// Loads and stores into its heap, mapped here.
    P2p,
    /// Through the soft HCA (mlx5 queues).
    Proxy,
    /// No transport reaches it (another node, no network backend yet).
    Unreachable,
}

/// Where an operation goes, once its PE and range are validated.
pub(crate) enum Route {
    /// The target's address in this process.
    P2p(*mut u8),
    /// Through the proxy, at this heap offset.
    Proxy,
}

/// One processing element.
///
/// `Send + Sync` (checked below): RMA may be issued from any thread; collectives from one
/// thread at a time.
pub struct Pe {
    rank: usize,
    n_pes: usize,
    boot: Option<Bootstrap>,
    pub(crate) live: Arc<Liveness>,
    pub(crate) settings: Settings,
    /// This PE's thread's CPU binding from init (`RSHMEM_BIND`, affinity.rs); dropping it
    /// gives the thread its mask back.
    binding: Option<crate::affinity::Binding>,
    job_id: String,
    heap_size: usize,
    /// How each peer is reached, by world rank (an enum match, no virtual call, on the p2p
    /// path).
    paths: Vec<PeerPath>,
    /// Per PE: the address here of its heap when it is reached by load/store (`PeerPath::P2p`),
    /// else 0 — the one table the hot path of [`Pe::route`] reads.
    direct: Box<[usize]>,
    /// The proxy transport (soft HCA), when some peer is reached through it. Declared
    /// before `peers`: it detaches its queue pairs from the engine before the mappings
    /// the engine writes into go away.
    pub(crate) proxy: Option<Proxy>,
    /// Which peers the proxy reaches through libfabric (the rest: node-local memory).
    fabric_to: Vec<bool>,
    /// The libfabric provider of this process's endpoint, when one was opened.
    fabric_provider: Option<String>,
    /// The process engine and this PE's fabric heap registration, when this PE reaches
    /// nobody by proxy but peers reach it through the fabric (its engine must poll).
    _fabric_keepalive: Option<(
        Arc<crate::softhca::engine::SoftHca<ProxyBackend>>,
        Arc<crate::fabric::MemoryRegion>,
    )>,
    /// An error a `quiet()` (which returns nothing) met; reported by the next `try_quiet`.
    pub(crate) deferred: crate::rma::KeptError,
    /// Target-assisted large p2p puts (assist.rs), when enabled. Declared before `peers`:
    /// it refers into this PE's own mapping.
    pub(crate) assist: Option<crate::assist::Assist>,
    /// Mapping of every PE's heap that this process can address (same node), by world rank;
    /// shared with the other PEs of this process (`heap::open_node_segment`).
    peers: Vec<Option<Arc<Segment>>>,
    alloc: Mutex<Allocator>,
    world: Team,
    node: Team,
    /// Team slots in use on this PE (bit i = slot i).
    pub(crate) slots: Mutex<u64>,
    /// This PE's mark on the team handles it makes (`Team`'s owner check).
    pub(crate) team_owner: u64,
    /// Heap offsets of the distributed locks this PE holds, waits for, or keeps a
    /// stranded ticket of (lock.rs).
    pub(crate) locks: Mutex<Vec<(usize, crate::lock::Claim)>>,
    /// Polls a waiting PE spins before it starts yielding (see rma.rs).
    pub(crate) spin_polls: u64,
    /// The bootstrap root, when this PE hosts it (rank 0 under torchrun/mpirun, or a
    /// single PE started without a launcher).
    root: Option<Root>,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Pe>();
};

impl std::fmt::Debug for Pe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pe")
            .field("rank", &self.rank)
            .field("n_pes", &self.n_pes)
            .field("heap_size", &self.heap_size)
            .finish_non_exhaustive()
    }
}

impl Pe {
    /// Starts this process's PE from the environment (see the README for the variables):
    /// `rshmem run`, torchrun, Open MPI, Slurm or PMI variables; without any, a job of one PE.
    ///
    /// Rank 0 hosts the bootstrap root at `RSHMEM_MASTER_ADDR:RSHMEM_MASTER_PORT` (or
    /// `MASTER_ADDR:MASTER_PORT`; under torchrun `MASTER_PORT + 1`, torchrun's own store
    /// holding `MASTER_PORT`), listening on every interface unless the address is a
    /// loopback one, unless `RSHMEM_ROOT=external` says a launcher hosts it.
    pub fn init() -> Result<Pe> {
        Pe::init_from_settings(Settings::from_env()?)
    }

    /// [`Pe::init`] with settings given instead of read from the environment (the launch
    /// variables still come from it).
    pub fn init_from_settings(settings: Settings) -> Result<Pe> {
        Pe::init_unbound(settings)?.bind_thread()
    }

    /// Binds the calling thread, this PE's, to a CPU as `RSHMEM_BIND` says (affinity.rs),
    /// once init has started its helper threads (they keep the wider mask).
    fn bind_thread(mut self) -> Result<Pe> {
        let all_p2p = self.world.p2p() && self.proxy.is_none();
        self.binding = crate::affinity::bind_pe(
            self.settings.bind,
            self.node.my_pe(),
            self.node.n_pes(),
            all_p2p,
        )?;
        Ok(self)
    }

    /// The CPU this PE's thread was bound to at init (`RSHMEM_BIND`), or None. The
    /// binding lasts as long as this `Pe`.
    pub fn bound_cpu(&self) -> Option<usize> {
        self.binding.as_ref().map(|b| b.cpu())
    }

    /// [`Pe::init_from_settings`] without binding the thread (GPU PEs' CPU side).
    pub(crate) fn init_unbound(settings: Settings) -> Result<Pe> {
        match LaunchInfo::from_env()? {
            None => {
                let token = random_token()?;
                let root = Root::bind("127.0.0.1:0", 1, &token)?;
                let cfg = PeConfig {
                    rank: 0,
                    world_size: 1,
                    root_addr: root.local_addr().to_string(),
                    token,
                    settings,
                };
                Pe::init_with(cfg, Some(root))
            }
            Some(li) => {
                // An empty token (`RSHMEM_TOKEN=$TOKEN` with TOKEN unset) is refused, not
                // taken as a token: a job without a secret would admit any PE without one.
                if let Some(t) = settings.token.as_deref().filter(|t| t.trim().is_empty()) {
                    return Err(Error::Env {
                        var: "RSHMEM_TOKEN".into(),
                        value: t.to_string(),
                        reason: "must not be empty (the variable it was set from is probably \
                                 unset): every PE of a job passes the same secret"
                            .into(),
                    });
                }
                let token = settings.token.clone().ok_or_else(|| {
                    Error::MissingEnv(format!(
                        "RSHMEM_TOKEN is not set: every PE of a job must carry the same job token \
                         (rank/size came from {:?} variables). `rshmem run` sets it; with other \
                         launchers export RSHMEM_TOKEN=<secret> to every PE (e.g. mpirun -x RSHMEM_TOKEN)",
                        li.source
                    ))
                })?;
                let (addr, port) = match (&li.master_addr, li.master_port) {
                    (Some(a), Some(p)) => (a.clone(), p),
                    _ => {
                        // A batch script's own environment has SLURM_PROCID=0 and
                        // SLURM_NTASKS: a program started there without srun looks like
                        // rank 0 of the allocation.
                        let slurm = if li.source == crate::config::LaunchSource::Slurm {
                            "; or, when this is not a PE of a job (a program run directly in \
                             an sbatch script, which sets SLURM_PROCID and SLURM_NTASKS for \
                             the allocation), start it with srun or unset SLURM_PROCID"
                        } else {
                            ""
                        };
                        return Err(Error::MissingEnv(format!(
                            "the bootstrap root address is not set: export RSHMEM_MASTER_ADDR and \
                             RSHMEM_MASTER_PORT (or MASTER_ADDR and MASTER_PORT) to every PE; rank 0 \
                             listens there (rank/size came from {:?} variables){slurm}",
                            li.source
                        )));
                    }
                };
                let root_addr = if addr.contains(':') && !addr.starts_with('[') {
                    format!("[{addr}]:{port}") // a bare IPv6 address
                } else {
                    format!("{addr}:{port}")
                };
                let root = if li.rank == 0 && !settings.root_external {
                    Some(Root::bind(
                        &root_listen_addr(&root_addr, &addr, port)?,
                        li.world_size,
                        &token,
                    )?)
                } else {
                    None
                };
                let cfg = PeConfig {
                    rank: li.rank,
                    world_size: li.world_size,
                    root_addr,
                    token,
                    settings,
                };
                Pe::init_with(cfg, root)
            }
        }
    }

    /// Starts a PE with explicit parameters. `root`, if given, is kept alive by this PE.
    pub fn init_with(cfg: PeConfig, root: Option<Root>) -> Result<Pe> {
        // A misspelled RSHMEM_* variable would otherwise leave its default in force unsaid.
        crate::config::warn_unknown_env(cfg.rank);
        let settings = cfg.settings;
        // Settings built in code skip the environment's checks (a Duration::MAX timeout
        // overflowed the first deadline; a fabric chunk of 0 panicked in the first put).
        settings.validate()?;
        if settings.transport == TransportMode::Ibgda {
            return Err(Error::Env {
                var: "RSHMEM_TRANSPORT".into(),
                value: "ibgda".into(),
                reason: "ibgda is for GPU PEs (GPU threads write the NIC's queues); CPU PEs \
                         reach peers with \"auto\", \"p2p\" or \"proxy\""
                    .into(),
            });
        }
        let boot = Bootstrap::join(&JoinParams {
            rank: cfg.rank,
            world_size: cfg.world_size,
            root_addr: cfg.root_addr,
            token: cfg.token,
            node_id: settings.node_id.clone(),
            timeout: settings.timeout,
        })?;
        let rank = boot.rank();
        let n = boot.world_size();
        let world_group = Group {
            uid: 0,
            members: (0..n as u32).collect(),
        };
        let live = boot.liveness();
        let job_id = boot.job_id().to_string();

        // Every PE must use the same heap size: offsets are symmetric.
        let sizes = boot.allgather(
            &world_group,
            &(settings.symmetric_size as u64).to_le_bytes(),
        )?;
        let sizes: Vec<u64> = sizes.iter().map(|b| le_u64(b)).collect();
        if sizes.iter().any(|&s| s != sizes[0]) {
            return Err(Error::CollectiveMismatch {
                op: "init (RSHMEM_SYMMETRIC_SIZE)",
                detail: per_pe(&sizes, |s| format!("{s} bytes")),
            });
        }
        let heap_size = settings.symmetric_size;

        // Node-local peers share their heaps through /dev/shm (or memfds where it is too
        // small): each PE publishes where its segment opens, and maps its node peers'.
        let node_ids = boot.node_ids().to_vec();
        let local: Vec<usize> = (0..n).filter(|&r| node_ids[r] == node_ids[rank]).collect();
        let (mine, my_name) = match heap::create_node_segment(
            &job_id,
            rank,
            heap_size,
            heap::mapping_skew(rank),
            local.len(),
        ) {
            Ok((seg, name)) => (Ok(seg), Some(name)),
            Err(e) => (Err(e), None),
        };
        // Whatever happens next, the name goes away when init ends (the file is removed,
        // the memfd closed): by then every node peer has mapped the segment (or init failed
        // and nobody needs it).
        exchange_status(&boot, &world_group, "create its symmetric heap", &mine)?;
        let mine = mine?;
        let my_name = my_name.expect("a created segment has a name");
        // Where each segment opens, with its (device, inode): a peer that reaches another
        // file by that path (another pid namespace) is refused, not mapped.
        let records = boot.allgather(&world_group, &my_name.record())?;
        let mut peers: Vec<Option<Arc<Segment>>> = (0..n).map(|_| None).collect();
        let opened: Result<()> = local.iter().filter(|&&r| r != rank).try_for_each(|&r| {
            peers[r] = Some(heap::open_node_segment(
                &records[r],
                heap_size,
                heap::mapping_skew(r),
            )?);
            Ok(())
        });
        exchange_status(&boot, &world_group, "map its node peers' heaps", &opened)?;
        opened?;
        drop(my_name);
        peers[rank] = Some(mine);

        // Every PE registers its heap in its protection domain and shares (base, key), so
        // any PE may reach it through the soft HCA whatever transport it picked itself.
        let pd = Arc::new(MrTable::new());
        let my_base = peers[rank]
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s.base());
        // SAFETY: the heap mapping lives in `peers` until the Pe drops, after `proxy`
        // (field order) which detaches every QP using this table.
        let heap_key =
            unsafe { pd.register(my_base, my_base as u64, heap_size as u64, Access::ALL) };
        let mode = settings.transport;
        let multi_node = node_ids.iter().any(|id| *id != node_ids[0]);
        // Whether this PE wants the fabric: peers on other nodes (unless p2p only), or
        // RSHMEM_TRANSPORT=proxy with RSHMEM_PROXY_BACKEND=fabric. If any PE wants it,
        // every PE opens an endpoint: peers may pick transports independently, and a
        // target must be reachable whatever it uses itself.
        let want_fabric = (multi_node && mode != TransportMode::P2p)
            || (mode == TransportMode::Proxy && settings.proxy_fabric);
        let mut mine_key = (my_base as u64).to_le_bytes().to_vec();
        mine_key.extend_from_slice(&(heap_key as u64).to_le_bytes());
        mine_key.push(want_fabric as u8);
        let keys = boot.allgather(&world_group, &mine_key)?;
        let any_fabric = keys.iter().any(|k| k.get(16) == Some(&1));
        // How each peer is reached, and whether through the fabric.
        let fabric_to: Vec<bool> = (0..n)
            .map(|r| match (&peers[r], mode) {
                (Some(_), TransportMode::Proxy) => settings.proxy_fabric,
                (Some(_), _) | (None, TransportMode::P2p) => false,
                (None, _) => true,
            })
            .collect();
        let paths: Vec<PeerPath> = (0..n)
            .map(|r| match (&peers[r], mode) {
                (Some(_), TransportMode::Proxy) => PeerPath::Proxy,
                (Some(_), _) => PeerPath::P2p,
                (None, TransportMode::P2p) => PeerPath::Unreachable,
                (None, _) => PeerPath::Proxy,
            })
            .collect();
        let direct: Box<[usize]> = (0..n)
            .map(|r| match (&peers[r], paths[r]) {
                (Some(seg), PeerPath::P2p) => seg.base() as usize,
                _ => 0,
            })
            .collect();
        let need_engine = paths.contains(&PeerPath::Proxy) || any_fabric;
        let hca = if need_engine {
            Some(crate::softhca::proxy::engine()?)
        } else {
            None
        };
        // The fabric: open (once per process), register the heap, allgather
        // (endpoint name, heap region), add the peers reached through it.
        let mut fabric = None;
        let mut fabric_provider = None;
        let mut fabric_peers: Vec<Option<FabricPeer>> = (0..n).map(|_| None).collect();
        if any_fabric {
            let hca = hca.as_ref().expect("engine started");
            let opened = install_fabric(hca, settings.fabric, settings.timeout).and_then(|ctx| {
                // SAFETY: the heap mapping lives in `peers` until the Pe drops, after
                // `proxy` (field order), which holds this registration.
                let mr = unsafe { ctx.domain.register(my_base, heap_size)? };
                Ok((ctx, mr))
            });
            exchange_status(&boot, &world_group, "open its libfabric endpoint", &opened)?;
            let (ctx, mr) = opened?;
            let msg = fabric_card(&ctx.provider, &ctx.name, &mr.remote().to_bytes());
            let all = boot.allgather(&world_group, &msg)?;
            let inserted: Result<()> = (0..n).filter(|&r| fabric_to[r]).try_for_each(|r| {
                let (name, region) = read_fabric_card(&all[r], r, &ctx.provider, &ctx.name)?;
                let region = RemoteRegion::from_bytes(region)?;
                let addr = insert_fabric_peer(hca, name)?;
                fabric_peers[r] = Some(FabricPeer {
                    addr,
                    region,
                    vbase: le_u64(&keys[r][..8]),
                    rkey: le_u64(&keys[r][8..16]) as u32,
                    len: heap_size as u64,
                });
                Ok(())
            });
            exchange_status(&boot, &world_group, "add its fabric peers", &inserted)?;
            fabric_provider = Some(ctx.provider.clone());
            fabric = Some((ctx, mr));
        }
        let proxy = if paths.contains(&PeerPath::Proxy) {
            let pp = (0..n)
                .map(|r| {
                    if paths[r] != PeerPath::Proxy {
                        return None;
                    }
                    let base = le_u64(&keys[r][..8]);
                    let rkey = le_u64(&keys[r][8..16]) as u32;
                    if let Some(fp) = fabric_peers[r] {
                        return Some(ProxyPeer {
                            base,
                            rkey,
                            via: PeerKind::Fabric(fp),
                        });
                    }
                    let seg = peers[r].as_ref()?;
                    // The peer's heap as this process reaches it: the LocalBackend checks
                    // the rkey and bounds against this and writes through the mapping.
                    let remote = Arc::new(MrTable::new());
                    // SAFETY: the mapping lives in `peers` until after `proxy` drops.
                    unsafe {
                        remote.register_key(rkey, seg.base(), base, heap_size as u64, Access::ALL)
                    };
                    Some(ProxyPeer {
                        base,
                        rkey,
                        via: PeerKind::Local(LocalPeer::new(remote)),
                    })
                })
                .collect();
            let hca = hca.clone().expect("engine started");
            Some(Proxy::new(
                rank,
                settings.timeout,
                pd,
                pp,
                hca,
                fabric.take(),
                live.clone(),
                settings.fabric_chunk,
                &job_id,
                settings.debug_queues,
            )?)
        } else {
            None
        };
        // A PE that reaches nobody by proxy still serves fabric peers: keep the engine
        // (and the heap registration) alive with the Pe.
        let fabric_keepalive = if proxy.is_none() {
            hca.zip(fabric.take().map(|(_, mr)| mr))
        } else {
            None
        };
        let fabric_to: Vec<bool> = (0..n).map(|r| fabric_peers[r].is_some()).collect();

        // Relaxed: a unique number, nothing is published through it.
        let team_owner = NEXT_TEAM_OWNER.fetch_add(1, Ordering::Relaxed);
        let world = Team::new(0, world_group.members.clone(), rank, 0, true, team_owner);
        let node_members: Vec<u32> = local.iter().map(|&r| r as u32).collect();
        let node_uid = 1u64 << 63 | fnv(node_ids[rank].as_bytes());
        let node = Team::new(node_uid, node_members, rank, 1, true, team_owner);
        let world_p2p = local.len() == n;
        world.set_p2p(world_p2p);

        // The node's online CPUs, not this thread's affinity mask: PEs pinned one per core
        // (taskset, numactl, Slurm binding) are not oversubscribed.
        // SAFETY: sysconf has no preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let cores = if online > 0 { online as usize } else { 1 };
        let spin_polls = crate::rma::spin_polls(local.len(), cores);
        let assist = match settings.p2p_assist {
            crate::assist::AssistMode::Off => None,
            crate::assist::AssistMode::Auto if local.len() > cores => None,
            // SAFETY: peers[rank] is this PE's own mapping, moved into the Pe below; the
            // Pe declares `assist` before `peers`, so it is dropped first.
            _ => unsafe {
                crate::assist::Assist::new(
                    peers[rank]
                        .as_ref()
                        .map_or(std::ptr::null_mut(), |s| s.base()),
                    rank,
                    n,
                    &local,
                )
            },
        };
        Ok(Pe {
            spin_polls,
            assist,
            rank,
            n_pes: n,
            boot: Some(boot),
            live,
            settings,
            binding: None,
            job_id,
            heap_size,
            paths,
            direct,
            fabric_to,
            proxy,
            _fabric_keepalive: fabric_keepalive,
            fabric_provider,
            deferred: crate::rma::KeptError::default(),
            peers,
            alloc: Mutex::new(Allocator::new(RESERVED_BYTES, heap_size)),
            world,
            node,
            slots: Mutex::new(0b11),
            locks: Mutex::new(Vec::new()),
            team_owner,
            root,
        })
    }

    /// This PE's number in the world team.
    pub fn my_pe(&self) -> usize {
        self.rank
    }
    /// Number of PEs in the job.
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }
    /// The job id (shared by all PEs of the job).
    pub fn job_id(&self) -> &str {
        &self.job_id
    }
    /// Size of every PE's symmetric heap in bytes (the usable part starts at
    /// [`heap::RESERVED_BYTES`]).
    pub fn heap_size(&self) -> usize {
        self.heap_size
    }
    /// The bound applied to every wait.
    pub fn timeout(&self) -> Duration {
        self.settings.timeout
    }
    /// The world team.
    pub fn world(&self) -> &Team {
        &self.world
    }
    /// The node-local team: PEs whose heaps this PE maps (OpenSHMEM's SHMEM_TEAM_SHARED).
    pub fn node(&self) -> &Team {
        &self.node
    }
    /// The PEs reported dead so far (by the bootstrap root), in report order.
    pub fn dead_pes(&self) -> Vec<usize> {
        self.live.dead_pes()
    }

    /// Tolerates the death of PE `pe` (reported already or later): it no longer fails this
    /// PE's waits and its RMA to other PEs. RMA to `pe` itself still fails with
    /// [`Error::PeerDied`], and so do barriers that include it and collectives through
    /// the bootstrap (team creation, finalize); other waits for something only `pe` would
    /// have done (a `wait_until` on a word it should write) end at their timeout. For code that routes around dead PEs, as EP shrink
    /// mode does ([`crate::ep::Buffer::set_shrink`]). Fails for this PE itself, for a PE
    /// outside the job, and once the bootstrap root is lost.
    pub fn tolerate_death(&self, pe: usize) -> Result<()> {
        if pe >= self.n_pes() || pe == self.my_pe() {
            return Err(Error::InvalidArgument(format!(
                "tolerate_death: PE {pe} is not another PE of this {}-PE job",
                self.n_pes()
            )));
        }
        self.live.tolerate(pe)
    }

    /// Whether PE `pe`'s heap is mapped here (p2p reachable).
    pub fn is_local(&self, pe: usize) -> bool {
        self.peers.get(pe).is_some_and(|s| s.is_some())
    }

    /// This PE's heap in this process (the start of its shared-memory segment).
    pub(crate) fn heap_host_base(&self) -> *mut u8 {
        self.peers[self.rank]
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s.base())
    }

    /// The proxy transport, when some peer is reached through it.
    pub(crate) fn proxy_opt(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }

    pub(crate) fn boot(&self) -> &Bootstrap {
        self.boot
            .as_ref()
            .expect("bootstrap present until finalize")
    }

    /// Address in this process of PE `pe`'s symmetric object (OpenSHMEM `shmem_ptr`):
    /// `None` when that PE's heap is not mapped here or the range is invalid.
    pub fn ptr<T: Element>(&self, sym: SymPtr<T>, pe: usize) -> Option<*mut T> {
        self.target(pe, sym.offset(), sym.bytes())
            .ok()
            .map(|p| p.cast())
    }

    /// Address in this process of `[offset, offset+len)` of PE `pe`'s heap when operations
    /// to `pe` take the p2p path (its heap is mapped here and no proxy serves it); `None`
    /// otherwise (proxy or unreachable peers, invalid ranges).
    pub(crate) fn p2p_addr(&self, pe: usize, offset: usize, len: usize) -> Option<*mut u8> {
        match self.route(pe, offset, len) {
            Ok(Route::P2p(p)) => Some(p),
            _ => None,
        }
    }

    /// The address of `[offset, offset+len)` in this PE's own heap, bounds-checked as
    /// [`Pe::target`] does but without its liveness check: a store to one's own memory
    /// does not depend on the peers (a small collective's last step, which must not fail
    /// on one member only because it heard of a death earlier than another).
    pub(crate) fn own_heap(&self, offset: usize, len: usize) -> Result<*mut u8> {
        self.check_range(self.rank, offset, len)?;
        let seg = self.peers[self.rank]
            .as_ref()
            .ok_or_else(|| Error::Unreachable {
                pe: self.rank,
                from: self.rank,
                reason: "its own heap is not mapped in this process".into(),
            })?;
        // SAFETY: offset + len <= heap_size = the length of the mapping (checked above).
        Ok(unsafe { seg.base().add(offset) })
    }

    /// Validates `[offset, offset+len)` on PE `pe` and returns its local address.
    #[inline]
    pub(crate) fn target(&self, pe: usize, offset: usize, len: usize) -> Result<*mut u8> {
        if let Some(p) = self.direct_at(pe, offset, len) {
            self.live.check_to(pe)?;
            return Ok(p);
        }
        if pe >= self.n_pes {
            return Err(Error::InvalidPe {
                pe,
                n_pes: self.n_pes,
                scope: "world team",
            });
        }
        let seg = self.peers[pe].as_ref().ok_or_else(|| Error::Unreachable {
            pe,
            from: self.rank,
            reason: "it is on another node and RSHMEM_TRANSPORT=p2p reaches node-local peers only"
                .into(),
        })?;
        self.check_range(pe, offset, len)?;
        self.live.check_to(pe)?;
        // SAFETY: offset + len <= heap_size = the mapping's length (checked above).
        Ok(unsafe { seg.base().add(offset) })
    }

    /// Validates `[offset, offset+len)` on PE `pe` and says how to reach it.
    #[inline]
    pub(crate) fn route(&self, pe: usize, offset: usize, len: usize) -> Result<Route> {
        if let Some(p) = self.direct_at(pe, offset, len) {
            self.live.check_to(pe)?;
            return Ok(Route::P2p(p));
        }
        self.route_slow(pe, offset, len)
    }

    /// The hot path of [`Pe::route`] and [`Pe::target`]: the address here of `[offset,
    /// offset+len)` on PE `pe` when that PE is reached by load/store and the range lies in
    /// its heap — one table load and three compares. None sends the caller down the full
    /// path, which reports every error.
    #[inline]
    fn direct_at(&self, pe: usize, offset: usize, len: usize) -> Option<*mut u8> {
        let base = *self.direct.get(pe)?;
        (base != 0
            && offset >= RESERVED_BYTES
            && offset <= self.heap_size
            && len <= self.heap_size - offset)
            // Inside PE `pe`'s mapping (heap_size long), checked just above.
            .then(|| (base + offset) as *mut u8)
    }

    #[cold]
    fn route_slow(&self, pe: usize, offset: usize, len: usize) -> Result<Route> {
        match self.paths.get(pe) {
            Some(PeerPath::Proxy) => {
                self.check_range(pe, offset, len)?;
                self.live.check_to(pe)?;
                Ok(Route::Proxy)
            }
            _ => self.target(pe, offset, len).map(Route::P2p),
        }
    }

    fn check_range(&self, pe: usize, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if in_heap(offset, len) && end <= self.heap_size => Ok(()),
            _ => Err(Error::OutOfBounds {
                pe,
                offset,
                len,
                heap_start: RESERVED_BYTES,
                heap_end: self.heap_size,
            }),
        }
    }

    /// The proxy transport (present whenever a route says Proxy).
    pub(crate) fn proxy(&self) -> &Proxy {
        self.proxy
            .as_ref()
            .expect("a proxy route implies a proxy transport")
    }

    /// The libfabric provider serving this PE's network peers (e.g. `tcp;ofi_rxm`), if
    /// an endpoint was opened.
    pub fn fabric_provider(&self) -> Option<&str> {
        self.fabric_provider.as_deref()
    }

    /// The transport used to reach PE `pe`: "p2p", "proxy" (soft HCA, node-local
    /// backend), "proxy-fabric" (soft HCA over libfabric) or "unreachable".
    pub fn transport_to(&self, pe: usize) -> Option<&'static str> {
        self.paths.get(pe).map(|p| match p {
            PeerPath::P2p => "p2p",
            PeerPath::Proxy if self.fabric_to[pe] => "proxy-fabric",
            PeerPath::Proxy => "proxy",
            PeerPath::Unreachable => "unreachable",
        })
    }

    /// Adds 1 to runtime word `offset` of PE `pe` (barrier signals): Release on p2p, a
    /// fenced fetch-add WQE through the proxy.
    pub(crate) fn runtime_signal(&self, pe: usize, offset: usize) -> Result<()> {
        match self.paths.get(pe) {
            Some(PeerPath::Proxy) => self.proxy().post_add(pe, offset, 1, true, "barrier"),
            _ => {
                let w = self.runtime_word(pe, offset)?;
                // SAFETY: runtime word inside a live mapping, 8-aligned, only accessed
                // atomically. Release: everything this PE wrote before the signal (and
                // everything it acquired from earlier rounds) is visible to the partner
                // that acquires it.
                unsafe {
                    crate::atomic::AtomicInt::fetch_add(
                        w,
                        1u64,
                        std::sync::atomic::Ordering::Release,
                    )
                };
                Ok(())
            }
        }
    }

    /// Local address of a runtime-region word of PE `pe` (no user bounds check: internal).
    pub(crate) fn runtime_word(&self, pe: usize, offset: usize) -> Result<*mut u64> {
        debug_assert!(offset + 8 <= RESERVED_BYTES && offset % 8 == 0);
        let seg = self.peers[pe].as_ref().ok_or_else(|| Error::Unreachable {
            pe,
            from: self.rank,
            reason: "it is on another node and RSHMEM_TRANSPORT=p2p reaches node-local peers only"
                .into(),
        })?;
        // SAFETY: offset is inside the reserved region, which is inside the mapping.
        Ok(unsafe { seg.base().add(offset).cast() })
    }

    // ---------------------------------------------------------------- allocation

    /// Collective: every PE allocates `size` bytes at the same offset (16-byte aligned).
    /// `size == 0` returns an empty pointer and allocates nothing.
    pub fn malloc(&self, size: usize) -> Result<SymPtr<u8>> {
        self.alloc_collective("malloc", Ok(size), 16, false)
            .map(|o| SymPtr::from_raw(o, size))
    }

    /// Collective: `count` zeroed elements of `T` at the same offset on every PE. Returns
    /// after every PE has zeroed its copy.
    pub fn calloc<T: Element>(&self, count: usize) -> Result<SymPtr<T>> {
        let bytes = bytes_of::<T>(count);
        let o = self.alloc_collective("calloc", bytes, align_of_elem::<T>(), true)?;
        Ok(SymPtr::from_raw(o, count))
    }

    /// Collective: `count` elements of `T` (uninitialised content) at the same offset.
    pub fn alloc<T: Element>(&self, count: usize) -> Result<SymPtr<T>> {
        let bytes = bytes_of::<T>(count);
        let o = self.alloc_collective("alloc", bytes, align_of_elem::<T>(), false)?;
        Ok(SymPtr::from_raw(o, count))
    }

    /// Collective: `size` bytes aligned to `alignment` (a power of two up to the page size).
    pub fn align(&self, alignment: usize, size: usize) -> Result<SymPtr<u8>> {
        self.alloc_collective("align", Ok(size), alignment, false)
            .map(|o| SymPtr::from_raw(o, size))
    }

    /// Collective: releases an allocation on every PE (all must pass the same pointer).
    /// Every PE's puts complete first (OpenSHMEM's `shmem_free` is a barrier, quiet
    /// included): a non-blocking put still in flight could otherwise land in the next
    /// allocation at that offset.
    pub fn free<T>(&self, ptr: SymPtr<T>) -> Result<()> {
        let quiet = self.try_quiet();
        let args = [ptr.offset() as u64, quiet.is_ok() as u64];
        let agreed = self.agree_heap("free", HeapCall::Free, &args);
        // A PE whose quiet failed reports that (the cause), not the mismatch it made.
        quiet?;
        agreed?;
        if ptr.offset() == 0 {
            return Ok(()); // the empty allocation
        }
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        a.free(ptr.offset())
            .map_err(|e| Error::InvalidArgument(format!("free: {e}")))
    }

    /// Collective: resizes an allocation to `count` elements on every PE (OpenSHMEM
    /// `shmem_realloc`; all must pass the same pointer and count). Shrinking happens in
    /// place; growing may move the block; each PE's contents are kept up to the smaller of
    /// the two sizes (the rest is uninitialised). An empty `ptr` allocates, a `count` of 0 frees and returns an empty
    /// pointer. The PE's puts complete first, and no PE returns before every PE has
    /// copied its contents (so writes into the new block after the call are not lost).
    /// When the heap has no room the old block is left as it was, on every PE.
    pub fn realloc<T: Element>(&self, ptr: SymPtr<T>, count: usize) -> Result<SymPtr<T>> {
        // A count whose bytes overflow is agreed as u64::MAX and refused after the
        // agreement, so that every PE fails this call, not this PE alone.
        let bytes = bytes_of::<T>(count);
        let quiet = self.try_quiet();
        let args = [
            ptr.offset() as u64,
            bytes.as_ref().map_or(u64::MAX, |&b| b as u64),
            quiet.is_ok() as u64,
        ];
        let agreed = self.agree_heap("realloc", HeapCall::Realloc, &args);
        // As in free: this PE's own failed quiet is the error it reports.
        quiet?;
        agreed?;
        let bytes = bytes?;
        if ptr.offset() == 0 {
            let o = self.alloc_collective("realloc", Ok(bytes), align_of_elem::<T>(), false)?;
            return Ok(SymPtr::from_raw(o, count));
        }
        let old_bytes = {
            let a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
            a.size_of(ptr.offset()).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "realloc: offset {:#x} is not the start of a symmetric allocation",
                    ptr.offset()
                ))
            })?
        };
        if count == 0 {
            self.free(ptr)?;
            return Ok(SymPtr::from_raw(0, 0));
        }
        if bytes <= old_bytes {
            // Shrinks in place (always room): every PE runs the same allocator step.
            let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
            a.shrink(ptr.offset(), bytes);
            return Ok(SymPtr::from_raw(ptr.offset(), count));
        }
        let off = self.alloc_collective("realloc", Ok(bytes), align_of_elem::<T>(), false)?;
        // The block's own size, not the pointer's view of it: a typed view (a cast) may
        // cover fewer bytes than the block holds, and realloc keeps the whole old content.
        let keep = bytes.min(old_bytes);
        let copied = if keep > 0 {
            self.target(self.rank, ptr.offset(), keep)
                .and_then(|from| Ok((from, self.target(self.rank, off, keep)?)))
                .map(|(from, to)| {
                    // SAFETY: both ranges lie in this PE's own mapping (checked by target)
                    // and do not overlap (the new block was allocated while the old one
                    // was live). No PE writes either block during the call (puts were
                    // completed and agreed above).
                    unsafe { crate::copy::copy_bytes(from, to, keep) }
                })
        } else {
            Ok(())
        };
        // Every PE has copied before any returns and writes into the new block, or frees
        // the old one (a barrier). The puts were completed above and the copy is local, so
        // no second quiet (as `free` would do). When the agreement completed, every PE
        // takes the same allocator step after it: the old block freed when every copy
        // succeeded, else the new one, so a failed realloc leaves the heap as it was
        // (before 2026-12-07 a failure here, such as a quiet failing inside `free`, left
        // the new block allocated and unreachable). When the agreement itself failed (a
        // timeout, a broken world) some PE may have completed it: then neither block is
        // freed here (the new one is lost), so no PE's allocator runs ahead of another's.
        let agreed = self.agree_heap(
            "realloc (copied)",
            HeapCall::ReallocCopied,
            &[copied.is_ok() as u64],
        );
        let free = |o: usize| {
            let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
            // Cannot fail: `o` is a live block this call holds (old or new).
            let _ = a.free(o);
        };
        // Completed on every PE: passed, or a mismatch (every PE read the same records).
        let completed = matches!(agreed, Ok(()) | Err(Error::CollectiveMismatch { .. }));
        match copied.and(agreed) {
            Ok(()) => {
                free(ptr.offset());
                Ok(SymPtr::from_raw(off, count))
            }
            Err(e) => {
                if completed {
                    free(off);
                }
                Err(e)
            }
        }
    }

    /// Bytes still free in the symmetric heap, and the largest free block.
    pub fn heap_free(&self) -> (usize, usize) {
        let a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        (a.free_bytes(), a.largest_free())
    }

    /// `size` is an error when the caller's element count overflowed: agreed as u64::MAX
    /// and reported after the agreement, like a bad alignment, so that every PE fails the
    /// call (before 2026-12-07 that PE alone returned at once and the others waited for
    /// it, or met its next call).
    fn alloc_collective(
        &self,
        op: &'static str,
        size: Result<usize>,
        align: usize,
        zero: bool,
    ) -> Result<usize> {
        let call = if zero {
            HeapCall::Calloc
        } else {
            HeapCall::Alloc
        };
        let words = [size.as_ref().map_or(u64::MAX, |&s| s as u64), align as u64];
        self.agree_heap(op, call, &words)?;
        let size = size?;
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(Error::InvalidArgument(format!(
                "{op}: alignment {align} is not a power of two up to {MAX_ALIGN}"
            )));
        }
        if size == 0 {
            return Ok(0);
        }
        let off = {
            let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
            a.alloc(size, align).ok_or_else(|| Error::HeapExhausted {
                pe: self.rank,
                requested: size,
                align,
                free: a.free_bytes(),
                largest_free: a.largest_free(),
                heap_size: self.heap_size,
            })?
        };
        if zero {
            let p = self.target(self.rank, off, size)?;
            // SAFETY: p..p+size is inside our own mapping (validated by target); no other
            // PE may access a block before the collective allocation returns.
            unsafe { std::ptr::write_bytes(p, 0, size) };
            self.sync_team(&self.world)?;
        }
        Ok(off)
    }

    /// [`Pe::agree`] for a call that changes the heap's layout: its kind goes first, so that
    /// two different calls whose arguments are equal are a mismatch (before 2026-12-07 a
    /// `free` of the block at 0x10000 on one PE met an `align(1, 0x10000)` on another,
    /// both passed, and the heaps were no longer symmetric).
    pub(crate) fn agree_heap(&self, op: &'static str, call: HeapCall, args: &[u64]) -> Result<()> {
        let words: Vec<u64> = std::iter::once(call.code())
            .chain(args.iter().copied())
            .collect();
        self.agree(op, &words, HeapCall::show)
    }

    /// Collective check that every PE passed the same arguments to `op`; on mismatch every
    /// PE gets the same error listing each PE's arguments. Also acts as a barrier.
    pub(crate) fn agree(
        &self,
        op: &'static str,
        args: &[u64],
        show: impl Fn(&[u64]) -> String,
    ) -> Result<()> {
        self.agree_in(&self.world, op, args, show)
    }

    pub(crate) fn agree_in(
        &self,
        team: &Team,
        op: &'static str,
        args: &[u64],
        show: impl Fn(&[u64]) -> String,
    ) -> Result<()> {
        let all = self.gather_in(team, op, args, &show)?;
        if all.iter().any(|r| r.as_slice() != args) {
            return Err(mismatch(team, op, &all, |r| show(r)));
        }
        Ok(())
    }

    /// Every member's `args` (one record per member, in team order; every member passes
    /// the same number of words), which may differ: the exchange under [`Pe::agree_in`],
    /// also used where members pass different counts (`collect`). Also a barrier. A member
    /// that passed a different number of words, or is at another exchange of this team,
    /// is a `CollectiveMismatch` on every member (`show` renders a record's arguments).
    pub(crate) fn gather_in(
        &self,
        team: &Team,
        op: &'static str,
        args: &[u64],
        show: impl Fn(&[u64]) -> String,
    ) -> Result<Vec<Vec<u64>>> {
        self.intact_team(team, op)?;
        if team.p2p() && args.len() <= AGREE_WORDS - 2 {
            return self.gather_in_heap(team, op, args, show);
        }
        let bytes: Vec<u8> = args.iter().flat_map(|a| a.to_le_bytes()).collect();
        let all = self.boot().allgather(&team.group(), &bytes);
        let all = self.note_team_failure(team, op, all)?;
        let vals: Vec<Vec<u64>> = all
            .iter()
            .map(|b| b.chunks_exact(8).map(le_u64).collect())
            .collect();
        if all.iter().any(|b| b.len() != bytes.len()) {
            return Err(mismatch(team, op, &vals, |v| show(v)));
        }
        Ok(vals)
    }

    /// [`Pe::gather_in`] on a team whose heaps are all mapped here, without the bootstrap:
    /// every member writes its record (sequence number, argument count, arguments) into
    /// its own runtime region (team slot, agreement half `seq % 2`), a team barrier, then
    /// every member reads every member's record. Two halves by turns: a member writes the
    /// half of call k + 2 only after the barrier of call k + 1, which every member reaches
    /// only after it read the records of call k. About two orders of magnitude faster than
    /// the bootstrap's allgather through the root (docs/runtime.md, "Team collectives").
    fn gather_in_heap(
        &self,
        team: &Team,
        op: &'static str,
        args: &[u64],
        show: impl Fn(&[u64]) -> String,
    ) -> Result<Vec<Vec<u64>>> {
        let (seq, all) = self.exchange_in_heap(team, op, args.len() as u64, args)?;
        if all.iter().all(|r| r[..2] == [seq, args.len() as u64]) {
            return Ok(all.iter().map(|r| record_words(r).to_vec()).collect());
        }
        Err(heap_mismatch(team, op, seq, &all, |r| {
            crate::collectives::small_call(r[1]).unwrap_or_else(|| show(record_words(r)))
        }))
    }

    /// The exchange under [`Pe::gather_in_heap`], its records unchecked: this call's
    /// sequence number and every member's record `[seq, count, words...]` as read after
    /// a team barrier (the words past what a member wrote are stale). `count` is the
    /// number of words for an agreement; a small collective's own word for a small call
    /// that met this one (collectives.rs, "Small calls"), with the number in its low 16
    /// bits as well ([`record_words`]). The caller checked the team (`usable_team`), that
    /// its heaps are all mapped here, and that `words` fit a record.
    pub(crate) fn exchange_in_heap(
        &self,
        team: &Team,
        op: &'static str,
        count: u64,
        words: &[u64],
    ) -> Result<(u64, Vec<[u64; AGREE_WORDS]>)> {
        let (seq, base) = self.publish_record(team, count, words)?;
        self.sync_team_as(team, op)?;
        Ok((seq, self.read_records(team, base)?))
    }

    /// A small collective's exchange (collectives.rs, "Small calls"): [`Pe::exchange_in_heap`]
    /// without the barrier. This member publishes its record (the sequence number last,
    /// with Release) and waits for every member's record of the same call (Acquire), which
    /// is also what a barrier would have waited for: every member has entered the call.
    /// Each member's record of the call before the last is no longer read by anyone when
    /// it writes this one into the same half: it wrote the last call's record after it
    /// read every record of the one before, and this member read its last call's record.
    /// Bounded like every wait: a member that does not come is named, with the agreement
    /// its record holds.
    pub(crate) fn exchange_polled(
        &self,
        team: &Team,
        op: &'static str,
        count: u64,
        words: &[u64],
    ) -> Result<(u64, Vec<[u64; AGREE_WORDS]>)> {
        let r = self.exchange_polled_unchecked(team, op, count, words);
        self.note_out_of_step(team, op, r)
    }

    fn exchange_polled_unchecked(
        &self,
        team: &Team,
        op: &'static str,
        count: u64,
        words: &[u64],
    ) -> Result<(u64, Vec<[u64; AGREE_WORDS]>)> {
        let (seq, base) = self.publish_record(team, count, words)?;
        let (n, me) = (team.n_pes(), team.my_pe());
        // From the next member on, so that members do not all wait on member 0 first.
        for k in 1..n {
            let m = team.members()[(me + k) % n] as usize;
            let w = self.runtime_word(m, base)?;
            // SAFETY: word 0 of member m's record in its mapped runtime region, accessed
            // only atomically. Acquire pairs with the member's Release store of its
            // sequence number, after its record's other words.
            let at = || unsafe { u64::load(w, std::sync::atomic::Ordering::Acquire) };
            // From the first miss: a record found at once costs no clock read (a tenth of
            // an 8-byte call at 2 PEs).
            let start = std::cell::Cell::new(None);
            self.poll_from(
                Some(m),
                || {
                    if at() >= seq {
                        return Ok(());
                    }
                    if start.get().is_none() {
                        start.set(Some(std::time::Instant::now()));
                    }
                    Err(())
                },
                |_| Error::Timeout {
                    pe: self.my_pe(),
                    what: format!(
                        "{op} on team {:#x} (agreement #{seq}): the record of PE {m}, which \
                         holds agreement #{} (a member at another call, or not in one)",
                        team.uid(),
                        at()
                    ),
                    waited_ms: start.get().map_or(0, ms_since),
                },
            )?;
        }
        Ok((seq, self.read_records(team, base)?))
    }

    /// Writes this member's record of its next agreement on `team` (`[seq, count,
    /// words...]`) into its half of the team's slot: the words, then the sequence number
    /// with Release, so that whoever acquires it reads the rest. Returns the sequence
    /// number and the record's heap offset.
    fn publish_record(&self, team: &Team, count: u64, words: &[u64]) -> Result<(u64, usize)> {
        debug_assert!(team.p2p() && words.len() <= AGREE_WORDS - 2);
        let seq = team.next_agreement();
        let base = psync_offset(team.slot(), AGREE_WORD0 + (seq % 2) as usize * AGREE_WORDS);
        let mine = self.runtime_word(self.my_pe(), base)?;
        for (k, &v) in [count].iter().chain(words).enumerate() {
            // SAFETY: word 1 + k < AGREE_WORDS of this PE's own runtime region (slot of a
            // team it belongs to), accessed only atomically. Relaxed: the Release store of
            // the sequence number below publishes it.
            unsafe { u64::store(mine.add(1 + k), v, std::sync::atomic::Ordering::Relaxed) };
        }
        // SAFETY: word 0 of the same record. Release: the words above are visible to a
        // member that acquires this value (a small call's poll; an agreement's barrier
        // publishes them too).
        unsafe { u64::store(mine, seq, std::sync::atomic::Ordering::Release) };
        Ok((seq, base))
    }

    /// Every member's record at heap offset `base`, in team order.
    fn read_records(&self, team: &Team, base: usize) -> Result<Vec<[u64; AGREE_WORDS]>> {
        team.members()
            .iter()
            .map(|&m| self.read_record(m as usize, base))
            .collect()
    }

    /// Member `m`'s record at heap offset `base`, all of its words.
    fn read_record(&self, m: usize, base: usize) -> Result<[u64; AGREE_WORDS]> {
        let w = self.runtime_word(m, base)?;
        // SAFETY: words k < AGREE_WORDS of a record in member m's mapped runtime region,
        // accessed only atomically. Relaxed: the caller's barrier or Acquire poll of the
        // record's sequence number ordered these loads after the member's stores; nobody
        // writes this half again before this PE publishes its next record.
        Ok(std::array::from_fn(|k| unsafe {
            u64::load(w.add(k), std::sync::atomic::Ordering::Relaxed)
        }))
    }

    /// Leaves the job cleanly: a barrier with every PE, then the bootstrap farewell. PEs
    /// that drop their `Pe` without `finalize` are reported to the others as died.
    pub fn finalize(mut self) -> Result<()> {
        // Complete this PE's outstanding puts first (they may be queued in the soft HCA),
        // as shmem_finalize's implicit barrier_all does.
        let q = self.try_quiet();
        let r = self.boot().barrier(&self.world.group()).and(q);
        if let Some(b) = self.boot.take() {
            b.finalize()?;
        }
        if let Some(root) = self.root.take() {
            // Keep serving the other PEs' farewells before this process goes away.
            let t0 = std::time::Instant::now();
            let left = root.wait_all_left(self.settings.timeout);
            if !left.is_empty() {
                // Said here: the finalize took a second timeout, and those PEs will report
                // a lost root with nothing linking the two.
                let names: Vec<String> = left.iter().map(|r| r.to_string()).collect();
                eprintln!(
                    "rshmem: PE {} (hosting the bootstrap root) waited {} ms in finalize for \
                     PE(s) {} to leave and gave up; they will report the lost root",
                    self.rank,
                    t0.elapsed().as_millis(),
                    names.join(", ")
                );
            }
        }
        r
    }
}

/// The calls that change a heap's layout, as the first word of their agreement
/// ([`Pe::agree_heap`]). `malloc`, `alloc`, `align` and a `realloc` of the empty pointer
/// take the same allocator step, so they are one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeapCall {
    Alloc,
    Calloc,
    Free,
    Realloc,
    ReallocCopied,
    GpuAlloc,
    GpuCalloc,
    GpuFree,
}

impl HeapCall {
    const ALL: [HeapCall; 8] = [
        HeapCall::Alloc,
        HeapCall::Calloc,
        HeapCall::Free,
        HeapCall::Realloc,
        HeapCall::ReallocCopied,
        HeapCall::GpuAlloc,
        HeapCall::GpuCalloc,
        HeapCall::GpuFree,
    ];

    pub(crate) fn code(self) -> u64 {
        u64::from_le_bytes(match self {
            HeapCall::Alloc => *b"heap-alc",
            HeapCall::Calloc => *b"heap-clc",
            HeapCall::Free => *b"heap-fre",
            HeapCall::Realloc => *b"heap-rea",
            HeapCall::ReallocCopied => *b"heap-rec",
            HeapCall::GpuAlloc => *b"gpuh-alc",
            HeapCall::GpuCalloc => *b"gpuh-clc",
            HeapCall::GpuFree => *b"gpuh-fre",
        })
    }

    fn name(self) -> &'static str {
        match self {
            HeapCall::Alloc => "malloc",
            HeapCall::Calloc => "calloc",
            HeapCall::Free => "free",
            HeapCall::Realloc => "realloc",
            HeapCall::ReallocCopied => "realloc (copied)",
            HeapCall::GpuAlloc => "gpu malloc",
            HeapCall::GpuCalloc => "gpu calloc",
            HeapCall::GpuFree => "gpu free",
        }
    }

    /// One member's agreement words in a mismatch error.
    fn show(r: &[u64]) -> String {
        let a = |i: usize| r.get(i).copied().unwrap_or(u64::MAX);
        let Some(call) = Self::ALL
            .into_iter()
            .find(|c| Some(c.code()) == r.first().copied())
        else {
            return format!(
                "another kind of call ({} words: a collective, a team split, ...)",
                r.len()
            );
        };
        let size = |w: u64| match w {
            u64::MAX => "overflowing".to_string(),
            w => w.to_string(),
        };
        let args = match call {
            HeapCall::Alloc | HeapCall::Calloc | HeapCall::GpuAlloc | HeapCall::GpuCalloc => {
                format!("size {} align {}", size(a(1)), a(2))
            }
            HeapCall::Free => format!("offset {:#x} ready {}", a(1), a(2) == 1),
            HeapCall::GpuFree => format!("offset {:#x}", a(1)),
            HeapCall::Realloc => {
                format!(
                    "offset {:#x} bytes {} ready {}",
                    a(1),
                    size(a(2)),
                    a(3) == 1
                )
            }
            HeapCall::ReallocCopied => format!("copied {}", a(1) == 1),
        };
        format!("{} {args}", call.name())
    }
}

/// The words a member wrote after its record's header: as many as the low 16 bits of its
/// count say (whatever the call), within the record.
pub(crate) fn record_words(r: &[u64; AGREE_WORDS]) -> &[u64] {
    &r[2..2 + ((r[1] & 0xffff) as usize).min(AGREE_WORDS - 2)]
}

/// The error of a heap exchange (`Pe::exchange_in_heap`, call `seq`) whose records differ:
/// a member at another agreement of the team is named by its sequence number, the others
/// by `show` of their record (`[seq, count, words...]`).
///
/// Records are compared (to find the most common one in a large team's message) by what
/// their members wrote: the header and its words, the header alone for a small call (whose
/// words are the member's own data) — not the stale words after them.
pub(crate) fn heap_mismatch(
    team: &Team,
    op: &'static str,
    seq: u64,
    records: &[[u64; AGREE_WORDS]],
    show: impl Fn(&[u64; AGREE_WORDS]) -> String,
) -> Error {
    /// A record, equal to another when what their members wrote is.
    struct Written<'a>(&'a [u64; AGREE_WORDS]);
    impl Written<'_> {
        fn key(&self) -> &[u64] {
            match self.0[1] & SMALL_RECORD {
                0 => &self.0[..2 + record_words(self.0).len()],
                _ => &self.0[..2],
            }
        }
    }
    impl PartialEq for Written<'_> {
        fn eq(&self, other: &Self) -> bool {
            self.key() == other.key()
        }
    }
    let written: Vec<Written> = records.iter().map(Written).collect();
    mismatch(team, op, &written, |Written(r)| {
        if r[0] != seq {
            format!("at agreement #{} of this team (this PE: #{seq})", r[0])
        } else {
            show(r)
        }
    })
}

/// A small collective's record (collectives.rs, "Small calls"): this bit of the count word.
/// An agreement's count (at most `AGREE_WORDS - 2`) never has it.
pub(crate) const SMALL_RECORD: u64 = 1 << 63;

/// The error of an agreement that found members' arguments differ (`records` in team
/// order; see [`describe_records`]).
pub(crate) fn mismatch<V: PartialEq>(
    team: &Team,
    op: &'static str,
    records: &[V],
    show: impl Fn(&V) -> String,
) -> Error {
    let detail = describe_records(team.members(), records, show);
    Error::CollectiveMismatch { op, detail }
}

/// "PE p: <what p passed>" for every member of a team of up to [`LISTED`] members, in team
/// order. In a larger team the members whose record differs from the most common one come
/// first (up to [`LISTED`] of them, then how many more), then the most common record once
/// with how many members passed it, so the PE at fault is named whatever the team's size.
pub(crate) fn describe_records<V: PartialEq>(
    members: &[u32],
    records: &[V],
    show: impl Fn(&V) -> String,
) -> String {
    const LISTED: usize = 32;
    let line = |i: usize| format!("PE {}: {}", members[i], show(&records[i]));
    if records.len() <= LISTED {
        return (0..records.len()).map(line).collect::<Vec<_>>().join("; ");
    }
    // Quadratic, on an error path only.
    let common = (0..records.len())
        .max_by_key(|&i| records.iter().filter(|r| **r == records[i]).count())
        .unwrap_or(0);
    let odd: Vec<usize> = (0..records.len())
        .filter(|&i| records[i] != records[common])
        .collect();
    let mut parts: Vec<String> = odd.iter().take(LISTED).map(|&i| line(i)).collect();
    if odd.len() > LISTED {
        parts.push(format!("{} more PEs differ", odd.len() - LISTED));
    }
    parts.push(format!(
        "the other {} PEs: {}",
        records.len() - odd.len(),
        show(&records[common])
    ));
    parts.join("; ")
}

/// Runs `n` PEs as threads of this process, with a bootstrap root hosted here. Each thread
/// initialises its PE (binding its thread to a CPU as `RSHMEM_BIND` says, as
/// [`Pe::init_from_settings`] does), runs `f`, and finalizes when `f` returns Ok (a failed PE leaves
/// without finalize, so the others see it as died). Results are in rank order.
pub fn run_threads<R: Send>(
    n: usize,
    settings: Settings,
    f: impl Fn(&Pe) -> Result<R> + Sync,
) -> Result<Vec<Result<R>>> {
    if n == 0 {
        return Err(Error::InvalidArgument("run_threads: 0 PEs".into()));
    }
    settings.validate()?;
    crate::heap::check_thread_pes_mappings(n, settings.transport == TransportMode::Proxy)?;
    let token = random_token()?;
    let root = Root::bind("127.0.0.1:0", n, &token)?;
    let addr = root.local_addr().to_string();
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let cfg = PeConfig {
                    rank,
                    world_size: n,
                    root_addr: addr.clone(),
                    token: token.clone(),
                    settings: settings.clone(),
                };
                let f = &f;
                std::thread::Builder::new()
                    .name(format!("pe{rank}"))
                    .spawn_scoped(s, move || -> Result<R> {
                        let pe = Pe::init_with(cfg, None)?.bind_thread()?;
                        let r = f(&pe)?;
                        pe.finalize()?;
                        Ok(r)
                    })
                    .map_err(|e| Error::io("spawning a PE thread", e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok::<_, Error>(
            hs.into_iter()
                .enumerate()
                .map(|(rank, h)| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Verification(format!("PE {rank} panicked"))))
                })
                .collect(),
        )
    })?;
    root.wait_all_left(Duration::from_secs(1));
    Ok(out)
}

impl Drop for Pe {
    fn drop(&mut self) {
        // A heap registered with this process's fabric endpoint outlives the PE: the
        // endpoint keeps the registration and this PE's own mapping until it closes
        // (`FabricBackend::retire`: closing it now would let one late write to it drop the
        // connection that the process's other PEs share).
        let reg = match self.proxy.as_mut() {
            Some(p) => p.take_heap_mr(),
            None => self._fabric_keepalive.clone(),
        };
        if let Some((hca, mr)) = reg {
            // `assist` refers into this PE's own mapping: it goes first.
            drop(self.assist.take());
            if let Some(seg) = self.peers.get_mut(self.rank).and_then(Option::take) {
                crate::softhca::proxy::retire_heap(&hca, mr, Box::new(seg));
            }
        }
    }
}

/// Shares each PE's outcome of a local step, so that a failure on one PE becomes an error
/// naming it on every PE instead of a hang or a bare "peer died".
pub(crate) fn exchange_status<T>(
    boot: &Bootstrap,
    g: &Group,
    what: &str,
    r: &Result<T>,
) -> Result<()> {
    let mine = match r {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().into_bytes(),
    };
    let all = boot.allgather(g, &mine)?;
    if let Some((pe, msg)) = all.iter().enumerate().find(|(_, m)| !m.is_empty()) {
        if r.is_ok() {
            return Err(Error::PeerDied {
                pe,
                detail: format!("PE {pe} could not {what}: {}", String::from_utf8_lossy(msg)),
            });
        }
    }
    Ok(())
}

pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(a)
}

fn per_pe(v: &[u64], show: impl Fn(u64) -> String) -> String {
    v.iter()
        .enumerate()
        .take(32)
        .map(|(pe, &x)| format!("PE {pe}: {}", show(x)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// splitmix64's finaliser: a bijective mix of the 64 bits (the digests, hashes and the
/// deterministic generators share it).
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) fn fnv(b: &[u8]) -> u64 {
    fnv_from(FNV_OFFSET, b)
}

/// FNV-1a's starting value.
pub(crate) const FNV_OFFSET: u64 = 0xcbf29ce484222325;

/// FNV-1a of `b` continued from the hash `h` (to hash a sequence without joining it).
pub(crate) fn fnv_from(h: u64, b: &[u8]) -> u64 {
    b.iter()
        .fold(h, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3))
}

fn bytes_of<T>(count: usize) -> Result<usize> {
    count.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{count} elements of {} overflow the address space",
            std::any::type_name::<T>()
        ))
    })
}

fn align_of_elem<T>() -> usize {
    std::mem::align_of::<T>().clamp(16, MAX_ALIGN)
}

/// 32 random hex characters from the kernel's CSPRNG.
pub fn random_token() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::io("reading /dev/urandom for a job token", e))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Milliseconds since `t`, saturating.
pub(crate) fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis().min(u64::MAX as u128) as u64
}

/// What a PE tells the others about its libfabric endpoint: provider name, endpoint
/// address and heap region, each length-prefixed (u64 little-endian).
fn fabric_card(provider: &str, name: &[u8], region: &[u8]) -> Vec<u8> {
    let mut msg = Vec::new();
    for part in [provider.as_bytes(), name, region] {
        msg.extend_from_slice(&(part.len() as u64).to_le_bytes());
        msg.extend_from_slice(part);
    }
    msg
}

/// The endpoint address and heap region in PE `r`'s [`fabric_card`]. Refused when it opened
/// another provider than this PE (`provider`), or its address has another length than this
/// PE's (`name`: another address format, e.g. IPv6 against IPv4): libfabric reads a peer's
/// address in its own format, so a foreign one would be misread or overrun.
fn read_fabric_card<'a>(
    m: &'a [u8],
    r: usize,
    provider: &str,
    name: &[u8],
) -> Result<(&'a [u8], &'a [u8])> {
    let bad = || Error::InvalidArgument(format!("PE {r} sent a malformed fabric address"));
    let mut parts = Vec::with_capacity(3);
    let mut at = 0usize;
    for _ in 0..3 {
        let len = m.get(at..at + 8).map(le_u64).ok_or_else(bad)? as usize;
        let end = len
            .checked_add(8)
            .and_then(|x| at.checked_add(x))
            .ok_or_else(bad)?;
        parts.push(m.get(at + 8..end).ok_or_else(bad)?);
        at = end;
    }
    let theirs = String::from_utf8_lossy(parts[0]);
    if theirs != provider {
        return Err(Error::InvalidArgument(format!(
            "PE {r} opened libfabric provider {theirs}, this PE {provider}: every PE must \
             use the same one (set RSHMEM_FABRIC_PROVIDER to the same provider on every node)"
        )));
    }
    if parts[1].len() != name.len() {
        return Err(Error::InvalidArgument(format!(
            "PE {r}'s {provider} endpoint address is {} bytes, this PE's {}: their address \
             formats differ (IPv4 against IPv6, say); choose interfaces of one kind with \
             RSHMEM_FABRIC_DOMAIN",
            parts[1].len(),
            name.len()
        )));
    }
    Ok((parts[1], parts[2]))
}

#[cfg(test)]
mod tests {
    #[test]
    fn fabric_cards_of_another_provider_or_address_format_are_refused() {
        use super::{fabric_card, read_fabric_card};
        let card = fabric_card("tcp;ofi_rxm", &[1; 16], &[7; 24]);
        let (name, region) = read_fabric_card(&card, 3, "tcp;ofi_rxm", &[0; 16]).unwrap();
        assert_eq!((name, region), (&[1u8; 16][..], &[7u8; 24][..]));
        let e = read_fabric_card(&card, 3, "efa", &[0; 16])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PE 3 opened libfabric provider tcp;ofi_rxm, this PE efa: every PE must"),
            "{e}"
        );
        let e = read_fabric_card(&card, 3, "tcp;ofi_rxm", &[0; 28])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PE 3's tcp;ofi_rxm endpoint address is 16 bytes, this PE's 28"),
            "{e}"
        );
        let e = read_fabric_card(&card[..30], 3, "tcp;ofi_rxm", &[0; 16]).unwrap_err();
        assert!(
            e.to_string()
                .contains("PE 3 sent a malformed fabric address"),
            "{e}"
        );
        // A length that would overflow the offset: malformed, not a panic.
        let mut huge = card.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = read_fabric_card(&huge, 3, "tcp;ofi_rxm", &[0; 16]).unwrap_err();
        assert!(e.to_string().contains("malformed fabric address"), "{e}");
    }

    use super::describe_records;

    #[test]
    fn small_teams_list_every_member_in_order() {
        let members: Vec<u32> = (10..14).collect();
        let d = describe_records(&members, &[1, 1, 2, 1], |v| format!("n {v}"));
        assert_eq!(d, "PE 10: n 1; PE 11: n 1; PE 12: n 2; PE 13: n 1");
    }

    /// Past 32 members, the ones that differ come first: PE 35's wrong count is named.
    #[test]
    fn large_teams_name_the_members_that_differ_first() {
        let members: Vec<u32> = (0..40).collect();
        let mut counts = vec![16u64; 40];
        counts[35] = 8;
        let d = describe_records(&members, &counts, |v| format!("count {v}"));
        assert_eq!(d, "PE 35: count 8; the other 39 PEs: count 16");
        let mut counts = vec![1u64; 100];
        for c in counts.iter_mut().skip(50).step_by(1).take(34) {
            *c = 2;
        }
        let d = describe_records(&(0..100).collect::<Vec<u32>>(), &counts, |v| v.to_string());
        assert!(d.starts_with("PE 50: 2; PE 51: 2; "), "{d}");
        assert!(
            d.ends_with("PE 81: 2; 2 more PEs differ; the other 66 PEs: 1"),
            "{d}"
        );
    }
}
