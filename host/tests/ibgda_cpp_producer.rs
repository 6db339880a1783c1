//! The device-side IBGDA producer (`device-kernels/include/rshmem/ibgda/queue.cuh`),
//! compiled as host C++ with g++ into a shared library, posting from many `std::thread`s
//! into real soft-HCA queue memory while the Rust engine executes: exact final memory,
//! exact fetched values, 16-bit WQE index wrap, CQ owner-bit flips, a ring small enough
//! that producers wait for free slots, error CQEs with their syndromes, timeouts, and the
//! descriptor layout checked against g++'s offsetof.
//!
//! How the plans stay exact with concurrent producers: every thread owns a region of the
//! remote memory (writes, reads, CS and masked atomics land only there, and one QP executes
//! a thread's WQEs in the order it reserved them), and shared words only get fetch-adds
//! of 1 (whose fetched values must be a permutation of 0..count) or signal adds (whose sum
//! is known).

use libloading::Library;
use rshmem::mlx5::cqe::CqeOpcode;
use rshmem::mlx5::doorbell::doorbell_word;
use rshmem::mlx5::wqe::opcode;
use rshmem::mlx5::Syndrome;
use rshmem::softhca::ibgda_table::{layout_facts, status, IbgdaQp, IbgdaTable};
use rshmem::softhca::{
    Access, AtomicOp, CqMode, DiscardEngine, LocalBackend, LocalPeer, MrTable, QpConfig,
    QueueMemory, SoftHca, Waker,
};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

// ---- the C++ library ---------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct TestOp {
    kind: u32,
    len: u32,
    raddr: u64,
    laddr: u64,
    a: u64,
    b: u64,
    c: u64,
    d: u64,
    rkey: u32,
    lkey: u32,
    batch: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<TestOp>() == 72);

#[repr(C)]
struct TestRun {
    qp: *mut IbgdaQp,
    ops: *const TestOp,
    starts: *const u64,
    threads: u32,
    skip_quiet: u32,
    status: *mut i32,
    failed: *mut u64,
}

const WRITE: u32 = 1;
const PUT: u32 = 2;
const WRITE_INLINE: u32 = 3;
const READ: u32 = 4;
const GET: u32 = 5;
const FA: u32 = 6;
const FETCH_ADD: u32 = 7;
const CS: u32 = 8;
const COMPARE_SWAP: u32 = 9;
const MASKED_FA32: u32 = 10;
const MASKED_CS32: u32 = 11;
const MASKED_CS64: u32 = 12;
const PUT_SIGNAL: u32 = 13;
const QUIET: u32 = 14;
const FENCE: u32 = 15;
const SIGNAL: u32 = 16;
const SIGNAL_SET: u64 = 0;
const SIGNAL_ADD: u64 = 1;

type SetHooks = unsafe extern "C" fn(
    Option<extern "C" fn(*mut c_void)>,
    Option<extern "C" fn(*mut c_void) -> i32>,
    *mut c_void,
);
type Run = unsafe extern "C" fn(*const TestRun);
type Layout = unsafe extern "C" fn(*mut u64, usize) -> usize;
type TableQp = unsafe extern "C" fn(*const IbgdaTable, u32) -> *mut IbgdaQp;

struct Producer {
    _lib: Library,
    set_hooks: SetHooks,
    run: Run,
    layout: Layout,
    table_qp: TableQp,
}

fn compile_library() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = manifest.join("tests/ibgda-producer/producer.cpp");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("libibgda-producer-{}.so", std::process::id()));
    let r = Command::new("c++")
        .args([
            "-std=c++17",
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-pthread",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-I",
        ])
        .arg(manifest.join("../device-kernels/include"))
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run c++ (install g++): {e}"));
    assert!(
        r.status.success(),
        "c++ {} failed:\n{}{}",
        src.display(),
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

fn producer() -> &'static Producer {
    static P: OnceLock<Producer> = OnceLock::new();
    P.get_or_init(|| {
        let path = compile_library();
        // SAFETY: our own freshly built library; its initialisers only set up statics.
        let lib = unsafe { Library::new(&path) }.expect("load the producer library");
        // SAFETY: the symbols exist with exactly these signatures (producer.cpp's
        // extern "C" block); the library stays loaded as long as the fn pointers (both
        // live in the same static).
        unsafe {
            let set_hooks = *lib.get::<SetHooks>(b"ibgda_set_hooks\0").unwrap();
            let run = *lib.get::<Run>(b"ibgda_run\0").unwrap();
            let layout = *lib.get::<Layout>(b"ibgda_layout\0").unwrap();
            let table_qp = *lib.get::<TableQp>(b"ibgda_table_qp\0").unwrap();
            Producer {
                _lib: lib,
                set_hooks,
                run,
                layout,
                table_qp,
            }
        }
    })
}

/// The hooks are process-wide in the library: one run at a time.
static RUN_LOCK: Mutex<()> = Mutex::new(());

extern "C" fn on_doorbell(ctx: *mut c_void) {
    // SAFETY: ctx is the Waker of the running test's engine, alive for the whole run
    // (set_hooks is called with it under RUN_LOCK and cleared before it is dropped).
    let w = unsafe { &*(ctx as *const Waker) };
    w.wake();
}

extern "C" fn on_relax(ctx: *mut c_void) -> i32 {
    // SAFETY: as in on_doorbell.
    let w = unsafe { &*(ctx as *const Waker) };
    w.assist() as i32
}

// ---- memory, engine, descriptor ----------------------------------------------------------

/// Remote words (the "peer heap"), local bytes (sources and results) and an engine.
struct Env {
    remote: Vec<u64>,
    local: Vec<u64>,
    rkey: u32,
    lkey: u32,
    pd: Arc<MrTable>,
    rtable: Arc<MrTable>,
}

