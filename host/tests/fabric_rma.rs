//! libfabric layer over tcp;ofi_rxm on 127.0.0.1 (domain `lo`): two endpoints in one
//! process, driven by one thread, each with a 1 MiB registered region holding a
//! pattern. A missing libfabric is a failure, not a skip.

use rshmem::fabric::{
    self, AtomicType, Completion, CompletionError, Endpoint, Fabric, FabricConfig, FetchOp, Local,
    MemoryRegion, PeerAddr, Target, MR_MODE_SUPPORTED,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn config(mr_mode: u64) -> FabricConfig {
    FabricConfig {
        provider: Some("tcp;ofi_rxm".into()),
        domain: Some("lo".into()),
        mr_mode,
        timeout: Duration::from_secs(10),
        ask_rma_order: true,
    }
}

/// The shm provider as rshmem opens it (its entry ordered for RMA reads after writes).
fn shm_config() -> FabricConfig {
    FabricConfig {
        provider: Some("shm".into()),
        domain: None,
        ..config(MR_MODE_SUPPORTED)
    }
}

/// The shm provider's unordered entry: FI_MR_VIRT_ADDR, so remote addresses are virtual
/// addresses (the mode efa and verbs require; no other provider here has it).
fn shm_virt_config() -> FabricConfig {
    FabricConfig {
        ask_rma_order: false,
        ..shm_config()
    }
}

fn la(region: &Arc<MemoryRegion>, offset: usize) -> Local<'_> {
    Local { region, offset }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ ((i >> 8) as u8) ^ seed)
        .collect()
}

/// Endpoint a on the test thread; endpoint b owned by a poller thread, as each PE's
/// engine would be (rxm connects on the first operation, which needs the target to
/// progress while the initiator's post retries).
struct Pair {
    a: Endpoint,
    ma: Arc<MemoryRegion>,
    mb: Arc<MemoryRegion>,
    /// b as seen from a.
    to_b: PeerAddr,
    /// Events b's poller saw.
    b_events: Arc<Mutex<Vec<Completion>>>,
    stop: Arc<AtomicBool>,
    b_thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.b_thread.take() {
            let _ = t.join();
        }
    }
}

impl Pair {
    fn open(mr_mode: u64) -> Pair {
        Pair::open_with(&config(mr_mode))
    }

    fn open_with(cfg: &FabricConfig) -> Pair {
        let fabric = Fabric::open(cfg).unwrap_or_else(|e| {
            panic!(
                "cannot open libfabric {:?}: {e}\n(install libfabric1: \
                 apt-get install -y libfabric1)",
                cfg.provider
            )
        });
        let domain = fabric.domain().expect("fi_domain");
        let mut a = Endpoint::new(&domain).expect("endpoint a");
        let mut b = Endpoint::new(&domain).expect("endpoint b");
        let ma = domain.alloc(MIB).expect("register a");
        let mb = domain.alloc(MIB).expect("register b");
        ma.write(0, &pattern(0xa5, MIB)).unwrap();
        mb.write(0, &pattern(0x3c, MIB)).unwrap();
        let to_b = a.insert_peer(b.name()).expect("av insert b");
        b.insert_peer(a.name()).expect("av insert a");
        let b_events = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ev, st) = (b_events.clone(), stop.clone());
        let b_thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !st.load(Ordering::Relaxed) {
                out.clear();
                b.poll_into(&mut out).expect("poll b");
                if !out.is_empty() {
                    ev.lock().unwrap().append(&mut out);
                }
            }
        });
        Pair {
            a,
            ma,
            mb,
            to_b,
            b_events,
            stop,
            b_thread: Some(b_thread),
        }
    }

    fn at_b(&self, offset: u64) -> Target {
        Target {
            peer: self.to_b,
            region: self.mb.remote(),
            offset,
        }
    }

    /// Polls a until its operation `ctx` completes.
    fn wait(&mut self, ctx: u64) -> Result<(), CompletionError> {
        let start = Instant::now();
        loop {
            let cs = self.a.poll().expect("poll a");
            assert!(cs.len() <= 1, "one operation in flight, got {cs:?}");
            if let Some(c) = cs.into_iter().next() {
                match c {
                    Completion::Local { context, status } if context == ctx => return status,
                    other => panic!("unexpected completion on a: {other:?}"),
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "operation {ctx} did not complete in 10 s"
            );
        }
    }

    /// Waits until b has seen a remote-data event.
    fn wait_b_data(&mut self) -> u64 {
        let start = Instant::now();
        loop {
            {
                let mut evs = self.b_events.lock().unwrap();
                if let Some(i) = evs
                    .iter()
                    .position(|c| matches!(c, Completion::RemoteData { .. }))
                {
                    let Completion::RemoteData { data } = evs.remove(i) else {
                        unreachable!()
                    };
                    return data;
                }
            }
            assert!(self.a.poll().expect("poll a").is_empty());
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no remote data at b in 10 s"
            );
        }
    }
}

