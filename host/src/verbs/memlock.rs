//! The locked-memory limit (`ulimit -l`, `RLIMIT_MEMLOCK`) that the kernel charges an RDMA
//! process's pinned host memory against: libmlx5's queue-pair and completion-queue
//! buffers, doorbell records and every host-memory registration. A process without
//! `CAP_IPC_LOCK` past its limit gets ENOMEM from `ibv_create_cq`, `ibv_create_qp` or
//! `ibv_reg_mr` (the kernel's `ib_umem_get`); containers often start with 64 KiB.

/// `CAP_IPC_LOCK`'s bit in the capability sets (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// The soft limit in bytes; None when unlimited (or unreadable).
pub fn limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through the valid pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Whether this process holds `CAP_IPC_LOCK` (which lifts the limit), from the `CapEff`
/// line of `status` (`/proc/self/status`).
pub fn has_ipc_lock_in(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Whether this process holds `CAP_IPC_LOCK`.
pub fn has_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| has_ipc_lock_in(&s))
}

/// The limit that binds this process: None when it is unlimited or lifted by
/// `CAP_IPC_LOCK`.
pub fn binding_limit() -> Option<u64> {
    limit().filter(|_| !has_ipc_lock())
}

/// The cure for a limit of `limit` bytes.
pub fn cure(limit: u64) -> String {
    format!(
        "the locked-memory limit (ulimit -l) is {}, and queues and registered host memory \
         are pinned against it: raise it (ulimit -l unlimited; docker run --ulimit \
         memlock=-1; systemd LimitMEMLOCK=infinity; or grant CAP_IPC_LOCK)",
        crate::doctor::human_bytes(limit)
    )
}

/// What to add to an ENOMEM from a verb that pins memory, when a limit binds.
pub fn enomem_hint() -> Option<String> {
    binding_limit().map(cure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_ipc_lock_from_status() {
        // CAP_IPC_LOCK is bit 14.
        let with = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000004000\n";
        let without = "CapEff:\t00000000a80425fb\n"; // docker's default set
        assert!(has_ipc_lock_in(with));
        assert!(!has_ipc_lock_in(without));
        assert!(has_ipc_lock_in("CapEff:\t000001ffffffffff\n")); // root's full set
        assert!(!has_ipc_lock_in("Name:\tx\n"));
        assert!(cure(64 << 10).starts_with("the locked-memory limit (ulimit -l) is 64.0 KiB"));
    }
}
