//! `rshmem bench put|get|p|atomic|signal|barrier|broadcast|fcollect|alltoall|reduce`:
//! perftest-style benchmarks of the host operations, in the manner of NVSHMEM's perftest,
//! `ucx_perftest` and (collectives) the OSU and nccl-tests benchmarks.
//!
//! Method (per size): PE 0 and PE 1 measure, other PEs only join the barriers.
//! - Latency of put, p and signal is a ping-pong: PE 0 sends, PE 1 waits for the data (the
//!   last word of the put, the p'd word, or the signal) and answers the same way; the
//!   reported figure is half the round trip ("half_round_trip"). Latency of get and of the
//!   fetching atomic is the time of one blocking operation ("round_trip"), and of barrier
//!   the time of one `barrier_all` across all PEs, and of a collective the time of one
//!   call with every PE calling (PE 0's clock), with its algbw (bytes received per call
//!   over the median) as bandwidth; every PE checks the result of the last call.
//! - Round trips are timed in batches (16 operations for sizes up to 64 KiB, else 1) so
//!   the clock is not the measurement; median and p99 are over batches, the mean over all
//!   measured operations (ucx_perftest's "overall"; its "50.0%ile" is a median of single
//!   round trips, which a median of batch means is not: the batch means carry the tail).
//! - Warm-up: `--warmup` untimed operations before the timed ones, at most as many as
//!   are timed (a 32 MiB put times 20 round trips; 500 warm-up ones would dwarf them).
//! - Bandwidth: PE 0 streams `bw_iters` non-blocking operations of the size (`--iters`,
//!   at most 512 MiB in all for put, signal and get), then `quiet`; a quarter of them,
//!   at most `--warmup`, go first untimed.
//! - Every size is verified afterwards (the receiver checks every word of what arrived);
//!   a mismatch fails the benchmark with the position and values.

use crate::config::{LaunchInfo, Settings, TransportMode};
use crate::error::{Error, Result};
use crate::pe::{run_threads, Pe};
use crate::types::{Cmp, SignalOp, SymPtr};
use serde::Serialize;
use std::io::IsTerminal;
use std::time::Instant;

/// What to benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Put,
    Get,
    P,
    Atomic,
    Signal,
    Barrier,
    /// Team broadcast from PE 0 (world team, host/src/collectives.rs) of `size` bytes:
    /// one call with every PE calling (PE 0's clock); bandwidth = bytes a PE receives per
    /// call / median latency (nccl-tests' algbw); every PE checks the last call.
    Broadcast,
    /// Team fcollect (allgather) of `size`-byte blocks, measured as broadcast (at most
    /// 32 MiB of blocks per PE).
    Fcollect,
    /// Team alltoall of `size`-byte blocks, measured as broadcast (at most 32 MiB of
    /// blocks per PE).
    Alltoall,
    /// Team sum reduction of `size` bytes of u64 words to every PE, measured as broadcast.
    Reduce,
    /// The soft HCA engine alone: RDMA WRITEs through queue → engine → memory on one
    /// engine thread (no PEs), into a pre-touched 1 MiB destination, after a discarded 8 B
    /// row and a warm-up per row; at least 200 000 WRITEs per size (more with --iters), at
    /// most 1 GiB moved.
    Softhca,
    /// GPU only (`--device gpu`): device-to-device copy bandwidth (the rshmem_copy kernel
    /// and cuMemcpyDtoD) next to device put bandwidth, its PEs on one GPU (on a node with
    /// several, set RSHMEM_DEVICE).
    Copy,
}

/// `rshmem bench KIND [options]` or `rshmem bench ep [options]`: the host-operation
/// kinds share [`BenchArgs`]; the MoE dispatch/combine benchmark has its own arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchCommand {
    #[command(subcommand)]
    pub sub: Option<BenchSub>,
    #[command(flatten)]
    pub args: Option<BenchArgs>,
}

/// Benchmarks with their own arguments.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchSub {
    /// MoE expert-parallel LL dispatch + combine (DeepEP semantics), validated every run.
    Ep(crate::ep::bench::EpBenchArgs),
    /// WQEs/s GPU threads post through the device-side IBGDA producer (soft HCA
    /// discarding, or executing); --device gpu.
    IbgdaRate(crate::gpu::ibgda_rate::IbgdaRateArgs),
}

/// Entry point of `rshmem bench`: the process exit code.
pub fn run_command(c: BenchCommand) -> i32 {
    match (c.sub, c.args) {
        (Some(BenchSub::Ep(a)), _) => crate::ep::bench::run_cli(a),
        (Some(BenchSub::IbgdaRate(a)), _) => crate::gpu::ibgda_rate::run_cli(a),
        (None, Some(a)) => run_cli(a),
        (None, None) => {
            eprintln!(
                "rshmem bench: name a benchmark: put, get, p, atomic, signal, barrier, broadcast, \
                 fcollect, alltoall, reduce, softhca, ep or ibgda-rate"
            );
            2
        }
    }
}

/// Transports a benchmark can run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Loads and stores into peers' heaps mapped in this process (same node).
    P2p,
    /// mlx5 WQEs executed by the soft HCA (RSHMEM_TRANSPORT=proxy).
    Proxy,
    /// GPU PEs only: mlx5 WQEs that GPU threads write into a ConnectX NIC's queues
    /// (RSHMEM_TRANSPORT=ibgda).
    Ibgda,
}

/// Why `--transport ibgda` is refused on CPU PEs.
pub(crate) const IBGDA_NEEDS_GPU: &str = "--transport ibgda is for GPU PEs (GPU threads write the \
     NIC's queues): add --device gpu, or use p2p or proxy on CPU PEs";

/// `bench KIND --transport`: the transports these benchmarks run over.
fn kind_transport(s: &str) -> std::result::Result<Transport, String> {
    match s {
        "p2p" => Ok(Transport::P2p),
        "proxy" => Ok(Transport::Proxy),
        "ibgda" => Ok(Transport::Ibgda),
        _ => Err("expected p2p, proxy or ibgda (ibgda: --device gpu only)".into()),
    }
}

impl Transport {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::P2p => "p2p",
            Transport::Proxy => "proxy",
            Transport::Ibgda => "ibgda",
        }
    }
    pub(crate) fn mode(self) -> TransportMode {
        match self {
            Transport::P2p => TransportMode::P2p,
            Transport::Proxy => TransportMode::Proxy,
            Transport::Ibgda => TransportMode::Ibgda,
        }
    }

    /// Under a launcher the PEs' environment chose the transport: refuses a `--transport`
    /// that differs (`auto` counts as p2p: node-local peers take p2p under it).
    pub(crate) fn check_launched(self, settings: &Settings) -> Result<()> {
        if settings.transport == self.mode()
            || (settings.transport == TransportMode::Auto && self == Transport::P2p)
        {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "--transport {} but RSHMEM_TRANSPORT={}: under a launcher, export \
             RSHMEM_TRANSPORT={} to every PE",
            self.name(),
            settings.transport.name(),
            self.name()
        )))
    }
}