fn write_read_exact(cfg: &FabricConfig) {
    let mut p = Pair::open_with(cfg);
    let info = p.a.info().clone();
    eprintln!("{info:?} delivery_complete={}", p.a.delivery_complete());
    let src = pattern(0xa5, MIB);
    let mut b_expect = pattern(0x3c, MIB);
    // (local offset at a, remote offset at b, length)
    let cases = [
        (8usize, 16u64, 8usize),
        (4096 + 3, 65536 + 5, 4096),
        (0, 0, MIB),
    ];
    for (k, &(lo, ro, len)) in cases.iter().enumerate() {
        let ctx = 100 + k as u64;
        p.a.write(p.at_b(ro), la(&p.ma, lo), len, ctx)
            .expect("post write");
        p.wait(ctx).expect("write completes");
        b_expect[ro as usize..ro as usize + len].copy_from_slice(&src[lo..lo + len]);
        assert!(
            p.mb.to_vec(0, MIB).unwrap() == b_expect,
            "target bytes after {len}-byte write differ"
        );
    }
    // Read back into a at different offsets.
    for (k, &(ro, lo, len)) in [
        (16u64, 100usize, 8usize),
        (65536 + 5, 200_000, 4096),
        (0, 0, MIB),
    ]
    .iter()
    .enumerate()
    {
        let ctx = 200 + k as u64;
        // Scribble first so a stale buffer cannot pass.
        p.ma.write(lo, &vec![0xee; len]).unwrap();
        let local = la(&p.ma, lo);
        p.a.read(local, p.at_b(ro), len, ctx).expect("post read");
        p.wait(ctx).expect("read completes");
        assert!(
            p.ma.to_vec(lo, len).unwrap() == b_expect[ro as usize..ro as usize + len],
            "{len}-byte read differs"
        );
    }
    let evs = p.b_events.lock().unwrap();
    assert!(evs.is_empty(), "b saw {evs:?}");
}

#[test]
fn write_and_read_exact_bytes_provider_mr_mode() {
    write_read_exact(&config(MR_MODE_SUPPORTED));
}

#[test]
fn write_and_read_exact_bytes_virtual_addressing_on_shm() {
    let f = Fabric::open(&shm_virt_config()).expect("shm provider");
    assert!(f.info().virt_addr, "{:?}", f.info());
    drop(f);
    write_read_exact(&shm_virt_config());
}

/// shm as rshmem opens it (ordered, offsets and rshmem's keys): exact bytes too.
#[test]
fn write_and_read_exact_bytes_on_ordered_shm() {
    let f = Fabric::open(&shm_config()).expect("shm provider");
    assert!(!f.info().virt_addr && !f.info().prov_key, "{:?}", f.info());
    drop(f);
    write_read_exact(&shm_config());
}

#[test]
fn write_and_read_exact_bytes_offset_addressing() {
    // mr_mode 0: tcp;ofi_rxm then uses offsets from 0 and rshmem-chosen keys.
    let f = Fabric::open(&config(0)).expect("mr_mode 0");
    assert!(!f.info().virt_addr && !f.info().prov_key, "{:?}", f.info());
    drop(f);
    write_read_exact(&config(0));
}

#[test]
fn write_data_delivers_64_bit_immediate() {
    let mut p = Pair::open(MR_MODE_SUPPORTED);
    assert_eq!(
        p.a.info().cq_data_size,
        8,
        "tcp;ofi_rxm carries 8-byte CQ data"
    );
    let imm = 0xfedc_ba98_7654_3210u64;
    p.a.write_data(p.at_b(512), la(&p.ma, 0), 4096, imm, 7)
        .expect("post writedata");
    p.wait(7).expect("writedata completes");
    assert_eq!(p.wait_b_data(), imm);
    assert_eq!(p.mb.to_vec(512, 4096).unwrap(), pattern(0xa5, 4096));
}

fn u_at(m: &MemoryRegion, off: usize, ty: AtomicType) -> u64 {
    match ty {
        AtomicType::U32 => m.read_u32(off).unwrap() as u64,
        AtomicType::U64 => m.read_u64(off).unwrap(),
    }
}

fn put(m: &MemoryRegion, off: usize, ty: AtomicType, v: u64) {
    match ty {
        AtomicType::U32 => m.write(off, &(v as u32).to_ne_bytes()).unwrap(),
        AtomicType::U64 => m.write(off, &v.to_ne_bytes()).unwrap(),
    }
}

