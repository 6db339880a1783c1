//! Thin layer over [`sys`](super::sys): the `static inline` functions of the libfabric
//! headers re-implemented against the generated structs (each calls through the same
//! ops-table slot the C inline does), and `Result` wrappers for the control path that
//! turn a failing call into [`Error::Fabric`] naming the call and its `fi_strerror` text.
//!
//! The data-path calls (`fi_write`, `fi_read`, atomics, `fi_cq_read`) return the raw
//! code: the caller must tell `-FI_EAGAIN` (retry after progress) from real failures.
//! A provider that leaves an ops slot empty gets `-FI_ENOSYS`, as libfabric's own
//! `FI_CHECK_OP` would report.
//!
//! This module owns no resources; the safe types in [`super`] do.

use super::loader;
use super::sys::*;
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void, CStr};
use std::ptr;

/// `FI_VERSION(major, minor)`.
pub const fn fi_version_number(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The API version rshmem asks for. 1.9 has every mr_mode bit, FI_CONTEXT2 and
/// `fi_cq_err_entry.err_data_size`; asking for less than the installed 1.17 keeps older
/// distributions working.
pub const API_VERSION: u32 = fi_version_number(1, 9);

const ENOSYS_INT: c_int = -(FI_ENOSYS as c_int);
const ENOSYS_SSIZE: isize = -(FI_ENOSYS as isize);

/// Calls `(*table).slot(args...)`, or evaluates `none` when the provider left it empty.
macro_rules! op {
    ($table:expr, $slot:ident, $none:expr, $($arg:expr),* $(,)?) => {
        match (*$table).$slot {
            Some(f) => f($($arg),*),
            None => $none,
        }
    };
}

/// `fi_strerror(code)` for a positive or negative `FI_E*` code; never fails (a missing
/// library yields a generic text).
pub fn strerror(code: i32) -> String {
    let Ok(lib) = loader::lib() else {
        return format!("libfabric error {code}");
    };
    // SAFETY: fi_strerror accepts any value and returns a static string or NULL.
    let p = unsafe { (lib.fi_strerror)(code.abs()) };
    if p.is_null() {
        format!("libfabric error {code}")
    } else {
        // SAFETY: non-null results are static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// `Error::Fabric` for `call` returning `code`, with the `fi_strerror` text and what
/// rshmem was doing.
pub fn error(call: &'static str, code: i64, doing: &str) -> Error {
    let code = code as i32;
    let text = strerror(code);
    Error::Fabric {
        call,
        code,
        detail: if doing.is_empty() {
            text
        } else {
            format!("{text} ({doing})")
        },
    }
}

fn check(call: &'static str, rc: c_int, doing: &str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(error(call, rc.into(), doing))
    }
}

// ---------------------------------------------------------------------------------------
// Exported functions (through the loaded table).

/// `fi_version()`.
pub fn version() -> Result<u32> {
    let lib = loader::lib()?;
    // SAFETY: fi_version has no preconditions.
    Ok(unsafe { (lib.fi_version)() })
}

/// `fi_dupinfo(NULL)`, i.e. `fi_allocinfo()`: a zeroed `fi_info` with its attribute
/// structs allocated, to be freed with [`freeinfo`].
pub fn allocinfo() -> Result<*mut fi_info> {
    let lib = loader::lib()?;
    // SAFETY: fi_dupinfo(NULL) allocates a fresh zeroed fi_info; no other precondition.
    let p = unsafe { (lib.fi_dupinfo)(ptr::null()) };
    if p.is_null() {
        Err(error("fi_dupinfo", -(FI_ENOMEM as i64), "allocating hints"))
    } else {
        Ok(p)
    }
}

/// `fi_freeinfo(info)`.
///
/// # Safety
/// `info` is null or a list from fi_getinfo / fi_dupinfo not freed before and not used
/// after.
pub unsafe fn freeinfo(info: *mut fi_info) {
    if info.is_null() {
        return;
    }
    if let Ok(lib) = loader::lib() {
        // SAFETY: forwarded from the caller.
        unsafe { (lib.fi_freeinfo)(info) }
    }
}

/// `fi_getinfo(API_VERSION, NULL, NULL, 0, hints, &info)`. `Ok(null)` when no provider
/// matches (`-FI_ENODATA`).
///
/// # Safety
/// `hints` is a valid `fi_info` (from [`allocinfo`]).
pub unsafe fn getinfo(hints: *const fi_info) -> Result<*mut fi_info> {
    let lib = loader::lib()?;
    let mut info = ptr::null_mut();
    // SAFETY: hints valid (caller), info writable; NULL node/service ask for local
    // providers.
    let rc =
        unsafe { (lib.fi_getinfo)(API_VERSION, ptr::null(), ptr::null(), 0, hints, &mut info) };
    if rc == -(FI_ENODATA as c_int) {
        return Ok(ptr::null_mut());
    }
    check("fi_getinfo", rc, "querying providers")?;
    Ok(info)
}

/// `fi_fabric(attr, &fabric, NULL)`.
///
/// # Safety
/// `attr` is the fabric_attr of a live `fi_info` from fi_getinfo.
pub unsafe fn fabric(attr: *mut fi_fabric_attr) -> Result<*mut fid_fabric> {
    let lib = loader::lib()?;
    let mut f = ptr::null_mut();
    // SAFETY: forwarded from the caller; `f` writable.
    let rc = unsafe { (lib.fi_fabric)(attr, &mut f, ptr::null_mut()) };
    check("fi_fabric", rc, "opening the fabric")?;
    Ok(f)
}

// ---------------------------------------------------------------------------------------
// Inline functions of the headers, re-implemented. All: `# Safety` — every pointer
// argument is a live object of the named type (or what the C function accepts), and the
// buffers passed stay valid as long as the C documentation requires.

/// `fi_close(fid)`: `fid->ops->close(fid)`.
///
/// # Safety
/// `fid` is a live libfabric object, not used afterwards.
pub unsafe fn fi_close(fid: *mut fid) -> c_int {
    unsafe { op!((*fid).ops, close, ENOSYS_INT, fid) }
}

/// `fi_domain(fabric, info, &domain, context)`: `fabric->ops->domain(...)`.
///
/// # Safety
/// See the section comment.
pub unsafe fn fi_domain(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    domain: *mut *mut fid_domain,
    context: *mut c_void,
) -> c_int {
    unsafe {
        op!(
            (*fabric).ops,
            domain,
            ENOSYS_INT,
            fabric,
            info,
            domain,
            context
        )
    }
}

/// `fi_cq_open(domain, attr, &cq, context)`: `domain->ops->cq_open(...)`.
///
/// # Safety
/// See the section comment.
pub unsafe fn fi_cq_open(
    domain: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    unsafe {
        op!(
            (*domain).ops,
            cq_open,
            ENOSYS_INT,
            domain,
            attr,
            cq,
            context
        )
    }
}

/// `fi_av_open(domain, attr, &av, context)`: `domain->ops->av_open(...)`.
///
/// # Safety
/// See the section comment.
pub unsafe fn fi_av_open(
    domain: *mut fid_domain,
    attr: *mut fi_av_attr,
    av: *mut *mut fid_av,
    context: *mut c_void,
) -> c_int {
    unsafe {
        op!(
            (*domain).ops,
            av_open,
            ENOSYS_INT,
            domain,
            attr,
            av,
            context
        )
    }
}

/// `fi_endpoint(domain, info, &ep, context)`: `domain->ops->endpoint(...)`.
///
/// # Safety
/// See the section comment.
pub unsafe fn fi_endpoint(
    domain: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    unsafe {
        op!(
            (*domain).ops,
            endpoint,
            ENOSYS_INT,
            domain,
            info,
            ep,
            context
        )
    }
}

/// `fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, &mr, context)`:
/// `domain->mr->reg(&domain->fid, ...)`.
///
/// # Safety
/// See the section comment; `buf..buf+len` stays allocated until the MR is closed.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_mr_reg(
    domain: *mut fid_domain,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    unsafe {
        op!(
            (*domain).mr,
            reg,
            ENOSYS_INT,
            ptr::addr_of_mut!((*domain).fid),
            buf,
            len,
            access,
            offset,
            requested_key,
            flags,
            mr,
            context,
        )
    }
}

/// `fi_mr_desc(mr)`: `mr->mem_desc`.
///
/// # Safety
/// `mr` is a live memory region.
pub unsafe fn fi_mr_desc(mr: *mut fid_mr) -> *mut c_void {
    unsafe { (*mr).mem_desc }
}

/// `fi_mr_key(mr)`: `mr->key`.
///
/// # Safety
/// `mr` is a live memory region.
pub unsafe fn fi_mr_key(mr: *mut fid_mr) -> u64 {
    unsafe { (*mr).key }
}

/// `fi_ep_bind(ep, bfid, flags)`: `ep->fid.ops->bind(&ep->fid, bfid, flags)`.
///
/// # Safety
/// See the section comment.
pub unsafe fn fi_ep_bind(ep: *mut fid_ep, bfid: *mut fid, flags: u64) -> c_int {
    unsafe {
        op!(
            (*ep).fid.ops,
            bind,
            ENOSYS_INT,
            ptr::addr_of_mut!((*ep).fid),
            bfid,
            flags
        )
    }
}

/// `fi_enable(ep)`: `ep->fid.ops->control(&ep->fid, FI_ENABLE, NULL)`.
///
/// # Safety
/// See the section comment.
pub unsafe fn fi_enable(ep: *mut fid_ep) -> c_int {
    unsafe {
        op!(
            (*ep).fid.ops,
            control,
            ENOSYS_INT,
            ptr::addr_of_mut!((*ep).fid),
            FI_ENABLE as c_int,
            ptr::null_mut()
        )
    }
}

/// `fi_getname(&ep->fid, addr, addrlen)`: `ep->cm->getname(fid, addr, addrlen)` (the C
/// version recovers `ep` with container_of; `fid` is the first field of `fid_ep`).
///
/// # Safety
/// See the section comment; `addr` has `*addrlen` writable bytes.
pub unsafe fn fi_getname(ep: *mut fid_ep, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    unsafe {
        op!(
            (*ep).cm,
            getname,
            ENOSYS_INT,
            ptr::addr_of_mut!((*ep).fid),
            addr,
            addrlen
        )
    }
}

/// `fi_av_insert(av, addr, count, fi_addr, flags, context)`: `av->ops->insert(...)`.
/// Returns the number of addresses inserted.
///
/// # Safety
/// See the section comment.
pub unsafe fn fi_av_insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    unsafe {
        op!(
            (*av).ops,
            insert,
            ENOSYS_INT,
            av,
            addr,
            count,
            fi_addr,
            flags,
            context
        )
    }
}

