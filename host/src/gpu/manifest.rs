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
//! A test may also name `"team": "parity"`: the runner splits the world into the even and
//! the odd PEs (two device teams, [`TEAM_PARITY`]) before the launch, passes each PE its
//! team's handle in the harness's `team`, and destroys both after (needs `min_pes` >= 2).
//!
//! `traps` lists the negative cases: kernels that must trap on a device-side check. A trap
//! destroys the CUDA context, so each runs in a child process of its own
//! (`rshmem selftest --device gpu --traps`, [`super::traps`]):
//!
//! ```json
//! {"name": "rshmem_trap_bad_pe", "module": "rshmem_device_tests", "grid": 1, "block": 1,
//!  "scratch_bytes": 4096, "expect_code": 2,
//!  "expect": {"pe": "n_pes", "addr": "scratch", "expected": 8, "message": ["PE out of range"]}}
//! ```
//!
//! Optional trap fields: `kernel` (the entry point, default `name`: several cases may launch
//! one kernel differently), `bind` (default true; false launches the kernel from a module
//! never bound to a PE), `timeout_ms` (RSHMEM_TIMEOUT_MS for the child: waits that must time
//! out), `min_pes`, `params`, `doc`, and `expect`: the error record's `pe`, `addr`,
//! `expected`, `observed` (each an integer or an expression [`Sym`]), `cmp`, `record`
//! (default true; false: the kernel cannot write the record, e.g. an unbound module has no
//! record pointer, and only the message is checked) and `message` (substrings the
//! kernel's printed line must contain besides those derived from the record).

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

/// The most threads a bench kernel's block may have: the launch bounds of
/// rshmem_device_bench.cu (`__launch_bounds__(256, 1)`, which keeps the IBGDA arms free of
/// spills). A launch with more fails in the driver; the manifest refuses it first.
pub const BENCH_MAX_BLOCK: u32 = 256;

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Manifest {
    pub tests: Vec<TestCase>,
    #[serde(default)]
    pub benches: Vec<BenchCase>,
    #[serde(default)]
    pub traps: Vec<TrapCase>,
}

/// A negative case: a kernel that must trap, and what it must report.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct TrapCase {
    /// The case's name (`rshmem_trap_*`); also the kernel unless `kernel` is given.
    pub name: String,
    /// The kernel's `extern "C"` name when it differs from `name`.
    #[serde(default)]
    pub kernel: Option<String>,
    pub module: String,
    pub grid: u32,
    pub block: u32,
    pub scratch_bytes: u64,
    #[serde(default = "one")]
    pub min_pes: usize,
    #[serde(default)]
    pub params: Vec<u64>,
    /// RSHMEM_DEVICE_ERR_* the failure is (in the record, unless `expect.record` is false).
    pub expect_code: u32,
    #[serde(default)]
    pub expect: TrapExpect,
    /// Bind the module to the PE before the launch (false: the UNBOUND case).
    #[serde(default = "yes")]
    pub bind: bool,
    /// RSHMEM_TIMEOUT_MS for the child process (cases whose wait must time out).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub doc: String,
}

fn yes() -> bool {
    true
}

/// What the error record and the printed line of a trap must say.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct TrapExpect {
    /// record.pe: the PE the failed operation addressed.
    #[serde(default)]
    pub pe: Option<Sym>,
    /// record.addr.
    #[serde(default)]
    pub addr: Option<Sym>,
    /// record.expected (the length for range errors, the operand for waits).
    #[serde(default)]
    pub expected: Option<Sym>,
    /// record.observed (waits: the last value seen).
    #[serde(default)]
    pub observed: Option<Sym>,
    /// record.cmp.
    #[serde(default)]
    pub cmp: Option<u32>,
    /// The kernel writes the error record (false: it cannot, e.g. no state bound).
    #[serde(default = "yes")]
    pub record: bool,
    /// Extra substrings of the kernel's printed line.
    #[serde(default)]
    pub message: Vec<String>,
}

impl Default for TrapExpect {
    fn default() -> Self {
        TrapExpect {
            pe: None,
            addr: None,
            expected: None,
            observed: None,
            cmp: None,
            record: true,
            message: Vec::new(),
        }
    }
}

/// A value that depends on the run: an integer, or `BASE`, `BASE+N`, `BASE-N` where BASE
/// is one of [`SYMBOLS`] and N a decimal or 0x-hex integer.
#[derive(Debug, Clone, PartialEq)]
pub enum Sym {
    Int(i128),
    Expr { base: String, offset: i128 },
}

/// The names an expression may use, evaluated by [`TrapEnv`].
pub const SYMBOLS: &[&str] = &[
    "my_pe",     // the launching PE
    "n_pes",     // the number of PEs
    "heap_base", // the launching PE's heap (device address)
    "heap_end",  // heap_base + heap_size
    "scratch",   // the case's scratch range (device address)
    "result",    // the harness result record (device memory outside the heap)
];

