//! The libfabric section of the doctor: library version and the providers that offer
//! RDM endpoints with RMA and atomics — what the proxy transport (soft HCA) runs over.

use super::dl::{self, Opened};
use crate::error::Error;
use serde::Serialize;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

const SONAMES: &[&str] = &["libfabric.so.1"];
const PACKAGE: &str = "libfabric1";

// Minimal prefixes of the libfabric structs, field order copied from rdma/fabric.h
// (libfabric 1.17, stable since 1.5). Only the fields up to the last one we read are
// declared; these structs are always allocated by libfabric (fi_dupinfo / fi_getinfo),
// never by us, so the missing tails do not matter. `tests::layout_matches_fabric_h`
// checks every offset against the real header.

/// `struct fi_info` (prefix, up to `fabric_attr`).
#[repr(C)]
struct FiInfo {
    next: *mut FiInfo,
    caps: u64,
    mode: u64,
    addr_format: u32,
    src_addrlen: usize,
    dest_addrlen: usize,
    src_addr: *mut c_void,
    dest_addr: *mut c_void,
    handle: *mut c_void,
    tx_attr: *mut c_void,
    rx_attr: *mut c_void,
    ep_attr: *mut FiEpAttr,
    domain_attr: *mut c_void,
    fabric_attr: *mut FiFabricAttr,
}

/// `struct fi_ep_attr` (prefix: `type`, an `enum fi_ep_type`).
#[repr(C)]
struct FiEpAttr {
    ep_type: c_int,
}

/// `struct fi_fabric_attr` (complete as of 1.17).
#[repr(C)]
struct FiFabricAttr {
    fabric: *mut c_void,
    name: *mut c_char,
    prov_name: *mut c_char,
    prov_version: u32,
    api_version: u32,
}

/// `FI_RMA` capability bit.
const FI_RMA: u64 = 1 << 2;
/// `FI_ATOMIC` capability bit.
const FI_ATOMIC: u64 = 1 << 4;
/// `FI_EP_RDM` in `enum fi_ep_type`.
const FI_EP_RDM: c_int = 3;
/// `FI_ENODATA`: fi_getinfo found no provider matching the hints.
const FI_ENODATA: c_int = 61;

/// `FI_VERSION(major, minor)`.
const fn fi_version_number(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

// Function signatures from rdma/fabric.h and rdma/fi_errno.h:
//   uint32_t fi_version(void);
//   int fi_getinfo(uint32_t version, const char *node, const char *service,
//                  uint64_t flags, const struct fi_info *hints, struct fi_info **info);
//   void fi_freeinfo(struct fi_info *info);
//   struct fi_info *fi_dupinfo(const struct fi_info *info);
//   const char *fi_strerror(int errnum);
type FiVersion = unsafe extern "C" fn() -> u32;
type FiGetinfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const FiInfo,
    *mut *mut FiInfo,
) -> c_int;
type FiFreeinfo = unsafe extern "C" fn(*mut FiInfo);
type FiDupinfo = unsafe extern "C" fn(*const FiInfo) -> *mut FiInfo;
type FiStrerror = unsafe extern "C" fn(c_int) -> *const c_char;

struct Fabric {
    soname: &'static str,
    version: FiVersion,
    getinfo: FiGetinfo,
    freeinfo: FiFreeinfo,
    dupinfo: FiDupinfo,
    strerror: FiStrerror,
    /// Keeps the function pointers above valid; never dropped (see `dl`).
    _opened: Opened,
}

fn fabric() -> Result<&'static Fabric, &'static Error> {
    static FABRIC: OnceLock<Result<Fabric, Error>> = OnceLock::new();
    FABRIC
        .get_or_init(|| {
            let opened = dl::open(SONAMES, PACKAGE)?;
            // SAFETY: the types above are the header signatures of these symbols, and the
            // pointers live in `Fabric` next to the library that keeps them valid.
            unsafe {
                Ok(Fabric {
                    soname: opened.soname,
                    version: dl::symbol(&opened, "fi_version", PACKAGE)?,
                    getinfo: dl::symbol(&opened, "fi_getinfo", PACKAGE)?,
                    freeinfo: dl::symbol(&opened, "fi_freeinfo", PACKAGE)?,
                    dupinfo: dl::symbol(&opened, "fi_dupinfo", PACKAGE)?,
                    strerror: dl::symbol(&opened, "fi_strerror", PACKAGE)?,
                    _opened: opened,
                })
            }
        })
        .as_ref()
}