impl Env {
    fn new(remote_words: usize, local_bytes: usize) -> Env {
        let mut remote = vec![0u64; remote_words];
        let mut local = vec![0u64; local_bytes.div_ceil(8)];
        let pd = Arc::new(MrTable::new());
        let rtable = Arc::new(MrTable::new());
        let (rp, lp) = (
            remote.as_mut_ptr().cast::<u8>(),
            local.as_mut_ptr().cast::<u8>(),
        );
        // SAFETY: both vectors live in this Env, which outlives every QP using the tables
        // (run() detaches its QP before returning) and are never resized.
        let (rkey, lkey) = unsafe {
            (
                rtable.register(rp, rp as u64, (remote_words * 8) as u64, Access::ALL),
                pd.register(lp, lp as u64, (local.len() * 8) as u64, Access::LOCAL_WRITE),
            )
        };
        Env {
            remote,
            local,
            rkey,
            lkey,
            pd,
            rtable,
        }
    }
    fn raddr(&self, word: usize) -> u64 {
        self.remote.as_ptr() as u64 + 8 * word as u64
    }
    fn laddr(&self, byte: usize) -> u64 {
        self.local.as_ptr() as u64 + byte as u64
    }
    fn local_bytes(&self) -> &[u8] {
        // SAFETY: reinterpreting initialised u64s as bytes; read only after the run.
        unsafe { std::slice::from_raw_parts(self.local.as_ptr().cast(), self.local.len() * 8) }
    }
    fn local_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; only before any run.
        unsafe {
            std::slice::from_raw_parts_mut(self.local.as_mut_ptr().cast(), self.local.len() * 8)
        }
    }
    fn remote_bytes(&self) -> &[u8] {
        // SAFETY: as local_bytes.
        unsafe { std::slice::from_raw_parts(self.remote.as_ptr().cast(), self.remote.len() * 8) }
    }
}

struct Outcome {
    /// WQEs the discard engine completed (Engine::Discard).
    discarded: Option<u64>,
    /// Wall time of the producers' run (threads started to joined).
    elapsed: Duration,
    status: Vec<i32>,
    failed: Vec<u64>,
    desc: Box<IbgdaQp>,
}

/// Runs `plan` (op lists per thread) from C++ threads against one QP. With `engine`, a
/// soft HCA serves the QP; without, nobody does (timeouts). `mem` may be reused across
/// runs together with `desc` (a descriptor of it from an earlier run).
fn run(
    env: &Env,
    mem: &Arc<QueueMemory>,
    desc: Option<Box<IbgdaQp>>,
    mode: CqMode,
    engine: bool,
    timeout: Duration,
    plan: &[Vec<TestOp>],
) -> Outcome {
    run_with(env, mem, desc, mode, engine, timeout, plan, false, false)
}

/// As [`run`]; with `skip_quiet` the threads end without a final quiet; with `mmio` a
/// fresh descriptor says its doorbell is a NIC register (doorbell_mode MMIO: the device
/// build rings it with an MMIO store; the host build stores the same word).
#[allow(clippy::too_many_arguments)]
fn run_with(
    env: &Env,
    mem: &Arc<QueueMemory>,
    desc: Option<Box<IbgdaQp>>,
    mode: CqMode,
    engine: bool,
    timeout: Duration,
    plan: &[Vec<TestOp>],
    skip_quiet: bool,
    mmio: bool,
) -> Outcome {
    run_engine(
        env,
        mem,
        desc,
        mode,
        if engine { Engine::Soft } else { Engine::None },
        timeout,
        plan,
        skip_quiet,
        mmio,
    )
}

/// Who serves the QP.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    /// The soft HCA (executes).
    Soft,
    /// A [`DiscardEngine`] on its own thread (completes without executing).
    Discard,
    /// Nobody.
    None,
}

#[allow(clippy::too_many_arguments)]
fn run_engine(
    env: &Env,
    mem: &Arc<QueueMemory>,
    desc: Option<Box<IbgdaQp>>,
    mode: CqMode,
    engine: Engine,
    timeout: Duration,
    plan: &[Vec<TestOp>],
    skip_quiet: bool,
    mmio: bool,
) -> Outcome {
    let _g = RUN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let p = producer();
    let hca = SoftHca::start(LocalBackend, "ibgda-test-engine").unwrap();
    let qp = (engine == Engine::Soft).then(|| {
        hca.attach(QpConfig::new(
            mem.clone(),
            env.pd.clone(),
            LocalPeer::new(env.rtable.clone()),
            mode,
        ))
    });
    let qpn = qp.as_ref().map_or(0x42, |q| q.qpn());
    let stop = Arc::new(AtomicBool::new(false));
    let discard = (engine == Engine::Discard).then(|| {
        let (mem, stop) = (mem.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut e = DiscardEngine::new(mem, qpn, mode);
            // Acquire: pairs with the Release below; nothing else is published by it.
            while !stop.load(Ordering::Acquire) {
                if e.progress() == 0 {
                    std::thread::yield_now();
                }
            }
            e.wqes()
        })
    });
    let desc = desc.unwrap_or_else(|| {
        let d = IbgdaQp::for_host(mem, qpn, mode, timeout).unwrap();
        Box::new(if mmio { d.with_mmio_doorbell() } else { d })
    });
    let desc = Box::into_raw(desc);
    let waker = hca.waker();
    let mut ops = Vec::new();
    let mut starts = vec![0u64];
    for t in plan {
        ops.extend_from_slice(t);
        starts.push(ops.len() as u64);
    }
    let mut st = vec![0i32; plan.len()];
    let mut failed = vec![u64::MAX; plan.len()];
    let elapsed;
    let r = TestRun {
        qp: desc,
        ops: ops.as_ptr(),
        starts: starts.as_ptr(),
        threads: plan.len() as u32,
        skip_quiet: skip_quiet as u32,
        status: st.as_mut_ptr(),
        failed: failed.as_mut_ptr(),
    };
    // SAFETY: the hooks get a Waker that outlives the run (cleared below, before hca
    // drops); `r` points at vectors and a descriptor that outlive ibgda_run, which joins
    // every thread before returning; the queue memory and registered regions stay alive
    // (mem, env) and the QP is detached (drop of qp) before they could go.
    unsafe {
        (p.set_hooks)(
            Some(on_doorbell),
            Some(on_relax),
            Arc::as_ptr(&waker) as *mut c_void,
        );
        let t0 = std::time::Instant::now();
        (p.run)(&r);
        elapsed = t0.elapsed();
        (p.set_hooks)(None, None, std::ptr::null_mut());
    }
    drop(qp); // detach: the engine no longer touches the queues or regions
    stop.store(true, Ordering::Release);
    let discarded = discard.map(|t| t.join().expect("discard engine thread"));
    // SAFETY: from Box::into_raw above; every producer thread has been joined.
    let desc = unsafe { Box::from_raw(desc) };
    Outcome {
        discarded,
        elapsed,
        status: st,
        failed,
        desc,
    }
}

