//! How the engine moves bytes: the [`Backend`] trait and [`LocalBackend`].
//!
//! The engine parses a WQE, checks its local buffers against the local protection domain
//! (lkeys), and hands the backend an [`Op`] with resolved local buffers and the *remote*
//! address and rkey as the WQE named them. The backend plays the responder: it checks the
//! rkey, bounds, rights and alignment against the peer's registrations and moves the bytes.
//!
//! # Contract (`Backend`)
//! - `execute` must not block. It returns `Some(status)` when the operation is complete
//!   (a synchronous backend: [`LocalBackend`]) or `None` when it will report completion
//!   later through `poll` with the same `token`. Completions may come in any order; the
//!   engine retires CQEs in WQE order and honours FENCE by draining before a fenced WQE.
//! - Inline data ([`Gather::Inline`]) lives in the send queue and is valid only during
//!   `execute`: an asynchronous backend copies it (as `fi_inject` does). Buffers given by
//!   pointer ([`LocalBuf`]) stay valid until the operation is reported complete.
//! - A failure is a [`Syndrome`], the one a ConnectX would report: REMOTE_ACCESS (0x13)
//!   for an unknown rkey, a range outside the region or a missing right, REMOTE_INVAL_REQ
//!   (0x12) for a misaligned atomic, and so on.

use super::mr::{Access, MrSnapshot, MrTable};
use crate::mlx5::Syndrome;
use crate::rma::copy_last_word_release;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A local buffer resolved through an lkey: valid for `len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalBuf {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a LocalBuf is an address and a length resolved through a registered region;
// moving it to another thread (the engine core moves between the engine thread and
// assisting producers under a lock) does not change who may access the memory.
unsafe impl Send for LocalBuf {}

/// The source of a write.
#[derive(Clone, Copy, Debug)]
pub enum Gather<'a> {
    /// Bytes carried in the WQE.
    Inline(&'a [u8]),
    /// Local buffers, concatenated in order.
    Bufs(&'a [LocalBuf]),
}

/// An atomic operation; operands in host order (decoded from the WQE's big-endian fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// 8 B: `if old == compare { new = swap }`.
    Cs { compare: u64, swap: u64 },
    /// 8 B: `new = old + add` (wrapping).
    Fa { add: u64 },
    /// 4 or 8 B: `if (old & compare_mask) == (compare & compare_mask)
    /// { new = (old & !swap_mask) | (swap & swap_mask) }`.
    MaskedCs {
        size: u8,
        swap: u64,
        compare: u64,
        swap_mask: u64,
        compare_mask: u64,
    },
    /// 4 or 8 B: fields end at the set bits of `boundary` (a set bit is the most
    /// significant bit of its field); each field adds independently, wrapping, with no
    /// carry into the next field: `new = ((old & !b) + (add & !b)) ^ ((old ^ add) & b)`.
    MaskedFa { size: u8, add: u64, boundary: u64 },
}

impl AtomicOp {
    /// Operand size in bytes.
    pub const fn size(&self) -> u8 {
        match self {
            AtomicOp::Cs { .. } | AtomicOp::Fa { .. } => 8,
            AtomicOp::MaskedCs { size, .. } | AtomicOp::MaskedFa { size, .. } => *size,
        }
    }

    /// The value the target word takes given its old value (truncated to the size).
    pub const fn apply(&self, old: u64) -> u64 {
        let m = if self.size() == 4 {
            0xffff_ffff
        } else {
            u64::MAX
        };
        let new = match *self {
            AtomicOp::Cs { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            AtomicOp::Fa { add } => old.wrapping_add(add),
            AtomicOp::MaskedCs {
                swap,
                compare,
                swap_mask,
                compare_mask,
                ..
            } => {
                if old & compare_mask == compare & compare_mask {
                    (old & !swap_mask) | (swap & swap_mask)
                } else {
                    old
                }
            }
            AtomicOp::MaskedFa { add, boundary, .. } => {
                ((old & !boundary).wrapping_add(add & !boundary)) ^ ((old ^ add) & boundary)
            }
        };
        new & m
    }
}

/// What a backend is asked to do.
#[derive(Clone, Copy, Debug)]
pub enum Op<'a> {
    /// RDMA WRITE (and WRITE_IMM, whose immediate the engine drops: there is no receive
    /// queue to consume it — see docs/soft-hca.md).
    Write {
        raddr: u64,
        rkey: u32,
        len: u64,
        src: Gather<'a>,
    },
    /// RDMA READ into `dst` (scattered in order).
    Read {
        raddr: u64,
        rkey: u32,
        len: u64,
        dst: &'a [LocalBuf],
    },
    /// An atomic; the old value is written to `result`, `op.size()` bytes, as a ConnectX
    /// writes it: an 8-byte one in host byte order, a 4-byte one big-endian (see
    /// [`fetched_bytes`]).
    Atomic {
        raddr: u64,
        rkey: u32,
        op: AtomicOp,
        result: LocalBuf,
    },
}

