//! Binding CPU PEs to CPUs (`RSHMEM_BIND`), as `mpirun` binds ranks.
//!
//! Unbound, two PEs that start on the same CPU (threads spawned from one thread, or
//! processes forked from one launcher) stay there until the kernel's load balancer moves
//! one, often 100 ms or more later, and every exchange between them pays for it: an
//! 8-byte reduce between 2 PEs took 62 µs instead of 0.5 µs, a barrier 30 µs instead of
//! 0.1 µs (both PEs under `taskset -c 0`, 2026-12-07), and the first row of most
//! `rshmem bench reduce --pes 2` runs measured exactly that (a sampler of the threads'
//! CPUs found both PEs on CPU 1 throughout such a row). Moving each PE to its own CPU at
//! init and then giving its mask back did not hold: a later blocking call (a bootstrap
//! socket read) may wake a PE on the CPU of the thread that woke it, the other PE's, and
//! 1 run in 3 was slow again. Pinned, 8 runs in 8 were not. Open MPI binds each rank to a
//! core when a job has 2 ranks or fewer for the same reason.
//!
//! `auto` binds only jobs whose PEs all reach each other by load/store (p2p on one node):
//! that is where two co-located PEs hurt most, and where no soft HCA or libfabric thread
//! runs (with the proxy, the engine thread some PE's first operation starts would inherit
//! that PE's one CPU; with PEs on two network-namespace hosts pinned, the netns suite
//! failed 2 of 9 runs on slow teardowns).
//!
//! Only the PE's own thread is bound, at the end of `Pe::init` (CPU PEs, launched or as
//! threads of `run_threads`): threads started before (bootstrap readers) keep the wider
//! mask; threads the PE's thread starts while it is bound inherit its one CPU, as threads
//! of an `mpirun`-bound rank do (`RSHMEM_BIND=none` for programs that start thread pools
//! beside their PE). The binding lasts as long as the `Pe`: dropping it gives the thread
//! its mask back. Under `auto`, PE i of a node takes the i-th CPU of its mask, skipping
//! CPUs that live PEs of the same process hold (jobs run side by side in one process, as
//! `cargo test` runs them, spread), and is not bound when every CPU is held. Across
//! processes nothing is shared: two jobs started side by side without a resource manager
//! (Slurm gives each job its own cpuset, which is the mask read here) bind to the same
//! CPUs, as two `mpirun`s do. A CPU here is a logical CPU: where SMT siblings are numbered
//! next to each other (Linux usually numbers them N apart), two PEs may share a physical
//! core. GPU PEs are never bound (their threads wait in CUDA, and a GPU's nearest cores
//! are a NUMA question this module does not answer).
use crate::error::{Error, Result};

/// `RSHMEM_BIND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    /// Each PE bound to its own CPU when the node has 2 PEs or more, they fit in the CPUs
    /// this thread may use, and every peer is reached by load/store (p2p); otherwise
    /// nothing is bound (a PE alone on its node has no PE to collide with, more PEs than
    /// CPUs are better spread by the scheduler, and the soft HCA's and libfabric's threads,
    /// which may start after init, would inherit the PE's one CPU).
    Auto,
    /// Each PE bound to one CPU, `node index % CPUs`, also when PEs must share CPUs or
    /// other PEs of the process hold them.
    Core,
    /// Nothing is bound.
    None,
}

impl BindMode {
    /// The `RSHMEM_BIND` value.
    pub fn name(self) -> &'static str {
        match self {
            BindMode::Auto => "auto",
            BindMode::Core => "core",
            BindMode::None => "none",
        }
    }
}

/// The calling thread's affinity mask, or None when it cannot be read.
fn mask() -> Option<libc::cpu_set_t> {
    // SAFETY: a cpu_set_t is plain data; all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
}

/// The CPUs of `set`, ascending.
fn cpus_of(set: &libc::cpu_set_t) -> Vec<usize> {
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i is below CPU_SETSIZE, the bit count of a cpu_set_t.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, set) })
        .collect()
}