// ---- plans ---------------------------------------------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// Words per thread region in the remote memory; bytes of source data per thread.
const REGION_WORDS: usize = 64;
const REGION: usize = REGION_WORDS * 8;
const SRC: usize = 4096;
/// Bytes of result slot per op.
const SLOT: usize = 64;

/// What to check after the run.
enum Check {
    /// Bytes at a local offset.
    Bytes(usize, Vec<u8>),
    /// A big-endian fetched value at a local offset (4 or 8 bytes).
    Be(usize, u8, u64),
    /// A native u64 a blocking op stored at a local offset.
    Native(usize, u64),
    /// A fetch-add of 1 on shared word 0: its fetched value (BE at the offset) joins the
    /// permutation check; with `native`, the blocking op's returned value (offset + 8)
    /// must equal it.
    Shared(usize, bool),
}

struct Plan {
    threads: Vec<Vec<TestOp>>,
    checks: Vec<Check>,
    /// Thread regions after the run.
    regions: Vec<Vec<u8>>,
    shared_fa: u64,
    signal_sum: u64,
    wqes: u64,
    wqebbs: u64,
}

fn inline_wqebbs(len: u32) -> u64 {
    (2 + (len as u64 + 4).div_ceil(16)).div_ceil(4)
}

fn wqebbs(op: &TestOp) -> u64 {
    match op.kind {
        WRITE_INLINE => inline_wqebbs(op.len),
        MASKED_CS64 | PUT_SIGNAL => 2,
        QUIET => 0,
        _ => 1,
    }
}

struct Planner<'a> {
    env: &'a Env,
    threads: usize,
    rng: Rng,
    slot: usize,
    checks: Vec<Check>,
    regions: Vec<Vec<u8>>,
    shared_fa: u64,
    signal_sum: u64,
}