/// A transport the engine executes operations over. See the module documentation for the
/// contract.
pub trait Backend: Send + 'static {
    /// Per-QP description of the remote side (the LocalBackend: the peer's registrations
    /// as mapped here; a fabric backend: the peer's address).
    type Peer: Send + Sync + 'static;
    /// Per-QP state the engine keeps for the backend (the LocalBackend: a snapshot of the
    /// peer's regions, so lookups take no lock).
    type Cache: Default + Send + 'static;

    /// Executes or starts `op`. `Some` when complete, `None` when `poll` will report it.
    fn execute(
        &mut self,
        peer: &Self::Peer,
        cache: &mut Self::Cache,
        token: u64,
        op: &Op<'_>,
    ) -> Option<Result<(), Syndrome>>;

    /// Reports operations that completed since the last call (none for a synchronous
    /// backend).
    fn poll(&mut self, _done: &mut dyn FnMut(u64, Result<(), Syndrome>)) {}

    /// Longest an idle engine thread sleeps between rounds (a producer's doorbell wakes
    /// it earlier). A backend whose provider progresses *incoming* operations only while
    /// polled (libfabric tcp) keeps this short.
    fn idle_wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(2)
    }

    /// Whether threads waiting on this backend's queues drive the engine themselves while
    /// the engine thread parks (the progress handover of [`super::Waker`]): true for
    /// backends whose every round polls a provider (short [`Backend::idle_wait`]), false
    /// for the LocalBackend, whose engine thread executes WQEs in parallel with the PEs.
    fn callers_drive(&self) -> bool {
        self.idle_wait() < std::time::Duration::from_millis(1)
    }

    /// Whether the engine thread parks while a thread drives ([`super::Waker`]'s progress
    /// handover; needs [`Backend::callers_drive`]). False here; the FabricBackend says yes
    /// unless `RSHMEM_ENGINE_HANDOVER=0` (docs/multinode.md).
    fn handover(&self) -> bool {
        false
    }

    /// Told before every round whether some thread waits for a completion of this
    /// engine's QPs, or the engine holds back WQEs (a FENCE, a batch limit): a backend
    /// that defers work until a completion is needed (the FabricBackend's lazy write
    /// confirmation) must do it while this is true.
    fn set_urgent(&mut self, _urgent: bool) {}
}

/// The remote side of a queue pair served by [`LocalBackend`]: the peer's memory regions,
/// mapped in this process.
#[derive(Debug, Clone)]
pub struct LocalPeer {
    table: Arc<MrTable>,
}

impl LocalPeer {
    pub fn new(table: Arc<MrTable>) -> LocalPeer {
        LocalPeer { table }
    }
}

/// Executes operations against memory mapped in this process (peers' heaps on this node,
/// or this PE's own): memcpy for data, CPU atomics for atomics. Synchronous.
///
/// Semantics:
/// - The target of an atomic is a native-endian word updated with a CPU atomic (AcqRel),
///   so PEs' own atomics on the same word stay coherent with the engine's. The old value
///   is written to the local result buffer as a ConnectX writes it ([`fetched_bytes`]).
/// - WRITE: the bytes are copied in order; when the last 8 destination bytes are 8-aligned
///   (or the write is 4 aligned bytes) they are stored last with a Release atomic store —
///   the p2p transport's property that a PE polling the last word of a put sees all of
///   it, and what makes an aligned 8-byte WRITE of a signal atomic.
/// - READ of 4 or 8 naturally aligned bytes is one Acquire atomic load; longer reads are
///   plain copies followed by an Acquire fence.
#[derive(Debug, Default)]
pub struct LocalBackend;

impl LocalBackend {
    fn resolve(
        peer: &LocalPeer,
        s: &mut MrSnapshot,
        rkey: u32,
        raddr: u64,
        len: u64,
        need: Access,
    ) -> Result<*mut u8, Syndrome> {
        s.refresh(&peer.table);
        s.find(rkey)
            .and_then(|r| r.resolve(raddr, len, need))
            .ok_or(Syndrome::RemoteAccess)
    }
}

impl Backend for LocalBackend {
    type Peer = LocalPeer;
    type Cache = MrSnapshot;