/// The CPU the PE at `node_index` of `node_pes` binds to under `mode`, given whether it
/// reaches every peer by load/store (`all_p2p`), the CPUs it may use and those that live
/// PEs of this process hold already; None: leave the mask as it is. `core` takes CPU
/// `node_index % CPUs` whatever is held; `auto` (only for all-p2p PEs) the first CPU not
/// held counting from `node_index` (so a job alone in its process binds PE i to CPU i,
/// and jobs run side by side in one process, as `cargo test` runs them, spread), and
/// none when every CPU is held.
pub(crate) fn choose(
    mode: BindMode,
    node_index: usize,
    node_pes: usize,
    all_p2p: bool,
    allowed: &[usize],
    held: &[usize],
) -> Option<usize> {
    match mode {
        BindMode::None => None,
        _ if allowed.is_empty() => None,
        BindMode::Auto
            if !all_p2p || node_pes < 2 || allowed.len() < 2 || node_pes > allowed.len() =>
        {
            None
        }
        BindMode::Auto => (0..allowed.len())
            .map(|k| allowed[(node_index + k) % allowed.len()])
            .find(|c| !held.contains(c)),
        BindMode::Core => Some(allowed[node_index % allowed.len()]),
    }
}

/// CPUs held by live bound PEs of this process, once per PE.
static HELD: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// A PE thread's binding: gives the thread its mask back and the CPU back to this
/// process's pool when the PE is dropped.
pub(crate) struct Binding {
    cpu: usize,
    tid: libc::pid_t,
    before: libc::cpu_set_t,
}

impl Binding {
    /// The CPU bound to.
    pub(crate) fn cpu(&self) -> usize {
        self.cpu
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        // The thread's mask as it was before init bound it (by thread id: the PE may be
        // dropped on another thread). Failing (the thread has exited: ESRCH) changes
        // nothing.
        // SAFETY: `before` is a valid cpu_set_t of the size passed.
        let _ = unsafe {
            libc::sched_setaffinity(
                self.tid,
                std::mem::size_of::<libc::cpu_set_t>(),
                &self.before,
            )
        };
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = held.iter().position(|&c| c == self.cpu) {
            held.swap_remove(i);
        }
    }
}

