//! The GPU symmetric heap: one CUDA VMM allocation per PE, exported as a POSIX file
//! descriptor and mapped by every PE of the node (docs/gpu-design.md, "Heap layout").
//!
//! Creation: `cuMemGetAllocationGranularity` (minimum granularity of a pinned device
//! allocation with a POSIX-fd handle), the size rounded up to it; `cuMemCreate` (with
//! `gpuDirectRDMACapable` when the device reports
//! `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`); `cuMemAddressReserve`;
//! `cuMemMap`; `cuMemSetAccess` (read-write for the PE's device). Sharing:
//! `cuMemExportToShareableHandle` gives an fd, [`super::fdpass`] passes it to the node's
//! other PEs, which `cuMemImportFromShareableHandle` it and map it the same way in their
//! context. PEs of one process take each other's allocation handles with
//! `cuMemRetainAllocationHandle` instead (no fd) and map them the same way (a second
//! mapping of the same memory is allowed).
//!
//! Release: a [`VmmMapping`] unmaps, frees its address range and releases its handle when
//! dropped. The physical memory goes away when the last handle anywhere is released; when
//! a process dies, the driver releases its handles and mappings, so a crash leaks nothing
//! (the fds are plain process fds, closed by the kernel).
//!
//! Layout (the same as CPU heaps): `[0, 32 KiB)` team psync (host barriers), `[32 KiB,
//! 64 KiB)` device sync scratch (zeroed at creation), user allocations from 64 KiB.

use super::driver::{ck, driver, settle_sync_copies};
use crate::error::Result;
use crate::heap::{PSYNC_WORDS, RESERVED_BYTES, TEAM_SLOTS};
use cudarc::driver::sys;
use std::os::fd::{FromRawFd, OwnedFd};

/// Heap offset of the device sync scratch (`state.sync_offset`).
pub const SYNC_OFFSET: usize = 32 << 10;
/// Its size (`state.sync_bytes`).
pub const SYNC_BYTES: usize = 32 << 10;

const _: () = assert!(TEAM_SLOTS * PSYNC_WORDS * 8 <= SYNC_OFFSET);
const _: () = assert!(SYNC_OFFSET + SYNC_BYTES == RESERVED_BYTES);

fn prop(ordinal: i32, rdma: bool) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: rdma as u8,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The minimum granularity of a heap allocation on device `ordinal`.
pub fn granularity(ordinal: i32) -> Result<usize> {
    driver()?;
    let p = prop(ordinal, false);
    let mut g = 0usize;
    // SAFETY: valid out-pointer and property struct.
    let rc = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    ck(rc, "cuMemGetAllocationGranularity", || {
        format!("sizing a heap on GPU {ordinal}")
    })?;
    Ok(g)
}

/// Whether device `ordinal` really exports a heap allocation as a POSIX fd (what GPU PEs in
/// different processes of a node need): creates a minimum-granularity allocation in the
/// device's primary context, exports it and frees both. The device attribute can say yes
/// where the export still fails (a sandbox such as gVisor's nvproxy forwards no export):
/// `rshmem doctor` tries it.
pub fn probe_fd_export(ordinal: i32) -> Result<()> {
    let ctx = super::module::Ctx::retain(ordinal)?;
    ctx.enter()?;
    let g = granularity(ordinal)?;
    // The fd and the allocation are closed and freed as they drop, the allocation before
    // `ctx` (a temporary in the tail expression would outlive it).
    let m = VmmMapping::create(ordinal, g, false, false)?;
    let r = m.export().map(drop);
    drop(m);
    r
}

/// One mapping of a heap allocation (this PE's own, or a peer's imported one) in the
/// current context, readable and writable by device `ordinal`.
#[derive(Debug)]
pub struct VmmMapping {
    handle: sys::CUmemGenericAllocationHandle,
    va: sys::CUdeviceptr,
    size: usize,
    mapped: bool,
    reserved: bool,
}