impl Planner<'_> {
    fn region_word(&self, t: usize, w: usize) -> u64 {
        u64::from_le_bytes(self.regions[t][w * 8..w * 8 + 8].try_into().unwrap())
    }
    fn src(&self, t: usize) -> usize {
        t * SRC
    }
    fn slot(&mut self) -> usize {
        let s = self.threads * SRC + self.slot * SLOT;
        self.slot += 1;
        s
    }
    fn op(&self, kind: u32) -> TestOp {
        TestOp {
            kind,
            rkey: self.env.rkey,
            lkey: self.env.lkey,
            ..TestOp::default()
        }
    }

    /// A write of `len` bytes from this thread's sources into its region.
    fn write(&mut self, t: usize, kind: u32, len: usize) -> TestOp {
        let off = self.rng.below((REGION - len + 1) as u64) as usize;
        let so = self.src(t) + self.rng.below((SRC - len + 1) as u64) as usize;
        let src = self.env.local_bytes()[so..so + len].to_vec();
        self.regions[t][off..off + len].copy_from_slice(&src);
        TestOp {
            len: len as u32,
            raddr: self.env.raddr(t * REGION_WORDS) + off as u64,
            laddr: self.env.laddr(so),
            ..self.op(kind)
        }
    }

    fn read(&mut self, t: usize, kind: u32) -> TestOp {
        let len = self.rng.range(1, 64) as usize;
        let off = self.rng.below((REGION - len + 1) as u64) as usize;
        let slot = self.slot();
        self.checks
            .push(Check::Bytes(slot, self.regions[t][off..off + len].to_vec()));
        TestOp {
            len: len as u32,
            raddr: self.env.raddr(t * REGION_WORDS) + off as u64,
            laddr: self.env.laddr(slot),
            ..self.op(kind)
        }
    }

    /// An atomic on this thread's region: kind FA / CS / COMPARE_SWAP / masked.
    fn atomic(&mut self, t: usize, kind: u32) -> TestOp {
        let slot = self.slot();
        let mut o = TestOp {
            laddr: self.env.laddr(slot),
            ..self.op(kind)
        };
        let size = if matches!(kind, MASKED_FA32 | MASKED_CS32) {
            4
        } else {
            8
        };
        let off = self.rng.below((REGION / size) as u64) as usize * size;
        o.raddr = self.env.raddr(t * REGION_WORDS) + off as u64;
        let old = if size == 4 {
            u32::from_le_bytes(self.regions[t][off..off + 4].try_into().unwrap()) as u64
        } else {
            self.region_word(t, off / 8)
        };
        let r = &mut self.rng;
        let aop = match kind {
            FA => {
                o.a = r.next();
                AtomicOp::Fa { add: o.a }
            }
            CS | COMPARE_SWAP => {
                o.a = r.next();
                o.b = if r.below(2) == 0 { old } else { old ^ 1 };
                AtomicOp::Cs {
                    compare: o.b,
                    swap: o.a,
                }
            }
            MASKED_FA32 => {
                o.a = r.next() & 0xffff_ffff;
                o.c = r.next() & 0xffff_ffff & r.next();
                AtomicOp::MaskedFa {
                    size: 4,
                    add: o.a,
                    boundary: o.c,
                }
            }
            MASKED_CS32 | MASKED_CS64 => {
                let m = if size == 4 { 0xffff_ffff } else { u64::MAX };
                o.a = r.next() & m;
                o.b = if r.below(2) == 0 { old } else { r.next() & m };
                o.c = r.next() & m;
                o.d = r.next() & r.next() & m;
                AtomicOp::MaskedCs {
                    size: size as u8,
                    swap: o.a,
                    compare: o.b,
                    swap_mask: o.c,
                    compare_mask: o.d,
                }
            }
            _ => unreachable!(),
        };
        let new = aop.apply(old);
        if size == 4 {
            self.regions[t][off..off + 4].copy_from_slice(&(new as u32).to_le_bytes());
        } else {
            self.regions[t][off..off + 8].copy_from_slice(&new.to_le_bytes());
        }
        self.checks.push(Check::Be(slot, size as u8, old));
        if kind == COMPARE_SWAP {
            o.d = self.env.laddr(slot + 8);
            self.checks.push(Check::Native(slot + 8, old));
        }
        o
    }

    fn shared_fa(&mut self, blocking: bool) -> TestOp {
        let slot = self.slot();
        self.shared_fa += 1;
        self.checks.push(Check::Shared(slot, blocking));
        TestOp {
            raddr: self.env.raddr(self.threads * REGION_WORDS),
            laddr: self.env.laddr(slot),
            a: 1,
            d: if blocking {
                self.env.laddr(slot + 8)
            } else {
                0
            },
            ..self.op(if blocking { FETCH_ADD } else { FA })
        }
    }

    fn put_signal(&mut self, t: usize) -> TestOp {
        let len = self.rng.range(1, 64) as usize;
        let mut o = self.write(t, PUT_SIGNAL, len);
        o.d = self.env.laddr(self.slot()); // scratch for the ADD's fetched value
        o.a = self.rng.range(1, 1000);
        if self.rng.below(2) == 0 {
            o.b = SIGNAL_ADD;
            o.c = self.env.raddr(self.threads * REGION_WORDS + 1);
            self.signal_sum += o.a;
        } else {
            o.b = SIGNAL_SET;
            let w = self.rng.below(REGION_WORDS as u64) as usize;
            o.c = self.env.raddr(t * REGION_WORDS + w);
            self.regions[t][w * 8..w * 8 + 8].copy_from_slice(&o.a.to_le_bytes());
        }
        o
    }

    fn batchable(&mut self, t: usize) -> TestOp {
        match self.rng.below(8) {
            0 => {
                let len = self.rng.range(1, 64) as usize;
                self.write(t, WRITE, len)
            }
            1 => {
                let len = self.rng.range(1, 100) as usize;
                self.write(t, WRITE_INLINE, len)
            }
            2 => self.read(t, READ),
            3 => self.atomic(t, FA),
            4 => self.atomic(t, CS),
            5 => self.atomic(t, MASKED_FA32),
            6 => self.atomic(t, MASKED_CS32),
            _ => self.atomic(t, MASKED_CS64),
        }
    }
}

/// Random op lists for `threads` threads of `per` ops each (batches count as their ops).
fn plan(env: &mut Env, threads: usize, per: usize, wqe_cnt: u32, seed: u64) -> Plan {
    // Source bytes: fixed random data.
    let mut rng = Rng(seed ^ 0x5eed);
    for b in env.local_bytes_mut()[..threads * SRC].iter_mut() {
        *b = rng.next() as u8;
    }
    let mut p = Planner {
        env,
        threads,
        rng: Rng(seed),
        slot: 0,
        checks: Vec::new(),
        regions: vec![vec![0u8; REGION]; threads],
        shared_fa: 0,
        signal_sum: 0,
    };
    let max_batch = (wqe_cnt as u64).min(16);
    let mut lists = Vec::new();
    for t in 0..threads {
        let mut ops = Vec::new();
        while ops.len() < per {
            let k = p.rng.below(100);
            if k < 10 {
                // A batch: one reservation, one publish.
                let n = p.rng.range(2, 5) as usize;
                let mut batch: Vec<TestOp> = Vec::new();
                for _ in 0..n {
                    let o = p.batchable(t);
                    if batch.iter().map(wqebbs).sum::<u64>() + wqebbs(&o) > max_batch {
                        // Would not fit: post it alone after the batch. (Its effects are
                        // already in the model, in this order.)
                        let len = batch.len() as u32;
                        if let Some(f) = batch.first_mut() {
                            f.batch = len;
                        }
                        ops.append(&mut batch);
                        ops.push(o);
                        continue;
                    }
                    batch.push(o);
                }
                let len = batch.len() as u32;
                if let Some(f) = batch.first_mut() {
                    f.batch = len;
                }
                ops.append(&mut batch);
                continue;
            }
            let o = match k {
                10..=19 => {
                    let len = p.rng.range(1, 64) as usize;
                    p.write(t, WRITE, len)
                }
                20..=29 => {
                    let len = p.rng.range(1, 64) as usize;
                    p.write(t, PUT, len)
                }
                30..=34 => {
                    let max = 200.min(16 * wqe_cnt as u64 - 36).min(256);
                    let len = p.rng.range(1, max) as usize;
                    p.write(t, WRITE_INLINE, len)
                }
                35..=42 => p.read(t, READ),
                43..=45 => p.read(t, GET),
                46..=51 => p.atomic(t, FA),
                52..=58 => p.shared_fa(false),
                59..=61 => p.shared_fa(true),
                62..=67 => p.atomic(t, CS),
                68..=69 => p.atomic(t, COMPARE_SWAP),
                70..=75 => p.atomic(t, MASKED_FA32),
                76..=81 => p.atomic(t, MASKED_CS32),
                82..=86 => p.atomic(t, MASKED_CS64),
                87..=95 => p.put_signal(t),
                96..=97 => p.op(QUIET),
                _ => p.op(FENCE),
            };
            ops.push(o);
        }
        lists.push(ops);
    }
    let all = lists.iter().flatten();
    let wqes = all
        .clone()
        .map(|o| match o.kind {
            QUIET => 0,
            PUT_SIGNAL => 2,
            _ => 1,
        })
        .sum();
    let wqebbs = all.map(wqebbs).sum();
    Plan {
        threads: lists,
        checks: p.checks,
        regions: p.regions,
        shared_fa: p.shared_fa,
        signal_sum: p.signal_sum,
        wqes,
        wqebbs,
    }
}

