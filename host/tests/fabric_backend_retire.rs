//! A PE that leaves a process whose fabric endpoint goes on (PEs as threads): its heap
//! registration is retired, not closed (`FabricBackend::retire`; docs/ep.md, "A PE thread
//! that leaves").
//! Real libfabric (tcp;ofi_rxm on `lo`): A is the backend of a process with two PE heaps,
//! P (stays) and Q (leaves), driven by hand as the engine drives it; C is a plain endpoint
//! standing for another process that does not know yet that Q left.
//! A missing libfabric is a failure, not a skip.

mod fabric_lo;

use rshmem::fabric::{Completion, Endpoint, Local, MemoryRegion, PeerAddr, RemoteRegion, Target};
use rshmem::mlx5::Syndrome;
use rshmem::softhca::backend::Gather;
use rshmem::softhca::{Backend, FabricBackend, FabricPeer, Op};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_millis(3000);

struct World {
    a: FabricBackend,
    c: Endpoint,
    /// C's source buffer.
    mc: Arc<MemoryRegion>,
    c_to_a: PeerAddr,
    /// A's completions by token.
    got: BTreeMap<u64, Result<(), Syndrome>>,
}

impl World {
    /// Polls A and C until A reported `token`.
    fn a_done(&mut self, token: u64) -> Result<(), Syndrome> {
        let t = Instant::now();
        let mut evs = Vec::new();
        while !self.got.contains_key(&token) {
            let got = &mut self.got;
            self.a
                .poll(&mut |t, s| assert!(got.insert(t, s).is_none(), "token {t} twice"));
            self.c.poll_into(&mut evs).expect("poll c");
            assert!(
                t.elapsed() < TIMEOUT,
                "A's operation {token} never completed"
            );
        }
        self.got[&token]
    }

    /// C writes `word` at `offset` of A's region `to` (A progressed meanwhile); C's
    /// completion status (Err: the libfabric error code).
    fn c_writes(&mut self, to: RemoteRegion, offset: u64, word: u64, ctx: u64) -> Result<(), i32> {
        self.mc.write(0, &word.to_le_bytes()).unwrap();
        let target = Target {
            peer: self.c_to_a,
            region: to,
            offset,
        };
        let t = Instant::now();
        let got = &mut self.got;
        loop {
            match self.c.write(
                target,
                Local {
                    region: &self.mc,
                    offset: 0,
                },
                8,
                ctx,
            ) {
                Ok(()) => break,
                Err(e) if Endpoint::is_busy(&e) => {}
                Err(e) => panic!("C cannot post: {e}"),
            }
            self.a
                .poll(&mut |t, s| assert!(got.insert(t, s).is_none(), "token {t} twice"));
            assert!(t.elapsed() < TIMEOUT, "C could not post");
        }
        let mut evs = Vec::new();
        loop {
            self.a
                .poll(&mut |t, s| assert!(got.insert(t, s).is_none(), "token {t} twice"));
            evs.clear();
            self.c.poll_into(&mut evs).expect("poll c");
            for e in &evs {
                if let Completion::Local { context, status } = e {
                    if *context == ctx {
                        return status.as_ref().map(|_| ()).map_err(|e| e.code);
                    }
                }
            }
            assert!(t.elapsed() < TIMEOUT, "C's write {ctx} never completed");
        }
    }
}

fn word_at(r: &MemoryRegion, offset: usize) -> u64 {
    u64::from_le_bytes(r.to_vec(offset, 8).unwrap().try_into().unwrap())
}

