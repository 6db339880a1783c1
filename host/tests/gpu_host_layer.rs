//! The GPU host layer run on the CPU, against hostcuda (host/tests/hostcuda/hostcuda.c): a
//! stand-in for libcuda.so.1 built here against the pinned CUDA 13.0 `cuda.h`, with host
//! memory as device memory (VMM heaps are memfds mapped at their reservations, so peers'
//! mappings share bytes) and the real driver's checks and errors. Kernel launches are not
//! emulated here (the kernels run in host/tests/device_emu.rs and ep_cuda_parity.rs); what
//! runs is everything around them that no CPU test ran before: GPU PE setup over p2p and
//! the proxy transport (heap creation, fd exchange, peer mappings, the device state, the
//! team entries in the sync scratch), symmetric allocation, stream copies between PEs,
//! teams, module loading and binding, EP buffer creation, masks and destruction, and
//! finalize. (Until 2026-12-05 every GPU PE's setup failed on a bounds check that only a
//! reading of the code found.) Fails, never skips, when the CUDA toolchain is missing:
//! run `scripts/cuda-toolchain` (scripts/test does).

use rshmem::config::Settings;
use rshmem::ep::Config;
use rshmem::gpu::ep::GpuBuffer;
use rshmem::gpu::{run_gpu_threads, GpuPe};
use rshmem::{Error, Result};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

#[path = "hostcuda/build.rs"]
mod hostcuda_build;

/// Builds hostcuda and points RSHMEM_CUDA_LIB at it, before any test of this process
/// touches the driver (the runtime loads it once per process); returns its path.
fn hostcuda() -> PathBuf {
    static SET: OnceLock<PathBuf> = OnceLock::new();
    SET.get_or_init(|| {
        let lib = hostcuda_build::hostcuda_lib();
        std::env::set_var("RSHMEM_CUDA_LIB", &lib);
        // Every PE of a test on the stand-in's device 0.
        std::env::set_var("RSHMEM_DEVICE", "0");
        lib
    })
    .clone()
}

fn settings(transport: &str) -> Settings {
    let t = transport.to_string();
    Settings::from_lookup(move |k| match k {
        "RSHMEM_SYMMETRIC_SIZE" => Some("8M".into()),
        "RSHMEM_TIMEOUT_MS" => Some("10000".into()),
        "RSHMEM_TRANSPORT" => Some(t.clone()),
        _ => None,
    })
    .unwrap()
}

/// Runs `f` on `n` GPU PEs (threads) and returns the first PE's error, naming it.
fn on_gpu_pes(n: usize, transport: &str, f: impl Fn(&GpuPe) -> Result<()> + Sync) {
    hostcuda();
    let out = run_gpu_threads(n, settings(transport), f).expect("GPU PE threads");
    for (pe, r) in out.into_iter().enumerate() {
        if let Err(e) = r {
            panic!("{n} PEs over {transport}: PE {pe}: {e}");
        }
    }
}

fn pattern(pe: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + pe * 31 + 1) as u8).collect()
}

/// Setup, symmetric allocation (same offset on every PE), local writes and reads, a put
/// and a get between PEs on the stream, refusals of bad input, and finalize, over p2p with
/// 2, 3 and 5 PEs on one GPU.
#[test]
fn gpu_pes_set_up_exchange_data_and_finalize_over_p2p() {
    for n in [2, 3, 5] {
        on_gpu_pes(n, "p2p", |g| {
            let (me, n) = (g.my_pe(), g.n_pes());
            let len = 4096;
            let a = g.malloc(len)?;
            let b = g.malloc(len)?;
            if b.offset() != a.offset() + len {
                return Err(Error::Verification(format!(
                    "second allocation at {:#x}, the first at {:#x}",
                    b.offset(),
                    a.offset()
                )));
            }
            // Every peer's heap is mapped here.
            for p in 0..n {
                if g.ptr(a.offset(), len, p).is_none() {
                    return Err(Error::Verification(format!("PE {p}'s heap is not mapped")));
                }
            }
            put_and_get_around_the_ring(g, a.offset(), b.offset(), len)?;
            let src = g.ptr(a.offset(), len, me).unwrap();
            // Bad input: below the user heap, past its end, a PE that does not exist.
            let e = g.write_local(0, &[1]).unwrap_err().to_string();
            expect_text(&e, "outside the symmetric heap")?;
            let e = g
                .write_local(g.heap_size() - 4, &[0; 8])
                .unwrap_err()
                .to_string();
            expect_text(&e, "outside the symmetric heap")?;
            let e = g
                .put_on_stream(b.offset(), src, 8, n)
                .unwrap_err()
                .to_string();
            expect_text(&e, "does not exist")?;
            g.pe().barrier_all()?;
            g.free(b)?;
            g.free(a)
        });
    }
}