/// Runs a random plan and checks everything exactly.
fn run_plan(
    threads: usize,
    per: usize,
    wqe_cnt: u32,
    cqe_cnt: u32,
    mode: CqMode,
    seed: u64,
) -> u64 {
    let mut env = Env::new(
        threads * REGION_WORDS + 8,
        threads * SRC + threads * per * 2 * SLOT,
    );
    let plan = plan(&mut env, threads, per, wqe_cnt, seed);
    let mem = Arc::new(QueueMemory::new(wqe_cnt, cqe_cnt).unwrap());
    let out = run(
        &env,
        &mem,
        None,
        mode,
        true,
        Duration::from_secs(60),
        &plan.threads,
    );
    eprintln!(
        "{threads} producer(s), {mode:?} CQ of {cqe_cnt}, SQ of {wqe_cnt}: {} ops, {} WQEs, \
         {} WQEBBs, {} CQEs consumed, {:?}",
        plan.threads.iter().map(Vec::len).sum::<usize>(),
        plan.wqes,
        plan.wqebbs,
        out.desc.cqes(),
        out.elapsed
    );
    for (t, (&s, &f)) in out.status.iter().zip(&out.failed).enumerate() {
        assert_eq!(
            s,
            status::OK,
            "thread {t}: {} at op {f}; first error {:?}",
            status::name(s),
            out.desc.first_error()
        );
    }
    let d = &out.desc;
    assert_eq!(d.first_error(), None);
    assert!(!d.is_broken());
    assert_eq!(d.reserved(), plan.wqebbs, "WQEBBs reserved");
    assert_eq!(d.ready(), plan.wqebbs, "WQEBBs published");
    assert_eq!(d.completed(), plan.wqebbs, "WQEBBs completed");
    if mode == CqMode::Normal {
        assert_eq!(d.cqes(), plan.wqes, "one CQE per WQE consumed");
        assert_eq!(d.cq_ci.load(Ordering::Acquire) as u64, plan.wqes);
    }
    // The doorbell record holds the final producer index.
    assert_eq!(
        u32::from_be_bytes(mem.qp_dbrec_send().load(Ordering::Acquire).to_ne_bytes()),
        (plan.wqebbs & 0xffff) as u32
    );
    // Remote memory, exactly.
    let rb = env.remote_bytes();
    for (t, region) in plan.regions.iter().enumerate() {
        assert!(
            rb[t * REGION..(t + 1) * REGION] == region[..],
            "thread {t}: region differs from the reference"
        );
    }
    let shared = threads * REGION_WORDS;
    assert_eq!(
        env.remote[shared], plan.shared_fa,
        "shared fetch-add counter"
    );
    assert_eq!(env.remote[shared + 1], plan.signal_sum, "signal sum");
    // Results.
    let lb = env.local_bytes();
    // As a ConnectX writes them: 4-byte results big-endian, 8-byte ones in host order.
    let be = |off: usize, size: u8| -> u64 {
        if size == 4 {
            u32::from_be_bytes(lb[off..off + 4].try_into().unwrap()) as u64
        } else {
            u64::from_ne_bytes(lb[off..off + 8].try_into().unwrap())
        }
    };
    let mut fetched = Vec::new();
    for c in &plan.checks {
        match c {
            Check::Bytes(off, want) => {
                assert!(lb[*off..off + want.len()] == want[..], "read at {off}")
            }
            Check::Be(off, size, want) => assert_eq!(be(*off, *size), *want, "fetched at {off}"),
            Check::Native(off, want) => assert_eq!(
                u64::from_ne_bytes(lb[*off..off + 8].try_into().unwrap()),
                *want,
                "returned at {off}"
            ),
            Check::Shared(off, native) => {
                let v = be(*off, 8);
                if *native {
                    assert_eq!(
                        u64::from_ne_bytes(lb[off + 8..off + 16].try_into().unwrap()),
                        v
                    );
                }
                fetched.push(v);
            }
        }
    }
    fetched.sort_unstable();
    assert!(
        fetched.iter().copied().eq(0..plan.shared_fa),
        "shared fetch-add values are not a permutation of 0..{}",
        plan.shared_fa
    );
    plan.wqebbs
}

// ---- tests ---------------------------------------------------------------------------------

#[test]
fn descriptor_layout_matches_gxx() {
    let mut v = vec![0u64; 128];
    // SAFETY: the buffer holds 128 values; the function writes at most `cap`.
    let n = unsafe { (producer().layout)(v.as_mut_ptr(), v.len()) };
    v.truncate(n);
    assert_eq!(v, layout_facts());
}

#[test]
fn one_producer_normal_cq() {
    // 64 WQEBBs, 64 CQEs (the CUDA producer asks a CQE of every WQE, so a smaller CQ
    // would overrun, on a ConnectX as on the soft HCA): the CQ wraps ~200 times.
    run_plan(1, 12_000, 64, 64, CqMode::Normal, 1);
}

#[test]
fn four_producers_collapsed_cq() {
    run_plan(4, 4_000, 64, 1, CqMode::Collapsed, 2);
}

