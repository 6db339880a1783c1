//! The `rshmem` command-line tool.
use clap::{Parser, Subcommand};

/// One write per error line, as in the library (lib.rs says why).
macro_rules! eprintln {
    ($($arg:tt)*) => {
        rshmem::write_stderr_line(::std::format!($($arg)*))
    };
}

#[derive(Parser)]
#[command(
    name = "rshmem",
    version,
    about = "GPU-initiated networking runtime: launcher, self-test, diagnostics, benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start N local PEs running PROGRAM, with their output prefixed by PE.
    Run(rshmem::launcher::RunArgs),
    /// Report what this machine offers rshmem (CPU PEs, CUDA, rdma-core, IBGDA, libfabric),
    /// or dump a running job's soft-HCA queues (--queues).
    Doctor(rshmem::doctor::DoctorArgs),
    /// Benchmark an operation between PEs (put, get, p, atomic, signal, barrier; host or,
    /// with --device gpu, device-initiated), GPU copy bandwidth, or MoE dispatch/combine (ep).
    Bench(rshmem::bench::BenchCommand),
    /// Check every operation among the PEs of a job with exact values (host operations, or
    /// the GPU host layer and device API with --device gpu).
    Selftest(SelftestArgs),
    /// mlx5 queue formats: decode a WQE or CQE from hex.
    Mlx5(rshmem::mlx5::decode::Mlx5Args),
}

/// Arguments of `rshmem selftest`.
#[derive(clap::Args)]
#[command(
    long_about = "Runs the self-test cases as this process's PE: under `rshmem run -n N`, \
    another launcher, or alone (a job of one PE). Every case checks exact values written by \
    the other PEs. Exits 0 when every case passed on this PE."
)]
struct SelftestArgs {
    /// Run only these cases (repeatable); default: all.
    #[arg(long = "case")]
    cases: Vec<String>,
    /// List the cases and exit.
    #[arg(long)]
    list: bool,
    /// cpu: host operations among the PEs of this job; gpu: the GPU host layer and the
    /// device API's test kernels, with --pes GPU PEs as threads of this process.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "gpu"])]
    device: String,
    /// GPU: number of PEs (threads sharing the visible GPU(s); default 2). Under a
    /// launcher the job's size is the PE count: --pes may only repeat it.
    #[arg(long)]
    pes: Option<usize>,
    /// GPU: the kernel manifest instead of the embedded one (also RSHMEM_GPU_MANIFEST).
    #[arg(long)]
    manifest: Option<std::path::PathBuf>,
    /// GPU: how the PEs reach each other (overrides RSHMEM_TRANSPORT): p2p (GPU heaps
    /// mapped into each other), proxy (host heaps, the device API's IBGDA queues drained
    /// by the soft HCA) or ibgda (GPU heaps, the queues of a ConnectX NIC).
    #[arg(long, value_parser = ["p2p", "proxy", "ibgda"])]
    transport: Option<String>,
    /// GPU: run these negative cases (manifest `traps`, full or short name; repeatable)
    /// instead of the self-test, each in a child process (a trap destroys the CUDA
    /// context); checks the launch fails, the device error record and the printed line.
    #[arg(long = "trap")]
    traps: Vec<String>,
    /// GPU: run every trap case of the manifest (as --trap).
    #[arg(long = "traps", conflicts_with = "traps")]
    all_traps: bool,
    /// Internal: run one trap case in this process (what --trap starts per case).
    #[arg(long, hide = true)]
    trap_child: Option<String>,
    /// Testing aid: this PE kills itself (SIGKILL) ...
    #[arg(long, hide = true)]
    crash_pe: Option<usize>,
    /// ... just before this case starts.
    #[arg(long, hide = true, default_value = "barrier")]
    crash_at: String,
}

