//! Grid sizing for collective launches, and device selection: pure arithmetic, tested on
//! CPU.
//!
//! A collective kernel (one that calls the device barrier, `rshmem_barrier_all` /
//! `rshmem_sync_all`) must have every block of every PE's grid resident at the same time,
//! or blocks that wait for not-yet-scheduled blocks spin forever (until the device wait
//! bound traps). When one PE owns the GPU, `cuLaunchCooperativeKernel` guarantees that for
//! its one grid (and refuses a grid that cannot be co-resident). When several PEs share
//! the GPU (single-GPU checks), their grids are separate launches on separate streams; the
//! driver makes no co-scheduling promise across cooperative launches (they may even be
//! serialised, which would deadlock PEs that wait on each other), so rshmem launches them
//! normally and sizes each PE's grid to its share of the GPU:
//! `floor(max active blocks per SM × SMs / PEs sharing the GPU)`. Then all grids fit at
//! once and, once launched, all run. This holds when nothing else occupies the GPU (no
//! other process's kernels; MPS or time-slicing with other jobs can break it) — the device
//! wait bound turns a violation into a trap with a message, not a hang.

use crate::error::{Error, Result};

/// The grid for a collective kernel: `requested` blocks, or when 0 the largest
/// co-resident share. Errors when the kernel cannot be resident at all or `requested`
/// exceeds the share.
pub fn co_resident_grid(
    kernel: &str,
    block: u32,
    blocks_per_sm: u32,
    sms: u32,
    pes_sharing: u32,
    requested: u32,
) -> Result<u32> {
    let pes = pes_sharing.max(1);
    let capacity = blocks_per_sm as u64 * sms as u64;
    let share = (capacity / pes as u64).min(u32::MAX as u64) as u32;
    if share == 0 {
        return Err(Error::InvalidArgument(format!(
            "collective kernel {kernel} (block {block}) cannot be co-resident: {blocks_per_sm} \
             block(s) per SM × {sms} SMs = {capacity} resident blocks for {pes} PEs sharing the GPU"
        )));
    }
    if requested == 0 {
        return Ok(share);
    }
    if requested > share {
        return Err(Error::InvalidArgument(format!(
            "collective kernel {kernel}: grid {requested} (block {block}) exceeds the co-resident \
             share of {share} blocks per PE ({blocks_per_sm} per SM × {sms} SMs / {pes} PEs \
             sharing the GPU)"
        )));
    }
    Ok(requested)
}

/// Whether a collective launch uses `cuLaunchCooperativeKernel` (one PE owns the GPU and
/// the device supports it) or a plain launch with a co-resident share.
pub fn use_cooperative(pes_sharing: u32, device_supports: bool) -> bool {
    pes_sharing <= 1 && device_supports
}

/// CUDA's hardware work queues per device when `CUDA_DEVICE_MAX_CONNECTIONS` is unset or
/// not in 1..=32.
pub const CUDA_DEFAULT_CONNECTIONS: u32 = 8;

/// The hardware queues per device CUDA gives a process whose `CUDA_DEVICE_MAX_CONNECTIONS`
/// is `var`, and whether `var` was usable (unset counts as usable: CUDA's default).
pub fn cuda_connections(var: Option<&str>) -> (u32, bool) {
    match var.map(str::trim) {
        None => (CUDA_DEFAULT_CONNECTIONS, true),
        Some(v) => match v.parse::<u32>() {
            Ok(q) if (1..=32).contains(&q) => (q, true),
            _ => (CUDA_DEFAULT_CONNECTIONS, false),
        },
    }
}

/// The most GPU PEs one process may put on a GPU with `queues` hardware queues: two are
/// kept for the legacy stream and a spare stream (see [`check_pes_fit_queues`]).
pub fn max_pes_per_gpu(queues: u32) -> usize {
    (queues as usize).saturating_sub(2)
}

/// Refuses more GPU PEs on one GPU in one process than its hardware queues carry. Each PE
/// has a stream, and the PEs' kernels wait for each other; streams beyond the queues share
/// one and run in submission order, so a kernel could wait behind a peer's kernel that
/// waits for it. Two queues are kept for the legacy stream and a spare stream (a program's
/// own; the EP bench's start gate once was one, and is now a host word).
pub fn check_pes_fit_queues(pes_per_gpu: usize, var: Option<&str>) -> Result<()> {
    let (queues, _) = cuda_connections(var);
    let most = max_pes_per_gpu(queues);
    if pes_per_gpu > most {
        return Err(Error::InvalidArgument(format!(
            "{pes_per_gpu} GPU PEs of this process would share one GPU, which CUDA gives {queues} \
             hardware queues (CUDA_DEVICE_MAX_CONNECTIONS={}): at most {most} PEs per GPU per \
             process, or export CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts (the rshmem \
             command does)",
            var.unwrap_or("unset")
        )));
    }
    Ok(())
}