    #[inline]
    fn execute(
        &mut self,
        peer: &LocalPeer,
        cache: &mut MrSnapshot,
        _token: u64,
        op: &Op<'_>,
    ) -> Option<Result<(), Syndrome>> {
        Some(match *op {
            Op::Write {
                raddr,
                rkey,
                len,
                src,
            } => {
                if len == 0 {
                    return Some(Ok(()));
                }
                Self::resolve(peer, cache, rkey, raddr, len, Access::REMOTE_WRITE).map(|dst| {
                    // SAFETY: dst..dst+len lies inside a registered region (resolve), whose
                    // memory stays valid while QPs using it are attached (MrTable::register
                    // contract); sources are the WQE's inline bytes or buffers resolved
                    // through lkeys, whose lengths sum to `len` (the engine checked).
                    unsafe {
                        match src {
                            Gather::Inline(b) => copy_last_word_release(dst, b.as_ptr(), b.len()),
                            Gather::Bufs(bufs) => {
                                let mut off = 0usize;
                                let last = bufs.len().saturating_sub(1);
                                for (i, b) in bufs.iter().enumerate() {
                                    if i == last {
                                        copy_last_word_release(dst.add(off), b.ptr, b.len);
                                    } else {
                                        crate::copy::copy_bytes(b.ptr, dst.add(off), b.len);
                                    }
                                    off += b.len;
                                }
                            }
                        }
                    }
                })
            }
            Op::Read {
                raddr,
                rkey,
                len,
                dst,
            } => {
                if len == 0 {
                    return Some(Ok(()));
                }
                Self::resolve(peer, cache, rkey, raddr, len, Access::REMOTE_READ).map(|src| {
                    // SAFETY: src..src+len is inside a registered remote region; each dst
                    // buffer was resolved through an lkey with LOCAL_WRITE; the lengths sum
                    // to `len` (engine).
                    unsafe {
                        if dst.len() == 1
                            && (len == 8 || len == 4)
                            && src as usize % len as usize == 0
                        {
                            // One atomic load, so a word updated by atomics is never torn.
                            if len == 8 {
                                let v = AtomicU64::from_ptr(src.cast()).load(Ordering::Acquire);
                                std::ptr::copy_nonoverlapping(
                                    v.to_ne_bytes().as_ptr(),
                                    dst[0].ptr,
                                    8,
                                );
                            } else {
                                let v = AtomicU32::from_ptr(src.cast()).load(Ordering::Acquire);
                                std::ptr::copy_nonoverlapping(
                                    v.to_ne_bytes().as_ptr(),
                                    dst[0].ptr,
                                    4,
                                );
                            }
                        } else {
                            let mut off = 0usize;
                            for b in dst {
                                crate::copy::copy_bytes(src.add(off), b.ptr, b.len);
                                off += b.len;
                            }
                            // Later reads of the result are not hoisted above the copy.
                            fence(Ordering::Acquire);
                        }
                    }
                })
            }
            Op::Atomic {
                raddr,
                rkey,
                op,
                result,
            } => {
                let size = op.size() as u64;
                Self::resolve(peer, cache, rkey, raddr, size, Access::REMOTE_ATOMIC).and_then(|t| {
                    if t as usize % size as usize != 0 {
                        return Err(Syndrome::RemoteInvalReq);
                    }
                    // SAFETY: t is an in-bounds, naturally aligned word of a registered
                    // region; every access rshmem makes to such words is atomic.
                    let old = unsafe { atomic_rmw(t, op) };
                    let n = (result.len).min(size as usize);
                    let bytes = fetched_bytes(old, size as usize);
                    // SAFETY: result was resolved through an lkey with LOCAL_WRITE for
                    // result.len bytes.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), result.ptr, n) };
                    Ok(())
                })
            }
        })
    }
}

/// Applies `op` to the word at `t` atomically (AcqRel) and returns the old value.
///
/// # Safety
/// `t` must be valid, aligned to `op.size()`, and accessed only atomically by others.
unsafe fn atomic_rmw(t: *mut u8, op: AtomicOp) -> u64 {
    // SAFETY (whole body): per the contract. AcqRel: the engine's earlier writes on this
    // QP (a put before a fenced signal) are visible to whoever acquires the new value, and
    // the old value read is coherent with every other atomic on the word.
    unsafe {
        match op {
            AtomicOp::Fa { add } => AtomicU64::from_ptr(t.cast()).fetch_add(add, Ordering::AcqRel),
            AtomicOp::Cs { compare, swap } => {
                match AtomicU64::from_ptr(t.cast()).compare_exchange(
                    compare,
                    swap,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(v) | Err(v) => v,
                }
            }
            _ if op.size() == 4 => {
                let w = AtomicU32::from_ptr(t.cast());
                match w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                    Some(op.apply(old as u64) as u32)
                }) {
                    Ok(v) | Err(v) => v as u64,
                }
            }
            _ => {
                let w = AtomicU64::from_ptr(t.cast());
                match w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                    Some(op.apply(old))
                }) {
                    Ok(v) | Err(v) => v,
                }
            }
        }
    }
}

/// The bytes a ConnectX writes to an atomic's local result buffer for the old value `old`
/// of a `size`-byte atomic (in the first `size` bytes): 8-byte results in host byte order,
/// 4-byte results big-endian. The mlx5 driver puts the NIC in host-endianness mode for
/// 8-byte atomic responses wherever it can, and reports atomics to verbs only then
/// (`IBV_ATOMIC_HCA`); 4-byte (masked) results stay big-endian. NVSHMEM's IBGDA reads
/// them the same way (byte-swaps 4-byte results only). Before 2026-12-06 rshmem wrote and
/// read both big-endian, which a real NIC would have returned byte-swapped.
pub fn fetched_bytes(old: u64, size: usize) -> [u8; 8] {
    if size == 8 {
        old.to_ne_bytes()
    } else {
        let mut a = [0u8; 8];
        a[..4].copy_from_slice(&(old as u32).to_be_bytes());
        a
    }
}

/// The old value from an atomic's result bytes, as [`fetched_bytes`] lays them out.
pub fn fetched_value(b: [u8; 8], size: usize) -> u64 {
    if size == 8 {
        u64::from_ne_bytes(b)
    } else {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64
    }
}
