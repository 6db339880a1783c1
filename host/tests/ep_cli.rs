//! `rshmem bench ep` from the command line: PEs as threads and as processes under
//! `rshmem run`, the JSON report, and bad arguments failing with a non-zero exit.
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");
const SMALL: [&str; 12] = [
    "--tokens",
    "8",
    "--hidden",
    "256",
    "--experts",
    "8",
    "--topk",
    "4",
    "--iters",
    "20",
    "--warmup",
    "2",
];

fn check_json(v: &serde_json::Value, pes: u64) {
    assert_eq!(v["bench"], "ep");
    assert_eq!(v["validated"], true, "{v}");
    assert_eq!(v["pes"], pes);
    assert_eq!(v["tokens"], 8);
    assert_eq!(v["hidden"], 256);
    assert_eq!(v["topk"], 4);
    assert_eq!(v["experts"], 8);
    for k in [
        "dispatch_us_median",
        "dispatch_us_p99",
        "combine_us_median",
        "combine_us_p99",
    ] {
        let x = v[k].as_f64().unwrap();
        assert!(x > 0.0, "{k}: {v}");
    }
    assert!(v["dispatch_us_p99"].as_f64() >= v["dispatch_us_median"].as_f64());
    assert!(v["combine_calc_diff"].as_f64().unwrap() < 9e-4);
}

#[test]
fn bench_ep_threads_json_hooks_zero_copy() {
    let o = Command::new(BIN)
        .args([
            "bench",
            "ep",
            "--pes",
            "2",
            "--json",
            "--hook",
            "--zero-copy",
        ])
        .args(SMALL)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    check_json(&v, 2);
    assert_eq!(v["transport"], "p2p", "{v}");
    assert!(v["dispatch_send_us_median"].as_f64().unwrap() > 0.0);
    assert_eq!(v["points"].as_array().unwrap().len(), 1);
}

/// `--transport proxy`: every peer through the soft HCA (the message path), validated, and
/// named in the report; under a launcher it must match the PEs' RSHMEM_TRANSPORT.
#[test]
fn bench_ep_transport_proxy() {
    let o = Command::new(BIN)
        .args([
            "bench",
            "ep",
            "--pes",
            "3",
            "--json",
            "--transport",
            "proxy",
        ])
        .args(["--experts", "6"])
        .args(&SMALL[..4])
        .args(&SMALL[6..])
        .env_remove("RSHMEM_TRANSPORT")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["validated"], true, "{v}");
    assert_eq!(v["pes"], 3);
    assert_eq!(v["experts"], 6);
    assert_eq!(v["transport"], "proxy", "{v}");
    assert!(v["combine_calc_diff"].as_f64().unwrap() < 9e-4, "{v}");

    let o = Command::new(BIN)
        .args([
            "run",
            "-n",
            "2",
            "--",
            BIN,
            "bench",
            "ep",
            "--transport",
            "proxy",
        ])
        .args(SMALL)
        .env_remove("RSHMEM_TRANSPORT")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--transport proxy but RSHMEM_TRANSPORT=auto: under a launcher, export RSHMEM_TRANSPORT=proxy"),
        "{err}"
    );

    let o = Command::new(BIN)
        .args(["bench", "ep", "--transport", "tcp"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid value 'tcp' for '--transport <TRANSPORT>'")
            && err.contains("[possible values: p2p, proxy, ibgda]"),
        "{err}"
    );
}

#[test]
fn bench_ep_under_rshmem_run_as_processes() {
    let o = Command::new(BIN)
        .args([
            "run", "-n", "4", "--", BIN, "bench", "ep", "--json", "--bf16",
        ])
        .args(SMALL)
        .env("RSHMEM_SYMMETRIC_SIZE", "32M")
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("\"bench\"")).collect();
    assert_eq!(lines.len(), 1, "{out}");
    let v: serde_json::Value =
        serde_json::from_str(lines[0].trim_start_matches("[pe 0] ")).unwrap();
    check_json(&v, 4);
    assert_eq!(v["fp8"], false);
}

