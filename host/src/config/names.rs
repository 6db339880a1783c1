//! The names of the `RSHMEM_*` variables, and a check for set ones that nothing reads.
//!
//! A misspelled variable (`RSHMEM_TIMEOUT=5000` for `RSHMEM_TIMEOUT_MS`) used to be
//! ignored without a word, and the job ran with the default. Rank 0 of a job now warns
//! once per process about each `RSHMEM_*` variable that is set but read by nothing,
//! naming the closest known one. It is a warning, not an error: a job script shared
//! with a newer or older rshmem may carry variables this one does not know.

use std::sync::atomic::{AtomicBool, Ordering};

/// The `RSHMEM_*` variables the library and the `rshmem` command read besides those
/// `rshmem run` sets ([`crate::launcher::PE_VARIABLES`]); both together are the README's
/// "Environment variables" table (a test keeps them equal): [`env_vars`].
const OTHER_VARS: &[&str] = &[
    "RSHMEM_SYMMETRIC_SIZE",
    "RSHMEM_TIMEOUT_MS",
    "RSHMEM_NODE_ID",
    "RSHMEM_TRANSPORT",
    "RSHMEM_HCA",
    "RSHMEM_IB_GID_INDEX",
    "RSHMEM_IB_TC",
    "RSHMEM_IB_SL",
    "RSHMEM_IB_TIMEOUT",
    "RSHMEM_IBGDA_DOORBELL",
    "RSHMEM_PROXY_BACKEND",
    "RSHMEM_FABRIC_PROVIDER",
    "RSHMEM_FABRIC_CHUNK",
    "RSHMEM_FABRIC_DELIVERY",
    "RSHMEM_FABRIC_DOMAIN",
    "RSHMEM_FABRIC_CONFIRM",
    "RSHMEM_BIND",
    "RSHMEM_P2P_ASSIST",
    "RSHMEM_ENGINE_HANDOVER",
    "RSHMEM_EP_PATH",
    "RSHMEM_FABRIC_LIB",
    "RSHMEM_DEBUG_QUEUES",
    "RSHMEM_VERBS_LIB",
    "RSHMEM_MLX5_LIB",
    "RSHMEM_DEVICE",
    "RSHMEM_DEVICE_CHECKS",
    "RSHMEM_CUDA_LIB",
    "RSHMEM_NVRTC_LIB",
    "RSHMEM_PTX_DIR",
    "RSHMEM_GPU_MANIFEST",
];

/// Every `RSHMEM_*` variable the library and the `rshmem` command read.
pub fn env_vars() -> impl Iterator<Item = &'static str> {
    crate::launcher::PE_VARIABLES
        .into_iter()
        .chain(OTHER_VARS.iter().copied())
}

/// `RSHMEM_*` variables that the scripts, the GPU bundle and the tests read, not the
/// library: set in a job's environment they are not misspellings.
const TOOL_VARS: &[&str] = &[
    "RSHMEM_BIN",
    "RSHMEM_BUNDLE_NVRTC",
    "RSHMEM_CCCL_INCLUDE",
    "RSHMEM_CICC",
    "RSHMEM_CUDA_HOME",
    "RSHMEM_CUDA_INCLUDE",
    "RSHMEM_CUDA_INCLUDE_FLAGS",
    "RSHMEM_CUDA_LOCK_WAIT_S",
    "RSHMEM_CUDA_VENV",
    "RSHMEM_DEVICE_REPORT",
    "RSHMEM_FDPASS_TEST_JOB",
    "RSHMEM_GPU_ALLOW_STALE",
    "RSHMEM_GPU_CHECK_BUDGET_S",
    "RSHMEM_GPU_LOGS",
    "RSHMEM_GPU_OUT",
    "RSHMEM_LAUNCHER_TEST_PE",
    "RSHMEM_NVCC",
    "RSHMEM_NVSHMEM_BENCH",
    "RSHMEM_NVSHMEM_LIB_DIR",
    "RSHMEM_NVSHMEM_MPS",
    "RSHMEM_NVSHMEM_VENV",
    "RSHMEM_NVVM_LIBDEVICE_DIR",
    "RSHMEM_PTXAS",
    "RSHMEM_PYTHON",
    "RSHMEM_SKIP_NETNS",
];

/// Prefixes of the test harnesses' own variables (the device emulators', the test
/// children's).
const TOOL_PREFIXES: &[&str] = &["RSHMEM_EMU_", "RSHMEM_TEST_"];

/// A set `RSHMEM_*` variable that nothing reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVar {
    pub name: String,
    /// The known variable it most likely meant, if one is close.
    pub suggestion: Option<&'static str>,
}

