//! Helpers for tests that run PEs as threads of one process (`rshmem::run_threads`).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Waits until `n` PE threads arrived at `counter`, this one included (at most 30 s, then
/// panics naming how many came): a meeting outside rshmem, where an rshmem wait would
/// be wrong. The death tests use it around a death: the PE that dies leaves only once
/// every PE has *returned* from the barrier before (a PE still inside it would see the
/// death first and fail, and its own leave would show the others a second death), and
/// survivors leave together (one that returns first fails its finalize, which needs the
/// dead PE, and drops its `Pe` unannounced: the others would see one more death). Others
/// use it where a PE waits for another's long work, which an rshmem wait would bound by
/// the timeout meant for single operations.
pub fn arrive_and_wait(counter: &AtomicUsize, n: usize) {
    counter.fetch_add(1, SeqCst);
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let came = counter.load(SeqCst);
        if came >= n {
            return;
        }
        assert!(
            Instant::now() < end,
            "{came} of {n} PEs arrived within 30 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