/// libfabric and its RDM providers.
#[derive(Debug, Clone, Serialize)]
pub struct FabricReport {
    /// Whether libfabric loaded.
    pub present: bool,
    /// One line: what was found, or why nothing was.
    pub detail: String,
    /// `fi_version()` as `"major.minor"`.
    pub version: Option<String>,
    /// Distinct providers offering RDM endpoints with FI_RMA|FI_ATOMIC, in the order
    /// fi_getinfo ranks them.
    pub providers: Vec<FabricProvider>,
}

/// One provider (layered providers are named like `tcp;ofi_rxm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FabricProvider {
    pub name: String,
    pub rma: bool,
    pub atomic: bool,
}

pub(super) fn probe() -> FabricReport {
    let fab = match fabric() {
        Ok(f) => f,
        Err(e) => {
            return FabricReport {
                present: false,
                detail: dl::absent_statement(e),
                version: None,
                providers: Vec::new(),
            }
        }
    };
    // SAFETY: fi_version has no preconditions.
    let v = unsafe { (fab.version)() };
    let version = format!("{}.{}", v >> 16, v & 0xffff);
    let (providers, detail) = match providers(fab) {
        Ok(p) if p.is_empty() => (
            p,
            format!(
                "{} {version} loaded; no RDM provider offers RMA and atomics",
                fab.soname
            ),
        ),
        Ok(p) => {
            let n = p.len();
            (
                p,
                format!(
                    "{} {version} loaded; {n} RDM provider(s) with RMA and atomics",
                    fab.soname
                ),
            )
        }
        Err(e) => (Vec::new(), format!("{} {version} loaded; {e}", fab.soname)),
    };
    FabricReport {
        present: true,
        detail,
        version: Some(version),
        providers,
    }
}

/// Runs fi_getinfo for RDM endpoints with FI_RMA|FI_ATOMIC and folds the answers by
/// provider name.
fn providers(fab: &Fabric) -> Result<Vec<FabricProvider>, String> {
    // SAFETY: fi_dupinfo(NULL) is what fi_allocinfo() does: a zeroed fi_info with its
    // attribute structs allocated. Freed below with fi_freeinfo.
    let hints = unsafe { (fab.dupinfo)(std::ptr::null()) };
    if hints.is_null() {
        return Err("fi_dupinfo(NULL) failed: out of memory".into());
    }
    // SAFETY: `hints` is a live fi_info from fi_dupinfo; its ep_attr, when non-null,
    // points to an fi_ep_attr it owns.
    unsafe {
        (*hints).caps = FI_RMA | FI_ATOMIC;
        if !(*hints).ep_attr.is_null() {
            (*(*hints).ep_attr).ep_type = FI_EP_RDM;
        }
    }
    let mut info: *mut FiInfo = std::ptr::null_mut();
    // SAFETY: `hints` is valid, `info` writable; node/service NULL and flags 0 ask for
    // every local provider matching the hints.
    let rc = unsafe {
        (fab.getinfo)(
            fi_version_number(1, 9),
            std::ptr::null(),
            std::ptr::null(),
            0,
            hints,
            &mut info,
        )
    };
    // SAFETY: `hints` came from fi_dupinfo and is not used after this.
    unsafe { (fab.freeinfo)(hints) };
    if rc == -FI_ENODATA {
        return Ok(Vec::new());
    }
    if rc != 0 {
        return Err(format!("fi_getinfo failed: {} ({rc})", strerror(fab, -rc)));
    }
    let mut out: Vec<FabricProvider> = Vec::new();
    let mut cur = info;
    while !cur.is_null() {
        // SAFETY: `cur` is an element of the list fi_getinfo returned, alive until the
        // fi_freeinfo below; fabric_attr and prov_name, when non-null, are owned by it and
        // prov_name is NUL-terminated.
        let (caps, name, next) = unsafe {
            let fa = (*cur).fabric_attr;
            let name = if fa.is_null() || (*fa).prov_name.is_null() {
                "(unnamed)".to_string()
            } else {
                CStr::from_ptr((*fa).prov_name)
                    .to_string_lossy()
                    .into_owned()
            };
            ((*cur).caps, name, (*cur).next)
        };
        add_provider(&mut out, name, caps);
        cur = next;
    }
    if !info.is_null() {
        // SAFETY: `info` is the head of the list from fi_getinfo, freed once, not used
        // afterwards.
        unsafe { (fab.freeinfo)(info) };
    }
    Ok(out)
}