// SAFETY: the handle and addresses are plain integers valid in the (process-wide) context;
// CUDA driver calls are thread-safe.
unsafe impl Send for VmmMapping {}
// SAFETY: as above; &VmmMapping only reads the integers.
unsafe impl Sync for VmmMapping {}

impl VmmMapping {
    /// Creates this PE's heap of `size` bytes (a multiple of the granularity) on device
    /// `ordinal`, maps it and zeroes the runtime region. The caller's context is current.
    ///
    /// `rdma`: ask for a GPUDirect-RDMA-capable allocation. `require_rdma`: fail rather
    /// than fall back to a plain one when that is refused (a NIC must register the heap:
    /// `RSHMEM_TRANSPORT=ibgda`).
    pub fn create(ordinal: i32, size: usize, rdma: bool, require_rdma: bool) -> Result<VmmMapping> {
        driver()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct; flags must be 0.
        let mut rc = unsafe { sys::cuMemCreate(&mut handle, size, &prop(ordinal, rdma), 0) };
        if rdma && require_rdma {
            ck(rc, "cuMemCreate", || {
                format!(
                    "allocating a {size}-byte GPUDirect-RDMA-capable heap on GPU {ordinal} \
                     (RSHMEM_TRANSPORT=ibgda registers it with the NIC); lower \
                     RSHMEM_SYMMETRIC_SIZE if the GPU is full, or use RSHMEM_TRANSPORT=proxy"
                )
            })?;
        } else if rdma
            && matches!(
                rc,
                sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
                    | sys::CUresult::CUDA_ERROR_INVALID_VALUE
                    | sys::CUresult::CUDA_ERROR_NOT_PERMITTED
            )
        {
            // The device reports GPUDirect RDMA with VMM, but a virtual machine (or a
            // driver without peer memory) may still refuse the flag. Only the NIC path
            // (RSHMEM_TRANSPORT=ibgda, which requires it) needs it: keep going without,
            // and say so. Other failures (out of memory above all) are not about the flag:
            // reported below as they are, not retried.
            eprintln!(
                "rshmem: GPU {ordinal}: an RDMA-capable heap was refused ({}); \
                 allocating it without gpuDirectRDMACapable",
                super::driver::result_name(rc)
            );
            // SAFETY: as above.
            rc = unsafe { sys::cuMemCreate(&mut handle, size, &prop(ordinal, false), 0) };
        }
        ck(rc, "cuMemCreate", || {
            format!("allocating a {size}-byte symmetric heap on GPU {ordinal} (POSIX-fd shareable, RDMA {rdma}); lower RSHMEM_SYMMETRIC_SIZE if the GPU is full")
        })?;
        let mut m = VmmMapping {
            handle,
            va: 0,
            size,
            mapped: false,
            reserved: false,
        };
        m.map(ordinal)?;
        // SAFETY: [va, va + RESERVED_BYTES) is mapped read-write above (size >= 64 KiB).
        let rc = unsafe { sys::cuMemsetD8_v2(m.va, 0, RESERVED_BYTES.min(size)) };
        ck(rc, "cuMemsetD8", || {
            "zeroing the heap's runtime region".into()
        })?;
        // Zero before the heap is exported: a peer's first barrier signal must not be
        // overwritten by a memset still in flight.
        settle_sync_copies(|| "zeros into the heap's runtime region".into())?;
        Ok(m)
    }

    /// Imports a peer's heap from its fd and maps it for device `ordinal`. The fd is
    /// consumed (closed after the import: the handle keeps the memory).
    pub fn import(fd: OwnedFd, size: usize, ordinal: i32, peer: usize) -> Result<VmmMapping> {
        driver()?;
        use std::os::fd::AsRawFd;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX-fd handles the OS handle argument is the fd value itself cast
        // to a pointer (cuda.h); the fd is open for the duration of the call.
        let rc = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        ck(rc, "cuMemImportFromShareableHandle", || {
            format!("importing PE {peer}'s GPU heap")
        })?;
        drop(fd);
        Self::map_peer(handle, size, ordinal, format!("mapping PE {peer}'s heap"))
    }

