//! examples/gpu_ring: launches the user kernel of `examples/gpu_ring/ring.cu` (a ring
//! exchange with `rshmem_uint64_put_signal_block` + `rshmem_signal_wait_until`) from Rust,
//! with N GPU PEs as threads of this process on the visible GPU(s), and checks the result
//! exactly. It uses only the public rshmem API:
//!
//! 1. `rshmem::gpu::run_gpu_threads(n, settings, |pe| ...)` starts the PEs;
//! 2. `GpuPe::load_module` loads the kernel's PTX (built with nvcc by `scripts/build-ptx`
//!    into `examples/gpu_ring/ring.ptx` and embedded here; `--ptx FILE` loads another);
//! 3. `GpuPe::bind_module` — the one host call a user module needs — writes the PE's
//!    device state into the module's `rshmemi_device_state`;
//! 4. `GpuPe::calloc` allocates the symmetric buffers, `GpuPe::ptr` gives their device
//!    addresses, `GpuPe::launch_raw` launches `ring_exchange` on every PE at once, and
//!    `GpuPe::sync` waits for it (bounded by RSHMEM_TIMEOUT_MS);
//! 5. the kernel counts the words it checked and the mismatches; the host then reads each
//!    PE's receive buffer and signal word back and compares them with the values the left
//!    neighbour sent in the last round (`rshmem::gpu::pattern_u64`, the host twin of
//!    `rshmem/pattern.cuh`).
//!
//! Run: `cargo run --release --example gpu_ring -- --pes 4` (exit 0 when every PE's data
//! is exact). Without the NVIDIA driver it stops with "libcuda.so.1 not found".

use rshmem::gpu::{pattern_u64, run_gpu_threads, GpuPe};
use rshmem::{Error, Result, Settings};
use std::ffi::c_void;
use std::path::PathBuf;

/// The PTX of ring.cu, built by scripts/build-ptx (committed; CI checks it is fresh).
const RING_PTX: &str = include_str!("ring.ptx");
const KERNEL: &str = "ring_exchange";
/// Threads per block (one block per PE: the kernel uses the one-block device barrier).
const BLOCK: u32 = 256;
const SEED: u64 = 0x51_0000;

#[derive(Debug, Clone, PartialEq)]
struct Opts {
    pes: usize,
    words: u64,
    rounds: u64,
    ptx: Option<PathBuf>,
}

const USAGE: &str = "usage: gpu_ring [--pes N (2..=64, default 4)] [--words W (1..=1048576, default 4096)] \
                     [--rounds R (1..=1000, default 8)] [--ptx FILE (default: the embedded ring.ptx)]";

fn parse_args(args: &[String]) -> std::result::Result<Opts, String> {
    let mut o = Opts {
        pes: 4,
        words: 4096,
        rounds: 8,
        ptx: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value; {USAGE}"))
        };
        let num = |name: &str, v: String, lo: u64, hi: u64| match v.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(format!(
                "{name} {v:?} is not an integer in {lo}..={hi}; {USAGE}"
            )),
        };
        match a.as_str() {
            "--pes" => o.pes = num("--pes", val("--pes")?, 2, 64)? as usize,
            "--words" => o.words = num("--words", val("--words")?, 1, 1 << 20)?,
            "--rounds" => o.rounds = num("--rounds", val("--rounds")?, 1, 1000)?,
            "--ptx" => o.ptx = Some(PathBuf::from(val("--ptx")?)),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(o)
}

/// What one PE saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeResult {
    /// Mismatches the kernel counted (all rounds).
    kernel_errors: u64,
    /// Words the kernel compared (all rounds).
    kernel_checked: u64,
    /// The first word of the final receive buffer (read by the host) that differs from the
    /// left neighbour's last round, and how many differ.
    host_first_bad: Option<u64>,
    host_bad: u64,
    /// The signal word after the last round.
    signal: u64,
}

/// The value the left neighbour of `pe` sent at word `i` of round `r` (ring.cu).
fn expected_word(pe: usize, n: usize, r: u64, i: u64) -> u64 {
    let left = ((pe + n - 1) % n) as u64;
    pattern_u64(SEED + left * 1000 + r, i)
}