/// Arguments of `rshmem bench <kind>`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Operation to measure.
    #[arg(value_enum)]
    pub kind: Kind,
    /// PEs to start when not launched as a PE (as threads of this process; default 2).
    /// Under a launcher the job's size is the PE count: --pes may only repeat it.
    #[arg(long)]
    pub pes: Option<usize>,
    /// Smallest message size (bytes; units like 64K accepted).
    #[arg(long, default_value = "8", value_parser = parse_size_arg)]
    pub min_size: usize,
    /// Largest message size (bytes; units like 32M accepted). Sizes double from min to max.
    #[arg(long, default_value = "32M", value_parser = parse_size_arg)]
    pub max_size: usize,
    /// Measured iterations per size (rounded up to whole batches of 16 below 64 KiB; the
    /// JSON's `iters` is the count measured). Large sizes use fewer (at least 20): a
    /// latency run's messages add up to at most 256 MiB per size in each direction, a
    /// bandwidth run's to at most 512 MiB (`bw_iters`).
    #[arg(long, default_value_t = 10_000)]
    pub iters: usize,
    /// Unmeasured warm-up iterations per size (default 500; at most the measured count of
    /// the size). CPU PEs only.
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Device whose memory holds the heap: cpu (host operations) or gpu (device-initiated
    /// operations of the GPU bench kernels, PEs as threads sharing the GPU(s)).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "gpu"])]
    pub device: String,
    /// GPU: scope of the device operation (thread, warp or block; default thread).
    #[arg(long, value_parser = ["thread", "warp", "block"])]
    pub scope: Option<String>,
    /// GPU: kernel launches per size (median and p99 are over launches; default 10).
    #[arg(long)]
    pub reps: Option<usize>,
    /// GPU: the kernel manifest to use instead of the embedded one
    /// (device-kernels/src/rshmem_device_tests.json; also RSHMEM_GPU_MANIFEST).
    #[arg(long)]
    pub manifest: Option<std::path::PathBuf>,
    /// Transport between the PEs: p2p or proxy; with --device gpu also ibgda (GPU
    /// threads write a ConnectX NIC's queues). Default: RSHMEM_TRANSPORT's (p2p when it
    /// is unset or auto). Under a launcher it must match the PEs' RSHMEM_TRANSPORT.
    #[arg(long, value_parser = kind_transport)]
    pub transport: Option<Transport>,
    /// put and signal: where the source buffer lives — `heap` (a symmetric allocation, as
    /// in NVSHMEM's perftest and the OSU OpenSHMEM benchmarks; large p2p puts may then be
    /// shared with a waiting target, RSHMEM_P2P_ASSIST) or `private` (page-aligned
    /// process memory; the initiator copies alone).
    /// CPU PEs only; default heap.
    #[arg(long, value_parser = ["heap", "private"])]
    pub source: Option<String>,
    /// Collectives: how a call is timed. `back-to-back` (default): PE 0's clock over
    /// batches of calls with nothing between them, so a root that returns early (an MPI
    /// broadcast root after its eager sends) times less than the call costs the others.
    /// `slowest`: a barrier before every call, and a call's time is the slowest PE's (the
    /// max of every PE's time for that call, OSU's max column); one call per sample.
    #[arg(long, value_parser = ["back-to-back", "slowest"])]
    pub timing: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_size_arg(s: &str) -> std::result::Result<usize, String> {
    crate::config::parse_size(s)
}

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub size: usize,
    pub latency_us_median: f64,
    pub latency_us_p99: f64,
    /// Mean over all measured operations (total measured time / operations): the statistic
    /// ucx_perftest calls "overall" latency. The median above is a median of batch means.
    pub latency_us_mean: f64,
    /// None for barrier.
    pub bandwidth_gbps: Option<f64>,
    pub iters: usize,
    pub bw_iters: usize,
    /// put and signal: the share of the bandwidth stream's bytes that the target copied
    /// while it waited (assist.rs); 0 when nothing was shared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bw_assisted: Option<f64>,
}

impl Row {
    /// The latency columns from per-operation samples (see [`stats`]); no bandwidth.
    fn from_samples(size: usize, samples: Vec<f64>, iters: usize) -> Row {
        let (med, p99, mean) = stats(samples);
        Row {
            size,
            latency_us_median: med,
            latency_us_p99: p99,
            latency_us_mean: mean,
            bandwidth_gbps: None,
            iters,
            bw_iters: 0,
            bw_assisted: None,
        }
    }
}

/// Per-operation microseconds of `batches` batches of `batch` calls of `f`, one sample per
/// batch (the barrier and the collectives: every PE calls).
fn timed_batches(
    batches: usize,
    batch: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6 / batch as f64);
    }
    Ok(samples)
}

/// `--timing slowest`: `calls` calls of `f` (a collective every PE of `team`, the world,
/// makes), each after a barrier; per call the slowest PE's microseconds, the maximum of
/// every PE's nanoseconds taken with a reduction over the team after the timed calls.
fn slowest_calls(
    pe: &Pe,
    team: &crate::team::Team,
    calls: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    // On an error this PE returns at once, as every bench step does (its buffers are not
    // freed: `free` is collective, and the other PEs are elsewhere).
    let mine = pe.calloc::<u64>(calls)?;
    let most = pe.calloc::<u64>(calls)?;
    let mut ns = Vec::with_capacity(calls);
    for _ in 0..calls {
        pe.barrier_all()?;
        let t = Instant::now();
        f()?;
        ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    pe.put(mine.slice(0..calls), &ns, pe.my_pe())?;
    pe.reduce(
        team,
        most.slice(0..calls),
        mine.slice(0..calls),
        calls,
        crate::collectives::ReduceOp::Max,
    )?;
    pe.get(&mut ns, most.slice(0..calls), pe.my_pe())?;
    pe.free(most)?;
    pe.free(mine)?;
    Ok(ns.into_iter().map(|n| n as f64 / 1e3).collect())
}

/// A whole benchmark result, as printed by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub bench: Kind,
    pub pes: usize,
    pub device: String,
    pub transport: &'static str,
    /// `RSHMEM_BIND` of PE 0: "auto", "core" or "none".
    pub bind: &'static str,
    /// The CPU each PE's thread was bound to at init, by PE; null: not bound.
    pub bound_cpus: Vec<Option<usize>>,
    /// Collectives: "back-to-back" or "slowest" (--timing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<&'static str>,
    /// The libfabric provider, when this PE opened an endpoint (peers on other nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    pub latency_kind: &'static str,
    /// put and signal: "heap" or "private" (--source).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub rows: Vec<Row>,
}

impl BenchArgs {
    /// The transport: `--transport`, else RSHMEM_TRANSPORT's as [`BenchArgs::resolve`]
    /// took it, else p2p.
    pub fn transport(&self) -> Transport {
        self.transport.unwrap_or(Transport::P2p)
    }

    /// Fills in what the environment decides: without `--transport`, RSHMEM_TRANSPORT's
    /// choice (before 2026-12-07 the flag defaulted to p2p, so `RSHMEM_TRANSPORT=proxy
    /// rshmem bench put` measured p2p, and under a launcher was refused for a flag nobody
    /// gave).
    pub fn resolve(&mut self) -> Result<()> {
        // bench copy and bench softhca use no transport: only a --transport given is
        // refused there.
        if self.transport.is_none() && !matches!(self.kind, Kind::Copy | Kind::Softhca) {
            self.transport = Some(match Settings::from_env()?.transport {
                TransportMode::Proxy => Transport::Proxy,
                TransportMode::Ibgda => Transport::Ibgda,
                TransportMode::P2p | TransportMode::Auto => Transport::P2p,
            });
        }
        Ok(())
    }

    /// `--pes`, or its default.
    pub fn pe_count(&self) -> usize {
        self.pes.unwrap_or(2)
    }

    /// Warm-up iterations before `measured` timed ones: `--warmup` (default 500), at
    /// most `measured`, so that the few iterations of a large size are not outweighed by
    /// their warm-up.
    fn warmup_for(&self, measured: usize) -> usize {
        self.warmup.unwrap_or(500).min(measured)
    }

    /// `--timing slowest` (collectives only; refused elsewhere by `unused_options`).
    fn slowest(&self) -> bool {
        self.timing.as_deref() == Some("slowest")
    }

    /// `--source`, or its default (heap).
    fn source(&self) -> &str {
        self.source.as_deref().unwrap_or("heap")
    }

    /// The options given that this benchmark would not use, each with why; empty when
    /// every option given applies. (Options with a default are checked by the value they
    /// change: `--transport proxy` on softhca.)
    fn unused_options(&self) -> Vec<String> {
        let gpu = self.device == "gpu";
        let mut out = Vec::new();
        if self.kind == Kind::Softhca {
            for (flag, given) in [
                ("--pes", self.pes.is_some()),
                ("--warmup", self.warmup.is_some()),
                ("--source", self.source.is_some()),
                ("--timing", self.timing.is_some()),
                (
                    "--transport",
                    self.transport.is_some_and(|t| t != Transport::P2p),
                ),
            ] {
                if given {
                    out.push(format!(
                        "{flag}: bench softhca measures the engine alone (one producer, one \
                         engine thread, no PEs; it discards a first row instead of warming up)"
                    ));
                }
            }
            return out;
        }
        if gpu && self.warmup.is_some() {
            out.push(
                "--warmup: GPU benches warm up inside each kernel launch; --reps sets the \
                 launches"
                    .into(),
            );
        }
        if self.source.is_some() && (gpu || !matches!(self.kind, Kind::Put | Kind::Signal)) {
            out.push("--source: only CPU put and signal have a source buffer to place".into());
        }
        if self.timing.is_some() && (gpu || !self.kind.collective()) {
            out.push(
                "--timing: only the CPU collectives (broadcast, fcollect, alltoall, reduce) \
                 choose how a call is timed"
                    .into(),
            );
        }
        if gpu && self.iters > GPU_MAX_ITERS {
            out.push(format!(
                "--iters {}: GPU benches time at most {GPU_MAX_ITERS} operations per launch",
                self.iters
            ));
        }
        out
    }
}

