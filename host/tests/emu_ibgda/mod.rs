//! Emulated GPU PEs over IBGDA queues that a soft HCA engine in the test process serves,
//! shared by host/tests/device_emu.rs (the device API's kernels) and
//! host/tests/ep_cuda_parity.rs (the EP kernels).
//!
// What `rshmem selftest --device gpu --transport proxy` sets up on a GPU (gpu::ibgda),
// with the emulated blocks as the GPU: every PE's heap, one queue pair per (PE, peer) (the
// loopback one included), descriptors, tables, result slots and peer tables live in one
// memfd that this test's soft HCA engine serves through the host mapping, and that the
// emulator maps at other ("device") addresses, as a GPU addresses host memory registered
// into CUDA. So the heap is registered twice in each PE's protection domain (host
// addresses: the rkey peers use; device addresses: state.lkey), the descriptors carry
// device addresses, and peers' raddr are host addresses, exactly as in ProxyGpu::new.

use rshmem::gpu::heap::{SYNC_BYTES, SYNC_OFFSET};
use rshmem::gpu::ibgda::{
    descriptor, descriptor_bytes, peer_bytes, peer_table, table_bytes, RESULT_SLOTS,
};
use rshmem::gpu::state::{DeviceState, STATE_CHECKS, STATE_MAGIC, STATE_SELF_IBGDA, STATE_VERSION};
use rshmem::softhca::ibgda_table::IbgdaTable;
use rshmem::softhca::queue::QueueParts;
use rshmem::softhca::{
    Access, Backend, CqMode, LocalBackend, LocalPeer, MrTable, Op, QpConfig, QueueLayout,
    QueueMemory, SoftHca,
};
use std::sync::Arc;
use std::time::Duration;

/// Heap bytes per PE of the device API's cases (the emulator's p2p heaps are the same size).
pub const IBGDA_HEAP: usize = 4 << 20;
/// Heap offset of the scratch range (the emulator's kScratchOffset).
pub const SCRATCH_OFFSET: usize = 64 << 10;

/// The LocalBackend, with a short idle sleep: the producers are other processes, which
/// cannot wake the engine thread (a GPU cannot either), so it polls.
pub struct PollingLocal(pub LocalBackend);

impl Backend for PollingLocal {
    type Peer = LocalPeer;
    type Cache = <LocalBackend as Backend>::Cache;
    fn execute(
        &mut self,
        peer: &LocalPeer,
        cache: &mut Self::Cache,
        token: u64,
        op: &Op<'_>,
    ) -> Option<Result<(), rshmem::mlx5::Syndrome>> {
        self.0.execute(peer, cache, token, op)
    }
    fn idle_wait(&self) -> Duration {
        Duration::from_micros(20)
    }
    fn callers_drive(&self) -> bool {
        false
    }
}