/// Merges one fi_info answer into the per-provider list (a provider answers once per
/// interface or address format; it offers a capability if any answer does).
fn add_provider(out: &mut Vec<FabricProvider>, name: String, caps: u64) {
    let rma = caps & FI_RMA != 0;
    let atomic = caps & FI_ATOMIC != 0;
    match out.iter_mut().find(|p| p.name == name) {
        Some(p) => {
            p.rma |= rma;
            p.atomic |= atomic;
        }
        None => out.push(FabricProvider { name, rma, atomic }),
    }
}

fn strerror(fab: &Fabric, errnum: c_int) -> String {
    // SAFETY: fi_strerror accepts any value and returns a static string or NULL.
    let p = unsafe { (fab.strerror)(errnum) };
    if p.is_null() {
        format!("error {errnum}")
    } else {
        // SAFETY: non-null results are static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    #[test]
    fn providers_are_merged_by_name() {
        let mut out = Vec::new();
        add_provider(&mut out, "tcp;ofi_rxm".into(), FI_RMA);
        add_provider(&mut out, "shm".into(), FI_RMA | FI_ATOMIC);
        add_provider(&mut out, "tcp;ofi_rxm".into(), FI_ATOMIC);
        assert_eq!(
            out,
            vec![
                FabricProvider {
                    name: "tcp;ofi_rxm".into(),
                    rma: true,
                    atomic: true
                },
                FabricProvider {
                    name: "shm".into(),
                    rma: true,
                    atomic: true
                },
            ]
        );
    }

    /// What the Rust declarations say: `name value` for every offset, size and constant
    /// the C program below prints.
    fn rust_layout() -> BTreeMap<String, u64> {
        let f = |n: &str, v: usize| (n.to_string(), v as u64);
        let ep = FiEpAttr { ep_type: 0 };
        let mut m: BTreeMap<String, u64> = [
            f("fi_info.next", offset_of!(FiInfo, next)),
            f("fi_info.caps", offset_of!(FiInfo, caps)),
            f("fi_info.mode", offset_of!(FiInfo, mode)),
            f("fi_info.addr_format", offset_of!(FiInfo, addr_format)),
            f("fi_info.src_addrlen", offset_of!(FiInfo, src_addrlen)),
            f("fi_info.dest_addrlen", offset_of!(FiInfo, dest_addrlen)),
            f("fi_info.src_addr", offset_of!(FiInfo, src_addr)),
            f("fi_info.dest_addr", offset_of!(FiInfo, dest_addr)),
            f("fi_info.handle", offset_of!(FiInfo, handle)),
            f("fi_info.tx_attr", offset_of!(FiInfo, tx_attr)),
            f("fi_info.rx_attr", offset_of!(FiInfo, rx_attr)),
            f("fi_info.ep_attr", offset_of!(FiInfo, ep_attr)),
            f("fi_info.domain_attr", offset_of!(FiInfo, domain_attr)),
            f("fi_info.fabric_attr", offset_of!(FiInfo, fabric_attr)),
            f("fi_info.caps.size", size_of::<u64>()),
            f("fi_ep_attr.type", offset_of!(FiEpAttr, ep_type)),
            f("fi_ep_attr.type.size", std::mem::size_of_val(&ep.ep_type)),
            f("fi_fabric_attr.fabric", offset_of!(FiFabricAttr, fabric)),
            f("fi_fabric_attr.name", offset_of!(FiFabricAttr, name)),
            f(
                "fi_fabric_attr.prov_name",
                offset_of!(FiFabricAttr, prov_name),
            ),
            f(
                "fi_fabric_attr.prov_version",
                offset_of!(FiFabricAttr, prov_version),
            ),
            f(
                "fi_fabric_attr.api_version",
                offset_of!(FiFabricAttr, api_version),
            ),
            f("sizeof.fi_fabric_attr", size_of::<FiFabricAttr>()),
        ]
        .into_iter()
        .collect();
        m.insert("FI_RMA".into(), FI_RMA);
        m.insert("FI_ATOMIC".into(), FI_ATOMIC);
        m.insert("FI_EP_RDM".into(), FI_EP_RDM as u64);
        m.insert("FI_ENODATA".into(), FI_ENODATA as u64);
        m.insert("FI_VERSION_1_9".into(), fi_version_number(1, 9) as u64);
        m
    }

    const LAYOUT_C: &str = r#"
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stddef.h>
#define OFF(s, f) printf("%s.%s %zu\n", #s, #f, offsetof(struct s, f))
int main(void) {
    OFF(fi_info, next); OFF(fi_info, caps); OFF(fi_info, mode); OFF(fi_info, addr_format);
    OFF(fi_info, src_addrlen); OFF(fi_info, dest_addrlen); OFF(fi_info, src_addr);
    OFF(fi_info, dest_addr); OFF(fi_info, handle); OFF(fi_info, tx_attr);
    OFF(fi_info, rx_attr); OFF(fi_info, ep_attr); OFF(fi_info, domain_attr);
    OFF(fi_info, fabric_attr);
    printf("fi_info.caps.size %zu\n", sizeof(((struct fi_info *)0)->caps));
    OFF(fi_ep_attr, type);
    printf("fi_ep_attr.type.size %zu\n", sizeof(((struct fi_ep_attr *)0)->type));
    OFF(fi_fabric_attr, fabric); OFF(fi_fabric_attr, name); OFF(fi_fabric_attr, prov_name);
    OFF(fi_fabric_attr, prov_version); OFF(fi_fabric_attr, api_version);
    printf("sizeof.fi_fabric_attr %zu\n", sizeof(struct fi_fabric_attr));
    printf("FI_RMA %llu\n", (unsigned long long)FI_RMA);
    printf("FI_ATOMIC %llu\n", (unsigned long long)FI_ATOMIC);
    printf("FI_EP_RDM %d\n", (int)FI_EP_RDM);
    printf("FI_ENODATA %d\n", (int)FI_ENODATA);
    printf("FI_VERSION_1_9 %u\n", (unsigned)FI_VERSION(1, 9));
    return 0;
}
"#;

    /// Compiles LAYOUT_C against the installed rdma/fabric.h and compares. A missing
    /// header or compiler is a failure, not a skip: CI installs libfabric-dev, and a
    /// silently skipped layout check is how wrong offsets ship.
    #[test]
    fn layout_matches_fabric_h() {
        let dir = std::env::temp_dir().join(format!("rshmem-fabric-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, LAYOUT_C).expect("write layout.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("cannot run C compiler `{cc}` ({e}); install gcc"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("fabric.h"),
            "rdma/fabric.h not found; install libfabric-dev (apt-get install -y libfabric-dev) \
             to check the libfabric struct layouts:\n{stderr}"
        );
        assert!(out.status.success(), "compiling layout.c failed:\n{stderr}");
        let run = Command::new(&exe).output().expect("run layout checker");
        assert!(run.status.success());
        let c: BTreeMap<String, u64> = String::from_utf8_lossy(&run.stdout)
            .lines()
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').expect("name value");
                (k.to_string(), v.parse().expect("number"))
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            rust_layout(),
            c,
            "Rust declarations (left) vs rdma/fabric.h (right)"
        );
    }
}
