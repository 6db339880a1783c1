//! Rust mirror of `device-kernels/include/rshmem/state.cuh`: the state struct a module's
//! `rshmemi_device_state` global holds, one peer-table entry, and the device error record.
//!
//! The layout is a contract with the header: sizes and field offsets are asserted here at
//! compile time and compared with what the host C compiler makes of the header in
//! `host/tests/gpu_layouts.rs`.

use std::mem::{offset_of, size_of};

/// `RSHMEM_STATE_MAGIC` ("rshs" little-endian).
pub const STATE_MAGIC: u32 = 0x7368_7372;
/// `RSHMEM_STATE_VERSION` (2: device teams in the sync scratch; 3: `rshmem_peer_t.flags`,
/// which a module built against older headers would ignore).
pub const STATE_VERSION: u32 = 3;
/// `RSHMEM_STATE_SYMBOL`: the `__constant__` global every device-API module carries.
pub const STATE_SYMBOL: &str = "rshmemi_device_state";
/// `RSHMEM_STATE_CHECKS`: validate PE and heap range on every device call.
pub const STATE_CHECKS: u32 = 0x1;
/// `RSHMEM_STATE_SELF_IBGDA`: atomics and signal updates to the own PE go through its
/// loopback IBGDA queue (GPU PEs over the proxy transport: the heap is host memory the soft
/// HCA updates with CPU atomics).
pub const STATE_SELF_IBGDA: u32 = 0x2;
/// `RSHMEM_STATE_HOST_HEAP`: the heap is host memory mapped into the GPU (GPU PEs over the
/// proxy transport): a GPU atomic on it is not atomic against the soft HCA's CPU stores.
pub const STATE_HOST_HEAP: u32 = 0x4;

/// `rshmem_transport_t`.
pub const TRANSPORT_NONE: u32 = 0;
pub const TRANSPORT_P2P: u32 = 1;
pub const TRANSPORT_IBGDA: u32 = 2;

/// `RSHMEM_DEVICE_ERR_*`.
pub const ERR_NONE: u32 = 0;
pub const ERR_UNBOUND: u32 = 1;
pub const ERR_BAD_PE: u32 = 2;
pub const ERR_OUT_OF_HEAP: u32 = 3;
pub const ERR_WAIT_TIMEOUT: u32 = 4;
pub const ERR_QUEUE: u32 = 5;
/// Invalid comparison / signal operator, or more PEs than the device sync scratch holds.
pub const ERR_BAD_ARG: u32 = 6;

/// `rshmem_peer_t.flags`: the P2P link to this peer has no native atomics (PCIe without
/// atomics between the GPUs): read-modify-write atomics and signal ADDs to it trap (BAD_PE).
pub const PEER_NO_P2P_ATOMICS: u32 = 0x1;

/// `rshmem_peer_t`: how this PE reaches one peer. 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevicePeer {
    pub heap_base: u64,
    pub transport: u32,
    pub qp: u32,
    pub raddr: u64,
    pub rkey: u32,
    /// `RSHMEM_PEER_*` bits ([`PEER_NO_P2P_ATOMICS`]).
    pub flags: u32,
}

/// `rshmem_device_error_t`: why a kernel trapped. 64 bytes, host-pinned and mapped.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceError {
    pub code: u32,
    pub pe: i32,
    pub addr: u64,
    pub expected: u64,
    pub observed: u64,
    pub cmp: u32,
    /// The reporting block's linear index in its grid (x fastest).
    pub block: u32,
    /// The reporting thread's linear index in its block (x fastest).
    pub thread: u32,
    pub reserved: [u32; 5],
}

/// `rshmem_device_state_t`: everything a kernel needs. 128 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceState {
    pub magic: u32,
    pub version: u32,
    pub my_pe: i32,
    pub n_pes: i32,
    pub heap_base: u64,
    pub heap_size: u64,
    pub peers: u64,
    pub timeout_ns: u64,
    pub sync_offset: u64,
    pub sync_bytes: u64,
    pub error: u64,
    pub ibgda: u64,
    pub flags: u32,
    pub lkey: u32,
    pub reserved: [u64; 5],
}