/// The shared memfd, mapped here; unmapped and closed on drop (after every queue).
pub struct Mapping {
    pub fd: i32,
    pub host: *mut u8,
    pub len: usize,
}
// SAFETY: plain memory; who writes what is decided by the queues' protocol and the test.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}
impl Mapping {
    /// A memfd of `len` bytes (zeroed), mapped shared here.
    pub fn new(len: usize) -> Arc<Mapping> {
        // SAFETY: plain libc calls; every result is checked.
        let (fd, host) = unsafe {
            let fd = libc::memfd_create(c"rshmem-device-emu".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            assert_eq!(libc::ftruncate(fd, len as i64), 0, "ftruncate");
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(
                p,
                libc::MAP_FAILED,
                "mmap: {}",
                std::io::Error::last_os_error()
            );
            (fd, p.cast::<u8>())
        };
        Arc::new(Mapping { fd, host, len })
    }

    /// The host address of byte `off` (at most the end) of the mapping.
    pub fn at(&self, off: usize) -> *mut u8 {
        assert!(
            off <= self.len,
            "offset {off} past the mapping ({} bytes)",
            self.len
        );
        // SAFETY: off is inside the mapping (or its end), checked above.
        unsafe { self.host.add(off) }
    }

    /// Copies `bytes` to `off` (bounds checked). Only while no emulated block runs.
    pub fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len, "write past the mapping");
        // SAFETY: the range is inside the mapping (checked); the callers write before
        // any emulator process or engine WQE touches it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.host.add(off), bytes.len()) }
    }

    /// `/proc/<pid>/fd/<n>`: how the emulator opens the memfd.
    pub fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd)
    }

    /// A queue pair's memory (`ring` WQEBBs and CQEs, QueueLayout's offsets) at `off`,
    /// its CQ initialised; it keeps the mapping alive.
    pub fn queue(self: &Arc<Self>, off: usize, ring: u32) -> Arc<QueueMemory> {
        let l = QueueLayout::new(ring, ring).unwrap();
        assert!(off + l.size <= self.len, "queue past the mapping");
        // SAFETY: the five parts lie in [off, off + l.size) of the mapping, which the
        // queue's owner (an Arc of it) keeps alive; only the engine and the emulated
        // producers touch them.
        unsafe {
            let at = |o: usize| self.host.add(off + o);
            let parts = QueueParts {
                sq: at(l.sq_offset),
                qp_dbrec: at(l.qp_dbrec_offset),
                doorbell: at(l.doorbell_offset),
                cq: at(l.cq_offset),
                cq_dbrec: at(l.cq_dbrec_offset),
            };
            rshmem::mlx5::cqe::init_cq(std::slice::from_raw_parts_mut(
                parts.cq,
                ring as usize * 64,
            ));
            Arc::new(QueueMemory::from_parts(parts, ring, ring, Box::new(self.clone())).unwrap())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in Shared::new with this length; nothing uses it any more (the
        // queues holding an Arc of it are gone).
        unsafe {
            libc::munmap(self.host.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

/// Where an emulator maps a job's memfd: its "device" addresses (a GPU's addresses differ
/// from the host's too). A fixed 16 TiB, not an offset from the test's own mapping: the
/// emulator is another process, whose libraries, stacks and fiber stacks Linux places at
/// random near the top of the address space, so an address near the test's mapping could
/// be taken there (the emulator's MAP_FIXED_NOREPLACE then fails and the run with it).
/// Nothing is mapped this low by default (mmaps grow down from ~127 TiB; PIE executables
/// and their heaps sit at ~85 TiB).
pub const EMU_DEVICE_BASE: u64 = 0x1000_0000_0000;

/// A memfd as the emulator sees it: where it maps it and where the PEs' states and
/// result records are (offsets into the memfd).
pub struct Shm {
    pub map: Arc<Mapping>,
    /// Where the emulator maps the memfd ("device" addresses).
    pub dev: u64,
    pub states: usize,
    pub results: usize,
}

impl Shm {
    /// The device address of offset `off`.
    pub fn d(&self, off: usize) -> u64 {
        self.dev + off as u64
    }

    /// The variables that tell an emulator driver where the memfd and the PEs' states
    /// and result records are (device_emulator.cpp, ll_emulator.cpp).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RSHMEM_EMU_SHM", self.map.path()),
            ("RSHMEM_EMU_SHM_AT", format!("{:#x}", self.dev)),
            ("RSHMEM_EMU_SHM_LEN", self.map.len.to_string()),
            ("RSHMEM_EMU_STATES", format!("{:#x}", self.d(self.states))),
            ("RSHMEM_EMU_RESULTS", format!("{:#x}", self.d(self.results))),
        ]
    }
}

/// Everything the emulated GPU PEs of one job share with the engine.
pub struct Shared {
    pub shm: Shm,
    pub pes: usize,
    pub heaps: Vec<usize>,
    pub heap_bytes: usize,
    pub errors: Vec<usize>,
    /// Per PE: its descriptors (one per peer, in rank order).
    pub descs: Vec<usize>,
    // Drop order: the QPs detach before the engine stops, both before the memory goes.
    _qps: Vec<rshmem::softhca::QpHandle<PollingLocal>>,
    _hca: SoftHca<PollingLocal>,
    _pds: Vec<Arc<MrTable>>,
}

impl Shared {
    pub fn host(&self, off: usize) -> *mut u8 {
        self.shm.map.at(off)
    }

    /// `bad_rkeys`: peers' entries name a key their heap was never registered under, so
    /// every remote operation completes with REMOTE_ACCESS (0x13), as on a NIC.
    /// `timeout_ms`: the device-side bound of waits and of the queues. `ring`: WQEBBs (and
    /// CQEs) per queue; gpu::ibgda's WQE_CNT in production.
    pub fn new(pes: usize, bad_rkeys: bool, timeout_ms: u64, ring: u32) -> Shared {
        Self::with(pes, bad_rkeys, timeout_ms, ring, IBGDA_HEAP, &|_, _| false)
    }

    /// As [`Shared::new`], with heaps of `heap_bytes` and PE p's entry for PE q != p a P2P
    /// mapping of q's heap (device address) where `p2p(p, q)`: a job whose PEs reach some
    /// peers by stores and the others through their queues (every queue exists either way).
    pub fn with(
        pes: usize,
        bad_rkeys: bool,
        timeout_ms: u64,
        ring: u32,
        heap_bytes: usize,
        p2p: &dyn Fn(usize, usize) -> bool,
    ) -> Shared {
        let page = 4096usize;
        let mut len = 0usize;
        let mut take = |bytes: usize| {
            let at = len.next_multiple_of(page);
            len = at + bytes;
            at
        };
        let qlayout = QueueLayout::new(ring, ring).unwrap();
        let heaps: Vec<usize> = (0..pes).map(|_| take(heap_bytes)).collect();
        let queues: Vec<Vec<usize>> = (0..pes)
            .map(|_| (0..pes).map(|_| take(qlayout.size)).collect())
            .collect();
        let slots: Vec<usize> = (0..pes)
            .map(|_| take((RESULT_SLOTS as usize + 1) * 8))
            .collect();
        let locks: Vec<usize> = (0..pes).map(|_| take(RESULT_SLOTS as usize * 4)).collect();
        let descs: Vec<usize> = (0..pes).map(|_| take(pes * 320)).collect();
        let tables: Vec<usize> = (0..pes).map(|_| take(64)).collect();
        let peers: Vec<usize> = (0..pes).map(|_| take(pes * 32)).collect();
        let errors: Vec<usize> = (0..pes).map(|_| take(64)).collect();
        let states = take(pes * 128);
        let results = take(pes * 64);
        let len = len.next_multiple_of(page);

        let map = Mapping::new(len);
        let host = map.host;
        let r = host as u64;
        let dev = EMU_DEVICE_BASE;
        let delta = dev.wrapping_sub(r);
        let at = |off: usize| map.at(off);
        let timeout = Duration::from_millis(timeout_ms);

        let pds: Vec<Arc<MrTable>> = (0..pes).map(|_| Arc::new(MrTable::new())).collect();
        // SAFETY (registrations): every range is inside the mapping, which outlives the
        // tables (Shared's drop order).
        let rkeys: Vec<u32> = (0..pes)
            .map(|p| unsafe {
                pds[p].register(
                    at(heaps[p]),
                    r + heaps[p] as u64,
                    heap_bytes as u64,
                    Access::ALL,
                )
            })
            .collect();
        let hca = SoftHca::start(PollingLocal(LocalBackend), "emu-softhca").expect("engine");
        let mut qps = Vec::new();
        for p in 0..pes {
            // SAFETY: as above.
            let lkey = unsafe {
                pds[p].register(
                    at(heaps[p]),
                    dev + heaps[p] as u64,
                    heap_bytes as u64,
                    Access::ALL,
                )
            };
            let slots_len = (RESULT_SLOTS as u64 + 1) * 8;
            // SAFETY: as above.
            let results_lkey = unsafe {
                pds[p].register(
                    at(slots[p]),
                    dev + slots[p] as u64,
                    slots_len,
                    Access::LOCAL_WRITE,
                )
            };
            let mut d = Vec::new();
            for q in 0..pes {
                let mem = map.queue(queues[p][q], ring);
                let h = hca.attach(QpConfig::new(
                    mem.clone(),
                    pds[p].clone(),
                    LocalPeer::new(pds[q].clone()),
                    CqMode::Normal,
                ));
                d.push(descriptor(&mem, delta, h.qpn(), timeout).unwrap());
                qps.push(h);
            }
            let write = |off: usize, bytes: &[u8]| map.write(off, bytes);
            write(descs[p], &descriptor_bytes(&d));
            let (mut table, _) = peer_table(
                &(0..pes)
                    .map(|q| {
                        let bad = bad_rkeys && q != p;
                        Some((
                            r + heaps[q] as u64,
                            rkeys[q] ^ if bad { 0x5a5a_0000 } else { 0 },
                        ))
                    })
                    .collect::<Vec<_>>(),
            );
            for (q, e) in table.iter_mut().enumerate() {
                if q != p && p2p(p, q) {
                    // Queue q stays in the table (qp = q); the entry just does not use it.
                    e.transport = rshmem::gpu::state::TRANSPORT_P2P;
                    e.heap_base = dev + heaps[q] as u64;
                }
            }
            write(peers[p], &peer_bytes(&table));
            let t = IbgdaTable::new(dev + descs[p] as u64, pes as u32).with_results(
                dev + slots[p] as u64,
                dev + locks[p] as u64,
                RESULT_SLOTS,
                results_lkey,
            );
            write(tables[p], &table_bytes(&t));
            let st = DeviceState {
                magic: STATE_MAGIC,
                version: STATE_VERSION,
                my_pe: p as i32,
                n_pes: pes as i32,
                heap_base: dev + heaps[p] as u64,
                heap_size: heap_bytes as u64,
                peers: dev + peers[p] as u64,
                timeout_ns: timeout.as_nanos() as u64,
                sync_offset: SYNC_OFFSET as u64,
                sync_bytes: SYNC_BYTES as u64,
                error: dev + errors[p] as u64,
                ibgda: dev + tables[p] as u64,
                flags: STATE_CHECKS | STATE_SELF_IBGDA,
                lkey,
                reserved: [0; 5],
            };
            // SAFETY: DeviceState is repr(C), 128 bytes of plain integers.
            write(states + 128 * p, unsafe {
                std::slice::from_raw_parts((&st as *const DeviceState).cast::<u8>(), 128)
            });
        }
        Shared {
            shm: Shm {
                map,
                dev,
                states,
                results,
            },
            pes,
            heaps,
            heap_bytes,
            errors,
            descs,
            _qps: qps,
            _hca: hca,
            _pds: pds,
        }
    }

    /// PE p's descriptor of its queue to PE q.
    fn desc(&self, p: usize, q: usize) -> &rshmem::softhca::ibgda_table::IbgdaQp {
        // SAFETY: descriptor q of PE p was written in new() (repr(C), 64-byte aligned: the
        // region is page-aligned and descriptors are 320 bytes); its counters are atomics.
        unsafe {
            &*self
                .host(
                    self.descs[p]
                        + q * std::mem::size_of::<rshmem::softhca::ibgda_table::IbgdaQp>(),
                )
                .cast::<rshmem::softhca::ibgda_table::IbgdaQp>()
        }
    }

    /// WQEs completed (and reaped by the producers) on PE p's queue to PE q.
    pub fn completed(&self, p: usize, q: usize) -> u64 {
        self.desc(p, q).completed()
    }

    /// WQEBBs the producers published on PE p's queue to PE q.
    pub fn published(&self, p: usize, q: usize) -> u64 {
        self.desc(p, q).ready()
    }

    /// Before a case: every PE's scratch range, result record and error record zeroed (as
    /// the GPU runner does); the sync scratch and the queues carry over, as on a GPU.
    pub fn reset(&self, scratch_bytes: usize) {
        for p in 0..self.pes {
            // SAFETY: inside the mapping; no emulated block runs between cases.
            unsafe {
                std::ptr::write_bytes(self.host(self.heaps[p] + SCRATCH_OFFSET), 0, scratch_bytes);
                std::ptr::write_bytes(self.host(self.errors[p]), 0, 64);
                std::ptr::write_bytes(self.host(self.shm.results + 64 * p), 0, 64);
            }
        }
    }
}
