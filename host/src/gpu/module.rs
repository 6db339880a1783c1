//! Modules: the library's PTX (embedded at build time from ptx/, see host/build.rs), user
//! PTX, and user CUDA source compiled at run time with NVRTC against the embedded device
//! API headers.
//!
//! One loaded module instance belongs to one PE: [`super::GpuPe::load_module`] loads it in
//! the PE's context and [`super::GpuPe::bind_module`] writes the PE's state into its
//! `rshmemi_device_state` global. Several PEs of one process share the context, so each
//! loads its own instance.

use super::driver::{ck, driver, nvrtc, nvrtc_result_name};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use cudarc::nvrtc::sys as nv;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// The lock that makes JIT compilations of library module `name` in this process take turns.
fn jit_lock(name: &str) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<std::collections::HashMap<String, Arc<Mutex<()>>>>> =
        OnceLock::new();
    let mut m = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    m.entry(name.to_string()).or_default().clone()
}

include!(concat!(env!("OUT_DIR"), "/embedded_device.rs"));

/// Where `RSHMEM_PTX_DIR` points, modules are read from `<dir>/<name>.ptx` before the
/// embedded copies (for running kernels newer than the binary, e.g. in gpu-check).
pub const PTX_DIR_ENV: &str = "RSHMEM_PTX_DIR";

/// The PTX text of module `name`: from `dir` (or `RSHMEM_PTX_DIR`) when that has
/// `<name>.ptx`, else the embedded copy.
pub fn ptx_source(name: &str, dir: Option<&std::path::Path>) -> Result<String> {
    let env_dir = std::env::var_os(PTX_DIR_ENV).map(std::path::PathBuf::from);
    if let Some(d) = dir.map(|d| d.to_path_buf()).or(env_dir) {
        let p = d.join(format!("{name}.ptx"));
        if p.exists() {
            return std::fs::read_to_string(&p)
                .map_err(|e| Error::io(format!("reading PTX module {}", p.display()), e));
        }
    }
    EMBEDDED_PTX
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| t.to_string())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no PTX module {name:?}: not embedded in this build (embedded: {}) and not found in \
                 {PTX_DIR_ENV}",
                EMBEDDED_PTX.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ))
        })
}

/// True when `sidecar` (a `.cubin.fnv` file's text) names the FNV-1a hash of `ptx`.
pub fn cubin_matches(ptx: &str, sidecar: &str) -> bool {
    sidecar.trim() == format!("{:016x}", crate::pe::fnv(ptx.as_bytes()))
}

/// What `<dir>/<name>.sm_<major><minor>.cubin` is for the PTX in use.
enum Cubin {
    Missing(std::path::PathBuf),
    NoSidecar(std::path::PathBuf),
    /// Its sidecar names other PTX: never loaded.
    Stale(std::path::PathBuf),
    /// Made from this PTX (not yet checked by [`cubin_check`]).
    Matching(std::path::PathBuf, Vec<u8>),
}

/// Looks up module `name`'s cubin for compute capability `cc` in `d`: the file and its
/// `.cubin.fnv` sidecar (the FNV-1a hash of the PTX it was compiled from, written by
/// scripts/build-gpu-bundle).
fn find_cubin(name: &str, ptx: &str, d: &std::path::Path, cc: (i32, i32)) -> Cubin {
    let cubin = d.join(format!("{name}.sm_{}{}.cubin", cc.0, cc.1));
    let Ok(image) = std::fs::read(&cubin) else {
        return Cubin::Missing(cubin);
    };
    match std::fs::read_to_string(cubin.with_extension("cubin.fnv")) {
        Err(_) => Cubin::NoSidecar(cubin),
        Ok(h) if !cubin_matches(ptx, &h) => Cubin::Stale(cubin),
        Ok(_) => Cubin::Matching(cubin, image),
    }
}

