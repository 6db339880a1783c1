//! Rust mirror of `device-kernels/include/rshmem/internal/harness.cuh`: the argument block
//! of the library's GPU self-test and benchmark kernels and the records they fill.
//! Layout asserted here and compared with the C compiler in `host/tests/gpu_layouts.rs`.

use std::mem::{offset_of, size_of};

/// `rshmem_harness_args_t`: passed by value to every test and bench kernel. 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HarnessArgs {
    /// Heap offset of the symmetric scratch range.
    pub scratch: u64,
    pub scratch_bytes: u64,
    /// Device pointer to the result (tests) or bench record (benches).
    pub result: u64,
    pub param0: u64,
    pub param1: u64,
    pub param2: u64,
    pub seed: u64,
    /// Test cases with a manifest `team`: this PE's device team handle (`rshmem_team_t`,
    /// sign-extended); else 0 (`RSHMEM_TEAM_WORLD`).
    pub team: u64,
}

/// `rshmem_test_result_t`. 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TestResult {
    pub checks: u64,
    pub failures: u64,
    pub first_index: u64,
    pub expected: u64,
    pub observed: u64,
    pub reserved: [u64; 3],
}

/// `rshmem_bench_record_t`. 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BenchRecord {
    pub start_ns: u64,
    pub end_ns: u64,
    pub iters: u64,
    pub bytes: u64,
    pub checksum: u64,
    pub reserved: [u64; 3],
}

const _: () = {
    assert!(size_of::<HarnessArgs>() == 64);
    assert!(size_of::<TestResult>() == 64);
    assert!(size_of::<BenchRecord>() == 64);
};

impl TestResult {
    /// The device's layout (little-endian words in field order).
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        let w = [
            self.checks,
            self.failures,
            self.first_index,
            self.expected,
            self.observed,
            self.reserved[0],
            self.reserved[1],
            self.reserved[2],
        ];
        for (c, v) in b.chunks_exact_mut(8).zip(w) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8; 64]) -> TestResult {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        TestResult {
            checks: w(0),
            failures: w(1),
            first_index: w(2),
            expected: w(3),
            observed: w(4),
            reserved: [w(5), w(6), w(7)],
        }
    }
}

impl BenchRecord {
    pub fn from_bytes(b: &[u8; 64]) -> BenchRecord {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        BenchRecord {
            start_ns: w(0),
            end_ns: w(1),
            iters: w(2),
            bytes: w(3),
            checksum: w(4),
            reserved: [w(5), w(6), w(7)],
        }
    }

    /// Elapsed nanoseconds of the timed part; None when the kernel left the record unset
    /// or the clock ran backwards.
    pub fn elapsed_ns(&self) -> Option<u64> {
        (self.end_ns > self.start_ns && self.start_ns != 0).then(|| self.end_ns - self.start_ns)
    }
}

/// Offsets and sizes as (C name, value) for the C-compiler comparison.
pub fn layout_table() -> Vec<(&'static str, usize)> {
    vec![
        ("sizeof.rshmem_harness_args_t", size_of::<HarnessArgs>()),
        (
            "rshmem_harness_args_t.scratch",
            offset_of!(HarnessArgs, scratch),
        ),
        (
            "rshmem_harness_args_t.scratch_bytes",
            offset_of!(HarnessArgs, scratch_bytes),
        ),
        (
            "rshmem_harness_args_t.result",
            offset_of!(HarnessArgs, result),
        ),
        (
            "rshmem_harness_args_t.param0",
            offset_of!(HarnessArgs, param0),
        ),
        (
            "rshmem_harness_args_t.param1",
            offset_of!(HarnessArgs, param1),
        ),
        (
            "rshmem_harness_args_t.param2",
            offset_of!(HarnessArgs, param2),
        ),
        ("rshmem_harness_args_t.seed", offset_of!(HarnessArgs, seed)),
        ("rshmem_harness_args_t.team", offset_of!(HarnessArgs, team)),
        ("sizeof.rshmem_test_result_t", size_of::<TestResult>()),
        (
            "rshmem_test_result_t.checks",
            offset_of!(TestResult, checks),
        ),
        (
            "rshmem_test_result_t.failures",
            offset_of!(TestResult, failures),
        ),
        (
            "rshmem_test_result_t.first_index",
            offset_of!(TestResult, first_index),
        ),
        (
            "rshmem_test_result_t.expected",
            offset_of!(TestResult, expected),
        ),
        (
            "rshmem_test_result_t.observed",
            offset_of!(TestResult, observed),
        ),
        (
            "rshmem_test_result_t.reserved",
            offset_of!(TestResult, reserved),
        ),
        ("sizeof.rshmem_bench_record_t", size_of::<BenchRecord>()),
        (
            "rshmem_bench_record_t.start_ns",
            offset_of!(BenchRecord, start_ns),
        ),
        (
            "rshmem_bench_record_t.end_ns",
            offset_of!(BenchRecord, end_ns),
        ),
        (
            "rshmem_bench_record_t.iters",
            offset_of!(BenchRecord, iters),
        ),
        (
            "rshmem_bench_record_t.bytes",
            offset_of!(BenchRecord, bytes),
        ),
        (
            "rshmem_bench_record_t.checksum",
            offset_of!(BenchRecord, checksum),
        ),
        (
            "rshmem_bench_record_t.reserved",
            offset_of!(BenchRecord, reserved),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_little_endian_words() {
        let mut b = [0u8; 64];
        for i in 0..8 {
            b[i * 8..i * 8 + 8].copy_from_slice(&(100 + i as u64).to_le_bytes());
        }
        let t = TestResult::from_bytes(&b);
        assert_eq!((t.checks, t.failures, t.first_index), (100, 101, 102));
        assert_eq!(
            (t.expected, t.observed, t.reserved),
            (103, 104, [105, 106, 107])
        );
        let r = BenchRecord::from_bytes(&b);
        assert_eq!(
            (r.start_ns, r.end_ns, r.iters, r.bytes),
            (100, 101, 102, 103)
        );
        assert_eq!(r.elapsed_ns(), Some(1));
        assert_eq!(BenchRecord::default().elapsed_ns(), None);
    }
}
