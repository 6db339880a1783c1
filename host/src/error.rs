//! The one error type of the crate.
//!
//! One variant per failure a user can act on, each carrying the context needed to act
//! (PE, offset, size, variable name, library name). Nothing a user's input or environment
//! can cause is a panic.

use std::io;

/// Result alias used throughout rshmem.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in rshmem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable is missing or malformed.
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        var: String,
        value: String,
        reason: String,
    },

    /// A required variable (or set of variables) is absent.
    #[error("{0}")]
    MissingEnv(String),

    /// A caller passed something rshmem cannot do; the message says what and why.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A PE number outside the job or team.
    #[error("PE {pe} does not exist (the {scope} has {n_pes} PEs)")]
    InvalidPe {
        pe: usize,
        n_pes: usize,
        scope: &'static str,
    },

    /// The peer exists but no transport reaches it (e.g. it is on another node and no
    /// network transport is configured).
    #[error("PE {pe} is not reachable from PE {from}: {reason}")]
    Unreachable {
        pe: usize,
        from: usize,
        reason: String,
    },

    /// A symmetric address range outside the heap.
    #[error(
        "symmetric range [{offset:#x}, {offset:#x}+{len}) on PE {pe} is outside the symmetric heap \
         (usable range [{heap_start:#x}, {heap_end:#x}))"
    )]
    OutOfBounds {
        pe: usize,
        offset: usize,
        len: usize,
        heap_start: usize,
        heap_end: usize,
    },

    /// A symmetric address not aligned for the operation.
    #[error("symmetric offset {offset:#x} is not {align}-byte aligned, as {op} requires")]
    Misaligned {
        offset: usize,
        align: usize,
        op: &'static str,
    },

    /// The symmetric heap cannot satisfy an allocation.
    #[error(
        "symmetric heap exhausted on PE {pe}: requested {requested} bytes (alignment {align}), \
         {free} bytes free, largest free block {largest_free} bytes; \
         raise RSHMEM_SYMMETRIC_SIZE (now {heap_size} bytes; with this PE's other allocations \
         this one needs about {}M or more)",
        heap_needed_mib(*heap_size, *largest_free, *requested, *align)
    )]
    HeapExhausted {
        pe: usize,
        requested: usize,
        align: usize,
        free: usize,
        largest_free: usize,
        heap_size: usize,
    },

    /// PEs passed different arguments to one collective call.
    #[error("collective {op} called with mismatched arguments across PEs: {detail}")]
    CollectiveMismatch { op: &'static str, detail: String },

    /// The members agreed on a collective call, but moving its data failed on some of
    /// them (a transport error, a peer that died): they return their own error, every
    /// other member this one naming them.
    #[error(
        "collective {op} failed on {}: moving its data failed there (each returns its own \
         error); dest is undefined on every member",
        pe_list(failed)
    )]
    CollectiveFailed {
        op: &'static str,
        /// World PE numbers of the members whose part failed, in team order.
        failed: Vec<usize>,
    },

    /// A barrier or collective on a team that an earlier one broke on this PE (a timeout
    /// or transport error left the members' counters out of step).
    #[error(
        "{op}: team {team:#x} is unusable on this PE: an earlier barrier or collective on it \
         failed ({cause}), which leaves its members' barrier and agreement counters out of \
         step (OpenSHMEM leaves such a team undefined); {}",
        if *predefined {
            "the world and node teams cannot be destroyed or repaired (symmetric \
             allocation agrees on the world team, so it fails too): split a new team from \
             it (team_split_strided) for barriers and collectives, which starts with fresh \
             counters"
        } else {
            "destroy it (team_destroy) and split a new team from its parent"
        }
    )]
    TeamBroken {
        op: String,
        team: u64,
        cause: String,
        /// The world or node team (which cannot be destroyed).
        predefined: bool,
    },

    /// A bounded wait on symmetric memory expired.
    #[error(
        "PE {pe}: timed out after {waited_ms} ms in {op} waiting for the value at symmetric \
         offset {offset:#x} to become {cmp} {expected}; last value seen {last}"
    )]
    WaitTimeout {
        pe: usize,
        op: &'static str,
        offset: usize,
        cmp: &'static str,
        expected: String,
        last: String,
        waited_ms: u64,
    },

    /// A bounded wait for something other than a memory word expired.
    #[error("PE {pe}: timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        pe: usize,
        what: String,
        waited_ms: u64,
    },

    /// A bounded wait of an expert-parallel call (dispatch/combine) expired: who waited,
    /// in which call, for which PE and (for dispatch) which of its own experts.
    #[error(
        "PE {pe}: {op} (LL call #{call}) timed out after {waited_ms} ms waiting for PE {peer}: \
         {what}"
    )]
    EpTimeout {
        pe: usize,
        op: &'static str,
        call: u64,
        peer: usize,
        /// Global id of the expert whose data was awaited, when the wait was for one.
        expert: Option<usize>,
        what: String,
        waited_ms: u64,
    },

    /// Another PE's expert-parallel call failed (e.g. its input was invalid); every PE of
    /// the call gets this error naming that PE.
    #[error("PE {pe}: {op} (LL call #{call}) failed on PE {peer}: {reason}")]
    EpPeerFailed {
        pe: usize,
        op: &'static str,
        call: u64,
        peer: usize,
        reason: String,
    },

    /// A peer PE died (or the bootstrap root was lost); the job cannot continue.
    #[error("PE {pe} died: {detail}")]
    PeerDied { pe: usize, detail: String },

    /// The bootstrap root refused this PE.
    #[error("bootstrap root refused PE {rank}: {reason}")]
    Refused { rank: usize, reason: String },

    /// A bootstrap protocol or socket failure.
    #[error("bootstrap: {what}: {source}")]
    Bootstrap {
        what: String,
        #[source]
        source: io::Error,
    },

    /// A shared-memory segment operation failed.
    #[error("shared memory {op} of {path} ({size} bytes) failed: {source}")]
    Shm {
        op: &'static str,
        path: String,
        size: usize,
        #[source]
        source: io::Error,
    },

    /// A run-time library (CUDA, rdma-core, libfabric) is absent or lacks a symbol.
    #[error("{library} could not be loaded ({detail}); install {package}")]
    LibraryMissing {
        library: String,
        package: String,
        detail: String,
    },

    /// A libfabric call failed. `code` is what the call returned (a negative `FI_E*`
    /// value, or 0 where the call returned a null pointer or a condition rshmem checks),
    /// `detail` is the `fi_strerror` text plus what rshmem was doing.
    #[error("libfabric {call} failed: {detail} (code {code})")]
    Fabric {
        call: &'static str,
        code: i32,
        detail: String,
    },

    /// An rdma-core call (libibverbs or mlx5dv) failed. `errno` is the errno it left (or
    /// returned), `detail` its strerror text plus what rshmem was doing.
    #[error("rdma-core {call} failed: {detail} (errno {errno})")]
    Verbs {
        call: &'static str,
        errno: i32,
        detail: String,
    },

    /// The launcher could not start or supervise a PE.
    #[error("launcher: {0}")]
    Launch(String),

    /// A network operation failed: the soft HCA (or a NIC) completed it with an error CQE,
    /// or the queue pair was already in the error state. `detail` names the QP, the WQE's
    /// opcode and index and the CQE syndrome.
    #[error("PE {from} -> PE {pe}: {op} failed: {detail}")]
    Transport {
        pe: usize,
        from: usize,
        op: &'static str,
        detail: String,
    },

    /// A CUDA driver or NVRTC call failed: which call, its status name and text, and what
    /// rshmem was doing.
    #[error("CUDA {call} failed: {detail}")]
    Cuda { call: &'static str, detail: String },

    /// A kernel trapped on a device-side check (invalid PE, address outside the heap, wait
    /// timeout): the device error record as the kernel wrote it. `pe` is the PE whose
    /// kernel trapped, `target_pe` the PE the failed operation addressed.
    #[error(
        "PE {pe}: kernel {kernel} trapped: {what} (device error {code}, target PE {target_pe}, address {addr:#x}{wait}; \
         block {block}, thread {thread}); the CUDA context is lost for every PE of this process"
    )]
    DeviceFault {
        pe: usize,
        kernel: String,
        /// RSHMEM_DEVICE_ERR_* and its meaning.
        code: u32,
        what: &'static str,
        target_pe: i32,
        addr: u64,
        /// Waits: ", waited for value CMP EXPECTED, last seen OBSERVED"; else empty.
        wait: String,
        block: u32,
        thread: u32,
    },

    /// A self-test or benchmark found wrong data.
    #[error("data check failed: {0}")]
    Verification(String),

    /// Any other I/O failure, with what was being done.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whether this error, from a bootstrap agreement, a split or a barrier's quiet,
    /// leaves the team's counters out of step between its members, so that the team is
    /// marked broken on this PE: a timeout (this PE gave up on a member that may still
    /// come, and its late signal would satisfy a later call) or a transport error (a
    /// signal or quiet that failed here). Not the errors every member reports alike after
    /// the agreement (mismatched arguments, a failed data phase), and not a peer's death,
    /// which is sticky on its own (every later call that involves the dead PE reports
    /// it). Inside a barrier or exchange over the heap every error marks the team
    /// (`Pe::note_out_of_step`): this PE's counters have moved on there.
    pub fn breaks_team(&self) -> bool {
        matches!(
            self,
            Error::WaitTimeout { .. }
                | Error::Timeout { .. }
                | Error::Transport { .. }
                | Error::Fabric { .. }
                | Error::Verbs { .. }
        )
    }

    /// Wraps an I/O error with a description of the operation that failed.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// Wraps a bootstrap socket error with what was being done.
    pub fn bootstrap(what: impl Into<String>, source: io::Error) -> Self {
        Error::Bootstrap {
            what: what.into(),
            source,
        }
    }
}