/// Most `--iters` of a GPU bench (the bench kernels' per-launch count).
const GPU_MAX_ITERS: usize = 100_000;

/// Under a launcher the job's size is the PE count: a `--pes` given there must be that
/// size (it was ignored before). Not launched, or no `--pes`: nothing to check.
pub(crate) fn launched_pes_match(pes: Option<&[usize]>) -> std::result::Result<(), String> {
    let (Some(pes), Ok(Some(info))) = (pes, LaunchInfo::from_env()) else {
        return Ok(());
    };
    if pes == [info.world_size] {
        return Ok(());
    }
    let given: Vec<String> = pes.iter().map(|p| p.to_string()).collect();
    Err(format!(
        "--pes {}: this process is a PE of a job of {} PEs, whose size is the PE count \
         under a launcher (omit --pes, or start the job with that many)",
        given.join(","),
        info.world_size
    ))
}

/// Entry point of the CLI: returns the process exit code.
pub fn run_cli(args: BenchArgs) -> i32 {
    if let Err(e) = launched_pes_match(args.pes.map(|p| vec![p]).as_deref()) {
        eprintln!("rshmem bench {}: {e}", args.kind.name());
        return 2;
    }
    let unused = args.unused_options();
    if !unused.is_empty() {
        eprintln!("rshmem bench {}: {}", args.kind.name(), unused.join("; "));
        return 2;
    }
    let mut args = args;
    if let Err(e) = args.resolve() {
        // A bad environment: the error every bench gives for it (exit 1).
        eprintln!("rshmem bench: {e}");
        return 1;
    }
    if let Err(e) = validate_counts(&args).and_then(|()| validate_sizes(&args)) {
        eprintln!("rshmem bench: {e}");
        return 1;
    }
    if args.device == "gpu" {
        return gpu_cli(&args);
    }
    let gpu_only: Vec<&str> = [
        ("--scope", args.scope.is_some()),
        ("--reps", args.reps.is_some()),
        ("--manifest", args.manifest.is_some()),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    if !gpu_only.is_empty() {
        eprintln!(
            "rshmem bench {}: {} only appl{} to GPU benches (add --device gpu); CPU PEs run \
             host operations",
            args.kind.name(),
            gpu_only.join(", "),
            if gpu_only.len() == 1 { "ies" } else { "y" }
        );
        return 2;
    }
    if args.kind == Kind::Copy {
        eprintln!("rshmem bench copy: a GPU benchmark; pass --device gpu");
        return 2;
    }
    if args.transport() == Transport::Ibgda {
        eprintln!("rshmem bench {}: {IBGDA_NEEDS_GPU}", args.kind.name());
        return 2;
    }
    if args.kind == Kind::Softhca {
        return match engine_bench(&args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("rshmem bench: {e}");
                1
            }
        };
    }
    match run(&args) {
        Ok(Some(rep)) => {
            print_report(&rep, args.json);
            0
        }
        Ok(None) => 0, // a PE other than 0 under a launcher
        Err(e) => {
            eprintln!("rshmem bench: {e}");
            1
        }
    }
}

/// `rshmem bench KIND --device gpu`.
fn gpu_cli(a: &BenchArgs) -> i32 {
    let op = match a.kind {
        Kind::Put => "put",
        Kind::Get => "get",
        Kind::P => "p",
        Kind::Atomic => "atomic",
        Kind::Signal => "signal",
        Kind::Copy => "copy",
        Kind::Barrier
        | Kind::Softhca
        | Kind::Broadcast
        | Kind::Fcollect
        | Kind::Alltoall
        | Kind::Reduce => {
            eprintln!(
                "rshmem bench {} --device gpu: not a GPU benchmark (GPU: put, get, p, atomic, signal, copy)",
                a.kind.name()
            );
            return 2;
        }
    };
    if a.kind == Kind::Copy && a.transport() != Transport::P2p {
        eprintln!(
            "rshmem bench copy --device gpu: --transport {}: the copy bench measures one \
             GPU's device-to-device copy and uses no transport",
            a.transport().name()
        );
        return 2;
    }
    crate::gpu::runner::bench_cli(crate::gpu::runner::BenchOpts {
        op: op.to_string(),
        scope: a.scope.clone().unwrap_or_else(|| "thread".into()),
        pes: a.pe_count(),
        min_size: a.min_size,
        max_size: a.max_size,
        iters: a.iters,
        reps: a.reps.unwrap_or(10),
        transport: a.transport(),
        json: a.json,
        sources: crate::gpu::runner::Sources::from_env(a.manifest.clone()),
    })
}

/// Runs the benchmark; Some(report) on the PE that reports (PE 0).
pub fn run(args: &BenchArgs) -> Result<Option<Report>> {
    validate(args)?;
    if args.kind == Kind::Copy || args.device != "cpu" {
        return Err(Error::InvalidArgument(
            "bench copy and --device gpu run through the GPU runner (rshmem bench ... --device gpu)".into(),
        ));
    }
    if args.transport() == Transport::Ibgda {
        return Err(Error::InvalidArgument(IBGDA_NEEDS_GPU.into()));
    }
    if args.kind == Kind::Softhca {
        return Err(Error::InvalidArgument(
            "bench softhca has no PEs: run it from the command line".into(),
        ));
    }
    if LaunchInfo::from_env()?.is_some() {
        args.transport().check_launched(&Settings::from_env()?)?;
        let pe = Pe::init()?;
        if pe.n_pes() < 2 && !args.kind.all_pes() {
            return Err(Error::InvalidArgument(format!(
                "bench {} needs at least 2 PEs, the job has {}",
                args.kind.name(),
                pe.n_pes()
            )));
        }
        let r = bench_pe(&pe, args)?;
        pe.finalize()?;
        return Ok(r);
    }
    if args.pe_count() < 2 && !args.kind.all_pes() {
        return Err(Error::InvalidArgument(format!(
            "bench {} needs --pes 2 or more (got {})",
            args.kind.name(),
            args.pe_count()
        )));
    }
    let settings = Settings::from_env()?;
    // Destination (and heap source) of the largest size, plus room; collectives: a source
    // and a destination of PEs blocks each, at most COLL_BUF_MAX.
    let need = if args.kind.collective() {
        // --timing slowest: every PE's per-call times and their maximum, 8 bytes a call.
        let times = if args.slowest() {
            16usize.saturating_mul(args.iters)
        } else {
            0
        };
        (2 * COLL_BUF_MAX.min(args.max_size.saturating_mul(args.pe_count())) + (4 << 20))
            .saturating_add(times)
    } else {
        // The largest size measured, not --max-size: barrier, atomic and p move a word
        // whatever it says (before 2026-12-07 `bench barrier --max-size 1T` was refused
        // for a 3 TiB heap it never used, and the default 32M took 100 MiB per PE).
        let largest = sizes(args.kind, args.min_size, args.max_size)
            .into_iter()
            .max()
            .unwrap_or(8)
            .max(8);
        largest.saturating_mul(3).saturating_add(4 << 20)
    };
    // A collective size that no PE could run is refused before any PE starts (bench_pe
    // checks the same on every PE of a launched job).
    coll_sizes(args, args.pe_count())?;
    // The PEs are threads of this process, so their heaps all come from this node.
    if let Some(mem) = crate::heap::node_memory_bytes() {
        let all = need as u128 * args.pe_count() as u128;
        if all > mem {
            let h = crate::doctor::human_bytes_wide;
            return Err(Error::InvalidArgument(format!(
                "bench {}: --max-size {} needs a {} heap on each of {} PEs ({}), more than \
                 this node's memory ({} of RAM and swap): lower --max-size{}",
                args.kind.name(),
                h(args.max_size as u128),
                h(need as u128),
                args.pe_count(),
                h(all),
                h(mem),
                if args.slowest() {
                    " or --iters (--timing slowest keeps 16 bytes per call)"
                } else {
                    ""
                }
            )));
        }
    }
    let mut settings = settings;
    settings.transport = args.transport().mode();
    if settings.symmetric_size < need {
        settings.symmetric_size = need.next_multiple_of(1 << 20);
    }
    let mut out = run_threads(args.pe_count(), settings, |pe| bench_pe(pe, args))?;
    // Report a failed check first, then the first failure (by rank) that is not only
    // another PE's death, then any: a PE that failed a check leaves, and the others then
    // fail naming it (or time out waiting for it, if they wait where the death is not
    // seen yet), which would hide its own error (before 2026-12-07 PE 0's "PE 1 died" hid
    // PE 1's verification error).
    let first =
        |want: &dyn Fn(&Error) -> bool| out.iter().position(|r| matches!(r, Err(e) if want(e)));
    let cause = first(&|e| matches!(e, Error::Verification(_)))
        .or_else(|| first(&|e| !matches!(e, Error::PeerDied { .. })))
        .or_else(|| first(&|_| true));
    if let Some(i) = cause {
        if let Err(e) = &mut out[i] {
            return Err(std::mem::replace(e, Error::Launch(String::new())));
        }
    }
    Ok(out.into_iter().next().and_then(|r| r.ok()).flatten())
}