impl std::fmt::Display for UnknownVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is set but rshmem reads no such variable", self.name)?;
        match self.suggestion {
            Some(s) => write!(f, " (did you mean {s}?)"),
            None => write!(f, " (the README lists the variables)"),
        }
    }
}

/// Whether rshmem, its scripts or its tests read `name`.
pub fn is_known(name: &str) -> bool {
    env_vars().any(|v| v == name)
        || TOOL_VARS.contains(&name)
        || TOOL_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The `RSHMEM_*` names among `names` that nothing reads, sorted, each with the closest
/// known variable when one is within a few edits.
pub fn unknown_vars<I, S>(names: I) -> Vec<UnknownVar>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out: Vec<UnknownVar> = names
        .into_iter()
        .filter_map(|n| {
            let n = n.as_ref();
            (n.starts_with("RSHMEM_") && !is_known(n)).then(|| UnknownVar {
                name: n.to_string(),
                suggestion: closest(n),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup();
    out
}

/// The documented variable nearest to `name` by edit distance, if within 3 edits
/// (`RSHMEM_TIMEOUT` → `RSHMEM_TIMEOUT_MS`, `RSHMEM_SYMETRIC_SIZE` →
/// `RSHMEM_SYMMETRIC_SIZE`); ties go to the first in [`env_vars`]. Case is ignored, so
/// `RSHMEM_Transport` finds `RSHMEM_TRANSPORT`.
fn closest(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    env_vars()
        .map(|k| (edit_distance(&upper, k), k))
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over bytes (the names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Whether this process already warned (the PEs of a process share an environment).
static WARNED: AtomicBool = AtomicBool::new(false);

/// On rank 0, once per process: one line on stderr for each `RSHMEM_*` variable of the
/// process environment that nothing reads.
pub fn warn_unknown_env(rank: usize) {
    // Relaxed: the flag only keeps the lines from repeating; it orders no other memory.
    if rank != 0 || WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    for u in unknown_vars(names) {
        eprintln!("rshmem: warning: {u}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspellings_name_the_variable_they_meant() {
        let got = unknown_vars([
            "RSHMEM_TIMEOUT",
            "RSHMEM_SYMETRIC_SIZE",
            "RSHMEM_Transport",
            "RSHMEM_FABRIC_PROVIDERS",
            "RSHMEM_WHATEVER_THIS_IS",
            "RSHMEM_TIMEOUT_MS",
            "RSHMEM_EMU_RING",
            "RSHMEM_TEST_CHILD",
            "RSHMEM_CUDA_VENV",
            "MASTER_ADDR",
            "RSHMEM_TIMEOUT",
        ]);
        let want = [
            ("RSHMEM_FABRIC_PROVIDERS", Some("RSHMEM_FABRIC_PROVIDER")),
            ("RSHMEM_SYMETRIC_SIZE", Some("RSHMEM_SYMMETRIC_SIZE")),
            ("RSHMEM_TIMEOUT", Some("RSHMEM_TIMEOUT_MS")),
            ("RSHMEM_Transport", Some("RSHMEM_TRANSPORT")),
            ("RSHMEM_WHATEVER_THIS_IS", None),
        ];
        let want: Vec<UnknownVar> = want
            .iter()
            .map(|(n, s)| UnknownVar {
                name: n.to_string(),
                suggestion: *s,
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            got[2].to_string(),
            "RSHMEM_TIMEOUT is set but rshmem reads no such variable \
             (did you mean RSHMEM_TIMEOUT_MS?)"
        );
        assert_eq!(
            got[4].to_string(),
            "RSHMEM_WHATEVER_THIS_IS is set but rshmem reads no such variable \
             (the README lists the variables)"
        );
    }

    #[test]
    fn every_known_variable_passes() {
        assert_eq!(
            unknown_vars(env_vars().chain(TOOL_VARS.iter().copied())),
            vec![]
        );
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("RSHMEM_IB_TC", "RSHMEM_IB_SL"), 2);
    }

    /// The README's table of variables and [`ENV_VARS`] name the same variables.
    #[test]
    fn the_readme_documents_exactly_the_variables_read() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("## Environment variables")
            .expect("README has an Environment variables section");
        let section = &readme[start..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
        let mut documented: Vec<&str> = Vec::new();
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let first_cell = line.split('|').nth(1).unwrap_or("");
            for part in first_cell.split('`').skip(1).step_by(2) {
                if part.starts_with("RSHMEM_") {
                    documented.push(part);
                }
            }
        }
        documented.sort_unstable();
        documented.dedup();
        let mut read: Vec<&str> = env_vars().collect();
        read.sort_unstable();
        assert_eq!(documented, read, "README table vs config::env_vars()");
    }
}