fn expect_text(e: &str, want: &str) -> Result<()> {
    if e.contains(want) {
        Ok(())
    } else {
        Err(Error::Verification(format!(
            "error {e:?} does not say {want:?}"
        )))
    }
}

/// Each PE writes its pattern into A, puts it into the next PE's B and checks its own B
/// (the previous PE's pattern) after a barrier, then gets the next PE's A into B and
/// checks it.
fn put_and_get_around_the_ring(g: &GpuPe, a: usize, b: usize, len: usize) -> Result<()> {
    let (me, n) = (g.my_pe(), g.n_pes());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    g.write_local(a, &pattern(me, len))?;
    g.pe().barrier_all()?;
    let src = g.ptr(a, len, me).unwrap();
    g.put_on_stream(b, src, len, next)?;
    g.quiet()?;
    g.pe().barrier_all()?;
    let mut got = vec![0u8; len];
    g.read_local(b, &mut got)?;
    if got != pattern(prev, len) {
        return Err(Error::Verification(format!(
            "B after PE {prev}'s put: {:?}...",
            &got[..8]
        )));
    }
    let dst = g.ptr(b, len, me).unwrap();
    g.get_on_stream(dst, a, len, next)?;
    g.quiet()?;
    g.read_local(b, &mut got)?;
    if got != pattern(next, len) {
        return Err(Error::Verification(format!(
            "B after a get from PE {next}: {:?}...",
            &got[..8]
        )));
    }
    Ok(())
}

/// A strided team gets a device handle (its entry in the sync scratch), and team_destroy
/// clears it; the world and node teams' entries were written at setup.
#[test]
fn device_teams_are_published_and_destroyed() {
    on_gpu_pes(4, "p2p", |g| {
        let world = g.pe().world().clone();
        if g.device_team(&world)? != 0 || g.device_team(g.pe().node())? != 1 {
            return Err(Error::Verification("world / node team handles".into()));
        }
        let evens = g.team_split_strided(&world, 0, 2, 2)?;
        let odds = g.team_split_strided(&world, 1, 2, 2)?;
        for t in [evens, odds].into_iter().flatten() {
            let h = g.device_team(&t)?;
            if h < 2 {
                return Err(Error::Verification(format!("split team handle {h}")));
            }
            g.team_destroy(t)?;
        }
        Ok(())
    });
}

/// The EP kernels' module loads and binds on every PE; a GPU EP buffer is created
/// (allocation agreed by all PEs, control block and mask written), its mask set, queried
/// and cleaned, and it is destroyed; then a second buffer on a team of a split.
#[test]
fn ep_buffers_are_created_masked_and_destroyed() {
    on_gpu_pes(3, "p2p", |g| {
        let (n, me) = (g.n_pes(), g.my_pe());
        let cfg = Config {
            num_max_dispatch_tokens_per_rank: 16,
            hidden: 2048,
            num_experts: 2 * n,
            num_topk: 2,
            use_fp8: true,
            round_scale: false,
        };
        let m = rshmem::gpu::ep::load_module(g)?;
        let mut buf = GpuBuffer::with_module(g, &m, cfg, 0)?;
        let other = (me + 1) % n;
        buf.update_mask(other, true)?;
        let want: Vec<bool> = (0..n).map(|p| p == other).collect();
        if buf.query_mask()? != want {
            return Err(Error::Verification("mask after update_mask".into()));
        }
        if buf.update_mask(me, true).is_ok() {
            return Err(Error::Verification("a PE masked itself".into()));
        }
        buf.clean_mask()?;
        if buf.query_mask()?.iter().any(|&x| x) {
            return Err(Error::Verification("mask after clean_mask".into()));
        }
        g.pe().barrier_all()?;
        buf.destroy()?;
        // On a team: PEs {0, 2} and {1}.
        let world = g.pe().world().clone();
        let a = g.pe().team_split_strided(&world, 0, 2, 2)?;
        let b = g.pe().team_split_strided(&world, 1, 1, 1)?;
        let team = a.clone().or(b.clone()).expect("every PE is in a group");
        let tcfg = Config {
            num_experts: 2 * team.n_pes(),
            ..cfg
        };
        let tb = GpuBuffer::with_module_on(g, &m, &team, tcfg, 0)?;
        g.pe().barrier_all()?;
        tb.destroy()?;
        for t in [a, b].into_iter().flatten() {
            g.pe().team_destroy(t)?;
        }
        Ok(())
    });
}