/// Most `--iters` (and `--warmup`) of any bench: far beyond any useful run, and small
/// enough that the counts derived from it cannot overflow.
pub const MAX_ITERS: usize = 1_000_000_000;

/// Largest `--max-size` of any bench (1 TiB): the heap sizes derived from it cannot
/// overflow.
pub const MAX_SIZE: usize = 1 << 40;

/// The counts every bench checks, CPU and GPU alike, before anything starts (before
/// 2026-12-07 the GPU path let `--min-size 0` through, and its size list doubled 0 for
/// ever).
fn validate_counts(a: &BenchArgs) -> Result<()> {
    if a.kind != Kind::Barrier
        && (a.min_size == 0 || a.min_size > a.max_size || a.max_size > MAX_SIZE)
    {
        return Err(Error::InvalidArgument(format!(
            "--min-size {} / --max-size {}: need 1 <= min <= max <= {MAX_SIZE} (1T)",
            a.min_size, a.max_size
        )));
    }
    if a.iters == 0 || a.iters > MAX_ITERS {
        return Err(Error::InvalidArgument(format!(
            "--iters {}: need 1..={MAX_ITERS}",
            a.iters
        )));
    }
    if a.warmup.is_some_and(|w| w > MAX_ITERS) {
        return Err(Error::InvalidArgument(format!(
            "--warmup {}: at most {MAX_ITERS}",
            a.warmup.unwrap_or(0)
        )));
    }
    if a.reps.is_some_and(|r| r == 0 || r > MAX_ITERS) {
        return Err(Error::InvalidArgument(format!(
            "--reps {}: need 1..={MAX_ITERS}",
            a.reps.unwrap_or(0)
        )));
    }
    Ok(())
}

fn validate(a: &BenchArgs) -> Result<()> {
    validate_counts(a)?;
    validate_sizes(a)?;
    if a.pe_count() == 0 || a.pe_count() > 1024 {
        return Err(Error::InvalidArgument(format!(
            "--pes {} is out of range 1..=1024",
            a.pe_count()
        )));
    }
    Ok(())
}

/// Sizes a kind cannot measure are refused, not replaced by ones it can (CPU and GPU
/// benches alike).
fn validate_sizes(a: &BenchArgs) -> Result<()> {
    let range = |lo: usize, hi: usize| a.min_size <= hi && a.max_size >= lo;
    match a.kind {
        Kind::Atomic if !range(8, 8) => {
            return Err(Error::InvalidArgument(format!(
                "bench atomic measures 8-byte atomics: --min-size {} / --max-size {} must \
                 include 8",
                a.min_size, a.max_size
            )));
        }
        Kind::P if !range(4, 4) && !range(8, 8) => {
            return Err(Error::InvalidArgument(format!(
                "bench p moves one 4- or 8-byte element: --min-size {} / --max-size {} must \
                 include 4 or 8",
                a.min_size, a.max_size
            )));
        }
        Kind::Put | Kind::Get | Kind::Signal if a.min_size % 8 != 0 => {
            return Err(Error::InvalidArgument(format!(
                "--min-size {}: bench {} moves whole 8-byte words (each message's last word \
                 is what the receiver polls and checks): use a multiple of 8",
                a.min_size,
                a.kind.name()
            )));
        }
        k if k.collective() && a.min_size % 8 != 0 => {
            return Err(Error::InvalidArgument(format!(
                "--min-size {}: bench {} moves whole 8-byte words (u64 elements): use a \
                 multiple of 8",
                a.min_size,
                k.name()
            )));
        }
        _ => {}
    }
    Ok(())
}

/// Largest collective buffer per PE (fcollect and alltoall hold PEs × size bytes).
const COLL_BUF_MAX: usize = 32 << 20;

impl Kind {
    /// The name on the command line (`put`, `ibgda-rate`, ...).
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }

    /// The collectives (every PE calls, every PE's result checked).
    pub fn collective(self) -> bool {
        matches!(
            self,
            Kind::Broadcast | Kind::Fcollect | Kind::Alltoall | Kind::Reduce
        )
    }

    /// Benchmarks over all PEs, which also run with one PE.
    fn all_pes(self) -> bool {
        self == Kind::Barrier || self.collective()
    }

    /// Blocks of `size` bytes in a PE's collective buffers.
    fn coll_blocks(self, n_pes: usize) -> usize {
        match self {
            Kind::Fcollect | Kind::Alltoall => n_pes,
            _ => 1,
        }
    }
}

/// The sizes measured for `kind`.
pub fn sizes(kind: Kind, min: usize, max: usize) -> Vec<usize> {
    match kind {
        Kind::Barrier => vec![0],
        Kind::Atomic => vec![8],
        Kind::P => {
            // p moves one 4- or 8-byte element; sizes outside [min, max] are skipped.
            let v: Vec<usize> = [4usize, 8]
                .into_iter()
                .filter(|&s| s >= min && s <= max)
                .collect();
            if v.is_empty() {
                vec![8]
            } else {
                v
            }
        }
        _ => {
            // Word-based verification and polling need multiples of 8 (at least one word:
            // a 0 would double to itself for ever).
            let mut s = min.max(1).next_multiple_of(8);
            let mut v = Vec::new();
            while s <= max.max(8) {
                v.push(s);
                s = match s.checked_mul(2) {
                    Some(x) => x,
                    None => break,
                };
            }
            v
        }
    }
}

/// The sizes `a` measures with `n_pes` PEs: for collectives, those whose blocks fit the
/// collective buffer, and an error when none does.
fn coll_sizes(a: &BenchArgs, n_pes: usize) -> Result<Vec<usize>> {
    let blocks = a.kind.coll_blocks(n_pes);
    let mut sizes = sizes(a.kind, a.min_size, a.max_size);
    if a.kind.collective() {
        sizes.retain(|&s| s.saturating_mul(blocks) <= COLL_BUF_MAX);
        if sizes.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "bench {}: --min-size {} times {blocks} PEs passes the {} MiB collective \
                 buffer",
                a.kind.name(),
                a.min_size,
                COLL_BUF_MAX >> 20
            )));
        }
    }
    Ok(sizes)
}

