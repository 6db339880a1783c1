//! Many PEs as threads of one process. They share one mapping of each heap (heap.rs,
//! `open_node_segment`), so a process holds about `MAPPINGS_PER_THREAD_PE` mappings per PE
//! instead of three per PE pair: 200 PEs run here (`vm.max_map_count`'s default capped a
//! process at 147 before), with exact values through puts, an atomic, a small collective
//! and a barrier.
use rshmem::heap::MAPPINGS_PER_THREAD_PE;
use rshmem::types::SymPtr;
use rshmem::{run_threads, Settings};

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .count()
}

/// A value distinct per PE.
fn v(p: usize) -> u64 {
    (p as u64 + 1) * 1_000_003
}

#[test]
fn two_hundred_pes_as_threads_share_their_heap_mappings() {
    const N: usize = 200;
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 1 << 20;
    s.timeout = std::time::Duration::from_secs(60);
    let before = mappings();
    let out = run_threads(N, s, |pe| {
        let (me, n) = (pe.my_pe(), pe.n_pes());
        let ring: SymPtr<u64> = pe.calloc(1)?;
        let mine: SymPtr<u64> = pe.calloc(1)?;
        let all: SymPtr<u64> = pe.calloc(n)?;
        let count: SymPtr<u64> = pe.calloc(1)?;
        pe.p(mine, v(me), me)?;
        pe.put(ring, &[v(me)], (me + 1) % n)?;
        pe.atomic_add(count, me as u64 + 1, 0)?;
        pe.barrier_all()?;
        let from_left = pe.g(ring, me)?;
        pe.fcollect(pe.world(), all, mine, 1)?;
        let mut gathered = vec![0u64; n];
        pe.get(&mut gathered, all, me)?;
        let total = pe.g(count, 0)?;
        // Where this PE reaches every PE's `ring`: the same in every PE of the process.
        let addrs: Vec<usize> = (0..n)
            .map(|p| pe.ptr(ring, p).map_or(0, |a| a as usize))
            .collect();
        let held = mappings();
        pe.barrier_all()?;
        Ok((from_left, gathered, total, addrs, held))
    })
    .expect("job starts");
    let expected: Vec<u64> = (0..N).map(v).collect();
    let mut first_addrs: Option<Vec<usize>> = None;
    let mut most = 0;
    for (me, r) in out.into_iter().enumerate() {
        let (from_left, gathered, total, addrs, held) =
            r.unwrap_or_else(|e| panic!("PE {me}: {e}"));
        assert_eq!(from_left, v((me + N - 1) % N), "PE {me}: ring put");
        assert_eq!(gathered, expected, "PE {me}: fcollect");
        assert_eq!(
            total,
            (N * (N + 1) / 2) as u64,
            "PE {me}: atomic adds on PE 0"
        );
        assert!(addrs.iter().all(|&a| a != 0), "PE {me}: a heap not mapped");
        match &first_addrs {
            None => first_addrs = Some(addrs),
            Some(f) => assert_eq!(&addrs, f, "PE {me} maps a heap apart"),
        }
        most = most.max(held);
    }
    // While all 200 PEs were up (each read after the allocations, before the last barrier).
    let added = most.saturating_sub(before);
    assert!(
        added <= N * MAPPINGS_PER_THREAD_PE,
        "{N} PEs added {added} mappings (at most {} expected)",
        N * MAPPINGS_PER_THREAD_PE
    );
}
