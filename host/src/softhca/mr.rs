//! Memory regions: what a key (lkey or rkey) grants — a byte range and access rights —
//! and the table the engine checks every local and remote address against.
//!
//! A [`MrTable`] is one protection domain: a PE's own registrations (its lkeys) or, on the
//! remote side of a queue pair, the peer's registrations as reachable from this process
//! (its rkeys). Lookups are lock-free for the engine: it keeps a snapshot ([`MrSnapshot`])
//! and refreshes it only when the table's generation changes.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Access rights of a memory region (the `IBV_ACCESS_*` flags rshmem uses). Local read is
/// always granted, as on a ConnectX.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u8);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Everything (a PE's symmetric heap).
    pub const ALL: Access = Access(15);
    pub const NONE: Access = Access(0);

    pub const fn contains(self, o: Access) -> bool {
        self.0 & o.0 == o.0
    }
    pub const fn union(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// One registration: `len` bytes at the address `addr` that WQEs name, reachable in this
/// process at `host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    pub key: u32,
    /// The address WQEs use for the region's first byte (the owner's virtual address).
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    /// Where the first byte is mapped in this process (equals `addr` for the owner).
    pub host: *mut u8,
}

// SAFETY: a MemoryRegion is a description (key, bounds, a pointer value); whoever
// registers it promises the memory stays valid (see MrTable::register), and the engine
// accesses it only within bounds.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// The host address of `[addr, addr+len)` if the range lies inside the region and the
    /// region grants `need`.
    pub fn resolve(&self, addr: u64, len: u64, need: Access) -> Option<*mut u8> {
        let off = addr.checked_sub(self.addr)?;
        let end = off.checked_add(len)?;
        if end > self.len || !self.access.contains(need) {
            return None;
        }
        // wrapping_add: off <= self.len, so the pointer stays inside (or one past) the
        // registered range; no dereference happens here.
        Some(self.host.wrapping_add(off as usize))
    }
}

/// The regions of one protection domain.
#[derive(Debug, Default)]
pub struct MrTable {
    regions: RwLock<Arc<Vec<MemoryRegion>>>,
    generation: AtomicU64,
}

/// A consistent copy of a table's regions (what the engine looks keys up in).
#[derive(Clone, Debug, Default)]
pub struct MrSnapshot {
    generation: u64,
    regions: Arc<Vec<MemoryRegion>>,
}

impl MrSnapshot {
    /// The region of `key`.
    pub fn find(&self, key: u32) -> Option<&MemoryRegion> {
        self.regions.iter().find(|r| r.key == key)
    }
    /// Refreshes from `t` when it changed since this snapshot was taken.
    pub fn refresh(&mut self, t: &MrTable) {
        // Acquire: pairs with the Release in register/deregister, so a new generation
        // comes with the regions written before it.
        if t.generation.load(Ordering::Acquire) != self.generation {
            *self = t.snapshot();
        }
    }
}

/// A process-wide key counter: keys are unique in the process, like a NIC's.
static NEXT_KEY: AtomicU32 = AtomicU32::new(0x100);

impl MrTable {
    pub fn new() -> MrTable {
        MrTable::default()
    }

    /// Registers `len` bytes at `host`, named `addr` in WQEs, with `access`; returns the
    /// key.
    ///
    /// # Safety
    /// `host..host+len` must stay valid for reads (and for writes when `access` grants any
    /// write) until the region is deregistered *and* every queue pair that uses this table
    /// has been detached from its engine.
    pub unsafe fn register(&self, host: *mut u8, addr: u64, len: u64, access: Access) -> u32 {
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        let mut g = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let mut v = (**g).clone();
        v.push(MemoryRegion {
            key,
            addr,
            len,
            access,
            host,
        });
        *g = Arc::new(v);
        // Release: a snapshot that sees the new generation sees the new list.
        self.generation.fetch_add(1, Ordering::Release);
        key
    }

    /// Records a region registered elsewhere under `key` (a peer's heap as mapped in this
    /// process, with the key the peer gave it).
    ///
    /// # Safety
    /// As [`MrTable::register`].
    pub unsafe fn register_key(
        &self,
        key: u32,
        host: *mut u8,
        addr: u64,
        len: u64,
        access: Access,
    ) {
        let mut g = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = g.iter().copied().filter(|r| r.key != key).collect();
        v.push(MemoryRegion {
            key,
            addr,
            len,
            access,
            host,
        });
        *g = Arc::new(v);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Removes the region of `key`; false if there was none.
    pub fn deregister(&self, key: u32) -> bool {
        let mut g = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let before = g.len();
        let v: Vec<_> = g.iter().copied().filter(|r| r.key != key).collect();
        let found = v.len() != before;
        *g = Arc::new(v);
        self.generation.fetch_add(1, Ordering::Release);
        found
    }

    /// A copy of the current regions.
    pub fn snapshot(&self) -> MrSnapshot {
        let g = self.regions.read().unwrap_or_else(|e| e.into_inner());
        MrSnapshot {
            generation: self.generation.load(Ordering::Acquire),
            regions: g.clone(),
        }
    }

    /// The region of `key` (a copy).
    pub fn find(&self, key: u32) -> Option<MemoryRegion> {
        self.snapshot().find(key).copied()
    }
}
