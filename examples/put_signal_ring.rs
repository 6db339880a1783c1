//! A ring exchange among CPU PEs: each PE puts a block into its successor with a signal,
//! waits for its predecessor's block, and checks every value.
//!
//! Run: `cargo build --release --example put_signal_ring &&
//!       target/release/rshmem run -n 4 -- target/release/examples/put_signal_ring`
use rshmem::{Cmp, Pe, SignalOp};

fn main() -> rshmem::Result<()> {
    let pe = Pe::init()?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let data = pe.calloc::<u64>(1024)?; // collective: the same offset on every PE
    let sig = pe.calloc::<u64>(1)?;
    let msg: Vec<u64> = (0..1024).map(|i| (me * 1000 + i) as u64).collect();
    pe.put_signal(data, &msg, sig, 1, SignalOp::Add, (me + 1) % n)?;
    pe.signal_wait_until(sig, Cmp::Ge, 1)?; // bounded by RSHMEM_TIMEOUT_MS
    let mut got = vec![0u64; 1024];
    pe.get(&mut got, data, me)?;
    let prev = (me + n - 1) % n;
    let ok = got
        .iter()
        .enumerate()
        .all(|(i, &v)| v == (prev * 1000 + i) as u64);
    println!(
        "PE {me}: block from PE {prev} {}",
        if ok { "correct" } else { "WRONG" }
    );
    pe.barrier_all()?;
    pe.finalize()?;
    if ok {
        Ok(())
    } else {
        Err(rshmem::Error::Verification(format!(
            "PE {me}: wrong data from PE {prev}"
        )))
    }
}