#[test]
fn a_leaving_pe_breaks_no_connection_and_its_region_refuses_access() {
    let (fabric, mut a) = fabric_lo::backend_on_lo(TIMEOUT);
    // The heaps of PEs P and Q, threads of A's process, registered with A's domain.
    let hp = a.domain().alloc(MIB).expect("register P's heap");
    let hq = a.domain().alloc(MIB).expect("register Q's heap");
    let hr = a.domain().alloc(MIB).expect("register R's heap");
    let to_self = a.insert_peer(&a.name()).expect("a knows itself");
    let dc = fabric.domain().expect("domain c");
    let mut c = Endpoint::new(&dc).expect("endpoint c");
    c.set_busy_limit(Some(Duration::ZERO));
    let mc = dc.alloc(4096).expect("register c");
    let c_to_a = c.insert_peer(&a.name()).expect("c knows a");
    a.insert_peer(c.name()).expect("a knows c");
    let pe = |mr: &Arc<MemoryRegion>, rkey: u32| FabricPeer {
        addr: to_self,
        region: mr.remote(),
        vbase: 0x10_0000_0000 * rkey as u64,
        rkey,
        len: MIB as u64,
    };
    let (pp, pq) = (pe(&hp, 1), pe(&hq, 2));
    let mut w = World {
        a,
        c,
        mc,
        c_to_a,
        got: BTreeMap::new(),
    };
    let put = |w: &mut World, p: &FabricPeer, off: u64, v: u64, token: u64| {
        let b = v.to_le_bytes();
        let op = Op::Write {
            raddr: p.vbase + off,
            rkey: p.rkey,
            len: 8,
            src: Gather::Inline(&b),
        };
        match w.a.execute(p, &mut (), token, &op) {
            Some(r) => r,
            None => w.a_done(token),
        }
    };

    // 1. Before: P and Q (through A's connection to itself) and C → A all work.
    assert_eq!(put(&mut w, &pq, 0, 0x51, 1), Ok(()));
    assert_eq!(put(&mut w, &pp, 0, 0x52, 2), Ok(()));
    assert_eq!(w.c_writes(hq.remote(), 8, 0x53, 100), Ok(()));
    assert_eq!(
        (word_at(&hq, 0), word_at(&hp, 0), word_at(&hq, 8)),
        (0x51, 0x52, 0x53)
    );

    // 2. Q leaves: its registration is retired, with the last reference to it (so only
    //    the backend keeps it). Q's memory is read through a pointer from now on.
    let q_remote = hq.remote();
    let q_mem = hq.as_ptr() as usize;
    let q_word = |off: usize| {
        // SAFETY: the retired region (and its memory) lives until the backend drops, at
        // the end of the test; 8-byte aligned offsets inside its 1 MiB.
        unsafe { std::ptr::read_volatile((q_mem + off) as *const u64) }
    };
    // A PE's heap is one of the local buffers WQEs may use while the PE lives (a GPU PE's
    // puts read from it); retiring it takes it off that list.
    let regions = w.a.regions();
    regions.lock().unwrap().push(hq.clone());
    let listed = || {
        regions
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.as_ptr() as usize == q_mem)
            .count()
    };
    assert_eq!(listed(), 1);
    w.a.retire(hq, Box::new(()));
    assert_eq!(w.a.retired(), 1);
    assert_eq!(listed(), 0, "a retired heap stays a local buffer");

    // 3. A's later operations to Q complete at once with REMOTE_ACCESS, as after a
    //    ConnectX's MR was deregistered; nothing reaches Q's memory.
    assert_eq!(put(&mut w, &pq, 16, 0x61, 3), Err(Syndrome::RemoteAccess));

    // 4. C, which does not know, writes to Q: the write lands in the retired memory and the
    //    connection stays up (closing the registration instead would drop it: step 6).
    assert_eq!(w.c_writes(q_remote, 24, 0x62, 101), Ok(()));
    assert_eq!((q_word(16), q_word(24)), (0, 0x62));

    // 5. Every other pair goes on: A → P over A's connection to itself, C → P.
    assert_eq!(put(&mut w, &pp, 32, 0x63, 4), Ok(()));
    assert_eq!(w.c_writes(hp.remote(), 40, 0x64, 102), Ok(()));
    assert_eq!((word_at(&hp, 32), word_at(&hp, 40)), (0x63, 0x64));

    // 6. The control: R's registration is closed instead (what a leaving PE did before).
    //    C's write to it is refused by dropping C's connection to A (FI_ECANCELED), and C's
    //    next write to P finds the connection gone (FI_ENOTCONN): every pair over it broke.
    let r_remote = hr.remote();
    drop(hr);
    let status = w.c_writes(r_remote, 0, 0x65, 103);
    assert_eq!(status, Err(125), "a write to a closed key: FI_ECANCELED");
    assert_eq!(
        w.c_writes(hp.remote(), 48, 0x66, 104),
        Err(107),
        "FI_ENOTCONN"
    );
    assert_eq!(word_at(&hp, 48), 0);
}