    /// Maps a heap of this process, another PE's, through the address it is mapped at:
    /// `cuMemRetainAllocationHandle` takes a new reference to the allocation behind
    /// `peer_va` (released on drop, as an imported handle). The way PEs of one process map
    /// each other (CUDA documents fd import between processes; within the exporting
    /// process it is not documented either way), with [`VmmMapping::import`] as fallback.
    pub fn retain(peer_va: u64, size: usize, ordinal: i32, peer: usize) -> Result<VmmMapping> {
        driver()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; peer_va is the start of PE `peer`'s heap mapping in
        // this process, which stays mapped until that PE finalizes (after a barrier).
        let rc = unsafe {
            sys::cuMemRetainAllocationHandle(&mut handle, peer_va as usize as *mut std::ffi::c_void)
        };
        ck(rc, "cuMemRetainAllocationHandle", || {
            format!("taking a reference to PE {peer}'s GPU heap at {peer_va:#x} in this process")
        })?;
        Self::map_peer(
            handle,
            size,
            ordinal,
            format!("mapping PE {peer}'s heap by its address"),
        )
    }

    /// Maps a peer's allocation `handle` (owned: released on drop, also when mapping
    /// fails); `what` is added to a driver error.
    fn map_peer(
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
        ordinal: i32,
        what: String,
    ) -> Result<VmmMapping> {
        let mut m = VmmMapping {
            handle,
            va: 0,
            size,
            mapped: false,
            reserved: false,
        };
        m.map(ordinal).map_err(|e| match e {
            crate::Error::Cuda { call, detail } => crate::Error::Cuda {
                call,
                detail: format!("{detail} ({what})"),
            },
            e => e,
        })?;
        Ok(m)
    }

    fn map(&mut self, ordinal: i32) -> Result<()> {
        let size = self.size;
        let gran = granularity(ordinal)?;
        // SAFETY: valid out-pointer; alignment = granularity; no fixed address; flags 0.
        let rc = unsafe { sys::cuMemAddressReserve(&mut self.va, size, gran, 0, 0) };
        ck(rc, "cuMemAddressReserve", || {
            format!("reserving {size} bytes of device address space")
        })?;
        self.reserved = true;
        // SAFETY: maps the whole allocation at the start of our reservation; flags 0.
        let rc = unsafe { sys::cuMemMap(self.va, size, 0, self.handle, 0) };
        ck(rc, "cuMemMap", || format!("mapping a {size}-byte heap"))?;
        self.mapped = true;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: [va, va+size) is mapped above; one valid descriptor.
        let rc = unsafe { sys::cuMemSetAccess(self.va, size, &desc, 1) };
        ck(rc, "cuMemSetAccess", || {
            format!("granting GPU {ordinal} read-write access to a heap mapping")
        })
    }

    /// Exports the allocation as a POSIX fd (owned by the caller).
    pub fn export(&self) -> Result<OwnedFd> {
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for POSIX-fd handles the output is an int; `fd` is a valid out-pointer.
        let rc = unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        ck(rc, "cuMemExportToShareableHandle", || {
            "exporting this PE's GPU heap as an fd for node peers in other processes (GPU PEs \
             that are threads of one process need no fd: run them as `--pes N` without a \
             launcher, or over RSHMEM_TRANSPORT=proxy)"
                .into()
        })?;
        // SAFETY: the driver handed us a fresh descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Device address of the mapping.
    pub fn va(&self) -> u64 {
        self.va
    }

    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        // SAFETY: each step undoes one that succeeded in create/import/map; the owner keeps
        // the context current (GpuPe drops its mappings with its context current).
        unsafe {
            if self.mapped {
                sys::cuMemUnmap(self.va, self.size);
            }
            if self.reserved {
                sys::cuMemAddressFree(self.va, self.size);
            }
            sys::cuMemRelease(self.handle);
        }
    }
}