fn bench_pe(pe: &Pe, a: &BenchArgs) -> Result<Option<Report>> {
    let blocks = a.kind.coll_blocks(pe.n_pes());
    let sizes = coll_sizes(a, pe.n_pes())?;
    let bound_cpus = bound_cpus(pe)?;
    let max = sizes.iter().copied().max().unwrap_or(8).max(8);
    let coll = if a.kind.collective() {
        Some((
            pe.calloc::<u64>(max / 8 * blocks)?,
            pe.calloc::<u64>(max / 8 * blocks)?,
        ))
    } else {
        None
    };
    let buf = pe.calloc::<u64>(if coll.is_some() { 1 } else { max / 8 })?;
    let aux = pe.calloc::<u64>(8)?;
    let put_like_kind = matches!(a.kind, Kind::Put | Kind::Signal);
    let heap_src = if put_like_kind && a.source() == "heap" {
        Some(pe.calloc::<u64>(max / 8)?)
    } else {
        None
    };
    let bar = (pe.my_pe() == 0 && !a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(sizes.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} sizes")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message(format!("bench {}", a.kind.name()));
        b
    });
    let mut rows = Vec::new();
    for (si, &size) in sizes.iter().enumerate() {
        let salt = (si as u64 + 1) << 48;
        let row = match a.kind {
            Kind::Put | Kind::Signal => put_like(pe, a, buf, aux, heap_src, size, salt)?,
            Kind::Get => get_row(pe, a, buf, size, salt)?,
            Kind::P => p_row(pe, a, aux, size, salt)?,
            Kind::Atomic => atomic_row(pe, a, aux)?,
            Kind::Barrier => barrier_row(pe, a)?,
            Kind::Broadcast | Kind::Fcollect | Kind::Alltoall | Kind::Reduce => {
                let (src, dst) = coll.expect("allocated for collectives");
                coll_row(pe, a, src, dst, size, salt)?
            }
            Kind::Softhca | Kind::Copy => unreachable!("handled before PEs start"),
        };
        rows.push(row);
        if let Some(b) = &bar {
            b.inc(1);
        }
        pe.barrier_all()?;
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Some(h) = heap_src {
        pe.free(h)?;
    }
    if let Some((src, dst)) = coll {
        pe.free(dst)?;
        pe.free(src)?;
    }
    pe.free(aux)?;
    pe.free(buf)?;
    Ok((pe.my_pe() == 0).then(|| Report {
        bench: a.kind,
        pes: pe.n_pes(),
        device: "cpu".into(),
        // "p2p", "proxy" (soft HCA, node-local backend) or "proxy-fabric" (libfabric).
        transport: pe
            .transport_to((pe.my_pe() + 1) % pe.n_pes())
            .unwrap_or("p2p"),
        provider: pe.fabric_provider().map(str::to_string),
        latency_kind: match a.kind {
            Kind::Put | Kind::P | Kind::Signal => "half_round_trip",
            Kind::Get | Kind::Atomic => "round_trip",
            Kind::Barrier | Kind::Softhca | Kind::Copy => "barrier",
            Kind::Broadcast | Kind::Fcollect | Kind::Alltoall | Kind::Reduce => "collective",
        },
        source: put_like_kind.then(|| a.source().to_string()),
        bind: pe.settings.bind.name(),
        bound_cpus,
        timing: a.kind.collective().then_some(if a.slowest() {
            "slowest"
        } else {
            "back-to-back"
        }),
        rows,
    }))
}

/// Every PE's [`Pe::bound_cpu`], by PE (an fcollect over the world).
fn bound_cpus(pe: &Pe) -> Result<Vec<Option<usize>>> {
    let n = pe.n_pes();
    let mine = pe.calloc::<u64>(1)?;
    let all = pe.calloc::<u64>(n)?;
    let code = pe.bound_cpu().map_or(0, |c| c as u64 + 1);
    pe.put(mine, &[code], pe.my_pe())?;
    pe.fcollect(pe.world(), all, mine, 1)?;
    let mut v = vec![0u64; n];
    pe.get(&mut v, all, pe.my_pe())?;
    pe.free(all)?;
    pe.free(mine)?;
    Ok(v.into_iter()
        .map(|c| c.checked_sub(1).map(|c| c as usize))
        .collect())
}

/// Word `i` of the payload of size `size` in iteration `tag` (non-zero, position-dependent).
fn word(i: usize, tag: u64) -> u64 {
    (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ tag
}

fn fill(v: &mut [u64], tag: u64) {
    for (i, w) in v.iter_mut().enumerate() {
        *w = word(i, tag);
    }
}

fn verify(pe: &Pe, what: &str, got: &[u64], tag: u64) -> Result<()> {
    if let Some(i) = got.iter().enumerate().position(|(i, &g)| g != word(i, tag)) {
        return Err(Error::Verification(format!(
            "PE {}: {what}: word {i} of {} is {:#x}, expected {:#x}",
            pe.my_pe(),
            got.len(),
            got[i],
            word(i, tag)
        )));
    }
    Ok(())
}

fn batch_for(size: usize) -> usize {
    if size <= 64 << 10 {
        16
    } else {
        1
    }
}

fn bw_iters(a: &BenchArgs, size: usize) -> usize {
    a.iters.min(((512usize << 20) / size.max(1)).max(20))
}

fn lat_iters(a: &BenchArgs, size: usize) -> usize {
    a.iters.min(((256usize << 20) / size.max(1)).max(20))
}

/// Median, p99 and mean of samples (here: per-operation microseconds, one value per
/// equal-sized batch, so the mean of the batches is the mean over all operations); zeros
/// for no samples. The one definition every rshmem bench uses, CPU and GPU alike, and
/// the NVSHMEM ping-pong of gpu-check (bench/nvshmem/pingpong.cu): the median of an even
/// count is the mean of the two middle samples, p99 is the nearest-rank sample
/// (ceil(0.99 n), 1-based).
pub fn stats(mut samples: Vec<f64>) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let med = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
    let mean = samples.iter().sum::<f64>() / n as f64;
    (med, samples[rank - 1], mean)
}

/// A zeroed buffer of `words` u64 that starts on a page boundary, as the send buffers of
/// ucx_perftest and NVSHMEM's perftest do. A malloc'd block starts 16 bytes into a page;
/// a 1 MiB copy from there measured 5-8 % slower on the build machine (loads that straddle
/// cache lines), which would make the comparison with those tools unfair.
struct PageAligned {
    store: Vec<u64>,
    off: usize,
    len: usize,
}

impl PageAligned {
    fn zeroed(words: usize) -> PageAligned {
        let page_words = crate::config::page_size() / 8;
        let store = vec![0u64; words + page_words];
        let off =
            (store.as_ptr() as usize).next_multiple_of(page_words * 8) - store.as_ptr() as usize;
        PageAligned {
            store,
            off: off / 8,
            len: words,
        }
    }
}

impl std::ops::Deref for PageAligned {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.store[self.off..self.off + self.len]
    }
}

impl std::ops::DerefMut for PageAligned {
    fn deref_mut(&mut self) -> &mut [u64] {
        &mut self.store[self.off..self.off + self.len]
    }
}

