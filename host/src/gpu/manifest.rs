//! The manifest of the library's GPU self-test and benchmark kernels
//! (`device-kernels/src/rshmem_device_tests.json`, written next to the kernels): for every
//! test kernel its launch shape, whether it needs a co-resident grid, scratch size,
//! parameters and the exact number of checks a correct run makes per PE; for every bench
//! kernel the operation, scope and kind it measures.
//!
//! Format (agreed with the device side):
//!
//! ```json
//! {
//!   "tests": [
//!     {"name": "rshmem_test_put_thread", "module": "rshmem_device_tests", "grid": 4, "block": 128,
//!      "collective": false, "scratch_bytes": 1048576, "min_pes": 2, "params": [4096, 0, 0],
//!      "checks_per_pe": 512, "doc": "..."}
//!   ],
//!   "benches": [
//!     {"name": "rshmem_bench_put_lat_thread", "module": "rshmem_device_bench", "op": "put",
//!      "scope": "thread", "kind": "latency", "grid": 1, "block": 1, "scratch_bytes": 33554432,
//!      "doc": "..."}
//!   ]
//! }
//! ```
//!
//! Unknown fields are ignored (the device side may add documentation); every field above
//! is required except `doc`, `params` (default `[0, 0, 0]`) and `min_pes` (default 1).

use crate::error::{Error, Result};
use serde::Deserialize;
use std::collections::BTreeSet;

/// The embedded manifest of the library's device test and bench kernels.
pub const EMBEDDED: Option<&str> = Some(include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../device-kernels/src/rshmem_device_tests.json"
)));

