//! The CPU-PE section of the doctor: CPUs, `/dev/shm` capacity (the backing of the
//! symmetric heap for CPU PEs), hostname, node id and the RSHMEM_* environment.

use serde::Serialize;
use std::ffi::{CStr, CString, OsStr};

/// Where CPU PEs put their symmetric heaps.
const SHM_PATH: &str = "/dev/shm";

/// CPU PEs: always available.
#[derive(Debug, Clone, Serialize)]
pub struct CpuReport {
    /// Always true: any process can be a PE.
    pub available: bool,
    /// `std::thread::available_parallelism()`; null if it could not be determined.
    pub count: Option<usize>,
    pub shm: ShmReport,
    pub hostname: String,
    /// The node id rshmem groups PEs by (PEs with the same id share memory).
    pub node_id: String,
    /// `"RSHMEM_NODE_ID"` or `"hostname:boot_id"`.
    pub node_id_source: String,
    /// RSHMEM_* variables set now, sorted by name; secrets hidden.
    pub env: Vec<EnvVar>,
}

/// Size of the shared-memory file system.
#[derive(Debug, Clone, Serialize)]
pub struct ShmReport {
    pub path: String,
    pub total_bytes: Option<u64>,
    /// Bytes an unprivileged process may still allocate (`f_bavail`).
    pub free_bytes: Option<u64>,
    /// Why the sizes are null, if they are.
    pub error: Option<String>,
}

/// One RSHMEM_* variable.
#[derive(Debug, Clone, Serialize)]
pub struct EnvVar {
    pub name: String,
    /// The value, or `"(hidden)"` for secrets such as RSHMEM_TOKEN.
    pub value: String,
    /// Set for a variable nothing reads (a misspelling): what the PEs' warning says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

pub(super) fn probe() -> CpuReport {
    let hostname = hostname();
    let (node_id, node_id_source) = node_id(
        std::env::var_os("RSHMEM_NODE_ID").as_deref(),
        &hostname,
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .as_deref(),
    );
    CpuReport {
        available: true,
        count: std::thread::available_parallelism().ok().map(|n| n.get()),
        shm: shm(SHM_PATH),
        hostname,
        node_id,
        node_id_source,
        env: rshmem_env(std::env::vars_os()),
    }
}

/// The node id as rshmem computes it: RSHMEM_NODE_ID if set and non-empty, else
/// `hostname:` + the first 8 characters of the boot id (so two containers with the same
/// hostname on different machines differ). Private to the doctor: the config module
/// computes the id the runtime actually uses.
fn node_id(env: Option<&OsStr>, hostname: &str, boot_id: Option<&str>) -> (String, String) {
    if let Some(v) = env.filter(|v| !v.is_empty()) {
        return (v.to_string_lossy().into_owned(), "RSHMEM_NODE_ID".into());
    }
    match boot_id.map(str::trim).filter(|b| !b.is_empty()) {
        Some(b) => (
            format!("{hostname}:{}", b.chars().take(8).collect::<String>()),
            "hostname:boot_id".into(),
        ),
        None => (hostname.to_string(), "hostname (boot_id unreadable)".into()),
    }
}

/// Whether a variable's value must not be printed.
fn is_secret(name: &str) -> bool {
    ["TOKEN", "SECRET", "PASSWORD"]
        .iter()
        .any(|s| name.contains(s))
}

fn rshmem_env(vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = vars
        .filter_map(|(k, v)| {
            let name = k.to_string_lossy().into_owned();
            if !name.starts_with("RSHMEM_") {
                return None;
            }
            let value = if is_secret(&name) {
                "(hidden)".to_string()
            } else {
                v.to_string_lossy().into_owned()
            };
            let unknown = crate::config::unknown_vars([&name])
                .first()
                .map(|u| u.to_string());
            Some(EnvVar {
                name,
                value,
                unknown,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for writes of buf.len() bytes; we pass one less so the last
    // byte stays 0 and the result is NUL-terminated even if the name was truncated.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
    }
    CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

fn shm(path: &str) -> ShmReport {
    let fail = |error: String| ShmReport {
        path: path.to_string(),
        total_bytes: None,
        free_bytes: None,
        error: Some(error),
    };
    let cpath = match CString::new(path) {
        Ok(c) => c,
        Err(_) => return fail(format!("{path}: path contains a NUL byte")),
    };
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: cpath is a NUL-terminated string and st a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(cpath.as_ptr(), &mut st) };
    if rc != 0 {
        return fail(format!(
            "statvfs({path}): {}",
            std::io::Error::last_os_error()
        ));
    }
    let frsize = st.f_frsize as u64;
    ShmReport {
        path: path.to_string(),
        total_bytes: Some(st.f_blocks as u64 * frsize),
        free_bytes: Some(st.f_bavail as u64 * frsize),
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn node_id_prefers_env_then_hostname_and_boot_id() {
        let boot = Some("6f07666e-1f09-47d7-b64f-6bc3a8db9ed0\n");
        assert_eq!(
            node_id(Some(OsStr::new("rack3")), "vm", boot),
            ("rack3".to_string(), "RSHMEM_NODE_ID".to_string())
        );
        assert_eq!(node_id(Some(OsStr::new("")), "vm", boot).0, "vm:6f07666e");
        assert_eq!(node_id(None, "vm", boot).0, "vm:6f07666e");
        assert_eq!(node_id(None, "vm", None).0, "vm");
    }

    #[test]
    fn env_is_filtered_sorted_and_token_hidden() {
        let vars = vec![
            ("RSHMEM_TOKEN", "s3cret"),
            ("PATH", "/bin"),
            ("RSHMEM_TIMEOUT_MS", "100"),
            ("XRSHMEM_A", "x"),
            ("RSHMEM_TIMEOUT", "100"),
        ]
        .into_iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env = rshmem_env(vars);
        let got: Vec<(&str, &str)> = env
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("RSHMEM_TIMEOUT", "100"),
                ("RSHMEM_TIMEOUT_MS", "100"),
                ("RSHMEM_TOKEN", "(hidden)")
            ]
        );
        let notes: Vec<Option<&str>> = env.iter().map(|e| e.unknown.as_deref()).collect();
        assert_eq!(
            notes,
            vec![
                Some(
                    "RSHMEM_TIMEOUT is set but rshmem reads no such variable \
                     (did you mean RSHMEM_TIMEOUT_MS?)"
                ),
                None,
                None
            ]
        );
    }

    #[test]
    fn shm_sizes_of_dev_shm() {
        let r = shm(SHM_PATH);
        assert_eq!(r.error, None);
        let (total, free) = (r.total_bytes.unwrap(), r.free_bytes.unwrap());
        assert!(total > 0 && free <= total, "total {total} free {free}");
        let missing = shm("/rshmem/no/such/dir");
        assert!(missing.total_bytes.is_none());
        assert!(missing.error.unwrap().contains("/rshmem/no/such/dir"));
    }
}