/// GPU PEs over the proxy transport: host heaps registered into CUDA and IBGDA queues
/// drained by the soft HCA; setup, a local write and read, a stream ADD refused, finalize.
#[test]
fn gpu_pes_set_up_and_finalize_over_the_proxy() {
    on_gpu_pes(2, "proxy", |g| {
        let me = g.my_pe();
        let a = g.malloc(256)?;
        g.write_local(a.offset(), &pattern(me, 256))?;
        let mut got = vec![0u8; 256];
        g.read_local(a.offset(), &mut got)?;
        if got != pattern(me, 256) {
            return Err(Error::Verification("read back over the proxy heap".into()));
        }
        // A stream ADD on its own heap would be a GPU atomic against the soft HCA's CPU
        // atomics: refused before anything is launched.
        let e = g
            .signal_on_stream(a.offset(), 1, rshmem::SignalOp::Add, me)
            .unwrap_err()
            .to_string();
        expect_text(&e, "the soft HCA's CPU atomics")?;
        g.pe().barrier_all()?;
        g.free(a)
    });
}

/// `rshmem` run with hostcuda as its driver.
fn rshmem(args: &[&str]) -> (Option<i32>, String) {
    let lib = hostcuda();
    let o = Command::new(env!("CARGO_BIN_EXE_rshmem"))
        .args(args)
        .env("RSHMEM_CUDA_LIB", &lib)
        .env("RSHMEM_TIMEOUT_MS", "10000")
        .env("RSHMEM_SYMMETRIC_SIZE", "8M")
        .output()
        .expect("run rshmem");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), text)
}

/// gpu-check's first step: the doctor finds the driver and reads the device's attributes
/// by the numbers it hard-codes, which must be cuda.h's (hostcuda answers by enum name).
#[test]
fn the_doctor_reads_the_device_through_the_driver() {
    let (rc, out) = rshmem(&["doctor", "--json"]);
    assert_eq!(rc, Some(0), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let d = &v["cuda"]["devices"][0];
    assert_eq!(v["cuda"]["present"], true, "{out}");
    assert_eq!(v["cuda"]["driver_version"], 13000, "{out}");
    assert_eq!(d["name"], "hostcuda 0 (CPU stand-in)", "{out}");
    assert_eq!(d["compute_capability"], "9.0", "{out}");
    assert_eq!(d["total_mem_bytes"], 80u64 << 30, "{out}");
    assert_eq!(d["vmm"], true, "{out}");
    assert_eq!(d["posix_fd_handles"], true, "{out}");
    assert_eq!(d["gpudirect_rdma_vmm"], false, "{out}");
    assert_eq!(d["dma_buf"], false, "{out}");
    // The doctor also tries the heap's fd export, which a sandbox may refuse although the
    // attribute says yes (hostcuda's HOSTCUDA_NO_FD_EXPORT=1 refuses it as gVisor would).
    assert_eq!(v["cuda"]["fd_export"], "ok", "{out}");
    let o = Command::new(env!("CARGO_BIN_EXE_rshmem"))
        .arg("doctor")
        .env("RSHMEM_CUDA_LIB", hostcuda())
        .env("HOSTCUDA_NO_FD_EXPORT", "1")
        .output()
        .expect("run rshmem doctor");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("heap fd export"))
        .unwrap_or_else(|| panic!("no fd export line: {text}"));
    assert!(
        line.contains("refused although the device reports POSIX-fd handles")
            && line.contains("cuMemExportToShareableHandle"),
        "{line}"
    );
}

/// The self-test's host-layer case that needs no kernel, through the CLI as gpu-check runs
/// it (steps selftest-2/3 and selftest-proxy-2): GPU PEs bind a module and read the bound
/// state back, 21 exact checks per PE. Over the proxy its peer count wrapped below zero
/// until 2026-12-05 (every peer is reached by a queue there, none by a mapping).
#[test]
fn the_selftest_binds_a_module_through_the_cli() {
    for (pes, transport) in [("2", "p2p"), ("3", "p2p"), ("2", "proxy")] {
        let (rc, out) = rshmem(&[
            "selftest",
            "--device",
            "gpu",
            "--pes",
            pes,
            "--transport",
            transport,
            "--case",
            "host_bind_module",
        ]);
        let checks = 21 * pes.parse::<usize>().unwrap();
        assert_eq!(rc, Some(0), "{pes} PEs over {transport}: {out}");
        assert!(
            out.contains(&format!(
                "gpu selftest host_bind_module: ok (checks {checks}/{checks})"
            )) && out.contains("1 passed, 0 failed"),
            "{pes} PEs over {transport}: {out}"
        );
    }
}