/// The cubin scripts/build-gpu-bundle compiled from exactly `ptx` for compute capability
/// `cc`: `<dir>/<name>.sm_<major><minor>.cubin`, whose sidecar `<...>.cubin.fnv` holds the
/// FNV-1a hash of that PTX (`dir`: the argument, else `RSHMEM_PTX_DIR`). None when there
/// is none or it was made from other PTX, so a stale image is never loaded. Loading a
/// cubin spares the driver's JIT of megabytes of PTX (about 50 s for
/// rshmem_device_tests) in every process whose compute cache lacks it.
pub fn prebuilt_cubin(
    name: &str,
    ptx: &str,
    dir: Option<&std::path::Path>,
    cc: (i32, i32),
) -> Option<(std::path::PathBuf, Vec<u8>)> {
    let d = dir
        .map(|d| d.to_path_buf())
        .or_else(|| std::env::var_os(PTX_DIR_ENV).map(std::path::PathBuf::from))?;
    match find_cubin(name, ptx, &d, cc) {
        Cubin::Matching(path, image) => Some((path, image)),
        _ => None,
    }
}

/// How each embedded library module would load on a GPU of compute capability `cc`:
/// (module, "cubin <path>" | "PTX: <why no cubin>"), as [`Module::load_library`] decides
/// (the doctor reports it, so a GPU run's log says whether the bundle's cubins are used).
pub fn module_sources(cc: (i32, i32)) -> Vec<(&'static str, String)> {
    let dir = std::env::var_os(PTX_DIR_ENV).map(std::path::PathBuf::from);
    module_sources_in(dir.as_deref(), cc)
}

/// [`module_sources`] for cubins in `dir` (None: no `RSHMEM_PTX_DIR`).
pub fn module_sources_in(
    dir: Option<&std::path::Path>,
    cc: (i32, i32),
) -> Vec<(&'static str, String)> {
    EMBEDDED_PTX
        .iter()
        .map(|(name, _)| {
            let how = match (dir, ptx_source(name, dir)) {
                (_, Err(e)) => format!("unavailable: {e}"),
                (None, Ok(_)) => format!("PTX (no {PTX_DIR_ENV})"),
                (Some(d), Ok(ptx)) => match find_cubin(name, &ptx, d, cc) {
                    Cubin::Missing(c) => format!("PTX (no {})", c.display()),
                    Cubin::NoSidecar(c) => format!("PTX ({} has no .fnv sidecar)", c.display()),
                    Cubin::Stale(c) => format!("PTX ({} was made from other PTX)", c.display()),
                    Cubin::Matching(c, image) => match cubin_check(&image) {
                        Ok(()) => format!("cubin {}", c.display()),
                        Err(why) => format!("PTX ({} is damaged: {why})", c.display()),
                    },
                },
            };
            (*name, how)
        })
        .collect()
}

/// Why `image` is not a complete CUDA ELF image (64-bit little-endian ELF for EM_CUDA whose
/// program headers, section headers and sections all lie inside it), or Ok. The driver's
/// `cuModuleLoadData` takes no length and trusts these offsets, so a truncated file (an
/// interrupted unpack) must never reach it.
pub fn cubin_check(image: &[u8]) -> std::result::Result<(), String> {
    const EM_CUDA: u16 = 190;
    const SHT_NOBITS: u32 = 8;
    let n = image.len() as u64;
    let u16_at = |o: usize| {
        image
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as u64)
    };
    let u32_at = |o: usize| {
        image
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        image
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return Err(format!("not a 64-bit little-endian ELF file ({n} bytes)"));
    }
    if u16_at(18) != Some(EM_CUDA as u64) {
        return Err(format!(
            "ELF machine {:?}, not CUDA ({EM_CUDA})",
            u16_at(18)
        ));
    }
    let table = |off: Option<u64>, num: Option<u64>, size: Option<u64>, what: &str| {
        let (off, num, size) = (off.unwrap_or(0), num.unwrap_or(0), size.unwrap_or(0));
        match num.checked_mul(size).and_then(|b| b.checked_add(off)) {
            Some(end) if end <= n => Ok((off, num, size)),
            _ => Err(format!(
                "its {what} ({num} x {size} bytes at {off}) end past its {n} bytes"
            )),
        }
    };
    table(u64_at(32), u16_at(56), u16_at(54), "program headers")?;
    let (shoff, shnum, shsize) = table(u64_at(40), u16_at(60), u16_at(58), "section headers")?;
    for i in 0..shnum {
        let h = (shoff + i * shsize) as usize;
        let (Some(ty), Some(off), Some(size)) = (u32_at(h + 4), u64_at(h + 24), u64_at(h + 32))
        else {
            return Err(format!("section header {i} is cut short"));
        };
        if ty != SHT_NOBITS && off.checked_add(size).is_none_or(|end| end > n) {
            return Err(format!(
                "section {i} ({size} bytes at {off}) ends past its {n} bytes"
            ));
        }
    }
    Ok(())
}