/// Every PE's result against the exact expectations; Err lists every wrong value.
fn check(o: &Opts, results: &[PeResult]) -> std::result::Result<(), Vec<String>> {
    let mut bad = Vec::new();
    if results.len() != o.pes {
        bad.push(format!("{} PE results for {} PEs", results.len(), o.pes));
    }
    for (pe, r) in results.iter().enumerate() {
        let want_checked = o.words * o.rounds;
        if r.kernel_errors != 0 {
            bad.push(format!(
                "PE {pe}: the kernel found {} wrong words",
                r.kernel_errors
            ));
        }
        if r.kernel_checked != want_checked {
            bad.push(format!(
                "PE {pe}: the kernel checked {} words, expected {want_checked}",
                r.kernel_checked
            ));
        }
        if let Some(i) = r.host_first_bad {
            bad.push(format!(
                "PE {pe}: {} words of the final buffer differ from the left neighbour's last round (first: word {i})",
                r.host_bad
            ));
        }
        if r.signal != o.rounds {
            bad.push(format!(
                "PE {pe}: signal word is {}, expected {} (the last round's value)",
                r.signal, o.rounds
            ));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// One PE: load + bind the module, allocate, launch, wait, read back.
fn ring_pe(g: &GpuPe, o: &Opts, ptx: &str) -> Result<PeResult> {
    let me = g.my_pe();
    let n = g.n_pes();
    let mut m = g.load_module("gpu_ring", ptx)?;
    g.bind_module(&mut m)?;
    let bytes = (2 * o.words * 8 + 64) as usize;
    // Symmetric (collective) allocations, zeroed: send + receive buffers, the signal word,
    // and two counters the kernel adds its totals to (only this PE's copy is used).
    let buf = g.calloc(bytes)?;
    let sig = g.calloc(8)?;
    let counters = g.calloc(16)?;
    let addr = |off: usize, len: usize| {
        g.ptr(off, len, me).ok_or_else(|| {
            Error::InvalidArgument(format!("PE {me}: no device address for heap offset {off}"))
        })
    };
    let (mut a_buf, mut a_sig) = (addr(buf.offset(), bytes)?, addr(sig.offset(), 8)?);
    let (mut words, mut rounds, mut seed) = (o.words, o.rounds, SEED);
    let mut a_err = addr(counters.offset(), 8)?;
    let mut a_chk = addr(counters.offset() + 8, 8)?;
    // Every PE's buffers are zeroed before any kernel may write into them.
    g.pe().barrier_all()?;
    let mut params = [
        (&mut a_buf as *mut u64).cast::<c_void>(),
        (&mut a_sig as *mut u64).cast(),
        (&mut words as *mut u64).cast(),
        (&mut rounds as *mut u64).cast(),
        (&mut seed as *mut u64).cast(),
        (&mut a_err as *mut u64).cast(),
        (&mut a_chk as *mut u64).cast(),
    ];
    // SAFETY: ring_exchange(uint64_t* sym_buf, uint64_t* sym_signal, uint64_t words,
    // uint64_t rounds, uint64_t seed, unsigned long long* errors, unsigned long long*
    // checked): seven 8-byte parameters, each pointer above points at a u64 that lives
    // until the launch call returns; the device pointers are this PE's symmetric buffers
    // of the sizes the kernel uses (2 * words + 8 words, 1 word, 2 words).
    unsafe { g.launch_raw(&m, KERNEL, 1, BLOCK, 0, &mut params, false)? };
    g.sync(KERNEL)?;
    let mut c = [0u8; 16];
    g.read_local(counters.offset(), &mut c)?;
    let mut s = [0u8; 8];
    g.read_local(sig.offset(), &mut s)?;
    let mut recv = vec![0u8; (o.words * 8) as usize];
    g.read_local(buf.offset() + (o.words * 8) as usize, &mut recv)?;
    let last = o.rounds - 1;
    let wrong: Vec<u64> = (0..o.words)
        .filter(|&i| word(&recv, i as usize) != expected_word(me, n, last, i))
        .collect();
    // Nobody frees (a collective) while a peer may still read our buffers.
    g.pe().barrier_all()?;
    Ok(PeResult {
        kernel_errors: word(&c, 0),
        kernel_checked: word(&c, 1),
        host_first_bad: wrong.first().copied(),
        host_bad: wrong.len() as u64,
        signal: word(&s, 0),
    })
}

fn run(o: &Opts) -> Result<Vec<PeResult>> {
    let ptx = match &o.ptx {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| Error::io(format!("reading {}", p.display()), e))?,
        None => RING_PTX.to_string(),
    };
    let mut settings = Settings::from_env()?;
    let need = rshmem::heap::RESERVED_BYTES
        + ((2 * o.words * 8 + 4096) as usize).next_multiple_of(1 << 20);
    settings.symmetric_size = settings.symmetric_size.max(need);
    let per_pe = run_gpu_threads(o.pes, settings, |g| {
        if g.my_pe() == 0 {
            let d = g.device();
            println!(
                "gpu_ring: {} PEs on GPU {} {} ({} PE(s) on this GPU), {} rounds of {} words",
                g.n_pes(),
                d.ordinal,
                d.name,
                g.pes_sharing_gpu(),
                o.rounds,
                o.words
            );
        }
        ring_pe(g, o, &ptx)
    })?;
    per_pe
        .into_iter()
        .enumerate()
        .map(|(pe, r)| r.map_err(|e| Error::Verification(format!("PE {pe}: {e}"))))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return;
    }
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu_ring: {e}");
            std::process::exit(2);
        }
    };
    let results = match run(&o) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpu_ring: {e}");
            std::process::exit(1);
        }
    };
    for (pe, r) in results.iter().enumerate() {
        println!(
            "gpu_ring: PE {pe}: kernel checked {} words, {} wrong; host: final buffer {} wrong of {}; signal {}",
            r.kernel_checked, r.kernel_errors, r.host_bad, o.words, r.signal
        );
    }
    match check(&o, &results) {
        Ok(()) => println!(
            "gpu_ring: ok ({} PEs, {} rounds of {} words, every value exact)",
            o.pes, o.rounds, o.words
        ),
        Err(bad) => {
            for b in bad {
                eprintln!("gpu_ring: FAIL: {b}");
            }
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options() {
        assert_eq!(
            parse_args(&[]).unwrap(),
            Opts {
                pes: 4,
                words: 4096,
                rounds: 8,
                ptx: None
            }
        );
        assert_eq!(
            parse_args(&args(&[
                "--pes", "8", "--words", "1", "--rounds", "3", "--ptx", "r.ptx"
            ]))
            .unwrap(),
            Opts {
                pes: 8,
                words: 1,
                rounds: 3,
                ptx: Some("r.ptx".into())
            }
        );
        for (a, e) in [
            (
                &["--pes", "1"][..],
                "--pes \"1\" is not an integer in 2..=64",
            ),
            (
                &["--words", "0"][..],
                "--words \"0\" is not an integer in 1..=1048576",
            ),
            (
                &["--rounds", "x"][..],
                "--rounds \"x\" is not an integer in 1..=1000",
            ),
            (&["--pes"][..], "--pes needs a value"),
            (&["--bogus"][..], "unknown argument \"--bogus\""),
        ] {
            let err = parse_args(&args(a)).unwrap_err();
            assert!(
                err.starts_with(e) && err.contains("usage: gpu_ring"),
                "{a:?}: {err}"
            );
        }
    }

    #[test]
    fn expected_words_come_from_the_left_neighbour() {
        // PE 0's left neighbour of 4 is PE 3: seed + 3000 + round.
        assert_eq!(expected_word(0, 4, 7, 5), pattern_u64(SEED + 3007, 5));
        assert_eq!(expected_word(2, 4, 0, 0), pattern_u64(SEED + 1000, 0));
        assert_ne!(expected_word(2, 4, 0, 0), expected_word(3, 4, 0, 0));
    }

    #[test]
    fn the_check_is_exact() {
        let o = Opts {
            pes: 2,
            words: 10,
            rounds: 3,
            ptx: None,
        };
        let good = PeResult {
            kernel_errors: 0,
            kernel_checked: 30,
            host_first_bad: None,
            host_bad: 0,
            signal: 3,
        };
        assert_eq!(check(&o, &[good, good]), Ok(()));
        let e = check(
            &o,
            &[
                good,
                PeResult {
                    kernel_errors: 1,
                    kernel_checked: 29,
                    host_first_bad: Some(4),
                    host_bad: 2,
                    signal: 2,
                },
            ],
        )
        .unwrap_err();
        assert_eq!(
            e,
            [
                "PE 1: the kernel found 1 wrong words",
                "PE 1: the kernel checked 29 words, expected 30",
                "PE 1: 2 words of the final buffer differ from the left neighbour's last round (first: word 4)",
                "PE 1: signal word is 2, expected 3 (the last round's value)"
            ]
        );
        assert_eq!(check(&o, &[good]).unwrap_err(), ["1 PE results for 2 PEs"]);
    }

    #[test]
    fn the_embedded_ptx_is_the_built_kernel() {
        assert!(RING_PTX.contains("Generated by scripts/build-ptx from examples/gpu_ring/ring.cu"));
        assert!(RING_PTX.contains(".visible .entry ring_exchange("));
        assert!(RING_PTX.contains("rshmemi_device_state"));
    }

    /// Without the NVIDIA driver the example stops with the runtime's clear error.
    #[test]
    fn without_libcuda_it_says_so() {
        if rshmem::gpu::driver::driver().is_ok() {
            return; // a GPU machine: scripts/gpu-check runs the example for real
        }
        let e = run(&parse_args(&[]).unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("libcuda.so.1 not found); install the NVIDIA driver"),
            "{e}"
        );
    }
}
