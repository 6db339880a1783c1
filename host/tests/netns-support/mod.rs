//! What the tests that run jobs across network-namespace "hosts" (scripts/netns-hosts)
//! share: whether they can run here, unique prefixes, and a command without the
//! launcher variables of the test's own environment. Included with `#[path]` by
//! host/tests/netns_jobs.rs and host/tests/gpu_on_hostcuda.rs.
#![allow(dead_code)]

use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// scripts/netns-hosts.
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/netns-hosts");

/// Whether network-namespace tests can run (root, `ip netns`). Without them: false with a
/// loud SKIPPED line when RSHMEM_SKIP_NETNS=1, else a panic naming what is missing.
pub fn netns_available(test: &str) -> bool {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    let r = PROBE.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("they must run as root (they create network namespaces)".into());
        }
        let name = format!("rshmem-probe-{}", std::process::id());
        let out = Command::new("ip").args(["netns", "add", &name]).output();
        match out {
            Err(e) => Err(format!("`ip` (iproute2) cannot be run: {e}")),
            Ok(o) if !o.status.success() => Err(format!(
                "`ip netns add` failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Ok(_) => {
                let _ = Command::new("ip").args(["netns", "del", &name]).status();
                Ok(())
            }
        }
    });
    match r {
        Ok(()) => true,
        Err(why) if std::env::var("RSHMEM_SKIP_NETNS").as_deref() == Ok("1") => {
            // Straight to the stderr handle: the test harness captures eprintln!, and a skip
            // must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "\n**************** SKIPPED {test}: network-namespace tests cannot run: {why} \
                 (RSHMEM_SKIP_NETNS=1) ****************\n"
            );
            false
        }
        Err(why) => panic!(
            "network-namespace test {test} cannot run: {why}. Run the tests as root with \
             iproute2 installed, or set RSHMEM_SKIP_NETNS=1 to skip them explicitly."
        ),
    }
}

/// A prefix no other test (in this or another process) uses.
pub fn unique_prefix() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "rt{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn clean_command(program: &str) -> Command {
    let mut c = Command::new(program);
    for (k, _) in std::env::vars() {
        if k.starts_with("RSHMEM_")
            || k.starts_with("OMPI_")
            || k.starts_with("SLURM_")
            || k.starts_with("PMI_")
            || k.starts_with("NETNS_")
        {
            c.env_remove(k);
        }
    }
    for k in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        c.env_remove(k);
    }
    c
}