/// A hand-written kernel behind `GpuPe::signal_on_stream`: one thread updates a signal
/// word with release semantics at system scope (`op` 0 = SET: `st.release.sys`, 1 = ADD:
/// `red.release.sys.add`). Checked with the pinned ptxas by host/tests/gpu_ptx.rs.
pub const SIGNAL_PTX: &str = r#"//
// rshmem host-side signal kernel (hand-written, host/src/gpu/module.rs)
.version 9.0
.target sm_90
.address_size 64

.visible .entry rshmem_host_signal(
	.param .u64 rshmem_host_signal_param_0,
	.param .u64 rshmem_host_signal_param_1,
	.param .u32 rshmem_host_signal_param_2
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [rshmem_host_signal_param_0];
	ld.param.u64 	%rd2, [rshmem_host_signal_param_1];
	ld.param.u32 	%r1, [rshmem_host_signal_param_2];
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__set;
	red.release.sys.global.add.u64 	[%rd1], %rd2;
	ret;
$L__set:
	st.release.sys.global.u64 	[%rd1], %rd2;
	ret;
}
"#;

/// A retained primary context; released when the last holder drops.
#[derive(Debug)]
pub struct Ctx {
    pub(crate) raw: sys::CUcontext,
    pub(crate) dev: sys::CUdevice,
    pub(crate) ordinal: i32,
}

// SAFETY: a CUcontext may be made current on any thread; the driver is thread-safe.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Retains device `ordinal`'s primary context (shared by every PE of this process on
    /// that device) and makes it current on this thread.
    pub fn retain(ordinal: i32) -> Result<Arc<Ctx>> {
        driver()?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out-pointer; ordinal validated by the caller.
        ck(
            unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
            "cuDeviceGet",
            || format!("GPU {ordinal}"),
        )?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and device.
        ck(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, dev) },
            "cuDevicePrimaryCtxRetain",
            || format!("GPU {ordinal}"),
        )?;
        let c = Arc::new(Ctx { raw, dev, ordinal });
        c.enter()?;
        Ok(c)
    }

    /// Makes the context current on the calling thread (cheap; every GpuPe call does it,
    /// since PEs may be driven from any thread).
    pub fn enter(&self) -> Result<()> {
        // SAFETY: raw is a retained context.
        ck(
            unsafe { sys::cuCtxSetCurrent(self.raw) },
            "cuCtxSetCurrent",
            || format!("entering GPU {}'s context", self.ordinal),
        )
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: balances the retain in Ctx::retain.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// A loaded module instance.
#[derive(Debug)]
pub struct Module {
    pub(crate) raw: sys::CUmodule,
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) name: String,
    /// The PE it is bound to (bind_module), if any.
    pub(crate) bound: Option<usize>,
}

// SAFETY: module handles are valid on any thread with the context current (Module calls
// enter() first).
unsafe impl Send for Module {}
// SAFETY: as above; &Module only looks up functions.
unsafe impl Sync for Module {}

impl Module {
    /// Loads PTX into `ctx`.
    pub fn load(ctx: &Arc<Ctx>, name: &str, image: &str) -> Result<Module> {
        let c = CString::new(image).map_err(|_| {
            Error::InvalidArgument(format!("module {name}: PTX contains a NUL byte"))
        })?;
        // SAFETY: a NUL-terminated PTX image that outlives the call.
        unsafe {
            Module::load_data(ctx, name, c.as_ptr().cast(), || {
                format!("loading module {name} (PTX for sm_90, ISA 9.0: needs driver 580 / CUDA 13.0 or newer)")
            })
        }
    }

