//! Loading the CUDA driver and NVRTC through cudarc (dynamic loading), and turning their
//! status codes into [`Error`]s.
//!
//! cudarc loads `libcuda.so.1` / `libnvrtc.so.*` lazily and *panics* when the library or
//! a symbol is missing. So every CUDA path in rshmem goes through [`driver`] (or
//! [`nvrtc`]) first: it checks that the library opens and that every symbol rshmem calls
//! is exported, and returns an error naming the library and the package otherwise. Only
//! after that succeeds are cudarc's `sys` functions called.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc_sys;
use std::ffi::CStr;
use std::sync::OnceLock;

/// What to install when libcuda is absent.
pub const DRIVER_PACKAGE: &str = "the NVIDIA driver (it provides libcuda.so.1)";
/// What to install when NVRTC is absent.
pub const NVRTC_PACKAGE: &str = "the PyPI wheel nvidia-cuda-nvrtc (==13.0.*, then put its \
     nvidia/cu13/lib on LD_LIBRARY_PATH or point RSHMEM_NVRTC_LIB at libnvrtc.so.13) or the \
     CUDA 13 toolkit";

/// Every driver entry point rshmem calls (cudarc's `sys` names, which are the exported
/// symbol names). Checked up front so that a driver too old to export one is an error, not
/// a panic inside cudarc.
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDeviceCanAccessPeer",
    "cuDeviceGetP2PAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetGlobal_v2",
    "cuModuleGetFunction",
    "cuModuleGetFunctionCount",
    "cuModuleEnumerateFunctions",
    "cuFuncLoad",
    "cuLaunchKernel",
    "cuLaunchCooperativeKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    // EP: how much of a caller's tensor is mapped (gpu/ep.rs).
    "cuMemGetAddressRange_v2",
    "cuMemHostAlloc",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8_v2",
    "cuMemsetD8Async",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemRetainAllocationHandle",
    // RSHMEM_TRANSPORT=ibgda: a dma-buf of the GPU heap for the NIC (gpu/nic.rs).
    "cuMemGetHandleForAddressRange",
    // EP: CUDA graphs of LL calls (gpu/ep.rs) and the bench's start gate (gpu/ep_bench.rs).
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuEventQuery",
];

/// NVRTC entry points rshmem calls.
pub const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcDestroyProgram",
    "nvrtcGetErrorString",
];

/// Names the driver library file to load instead of the linker's lookup (as NVSHMEM's
/// `NVSHMEM_CUDA_PATH`): a driver outside the loader path, CUDA's forward-compatibility
/// `libcuda.so.1`, or, in tests, a library that is not there.
pub const CUDA_LIB_ENV: &str = "RSHMEM_CUDA_LIB";

/// What to do when `RSHMEM_CUDA_LIB` is the problem (after "install ").
pub const CHOSEN_ADVICE: &str =
    "the NVIDIA driver and point RSHMEM_CUDA_LIB at its libcuda.so.1, or unset RSHMEM_CUDA_LIB";

/// Why the driver gate failed (kept as data so every caller gets the same error).
#[derive(Clone, Debug)]
enum Refusal {
    /// The library is absent or too old.
    Library(String),
    /// `RSHMEM_CUDA_LIB` names a file that cannot be the driver cudarc uses.
    Chosen(String),
    /// `cuInit(0)` failed.
    Init(String),
}

/// The driver names cudarc tries, in its order (the first that loads is the one it uses).
fn cudarc_driver_names() -> Vec<String> {
    ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
        .collect()
}