/// Path of the manifest in a checkout (runners accept `--manifest` / `RSHMEM_GPU_MANIFEST`
/// to load it from disk instead of the embedded copy).
pub const SOURCE_PATH: &str = "device-kernels/src/rshmem_device_tests.json";

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Manifest {
    pub tests: Vec<TestCase>,
    #[serde(default)]
    pub benches: Vec<BenchCase>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct TestCase {
    /// The kernel's `extern "C"` name.
    pub name: String,
    /// The module (PTX file stem) that holds it.
    pub module: String,
    /// Blocks; 0 only for collective cases: the runner sizes a co-resident grid.
    pub grid: u32,
    /// Threads per block, 1..=1024.
    pub block: u32,
    /// The grid must be co-resident with the other PEs' grids (device barrier).
    pub collective: bool,
    pub scratch_bytes: u64,
    #[serde(default = "one")]
    pub min_pes: usize,
    #[serde(default)]
    pub params: Vec<u64>,
    pub checks_per_pe: u64,
    #[serde(default)]
    pub doc: String,
}

fn one() -> usize {
    1
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BenchCase {
    pub name: String,
    pub module: String,
    /// put, get, p, g, atomic, signal, ...
    pub op: String,
    /// thread, warp or block.
    pub scope: String,
    /// latency or bandwidth.
    pub kind: String,
    pub grid: u32,
    pub block: u32,
    pub scratch_bytes: u64,
    #[serde(default)]
    pub doc: String,
}

impl TestCase {
    /// params padded to three words.
    pub fn params3(&self) -> [u64; 3] {
        let mut p = [0u64; 3];
        for (d, s) in p.iter_mut().zip(&self.params) {
            *d = *s;
        }
        p
    }
}

impl Manifest {
    /// Parses and validates a manifest; errors name the entry and the field.
    pub fn parse(text: &str) -> Result<Manifest> {
        let m: Manifest = serde_json::from_str(text).map_err(|e| {
            Error::InvalidArgument(format!("GPU kernel manifest is not valid: {e}"))
        })?;
        m.validate()?;
        Ok(m)
    }

    /// Loads the manifest: from `path` when given, else the embedded copy.
    pub fn load(path: Option<&std::path::Path>) -> Result<Manifest> {
        match path {
            Some(p) => {
                let t = std::fs::read_to_string(p).map_err(|e| {
                    Error::io(
                        format!("reading the GPU kernel manifest {}", p.display()),
                        e,
                    )
                })?;
                Manifest::parse(&t)
            }
            None => match EMBEDDED {
                Some(t) => Manifest::parse(t),
                None => Err(Error::InvalidArgument(format!(
                    "this build embeds no GPU kernel manifest (the device test kernels were not \
                     part of it): pass --manifest {SOURCE_PATH} (or set RSHMEM_GPU_MANIFEST) and \
                     RSHMEM_PTX_DIR=ptx from a checkout that has them"
                ))),
            },
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |name: &str, what: String| {
            Err(Error::InvalidArgument(format!(
                "GPU kernel manifest: entry {name:?}: {what}"
            )))
        };
        let mut names = BTreeSet::new();
        for t in &self.tests {
            if !names.insert(t.name.as_str()) {
                return bad(&t.name, "name appears twice".into());
            }
            if !t.name.starts_with("rshmem_test_") {
                return bad(&t.name, "test kernel names start with rshmem_test_".into());
            }
            if t.module.is_empty() {
                return bad(&t.name, "module is empty".into());
            }
            if t.block == 0 || t.block > 1024 {
                return bad(&t.name, format!("block {} is not in 1..=1024", t.block));
            }
            if t.grid == 0 && !t.collective {
                return bad(
                    &t.name,
                    "grid 0 (sized by the runner) is only for collective cases".into(),
                );
            }
            if t.checks_per_pe == 0 {
                return bad(
                    &t.name,
                    "checks_per_pe is 0: a case must check something".into(),
                );
            }
            if t.min_pes == 0 {
                return bad(&t.name, "min_pes is 0".into());
            }
            if t.params.len() > 3 {
                return bad(
                    &t.name,
                    format!("{} params (at most 3: param0..param2)", t.params.len()),
                );
            }
        }
        for b in &self.benches {
            if !names.insert(b.name.as_str()) {
                return bad(&b.name, "name appears twice".into());
            }
            if !b.name.starts_with("rshmem_bench_") {
                return bad(
                    &b.name,
                    "bench kernel names start with rshmem_bench_".into(),
                );
            }
            if !["thread", "warp", "block"].contains(&b.scope.as_str()) {
                return bad(
                    &b.name,
                    format!("scope {:?} is not thread, warp or block", b.scope),
                );
            }
            if !["latency", "bandwidth"].contains(&b.kind.as_str()) {
                return bad(
                    &b.name,
                    format!("kind {:?} is not latency or bandwidth", b.kind),
                );
            }
            if b.op.is_empty() || b.module.is_empty() {
                return bad(&b.name, "op and module must not be empty".into());
            }
            if b.block == 0 || b.block > 1024 || b.grid == 0 {
                return bad(
                    &b.name,
                    format!(
                        "grid {} block {}: need grid >= 1 and block in 1..=1024",
                        b.grid, b.block
                    ),
                );
            }
            if b.scratch_bytes < 8 {
                return bad(
                    &b.name,
                    "scratch_bytes must hold at least one 8-byte word".into(),
                );
            }
        }
        Ok(())
    }

    /// Test cases selected by name (all when `names` is empty); an unknown name is an
    /// error listing the known ones.
    pub fn select(&self, names: &[String]) -> Result<Vec<&TestCase>> {
        if names.is_empty() {
            return Ok(self.tests.iter().collect());
        }
        names
            .iter()
            .map(|n| {
                self.tests
                    .iter()
                    .find(|t| &t.name == n || t.name.strip_prefix("rshmem_test_") == Some(n))
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "no GPU test case {n:?}; known: {}",
                            self.tests
                                .iter()
                                .map(|t| t.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })
            })
            .collect()
    }

    /// The bench kernel for (op, scope, kind), if the manifest has one.
    pub fn bench(&self, op: &str, scope: &str, kind: &str) -> Option<&BenchCase> {
        self.benches
            .iter()
            .find(|b| b.op == op && b.scope == scope && b.kind == kind)
    }

    /// Module names the tests and benches use (each loaded once per PE).
    pub fn modules(&self) -> BTreeSet<&str> {
        self.tests
            .iter()
            .map(|t| t.module.as_str())
            .chain(self.benches.iter().map(|b| b.module.as_str()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{
      "tests": [
        {"name": "rshmem_test_put_thread", "module": "rshmem_device_tests", "grid": 4, "block": 128,
         "collective": false, "scratch_bytes": 1048576, "min_pes": 2, "params": [4096, 0, 0],
         "checks_per_pe": 512, "doc": "put at thread scope"},
        {"name": "rshmem_test_barrier_all", "module": "rshmem_device_tests", "grid": 0, "block": 256,
         "collective": true, "scratch_bytes": 4096, "checks_per_pe": 7, "extra_field": 1}
      ],
      "benches": [
        {"name": "rshmem_bench_put_lat_thread", "module": "rshmem_device_bench", "op": "put", "scope": "thread",
         "kind": "latency", "grid": 1, "block": 1, "scratch_bytes": 33554432, "doc": "..."},
        {"name": "rshmem_bench_put_bw_block", "module": "rshmem_device_bench", "op": "put", "scope": "block",
         "kind": "bandwidth", "grid": 32, "block": 1024, "scratch_bytes": 33554432}
      ]
    }"#;

    #[test]
    fn parses_the_agreed_format() {
        let m = Manifest::parse(SAMPLE).unwrap();
        assert_eq!(m.tests.len(), 2);
        let t = &m.tests[0];
        assert_eq!(t.name, "rshmem_test_put_thread");
        assert_eq!((t.grid, t.block, t.collective), (4, 128, false));
        assert_eq!(
            (t.scratch_bytes, t.min_pes, t.checks_per_pe),
            (1 << 20, 2, 512)
        );
        assert_eq!(t.params3(), [4096, 0, 0]);
        let b = &m.tests[1];
        assert_eq!(
            (b.grid, b.collective, b.min_pes, b.params3()),
            (0, true, 1, [0, 0, 0])
        );
        assert_eq!(m.benches.len(), 2);
        let k = m.bench("put", "block", "bandwidth").unwrap();
        assert_eq!((k.grid, k.block), (32, 1024));
        assert!(m.bench("put", "warp", "latency").is_none());
        assert_eq!(
            m.modules().into_iter().collect::<Vec<_>>(),
            ["rshmem_device_bench", "rshmem_device_tests"]
        );
    }

    #[test]
    fn selects_by_full_or_short_name() {
        let m = Manifest::parse(SAMPLE).unwrap();
        assert_eq!(m.select(&[]).unwrap().len(), 2);
        let s = m
            .select(&["barrier_all".into(), "rshmem_test_put_thread".into()])
            .unwrap();
        assert_eq!(s[0].name, "rshmem_test_barrier_all");
        assert_eq!(s[1].name, "rshmem_test_put_thread");
        let e = m.select(&["nope".into()]).unwrap_err().to_string();
        assert!(e.contains("no GPU test case \"nope\""), "{e}");
        assert!(
            e.contains("rshmem_test_put_thread, rshmem_test_barrier_all"),
            "{e}"
        );
    }

    fn with(field: &str, value: &str) -> String {
        // Replaces the first occurrence of `"field": <old>` in the first test entry.
        let mut v: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        v["tests"][0][field] = serde_json::from_str(value).unwrap();
        v.to_string()
    }

    #[test]
    fn rejects_bad_entries_naming_them() {
        for (field, value, expect) in [
            ("block", "0", "block 0 is not in 1..=1024"),
            ("block", "2048", "block 2048"),
            (
                "grid",
                "0",
                "grid 0 (sized by the runner) is only for collective cases",
            ),
            ("checks_per_pe", "0", "checks_per_pe is 0"),
            ("min_pes", "0", "min_pes is 0"),
            ("params", "[1,2,3,4]", "4 params"),
            ("name", "\"put\"", "start with rshmem_test_"),
            ("name", "\"rshmem_test_barrier_all\"", "name appears twice"),
        ] {
            let e = Manifest::parse(&with(field, value))
                .unwrap_err()
                .to_string();
            assert!(e.contains(expect), "{field}={value}: {e}");
            assert!(e.contains("GPU kernel manifest"), "{e}");
        }
        let e = Manifest::parse(&with("grid", "-1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid"), "{e}");
        let e = Manifest::parse(r#"{"tests": [{"name": "rshmem_test_x"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        v["benches"][0]["scope"] = "grid".into();
        let e = Manifest::parse(&v.to_string()).unwrap_err().to_string();
        assert!(
            e.contains("scope \"grid\" is not thread, warp or block"),
            "{e}"
        );
    }

    #[test]
    fn missing_embedded_manifest_says_how_to_load_one() {
        if EMBEDDED.is_some() {
            assert!(Manifest::load(None).is_ok());
            return;
        }
        let e = Manifest::load(None).unwrap_err().to_string();
        assert!(
            e.contains("--manifest device-kernels/src/rshmem_device_tests.json"),
            "{e}"
        );
        let e = Manifest::load(Some(std::path::Path::new("/nonexistent/m.json")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/m.json"), "{e}");
    }

    #[test]
    fn embedded_manifest_names_kernels_of_the_embedded_ptx() {
        let m = Manifest::load(None).expect("embedded manifest parses");
        assert!(
            m.tests.len() >= 20 && m.benches.len() >= 20,
            "{} tests, {} benches",
            m.tests.len(),
            m.benches.len()
        );
        let names = m
            .tests
            .iter()
            .map(|t| (&t.module, &t.name))
            .chain(m.benches.iter().map(|b| (&b.module, &b.name)));
        for (module, name) in names {
            let ptx =
                crate::gpu::module::ptx_source(module, Some(std::path::Path::new("/nonexistent")))
                    .expect("module embedded");
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "manifest kernel {name} is not an entry of module {module}"
            );
        }
    }
}