/// Restricts the calling thread to `cpu`.
pub(crate) fn bind_this_thread(cpu: usize) -> Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(Error::InvalidArgument(format!(
            "RSHMEM_BIND: CPU {cpu} is past the {} a CPU mask holds",
            libc::CPU_SETSIZE
        )));
    }
    // SAFETY: a cpu_set_t is plain data; all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(Error::io(
            format!("RSHMEM_BIND: binding this PE's thread to CPU {cpu} (sched_setaffinity)"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Binds the calling thread (a CPU PE's) as `mode` says (see [`choose`]); its binding, or
/// None. Under `auto` a refused binding leaves the thread as it was (binding is an
/// optimisation); under `core` it is an error.
pub(crate) fn bind_pe(
    mode: BindMode,
    node_index: usize,
    node_pes: usize,
    all_p2p: bool,
) -> Result<Option<Binding>> {
    let before = mask();
    let Some(before) = before else {
        if mode == BindMode::Core {
            return Err(Error::io(
                "RSHMEM_BIND=core: reading this PE's thread's CPU mask (sched_getaffinity)",
                std::io::Error::last_os_error(),
            ));
        }
        return Ok(None);
    };
    // Chosen and recorded under one lock: PE threads of one job bind at the same time.
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let allowed = cpus_of(&before);
    let Some(cpu) = choose(mode, node_index, node_pes, all_p2p, &allowed, &held) else {
        return Ok(None);
    };
    match bind_this_thread(cpu) {
        Ok(()) => {
            held.push(cpu);
            Ok(Some(Binding {
                cpu,
                // SAFETY: gettid has no preconditions.
                tid: unsafe { libc::gettid() },
                before,
            }))
        }
        Err(_) if mode == BindMode::Auto => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's CPUs, ascending; empty when its mask cannot be read.
    fn allowed_cpus() -> Vec<usize> {
        mask().as_ref().map(cpus_of).unwrap_or_default()
    }

    #[test]
    fn auto_binds_only_when_every_pe_of_the_node_has_a_cpu() {
        let four = [0, 1, 2, 3];
        assert_eq!(choose(BindMode::Auto, 0, 2, true, &four, &[]), Some(0));
        assert_eq!(choose(BindMode::Auto, 3, 4, true, &four, &[]), Some(3));
        // More PEs than CPUs: the scheduler places them.
        assert_eq!(choose(BindMode::Auto, 1, 5, true, &four, &[]), None);
        // One CPU allowed (taskset, Slurm's per-task binding) for 2 PEs.
        assert_eq!(choose(BindMode::Auto, 0, 2, true, &[7], &[]), None);
        // The mask's CPUs, not 0..n: a job given CPUs 4-7 uses those.
        assert_eq!(
            choose(BindMode::Auto, 1, 2, true, &[4, 5, 6, 7], &[]),
            Some(5)
        );
        assert_eq!(choose(BindMode::Auto, 0, 1, true, &[], &[]), None);
        // A PE alone on its node (one PE per host, or per network namespace here).
        assert_eq!(choose(BindMode::Auto, 0, 1, true, &four, &[]), None);
        // Through the soft HCA or libfabric (their threads would inherit the PE's CPU).
        assert_eq!(choose(BindMode::Auto, 0, 2, false, &four, &[]), None);
        assert_eq!(choose(BindMode::Core, 0, 2, false, &four, &[]), Some(0));
    }

    /// A second job in the process takes the CPUs the first left free, and none when
    /// every CPU is held.
    #[test]
    fn auto_skips_cpus_other_pes_of_the_process_hold() {
        let four = [0, 1, 2, 3];
        assert_eq!(choose(BindMode::Auto, 0, 2, true, &four, &[0, 1]), Some(2));
        assert_eq!(
            choose(BindMode::Auto, 1, 2, true, &four, &[0, 1, 2]),
            Some(3)
        );
        assert_eq!(
            choose(BindMode::Auto, 1, 2, true, &four, &[0, 1, 3]),
            Some(2)
        );
        assert_eq!(
            choose(BindMode::Auto, 0, 2, true, &four, &[0, 1, 2, 3]),
            None
        );
        // core ignores them.
        assert_eq!(choose(BindMode::Core, 0, 2, true, &four, &[0, 1]), Some(0));
    }

    #[test]
    fn core_shares_cpus_round_robin_and_none_never_binds() {
        assert_eq!(choose(BindMode::Core, 5, 8, true, &[2, 3], &[]), Some(3));
        assert_eq!(choose(BindMode::Core, 0, 1, true, &[6], &[]), Some(6));
        assert_eq!(choose(BindMode::None, 0, 2, true, &[0, 1], &[]), None);
    }

    /// bind_pe under core, on a thread of its own: bound to the CPU, the mask given back
    /// when the binding drops (the test thread keeps its mask throughout). Not under
    /// auto: other tests of this binary bind PEs at the same time, so which CPU auto
    /// picks depends on them (the choice itself is tested above).
    #[test]
    fn a_pe_thread_is_bound_and_given_its_mask_back() {
        let allowed = allowed_cpus();
        assert!(
            !allowed.is_empty(),
            "this thread's affinity mask could not be read"
        );
        let n = allowed.len();
        let (cpu, bound, after) = std::thread::spawn(move || {
            let b = bind_pe(BindMode::Core, n, n + 1, true)
                .expect("core binds")
                .expect("a binding");
            let bound = allowed_cpus();
            let cpu = b.cpu();
            drop(b);
            (cpu, bound, allowed_cpus())
        })
        .join()
        .expect("thread ran");
        assert_eq!((cpu, bound), (allowed[0], vec![allowed[0]]));
        assert_eq!(after, allowed, "the mask is given back with the binding");
        // This thread's mask is its own.
        assert_eq!(allowed_cpus(), allowed);
        let e = bind_this_thread(libc::CPU_SETSIZE as usize).unwrap_err();
        assert!(e.to_string().contains("past the 1024"), "{e}");
    }
}