/// Loads the file `RSHMEM_CUDA_LIB` names (Ok(None) when unset) and checks that it is the
/// library cudarc will use: cudarc opens the first of [`cudarc_driver_names`] that loads,
/// and a name resolves to an already loaded library only through its soname
/// (libcuda.so.1), so a `libcuda.so` or `libcuda.so.13` elsewhere on the loader path
/// would win. Ok(Some(path)) when it is the one. Handles are leaked: drivers stay loaded.
/// The doctor calls this too, so both report the same.
pub fn load_chosen_driver() -> std::result::Result<Option<String>, String> {
    let Some(path) = std::env::var_os(CUDA_LIB_ENV).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let shown = std::path::Path::new(&path).display().to_string();
    // A bare name is the loader's to search (as dlopen does); a path must exist.
    if shown.contains('/') && !std::path::Path::new(&path).exists() {
        return Err(format!("libcuda.so.1 not found at {CUDA_LIB_ENV}={shown}"));
    }
    // SAFETY: loading the NVIDIA driver library runs its initialisers, which only set up
    // the driver's own state.
    let lib = unsafe { libloading::Library::new(&path) }
        .map_err(|e| format!("{CUDA_LIB_ENV}={shown} could not be loaded ({e})"))?;
    // SAFETY: a symbol lookup; the address is only compared, never called.
    let init = unsafe { lib.get::<*const ()>(b"cuInit") }
        .map(|s| *s)
        .map_err(|_| format!("{CUDA_LIB_ENV}={shown} lacks cuInit: it is not a CUDA driver"))?;
    std::mem::forget(lib);
    for name in cudarc_driver_names() {
        // SAFETY: as above (a driver library, or the one already loaded).
        let Ok(found) = (unsafe { libloading::Library::new(&name) }) else {
            continue;
        };
        // SAFETY: a symbol lookup; the address is only compared.
        let same = unsafe { found.get::<*const ()>(b"cuInit") }
            .map(|s| *s)
            .ok()
            == Some(init);
        std::mem::forget(found);
        if same {
            return Ok(Some(shown));
        }
        return Err(format!(
            "{CUDA_LIB_ENV}={shown} is not the library the loader finds first as {name}, \
             which rshmem's CUDA layer opens (it tries libcuda.so, libcuda.so.13, ... and \
             then libcuda.so.1): put the folder of {CUDA_LIB_ENV} first on LD_LIBRARY_PATH"
        ));
    }
    Err(format!(
        "{CUDA_LIB_ENV}={shown} loads, but no libcuda name resolves to it: its soname must \
         be libcuda.so.1"
    ))
}

/// The driver library is loaded, exports every symbol in [`DRIVER_SYMBOLS`] and `cuInit(0)`
/// succeeded. Checked once per process; the error is returned to every caller.
pub fn driver() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), Refusal>> = OnceLock::new();
    READY
        .get_or_init(|| {
            load_chosen_driver().map_err(Refusal::Chosen)?;
            // SAFETY: is_culib_present only tries to dlopen candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err(Refusal::Library("libcuda.so.1 not found".into()));
            }
            // SAFETY: present (checked above), so culib() does not panic; get() only looks
            // a symbol up.
            let lib = unsafe { sys::culib() };
            for s in DRIVER_SYMBOLS {
                // SAFETY: looking up a symbol address; it is not called here.
                if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                    return Err(Refusal::Library(format!(
                        "libcuda.so.1 lacks {s}: the driver is too old (rshmem needs CUDA 13.0, driver 580 or newer)"
                    )));
                }
            }
            // SAFETY: every symbol is present; cuInit(0) is the documented first call.
            let rc = unsafe { sys::cuInit(0) };
            if rc != sys::CUresult::CUDA_SUCCESS {
                return Err(Refusal::Init(format!("cuInit failed: {}", result_name(rc))));
            }
            Ok(())
        })
        .clone()
        .map_err(|refusal| match refusal {
            Refusal::Library(detail) => Error::LibraryMissing {
                library: "libcuda.so.1".into(),
                package: DRIVER_PACKAGE.into(),
                // The package names the cure; the detail says only what was found.
                detail,
            },
            Refusal::Chosen(detail) => Error::LibraryMissing {
                library: "libcuda.so.1".into(),
                package: CHOSEN_ADVICE.into(),
                detail,
            },
            Refusal::Init(detail) => Error::Cuda {
                call: "cuInit",
                detail,
            },
        })
}