/// Under a launcher without --pes, the count checks use the job's size: 200 000
/// iterations' times from 8 PEs do not fit one gather (they do from 4, the default
/// without a launcher, which the check used before and so let the job run to its end and
/// fail there).
#[test]
fn bench_ep_under_a_launcher_checks_counts_for_the_jobs_size() {
    let o = Command::new(BIN)
        .args([
            "run",
            "-n",
            "8",
            "--",
            BIN,
            "bench",
            "ep",
            "--iters",
            "200000",
            "--tokens",
            "4",
            "--experts",
            "8",
            "--hidden",
            "256",
        ])
        .env("RSHMEM_TIMEOUT_MS", "20000")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--iters 200000 at 8 PEs"), "{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn bench_ep_rejects_bad_arguments() {
    for (args, msg) in [
        (
            vec!["--device", "tpu"],
            "--device tpu: expected cpu, gpu or auto",
        ),
        (vec!["--check"], "--check is the GPU correctness suite"),
        (
            vec!["--pes", "3"],
            "must be a positive multiple of the team size (3)",
        ),
        (vec!["--topk", "12"], "num_topk (12) must be in 1..=11"),
        (vec!["--hidden", "200"], "must be a multiple of 128"),
        (vec!["--iters", "0"], "--iters"),
        // 48 bytes of times per iteration on every PE: a bound, not a 48 GB allocation.
        (
            vec!["--iters", "1000000000"],
            "--iters 1000000000: at most 1000000",
        ),
        (
            vec!["--warmup", "2000000"],
            "--warmup 2000000: at most 1000000",
        ),
        // PE 0 gathers every PE's times in one 64 MiB bootstrap message (this count
        // passed the check and failed after the timed run).
        (
            vec!["--iters", "200000", "--pes", "8"],
            "--iters 200000 at 8 PEs: every PE's 48 bytes per iteration are gathered in \
             one message of at most 64 MiB, which holds at most 174677 iterations at 8 PEs",
        ),
        (
            vec!["--pes", "2,0"],
            "--pes 0: every value of --pes must be at least 1",
        ),
        (
            vec!["--tokens", "0"],
            "--tokens 0: every value of --tokens must be at least 1",
        ),
        (
            vec!["--plot", "/nonexistent/lat.png"],
            "--plot /nonexistent/lat.png: /nonexistent is not an existing folder",
        ),
        (
            // Expert outputs of 8 experts × 2^20 tokens × 2^20 bf16 channels on each of the
            // 4 PEs: 64 TiB, more than any machine.
            vec!["--hidden", "1048576", "--tokens", "1048576"],
            "lower --tokens or --pes",
        ),
        (
            vec!["--plot", "lat.svg"],
            "--plot lat.svg: the plot is a PNG file: give a name ending in .png",
        ),
    ] {
        let o = Command::new(BIN)
            .args(["bench", "ep", "--tokens", "4", "--experts", "8"])
            .args(&args)
            .args(if args.contains(&"--hidden") {
                vec![]
            } else {
                vec!["--hidden", "256"]
            })
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
        // Refused before anything ran: no table.
        assert!(
            o.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

#[test]
fn bench_ep_plot_writes_a_png() {
    let dir = std::env::temp_dir().join(format!("rshmem-ep-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("lat.png");
    let o = Command::new(BIN)
        .args(["bench", "ep", "--pes", "1,2", "--plot"])
        .arg(&png)
        .args(SMALL)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The text names each point's buffer and bytes (they differ with the PE count).
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("buffer: ")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("1 PEs, 8 tokens: buffer: "), "{text}");
    assert!(lines[1].starts_with("2 PEs, 8 tokens: buffer: "), "{text}");
    let b = std::fs::read(&png).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where the tests "have no driver": the runtime loads the file RSHMEM_CUDA_LIB names
/// instead of searching, so a file that is not there means no driver on any machine.
const NO_DRIVER: (&str, &str) = ("RSHMEM_CUDA_LIB", "/nonexistent/libcuda.so.1");

/// GPU runs: an unsupported hidden size (or a bad config) is refused on any machine; a
/// machine without the driver gets a message naming libcuda; both exit 1.
#[test]
fn bench_ep_gpu_errors_are_clear() {
    let run = |args: &[&str]| {
        let o = Command::new(BIN)
            .env(NO_DRIVER.0, NO_DRIVER.1)
            .args(["bench", "ep", "--tokens", "4", "--pes", "2"])
            .args(args)
            .args(if args.contains(&"--experts") {
                &[][..]
            } else {
                &["--experts", "16"][..]
            })
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (rc, err) = run(&["--device", "gpu", "--hidden", "3072"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(
        err.contains("hidden size 3072 has no GPU kernel")
            && err.contains("2048, 2560, 4096, 5120, 7168, 8192"),
        "{err}"
    );
    let (rc, err) = run(&["--device", "gpu", "--hidden", "2048", "--topk", "12"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("num_topk (12) must be in 1..=11"), "{err}");
    let (rc, err) = run(&["--device", "gpu", "--hidden", "2048", "--experts", "15"]);
    assert_eq!(rc, Some(1), "{err}");
    assert!(
        err.contains("num_experts (15) must be a positive multiple"),
        "{err}"
    );
    for args in [
        &["--device", "gpu", "--hidden", "2048"][..],
        &["--device", "gpu", "--hidden", "2048", "--check"][..],
        &[
            "--device",
            "gpu",
            "--hidden",
            "2048",
            "--check",
            "--transport",
            "proxy",
        ][..],
    ] {
        let (rc, err) = run(args);
        assert_eq!(rc, Some(1), "{args:?}: {err}");
        assert!(
            err.contains(
                "libcuda.so.1 not found at RSHMEM_CUDA_LIB=/nonexistent/libcuda.so.1); \
                 install the NVIDIA driver and point RSHMEM_CUDA_LIB at its libcuda.so.1"
            ),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `--device auto` without a driver runs on CPU PEs.
#[test]
fn bench_ep_auto_falls_back_to_cpu() {
    let o = Command::new(BIN)
        .env(NO_DRIVER.0, NO_DRIVER.1)
        .args(["bench", "ep", "--pes", "2", "--json", "--device", "auto"])
        .args(SMALL)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    check_json(&v, 2);
    assert_eq!(v["device"], "cpu");
    assert!(v.get("copy_gbps").is_none(), "{v}");
}
