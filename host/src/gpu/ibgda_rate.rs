//! `rshmem bench ibgda-rate --device gpu`: how many WQEs per second GPU threads post
//! through the device-side IBGDA producer (`rshmem/ibgda/queue.cuh`) into one send queue in
//! host memory mapped into the GPU — the issue's target "producer alone, engine
//! discarding" — and, for comparison, with the soft HCA executing the WRITEs.
//!
//! Each run: a fresh queue (`--wqe-cnt` WQEBBs, collapsed CQ) registered into CUDA, its
//! descriptor in device memory, `rshmem_ibgda_post_writes` (ptx/rshmem_ibgda_producer.ptx)
//! with `blocks × threads` threads each posting `iters` 8-byte RDMA WRITEs (warp-batched or
//! not), and on a host thread either [`DiscardEngine::progress`] spinning (completes
//! without executing) or a [`SoftHca`] over the proxy transport's backend (executes into a
//! registered host buffer). WQEs/s = threads × iters / (last block end − first block
//! start), from the kernel's `%globaltimer` stamps. Checked after every run: the
//! descriptor's `reserved == completed ==` the WQEs posted, the discard engine completed
//! exactly that many, and with the executing engine every destination word holds the
//! source pattern. Unverified on a GPU until scripts/gpu-check ran.