/// `RSHMEM_TEAM_SLOTS`: device team handles are team slots (`crate::heap::TEAM_SLOTS`).
pub const TEAM_SLOTS: u32 = 64;
/// `RSHMEM_TEAM_MAX_ROUNDS`: a device team barrier serves teams of up to 2^12 PEs.
pub const TEAM_MAX_ROUNDS: u32 = 12;
/// `RSHMEM_TEAM_INVALID`, `RSHMEM_TEAM_WORLD`, `RSHMEM_TEAM_SHARED` (types.cuh).
pub const TEAM_INVALID: i32 = -1;
pub const TEAM_WORLD: i32 = 0;
pub const TEAM_SHARED: i32 = 1;
/// Offset of team slot 0's area in the device sync scratch (`RSHMEMI_SYNC_TEAMS`), and the
/// bytes of one slot's area (`RSHMEMI_TEAM_AREA_BYTES`; rshmem/device/layout.cuh): the
/// [`DeviceTeamEntry`], the epoch, the dissemination round words. (layout.cuh is C++, so
/// the C oracle cannot print these; device-kernels/tests/host_logic_test.cpp pins the same
/// numbers, and the assert below the arrival array's 2944 PEs that it checks too.)
pub const SYNC_TEAMS: usize = 1024;
pub const TEAM_AREA_BYTES: usize = 128;

/// Offset in the sync scratch of team slot `slot`'s area (`rshmemi_team_area_offset`).
pub const fn team_area_offset(slot: usize) -> usize {
    SYNC_TEAMS + TEAM_AREA_BYTES * slot
}

/// `rshmem_team_entry_t`: a strided team as the device sees it. 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceTeamEntry {
    pub start: i32,
    pub stride: i32,
    /// 0: no team in this slot.
    pub size: i32,
    pub my_pe: i32,
}

impl DeviceTeamEntry {
    /// The entry of a team whose members are the world ranks `members` (in team order) on
    /// the member numbered `my_pe`; None unless they form `start, start + stride, ...`
    /// (the device's strided teams) with stride >= 1, or when the team is larger than a
    /// device team barrier serves.
    pub fn strided(members: &[u32], my_pe: usize) -> Option<DeviceTeamEntry> {
        let start = *members.first()?;
        let stride = members.get(1).map_or(Some(1), |&m| m.checked_sub(start))?;
        if stride == 0
            || members.len() > 1 << TEAM_MAX_ROUNDS
            || my_pe >= members.len()
            || members
                .iter()
                .enumerate()
                .any(|(i, &m)| m as u64 != start as u64 + stride as u64 * i as u64)
        {
            return None;
        }
        Some(DeviceTeamEntry {
            start: start as i32,
            stride: stride as i32,
            size: members.len() as i32,
            my_pe: my_pe as i32,
        })
    }

