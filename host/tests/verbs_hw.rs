//! The real verbs path on a real RDMA device: ignored by default (this project's build
//! machine has none: its kernel is built without CONFIG_INFINIBAND, so not even soft-RoCE
//! can be created — docs/ibgda.md). Run on a machine with a device:
//!
//! ```text
//! RSHMEM_TEST_RDMA_DEVICE=rxe0 scripts/test --rdma      # any device: standard verbs
//! RSHMEM_TEST_RDMA_DEVICE=mlx5_0 scripts/test --rdma    # mlx5: also the SendQueue path
//! ```
//!
//! The `gpu_selftest_over_ibgda_*` tests also need a GPU with its driver: they run the GPU
//! self-test over `--transport ibgda` (docs/ibgda.md, step 10).
//!
//! A run with `--ignored` but without the variable fails (a skipped test must not look
//! like a passing one); the mlx5 test fails on a device that is not mlx5.

use rshmem::mlx5::wqe::{Payload, RaddrSeg, WqeOp};
use rshmem::softhca::queue::{CqMode, SendQueue};
use rshmem::verbs::{self, dv, HeapKey, HeapMemory, MemoryRegion, ProtectionDomain, QpCaps};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REASON: &str = "needs an RDMA device: RSHMEM_TEST_RDMA_DEVICE=<name> scripts/test --rdma";

fn device() -> String {
    std::env::var("RSHMEM_TEST_RDMA_DEVICE").unwrap_or_else(|_| {
        panic!("not run: no RDMA device named ({REASON}); this is a skip, not a pass")
    })
}

/// Opens the device, registers `buf` (the "heap") and connects one QP to this PE
/// (loopback) through `connect_all` with a one-PE exchange.
fn loopback(buf: &mut [u8]) -> (Arc<ProtectionDomain>, MemoryRegion, verbs::Connected) {
    let name = device();
    let ctx = verbs::Context::open(&name).expect("open device");
    let port = ctx.port_info(1).expect("port 1");
    assert_eq!(
        port.state,
        verbs::device::PORT_ACTIVE,
        "{name} port 1 is not ACTIVE"
    );
    let pd = ProtectionDomain::new(&ctx).expect("PD");
    // SAFETY: `buf` outlives the region (the caller drops the region first).
    let mr = unsafe {
        MemoryRegion::register(
            &pd,
            HeapMemory::Virtual {
                addr: buf.as_mut_ptr(),
                len: buf.len(),
            },
            verbs::device::HEAP_ACCESS,
        )
    }
    .expect("register");
    let heap = HeapKey {
        base: buf.as_ptr() as u64,
        len: buf.len() as u64,
        rkey: mr.rkey(),
    };
    let conn = verbs::connect_all(
        &pd,
        &port,
        0,
        1,
        heap,
        QpCaps::default(),
        &verbs::RcParams::default(),
        0x5eed,
        |mine| Ok(vec![mine.to_vec()]),
    )
    .expect("QP to RTS");
    (pd, mr, conn)
}

#[test]
#[ignore = "needs an RDMA device: RSHMEM_TEST_RDMA_DEVICE=<name> scripts/test --rdma"]
fn loopback_rdma_write_through_standard_verbs() {
    let mut buf = vec![0u8; 8192];
    for (i, b) in buf[..4096].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let base = buf.as_ptr() as u64;
    let (_pd, mr, conn) = loopback(&mut buf);
    let qp = &conn.qps[0];
    assert_eq!(conn.peers[0].heap_rkey, mr.rkey());
    qp.post_rdma_write(42, buf.as_ptr(), 4096, mr.lkey(), base + 4096, mr.rkey())
        .expect("post");
    let t0 = Instant::now();
    let wc = loop {
        let got = qp.cq().poll(1).expect("poll");
        if let Some(w) = got.first() {
            break *w;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no completion in 5 s"
        );
    };
    assert_eq!((wc.wr_id, wc.qp_num), (42, qp.qpn()));
    assert_eq!(wc.status, 0, "{}", verbs::wc_status_str(wc.status));
    // SAFETY: the NIC finished writing (completion seen); read through a volatile copy.
    let dst: Vec<u8> = (0..4096)
        .map(|i| unsafe { std::ptr::read_volatile(buf.as_ptr().add(4096 + i)) })
        .collect();
    assert_eq!(&dst[..], &buf[..4096]);
    drop(conn);
    drop(mr);
}

#[test]
#[ignore = "needs an mlx5 device: RSHMEM_TEST_RDMA_DEVICE=mlx5_N scripts/test --rdma"]
fn loopback_rdma_write_through_send_queue_on_mlx5_queues() {
    let mut buf = vec![0u8; 8192];
    let base = buf.as_ptr() as u64;
    let (_pd, mr, mut conn) = loopback(&mut buf);
    let qp = conn.qps.pop().expect("one QP");
    assert!(
        qp.pd().context().is_mlx5(),
        "{} is not an mlx5 device",
        device()
    );
    let qpn = qp.qpn();
    let mem = dv::queue_memory(qp).expect("mlx5dv_init_obj");
    let sq = SendQueue::new(
        Arc::new(mem),
        qpn,
        CqMode::Normal,
        Duration::from_secs(5),
        None,
    );
    for i in 0..300u64 {
        let v = (i * 0x0101_0101_0101_0101).to_le_bytes();
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(base + 8 * (i % 512), mr.rkey()),
            payload: Payload::Inline(&v),
        };
        let _ = sq.post(&w).expect("post");
    }
    sq.quiet().expect("every WQE completes without error");
    for i in 212..300u64 {
        let at = 8 * (i % 512) as usize;
        // SAFETY: completed WRITEs; volatile read of the NIC-written bytes.
        let got = unsafe { std::ptr::read_volatile(buf.as_ptr().add(at) as *const u64) };
        assert_eq!(got, i * 0x0101_0101_0101_0101, "slot {i}");
    }
    drop(sq);
    drop(conn);
    drop(mr);
}

/// The GPU selftest over a real NIC (`--transport ibgda`: GPU heaps registered with the
/// NIC, the device API writing its queues), 2 PEs as threads on GPU 0, with the doorbell
/// `mode` (`auto`: GPU threads ring the UAR if the driver maps it; `cpu`: the relay
/// thread). Needs a GPU and an mlx5 device: never run on this project's machines.
fn gpu_selftest_over_ibgda(mode: &str) {
    let name = device();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rshmem"))
        .args([
            "selftest",
            "--device",
            "gpu",
            "--pes",
            "2",
            "--transport",
            "ibgda",
        ])
        .env("RSHMEM_HCA", &name)
        .env("RSHMEM_IBGDA_DOORBELL", mode)
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .output()
        .expect("run rshmem");
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("transport ibgda") && t.contains("GPU PEs over ibgda:"),
        "{t}"
    );
    if mode == "cpu" {
        assert!(t.contains("a CPU thread rings the NIC"), "{t}");
    }
}

#[test]
#[ignore = "needs a GPU and an mlx5 device: RSHMEM_TEST_RDMA_DEVICE=mlx5_N scripts/test --rdma"]
fn gpu_selftest_over_ibgda_gpu_doorbell() {
    gpu_selftest_over_ibgda("auto");
}

#[test]
#[ignore = "needs a GPU and an mlx5 device: RSHMEM_TEST_RDMA_DEVICE=mlx5_N scripts/test --rdma"]
fn gpu_selftest_over_ibgda_cpu_doorbell() {
    gpu_selftest_over_ibgda("cpu");
}
