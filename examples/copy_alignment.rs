//! glibc's memmove against `rshmem::copy::copy_bytes`, side by side, for the relative
//! alignments where glibc's `rep movsb` path is slow on some CPUs (AMD Zen 3 measured;
//! see host/src/copy.rs). Prints GB/s for each size and destination-minus-source residue
//! mod 64, and the ratio. Run: `cargo run --release --example copy_alignment`.
use rshmem::copy::{copy_bytes, takes_vector_loop};
use std::time::Instant;

fn rate(mut f: impl FnMut(), bytes: usize) -> f64 {
    // Enough repetitions for ~50 ms per cell, after one untimed call.
    f();
    let reps = ((1usize << 30) / bytes).clamp(16, 1 << 18);
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    (reps * bytes) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    // Source at the start of a 64 MiB buffer, destination 32 MiB further plus the residue.
    let mut buf = vec![1u8; 64 << 20];
    let base = buf.as_mut_ptr();
    let pad = (4096 - base as usize % 4096) % 4096;
    println!("size      residue  memmove GB/s  copy_bytes GB/s  ratio  vector loop");
    for size in [4096usize, 16 << 10, 64 << 10, 256 << 10, 1 << 20] {
        for residue in [0usize, 8, 16, 48] {
            // SAFETY: pad + 32 MiB + residue + size stays inside the 64 MiB buffer.
            let (src, dst) = unsafe {
                (
                    base.add(pad).cast_const(),
                    base.add(pad + (32 << 20) + residue),
                )
            };
            // SAFETY (both closures): src..src+size and dst..dst+size lie in `buf`, disjoint.
            let glibc = rate(|| unsafe { std::ptr::copy(src, dst, size) }, size);
            let ours = rate(|| unsafe { copy_bytes(src, dst, size) }, size);
            println!(
                "{size:>8}  {residue:>7}  {glibc:>12.1}  {ours:>15.1}  {:>5.1}  {}",
                ours / glibc,
                takes_vector_loop(dst, src, size)
            );
        }
    }
    std::hint::black_box(&buf);
}
