//! Run-time loading of rdma-core: libibverbs.so.1 (the verbs) and libmlx5.so.1 (the mlx5
//! provider, which also exports mlx5dv), each looked up once into its generated symbol
//! table ([`VerbsLib`], [`Mlx5Lib`]) and kept in a `OnceLock` for the life of the process.
//!
//! The libraries are never unloaded: libibverbs keeps provider state (and, with a device
//! open, an async-event fd) that outlives any one caller.
//!
//! `RSHMEM_VERBS_LIB` / `RSHMEM_MLX5_LIB` name one file to load instead of the default
//! sonames (an rdma-core built from source, or testing the missing-library path).

use super::sys::{Mlx5Lib, VerbsLib};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Sonames of libibverbs tried, in order.
pub const VERBS_SONAMES: &[&str] = &["libibverbs.so.1"];
/// Debian package providing libibverbs.so.1.
pub const VERBS_PACKAGE: &str = "libibverbs1";
/// Sonames of the mlx5 provider (with mlx5dv).
pub const MLX5_SONAMES: &[&str] = &["libmlx5.so.1"];
/// Debian package providing libmlx5.so.1 (and the provider plugins libibverbs loads).
pub const MLX5_PACKAGE: &str = "ibverbs-providers";
/// Overrides [`VERBS_SONAMES`].
pub const VERBS_LIB_ENV: &str = "RSHMEM_VERBS_LIB";
/// Overrides [`MLX5_SONAMES`].
pub const MLX5_LIB_ENV: &str = "RSHMEM_MLX5_LIB";

struct Loaded<T> {
    lib: T,
    name: String,
}

/// Why loading failed, kept as strings so every caller gets its own [`Error`].
struct LoadFailure {
    library: String,
    package: &'static str,
    detail: String,
}

fn load<T>(
    env: &str,
    sonames: &[&str],
    package: &'static str,
    open: impl Fn(&str) -> std::result::Result<T, libloading::Error>,
) -> std::result::Result<Loaded<T>, LoadFailure> {
    let from_env = std::env::var_os(env).filter(|p| !p.is_empty());
    let names: Vec<String> = match &from_env {
        Some(p) => vec![p.to_string_lossy().into_owned()],
        None => sonames.iter().map(|s| s.to_string()).collect(),
    };
    let mut tried = Vec::new();
    for name in &names {
        match open(name) {
            Ok(lib) => {
                return Ok(Loaded {
                    lib,
                    name: name.clone(),
                })
            }
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    let how = if from_env.is_some() {
        format!(" (from {env})")
    } else {
        String::new()
    };
    Err(LoadFailure {
        library: names.join(", "),
        package,
        detail: format!("tried {}{how}", tried.join("; ")),
    })
}

fn verbs_loaded() -> &'static std::result::Result<Loaded<VerbsLib>, LoadFailure> {
    static LIB: OnceLock<std::result::Result<Loaded<VerbsLib>, LoadFailure>> = OnceLock::new();
    LIB.get_or_init(|| {
        load(VERBS_LIB_ENV, VERBS_SONAMES, VERBS_PACKAGE, |name| {
            // SAFETY: loading libibverbs runs its initialisers, which only set up its own
            // state. The generated table's field types are the header signatures of the
            // symbols (bindgen output from the same headers); the table owns the
            // `Library` that keeps the pointers valid. Missing symbols stay `Err` per
            // field and are reported when called.
            unsafe { VerbsLib::new(name) }
        })
    })
}

fn mlx5_loaded() -> &'static std::result::Result<Loaded<Mlx5Lib>, LoadFailure> {
    static LIB: OnceLock<std::result::Result<Loaded<Mlx5Lib>, LoadFailure>> = OnceLock::new();
    LIB.get_or_init(|| {
        load(MLX5_LIB_ENV, MLX5_SONAMES, MLX5_PACKAGE, |name| {
            // SAFETY: as for libibverbs above; libmlx5 depends on libibverbs and loads it.
            unsafe { Mlx5Lib::new(name) }
        })
    })
}

fn missing(f: &LoadFailure) -> Error {
    Error::LibraryMissing {
        library: f.library.clone(),
        package: f.package.to_string(),
        detail: f.detail.clone(),
    }
}

/// The loaded libibverbs table, or [`Error::LibraryMissing`] naming the files tried and
/// the package `libibverbs1`.
pub fn verbs() -> Result<&'static VerbsLib> {
    verbs_loaded().as_ref().map(|l| &l.lib).map_err(missing)
}

/// The loaded libmlx5 table, or [`Error::LibraryMissing`] naming `ibverbs-providers`.
pub fn mlx5() -> Result<&'static Mlx5Lib> {
    mlx5_loaded().as_ref().map(|l| &l.lib).map_err(missing)
}

/// The name libibverbs was loaded under (e.g. `libibverbs.so.1`).
pub fn verbs_name() -> Result<&'static str> {
    verbs_loaded()
        .as_ref()
        .map(|l| l.name.as_str())
        .map_err(missing)
}

/// The file the dynamic loader resolved libibverbs to, with symlinks followed
/// (`/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0`); None if unknown.
pub fn verbs_file() -> Option<PathBuf> {
    let lib = verbs().ok()?;
    let f = lib.ibv_get_device_list.as_ref().ok()?;
    let addr = *f as *const std::ffi::c_void;
    // SAFETY: dladdr only reads the loader's tables; `info` is a plain out-struct.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: addr is the address of a function in a loaded library; info is writable.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader, valid while the
    // library stays loaded (forever, see the module doc); copied at once.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    Some(std::fs::canonicalize(&path).unwrap_or_else(|_| PathBuf::from(path)))
}

/// The rdma-core release encoded in a resolved libibverbs file name:
/// `libibverbs.so.1.14.44.0` → `44.0` (rdma-core names its libraries
/// `lib<name>.so.<abi>.<abi-minor>.<release>`). None for a name without that shape.
pub fn rdma_core_version(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    let rest = name.split(".so.").nth(1)?;
    let parts: Vec<&str> = rest.split('.').collect();
    if parts.len() < 4 || !parts.iter().all(|p| p.parse::<u32>().is_ok()) {
        return None;
    }
    Some(parts[2..].join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_file_name() {
        let v = |s: &str| rdma_core_version(Path::new(s));
        assert_eq!(
            v("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0").as_deref(),
            Some("44.0")
        );
        assert_eq!(v("libmlx5.so.1.24.50.1").as_deref(), Some("50.1"));
        assert_eq!(v("libibverbs.so.1"), None);
        assert_eq!(v("libibverbs.so.1.14.x.0"), None);
        assert_eq!(v("/opt/lib/libibverbs.so"), None);
    }

    #[test]
    fn missing_library_error_names_package() {
        let f = load::<()>(
            "RSHMEM_TEST_NO_SUCH_ENV",
            &["librshmem-nope.so.1"],
            "pkg-x",
            |n| {
                // SAFETY: the file does not exist; loading fails without running anything.
                unsafe { libloading::Library::new(n) }.map(|_| ())
            },
        );
        let e = missing(f.as_ref().err().unwrap()).to_string();
        assert!(
            e.starts_with("librshmem-nope.so.1 could not be loaded (tried librshmem-nope.so.1: "),
            "{e}"
        );
        assert!(e.ends_with("; install pkg-x"), "{e}");
    }
}