/// `fi_write(ep, buf, len, desc, dest_addr, addr, key, context)`: `ep->rma->write(...)`.
///
/// # Safety
/// See the section comment; `buf` stays valid until the completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    unsafe {
        op!(
            (*ep).rma,
            write,
            ENOSYS_SSIZE,
            ep,
            buf,
            len,
            desc,
            dest_addr,
            addr,
            key,
            context
        )
    }
}

/// `fi_writedata(ep, buf, len, desc, data, dest_addr, addr, key, context)`:
/// `ep->rma->writedata(...)`.
///
/// # Safety
/// See the section comment; `buf` stays valid until the completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_writedata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    unsafe {
        op!(
            (*ep).rma,
            writedata,
            ENOSYS_SSIZE,
            ep,
            buf,
            len,
            desc,
            data,
            dest_addr,
            addr,
            key,
            context
        )
    }
}

/// `fi_read(ep, buf, len, desc, src_addr, addr, key, context)`: `ep->rma->read(...)`.
///
/// # Safety
/// See the section comment; `buf` stays valid until the completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    unsafe {
        op!(
            (*ep).rma,
            read,
            ENOSYS_SSIZE,
            ep,
            buf,
            len,
            desc,
            src_addr,
            addr,
            key,
            context
        )
    }
}