/// `libnvrtc-builtins.so.*` files next to the NVRTC library `lib` (not the `.alt`
/// variants), sorted.
fn nvrtc_builtins_beside(lib: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Some(dir) = lib.parent() else {
        return Vec::new();
    };
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
        })
        .collect();
    v.sort();
    v
}

/// NVRTC is loaded and exports every symbol in [`NVRTC_SYMBOLS`]. `RSHMEM_NVRTC_LIB`, if
/// set, names the library file to load first (the PyPI wheel installs it off the linker's
/// path); cudarc's own lookup then finds it by soname.
pub fn nvrtc() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            // A path: read as bytes (a name that is not UTF-8 is still a file name).
            if let Some(path) = std::env::var_os("RSHMEM_NVRTC_LIB") {
                let path = std::path::PathBuf::from(path);
                // NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by name when it
                // compiles; off the linker's path (the PyPI wheel) that fails with
                // NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. A library already loaded under
                // that soname satisfies the lookup, so load it from the same folder first.
                for b in nvrtc_builtins_beside(&path) {
                    // SAFETY: as below: NVRTC's builtins library has benign initialisers;
                    // leaked so that it stays loaded.
                    match unsafe { libloading::Library::new(&b) } {
                        Ok(l) => std::mem::forget(l),
                        Err(e) => return Err(format!("{} could not be loaded: {e}", b.display())),
                    }
                }
                // SAFETY: loading a shared library runs its initialisers; NVRTC's are
                // benign. The handle is leaked so that the library stays loaded.
                match unsafe { libloading::Library::new(&path) } {
                    Ok(l) => std::mem::forget(l),
                    Err(e) => {
                        return Err(format!(
                            "RSHMEM_NVRTC_LIB={} could not be loaded: {e}",
                            path.display()
                        ))
                    }
                }
            }
            // SAFETY: only tries to dlopen candidate names.
            if !unsafe { nvrtc_sys::is_culib_present() } {
                return Err("libnvrtc.so not found".into());
            }
            // SAFETY: present, so culib() does not panic; get() only looks symbols up.
            let lib = unsafe { nvrtc_sys::culib() };
            for s in NVRTC_SYMBOLS {
                // SAFETY: a symbol lookup.
                if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                    return Err(format!("libnvrtc lacks {s}"));
                }
            }
            Ok(())
        })
        .clone()
        .map_err(|detail| Error::LibraryMissing {
            library: "libnvrtc.so (NVRTC)".into(),
            package: NVRTC_PACKAGE.into(),
            detail,
        })
}

/// `CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered`.
pub fn result_name(rc: sys::CUresult) -> String {
    let code = rc as u32;
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only called once the driver is loaded (results come from driver calls);
    // the out-pointers are valid; on success they point at static strings.
    let (n, t) = unsafe {
        (
            sys::cuGetErrorName(rc, &mut name),
            sys::cuGetErrorString(rc, &mut text),
        )
    };
    let n = if n == sys::CUresult::CUDA_SUCCESS && !name.is_null() {
        // SAFETY: static NUL-terminated string from the driver.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{rc:?}")
    };
    if t == sys::CUresult::CUDA_SUCCESS && !text.is_null() {
        // SAFETY: as above.
        let t = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        format!("{n} ({code}): {t}")
    } else {
        format!("{n} ({code})")
    }
}

/// Ok when `rc` is CUDA_SUCCESS, else an [`Error::Cuda`] naming `call` and what it did.
pub fn ck(rc: sys::CUresult, call: &'static str, what: impl FnOnce() -> String) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda {
            call,
            detail: format!("{} while {}", result_name(rc), what()),
        })
    }
}