/// The run's values of [`SYMBOLS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct TrapEnv {
    pub my_pe: i64,
    pub n_pes: i64,
    pub heap_base: u64,
    pub heap_size: u64,
    pub scratch: u64,
    pub result: u64,
}

impl Sym {
    pub fn parse(text: &str) -> std::result::Result<Sym, String> {
        let t: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let (base, off) = match t.find(['+', '-']) {
            Some(i) => (&t[..i], Some(&t[i..])),
            None => (t.as_str(), None),
        };
        if !SYMBOLS.contains(&base) {
            return Err(format!(
                "expression {text:?}: {base:?} is not one of {}",
                SYMBOLS.join(", ")
            ));
        }
        let offset = match off {
            None => 0,
            Some(o) => {
                let (neg, digits) = (o.starts_with('-'), &o[1..]);
                let v = match digits.strip_prefix("0x") {
                    Some(h) => i128::from_str_radix(h, 16),
                    None => digits.parse::<i128>(),
                }
                .map_err(|_| format!("expression {text:?}: {digits:?} is not an integer"))?;
                if neg {
                    -v
                } else {
                    v
                }
            }
        };
        Ok(Sym::Expr {
            base: base.to_string(),
            offset,
        })
    }

    /// The value in this run.
    pub fn eval(&self, env: &TrapEnv) -> i128 {
        match self {
            Sym::Int(v) => *v,
            Sym::Expr { base, offset } => {
                let b: i128 = match base.as_str() {
                    "my_pe" => env.my_pe as i128,
                    "n_pes" => env.n_pes as i128,
                    "heap_base" => env.heap_base as i128,
                    "heap_end" => env.heap_base as i128 + env.heap_size as i128,
                    "scratch" => env.scratch as i128,
                    "result" => env.result as i128,
                    _ => unreachable!("validated by Sym::parse"),
                };
                b + offset
            }
        }
    }
}

impl std::fmt::Display for Sym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sym::Int(v) => write!(f, "{v}"),
            Sym::Expr { base, offset: 0 } => write!(f, "{base}"),
            Sym::Expr { base, offset } if *offset < 0 => write!(f, "{base}{offset}"),
            Sym::Expr { base, offset } => write!(f, "{base}+{offset}"),
        }
    }
}

