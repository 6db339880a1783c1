//! `rshmem doctor --queues`: prints the live soft-HCA queue state that running PE
//! processes publish with `RSHMEM_DEBUG_QUEUES` (see `crate::softhca::status`): per QP the
//! producer counters, doorbell record and doorbell, CQ consumer index, outstanding WQEBBs,
//! error state, and the last CQE decoded as `rshmem mlx5 decode --cqe` prints it.

use crate::mlx5::decode::{cqe_listing, decode_hex};
use crate::mlx5::{Cqe64, WireStruct};
use crate::softhca::status::{parse_status_name, Snapshot, FORMAT_VERSION};
use serde::Serialize;
use std::path::Path;

/// Where status files live.
pub const STATUS_DIR: &str = "/dev/shm";

/// One status file as read.
#[derive(Debug, Clone, Serialize)]
pub struct Published {
    pub path: String,
    /// Whether the process still runs (`kill(pid, 0)`).
    pub alive: bool,
    /// Age of the snapshot when read (ms).
    pub age_ms: u64,
    pub snapshot: Snapshot,
}

/// Why nothing could be dumped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueuesError {
    #[error(
        "no queue status files{which} in {dir}: start the job with RSHMEM_DEBUG_QUEUES=1 \
         (only soft-HCA queue pairs are published, and only once a PE has used one)"
    )]
    None { which: String, dir: String },
    #[error("cannot read {dir}: {detail}")]
    Dir { dir: String, detail: String },
}

/// Reads every status file in `dir` matching `job` and `pid` (None = any), sorted by
/// job and pid. Unreadable or foreign-version files are skipped.
pub fn read_published(
    dir: &Path,
    job: Option<&str>,
    pid: Option<u32>,
) -> Result<Vec<Published>, QueuesError> {
    let entries = std::fs::read_dir(dir).map_err(|e| QueuesError::Dir {
        dir: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((j, p)) = parse_status_name(&name) else {
            continue;
        };
        if job.is_some_and(|want| want != j) || pid.is_some_and(|want| want != p) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(snapshot) = serde_json::from_str::<Snapshot>(&text) else {
            continue;
        };
        if snapshot.version != FORMAT_VERSION {
            continue;
        }
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(p as libc::pid_t, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        out.push(Published {
            path: e.path().display().to_string(),
            alive,
            age_ms: now.saturating_sub(snapshot.written_unix_ms),
            snapshot,
        });
    }
    if out.is_empty() {
        let mut which = String::new();
        if let Some(j) = job {
            which.push_str(&format!(" for job {j}"));
        }
        if let Some(p) = pid {
            which.push_str(&format!(" for pid {p}"));
        }
        return Err(QueuesError::None {
            which,
            dir: dir.display().to_string(),
        });
    }
    out.sort_by(|a, b| (&a.snapshot.job, a.snapshot.pid).cmp(&(&b.snapshot.job, b.snapshot.pid)));
    Ok(out)
}

/// The table `rshmem doctor --queues` prints.
pub fn render(all: &[Published]) -> String {
    let mut s = String::new();
    for p in all {
        let snap = &p.snapshot;
        s.push_str(&format!(
            "job {} pid {} ({}), snapshot {} ms old (published every {} ms), {} QP(s)\n",
            snap.job,
            snap.pid,
            if p.alive {
                "running"
            } else {
                "exited: stale file"
            },
            p.age_ms,
            snap.period_ms,
            snap.qps.len()
        ));
        for q in &snap.qps {
            let state = if q.async_events & crate::softhca::queue::EVENT_CQ_ERR != 0 {
                "ERROR (CQ overrun)"
            } else if q.error_state || q.first_error.is_some() {
                "ERROR"
            } else if q.broken {
                "BROKEN"
            } else {
                "ok"
            };
            s.push_str(&format!(
                "  PE {} -> PE {}  QP {:#x}  {state}  SQ {} WQEBBs, CQ {}\n",
                q.local_pe, q.remote_pe, q.qpn, q.wqe_cnt, q.cqe_cnt
            ));
            s.push_str(&format!(
                "    producer: reserved {} ready {} rung {} completed {} ({} outstanding)\n",
                q.reserved, q.ready, q.rung, q.completed, q.outstanding_wqebbs
            ));
            s.push_str(&format!(
                "    doorbell record {:#06x}, doorbell pi {:#06x} qpn {:#x}; CQ consumer index {:#x}{}; engine executed {} WQEs\n",
                q.dbrec_send,
                q.doorbell_pi,
                q.doorbell_qpn,
                q.cq_ci,
                if q.cqe_pending { " (next CQE waiting)" } else { "" },
                q.engine_wqes
            ));
            if let Some(e) = &q.first_error {
                s.push_str(&format!("    first error: {e}\n"));
            }
            match q.last_cqe_hex.as_deref().and_then(cqe_from_hex) {
                Some(c) => {
                    for line in cqe_listing(&c).lines() {
                        s.push_str(&format!("    last {line}\n"));
                    }
                }
                None => s.push_str("    last CQE: none yet\n"),
            }
        }
    }
    s.trim_end().to_string()
}

fn cqe_from_hex(h: &str) -> Option<Cqe64> {
    let b = decode_hex(&[h]).ok()?;
    Cqe64::read_from(&b)
}

/// Runs `rshmem doctor --queues`; returns the exit code (1 when nothing was found).
pub fn run(job: Option<&str>, pid: Option<u32>, json: bool) -> i32 {
    match read_published(Path::new(STATUS_DIR), job, pid) {
        Ok(all) => {
            let text = if json {
                match serde_json::to_string(&all) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("rshmem doctor --queues: cannot encode JSON: {e}");
                        return 1;
                    }
                }
            } else {
                render(&all)
            };
            println!("{text}");
            0
        }
        Err(e) => {
            eprintln!("rshmem doctor --queues: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_published_names_the_variable() {
        let dir = std::env::temp_dir().join(format!("rshmem-queues-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rshmem-j-pe0"), "not a status file").unwrap();
        std::fs::write(dir.join("rshmem-j-queues-1"), "{ torn").unwrap();
        let e = read_published(&dir, Some("j"), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "no queue status files for job j in {}: start the job with RSHMEM_DEBUG_QUEUES=1 \
                 (only soft-HCA queue pairs are published, and only once a PE has used one)",
                dir.display()
            )
        );
        let snap = Snapshot {
            version: FORMAT_VERSION,
            job: "j".into(),
            pid: 1,
            written_unix_ms: 0,
            period_ms: 100,
            qps: vec![],
        };
        std::fs::write(
            dir.join("rshmem-j-queues-1"),
            serde_json::to_string(&snap).unwrap(),
        )
        .unwrap();
        let got = read_published(&dir, None, Some(1)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].snapshot, snap);
        // pid 1 exists in any pid namespace.
        assert!(got[0].alive);
        assert_eq!(
            render(&got).lines().next().unwrap(),
            format!(
                "job j pid 1 (running), snapshot {} ms old (published every 100 ms), 0 QP(s)",
                got[0].age_ms
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