/// put and signal: ping-pong latency, streaming bandwidth, verification.
fn put_like(
    pe: &Pe,
    a: &BenchArgs,
    buf: SymPtr<u64>,
    aux: SymPtr<u64>,
    heap_src: Option<SymPtr<u64>>,
    size: usize,
    salt: u64,
) -> Result<Row> {
    let me = pe.my_pe();
    let words = size / 8;
    let dest = buf.slice(0..words);
    let sig = aux.at(0);
    let signal = a.kind == Kind::Signal;
    let mut private;
    let src: &mut [u64] = match heap_src {
        Some(h) => {
            let p = pe.ptr(h.slice(0..words), me).ok_or_else(|| {
                Error::InvalidArgument("bench: the heap source is not mapped".into())
            })?;
            // SAFETY: `words` u64s of this PE's own heap, a private allocation of this
            // bench that no other PE writes; peers only read it while a put of it runs
            // (assisted puts), when this function holds no other borrow of it.
            unsafe { std::slice::from_raw_parts_mut(p, words) }
        }
        None => {
            private = PageAligned::zeroed(words);
            &mut private
        }
    };
    fill(src, 0);
    let iters = lat_iters(a, size);
    let batch = batch_for(size);
    let measured = iters.div_ceil(batch) * batch;
    let warmup = a.warmup_for(measured);
    let total = warmup + measured;
    pe.atomic_set(sig, 0u64, me)?;
    pe.barrier_all()?;
    let mut samples = Vec::with_capacity(total / batch);
    if me < 2 {
        let peer = 1 - me;
        // One round trip: PE 0 sends first and PE 1 answers, each waiting for the other's
        // message to land (the last word of the put, or the signal).
        let mut exchange = |tag: u64| -> Result<()> {
            for turn in 0..2 {
                if turn == me {
                    src[words - 1] = tag;
                    if signal {
                        pe.put_signal(dest, &*src, sig, tag, SignalOp::Set, peer)?;
                    } else {
                        pe.put(dest, &*src, peer)?;
                    }
                } else if signal {
                    pe.signal_wait_until(sig, Cmp::Eq, tag)?;
                } else {
                    pe.wait_until(dest.at(words - 1), Cmp::Eq, tag)?;
                }
            }
            Ok(())
        };
        let mut it = 0u64;
        for _ in 0..warmup {
            it += 1;
            exchange(salt | it)?;
        }
        for _ in 0..measured / batch {
            let t0 = Instant::now();
            for _ in 0..batch {
                it += 1;
                exchange(salt | it)?;
            }
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / (2 * batch) as f64);
        }
    }
    pe.barrier_all()?;
    // Latency check: the whole last message arrived (not only its final word).
    if me < 2 {
        let last = salt | total as u64;
        let mut got = vec![0u64; words];
        pe.get(&mut got, dest, me)?;
        verify(pe, "ping-pong payload", &got[..words - 1], 0)?;
        if got[words - 1] != last {
            return Err(Error::Verification(format!(
                "PE {me}: ping-pong ended with tag {:#x}, expected {last:#x}",
                got[words - 1]
            )));
        }
    }
    pe.barrier_all()?;
    // Bandwidth: PE 0 streams to PE 1.
    let bw_n = bw_iters(a, size);
    pe.atomic_set(sig, 0u64, me)?;
    pe.barrier_all()?;
    let mut bw = 0.0;
    let mut assisted = 0.0;
    let bw_tag = salt | 0xB000_0000;
    if me == 0 {
        // The warm-up moves other data than the timed stream (refilled after it), so the
        // check below sees what the timed puts delivered: before 2026-12-07 both moved
        // the same bytes, and a timed stream that moved nothing still validated.
        fill(src, salt | 0xA000_0000);
        // Untimed warm-up of the same stream (caches, TLB, clock), as ucx_perftest and
        // NVSHMEM's perftest do: a quarter of the timed puts, at most --warmup. Signal
        // puts SET the signal to 0, which the timed stream's ADDs then count from (the
        // quiet completes them first).
        for _ in 0..(bw_n / 4).min(a.warmup_for(bw_n)) {
            if signal {
                pe.put_signal_nbi(dest, &*src, sig, 0, SignalOp::Set, 1)?;
            } else {
                pe.put_nbi(dest, &*src, 1)?;
            }
        }
        pe.quiet();
        fill(src, bw_tag);
        let before = pe.assist_stats().bytes_received;
        let t = Instant::now();
        for _ in 0..bw_n {
            if signal {
                pe.put_signal_nbi(dest, &*src, sig, 1, SignalOp::Add, 1)?;
            } else {
                pe.put_nbi(dest, &*src, 1)?;
            }
        }
        pe.quiet();
        bw = (size * bw_n) as f64 / t.elapsed().as_secs_f64() / 1e9;
        assisted = (pe.assist_stats().bytes_received - before) as f64 / (size * bw_n) as f64;
    }
    if me == 1 && signal {
        pe.signal_wait_until(sig, Cmp::Eq, bw_n as u64)?;
    }
    pe.barrier_all()?;
    if me == 1 {
        let mut got = vec![0u64; words];
        pe.get(&mut got, dest, me)?;
        verify(pe, &format!("{size}-byte stream"), &got, bw_tag)?;
    }
    Ok(Row {
        bandwidth_gbps: Some(bw),
        bw_iters: bw_n,
        bw_assisted: (me == 0).then_some(assisted),
        ..Row::from_samples(size, samples, measured)
    })
}

fn get_row(pe: &Pe, a: &BenchArgs, buf: SymPtr<u64>, size: usize, salt: u64) -> Result<Row> {
    let me = pe.my_pe();
    let words = size / 8;
    let src = buf.slice(0..words);
    // PE 1 owns the data PE 0 reads.
    if me == 1 {
        let mut v = vec![0u64; words];
        fill(&mut v, salt);
        pe.put(src, &v, me)?;
    }
    pe.barrier_all()?;
    let iters = lat_iters(a, size);
    let batch = batch_for(size);
    let mut samples = Vec::new();
    let mut bw = 0.0;
    let bw_n = bw_iters(a, size);
    let measured = iters.div_ceil(batch) * batch;
    if me == 0 {
        let mut dst = vec![0u64; words];
        for _ in 0..a.warmup_for(measured) {
            pe.get(&mut dst, src, 1)?;
        }
        // What the warm-up fetched must not pass for what the timed gets fetched.
        dst.fill(0);
        for _ in 0..measured / batch {
            let t = Instant::now();
            for _ in 0..batch {
                pe.get(&mut dst, src, 1)?;
            }
            samples.push(t.elapsed().as_secs_f64() * 1e6 / batch as f64);
        }
        verify(pe, &format!("{size}-byte get"), &dst, salt)?;
        dst.fill(0);
        let t = Instant::now();
        for _ in 0..bw_n {
            pe.get_nbi(&mut dst, src, 1)?;
        }
        pe.quiet();
        bw = (size * bw_n) as f64 / t.elapsed().as_secs_f64() / 1e9;
        verify(pe, &format!("{size}-byte get stream"), &dst, salt)?;
    }
    Ok(Row {
        bandwidth_gbps: Some(bw),
        bw_iters: bw_n,
        ..Row::from_samples(size, samples, measured)
    })
}

fn p_row(pe: &Pe, a: &BenchArgs, aux: SymPtr<u64>, size: usize, salt: u64) -> Result<Row> {
    match size {
        4 => p_row_typed::<u32>(pe, a, aux.cast::<u32>().at(2), size, salt as u32 | 1 << 31),
        _ => p_row_typed::<u64>(pe, a, aux.at(1), size, salt),
    }
}

/// The counter part of p's `it`-th value: the ping-pong's and the timed stream's are
/// disjoint (bit 30), so a stream that delivered nothing does not find its last value
/// already there (before 2026-12-07, with `--warmup 0` the ping-pong left exactly the
/// stream's last value in PE 1's word).
fn p_tag(it: usize, stream: bool) -> u64 {
    ((it as u64 + 1) & 0x3FFF_FFFF) | if stream { 0x4000_0000 } else { 0 }
}

fn p_row_typed<T>(pe: &Pe, a: &BenchArgs, w: SymPtr<T>, size: usize, salt: T) -> Result<Row>
where
    T: crate::AtomicInt + TryFrom<u64> + std::ops::BitOr<Output = T> + Default,
{
    let me = pe.my_pe();
    let tag = |it: usize| -> T { salt | T::try_from(p_tag(it, false)).unwrap_or_default() };
    let stream_tag = |it: usize| -> T { salt | T::try_from(p_tag(it, true)).unwrap_or_default() };
    pe.atomic_set(w, T::default(), me)?;
    pe.barrier_all()?;
    let iters = lat_iters(a, size);
    let batch = 16;
    let measured = iters.div_ceil(batch) * batch;
    let warmup = a.warmup_for(measured);
    let total = warmup + measured;
    let mut samples = Vec::new();
    if me < 2 {
        let peer = 1 - me;
        let mut t0 = Instant::now();
        for it in 0..total {
            if it >= warmup && (it - warmup) % batch == 0 {
                t0 = Instant::now();
            }
            for turn in 0..2 {
                if turn == me {
                    pe.p(w, tag(it), peer)?;
                } else {
                    pe.wait_until(w, Cmp::Eq, tag(it))?;
                }
            }
            if it >= warmup && (it - warmup + 1) % batch == 0 {
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / (2 * batch) as f64);
            }
        }
        let got = pe.g(w, me)?;
        if got != tag(total - 1) {
            return Err(Error::Verification(format!(
                "PE {me}: p ping-pong ended with {got}, expected {}",
                tag(total - 1)
            )));
        }
    }
    pe.barrier_all()?;
    // Bandwidth: a stream of p's (message rate × size).
    let bw_n = a.iters;
    let mut bw = 0.0;
    if me == 0 {
        let t = Instant::now();
        for it in 0..bw_n {
            pe.p(w, stream_tag(it), 1)?;
        }
        pe.quiet();
        bw = (size * bw_n) as f64 / t.elapsed().as_secs_f64() / 1e9;
    }
    pe.barrier_all()?;
    if me == 1 {
        let got = pe.g(w, me)?;
        if got != stream_tag(bw_n - 1) {
            return Err(Error::Verification(format!(
                "PE 1: p stream ended with {got}, expected {}",
                stream_tag(bw_n - 1)
            )));
        }
    }
    Ok(Row {
        bandwidth_gbps: Some(bw),
        bw_iters: bw_n,
        ..Row::from_samples(size, samples, measured)
    })
}