impl<'de> Deserialize<'de> for Sym {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Sym, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            I(i64),
            U(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::I(v) => Ok(Sym::Int(v as i128)),
            Raw::U(v) => Ok(Sym::Int(v as i128)),
            Raw::S(s) => Sym::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

impl TrapCase {
    /// The kernel this case launches.
    pub fn kernel(&self) -> &str {
        self.kernel.as_deref().unwrap_or(&self.name)
    }

    /// params padded to three words.
    pub fn params3(&self) -> [u64; 3] {
        let mut p = [0u64; 3];
        for (d, s) in p.iter_mut().zip(&self.params) {
            *d = *s;
        }
        p
    }
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
    /// A device team the runner creates for the case ([`TEAM_PARITY`]), or None.
    #[serde(default)]
    pub team: Option<String>,
    #[serde(default)]
    pub doc: String,
}

/// `"team": "parity"`: the even PEs (0, 2, ...) and the odd PEs (1, 3, ...), each a strided
/// team of the world; every PE gets the handle of the one it belongs to.
pub const TEAM_PARITY: &str = "parity";

/// The parity teams of `n_pes` PEs as `team_split_strided(world, start, 2, size)`
/// arguments: (start, size) of the even and of the odd team.
pub fn parity_teams(n_pes: usize) -> [(usize, usize); 2] {
    [(0, n_pes.div_ceil(2)), (1, n_pes / 2)]
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
    /// Threads per block, 1..=[`BENCH_MAX_BLOCK`].
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
            match t.team.as_deref() {
                None => {}
                Some(TEAM_PARITY) if t.min_pes >= 2 => {}
                Some(TEAM_PARITY) => {
                    return bad(
                        &t.name,
                        "team \"parity\" needs min_pes >= 2 (an odd PE)".into(),
                    )
                }
                Some(other) => {
                    return bad(
                        &t.name,
                        format!("unknown team {other:?} (known: \"{TEAM_PARITY}\")"),
                    )
                }
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
            if b.block == 0 || b.block > BENCH_MAX_BLOCK || b.grid == 0 {
                return bad(
                    &b.name,
                    format!(
                        "grid {} block {}: need grid >= 1 and block in 1..={BENCH_MAX_BLOCK} \
                         (the bench kernels' launch bounds, rshmem_device_bench.cu)",
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
        for t in &self.traps {
            if !names.insert(t.name.as_str()) {
                return bad(&t.name, "name appears twice".into());
            }
            if !t.name.starts_with("rshmem_trap_") {
                return bad(&t.name, "trap case names start with rshmem_trap_".into());
            }
            if t.module.is_empty() || t.kernel().is_empty() {
                return bad(&t.name, "module and kernel must not be empty".into());
            }
            if t.block == 0 || t.block > 1024 || t.grid == 0 {
                return bad(
                    &t.name,
                    format!(
                        "grid {} block {}: need grid >= 1 and block in 1..=1024",
                        t.grid, t.block
                    ),
                );
            }
            if t.expect_code == 0 || t.expect_code > super::state::ERR_BAD_ARG {
                return bad(
                    &t.name,
                    format!(
                        "expect_code {} is not a RSHMEM_DEVICE_ERR_* code (1..={})",
                        t.expect_code,
                        super::state::ERR_BAD_ARG
                    ),
                );
            }
            if t.min_pes == 0 || t.params.len() > 3 {
                return bad(
                    &t.name,
                    format!(
                        "min_pes {} / {} params: need min_pes >= 1 and at most 3 params",
                        t.min_pes,
                        t.params.len()
                    ),
                );
            }
            if t.scratch_bytes < 128 {
                return bad(&t.name, "scratch_bytes must be at least 128".into());
            }
            if t.timeout_ms == Some(0) {
                return bad(&t.name, "timeout_ms 0 (omit it to keep the default)".into());
            }
        }
        Ok(())
    }

    /// Trap cases selected by name (all when `names` is empty); full or short name
    /// (without `rshmem_trap_`); an unknown name is an error listing the known ones.
    pub fn select_traps(&self, names: &[String]) -> Result<Vec<&TrapCase>> {
        if names.is_empty() {
            return Ok(self.traps.iter().collect());
        }
        names
            .iter()
            .map(|n| {
                self.traps
                    .iter()
                    .find(|t| &t.name == n || t.name.strip_prefix("rshmem_trap_") == Some(n))
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "no GPU trap case {n:?}; known: {}",
                            self.traps
                                .iter()
                                .map(|t| t.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })
            })
            .collect()
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
            .chain(self.traps.iter().map(|t| t.module.as_str()))
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
         "kind": "bandwidth", "grid": 32, "block": 256, "scratch_bytes": 33554432}
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
        assert_eq!((k.grid, k.block), (32, 256));
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

    #[test]
    fn parity_teams_cover_every_pe_once() {
        assert_eq!(parity_teams(2), [(0, 1), (1, 1)]);
        assert_eq!(parity_teams(5), [(0, 3), (1, 2)]);
        for n in 2..20 {
            let mut seen = vec![0; n];
            for (start, size) in parity_teams(n) {
                for i in 0..size {
                    seen[start + 2 * i] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{n}: {seen:?}");
        }
        // A parity case must allow an odd PE.
        let mut v: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        v["tests"][0]["team"] = "parity".into();
        v["tests"][0]["min_pes"] = 1.into();
        let e = Manifest::parse(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("needs min_pes >= 2"), "{e}");
        v["tests"][0]["min_pes"] = 2.into();
        let m = Manifest::parse(&v.to_string()).unwrap();
        assert_eq!(m.tests[0].team.as_deref(), Some(TEAM_PARITY));
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
            (
                "team",
                "\"halves\"",
                "unknown team \"halves\" (known: \"parity\")",
            ),
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
        // A bench block past the kernels' launch bounds.
        let mut v: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        v["benches"][1]["block"] = 512.into();
        let e = Manifest::parse(&v.to_string()).unwrap_err().to_string();
        assert!(
            e.contains("rshmem_bench_put_bw_block")
                && e.contains("grid 32 block 512: need grid >= 1 and block in 1..=256"),
            "{e}"
        );
    }

    const TRAPS: &str = r#"{"tests": [], "traps": [
        {"name": "rshmem_trap_bad_pe", "module": "m", "grid": 1, "block": 1, "scratch_bytes": 4096,
         "expect_code": 2, "expect": {"pe": "n_pes", "addr": "scratch + 0x40", "expected": 8, "cmp": 0,
         "message": ["PE out of range"]}},
        {"name": "rshmem_trap_unbound", "kernel": "rshmem_trap_bad_pe", "module": "m", "grid": 1,
         "block": 1, "scratch_bytes": 4096, "expect_code": 1, "bind": false, "timeout_ms": 200,
         "expect": {"pe": -1, "addr": "heap_end-4", "observed": 18446744073709551615, "record": false}}
    ]}"#;

    #[test]
    fn parses_trap_cases_and_their_expressions() {
        let m = Manifest::parse(TRAPS).unwrap();
        let (a, b) = (&m.traps[0], &m.traps[1]);
        assert_eq!(
            (a.kernel(), a.bind, a.timeout_ms, a.min_pes, a.params3()),
            ("rshmem_trap_bad_pe", true, None, 1, [0, 0, 0])
        );
        assert_eq!(
            a.expect.pe,
            Some(Sym::Expr {
                base: "n_pes".into(),
                offset: 0
            })
        );
        assert_eq!(
            a.expect.addr,
            Some(Sym::Expr {
                base: "scratch".into(),
                offset: 64
            })
        );
        assert_eq!(
            (
                a.expect.expected.clone(),
                a.expect.observed.clone(),
                a.expect.cmp,
                a.expect.record
            ),
            (Some(Sym::Int(8)), None, Some(0), true)
        );
        assert_eq!(a.expect.message, ["PE out of range"]);
        assert_eq!(
            (b.kernel(), b.bind, b.timeout_ms, b.expect.record),
            ("rshmem_trap_bad_pe", false, Some(200), false)
        );
        let env = TrapEnv {
            my_pe: 2,
            n_pes: 3,
            heap_base: 0x1000,
            heap_size: 0x100,
            scratch: 0x1040,
            result: 7,
        };
        assert_eq!(a.expect.pe.as_ref().unwrap().eval(&env), 3);
        assert_eq!(a.expect.addr.as_ref().unwrap().eval(&env), 0x1080);
        assert_eq!(b.expect.pe.as_ref().unwrap().eval(&env), -1);
        assert_eq!(b.expect.addr.as_ref().unwrap().eval(&env), 0x10fc);
        assert_eq!(
            b.expect.observed.as_ref().unwrap().eval(&env),
            u64::MAX as i128
        );
        assert_eq!(Sym::parse("result").unwrap().eval(&env), 7);
        assert_eq!(Sym::parse("my_pe+1").unwrap().to_string(), "my_pe+1");
        assert_eq!(
            Sym::parse("heap_end - 4").unwrap().to_string(),
            "heap_end-4"
        );
        assert_eq!(
            m.select_traps(&["unbound".into()]).unwrap()[0].name,
            "rshmem_trap_unbound"
        );
        let e = m.select_traps(&["nope".into()]).unwrap_err().to_string();
        assert!(
            e.contains("no GPU trap case \"nope\"; known: rshmem_trap_bad_pe, rshmem_trap_unbound"),
            "{e}"
        );
        assert_eq!(m.modules().into_iter().collect::<Vec<_>>(), ["m"]);
    }

    #[test]
    fn rejects_bad_trap_cases_naming_them() {
        for (field, value, expect) in [
            (
                "name",
                "\"rshmem_test_x\"",
                "trap case names start with rshmem_trap_",
            ),
            ("name", "\"rshmem_trap_unbound\"", "name appears twice"),
            (
                "expect_code",
                "0",
                "expect_code 0 is not a RSHMEM_DEVICE_ERR_* code (1..=6)",
            ),
            ("expect_code", "7", "expect_code 7"),
            ("grid", "0", "need grid >= 1"),
            ("block", "1025", "block 1025"),
            ("scratch_bytes", "64", "scratch_bytes must be at least 128"),
            ("timeout_ms", "0", "timeout_ms 0"),
            ("params", "[1,2,3,4]", "at most 3 params"),
            ("kernel", "\"\"", "kernel must not be empty"),
        ] {
            let mut v: serde_json::Value = serde_json::from_str(TRAPS).unwrap();
            v["traps"][0][field] = serde_json::from_str(value).unwrap();
            let e = Manifest::parse(&v.to_string()).unwrap_err().to_string();
            assert!(e.contains(expect), "{field}={value}: {e}");
        }
        for (value, expect) in [
            (
                "\"heap\"",
                "\"heap\" is not one of my_pe, n_pes, heap_base, heap_end, scratch, result",
            ),
            ("\"scratch+x\"", "\"x\" is not an integer"),
            ("1.5", "not valid"),
        ] {
            let mut v: serde_json::Value = serde_json::from_str(TRAPS).unwrap();
            v["traps"][0]["expect"]["addr"] = serde_json::from_str(value).unwrap();
            let e = Manifest::parse(&v.to_string()).unwrap_err().to_string();
            assert!(e.contains(expect), "addr={value}: {e}");
        }
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
        let traps = m.traps.iter().map(|t| (&t.module, t.kernel()));
        let names: Vec<(&String, &str)> =
            names.map(|(m, n)| (m, n.as_str())).chain(traps).collect();
        assert!(m.traps.len() >= 7, "{} trap cases", m.traps.len());
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
