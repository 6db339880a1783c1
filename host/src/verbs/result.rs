//! Thin `Result` wrappers over the generated tables: a missing symbol becomes
//! [`Error::LibraryMissing`], a failing call becomes [`Error::Verbs`] naming the verb and
//! its errno with the strerror text and what rshmem was doing.

use crate::error::{Error, Result};

/// The function pointer of `sym`, or [`Error::LibraryMissing`] naming `call`, the library
/// and its package.
pub(crate) fn sym<F: Copy>(
    sym: &std::result::Result<F, libloading::Error>,
    call: &'static str,
    library: &str,
    package: &str,
) -> Result<F> {
    sym.as_ref().copied().map_err(|e| Error::LibraryMissing {
        library: library.to_string(),
        package: package.to_string(),
        detail: format!("symbol {call} missing: {e}"),
    })
}

/// Looks up a libibverbs symbol of the loaded table.
macro_rules! verbs_fn {
    ($name:ident) => {
        $crate::verbs::loader::verbs().and_then(|l| {
            $crate::verbs::result::sym(
                &l.$name,
                stringify!($name),
                "libibverbs.so.1",
                $crate::verbs::loader::VERBS_PACKAGE,
            )
        })
    };
}
/// Looks up an mlx5dv symbol of the loaded libmlx5 table.
macro_rules! mlx5_fn {
    ($name:ident) => {
        $crate::verbs::loader::mlx5().and_then(|l| {
            $crate::verbs::result::sym(
                &l.$name,
                stringify!($name),
                "libmlx5.so.1",
                $crate::verbs::loader::MLX5_PACKAGE,
            )
        })
    };
}
pub(crate) use {mlx5_fn, verbs_fn};

/// The errno a verb reported. rdma-core calls that return `int` return 0 on success and
/// a positive errno on failure (a few older paths return -1 or -errno with errno set);
/// `last` is the thread's errno read right after the call.
pub fn errno_of(rc: i32, last: i32) -> i32 {
    match rc {
        r if r > 0 => r,
        -1 => last,
        r if r < 0 => -r,
        _ => 0,
    }
}

/// `strerror(errno)` as a String.
pub fn strerror(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    // std appends " (os error N)"; the errno is printed separately.
    match s.rfind(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// The [`Error::Verbs`] for `call` failing with `errno` while doing `what`.
pub fn verbs_error(call: &'static str, errno: i32, what: &str) -> Error {
    let mut s = strerror(errno);
    // ENOMEM from a verb that pins host memory is most often the locked-memory limit
    // (a dma-buf registration of GPU memory is not charged to it).
    let pins_host = matches!(
        call,
        "ibv_create_cq" | "ibv_create_qp" | "ibv_create_qp_ex" | "ibv_reg_mr" | "ibv_reg_mr_iova2"
    );
    if errno == libc::ENOMEM && pins_host {
        if let Some(h) = super::memlock::enomem_hint() {
            s = format!("{s}: {h}");
        }
    }
    Error::Verbs {
        call,
        errno,
        detail: if what.is_empty() {
            s
        } else {
            format!("{s} ({what})")
        },
    }
}

/// Checks the `int` result of `call`: Ok for 0, else [`Error::Verbs`].
pub fn check_rc(call: &'static str, rc: i32, what: &str) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let last = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    Err(verbs_error(call, errno_of(rc, last), what))
}

/// Checks the pointer result of `call`: Ok for non-null, else [`Error::Verbs`] with the
/// errno the call left.
pub fn check_ptr<T>(call: &'static str, p: *mut T, what: &str) -> Result<*mut T> {
    if !p.is_null() {
        return Ok(p);
    }
    let last = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    Err(verbs_error(call, last, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_conventions() {
        assert_eq!(errno_of(0, 5), 0);
        assert_eq!(errno_of(libc::EINVAL, 0), libc::EINVAL);
        assert_eq!(errno_of(-1, libc::EPERM), libc::EPERM);
        assert_eq!(errno_of(-libc::ENOMEM, 0), libc::ENOMEM);
    }

    #[test]
    fn error_names_verb_errno_and_strerror() {
        let e = check_rc("ibv_modify_qp", libc::EINVAL, "QP 0x12 RESET->INIT").unwrap_err();
        assert_eq!(
            e.to_string(),
            "rdma-core ibv_modify_qp failed: Invalid argument (QP 0x12 RESET->INIT) (errno 22)"
        );
        assert!(check_rc("ibv_dealloc_pd", 0, "").is_ok());
        let p: *mut u8 = std::ptr::null_mut();
        // errno is whatever the thread left; the call name is what matters here.
        let e = check_ptr("ibv_alloc_pd", p, "mlx5_0").unwrap_err();
        assert!(
            matches!(
                e,
                Error::Verbs {
                    call: "ibv_alloc_pd",
                    ..
                }
            ),
            "{e}"
        );
        let mut x = 1u8;
        assert_eq!(
            check_ptr("ibv_alloc_pd", &mut x as *mut u8, "").unwrap(),
            &mut x as *mut u8
        );
    }
}