/// The CUDA device ordinal for this PE: `RSHMEM_DEVICE` (`env`) when set, else
/// `local_rank % count`.
pub fn pick_device(env: Option<&str>, local_rank: usize, count: usize) -> Result<i32> {
    if count == 0 {
        return Err(Error::InvalidArgument(
            "no CUDA device is visible (cuDeviceGetCount = 0; check CUDA_VISIBLE_DEVICES)".into(),
        ));
    }
    match env {
        None => Ok((local_rank % count) as i32),
        Some(v) => {
            let n: usize = v.trim().parse().map_err(|_| Error::Env {
                var: "RSHMEM_DEVICE".into(),
                value: v.into(),
                reason: "not a device number (a CUDA ordinal, 0-based)".into(),
            })?;
            if n >= count {
                return Err(Error::Env {
                    var: "RSHMEM_DEVICE".into(),
                    value: v.into(),
                    reason: format!(
                        "only {count} CUDA device(s) are visible (ordinals 0..{})",
                        count - 1
                    ),
                });
            }
            Ok(n as i32)
        }
    }
}

/// Size of a GPU heap: `requested` rounded up to the allocation granularity.
pub fn round_to_granularity(requested: usize, granularity: usize) -> Result<usize> {
    if granularity == 0 || !granularity.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "the driver reported an allocation granularity of {granularity} bytes"
        )));
    }
    requested
        .checked_next_multiple_of(granularity)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "heap size {requested} overflows when rounded to {granularity}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_connections_parse_as_cuda_does() {
        assert_eq!(cuda_connections(None), (8, true));
        assert_eq!(cuda_connections(Some("32")), (32, true));
        assert_eq!(cuda_connections(Some(" 4 ")), (4, true));
        for bad in ["0", "33", "x", ""] {
            assert_eq!(cuda_connections(Some(bad)), (8, false), "{bad:?}");
        }
    }

    #[test]
    fn pes_per_gpu_must_fit_the_hardware_queues() {
        check_pes_fit_queues(6, None).unwrap();
        check_pes_fit_queues(30, Some("32")).unwrap();
        let e = check_pes_fit_queues(8, None).unwrap_err().to_string();
        assert!(
            e.contains("8 GPU PEs of this process would share one GPU, which CUDA gives 8 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=unset): at most 6"),
            "{e}"
        );
        let e = check_pes_fit_queues(31, Some("32"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 30 PEs per GPU"), "{e}");
    }

    #[test]
    fn collective_grids_split_the_gpu() {
        // H200: 132 SMs; a 256-thread block with 8 resident per SM.
        assert_eq!(co_resident_grid("k", 256, 8, 132, 1, 0).unwrap(), 1056);
        assert_eq!(co_resident_grid("k", 256, 8, 132, 2, 0).unwrap(), 528);
        assert_eq!(co_resident_grid("k", 256, 8, 132, 8, 0).unwrap(), 132);
        assert_eq!(co_resident_grid("k", 256, 1, 132, 3, 0).unwrap(), 44);
        assert_eq!(co_resident_grid("k", 256, 8, 132, 8, 100).unwrap(), 100);
        assert_eq!(
            co_resident_grid("k", 256, 8, 132, 0, 0).unwrap(),
            1056,
            "0 PEs counts as 1"
        );
        let e = co_resident_grid("kern", 1024, 1, 4, 8, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kern") && e.contains("cannot be co-resident") && e.contains("8 PEs"),
            "{e}"
        );
        let e = co_resident_grid("kern", 256, 8, 132, 8, 133)
            .unwrap_err()
            .to_string();
        assert!(e.contains("grid 133") && e.contains("share of 132"), "{e}");
        let e = co_resident_grid("kern", 256, 0, 132, 1, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("0 block(s) per SM"), "{e}");
    }

    #[test]
    fn cooperative_only_when_the_gpu_is_owned() {
        assert!(use_cooperative(1, true));
        assert!(!use_cooperative(2, true));
        assert!(!use_cooperative(1, false));
    }

    #[test]
    fn device_pick_and_override() {
        assert_eq!(pick_device(None, 0, 8).unwrap(), 0);
        assert_eq!(pick_device(None, 9, 8).unwrap(), 1);
        assert_eq!(
            pick_device(None, 3, 1).unwrap(),
            0,
            "several PEs share one GPU"
        );
        assert_eq!(pick_device(Some("3"), 0, 8).unwrap(), 3);
        assert_eq!(pick_device(Some(" 0 "), 5, 1).unwrap(), 0);
        let e = pick_device(Some("gpu1"), 0, 8).unwrap_err().to_string();
        assert!(
            e.contains("RSHMEM_DEVICE=\"gpu1\"") && e.contains("not a device number"),
            "{e}"
        );
        let e = pick_device(Some("8"), 0, 8).unwrap_err().to_string();
        assert!(
            e.contains("only 8 CUDA device(s)") && e.contains("0..7"),
            "{e}"
        );
        let e = pick_device(Some("-1"), 0, 8).unwrap_err().to_string();
        assert!(e.contains("not a device number"), "{e}");
        let e = pick_device(None, 0, 0).unwrap_err().to_string();
        assert!(e.contains("no CUDA device"), "{e}");
    }

    #[test]
    fn heap_sizes_round_to_granularity() {
        assert_eq!(round_to_granularity(1 << 20, 2 << 20).unwrap(), 2 << 20);
        assert_eq!(
            round_to_granularity((2 << 20) + 1, 2 << 20).unwrap(),
            4 << 20
        );
        assert_eq!(round_to_granularity(4 << 20, 2 << 20).unwrap(), 4 << 20);
        assert!(round_to_granularity(1, 3).is_err());
        assert!(round_to_granularity(usize::MAX, 2 << 20).is_err());
    }
}