    /// Loads a cubin image (from [`prebuilt_cubin`]; `path` names it in errors). Refuses an
    /// image that [`cubin_check`] finds incomplete.
    pub fn load_cubin(
        ctx: &Arc<Ctx>,
        name: &str,
        image: &[u8],
        path: &std::path::Path,
    ) -> Result<Module> {
        cubin_check(image).map_err(|why| {
            Error::InvalidArgument(format!("module {name}: {}: {why}", path.display()))
        })?;
        // SAFETY: a complete cubin image (checked above: the driver reads its extent from
        // the ELF headers) that outlives the call.
        unsafe {
            Module::load_data(ctx, name, image.as_ptr().cast(), || {
                format!("loading module {name} from {}", path.display())
            })
        }
    }

    /// `cuModuleLoadDataEx` of `image` (with the JIT's error log, which a refused PTX
    /// error message then carries), then every kernel loaded.
    ///
    /// # Safety
    /// `image` points at a complete PTX (NUL-terminated) or cubin image that stays valid
    /// for the call.
    unsafe fn load_data(
        ctx: &Arc<Ctx>,
        name: &str,
        image: *const std::ffi::c_void,
        what: impl FnOnce() -> String,
    ) -> Result<Module> {
        ctx.enter()?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // The JIT's error log: what ptxas said about a PTX the driver refuses (an
        // unsupported .version or .target, a ptxas error), the first thing to read on a
        // new driver.
        let mut log = vec![0u8; 8192];
        let mut opts = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut vals: [*mut std::ffi::c_void; 2] =
            [log.as_mut_ptr().cast(), log.len() as *mut std::ffi::c_void];
        // SAFETY: the caller's image; valid out-pointer; context current; two options
        // whose values are the log buffer and its size (the driver writes at most that
        // many bytes, NUL included, and the size it used back into vals[1]).
        let rc = unsafe {
            sys::cuModuleLoadDataEx(
                &mut raw,
                image,
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        ck(rc, "cuModuleLoadDataEx", || {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let text = text.trim();
            if text.is_empty() {
                what()
            } else {
                format!("{}; the JIT said: {text}", what())
            }
        })?;
        let m = Module {
            raw,
            ctx: ctx.clone(),
            name: name.into(),
            bound: None,
        };
        m.load_functions()?;
        Ok(m)
    }

    /// Loads module `name`, whose PTX is `ptx`: the prebuilt cubin for compute capability
    /// `cc` when `dir` (or `RSHMEM_PTX_DIR`) has one made from this very PTX, else the PTX
    /// itself (JIT-compiled by the driver).
    pub fn load_library(
        ctx: &Arc<Ctx>,
        name: &str,
        ptx: &str,
        dir: Option<&std::path::Path>,
        cc: (i32, i32),
    ) -> Result<Module> {
        if let Some((path, image)) = prebuilt_cubin(name, ptx, dir, cc) {
            // A damaged (cubin_check, in load_cubin) or refused cubin costs the JIT only,
            // never the run.
            match Module::load_cubin(ctx, name, &image, &path) {
                Ok(m) => return Ok(m),
                Err(e) => eprintln!(
                    "rshmem: GPU: {} not used ({e}); JIT-compiling module {name}'s PTX instead",
                    path.display()
                ),
            }
        }
        // One JIT compilation of a module at a time in this process: its PEs load the same
        // modules at the same moment, and the first compilation fills the driver's compute
        // cache for the others (megabytes of PTX take ptxas tens of seconds) instead of
        // every PE compiling the same PTX at once. The wait is for driver calls only; a
        // host barrier around PE 0's load instead would be bounded by RSHMEM_TIMEOUT_MS,
        // which a long compilation can outlast. Without the cache (CUDA_CACHE_DISABLE=1)
        // turns would only serialise the compilations: then they run at once.
        if std::env::var("CUDA_CACHE_DISABLE").as_deref() == Ok("1") {
            return Module::load(ctx, name, ptx);
        }
        let lock = jit_lock(name);
        let _one_at_a_time = match lock.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                // Said once per wait: a compilation can take tens of seconds, during which
                // this PE shows no other sign of life.
                eprintln!(
                    "rshmem: GPU: waiting for another PE of this process to JIT-compile \
                     module {name} (its compilation fills the driver's cache for this one)"
                );
                lock.lock().unwrap_or_else(|p| p.into_inner())
            }
        };
        Module::load(ctx, name, ptx)
    }