#[test]
fn sixteen_producers_small_ring_wrap_the_wqe_index() {
    // A 16-WQEBB ring and a 16-entry CQ: producers wait for free slots all the time; the
    // 16-bit WQE index wraps and the CQ owner bit flips thousands of times.
    let wqebbs = run_plan(16, 4_200, 16, 16, CqMode::Normal, 3);
    assert!(
        wqebbs > 0x1_0000,
        "the 16-bit WQE index wrapped ({wqebbs} WQEBBs)"
    );
}

/// One thread's op list with one bad key; returns the outcome and the environment.
fn error_run(bad: impl FnOnce(&Env, &mut TestOp), kind: u32) -> (Outcome, Env) {
    let mut env = Env::new(16, 4096);
    env.local_bytes_mut()[..64].copy_from_slice(&[0xab; 64]);
    let good = |env: &Env, w: usize| TestOp {
        kind: WRITE,
        len: 8,
        raddr: env.raddr(w),
        laddr: env.laddr(0),
        rkey: env.rkey,
        lkey: env.lkey,
        ..TestOp::default()
    };
    let mut b = TestOp {
        kind,
        len: 8,
        raddr: env.raddr(1),
        laddr: env.laddr(64),
        a: 1,
        d: env.laddr(128),
        rkey: env.rkey,
        lkey: env.lkey,
        ..TestOp::default()
    };
    bad(&env, &mut b);
    let ops = vec![
        good(&env, 0),
        b,
        good(&env, 2),
        TestOp {
            kind: QUIET,
            ..TestOp::default()
        },
    ];
    let mem = Arc::new(QueueMemory::new(16, 16).unwrap());
    let out = run(
        &env,
        &mem,
        None,
        CqMode::Normal,
        true,
        Duration::from_secs(20),
        &[ops],
    );
    (out, env)
}

#[test]
fn bad_rkey_is_reported_with_remote_access() {
    let (out, env) = error_run(|_, o| o.rkey ^= 0x5555, WRITE);
    assert_eq!(out.status, vec![status::CQE]);
    assert_eq!(out.failed, vec![3], "quiet reports it");
    let e = out.desc.first_error().expect("error recorded");
    assert_eq!(e.syndrome, Syndrome::RemoteAccess as u8);
    assert_eq!(e.wqe_opcode, opcode::RDMA_WRITE);
    assert_eq!(e.cqe_opcode, CqeOpcode::ReqErr as u8);
    assert_eq!(e.index, 1);
    // Before the error: executed. After it: flushed (WR_FLUSH), not executed.
    assert_eq!(env.remote[0], 0xabab_abab_abab_abab);
    assert_eq!(env.remote[1], 0);
    assert_eq!(env.remote[2], 0);
    assert_eq!(out.desc.completed(), 3, "flushed WQEs complete too");
}

#[test]
fn bad_lkey_is_reported_with_local_prot() {
    let (out, _env) = error_run(|_, o| o.lkey ^= 0x5555, READ);
    assert_eq!(out.status, vec![status::CQE]);
    let e = out.desc.first_error().expect("error recorded");
    assert_eq!(e.syndrome, Syndrome::LocalProt as u8);
    assert_eq!(e.wqe_opcode, opcode::RDMA_READ);
    assert_eq!(e.index, 1);
}

#[test]
fn blocking_fetch_add_with_bad_rkey_fails_at_once() {
    let (out, env) = error_run(|_, o| o.rkey ^= 0x5555, FETCH_ADD);
    assert_eq!(out.status, vec![status::CQE]);
    assert_eq!(out.failed, vec![1], "the blocking op itself reports it");
    let e = out.desc.first_error().expect("error recorded");
    assert_eq!(e.syndrome, Syndrome::RemoteAccess as u8);
    assert_eq!(e.wqe_opcode, opcode::ATOMIC_FA);
    // The blocking op did not store a value.
    assert_eq!(&env.local_bytes()[128..136], &[0u8; 8]);
}

/// An 8-byte WRITE from the local buffer's start to the remote buffer's start.
fn write8(env: &Env) -> TestOp {
    TestOp {
        kind: WRITE,
        len: 8,
        raddr: env.raddr(0),
        laddr: env.laddr(0),
        rkey: env.rkey,
        lkey: env.lkey,
        ..TestOp::default()
    }
}

#[test]
fn waits_time_out_and_a_timed_out_reservation_breaks_the_queue() {
    let env = Env::new(16, 4096);
    let w = |_: usize| write8(&env);
    let mem = Arc::new(QueueMemory::new(8, 8).unwrap());
    let t = Duration::from_millis(100);
    // No engine: 8 WRITEs fill the ring; the final quiet times out.
    let out = run(
        &env,
        &mem,
        None,
        CqMode::Normal,
        false,
        t,
        &[(0..8).map(w).collect()],
    );
    assert_eq!(out.status, vec![status::TIMEOUT]);
    assert_eq!(out.failed, vec![8], "the final quiet");
    assert!(out.elapsed >= t);
    assert!(!out.desc.is_broken(), "a quiet holds no reservation");
    // The descriptor says which wait gave up and for which index: completion of the 8.
    assert_eq!(out.desc.timed_out_waiting(), Some((3, 8)));
    assert_eq!(
        (out.desc.reserved(), out.desc.ready(), out.desc.completed()),
        (8, 8, 0)
    );
    // The ring is full: the next WRITE cannot get a slot; its reservation is a hole.
    let out = run(
        &env,
        &mem,
        Some(out.desc),
        CqMode::Normal,
        false,
        t,
        &[vec![w(0)]],
    );
    assert_eq!(out.status, vec![status::TIMEOUT]);
    assert_eq!(out.failed, vec![0]);
    assert!(out.desc.is_broken());
    assert!(out.elapsed >= t);
    // The first timeout stays the one reported.
    assert_eq!(out.desc.timed_out_waiting(), Some((3, 8)));
    // Every later post fails at once: well before a long bound, which the descriptor
    // (reused, so `run`'s timeout argument does not reach it) is given too: a post that
    // waited out its timeout before failing would take that long. (The run's own time,
    // thread start included, on a loaded machine, stays far below it.)
    let long = Duration::from_secs(5);
    let mut desc = out.desc;
    desc.timeout_ns = long.as_nanos() as u64;
    let out = run(
        &env,
        &mem,
        Some(desc),
        CqMode::Normal,
        false,
        long,
        &[vec![w(0)]],
    );
    assert_eq!(out.status, vec![status::BROKEN]);
    assert_eq!(out.failed, vec![0]);
    assert!(out.elapsed < long, "{:?}", out.elapsed);
}