/// `fi_fetch_atomic(ep, buf, count, desc, result, result_desc, dest_addr, addr, key,
/// datatype, op, context)`: `ep->atomic->readwrite(...)`.
///
/// # Safety
/// See the section comment; `buf` and `result` stay valid until the completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_fetch_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    unsafe {
        op!(
            (*ep).atomic,
            readwrite,
            ENOSYS_SSIZE,
            ep,
            buf,
            count,
            desc,
            result,
            result_desc,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context
        )
    }
}

/// `fi_compare_atomic(ep, buf, count, desc, compare, compare_desc, result, result_desc,
/// dest_addr, addr, key, datatype, op, context)`: `ep->atomic->compwrite(...)`.
///
/// # Safety
/// See the section comment; `buf`, `compare` and `result` stay valid until the
/// completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_compare_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    compare: *const c_void,
    compare_desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    unsafe {
        op!(
            (*ep).atomic,
            compwrite,
            ENOSYS_SSIZE,
            ep,
            buf,
            count,
            desc,
            compare,
            compare_desc,
            result,
            result_desc,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context
        )
    }
}

/// Which of the three `fi_*atomicvalid` queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicKind {
    /// `fi_atomicvalid`: `ep->atomic->writevalid`.
    Write,
    /// `fi_fetch_atomicvalid`: `ep->atomic->readwritevalid`.
    Fetch,
    /// `fi_compare_atomicvalid`: `ep->atomic->compwritevalid`.
    Compare,
}

impl AtomicKind {
    /// The C function name.
    pub fn call(self) -> &'static str {
        match self {
            AtomicKind::Write => "fi_atomicvalid",
            AtomicKind::Fetch => "fi_fetch_atomicvalid",
            AtomicKind::Compare => "fi_compare_atomicvalid",
        }
    }
}