    /// Loads every kernel of the module now. Under lazy loading (CUDA's default since 12.2)
    /// a kernel is loaded at its first `cuModuleGetFunction`, and that load may wait for
    /// the context's running kernels to finish (CUDA Programming Guide, "Lazy Loading",
    /// concurrent execution). PEs of one process share a context and their kernels wait
    /// for each other, so a PE looking up a kernel while a peer's kernel waits for this
    /// PE would deadlock. Loading modules and kernels before the launches keeps every
    /// later lookup a table read.
    pub(crate) fn load_functions(&self) -> Result<()> {
        let mut n: std::ffi::c_uint = 0;
        // SAFETY: valid out-pointer and module; context current (load entered it).
        let rc = unsafe { sys::cuModuleGetFunctionCount(&mut n, self.raw) };
        ck(rc, "cuModuleGetFunctionCount", || {
            format!("listing the kernels of module {}", self.name)
        })?;
        if n == 0 {
            // A module without kernels (the state-only module that binds a host-side
            // state): nothing to load, and the enumeration may refuse a count of 0.
            return Ok(());
        }
        let mut fs: Vec<sys::CUfunction> = vec![std::ptr::null_mut(); n as usize];
        // SAFETY: room for exactly n handles; valid module.
        let rc = unsafe { sys::cuModuleEnumerateFunctions(fs.as_mut_ptr(), n, self.raw) };
        ck(rc, "cuModuleEnumerateFunctions", || {
            format!("listing the kernels of module {}", self.name)
        })?;
        for f in fs {
            // SAFETY: a handle the driver just returned for this module.
            let rc = unsafe { sys::cuFuncLoad(f) };
            ck(rc, "cuFuncLoad", || {
                format!("loading the kernels of module {} eagerly", self.name)
            })?;
        }
        Ok(())
    }

    /// A kernel of the module by its `extern "C"` name.
    pub fn function(&self, kernel: &str) -> Result<sys::CUfunction> {
        self.ctx.enter()?;
        let c = CString::new(kernel)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {kernel:?}")))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: valid out-pointer, module and NUL-terminated name.
        let rc = unsafe { sys::cuModuleGetFunction(&mut f, self.raw, c.as_ptr()) };
        ck(rc, "cuModuleGetFunction", || {
            format!("looking up kernel {kernel} in module {}", self.name)
        })?;
        Ok(f)
    }