/// A heap size in MiB (rounded up) that would hold an allocation of `requested` bytes
/// beside what is allocated now: the heap grows by what the largest free block lacks (the
/// free space at the end of the heap is usually that block), plus the alignment.
fn heap_needed_mib(heap_size: usize, largest_free: usize, requested: usize, align: usize) -> usize {
    let short = requested.saturating_sub(largest_free);
    heap_size
        .saturating_add(short)
        .saturating_add(align)
        .div_ceil(1 << 20)
}

/// "PE 3" or "PEs 1, 4 and 6" (at most 16 listed, then how many more).
fn pe_list(pes: &[usize]) -> String {
    const SHOWN: usize = 16;
    let mut names: Vec<String> = pes.iter().take(SHOWN).map(|p| p.to_string()).collect();
    if pes.len() > SHOWN {
        names.push(format!("{} more", pes.len() - SHOWN));
    }
    match names.len() {
        0 => "no PE".to_string(),
        1 => format!("PE {}", names[0]),
        n => format!("PEs {} and {}", names[..n - 1].join(", "), names[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::pe_list;

    #[test]
    fn pe_lists_read_as_english() {
        assert_eq!(pe_list(&[3]), "PE 3");
        assert_eq!(pe_list(&[1, 5]), "PEs 1 and 5");
        assert_eq!(pe_list(&[1, 4, 6]), "PEs 1, 4 and 6");
        let many: Vec<usize> = (0..20).collect();
        assert_eq!(
            pe_list(&many),
            "PEs 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 and 4 more"
        );
    }
}