fn atomic_row(pe: &Pe, a: &BenchArgs, aux: SymPtr<u64>) -> Result<Row> {
    let me = pe.my_pe();
    let ctr = aux.at(3);
    pe.atomic_set(ctr, 0u64, me)?;
    pe.barrier_all()?;
    let iters = a.iters;
    let batch = 16;
    let mut samples = Vec::new();
    let mut bw = 0.0;
    let mut expect = 0u64;
    let measured = iters.div_ceil(batch) * batch;
    if me == 0 {
        let warmup = a.warmup_for(measured);
        for _ in 0..warmup {
            pe.atomic_fetch_add(ctr, 1u64, 1)?;
        }
        expect += warmup as u64;
        for _ in 0..measured / batch {
            let t = Instant::now();
            for _ in 0..batch {
                pe.atomic_fetch_add(ctr, 1u64, 1)?;
            }
            samples.push(t.elapsed().as_secs_f64() * 1e6 / batch as f64);
        }
        expect += measured as u64;
        let t = Instant::now();
        for _ in 0..iters {
            pe.atomic_add(ctr, 1u64, 1)?;
        }
        pe.quiet();
        bw = (8 * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        expect += iters as u64;
        let got = pe.atomic_fetch(ctr, 1)?;
        if got != expect {
            return Err(Error::Verification(format!(
                "atomic counter on PE 1 is {got}, expected {expect}"
            )));
        }
    }
    Ok(Row {
        bandwidth_gbps: Some(bw),
        bw_iters: iters,
        ..Row::from_samples(8, samples, measured)
    })
}

fn barrier_row(pe: &Pe, a: &BenchArgs) -> Result<Row> {
    let batch = 16;
    let measured = a.iters.div_ceil(batch) * batch;
    for _ in 0..a.warmup_for(measured) {
        pe.barrier_all()?;
    }
    let samples = timed_batches(measured / batch, batch, || pe.barrier_all())?;
    Ok(Row::from_samples(0, samples, measured))
}

/// One row of a collective benchmark (see [`Kind::Broadcast`]). Block j of PE p's source
/// is `word(i, tag(p, j))`; after the timed calls every PE checks its result exactly.
fn coll_row(
    pe: &Pe,
    a: &BenchArgs,
    src: SymPtr<u64>,
    dst: SymPtr<u64>,
    size: usize,
    salt: u64,
) -> Result<Row> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = size / 8;
    let blocks = a.kind.coll_blocks(n);
    let tag_of = |salt: u64, p: usize, j: usize| salt ^ ((p as u64) << 32) ^ ((j as u64) << 16);
    let mut v = vec![0u64; w * blocks];
    for (j, b) in v.chunks_mut(w).enumerate() {
        let src_block = if a.kind == Kind::Alltoall { j } else { 0 };
        fill(b, tag_of(salt, me, src_block));
    }
    pe.put(src.slice(0..w * blocks), &v, me)?;
    let team = pe.world().clone();
    let out_words = w * blocks;
    let call = || -> Result<()> {
        match a.kind {
            Kind::Broadcast => pe.broadcast(&team, dst.slice(0..w), src.slice(0..w), w, 0),
            Kind::Fcollect => pe.fcollect(&team, dst.slice(0..n * w), src.slice(0..w), w),
            Kind::Alltoall => pe.alltoall(&team, dst.slice(0..n * w), src.slice(0..n * w), w),
            _ => pe.reduce(
                &team,
                dst.slice(0..w),
                src.slice(0..w),
                w,
                crate::collectives::ReduceOp::Sum,
            ),
        }
    };
    pe.barrier_all()?;
    let iters = lat_iters(a, out_words * 8);
    let batch = if a.slowest() { 1 } else { batch_for(size) };
    let measured = iters.div_ceil(batch) * batch;
    for _ in 0..a.warmup_for(measured) {
        call()?;
    }
    let samples = if a.slowest() {
        slowest_calls(pe, &team, measured, call)?
    } else {
        timed_batches(measured / batch, batch, call)?
    };
    // The timed calls all moved the same inputs: one more call on new inputs (untimed)
    // is what is checked, so a collective that stopped moving data after its first calls
    // fails here (before 2026-12-07 the check read the timed calls' identical result).
    let salt = salt ^ 0x5A5A_0000_0000;
    for (j, b) in v.chunks_mut(w).enumerate() {
        let src_block = if a.kind == Kind::Alltoall { j } else { 0 };
        fill(b, tag_of(salt, me, src_block));
    }
    pe.put(src.slice(0..w * blocks), &v, me)?;
    pe.barrier_all()?;
    call()?;
    let tag = |p: usize, j: usize| tag_of(salt, p, j);
    let mut got = vec![0u64; out_words];
    pe.get(&mut got, dst.slice(0..out_words), me)?;
    let what = |p: usize| format!("{size}-byte {}, block of PE {p}", a.kind.name());
    match a.kind {
        Kind::Broadcast => verify(pe, &what(0), &got, tag(0, 0))?,
        Kind::Fcollect => {
            for (p, b) in got.chunks(w).enumerate() {
                verify(pe, &what(p), b, tag(p, 0))?;
            }
        }
        Kind::Alltoall => {
            for (p, b) in got.chunks(w).enumerate() {
                verify(pe, &what(p), b, tag(p, me))?;
            }
        }
        _ => {
            if let Some(i) = (0..w)
                .find(|&i| got[i] != (0..n).fold(0u64, |s, p| s.wrapping_add(word(i, tag(p, 0)))))
            {
                return Err(Error::Verification(format!(
                    "PE {me}: {size}-byte u64 sum reduce: word {i} is {:#x}, expected the \
                     wrapping sum of every PE's word {i}",
                    got[i]
                )));
            }
        }
    }
    let mut row = Row::from_samples(size, samples, measured);
    row.bandwidth_gbps = Some((out_words * 8) as f64 / (row.latency_us_median * 1e-6) / 1e9);
    Ok(row)
}

/// Fewest WRITEs per size of `bench softhca`: 10 000 8-byte WRITEs take about 1 ms, too
/// short to time against thread wake-ups and the host's jitter.
const ENGINE_MIN_OPS: u64 = 200_000;

/// Round trips of the cross-core probe `bench softhca` runs before and after its rows
/// (about 10–100 ms each).
const CORE_RTT_ROUNDS: u64 = 100_000;

/// 8-byte WRITEs of the discarded first row of `bench softhca` (50–300 ms here).
const ENGINE_WARMUP_OPS: u64 = 1_000_000;