    /// (device address, size) of a global.
    pub fn global(&self, symbol: &str) -> Result<Option<(u64, usize)>> {
        self.ctx.enter()?;
        let c = CString::new(symbol)
            .map_err(|_| Error::InvalidArgument(format!("symbol {symbol:?}")))?;
        let mut p: sys::CUdeviceptr = 0;
        let mut n = 0usize;
        // SAFETY: valid out-pointers, module and name.
        let rc = unsafe { sys::cuModuleGetGlobal_v2(&mut p, &mut n, self.raw, c.as_ptr()) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Ok(None);
        }
        ck(rc, "cuModuleGetGlobal", || {
            format!("looking up {symbol} in module {}", self.name)
        })?;
        Ok(Some((p, n)))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PE this instance is bound to.
    pub fn bound_pe(&self) -> Option<usize> {
        self.bound
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.enter().is_ok() {
            // SAFETY: raw was loaded in this context and is unloaded once.
            unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}

/// A minimal `<stdint.h>` for NVRTC (LP64, as glibc's, so that the types are the ones an
/// nvcc build of the same source sees), offered only if the first compile reports that it
/// cannot find one (NVRTC ships no C library headers).
const STDINT_SHIM: &str = "#pragma once\n\
typedef signed char int8_t; typedef unsigned char uint8_t;\n\
typedef short int16_t; typedef unsigned short uint16_t;\n\
typedef int int32_t; typedef unsigned int uint32_t;\n\
typedef long int64_t; typedef unsigned long uint64_t;\n\
typedef unsigned long uintptr_t; typedef long intptr_t;\n\
#define UINT64_MAX 0xffffffffffffffffull\n#define UINT32_MAX 0xffffffffu\n";

/// `<stddef.h>` for NVRTC builds that have none (LP64, as glibc's).
const STDDEF_SHIM: &str = "#pragma once\n\
typedef unsigned long size_t; typedef long ptrdiff_t;\n\
#ifndef NULL\n#define NULL 0\n#endif\n";

/// NVRTC options rshmem always passes for compute capability `cc`.
pub fn nvrtc_options(cc: (i32, i32), extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        format!("--gpu-architecture=compute_{}{}", cc.0, cc.1),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Compiles CUDA C++ `src` (named `name` in messages) to PTX with NVRTC. The device API
/// headers are available as `#include "rshmem/rshmem.cuh"` (every header under
/// device-kernels/include is embedded). Returns the PTX; the compile log is in the error.
pub fn nvrtc_compile(src: &str, name: &str, cc: (i32, i32), extra: &[&str]) -> Result<String> {
    nvrtc()?;
    match compile_once(src, name, cc, extra, false) {
        Err(e)
            if ["stdint.h", "stddef.h"]
                .iter()
                .any(|h| e.to_string().contains(h)) =>
        {
            compile_once(src, name, cc, extra, true)
        }
        r => r,
    }
}

fn compile_once(
    src: &str,
    name: &str,
    cc: (i32, i32),
    extra: &[&str],
    shim: bool,
) -> Result<String> {
    let cstr = |s: &str| {
        CString::new(s)
            .map_err(|_| Error::InvalidArgument(format!("NUL byte in NVRTC input {name}")))
    };
    let src_c = cstr(src)?;
    let name_c = cstr(name)?;
    let mut hdrs: Vec<(CString, CString)> = EMBEDDED_HEADERS
        .iter()
        .map(|(n, t)| Ok((cstr(t)?, cstr(n)?)))
        .collect::<Result<_>>()?;
    if shim {
        hdrs.push((cstr(STDINT_SHIM)?, cstr("stdint.h")?));
        hdrs.push((cstr(STDDEF_SHIM)?, cstr("stddef.h")?));
    }
    let texts: Vec<*const std::ffi::c_char> = hdrs.iter().map(|(t, _)| t.as_ptr()).collect();
    let names: Vec<*const std::ffi::c_char> = hdrs.iter().map(|(_, n)| n.as_ptr()).collect();
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all strings are NUL-terminated and outlive the call; counts match the arrays.
    let rc = unsafe {
        nv::nvrtcCreateProgram(
            &mut prog,
            src_c.as_ptr(),
            name_c.as_ptr(),
            texts.len() as i32,
            texts.as_ptr(),
            names.as_ptr(),
        )
    };
    if rc != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Cuda {
            call: "nvrtcCreateProgram",
            detail: format!("{} ({name})", nvrtc_result_name(rc)),
        });
    }
    let opts: Vec<CString> = nvrtc_options(cc, extra)
        .iter()
        .map(|o| cstr(o))
        .collect::<Result<_>>()?;
    let optp: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: prog was created above; options are NUL-terminated strings.
    let rc = unsafe { nv::nvrtcCompileProgram(prog, optp.len() as i32, optp.as_ptr()) };
    let log = program_log(prog);
    let out = if rc != nv::nvrtcResult::NVRTC_SUCCESS {
        Err(Error::Cuda {
            call: "nvrtcCompileProgram",
            detail: format!(
                "{} compiling {name} with {:?}:\n{log}",
                nvrtc_result_name(rc),
                nvrtc_options(cc, extra)
            ),
        })
    } else {
        let mut n = 0usize;
        // SAFETY: compiled program; valid out-pointer.
        let rc = unsafe { nv::nvrtcGetPTXSize(prog, &mut n) };
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: buf holds n bytes as nvrtcGetPTXSize said.
        let rc2 = if rc == nv::nvrtcResult::NVRTC_SUCCESS {
            unsafe { nv::nvrtcGetPTX(prog, buf.as_mut_ptr().cast()) }
        } else {
            rc
        };
        if rc2 != nv::nvrtcResult::NVRTC_SUCCESS {
            Err(Error::Cuda {
                call: "nvrtcGetPTX",
                detail: nvrtc_result_name(rc2),
            })
        } else {
            let s = CStr::from_bytes_until_nul(&buf)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok(s)
        }
    };
    // SAFETY: destroys the program created above, once.
    unsafe { nv::nvrtcDestroyProgram(&mut prog) };
    out
}

fn program_log(prog: nv::nvrtcProgram) -> String {
    let mut n = 0usize;
    // SAFETY: valid program and out-pointer.
    if unsafe { nv::nvrtcGetProgramLogSize(prog, &mut n) } != nv::nvrtcResult::NVRTC_SUCCESS
        || n == 0
    {
        return String::new();
    }
    let mut buf = vec![0u8; n];
    // SAFETY: buf holds n bytes.
    unsafe { nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) };
    CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files_under(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                files_under(&p, base, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }

    #[test]
    fn every_device_header_is_embedded_verbatim() {
        let base =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../device-kernels/include");
        let mut on_disk = Vec::new();
        files_under(&base, &base, &mut on_disk);
        on_disk.sort();
        let mut embedded: Vec<String> = EMBEDDED_HEADERS
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
        for (n, t) in EMBEDDED_HEADERS {
            assert_eq!(
                *t,
                std::fs::read_to_string(base.join(n)).unwrap(),
                "{n} is stale"
            );
        }
        assert!(on_disk.contains(&"rshmem/state.cuh".to_string()));
    }

    #[test]
    fn every_ptx_module_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ptx");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter_map(|e| {
                e.path()
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .filter(|_| e.path().extension().is_some_and(|x| x == "ptx"))
            })
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = EMBEDDED_PTX.iter().map(|(n, _)| n.to_string()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
        let k = ptx_source("rshmem_kernels", None).unwrap();
        assert!(k.contains(".visible .entry rshmem_copy("));
        let e = ptx_source("no_such_module", None).unwrap_err().to_string();
        assert!(
            e.contains("no PTX module \"no_such_module\"") && e.contains("rshmem_kernels"),
            "{e}"
        );
    }

