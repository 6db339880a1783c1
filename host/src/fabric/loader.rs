//! Run-time loading of libfabric: the exported functions (`fi_getinfo`, `fi_fabric`, ...)
//! looked up once into the generated [`FabricLib`] table, kept in a `OnceLock` for the
//! life of the process.
//!
//! The library is never unloaded: libfabric providers start progress threads that run
//! code inside it, so `dlclose` could pull code out from under them.
//!
//! `RSHMEM_FABRIC_LIB=/path/to/libfabric.so.1` replaces the default names (for a libfabric
//! built from source, or to test the missing-library path).

use super::sys::FabricLib;
use crate::error::{Error, Result};
use std::sync::OnceLock;

/// The names tried, in order, when `RSHMEM_FABRIC_LIB` is not set.
pub const SONAMES: &[&str] = &["libfabric.so.1", "libfabric.so"];
/// The Debian package that provides [`SONAMES`].
pub const PACKAGE: &str = "libfabric1";
/// Environment variable naming one library file to load instead of [`SONAMES`].
pub const LIB_ENV: &str = "RSHMEM_FABRIC_LIB";

struct Loaded {
    lib: FabricLib,
    name: String,
}

/// Why loading failed, kept as strings so every caller gets its own [`Error`].
struct LoadFailure {
    library: String,
    detail: String,
}

fn loaded() -> &'static std::result::Result<Loaded, LoadFailure> {
    static LIB: OnceLock<std::result::Result<Loaded, LoadFailure>> = OnceLock::new();
    LIB.get_or_init(|| {
        let names: Vec<String> = match std::env::var_os(LIB_ENV) {
            Some(p) if !p.is_empty() => vec![p.to_string_lossy().into_owned()],
            _ => SONAMES.iter().map(|s| s.to_string()).collect(),
        };
        let mut tried = Vec::new();
        for name in &names {
            // SAFETY: loading libfabric runs its initialisers, which only set up its own
            // state. The generated table's field types are the header signatures of
            // these symbols (bindgen output from the same headers), and the table keeps
            // the `Library` that makes the pointers valid.
            match unsafe { FabricLib::new(name) } {
                Ok(lib) => {
                    return Ok(Loaded {
                        lib,
                        name: name.clone(),
                    })
                }
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        let how = if std::env::var_os(LIB_ENV).is_some_and(|p| !p.is_empty()) {
            format!(" (from {LIB_ENV})")
        } else {
            String::new()
        };
        Err(LoadFailure {
            library: names.join(", "),
            detail: format!("tried {}{how}", tried.join("; ")),
        })
    })
}

/// The loaded libfabric symbol table, or [`Error::LibraryMissing`] naming every file
/// tried and the package `libfabric1`.
pub fn lib() -> Result<&'static FabricLib> {
    loaded().as_ref().map(|l| &l.lib).map_err(missing)
}

/// The name libfabric was loaded under (e.g. `libfabric.so.1`).
pub fn loaded_name() -> Result<&'static str> {
    loaded().as_ref().map(|l| l.name.as_str()).map_err(missing)
}

fn missing(f: &LoadFailure) -> Error {
    Error::LibraryMissing {
        library: f.library.clone(),
        package: PACKAGE.to_string(),
        detail: f.detail.clone(),
    }
}