/// `rshmem bench softhca`: the engine microbenchmark (see
/// [`crate::softhca::engine::bench_writes`]); sizes from --min-size to --max-size, `--iters`
/// WRITEs per size (at least [`ENGINE_MIN_OPS`], so that a run lasts long enough to time,
/// and at most 1 GiB moved, but never under 1000), plus 8-byte inline WRITEs.
fn engine_bench(a: &BenchArgs) -> Result<()> {
    validate(a)?;
    // One WRITE per op: a data segment's length has 31 bits (the top bit of the word marks
    // an inline segment), so a message stays below 2 GiB.
    if a.max_size >= 1 << 31 {
        return Err(Error::InvalidArgument(format!(
            "bench softhca: --max-size {}: one RDMA WRITE carries less than 2 GiB (a data \
             segment's length has 31 bits)",
            crate::doctor::human_bytes(a.max_size as u64)
        )));
    }
    // A source and a destination of the largest size.
    if let Some(mem) = crate::heap::node_memory_bytes() {
        let need = 2 * (a.max_size.max(1 << 20) as u128);
        if need > mem {
            return Err(Error::InvalidArgument(format!(
                "bench softhca: --max-size {} needs {} (source and destination), more than \
                 this node's memory ({} of RAM and swap): lower --max-size",
                crate::doctor::human_bytes(a.max_size as u64),
                crate::doctor::human_bytes_wide(need),
                crate::doctor::human_bytes_wide(mem)
            )));
        }
    }
    // The cost that bounds the rate on this machine, before and after the rows (it can
    // change during a run on a VM; see core_round_trip_ns).
    let rtt_before = crate::softhca::engine::core_round_trip_ns(CORE_RTT_ROUNDS);
    let mut rows = Vec::new();
    let ops8 = (a.iters as u64).max(ENGINE_MIN_OPS);
    // A discarded row first: on the 2-vCPU VMs the first row a fresh process measured ran
    // at about half the rate of the rows after it (8 B: ~10 against ~20 M/s), whatever
    // its payload, and a longer per-row warm-up did not remove that (docs/soft-hca.md,
    // "session 10"); the rows reported are the steady state.
    crate::softhca::engine::bench_writes(8, ENGINE_WARMUP_OPS, false)?;
    rows.push(crate::softhca::engine::bench_writes(8, ops8, true)?);
    let mut s = a.min_size.max(1);
    while s <= a.max_size {
        let cap = ((1u64 << 30) / s as u64).max(1000);
        let ops = (a.iters as u64).max(ENGINE_MIN_OPS).min(cap);
        rows.push(crate::softhca::engine::bench_writes(s, ops, false)?);
        s *= 2;
    }
    let rtt_after = crate::softhca::engine::core_round_trip_ns(CORE_RTT_ROUNDS);
    if a.json {
        let v = serde_json::json!({
            "bench": "softhca",
            "engine_threads": 1,
            "core_round_trip_ns": {"before": rtt_before, "after": rtt_after},
            "rows": rows,
        });
        println!("{v}");
    } else {
        println!(
            "rshmem bench softhca: RDMA WRITE, queue -> engine (1 thread) -> memory, 1 producer"
        );
        println!(
            "cross-core round trip (the handover each WRITE pays): {rtt_before:.0} ns before, \
             {rtt_after:.0} ns after"
        );
        println!(
            "{:>10} {:>8} {:>10} {:>14} {:>10}",
            "size (B)", "payload", "ops", "Mops/s", "GB/s"
        );
        for r in &rows {
            println!(
                "{:>10} {:>8} {:>10} {:>14.3} {:>10.3}",
                r.size,
                r.payload,
                r.ops,
                r.ops_per_s / 1e6,
                r.gbps
            );
        }
    }
    Ok(())
}

fn print_report(r: &Report, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("rshmem bench: cannot encode the report: {e}"),
        }
        return;
    }
    println!(
        "rshmem bench {}: {} PEs, device {}, transport {}{}, latency = {}",
        r.bench.name(),
        r.pes,
        r.device,
        r.transport,
        r.provider
            .as_ref()
            .map_or(String::new(), |p| format!(" ({p})")),
        r.latency_kind
    );
    println!("{}", binding_line(r.bind, &r.bound_cpus));
    if let Some(t) = r.timing {
        println!(
            "timing: {t}{}",
            if t == "slowest" {
                " (a barrier before every call; a call's time is the slowest PE's)"
            } else {
                " (calls back to back, PE 0's clock)"
            }
        );
    }
    if let Some(src) = &r.source {
        println!(
            "source: {src}{}",
            if src == "heap" {
                " (symmetric; the target may copy part of large puts while it waits: \
                 the 'assisted' column, RSHMEM_P2P_ASSIST)"
            } else {
                " (private memory: the initiator copies alone)"
            }
        );
    }
    println!(
        "{:>10} {:>14} {:>14} {:>14} {:>12}{}",
        "size (B)",
        "lat med (us)",
        "lat p99 (us)",
        "lat mean (us)",
        "bw (GB/s)",
        if r.source.is_some() {
            "   assisted"
        } else {
            ""
        }
    );
    for row in &r.rows {
        let bw = row
            .bandwidth_gbps
            .map_or("-".to_string(), |b| format!("{b:.3}"));
        let share = match (&r.source, row.bw_assisted) {
            (Some(_), Some(f)) => format!(" {f:>10.2}"),
            (Some(_), None) => format!(" {:>10}", "-"),
            (None, _) => String::new(),
        };
        println!(
            "{:>10} {:>14.3} {:>14.3} {:>14.3} {:>12}{share}",
            row.size, row.latency_us_median, row.latency_us_p99, row.latency_us_mean, bw
        );
    }
}

/// The table's line on where the PEs ran: "PEs bound to CPUs 0, 1 (RSHMEM_BIND=auto)"
/// ("-" for a PE that was not) or "PEs not bound to CPUs (RSHMEM_BIND=none)".
fn binding_line(bind: &str, cpus: &[Option<usize>]) -> String {
    if cpus.iter().all(Option::is_none) {
        return format!("PEs not bound to CPUs (RSHMEM_BIND={bind})");
    }
    let each: Vec<String> = cpus
        .iter()
        .map(|c| c.map_or("-".to_string(), |c| c.to_string()))
        .collect();
    format!("PEs bound to CPUs {} (RSHMEM_BIND={bind})", each.join(", "))
}

#[cfg(test)]
mod tests {
    use super::{binding_line, p_tag, stats};

    /// p's ping-pong and its stream never share a value: with --warmup 0 the ping-pong's
    /// last value (iteration n - 1) was the stream's last, so a stream that moved nothing
    /// passed the check.
    #[test]
    fn p_stream_values_differ_from_the_ping_pong_values() {
        for n in [1usize, 16, 10_000, (1 << 30) - 1, 1 << 30, 3 << 30] {
            assert_ne!(p_tag(n - 1, false), p_tag(n - 1, true), "n = {n}");
            assert_ne!(p_tag(n - 1, true), 0, "n = {n}");
            assert_eq!(p_tag(n - 1, false) & 0x4000_0000, 0);
        }
        // Both fit the 31 bits a 4-byte p leaves beside its salt (bit 31).
        assert!(p_tag(usize::MAX - 1, true) < 1 << 31);
    }

    #[test]
    fn the_binding_line_names_each_pe_cpu() {
        assert_eq!(
            binding_line("auto", &[None, None]),
            "PEs not bound to CPUs (RSHMEM_BIND=auto)"
        );
        assert_eq!(
            binding_line("core", &[Some(0), Some(1), Some(0)]),
            "PEs bound to CPUs 0, 1, 0 (RSHMEM_BIND=core)"
        );
        assert_eq!(
            binding_line("core", &[Some(3), None]),
            "PEs bound to CPUs 3, - (RSHMEM_BIND=core)"
        );
    }

    /// `--timing slowest` takes every PE's time for each call: PE k is slow (sleeps 3 ms)
    /// in call k only, so every call's sample is at least 3 ms on every PE. PE 0's own
    /// times would show call 0 alone.
    #[test]
    fn slowest_timing_is_the_maximum_over_pes() {
        let settings = crate::config::Settings::from_lookup(|_| None).expect("defaults");
        let out = crate::pe::run_threads(3, settings, |pe| {
            let world = pe.world().clone();
            let mut call = 0;
            let samples = super::slowest_calls(pe, &world, 4, || {
                if call == pe.my_pe() {
                    std::thread::sleep(std::time::Duration::from_millis(3));
                }
                call += 1;
                Ok(())
            })?;
            Ok(samples)
        })
        .expect("threads ran");
        for (p, r) in out.into_iter().enumerate() {
            let s = r.expect("PE ran");
            assert_eq!(s.len(), 4, "PE {p}");
            for (k, &us) in s.iter().take(3).enumerate() {
                assert!(
                    us >= 3000.0,
                    "PE {p}: call {k} took {us} us at its slowest PE"
                );
            }
        }
    }

    #[test]
    fn stats_median_p99_mean() {
        assert_eq!(stats(vec![]), (0.0, 0.0, 0.0));
        assert_eq!(stats(vec![2.0, 9.0, 4.0]), (4.0, 9.0, 5.0));
        // Even count: the two middle samples' mean; p99 of 4 samples: rank ceil(3.96) = 4.
        assert_eq!(stats(vec![4.0, 1.0, 3.0, 2.0]), (2.5, 4.0, 2.5));
        // 1000 samples 1..=1000: p99 is rank 990.
        let v: Vec<f64> = (1..=1000).rev().map(|x| x as f64).collect();
        assert_eq!(stats(v), (500.5, 990.0, 500.5));
    }
}