use super::driver::{ck, driver};
use super::ibgda::{descriptor_bytes, HostBuf, HostRegistration};
use super::module::{Ctx, Module};
use super::pe::DevBuf;
use crate::error::{Error, Result};
use crate::softhca::ibgda_table::{IbgdaQp, QueueAddrs};
use crate::softhca::mr::{Access, MrTable};
use crate::softhca::proxy::{PeerKind, ProxyBackend};
use crate::softhca::{CqMode, DiscardEngine, LocalPeer, QpConfig, QueueMemory, SoftHca};
use cudarc::driver::sys;
use serde::Serialize;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `rshmem bench ibgda-rate`.
#[derive(Debug, Clone, clap::Args)]
pub struct IbgdaRateArgs {
    /// Only gpu (the producer runs in GPU threads).
    #[arg(long, default_value = "gpu", value_parser = ["cpu", "gpu"])]
    pub device: String,
    /// Grid sizes to sweep (comma list).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,132")]
    pub blocks: Vec<u32>,
    /// Threads per block (at most 256).
    #[arg(long, default_value_t = 256)]
    pub threads: u32,
    /// WRITEs each thread posts.
    #[arg(long, default_value_t = 100)]
    pub iters: u32,
    /// SQ ring size in WQEBBs (a power of two, 64 ..= 16384).
    #[arg(long, default_value_t = 4096)]
    pub wqe_cnt: u32,
    /// Engines to run: discard (the producer alone), execute (the soft HCA executing).
    #[arg(long, value_delimiter = ',', default_value = "discard,execute")]
    pub engines: Vec<String>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct RateRow {
    pub engine: String,
    pub warp_batch: bool,
    pub blocks: u32,
    pub threads: u32,
    pub wqes: u64,
    pub seconds: f64,
    pub wqes_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RateReport {
    pub bench: &'static str,
    pub device: String,
    pub sq_wqebbs: u32,
    pub cq: &'static str,
    pub bytes: u32,
    pub iters: u32,
    pub rows: Vec<RateRow>,
}

/// Checks the options before touching a GPU.
pub fn validate(a: &IbgdaRateArgs) -> Result<()> {
    let bad = |m: String| Err(Error::InvalidArgument(m));
    if a.device != "gpu" {
        return bad("bench ibgda-rate measures GPU producers: pass --device gpu".into());
    }
    if a.threads == 0 || a.threads > 256 {
        return bad(format!("--threads {} is out of range 1..=256", a.threads));
    }
    if a.blocks.is_empty() || a.blocks.iter().any(|&b| b == 0 || b > 65_535) {
        return bad(format!(
            "--blocks {:?}: every grid size must be in 1..=65535",
            a.blocks
        ));
    }
    if a.iters == 0 {
        return bad("--iters must be at least 1".into());
    }
    if !a.wqe_cnt.is_power_of_two() || !(64..=16_384).contains(&a.wqe_cnt) {
        return bad(format!(
            "--wqe-cnt {} must be a power of two in 64..=16384",
            a.wqe_cnt
        ));
    }
    if a.engines.is_empty() || a.engines.iter().any(|e| e != "discard" && e != "execute") {
        return bad(format!(
            "--engines {:?}: each must be discard or execute",
            a.engines
        ));
    }
    Ok(())
}

/// WQEs/s from the kernel's per-block (start, end) stamps.
pub fn rate(wqes: u64, times: &[u64]) -> Option<(f64, f64)> {
    let start = times.iter().step_by(2).min()?;
    let end = times.iter().skip(1).step_by(2).max()?;
    if end <= start {
        return None;
    }
    let ns = (end - start) as f64;
    Some((ns / 1e9, wqes as f64 * 1e9 / ns))
}

pub fn run_cli(a: IbgdaRateArgs) -> i32 {
    match run(&a) {
        Ok(r) => {
            if a.json {
                println!("{}", serde_json::to_string(&r).expect("serializable"));
            } else {
                println!(
                    "# ibgda-rate on {}: SQ {} WQEBBs, collapsed CQ, {}-byte WRITEs, {} per thread",
                    r.device, r.sq_wqebbs, r.bytes, r.iters
                );
                println!(
                    "{:<8} {:>5} {:>7} {:>8} {:>12} {:>10} {:>14}",
                    "engine", "warp", "blocks", "threads", "wqes", "seconds", "wqes/s"
                );
                for x in &r.rows {
                    println!(
                        "{:<8} {:>5} {:>7} {:>8} {:>12} {:>10.6} {:>14.0}",
                        x.engine,
                        x.warp_batch as u8,
                        x.blocks,
                        x.threads,
                        x.wqes,
                        x.seconds,
                        x.wqes_per_s
                    );
                }
            }
            0
        }
        Err(e) => {
            eprintln!("rshmem bench ibgda-rate: {e}");
            1
        }
    }
}

const BYTES: u32 = 8;
const PATTERN: u64 = 0x0123_4567_89ab_cdef;

pub fn run(a: &IbgdaRateArgs) -> Result<RateReport> {
    validate(a)?;
    // The producers' queue waits are bounded by RSHMEM_TIMEOUT_MS, as a PE's are.
    let timeout = crate::config::Settings::from_env()?.timeout;
    driver()?;
    // RSHMEM_DEVICE checked as for a PE (a bad or out-of-range value is refused; it fell
    // back to GPU 0 silently); unset: GPU 0.
    let ordinal = super::launch::pick_device(
        crate::config::env_text("RSHMEM_DEVICE")?.as_deref(),
        0,
        super::pe::device_count()?,
    )?;
    let ctx = Ctx::retain(ordinal)?;
    let info = super::pe::device_info(ordinal)?;
    let dir = std::env::var_os(super::module::PTX_DIR_ENV).map(std::path::PathBuf::from);
    let src = super::module::ptx_source("rshmem_ibgda_producer", dir.as_deref())?;
    let m = Module::load_library(&ctx, "rshmem_ibgda_producer", &src, dir.as_deref(), info.cc)?;
    let mut rows = Vec::new();
    for engine in &a.engines {
        for warp in [false, true] {
            for &blocks in &a.blocks {
                rows.push(one_run(&ctx, &m, a, engine, warp, blocks, timeout)?);
            }
        }
    }
    Ok(RateReport {
        bench: "ibgda-rate",
        device: info.name,
        sq_wqebbs: a.wqe_cnt,
        cq: "collapsed",
        bytes: BYTES,
        iters: a.iters,
        rows,
    })
}

fn one_run(
    ctx: &Arc<Ctx>,
    m: &Module,
    a: &IbgdaRateArgs,
    engine: &str,
    warp: bool,
    blocks: u32,
    timeout: Duration,
) -> Result<RateRow> {
    let threads = blocks as u64 * a.threads as u64;
    let wqes = threads * a.iters as u64;
    let mem = Arc::new(
        QueueMemory::new(a.wqe_cnt, 1).map_err(|e| Error::InvalidArgument(e.to_string()))?,
    );
    // SAFETY: `mem` outlives the registration (dropped at the end of this function, after it).
    let qreg = unsafe {
        HostRegistration::new(ctx, mem.base(), mem.layout().size, "the benchmark queue")?
    };
    // Source (one 8-byte word, the pattern) and destination (one word per thread), host
    // memory the GPU and the engine both address.
    let src = HostBuf::new(4096)?;
    // SAFETY: 8 bytes of the fresh page.
    unsafe { src.ptr.cast::<u64>().write(PATTERN) };
    // SAFETY: `src` outlives the registration (declared before it, dropped after).
    let sreg =
        unsafe { HostRegistration::new(ctx, src.ptr, src.layout.size(), "the benchmark source")? };
    let dst = HostBuf::new(threads as usize * BYTES as usize)?;
    let errbuf = HostBuf::new(4096)?;
    // SAFETY: as above.
    let ereg = unsafe {
        HostRegistration::new(
            ctx,
            errbuf.ptr,
            errbuf.layout.size(),
            "the benchmark error record",
        )?
    };
    let pd = Arc::new(MrTable::new());
    let remote = Arc::new(MrTable::new());
    // SAFETY: the buffers outlive the engine (stopped below before they drop).
    let lkey = unsafe { pd.register(src.ptr, sreg.dev(), src.layout.size() as u64, Access::ALL) };
    // SAFETY: as above.
    let rkey = unsafe {
        remote.register(
            dst.ptr,
            dst.ptr as u64,
            dst.layout.size() as u64,
            Access::ALL,
        )
    };

    let stop = Arc::new(AtomicBool::new(false));
    let (qpn, discard, hca) = if engine == "discard" {
        let mut e = DiscardEngine::new(mem.clone(), 0x77, CqMode::Collapsed);
        let stop2 = stop.clone();
        let h = std::thread::Builder::new()
            .name("rshmem-discard".into())
            .spawn(move || {
                // Relaxed: a stop flag; the joins below order everything else.
                while !stop2.load(Ordering::Relaxed) {
                    if e.progress() == 0 {
                        std::hint::spin_loop();
                    }
                }
                while e.progress() > 0 {}
                e.wqes()
            })
            .map_err(|e| Error::io("spawning the discard engine thread", e))?;
        (0x77, Some(h), None)
    } else {
        // The backend of the proxy transport's process engine, configured as it is while
        // GPU PEs are attached: GPU producers ring no waker, so an idle engine sleeps at
        // most GPU_IDLE_WAIT (20 µs) instead of the LocalBackend's 2 ms.
        let mut backend = ProxyBackend::default();
        backend.gpu_pes = 1;
        let hca = SoftHca::start(backend, "rshmem-rate")
            .map_err(|e| Error::io("starting the soft HCA engine thread", e))?;
        let handle = hca.attach(QpConfig::new(
            mem.clone(),
            pd.clone(),
            PeerKind::Local(LocalPeer::new(remote.clone())),
            CqMode::Collapsed,
        ));
        (handle.qpn(), None, Some((hca, handle)))
    };
    let desc = IbgdaQp::new(
        QueueAddrs::of(&mem, qreg.delta()),
        a.wqe_cnt,
        1,
        qpn,
        CqMode::Collapsed,
        timeout,
    )?;
    let qbuf = DevBuf::new(ctx, 320, "the benchmark descriptor")?;
    qbuf.write(&descriptor_bytes(std::slice::from_ref(&desc)))?;
    let times = DevBuf::new(ctx, 16 * blocks as usize, "the block timestamps")?;
    let f = m.function("rshmem_ibgda_post_writes")?;
    let (mut p0, mut p1, mut p2, mut p3, mut p4) =
        (qbuf.ptr(), dst.ptr as u64, rkey, sreg.dev(), lkey);
    let (mut p5, mut p6, mut p7, mut p8, mut p9) =
        (BYTES, a.iters, warp as u32, ereg.dev(), times.ptr());
    let mut params: [*mut c_void; 10] = [
        (&mut p0 as *mut u64).cast(),
        (&mut p1 as *mut u64).cast(),
        (&mut p2 as *mut u32).cast(),
        (&mut p3 as *mut u64).cast(),
        (&mut p4 as *mut u32).cast(),
        (&mut p5 as *mut u32).cast(),
        (&mut p6 as *mut u32).cast(),
        (&mut p7 as *mut u32).cast(),
        (&mut p8 as *mut u64).cast(),
        (&mut p9 as *mut u64).cast(),
    ];
    ctx.enter()?;
    // SAFETY: rshmem_ibgda_post_writes(qp*, u64 raddr, u32 rkey, u64 laddr, u32 lkey, u32
    // bytes, u32 iters, u32 warp_batch, err*, u64* times): params match one by one; every
    // address is live device or registered host memory; the driver copies the values.
    let launched = ck(
        unsafe {
            sys::cuLaunchKernel(
                f,
                blocks,
                1,
                1,
                a.threads,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
        || format!("rshmem_ibgda_post_writes ({blocks} x {})", a.threads),
    )
    // SAFETY: no preconditions; the kernel's waits are bounded (RSHMEM_TIMEOUT_MS), so this
    // returns.
    .and_then(|()| {
        ck(
            unsafe { sys::cuCtxSynchronize() },
            "cuCtxSynchronize",
            || "waiting for the producer kernel".into(),
        )
    });
    stop.store(true, Ordering::Relaxed);
    let engine_wqes = discard.map(|h| h.join().unwrap_or(0));
    drop(hca);
    if let Err(e) = launched {
        // SAFETY: 64 bytes of registered host memory the kernel may have written.
        let rec =
            unsafe { std::ptr::read_volatile(errbuf.ptr.cast::<super::state::DeviceError>()) };
        return Err(Error::Verification(format!(
            "{engine} warp_batch {warp} blocks {blocks}: {e}; device error record: code {} status/syndrome/opcodes {:#x}, index {}, completed {}",
            rec.code, rec.cmp, rec.expected, rec.observed
        )));
    }
    let mut d = [0u8; 320];
    qbuf.read(&mut d)?;
    let at = |o: usize| u64::from_le_bytes(d[o..o + 8].try_into().expect("8 bytes"));
    let (reserved, completed) = (at(64), at(192));
    if reserved != wqes || completed != wqes {
        return Err(Error::Verification(format!(
            "{engine} warp_batch {warp} blocks {blocks}: descriptor says reserved {reserved}, completed {completed}; expected {wqes} each"
        )));
    }
    if let Some(n) = engine_wqes {
        if n != wqes {
            return Err(Error::Verification(format!(
                "discard engine completed {n} WQEs, the producers posted {wqes}"
            )));
        }
    } else {
        for t in 0..threads as usize {
            // SAFETY: word t of the destination, written by the engine before its CQEs.
            let v = unsafe { std::ptr::read_volatile(dst.ptr.cast::<u64>().add(t)) };
            if v != PATTERN {
                return Err(Error::Verification(format!(
                    "execute engine: destination word {t} is {v:#x}, expected {PATTERN:#x}"
                )));
            }
        }
    }
    let mut tb = vec![0u8; 16 * blocks as usize];
    times.read(&mut tb)?;
    let stamps: Vec<u64> = tb
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
        .collect();
    let (seconds, per_s) = rate(wqes, &stamps).ok_or_else(|| {
        Error::Verification("the kernel's timestamps are empty or not increasing".into())
    })?;
    drop((pd, remote));
    Ok(RateRow {
        engine: engine.to_string(),
        warp_batch: warp,
        blocks,
        threads: a.threads,
        wqes,
        seconds,
        wqes_per_s: per_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> IbgdaRateArgs {
        IbgdaRateArgs {
            device: "gpu".into(),
            blocks: vec![1, 8],
            threads: 256,
            iters: 10,
            wqe_cnt: 4096,
            engines: vec!["discard".into()],
            json: true,
        }
    }

    #[test]
    fn options_are_checked_before_any_gpu_work() {
        assert!(validate(&args()).is_ok());
        let e = |f: &dyn Fn(&mut IbgdaRateArgs)| {
            let mut a = args();
            f(&mut a);
            validate(&a).unwrap_err().to_string()
        };
        assert!(e(&|a| a.device = "cpu".into()).contains("pass --device gpu"));
        assert!(e(&|a| a.threads = 512).contains("--threads 512 is out of range 1..=256"));
        assert!(e(&|a| a.blocks = vec![0]).contains("--blocks [0]"));
        assert!(e(&|a| a.wqe_cnt = 1000).contains("--wqe-cnt 1000 must be a power of two"));
        assert!(e(&|a| a.engines = vec!["fast".into()]).contains("each must be discard or execute"));
        assert!(e(&|a| a.iters = 0).contains("--iters must be at least 1"));
    }

    #[test]
    fn rate_spans_first_start_to_last_end() {
        // Two blocks: (100, 600) and (50, 1050): 1000 ns for 2000 WQEs = 2e9/s.
        let (s, r) = rate(2000, &[100, 600, 50, 1050]).unwrap();
        assert_eq!(s, 1e-6);
        assert_eq!(r, 2e9);
        assert!(rate(1, &[]).is_none());
        assert!(rate(1, &[5, 5]).is_none());
    }

    #[test]
    fn without_a_driver_the_bench_names_libcuda() {
        if !crate::test_child::run_without_cuda(
            module_path!(),
            "without_a_driver_the_bench_names_libcuda",
        ) {
            return;
        }
        let e = run(&args()).unwrap_err().to_string();
        assert!(e.contains("libcuda.so.1"), "{e}");
    }
}