fn selftest(a: SelftestArgs) -> i32 {
    if a.device == "gpu" {
        let sources = rshmem::gpu::runner::Sources::from_env(a.manifest.clone());
        if let Some(name) = &a.trap_child {
            return rshmem::gpu::traps::trap_child_cli(name, &sources);
        }
        if a.all_traps || !a.traps.is_empty() {
            return rshmem::gpu::traps::traps_cli(&rshmem::gpu::traps::TrapsOpts {
                names: a.traps,
                sources,
            });
        }
        if a.list {
            return match rshmem::gpu::runner::list(&sources) {
                Ok(v) => {
                    v.iter().for_each(|c| println!("{c}"));
                    0
                }
                Err(e) => {
                    // The host-layer cases need no manifest: list them, then say why the
                    // kernel cases are missing.
                    rshmem::gpu::runner::HOST_CASES
                        .iter()
                        .for_each(|c| println!("{c}"));
                    eprintln!("rshmem selftest --device gpu --list: {e}");
                    1
                }
            };
        }
        // Under a launcher the job's size is the PE count (as for bench): a different
        // --pes was ignored before.
        if let (Some(p), Ok(Some(info))) = (a.pes, rshmem::config::LaunchInfo::from_env()) {
            if p != info.world_size {
                eprintln!(
                    "rshmem selftest --device gpu: --pes {p}: this process is a PE of a job \
                     of {} PEs, whose size is the PE count under a launcher (omit --pes, or \
                     start the job with that many)",
                    info.world_size
                );
                return 2;
            }
        }
        return rshmem::gpu::runner::selftest_cli(rshmem::gpu::runner::SelftestOpts {
            pes: a.pes.unwrap_or(2),
            cases: a.cases,
            sources,
            transport: a.transport.as_deref().map(|t| match t {
                "proxy" => rshmem::config::TransportMode::Proxy,
                "ibgda" => rshmem::config::TransportMode::Ibgda,
                _ => rshmem::config::TransportMode::P2p,
            }),
        });
    }
    if a.all_traps || !a.traps.is_empty() || a.trap_child.is_some() {
        eprintln!("rshmem selftest: --trap/--traps are GPU cases: add --device gpu");
        return 2;
    }
    if let Some(p) = a.pes {
        eprintln!(
            "rshmem selftest: --pes {p} is a GPU option (add --device gpu); CPU PEs are the \
             job's processes: start N with rshmem run -n N -- rshmem selftest"
        );
        return 2;
    }
    if let Some(t) = &a.transport {
        eprintln!(
            "rshmem selftest: --transport {t} is a GPU option (add --device gpu); CPU PEs \
             take RSHMEM_TRANSPORT from their environment (export it to every PE)"
        );
        return 2;
    }
    if a.list {
        for c in rshmem::selftest::CASES {
            println!("{}", c.name);
        }
        return 0;
    }
    // Names first: a typo is refused before the PE joins its job (no "PE died" from the
    // bootstrap root after the error).
    let mut named = a.cases.clone();
    if a.crash_pe.is_some() {
        named.push(a.crash_at.clone());
    }
    if let Err(e) = rshmem::selftest::check_names(&named) {
        eprintln!("rshmem selftest: {e}");
        return 1;
    }
    let pe = match rshmem::Pe::init() {
        Ok(pe) => pe,
        Err(e) => {
            eprintln!("rshmem selftest: {e}");
            return 1;
        }
    };
    let names: Vec<String> = if a.crash_pe.is_some() {
        // Run the cases up to (not including) crash_at, then crash or continue with it.
        let mut v = Vec::new();
        for c in rshmem::selftest::CASES {
            if c.name == a.crash_at {
                break;
            }
            v.push(c.name.to_string());
        }
        v
    } else {
        a.cases.clone()
    };
    let me = pe.my_pe();
    println!("selftest: PE {me} of {}, job {}", pe.n_pes(), pe.job_id());
    let r = rshmem::selftest::run(&pe, &names, |c| println!("selftest {c}: ok")).and_then(|n| {
        if a.crash_pe == Some(me) {
            println!(
                "selftest: PE {me} crashing on purpose before {}",
                a.crash_at
            );
            // SAFETY: raising a signal against our own process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        if a.crash_pe.is_some() {
            let more = vec![a.crash_at.clone()];
            return rshmem::selftest::run(&pe, &more, |c| println!("selftest {c}: ok"))
                .map(|m| n + m);
        }
        Ok(n)
    });
    match r {
        Ok(n) => match (pe.n_pes(), pe.finalize()) {
            (pes, Ok(())) => {
                println!("selftest: all {n} cases passed on PE {me}");
                if pes == 1 {
                    // Said, not implied: alone, every operation went to this PE itself.
                    println!(
                        "selftest: one PE: no operation crossed between PEs; run it with 2 or \
                         more (rshmem run -n 2 -- rshmem selftest) to check PEs against each \
                         other"
                    );
                }
                0
            }
            (_, Err(e)) => {
                eprintln!("rshmem selftest: finalize: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("rshmem selftest: PE {me}: {e}");
            1
        }
    }
}

/// Hardware work queues the CUDA driver gives a process per device when
/// `CUDA_DEVICE_MAX_CONNECTIONS` is unset (its default is 8; 32 is the most).
const CUDA_CONNECTIONS: &str = "32";

fn main() {
    let cli = Cli::parse();
    // GPU PEs of one process each have a stream, and their kernels wait for each other.
    // Streams beyond the driver's connections share one and then run in submission order
    // ("false dependencies"), so a PE's kernel queued behind a peer's waiting kernel would
    // never start: with the default 8, `--pes 8` plus the legacy stream is already one too
    // many. Set before any thread exists and before cuInit reads it; a
    // value the user exported wins. Not for `run`: the programs it starts get the
    // environment the user gave them.
    if !matches!(cli.command, Command::Run(_))
        && std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none()
    {
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", CUDA_CONNECTIONS);
    }
    // Output piped into a reader that stops early (`rshmem selftest --list | head -1`):
    // end quietly on SIGPIPE, as Unix tools do, instead of panicking in println! at the
    // EPIPE Rust's default (SIGPIPE ignored) turns it into. Not for `run`: the launcher
    // drops output it cannot write and goes on stopping its PEs and removing their
    // segments (launcher::output).
    if !matches!(cli.command, Command::Run(_)) {
        // SAFETY: signal(2) with SIG_DFL has no memory-safety preconditions; this runs
        // before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let code = match cli.command {
        Command::Run(args) => rshmem::launcher::run_cli(args),
        Command::Doctor(args) => rshmem::doctor::run_cli(args),
        Command::Bench(args) => rshmem::bench::run_command(args),
        Command::Selftest(args) => selftest(args),
        Command::Mlx5(args) => rshmem::mlx5::decode::run_cli(args),
    };
    std::process::exit(code);
}