/// A ring with no engine and one more WRITE than slots: the reservation waits for a free
/// slot, times out, and the descriptor names that wait and the index (9: the end of the
/// reservation it waited to fit). A quiet after the queue broke fails at once with BROKEN
/// (it waited out a second timeout before 2026-12-07).
#[test]
fn a_timeout_names_the_wait_and_a_later_quiet_fails_at_once() {
    let env = Env::new(16, 4096);
    let w = |_: usize| write8(&env);
    let mem = Arc::new(QueueMemory::new(8, 8).unwrap());
    let t = Duration::from_millis(100);
    let out = run(
        &env,
        &mem,
        None,
        CqMode::Normal,
        false,
        t,
        &[(0..9).map(w).collect()],
    );
    assert_eq!(out.status, vec![status::TIMEOUT]);
    assert_eq!(out.failed, vec![8], "the ninth WRITE");
    assert!(out.desc.is_broken());
    assert_eq!(out.desc.timed_out_waiting(), Some((1, 9)));
    // Reserved 9, published 8: the hole is the ninth.
    assert_eq!((out.desc.reserved(), out.desc.ready()), (9, 8));
    // A plan with no operation: only its final quiet, which can never see the hole
    // complete. At once: well before a long bound, given to the descriptor as in the test
    // above.
    let long = Duration::from_secs(5);
    let mut desc = out.desc;
    desc.timeout_ns = long.as_nanos() as u64;
    let out = run(
        &env,
        &mem,
        Some(desc),
        CqMode::Normal,
        false,
        long,
        &[Vec::new()],
    );
    assert_eq!(out.status, vec![status::BROKEN]);
    assert!(out.elapsed < long, "{:?}", out.elapsed);
}

/// A ring that gives up (its lock never released: a descriptor not zeroed) fails the post
/// that rang, not only a later quiet: a put with no quiet after it was lost without a
/// word before (its post returned OK).
#[test]
fn a_ring_that_gives_up_fails_the_post() {
    let env = Env::new(16, 4096);
    let mem = Arc::new(QueueMemory::new(8, 8).unwrap());
    let t = Duration::from_millis(100);
    let desc = Box::new(IbgdaQp::for_host(&mem, 0x42, CqMode::Normal, t).unwrap());
    desc.ring_lock
        .store(1, std::sync::atomic::Ordering::Relaxed);
    let out = run(
        &env,
        &mem,
        Some(desc),
        CqMode::Normal,
        false,
        t,
        &[vec![write8(&env)]],
    );
    assert_eq!(out.status, vec![status::TIMEOUT]);
    assert_eq!(out.failed, vec![0], "the WRITE's own post");
    assert!(out.desc.is_broken());
}

#[test]
fn the_last_publisher_rings_the_doorbell() {
    // Post-only op lists (no quiet, nothing blocking): when the threads return, nobody has
    // waited for anything, so only batching's "the last publisher rings" can have put the
    // final producer index into the doorbell record and the doorbell word.
    const THREADS: usize = 4;
    const PER: usize = 3000;
    let env = Env::new(THREADS * REGION_WORDS + 8, 4096);
    let plan: Vec<Vec<TestOp>> = (0..THREADS)
        .map(|t| {
            (0..PER)
                .map(|i| TestOp {
                    kind: if i % 2 == 0 { WRITE } else { PUT },
                    len: 8,
                    raddr: env.raddr(t * REGION_WORDS + i % REGION_WORDS),
                    laddr: env.laddr(8 * (i % 64)),
                    rkey: env.rkey,
                    lkey: env.lkey,
                    ..TestOp::default()
                })
                .collect()
        })
        .collect();
    // Both doorbell modes: a word in memory, and a NIC register (the branch a GPU rings
    // with an MMIO store; in this host build the same store).
    for mmio in [false, true] {
        let mem = Arc::new(QueueMemory::new(64, 64).unwrap());
        let out = run_with(
            &env,
            &mem,
            None,
            CqMode::Normal,
            true,
            Duration::from_secs(60),
            &plan,
            true,
            mmio,
        );
        assert_eq!(out.desc.doorbell_mode, u32::from(mmio), "mmio {mmio}");
        assert_eq!(out.status, vec![status::OK; THREADS]);
        let total = (THREADS * PER) as u64;
        assert_eq!(out.desc.reserved(), total);
        assert_eq!(out.desc.ready(), total);
        let rec = mem.qp_dbrec_send().load(Ordering::Acquire);
        assert_eq!(
            u32::from_be_bytes(rec.to_ne_bytes()),
            (total & 0xffff) as u32
        );
        let db = mem.doorbell().load(Ordering::Acquire);
        assert_eq!(db, doorbell_word(total as u16, out.desc.qpn), "mmio {mmio}");
    }
}