#[test]
fn atomics_u32_u64_exact_old_values_and_results() {
    let mut p = Pair::open(MR_MODE_SUPPORTED);
    let (tgt, res) = (4096usize, 8192usize);
    let mut ctx = 1000;
    for ty in [AtomicType::U32, AtomicType::U64] {
        let mask = if ty == AtomicType::U32 {
            u32::MAX as u64
        } else {
            u64::MAX
        };
        let init = 0x8123_4567_89ab_cdefu64 & mask;
        // (op, operand, expected new value from `init`)
        let cases = [
            (
                FetchOp::Add,
                0x1111_1111_1111_1111u64 & mask,
                init.wrapping_add(0x1111_1111_1111_1111) & mask,
            ),
            (FetchOp::Add, mask, init.wrapping_add(mask) & mask), // wraps: -1
            (FetchOp::Read, 0xdead, init),
            (
                FetchOp::Swap,
                0x0f0f_0f0f_0f0f_0f0f & mask,
                0x0f0f_0f0f_0f0f_0f0f & mask,
            ),
            (
                FetchOp::And,
                0xff00_ff00_ff00_ff00 & mask,
                init & 0xff00_ff00_ff00_ff00,
            ),
            (
                FetchOp::Or,
                0x00f0_00f0_00f0_00f0 & mask,
                init | (0x00f0_00f0_00f0_00f0 & mask),
            ),
            (
                FetchOp::Xor,
                0xffff_0000_ffff_0000 & mask,
                init ^ (0xffff_0000_ffff_0000 & mask),
            ),
        ];
        for (op, operand, new) in cases {
            put(&p.mb, tgt, ty, init);
            // Neighbouring bytes must not change.
            p.mb.write(tgt + ty.size(), &[0x77; 8]).unwrap();
            put(&p.ma, res, ty, 0x5a5a_5a5a_5a5a_5a5a & mask);
            ctx += 1;
            p.a.fetch_atomic(op, ty, operand, p.at_b(tgt as u64), la(&p.ma, res), ctx)
                .expect("post fetch atomic");
            p.wait(ctx).expect("atomic completes");
            assert_eq!(
                u_at(&p.ma, res, ty),
                init,
                "{op:?} {ty:?}: fetched old value"
            );
            assert_eq!(u_at(&p.mb, tgt, ty), new, "{op:?} {ty:?}: new value");
            assert_eq!(p.mb.to_vec(tgt + ty.size(), 8).unwrap(), [0x77; 8]);
        }
        // Compare-and-swap: a miss leaves the value, a hit swaps; both return old.
        let swap = 0x1234_5678_9abc_def0 & mask;
        for (compare, expect_new) in [(init ^ 1, init), (init, swap)] {
            put(&p.mb, tgt, ty, init);
            ctx += 1;
            p.a.compare_swap(ty, compare, swap, p.at_b(tgt as u64), la(&p.ma, res), ctx)
                .expect("post cswap");
            p.wait(ctx).expect("cswap completes");
            assert_eq!(u_at(&p.ma, res, ty), init, "cswap {ty:?} old value");
            assert_eq!(
                u_at(&p.mb, tgt, ty),
                expect_new,
                "cswap {ty:?} compare {compare:#x}"
            );
        }
    }
    for ty in [AtomicType::U32, AtomicType::U64] {
        for op in FetchOp::ALL {
            assert!(p.a.atomic_support().fetch(op, ty).is_ok_and(|n| n >= 1));
        }
        assert!(p.a.atomic_support().compare(ty).is_ok_and(|n| n >= 1));
    }
}

#[test]
fn misaligned_atomic_is_refused_before_posting() {
    let mut p = Pair::open(MR_MODE_SUPPORTED);
    let e =
        p.a.fetch_atomic(FetchOp::Add, AtomicType::U64, 1, p.at_b(4), la(&p.ma, 0), 1)
            .unwrap_err();
    assert!(
        matches!(e, rshmem::Error::Misaligned { align: 8, .. }),
        "{e}"
    );
    assert_eq!(p.a.in_flight(), 0);
}