/// Whether device memory `[p, p + len)` is mapped, as far as `cuMemGetAddressRange`
/// sees: `Err(at)` names the first address from `p` on that no allocation covers. The
/// allocations may follow each other (a VMM range of several physical chunks, where the
/// driver answers one chunk at a time, as PyTorch's expandable segments are). `Ok` too
/// when the driver does not know `p` itself (memory it cannot describe, such as managed
/// or host memory on some drivers: not checked) or after 1024 chunks. `Ok(n)`: the
/// chunks looked up (0: not checked). Needs the context current.
pub fn mapped_through(p: u64, len: u64) -> std::result::Result<u32, u64> {
    let Some(end) = p.checked_add(len) else {
        return Err(p);
    };
    let mut at = p;
    for step in 0..1024u32 {
        if at >= end {
            return Ok(step);
        }
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers; the call only reads the driver's address map.
        let rc = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, at) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return if step == 0 { Ok(0) } else { Err(at) };
        }
        let stop = base.saturating_add(size as u64);
        if stop <= at {
            return Ok(0); // an answer that does not cover `at`: not checked
        }
        at = stop;
    }
    Ok(0)
}

/// Waits until the synchronous copies and memsets issued so far in the current context
/// have landed. `cuMemcpyHtoD` from pageable memory may return before its DMA completes,
/// and `cuMemsetD8` on device memory is asynchronous to the host (CUDA's "API
/// synchronization behavior"); both run on the legacy default stream, which the PEs'
/// non-blocking streams do not wait for, so without this a kernel enqueued next, or a
/// peer that reads the memory after a host barrier, could see the old bytes. Only the
/// legacy stream is waited for, never the PEs' streams (a context-wide sync could wait
/// for a kernel that waits for this PE).
pub fn settle_sync_copies(what: impl FnOnce() -> String) -> Result<()> {
    // SAFETY: the null stream is the current context's legacy default stream.
    let rc = unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) };
    ck(rc, "cuStreamSynchronize", || {
        format!("waiting for the upload of {} to land", what())
    })
}