/// One GPU PE per process, as production runs them (`rshmem run -n 3`, `GpuPe::init`
/// from the launcher's environment): the heaps' fds cross process boundaries (SCM_RIGHTS)
/// and each process maps its peers' memfds; a put and a get between processes; finalize.
/// Once with the three processes on one GPU (`RSHMEM_DEVICE=0`: each warns that its GPU
/// is shared across processes), once with three GPUs, one per process (picked by local
/// rank). gpu-check runs its PEs as threads of one process only, so this path had never
/// run.
#[test]
fn gpu_pes_as_processes_under_rshmem_run() {
    let lib = hostcuda();
    let exe = std::env::current_exe().unwrap();
    for gpus in [1, 3] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rshmem"));
        c.args(["run", "-n", "3", "--"])
            .arg(&exe)
            .args([
                "gpu_pe_process_child",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env("RSHMEM_CUDA_LIB", &lib)
            .env("RSHMEM_SYMMETRIC_SIZE", "8M")
            .env("RSHMEM_TIMEOUT_MS", "10000")
            .env("HOSTCUDA_DEVICES", gpus.to_string())
            .env("GPU_PE_PROCESS_CHILD", "1");
        if gpus > 1 {
            c.env_remove("RSHMEM_DEVICE");
        }
        let o = c.output().expect("rshmem run");
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "{gpus} GPU(s): {out}");
        for pe in 0..3 {
            let gpu = if gpus == 1 { 0 } else { pe };
            assert!(
                out.contains(&format!(
                    "GPU PE {pe} of 3 (process, GPU {gpu}): put and get ok"
                )),
                "{gpus} GPU(s), PE {pe}: {out}"
            );
        }
        assert_eq!(
            out.matches("share it from 3 processes").count(),
            if gpus == 1 { 3 } else { 0 },
            "{gpus} GPU(s): {out}"
        );
    }
}

/// The body of [`gpu_pes_as_processes_under_rshmem_run`], in each process it starts
/// (ignored in a plain run: it needs the launcher's environment).
#[test]
#[ignore = "a child of gpu_pes_as_processes_under_rshmem_run (needs rshmem run's environment)"]
fn gpu_pe_process_child() {
    assert_eq!(
        std::env::var("GPU_PE_PROCESS_CHILD").as_deref(),
        Ok("1"),
        "run by gpu_pes_as_processes_under_rshmem_run"
    );
    let g = GpuPe::init().expect("GpuPe::init under rshmem run");
    let r = (|| -> Result<()> {
        let (me, n) = (g.my_pe(), g.n_pes());
        let len = 8192;
        let a = g.malloc(len)?;
        let b = g.malloc(len)?;
        put_and_get_around_the_ring(&g, a.offset(), b.offset(), len)?;
        g.pe().barrier_all()?;
        g.free(b)?;
        g.free(a)?;
        println!(
            "GPU PE {me} of {n} (process, GPU {}): put and get ok",
            g.device().ordinal
        );
        Ok(())
    })();
    let f = g.finalize();
    r.expect("the GPU PE's work");
    f.expect("finalize");
}

/// hostcuda's host registration behaves as the real driver's does to the memory: shared
/// with the kernels (forked block processes) while registered, the program's private
/// memory again afterwards, contents kept, with the driver's errors for a double
/// registration (also of a range overlapping one) or unregistration, and a
/// refusal of a private range it could not share whole. Until 2026-12-06 unregistration left the pages shared:
/// malloc reused them once freed and a block process's malloc corrupted the parent's heap
/// (CI: "malloc(): unsorted double linked list corrupted", an IBGDA queue timed out).
#[test]
fn host_registration_is_undone_at_unregistration() {
    let lib = hostcuda();
    let dir = lib.parent().unwrap();
    let exe = dir.join("register_fork");
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostcuda/register_fork.c");
    let o = Command::new("cc")
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(hostcuda_build::cuda_include())
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .expect("cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(&exe).output().expect("run register_fork");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "register_fork: ok\n");
    // The one refusal it provokes says why.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot share host range") && err.contains("(not page-aligned)"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