/// What tcp;ofi_rxm 1.17 does with a write the target's provider refuses (outside the
/// registered region, or an unknown key): the target drops the connection. The refused
/// write completes with FI_ECANCELED (prov_errno ENOENT) → WR_FLUSH; every later
/// operation to that peer with FI_ENOTCONN (prov_errno EPIPE) → TRANSPORT_RETRY_EXC.
/// (A ConnectX would say REMOTE_ACCESS; the soft HCA checks keys and bounds itself
/// before posting, so it can.) The target's memory is untouched.
fn refused_write(corrupt: impl Fn(&mut Target)) {
    let mut p = Pair::open(MR_MODE_SUPPORTED);
    // Connect first, so the error is about the access, not connection setup.
    p.a.write(p.at_b(0), la(&p.ma, 0), 8, 1)
        .expect("post write");
    p.wait(1).expect("first write");
    let mut bad = p.at_b((MIB - 32) as u64);
    corrupt(&mut bad);
    let before = p.mb.to_vec(0, MIB).unwrap();
    p.a.write(bad, la(&p.ma, 4096), 64, 2)
        .expect("post refused write");
    let e = p
        .wait(2)
        .expect_err("the refused write must complete with an error");
    assert_eq!(
        (e.code, e.prov_errno, e.syndrome()),
        (125, 2, fabric::syndrome::WR_FLUSH),
        "{e}"
    );
    assert_eq!(e.text, "Operation canceled");
    p.a.write(p.at_b(0), la(&p.ma, 4096), 8, 3)
        .expect("post write after error");
    let after = p.wait(3).expect_err("the connection is gone");
    assert_eq!(
        (after.code, after.prov_errno, after.syndrome()),
        (107, 32, fabric::syndrome::TRANSPORT_RETRY_EXC),
        "{after}"
    );
    assert!(
        p.mb.to_vec(0, MIB).unwrap() == before,
        "target memory changed"
    );
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn out_of_bounds_write_completes_with_error() {
    // 64 bytes straddling the end of b's 1 MiB region.
    refused_write(|_| {});
}

#[test]
fn wrong_key_write_completes_with_error() {
    refused_write(|t| {
        t.offset = 0;
        t.region.key ^= 0x5555;
    });
}

#[test]
fn unknown_provider_error_lists_what_was_found() {
    let cfg = FabricConfig {
        provider: Some("nosuchprov".into()),
        ..config(MR_MODE_SUPPORTED)
    };
    let e = Fabric::open(&cfg).unwrap_err().to_string();
    assert!(e.contains("fi_getinfo") && e.contains("nosuchprov"), "{e}");
    assert!(
        e.contains("RDM providers found: [") && e.contains("tcp;ofi_rxm"),
        "{e}"
    );
}

#[test]
fn bare_tcp_means_tcp_over_rxm_and_auto_choice_is_in_order() {
    assert_eq!(fabric::normalize_provider("tcp"), "tcp;ofi_rxm");
    let f = Fabric::open(&FabricConfig {
        provider: None,
        ..config(MR_MODE_SUPPORTED)
    })
    .expect("automatic choice");
    assert!(
        fabric::AUTO_ORDER.contains(&f.info().provider.as_str()),
        "{:?}",
        f.info()
    );
}

#[test]
fn remote_region_round_trips_through_bytes() {
    let r = fabric::RemoteRegion {
        base: 0x7f00_1234_5000,
        key: 0xabcdef,
        len: MIB as u64,
    };
    assert_eq!(fabric::RemoteRegion::from_bytes(&r.to_bytes()).unwrap(), r);
    assert!(fabric::RemoteRegion::from_bytes(&[0; 23]).is_err());
}

/// Not a timing assertion: prints the ping-pong latency for docs/fabric.md.
#[test]
fn pingpong_prints_latency() {
    let f = Fabric::open(&config(MR_MODE_SUPPORTED)).expect("open");
    let d = f.domain().expect("domain");
    for (size, iters) in [(8, 2000), (MIB, 50)] {
        let r = fabric::bench::pingpong_on(&d, size, iters).expect("pingpong");
        println!("{r}");
        assert_eq!((r.size, r.iters), (size, iters));
        assert!(r.median_one_way > Duration::ZERO);
    }
}

/// RMA reads ordered after writes are asked for on both sides, so shm (which orders them
/// only when asked: transmit msg_order 0x100 otherwise) answers with the ordering, and the
/// soft HCA confirms writes with flush READs on shm as on tcp;ofi_rxm (it took the slower
/// delivery-complete writes on shm before).
#[test]
fn read_after_write_ordering_is_asked_for_on_both_sides() {
    use rshmem::fabric::sys::FI_ORDER_RMA_RAW;
    for cfg in [config(MR_MODE_SUPPORTED), shm_config()] {
        let f = Fabric::open(&cfg).unwrap_or_else(|e| panic!("{:?}: {e}", cfg.provider));
        let i = f.info().clone();
        assert_ne!(i.msg_order & FI_ORDER_RMA_RAW, 0, "{i:?}");
        assert_ne!(i.rx_msg_order & FI_ORDER_RMA_RAW, 0, "{i:?}");
        let switches = rshmem::config::FabricSwitches {
            handover: true,
            lazy_confirm: true,
            delivery_complete: false,
        };
        let b = rshmem::softhca::FabricBackend::open_on(&f, switches)
            .unwrap_or_else(|e| panic!("{:?}: {e}", cfg.provider));
        assert!(b.confirms_with_reads(), "{i:?}");
    }
}