    fn fnv_reference(b: &[u8]) -> u64 {
        let mut h: u64 = 0xcbf29ce484222325;
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h
    }

    #[test]
    fn cubins_are_used_only_for_the_ptx_they_came_from() {
        let ptx = ptx_source("ep_ll", None).unwrap();
        let h = format!("{:016x}\n", crate::pe::fnv(ptx.as_bytes()));
        assert!(cubin_matches(&ptx, &h));
        assert!(!cubin_matches(&format!("{ptx} "), &h));
        assert!(!cubin_matches(&ptx, ""));
        // The bundle script's FNV-1a (python) agrees with this one on a known input.
        assert_eq!(crate::pe::fnv(b"ep_ll"), fnv_reference(b"ep_ll"));
        assert_eq!(format!("{:016x}", crate::pe::fnv(b"")), "cbf29ce484222325");

        // prebuilt_cubin: the file for this compute capability, only with a matching
        // sidecar.
        let d = std::env::temp_dir().join(format!("rshmem-cubins-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let src = ".version 9.0\n// module m\n";
        std::fs::write(d.join("m.sm_90.cubin"), b"\x7fELF-cubin").unwrap();
        assert!(
            prebuilt_cubin("m", src, Some(&d), (9, 0)).is_none(),
            "no sidecar"
        );
        std::fs::write(
            d.join("m.sm_90.cubin.fnv"),
            format!("{:016x}\n", crate::pe::fnv(src.as_bytes())),
        )
        .unwrap();
        let (path, image) = prebuilt_cubin("m", src, Some(&d), (9, 0)).unwrap();
        assert_eq!(path, d.join("m.sm_90.cubin"));
        assert_eq!(image, b"\x7fELF-cubin");
        assert!(
            prebuilt_cubin("m", "other PTX", Some(&d), (9, 0)).is_none(),
            "stale"
        );
        assert!(
            prebuilt_cubin("m", src, Some(&d), (10, 0)).is_none(),
            "other GPU"
        );
        assert!(
            prebuilt_cubin("n", src, Some(&d), (9, 0)).is_none(),
            "other module"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// What the doctor reports per module: every reason a cubin is not used.
    #[test]
    fn module_sources_name_why_a_cubin_is_not_used() {
        let all = module_sources_in(None, (9, 0));
        assert_eq!(all.len(), EMBEDDED_PTX.len());
        assert!(
            all.iter().all(|(_, h)| h == "PTX (no RSHMEM_PTX_DIR)"),
            "{all:?}"
        );
        let d = std::env::temp_dir().join(format!("rshmem-sources-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let state = |m: &str| {
            module_sources_in(Some(&d), (9, 0))
                .into_iter()
                .find(|(n, _)| *n == m)
                .unwrap()
                .1
        };
        let c = d.join("rshmem_kernels.sm_90.cubin");
        assert_eq!(state("rshmem_kernels"), format!("PTX (no {})", c.display()));
        std::fs::write(&c, b"\x7fELF").unwrap();
        assert_eq!(
            state("rshmem_kernels"),
            format!("PTX ({} has no .fnv sidecar)", c.display())
        );
        std::fs::write(
            d.join("rshmem_kernels.sm_90.cubin.fnv"),
            "0000000000000000\n",
        )
        .unwrap();
        assert_eq!(
            state("rshmem_kernels"),
            format!("PTX ({} was made from other PTX)", c.display())
        );
        let ptx = ptx_source("rshmem_kernels", None).unwrap();
        std::fs::write(
            d.join("rshmem_kernels.sm_90.cubin.fnv"),
            format!("{:016x}\n", crate::pe::fnv(ptx.as_bytes())),
        )
        .unwrap();
        assert!(
            state("rshmem_kernels").starts_with(&format!(
                "PTX ({} is damaged: not a 64-bit little-endian ELF file",
                c.display()
            )),
            "{}",
            state("rshmem_kernels")
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The IBGDA producer rings a NIC's doorbell register with a system-scope fence and an
    /// MMIO store, and the soft HCA's doorbell word with a release store (queue.cuh,
    /// `ring`): every module that rings has both, and no MMIO store goes out without the
    /// fence right before it (ordering.cuh, `st_release_mmio_sys_u64`).
    #[test]
    fn doorbell_registers_get_a_fenced_mmio_store() {
        let mut ringing = Vec::new();
        for (name, ptx) in EMBEDDED_PTX {
            let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
            let mut mmio = 0;
            for (i, l) in lines.iter().enumerate() {
                if l.starts_with("st.mmio") || l.starts_with("ld.mmio") {
                    assert!(
                        l.starts_with("st.mmio.relaxed.sys.u64 "),
                        "{name}: unexpected MMIO access {l}"
                    );
                    assert_eq!(lines[i - 1], "fence.acq_rel.sys;", "{name}: line {}", i + 1);
                    mmio += 1;
                }
            }
            let release_u64 = lines
                .iter()
                .filter(|l| l.starts_with("st.release.sys.u64 "))
                .count();
            if mmio > 0 {
                assert!(
                    release_u64 >= mmio,
                    "{name}: {mmio} MMIO, {release_u64} release"
                );
                ringing.push(*name);
            }
        }
        ringing.sort();
        assert_eq!(
            ringing,
            [
                "ep_ll",
                "rshmem_device_bench",
                "rshmem_device_tests",
                "rshmem_ibgda_producer"
            ],
            "the modules built on rshmem/ibgda/queue.cuh"
        );
    }

    #[test]
    fn ptx_dir_overrides_the_embedded_copy() {
        let d = std::env::temp_dir().join(format!("rshmem-ptxdir-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("rshmem_kernels.ptx"), "// from disk\n").unwrap();
        assert_eq!(
            ptx_source("rshmem_kernels", Some(&d)).unwrap(),
            "// from disk\n"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn nvrtc_options_name_the_arch() {
        let o = nvrtc_options((9, 0), &["-lineinfo"]);
        assert_eq!(
            o,
            [
                "--gpu-architecture=compute_90",
                "--std=c++17",
                "-default-device",
                "-lineinfo"
            ]
        );
    }

    #[test]
    fn nvrtc_absent_is_an_error_not_a_panic() {
        if !crate::test_child::run_without_cuda(
            module_path!(),
            "nvrtc_absent_is_an_error_not_a_panic",
        ) {
            return;
        }
        let e = nvrtc_compile("__global__ void k() {}", "k.cu", (9, 0), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("libnvrtc") && e.contains("nvidia-cuda-nvrtc"),
            "{e}"
        );
    }
}