/// `fi_atomicvalid` / `fi_fetch_atomicvalid` / `fi_compare_atomicvalid`: `Ok(count)`
/// (elements one operation may carry) or the negative code.
///
/// # Safety
/// `ep` is a live endpoint.
pub unsafe fn atomic_valid(
    ep: *mut fid_ep,
    kind: AtomicKind,
    datatype: fi_datatype,
    op: fi_op,
) -> std::result::Result<usize, c_int> {
    let mut count = 0usize;
    let rc = unsafe {
        match kind {
            AtomicKind::Write => {
                op!(
                    (*ep).atomic,
                    writevalid,
                    ENOSYS_INT,
                    ep,
                    datatype,
                    op,
                    &mut count
                )
            }
            AtomicKind::Fetch => {
                op!(
                    (*ep).atomic,
                    readwritevalid,
                    ENOSYS_INT,
                    ep,
                    datatype,
                    op,
                    &mut count
                )
            }
            AtomicKind::Compare => {
                op!(
                    (*ep).atomic,
                    compwritevalid,
                    ENOSYS_INT,
                    ep,
                    datatype,
                    op,
                    &mut count
                )
            }
        }
    };
    if rc == 0 {
        Ok(count)
    } else {
        Err(rc)
    }
}

/// `fi_cq_read(cq, buf, count)`: `cq->ops->read(...)`.
///
/// # Safety
/// `cq` is live; `buf` holds `count` entries of the CQ's format.
pub unsafe fn fi_cq_read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    unsafe { op!((*cq).ops, read, ENOSYS_SSIZE, cq, buf, count) }
}

/// `fi_cq_readerr(cq, buf, flags)`: `cq->ops->readerr(...)`.
///
/// # Safety
/// `cq` is live; `buf` is writable.
pub unsafe fn fi_cq_readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, flags: u64) -> isize {
    unsafe { op!((*cq).ops, readerr, ENOSYS_SSIZE, cq, buf, flags) }
}

/// `fi_cq_strerror(cq, prov_errno, err_data, NULL, 0)`: the provider's text for an
/// error entry, or `None`.
///
/// # Safety
/// `cq` is live and `err_data` is the entry's, read before the next CQ read.
pub unsafe fn cq_strerror(
    cq: *mut fid_cq,
    prov_errno: c_int,
    err_data: *const c_void,
) -> Option<String> {
    let p = unsafe {
        op!(
            (*cq).ops,
            strerror,
            ptr::null(),
            cq,
            prov_errno,
            err_data,
            ptr::null_mut(),
            0
        )
    };
    if p.is_null() {
        None
    } else {
        // SAFETY: non-null results are NUL-terminated strings owned by the provider,
        // copied out at once.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

// ---------------------------------------------------------------------------------------
// Result wrappers for the control path.

/// Closes `fid`, naming `what` in the error.
///
/// # Safety
/// As [`fi_close`].
pub unsafe fn close(fid: *mut fid, what: &str) -> Result<()> {
    // SAFETY: forwarded.
    check("fi_close", unsafe { fi_close(fid) }, what)
}

/// Binds `bfid` to `ep`.
///
/// # Safety
/// As [`fi_ep_bind`].
pub unsafe fn ep_bind(ep: *mut fid_ep, bfid: *mut fid, flags: u64, what: &str) -> Result<()> {
    // SAFETY: forwarded.
    check("fi_ep_bind", unsafe { fi_ep_bind(ep, bfid, flags) }, what)
}

/// Enables `ep`.
///
/// # Safety
/// As [`fi_enable`].
pub unsafe fn enable(ep: *mut fid_ep) -> Result<()> {
    // SAFETY: forwarded.
    check(
        "fi_enable",
        unsafe { fi_enable(ep) },
        "enabling the endpoint",
    )
}

/// The endpoint's address bytes.
///
/// # Safety
/// `ep` is a live, enabled endpoint.
pub unsafe fn getname(ep: *mut fid_ep) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; 64];
    let mut len = buf.len();
    // SAFETY: buf has len writable bytes.
    let mut rc = unsafe { fi_getname(ep, buf.as_mut_ptr().cast(), &mut len) };
    if rc == -(FI_ETOOSMALL as c_int) {
        // `len` now holds the size needed.
        buf.resize(len, 0);
        // SAFETY: as above, with the larger buffer.
        rc = unsafe { fi_getname(ep, buf.as_mut_ptr().cast(), &mut len) };
    }
    check("fi_getname", rc, "reading the endpoint address")?;
    buf.truncate(len);
    Ok(buf)
}
