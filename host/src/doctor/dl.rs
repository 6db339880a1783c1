//! Run-time loading of C libraries for the doctor: open a library by its soname, look up
//! symbols, and turn failures into [`Error::LibraryMissing`] statements that name the
//! library and the package providing it.
//!
//! Libraries opened here are kept for the life of the process (callers keep them in a
//! `OnceLock`): libcuda and libfabric start threads that run code inside the library, so
//! unloading them with `dlclose` could pull code out from under those threads.

use crate::error::Error;
use libloading::Library;

/// A library opened by [`open`], with the soname that succeeded.
#[derive(Debug)]
pub(super) struct Opened {
    pub lib: Library,
    pub soname: &'static str,
}

/// Opens the first of `sonames` that loads. On failure the error names the first soname
/// (the one rshmem prefers) and `package`, with the loader's message for it.
pub(super) fn open(sonames: &[&'static str], package: &str) -> Result<Opened, Error> {
    let mut first_error = None;
    for &soname in sonames {
        // SAFETY: loading a library runs its initialisers. The libraries opened here
        // (libcuda, libibverbs, libmlx5, libfabric) are system libraries whose
        // initialisers only set up their own state; none of them is unsound to load.
        match unsafe { Library::new(soname) } {
            Ok(lib) => return Ok(Opened { lib, soname }),
            Err(e) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    Err(Error::LibraryMissing {
        library: sonames.first().copied().unwrap_or("").to_string(),
        package: package.to_string(),
        detail: first_error.unwrap_or_else(|| "no library name given".to_string()),
    })
}

/// Looks up `name` in `opened` as a value of type `T` (a function pointer type).
///
/// # Safety
/// `T` must be the exact C type of the symbol (for functions: an `unsafe extern "C" fn`
/// with the C signature), and the returned value must not be used after `opened.lib`
/// is dropped.
pub(super) unsafe fn symbol<T: Copy>(
    opened: &Opened,
    name: &str,
    package: &str,
) -> Result<T, Error> {
    let mut cname = Vec::with_capacity(name.len() + 1);
    cname.extend_from_slice(name.as_bytes());
    cname.push(0);
    // SAFETY: the caller guarantees `T` is the symbol's type and that the value does not
    // outlive the library.
    match unsafe { opened.lib.get::<T>(&cname) } {
        Ok(sym) => Ok(*sym),
        Err(e) => Err(Error::LibraryMissing {
            library: opened.soname.to_string(),
            package: package.to_string(),
            detail: format!("symbol {name} missing: {e}"),
        }),
    }
}

/// The one-line statement the doctor prints for a library that did not load:
/// `absent: libcuda.so.1 not found (install the NVIDIA driver)`.
pub(super) fn absent_statement(err: &Error) -> String {
    match err {
        Error::LibraryMissing {
            library,
            package,
            detail,
        } => {
            if detail.contains("No such file") {
                format!("absent: {library} not found (install {package})")
            } else {
                format!("absent: {library} could not be loaded: {detail} (install {package})")
            }
        }
        other => format!("absent: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_library_and_package() {
        let err = open(&["librshmem-does-not-exist.so.1"], "no-such-package").unwrap_err();
        assert_eq!(
            absent_statement(&err),
            "absent: librshmem-does-not-exist.so.1 not found (install no-such-package)"
        );
    }

    #[test]
    fn falls_back_to_later_names() {
        let opened = open(&["librshmem-does-not-exist.so.1", "libc.so.6"], "libc6").unwrap();
        assert_eq!(opened.soname, "libc.so.6");
        // SAFETY: getpid has this exact signature in <unistd.h>; used while `opened` lives.
        let getpid: unsafe extern "C" fn() -> libc::pid_t =
            unsafe { symbol(&opened, "getpid", "libc6") }.unwrap();
        // SAFETY: getpid has no preconditions.
        assert_eq!(unsafe { getpid() } as u32, std::process::id());
        // SAFETY: never called; only the lookup failure is checked.
        let missing: Result<unsafe extern "C" fn(), _> =
            unsafe { symbol(&opened, "rshmem_no_such_symbol", "libc6") };
        let msg = missing.unwrap_err().to_string();
        assert!(
            msg.contains("rshmem_no_such_symbol") && msg.contains("libc.so.6"),
            "{msg}"
        );
    }
}