    /// The 16 bytes the device reads (little-endian, as every supported GPU host).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        for (i, v) in [self.start, self.stride, self.size, self.my_pe]
            .into_iter()
            .enumerate()
        {
            b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

const _: () = {
    assert!(size_of::<DeviceTeamEntry>() == 16);
    assert!(TEAM_SLOTS as usize == crate::heap::TEAM_SLOTS);
    assert!(team_area_offset(TEAM_SLOTS as usize) + 8 * 2944 == 32 << 10);
    assert!(size_of::<DevicePeer>() == 32);
    assert!(size_of::<DeviceError>() == 64);
    assert!(size_of::<DeviceState>() == 128);
    assert!(offset_of!(DeviceState, heap_base) == 16);
    assert!(offset_of!(DeviceState, peers) == 32);
    assert!(offset_of!(DeviceState, sync_offset) == 48);
    assert!(offset_of!(DeviceState, error) == 64);
    assert!(offset_of!(DeviceState, ibgda) == 72);
    assert!(offset_of!(DeviceState, flags) == 80);
    assert!(offset_of!(DevicePeer, raddr) == 16);
};

impl DeviceError {
    /// This record as the error of PE `pe`'s kernel `kernel`.
    pub fn fault(&self, pe: usize, kernel: &str) -> crate::Error {
        crate::Error::DeviceFault {
            pe,
            kernel: kernel.to_string(),
            code: self.code,
            what: self.what(),
            target_pe: self.pe,
            addr: self.addr,
            wait: self.wait_text(),
            block: self.block,
            thread: self.thread,
        }
    }

    /// What `code` means, in words.
    pub fn what(&self) -> &'static str {
        match self.code {
            ERR_NONE => "no error recorded",
            ERR_UNBOUND => "module not bound to a PE (GpuPe::bind_module was not called on it)",
            ERR_BAD_PE => "invalid PE (out of range or unreachable from the device)",
            ERR_OUT_OF_HEAP => "address range outside the symmetric heap",
            ERR_WAIT_TIMEOUT => "wait timed out (RSHMEM_TIMEOUT_MS)",
            ERR_QUEUE => "IBGDA queue error",
            ERR_BAD_ARG => {
                "invalid argument (comparison, signal op, team, PE count or a misaligned word)"
            }
            _ => "unknown device error code",
        }
    }

    /// ", waited for value GE 5, last seen 3" for waits; empty otherwise.
    pub fn wait_text(&self) -> String {
        if self.code != ERR_WAIT_TIMEOUT {
            return String::new();
        }
        // rshmem_cmp_t (types.cuh), the order of crate::types::Cmp.
        let cmp = match self.cmp {
            0 => "EQ".to_string(),
            1 => "NE".to_string(),
            2 => "GT".to_string(),
            3 => "GE".to_string(),
            4 => "LT".to_string(),
            5 => "LE".to_string(),
            c => format!("cmp#{c}"),
        };
        format!(
            ", waited for value {cmp} {}, last seen {}",
            self.expected, self.observed
        )
    }
}

/// Every field of the three structs as (C name, Rust offset or size), for the comparison
/// with the C compiler (`host/tests/gpu_layouts.rs`). Keys: `sizeof.<type>` and
/// `<type>.<field>`.
pub fn layout_table() -> Vec<(&'static str, usize)> {
    vec![
        ("sizeof.rshmem_team_entry_t", size_of::<DeviceTeamEntry>()),
        (
            "rshmem_team_entry_t.start",
            offset_of!(DeviceTeamEntry, start),
        ),
        (
            "rshmem_team_entry_t.stride",
            offset_of!(DeviceTeamEntry, stride),
        ),
        (
            "rshmem_team_entry_t.size",
            offset_of!(DeviceTeamEntry, size),
        ),
        (
            "rshmem_team_entry_t.my_pe",
            offset_of!(DeviceTeamEntry, my_pe),
        ),
        ("sizeof.rshmem_peer_t", size_of::<DevicePeer>()),
        ("rshmem_peer_t.heap_base", offset_of!(DevicePeer, heap_base)),
        ("rshmem_peer_t.transport", offset_of!(DevicePeer, transport)),
        ("rshmem_peer_t.qp", offset_of!(DevicePeer, qp)),
        ("rshmem_peer_t.raddr", offset_of!(DevicePeer, raddr)),
        ("rshmem_peer_t.rkey", offset_of!(DevicePeer, rkey)),
        ("rshmem_peer_t.flags", offset_of!(DevicePeer, flags)),
        ("sizeof.rshmem_device_error_t", size_of::<DeviceError>()),
        ("rshmem_device_error_t.code", offset_of!(DeviceError, code)),
        ("rshmem_device_error_t.pe", offset_of!(DeviceError, pe)),
        ("rshmem_device_error_t.addr", offset_of!(DeviceError, addr)),
        (
            "rshmem_device_error_t.expected",
            offset_of!(DeviceError, expected),
        ),
        (
            "rshmem_device_error_t.observed",
            offset_of!(DeviceError, observed),
        ),
        ("rshmem_device_error_t.cmp", offset_of!(DeviceError, cmp)),
        (
            "rshmem_device_error_t.block",
            offset_of!(DeviceError, block),
        ),
        (
            "rshmem_device_error_t.thread",
            offset_of!(DeviceError, thread),
        ),
        (
            "rshmem_device_error_t.reserved",
            offset_of!(DeviceError, reserved),
        ),
        ("sizeof.rshmem_device_state_t", size_of::<DeviceState>()),
        (
            "rshmem_device_state_t.magic",
            offset_of!(DeviceState, magic),
        ),
        (
            "rshmem_device_state_t.version",
            offset_of!(DeviceState, version),
        ),
        (
            "rshmem_device_state_t.my_pe",
            offset_of!(DeviceState, my_pe),
        ),
        (
            "rshmem_device_state_t.n_pes",
            offset_of!(DeviceState, n_pes),
        ),
        (
            "rshmem_device_state_t.heap_base",
            offset_of!(DeviceState, heap_base),
        ),
        (
            "rshmem_device_state_t.heap_size",
            offset_of!(DeviceState, heap_size),
        ),
        (
            "rshmem_device_state_t.peers",
            offset_of!(DeviceState, peers),
        ),
        (
            "rshmem_device_state_t.timeout_ns",
            offset_of!(DeviceState, timeout_ns),
        ),
        (
            "rshmem_device_state_t.sync_offset",
            offset_of!(DeviceState, sync_offset),
        ),
        (
            "rshmem_device_state_t.sync_bytes",
            offset_of!(DeviceState, sync_bytes),
        ),
        (
            "rshmem_device_state_t.error",
            offset_of!(DeviceState, error),
        ),
        (
            "rshmem_device_state_t.ibgda",
            offset_of!(DeviceState, ibgda),
        ),
        (
            "rshmem_device_state_t.flags",
            offset_of!(DeviceState, flags),
        ),
        ("rshmem_device_state_t.lkey", offset_of!(DeviceState, lkey)),
        (
            "rshmem_device_state_t.reserved",
            offset_of!(DeviceState, reserved),
        ),
    ]
}

/// The constants as (C macro name, value), compared with the header by the same test.
pub fn constant_table() -> Vec<(&'static str, u64)> {
    vec![
        ("RSHMEM_STATE_MAGIC", STATE_MAGIC as u64),
        ("RSHMEM_STATE_VERSION", STATE_VERSION as u64),
        ("RSHMEM_STATE_CHECKS", STATE_CHECKS as u64),
        ("RSHMEM_STATE_SELF_IBGDA", STATE_SELF_IBGDA as u64),
        ("RSHMEM_STATE_HOST_HEAP", STATE_HOST_HEAP as u64),
        ("RSHMEM_PEER_NO_P2P_ATOMICS", PEER_NO_P2P_ATOMICS as u64),
        ("RSHMEM_TRANSPORT_NONE", TRANSPORT_NONE as u64),
        ("RSHMEM_TRANSPORT_P2P", TRANSPORT_P2P as u64),
        ("RSHMEM_TRANSPORT_IBGDA", TRANSPORT_IBGDA as u64),
        ("RSHMEM_DEVICE_ERR_NONE", ERR_NONE as u64),
        ("RSHMEM_DEVICE_ERR_UNBOUND", ERR_UNBOUND as u64),
        ("RSHMEM_DEVICE_ERR_BAD_PE", ERR_BAD_PE as u64),
        ("RSHMEM_DEVICE_ERR_OUT_OF_HEAP", ERR_OUT_OF_HEAP as u64),
        ("RSHMEM_DEVICE_ERR_WAIT_TIMEOUT", ERR_WAIT_TIMEOUT as u64),
        ("RSHMEM_DEVICE_ERR_QUEUE", ERR_QUEUE as u64),
        ("RSHMEM_DEVICE_ERR_BAD_ARG", ERR_BAD_ARG as u64),
        ("RSHMEM_TEAM_SLOTS", TEAM_SLOTS as u64),
        ("RSHMEM_TEAM_MAX_ROUNDS", TEAM_MAX_ROUNDS as u64),
        ("RSHMEM_TEAM_INVALID", TEAM_INVALID as i64 as u64),
        ("RSHMEM_TEAM_WORLD", TEAM_WORLD as u64),
        ("RSHMEM_TEAM_SHARED", TEAM_SHARED as u64),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_record_texts() {
        let e = DeviceError {
            code: ERR_WAIT_TIMEOUT,
            pe: 1,
            addr: 0x7f00_0001_0000,
            expected: 5,
            observed: 3,
            cmp: 3, // GE in rshmem's order EQ NE GT GE LT LE
            ..Default::default()
        };
        assert_eq!(e.what(), "wait timed out (RSHMEM_TIMEOUT_MS)");
        assert_eq!(e.wait_text(), ", waited for value GE 5, last seen 3");
        let b = DeviceError {
            code: ERR_BAD_PE,
            ..e
        };
        assert_eq!(b.wait_text(), "");
        assert!(b.what().starts_with("invalid PE"));
    }

    #[test]
    fn device_faults_read_as_one_sentence() {
        let e = DeviceError {
            code: ERR_WAIT_TIMEOUT,
            pe: 3,
            addr: 0x7f00_0001_0040,
            expected: 1,
            observed: 0,
            cmp: 0,
            block: 2,
            thread: 31,
            ..Default::default()
        };
        let err = e.fault(1, "rshmem_test_wait");
        assert_eq!(
            err.to_string(),
            "PE 1: kernel rshmem_test_wait trapped: wait timed out (RSHMEM_TIMEOUT_MS) (device error 4, \
             target PE 3, address 0x7f0000010040, waited for value EQ 1, last seen 0; block 2, thread 31); \
             the CUDA context is lost for every PE of this process"
        );
    }

    #[test]
    fn team_entries_are_strided_teams_only() {
        let e = DeviceTeamEntry::strided(&[1, 3, 5, 7], 2).unwrap();
        assert_eq!(
            e,
            DeviceTeamEntry {
                start: 1,
                stride: 2,
                size: 4,
                my_pe: 2
            }
        );
        assert_eq!(
            e.to_bytes(),
            [1, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0]
        );
        assert_eq!(
            DeviceTeamEntry::strided(&[6], 0),
            Some(DeviceTeamEntry {
                start: 6,
                stride: 1,
                size: 1,
                my_pe: 0
            })
        );
        assert_eq!(DeviceTeamEntry::strided(&[0, 1, 3], 0), None); // not strided
        assert_eq!(DeviceTeamEntry::strided(&[4, 2, 0], 0), None); // descending
        assert_eq!(DeviceTeamEntry::strided(&[2, 2], 0), None); // stride 0
        assert_eq!(DeviceTeamEntry::strided(&[], 0), None);
        assert_eq!(DeviceTeamEntry::strided(&[0, 1], 2), None); // not a member
        let big: Vec<u32> = (0..4097).collect();
        assert_eq!(DeviceTeamEntry::strided(&big, 0), None); // over 2^12 members
        assert!(DeviceTeamEntry::strided(&big[..4096], 4095).is_some());
    }

    #[test]
    fn magic_is_rshs_little_endian() {
        assert_eq!(&STATE_MAGIC.to_le_bytes(), b"rshs");
    }
}