/// fence is a NOP of its own with fence mode FENCE (not a mark for whichever reservation
/// comes next, which another thread may have made before the caller's earlier WQEs);
/// put_signal's signal WQE and a lone signal update carry FENCE themselves.
#[test]
fn fence_is_a_fenced_nop_and_signals_carry_their_own() {
    let env = Env::new(16, 4096);
    let op = |kind: u32| TestOp {
        kind,
        len: 8,
        raddr: env.raddr(0),
        laddr: env.laddr(0),
        a: 5,
        b: SIGNAL_ADD,
        c: env.raddr(1),
        d: env.laddr(64),
        rkey: env.rkey,
        lkey: env.lkey,
        ..TestOp::default()
    };
    let signal = |word: usize, b: u64, a: u64| TestOp {
        raddr: env.raddr(word),
        b,
        a,
        ..op(SIGNAL)
    };
    let ops = vec![
        op(WRITE),
        op(FENCE),
        op(WRITE),
        op(PUT_SIGNAL),
        signal(2, SIGNAL_ADD, 5),
        signal(3, SIGNAL_SET, 7),
        op(WRITE),
    ];
    let mem = Arc::new(QueueMemory::new(16, 16).unwrap());
    let out = run(
        &env,
        &mem,
        None,
        CqMode::Normal,
        true,
        Duration::from_secs(20),
        &[ops],
    );
    assert_eq!(out.status, vec![status::OK]);
    // fm_ce_se (byte 11 of each control segment): CQ update always; FENCE (0x40) on the
    // fence's NOP, on put_signal's signal WQE (not its data) and on both signal updates;
    // opcodes in posting order.
    let fm: Vec<(u8, u8)> = (0..8)
        .map(|i| {
            // SAFETY: slot i of a 16-WQEBB ring; the engine is done with it (the run quieted).
            let s = unsafe { std::slice::from_raw_parts(mem.sq().add(64 * i), 16) };
            (s[3], s[11])
        })
        .collect();
    assert_eq!(
        fm,
        vec![
            (opcode::RDMA_WRITE, 0x08),
            (opcode::NOP, 0x48),
            (opcode::RDMA_WRITE, 0x08),
            (opcode::RDMA_WRITE, 0x08),
            (opcode::ATOMIC_FA, 0x48),
            (opcode::ATOMIC_FA, 0x48),
            (opcode::RDMA_WRITE, 0x48),
            (opcode::RDMA_WRITE, 0x08),
        ]
    );
    assert_eq!(
        (env.remote[1], env.remote[2], env.remote[3]),
        (5, 5, 7),
        "the signals"
    );
}

fn discard_run(mode: CqMode, wqe_cnt: u32, cqe_cnt: u32) {
    // Writes, puts, reads and atomics with keys nobody registered: a discarding engine
    // completes them all without touching memory.
    const THREADS: usize = 4;
    const PER: usize = 5000;
    let env = Env::new(THREADS * REGION_WORDS + 8, 4096);
    let kinds = [WRITE, PUT, READ, FA, MASKED_CS64, WRITE_INLINE];
    let plan: Vec<Vec<TestOp>> = (0..THREADS)
        .map(|t| {
            (0..PER)
                .map(|i| TestOp {
                    kind: kinds[i % kinds.len()],
                    len: 8 + (i % 3) as u32 * 40,
                    raddr: env.raddr(t * REGION_WORDS + i % 32),
                    laddr: env.laddr(8 * (i % 64)),
                    a: 1,
                    rkey: 0xbad,
                    lkey: 0xbad,
                    ..TestOp::default()
                })
                .collect()
        })
        .collect();
    let wqebbs: u64 = plan.iter().flatten().map(wqebbs).sum();
    let mem = Arc::new(QueueMemory::new(wqe_cnt, cqe_cnt).unwrap());
    let out = run_engine(
        &env,
        &mem,
        None,
        mode,
        Engine::Discard,
        Duration::from_secs(60),
        &plan,
        false,
        false,
    );
    assert_eq!(out.status, vec![status::OK; THREADS]);
    assert_eq!(out.discarded, Some((THREADS * PER) as u64));
    assert_eq!(out.desc.reserved(), wqebbs);
    assert_eq!(out.desc.completed(), wqebbs);
    assert_eq!(out.desc.first_error(), None);
    assert!(env.remote.iter().all(|&w| w == 0), "nothing executed");
}

#[test]
fn discard_engine_completes_without_executing_normal_cq() {
    // A normal CQ as large as the ring (IbgdaQp::new refuses a smaller one: the producer
    // asks a CQE of every WQE).
    discard_run(CqMode::Normal, 16, 16);
}

#[test]
fn discard_engine_completes_without_executing_collapsed_cq() {
    discard_run(CqMode::Collapsed, 64, 1);
}

#[test]
fn table_lookup_checks_magic_version_and_bounds() {
    let mem = QueueMemory::new(8, 8).unwrap();
    let qps: Vec<IbgdaQp> = (0..3)
        .map(|i| IbgdaQp::for_host(&mem, 0x10 + i, CqMode::Normal, Duration::from_secs(1)).unwrap())
        .collect();
    let base = qps.as_ptr();
    let table = IbgdaTable::new(base as u64, 3);
    let p = producer();
    // SAFETY: the lookup only reads the table header and computes addresses.
    let at = |t: &IbgdaTable, i: u32| unsafe { (p.table_qp)(t, i) } as *const IbgdaQp;
    for i in 0..3u32 {
        assert_eq!(at(&table, i), base.wrapping_add(i as usize));
        // SAFETY: a valid element of qps.
        assert_eq!(unsafe { (*at(&table, i)).qpn }, 0x10 + i);
    }
    assert!(at(&table, 3).is_null(), "index past n_qps");
    assert!(
        at(&IbgdaTable { magic: 0, ..table }, 0).is_null(),
        "bad magic"
    );
    assert!(
        at(
            &IbgdaTable {
                version: rshmem::softhca::ibgda_table::IBGDA_VERSION + 1,
                ..table
            },
            0
        )
        .is_null(),
        "bad version"
    );
    // SAFETY: a null table is checked before any read.
    assert!(unsafe { (p.table_qp)(std::ptr::null(), 0) }.is_null());
}