/// The text of an NVRTC status.
pub fn nvrtc_result_name(rc: nvrtc_sys::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a static string for any status; NVRTC is loaded
    // (statuses only come from NVRTC calls).
    let p = unsafe { nvrtc_sys::nvrtcGetErrorString(rc) };
    if p.is_null() {
        format!("{rc:?}")
    } else {
        // SAFETY: static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    /// Every driver function the sources call through cudarc's `sys` is in
    /// DRIVER_SYMBOLS (checked up front), so a driver that lacks one is an error naming it
    /// rather than a panic inside cudarc at the first call.
    #[test]
    fn every_called_driver_function_is_checked_up_front() {
        fn scan(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    scan(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (k, _) in text.match_indices("sys::cu") {
                        let name: String = text[k + 5..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        let called = text[k + 5 + name.len()..].starts_with('(');
                        if called && !name.starts_with("culib") {
                            out.push((name, p.display().to_string()));
                        }
                    }
                }
            }
        }
        let mut used = Vec::new();
        scan(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut used,
        );
        assert!(used.len() > 50, "the scan found only {} calls", used.len());
        let missing: Vec<_> = used
            .iter()
            .filter(|(n, _)| !DRIVER_SYMBOLS.contains(&n.as_str()))
            .collect();
        assert!(missing.is_empty(), "not in DRIVER_SYMBOLS: {missing:?}");
    }

    use super::*;

    use crate::test_child::{in_child, run_in_child, run_without_cuda};
    use std::path::{Path, PathBuf};

    /// No driver (RSHMEM_CUDA_LIB at a file that is not there, in a child process, so the
    /// same on every machine): the gate says so, naming the library, the variable and the
    /// package, and does not panic.
    #[test]
    fn absent_driver_is_an_error_naming_the_library() {
        if !run_without_cuda(
            module_path!(),
            "absent_driver_is_an_error_naming_the_library",
        ) {
            return;
        }
        let s = driver().unwrap_err().to_string();
        assert_eq!(
            s,
            "libcuda.so.1 could not be loaded (libcuda.so.1 not found at \
             RSHMEM_CUDA_LIB=/nonexistent/libcuda.so.1); install the NVIDIA driver and point \
             RSHMEM_CUDA_LIB at its libcuda.so.1, or unset RSHMEM_CUDA_LIB"
        );
        // Every caller gets the same error.
        assert_eq!(driver().unwrap_err().to_string(), s);
    }

    #[test]
    fn absent_nvrtc_is_an_error_naming_the_wheel() {
        if !run_without_cuda(module_path!(), "absent_nvrtc_is_an_error_naming_the_wheel") {
            return;
        }
        let s = nvrtc().unwrap_err().to_string();
        assert!(
            s.contains("RSHMEM_NVRTC_LIB=/nonexistent/libnvrtc.so.13 could not be loaded"),
            "{s}"
        );
        assert!(s.contains("nvidia-cuda-nvrtc"), "{s}");
        assert!(s.contains("CUDA 13 toolkit"), "{s}");
    }

    /// Stand-in drivers for the RSHMEM_CUDA_LIB tests live beside the test binary, so the
    /// parent (which builds them) and its child (which loads them) name the same files.
    fn fakes(tag: &str) -> PathBuf {
        let exe = std::env::current_exe().unwrap();
        exe.parent().unwrap().join(format!("fake-cuda-{tag}"))
    }

    /// Builds `dir`/`file`: a library with soname libcuda.so.1 that exports every entry
    /// point of DRIVER_SYMBOLS (returning CUDA_SUCCESS) except `skip`.
    fn build_fake(dir: &Path, file: &str, skip: &[&str]) -> PathBuf {
        build_fake_named(dir, file, skip, "libcuda.so.1")
    }

    fn build_fake_named(dir: &Path, file: &str, skip: &[&str], soname: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let mut c = String::new();
        for s in DRIVER_SYMBOLS.iter().filter(|s| !skip.contains(s)) {
            c.push_str(&format!("int {s}(void) {{ return 0; }}\n"));
        }
        let src = dir.join(format!("{file}.c"));
        std::fs::write(&src, c).unwrap();
        let out = dir.join(file);
        let o = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
            .arg(&out)
            .arg(&src)
            .output()
            .expect("cc (the tests need a C compiler)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    }

    /// The gate's refusal with `RSHMEM_CUDA_LIB=path`, in a child process: None in the
    /// parent (which re-ran `test` in the child and saw it pass), the error text in the
    /// child.
    fn refusal_in_child(test: &str, path: &Path) -> Option<String> {
        let p = path.to_str().unwrap();
        if !run_in_child(module_path!(), test, &[("RSHMEM_CUDA_LIB", p)]) {
            return None;
        }
        Some(driver().unwrap_err().to_string())
    }

    /// `dir` in front of the parent's loader path (the test binary may need it); in the
    /// child, the path the parent gave it.
    fn ld_path_with(dir: &Path) -> String {
        let now = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        match (in_child(), now.is_empty()) {
            (true, _) => now,
            (false, true) => dir.display().to_string(),
            (false, false) => format!("{}:{now}", dir.display()),
        }
    }

    /// RSHMEM_CUDA_LIB names the driver file: the gate loads it, cudarc uses it (found by
    /// soname; libcuda.so beside it on LD_LIBRARY_PATH is the same file) and cuInit runs.
    #[test]
    fn the_chosen_driver_file_is_the_one_used() {
        let dir = fakes("chosen");
        if !in_child() {
            let lib = build_fake(&dir, "libcuda.so.1", &[]);
            let _ = std::fs::remove_file(dir.join("libcuda.so"));
            std::os::unix::fs::symlink(&lib, dir.join("libcuda.so")).unwrap();
        }
        let lib = dir.join("libcuda.so.1");
        let ld = ld_path_with(&dir);
        if !run_in_child(
            module_path!(),
            "the_chosen_driver_file_is_the_one_used",
            &[
                ("RSHMEM_CUDA_LIB", lib.to_str().unwrap()),
                ("LD_LIBRARY_PATH", &ld),
            ],
        ) {
            return;
        }
        driver().unwrap();
    }

    /// RSHMEM_CUDA_LIB names one library but cudarc's lookup (libcuda.so first) finds
    /// another: refused, saying what to do, instead of running with two drivers.
    #[test]
    fn a_different_driver_found_first_is_refused() {
        let dir = fakes("other");
        if !in_child() {
            build_fake(&dir.join("chosen"), "libcuda.so.1", &[]);
            build_fake(&dir.join("found"), "libcuda.so", &[]);
        }
        let chosen = dir.join("chosen/libcuda.so.1");
        let found = dir.join("found");
        let ld = ld_path_with(&found);
        if !run_in_child(
            module_path!(),
            "a_different_driver_found_first_is_refused",
            &[
                ("RSHMEM_CUDA_LIB", chosen.to_str().unwrap()),
                ("LD_LIBRARY_PATH", &ld),
            ],
        ) {
            return;
        }
        let s = driver().unwrap_err().to_string();
        assert_eq!(
            s,
            format!(
                "libcuda.so.1 could not be loaded (RSHMEM_CUDA_LIB={} is not the library the \
                 loader finds first as libcuda.so, which rshmem's CUDA layer opens (it tries \
                 libcuda.so, libcuda.so.13, ... and then libcuda.so.1): put the folder of \
                 RSHMEM_CUDA_LIB first on LD_LIBRARY_PATH); install {CHOSEN_ADVICE}",
                chosen.display()
            )
        );
    }

    /// RSHMEM_CUDA_LIB at a file that is not a library.
    #[test]
    fn a_chosen_file_that_is_not_a_library_is_refused() {
        let path = fakes("text").join("libcuda.so.1");
        if !in_child() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "not an ELF file\n").unwrap();
        }
        let Some(s) = refusal_in_child("a_chosen_file_that_is_not_a_library_is_refused", &path)
        else {
            return;
        };
        let p = path.display();
        assert!(
            s.contains(&format!("RSHMEM_CUDA_LIB={p} could not be loaded (")),
            "{s}"
        );
        assert!(s.contains("install the NVIDIA driver"), "{s}");
    }

    /// RSHMEM_CUDA_LIB at a library that has no cuInit.
    #[test]
    fn a_chosen_library_that_is_not_a_driver_is_refused() {
        let dir = fakes("noinit");
        if !in_child() {
            build_fake(&dir, "libcuda.so.1", &["cuInit"]);
        }
        let path = dir.join("libcuda.so.1");
        let Some(s) = refusal_in_child("a_chosen_library_that_is_not_a_driver_is_refused", &path)
        else {
            return;
        };
        let p = path.display();
        assert!(
            s.contains(&format!(
                "RSHMEM_CUDA_LIB={p} lacks cuInit: it is not a CUDA driver"
            )),
            "{s}"
        );
    }

    /// A driver file whose soname is not libcuda.so.1: no name cudarc tries reaches it.
    #[test]
    fn a_chosen_library_under_another_soname_is_refused() {
        let dir = fakes("soname");
        if !in_child() {
            build_fake_named(&dir, "libcuda.so.1", &[], "libnotcuda.so.1");
        }
        let path = dir.join("libcuda.so.1");
        // Refused either way: where no driver is installed no name resolves to the file;
        // where one is, its libcuda.so is found first (nothing can hide it from dlopen).
        let Some(s) = refusal_in_child("a_chosen_library_under_another_soname_is_refused", &path)
        else {
            return;
        };
        let p = path.display();
        let no_name = format!(
            "RSHMEM_CUDA_LIB={p} loads, but no libcuda name resolves to it: its soname must be \
             libcuda.so.1"
        );
        let other = format!("RSHMEM_CUDA_LIB={p} is not the library the loader finds first as");
        assert!(s.contains(&no_name) || s.contains(&other), "{s}");
    }
}
