//! Live queue state for `rshmem doctor --queues`: with `RSHMEM_DEBUG_QUEUES` set, every
//! process that has soft-HCA queue pairs publishes their state to a small read-only file,
//! `/dev/shm/rshmem-<job>-queues-<pid>` (JSON, [`Snapshot`]), rewritten every period by a
//! publisher thread (written to a temporary name, then renamed, so readers never see a
//! torn file). The file goes away when the process's last QP does; the launcher's
//! `rshmem-<job>-*` cleanup removes it after a crash.
//!
//! Why a file and not a request on the bootstrap side channel: it needs nothing from the
//! job (a wedged PE still has a publisher thread, and a PE stuck inside a bootstrap call
//! could not answer), works for jobs of any launcher, and is readable by plain `cat`.
//! The price is staleness up to one period, which the snapshot's timestamp states.
//!
//! Everything read here is read from another thread while producers and the engine run:
//! the counters are atomics (each consistent on its own), the CQE is read with the
//! queue's own CQE protocol. Nothing here writes to a queue.

use super::engine::EngineQp;
use super::proxy::PeerKind;
use super::queue::{SendQueue, SqCounters};
use crate::mlx5::cqe::sw_owns;
use crate::mlx5::decode::cqe_json;
use crate::mlx5::doorbell::parse_doorbell;
use crate::mlx5::WireStruct;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Version of the file format.
pub const FORMAT_VERSION: u32 = 1;

/// Path of the status file of process `pid` in job `job`.
pub fn status_path(job: &str, pid: u32) -> String {
    format!("/dev/shm/rshmem-{job}-queues-{pid}")
}

/// Parses a status file name (`rshmem-<job>-queues-<pid>`) into (job, pid).
pub fn parse_status_name(name: &str) -> Option<(String, u32)> {
    let rest = name.strip_prefix("rshmem-")?;
    let (job, pid) = rest.rsplit_once("-queues-")?;
    if job.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((job.to_string(), pid.parse().ok()?))
}

/// One process's queues, as written to its status file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub job: String,
    pub pid: u32,
    /// When this snapshot was taken (ms since the Unix epoch).
    pub written_unix_ms: u64,
    /// The publishing period (ms): the snapshot is at most about this old while the
    /// process lives.
    pub period_ms: u64,
    pub qps: Vec<QpStatus>,
}

/// One queue pair.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QpStatus {
    pub local_pe: usize,
    pub remote_pe: usize,
    pub qpn: u32,
    pub wqe_cnt: u32,
    pub cqe_cnt: u32,
    /// Producer counters (unwrapped WQEBB indices).
    pub reserved: u64,
    pub ready: u64,
    pub rung: u64,
    pub completed: u64,
    /// WQEBBs reserved but not completed.
    pub outstanding_wqebbs: u64,
    /// A wait timed out with slots reserved but never published.
    pub broken: bool,
    /// The doorbell record's send counter as stored (16-bit producer index).
    pub dbrec_send: u16,
    /// The last doorbell written: producer index and QP number.
    pub doorbell_pi: u16,
    pub doorbell_qpn: u32,
    /// The CQ doorbell record's consumer index (24 bits).
    pub cq_ci: u32,
    /// WQEs the engine executed or flushed.
    pub engine_wqes: u64,
    /// The engine moved the QP to the error state.
    pub error_state: bool,
    /// Asynchronous events the engine raised (`softhca::queue::EVENT_*` bits: 1 CQ
    /// overrun, 2 QP fatal); 0 in files written before the field existed.
    #[serde(default)]
    pub async_events: u32,
    /// The first error CQE the producer saw, described.
    pub first_error: Option<String>,
    /// The CQE at the consumer index is written and not consumed yet.
    pub cqe_pending: bool,
    /// The last consumed CQE (slot `cq_ci - 1`), decoded as `rshmem mlx5 decode --json`
    /// prints it; null before the first.
    pub last_cqe: Option<serde_json::Value>,
    /// Its 64 bytes in hex.
    pub last_cqe_hex: Option<String>,
}

struct Entry {
    local_pe: usize,
    remote_pe: usize,
    sq: Weak<SendQueue>,
    qp: Weak<EngineQp<PeerKind>>,
    id: u64,
}

#[derive(Default)]
struct Registry {
    job: String,
    period: Duration,
    entries: Vec<Entry>,
    next_id: u64,
    publisher: bool,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps a QP in the published set; dropping it removes the QP (and the file, when it was
/// the process's last).
#[must_use = "the QP is unpublished when the registration drops"]
pub struct Registration {
    id: u64,
}

/// Publishes the QP `sq`/`qp` of `local_pe` to `remote_pe` in job `job` every `period`.
/// One job per process (the first registration's job and period are kept).
pub(crate) fn register(
    job: &str,
    period: Duration,
    local_pe: usize,
    remote_pe: usize,
    sq: &Arc<SendQueue>,
    qp: &Arc<EngineQp<PeerKind>>,
) -> Registration {
    let mut g = lock();
    let r = g.get_or_insert_with(Registry::default);
    if r.entries.is_empty() {
        r.job = job.to_string();
        r.period = period;
    }
    r.next_id += 1;
    let id = r.next_id;
    r.entries.push(Entry {
        local_pe,
        remote_pe,
        sq: Arc::downgrade(sq),
        qp: Arc::downgrade(qp),
        id,
    });
    publish(r);
    if !r.publisher {
        let started = std::thread::Builder::new()
            .name("rshmem-queue-status".into())
            .spawn(publisher);
        // Without the thread the file is still written at every (un)registration.
        r.publisher = started.is_ok();
    }
    Registration { id }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut g = lock();
        let Some(r) = g.as_mut() else { return };
        r.entries.retain(|e| e.id != self.id);
        if r.entries.is_empty() {
            let _ = std::fs::remove_file(status_path(&r.job, std::process::id()));
        } else {
            publish(r);
        }
    }
}

fn publisher() {
    loop {
        let period = {
            let mut g = lock();
            let Some(r) = g.as_mut() else { return };
            if r.entries.is_empty() {
                r.publisher = false;
                return;
            }
            publish(r);
            r.period
        };
        std::thread::sleep(period);
    }
}

/// Writes the registry's snapshot (under the registry lock, so a removal never races a
/// rename). Errors are ignored: diagnostics must not break the job.
fn publish(r: &Registry) {
    let snap = Snapshot {
        version: FORMAT_VERSION,
        job: r.job.clone(),
        pid: std::process::id(),
        written_unix_ms: now_ms(),
        period_ms: r.period.as_millis() as u64,
        qps: r
            .entries
            .iter()
            .filter_map(|e| {
                let (sq, qp) = (e.sq.upgrade()?, e.qp.upgrade()?);
                Some(qp_status(e.local_pe, e.remote_pe, &sq, &qp))
            })
            .collect(),
    };
    let path = status_path(&r.job, snap.pid);
    let tmp = format!("{path}.tmp");
    let Ok(text) = serde_json::to_string(&snap) else {
        return;
    };
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The state of one QP, read while it runs.
pub(crate) fn qp_status(
    local_pe: usize,
    remote_pe: usize,
    sq: &SendQueue,
    qp: &EngineQp<PeerKind>,
) -> QpStatus {
    let mem = sq.memory();
    let SqCounters {
        reserved,
        ready,
        rung,
        completed,
        broken,
    } = sq.counters();
    // Acquire on the records: they are written with Release by the producer and the CQ
    // consumer; a diagnostic read needs nothing stronger.
    let dbrec_send =
        u32::from_be_bytes(mem.qp_dbrec_send().load(Ordering::Acquire).to_ne_bytes()) as u16;
    let (doorbell_pi, doorbell_qpn) =
        parse_doorbell(mem.doorbell().load(Ordering::Acquire).to_ne_bytes());
    let cq_ci =
        u32::from_be_bytes(mem.cq_dbrec_ci().load(Ordering::Acquire).to_ne_bytes()) & 0xff_ffff;
    let cqe_cnt = mem.layout().cqe_cnt;
    let cqe_pending = sw_owns(mem.cqe_op_own(cq_ci), cq_ci, cqe_cnt);
    let last = (cq_ci > 0).then(|| mem.read_cqe(cq_ci.wrapping_sub(1)));
    QpStatus {
        local_pe,
        remote_pe,
        qpn: sq.qpn(),
        wqe_cnt: mem.layout().wqe_cnt,
        cqe_cnt,
        reserved,
        ready,
        rung,
        completed,
        outstanding_wqebbs: reserved.saturating_sub(completed),
        broken,
        dbrec_send,
        doorbell_pi,
        doorbell_qpn,
        cq_ci,
        // Relaxed: a statistic; it orders nothing else read here.
        engine_wqes: qp.wqes.load(Ordering::Relaxed),
        error_state: qp.in_error.load(Ordering::Acquire),
        // Acquire: as for the records above.
        async_events: mem.async_events().map_or(0, |w| w.load(Ordering::Acquire)),
        first_error: sq.error().map(|c| c.describe()),
        cqe_pending,
        last_cqe: last
            .as_ref()
            .and_then(|c| serde_json::from_str(&cqe_json(c)).ok()),
        last_cqe_hex: last.map(|c| c.as_bytes().iter().map(|b| format!("{b:02x}")).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(status_path("j1-2", 77), "/dev/shm/rshmem-j1-2-queues-77");
        assert_eq!(
            parse_status_name("rshmem-j1-2-queues-77"),
            Some(("j1-2".into(), 77))
        );
        assert_eq!(parse_status_name("rshmem-j1-pe0"), None);
        assert_eq!(parse_status_name("rshmem-j1-queues-77.tmp"), None);
        assert_eq!(parse_status_name("rshmem--queues-1"), None);
    }

    /// A QP that completed one WRITE and then hit a bad rkey: counters, error state,
    /// first error and the last CQE (the error CQE, decoded) are all reported exactly.
    #[test]
    fn error_state_and_last_cqe() {
        use crate::mlx5::wqe::{Payload, RaddrSeg, WqeOp};
        use crate::softhca::backend::LocalPeer;
        use crate::softhca::engine::{EngineCore, QpConfig};
        use crate::softhca::mr::{Access, MrTable};
        use crate::softhca::proxy::ProxyBackend;
        use crate::softhca::queue::{CqMode, QueueMemory};
        let mem = Arc::new(QueueMemory::new(8, 8).unwrap());
        // Soft queues: ring() stores to plain memory without the device barriers.
        assert!(!mem.doorbell_is_device());
        let pd = Arc::new(MrTable::new());
        let remote = Arc::new(MrTable::new());
        let mut rbuf = vec![0u64; 4].into_boxed_slice();
        let rp = rbuf.as_mut_ptr().cast::<u8>();
        // SAFETY: rbuf outlives the engine core below (dropped at the end of the test).
        let rkey = unsafe { remote.register(rp, rp as u64, 32, Access::ALL) };
        let qp = EngineQp::new(
            0x77,
            QpConfig::new(
                mem.clone(),
                pd,
                PeerKind::Local(LocalPeer::new(remote)),
                CqMode::Normal,
            ),
        );
        let mut core = EngineCore::new(ProxyBackend::default());
        core.attach(qp.clone());
        let sq = SendQueue::new(mem, 0x77, CqMode::Normal, Duration::from_secs(5), None);
        let v = 5u64.to_le_bytes();
        let good = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(rp as u64, rkey),
            payload: Payload::Inline(&v),
        };
        let bad = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(rp as u64, rkey ^ 0x100),
            payload: Payload::Inline(&v),
        };
        let _ = sq.post(&good).unwrap();
        let _ = sq.post(&bad).unwrap();
        let _ = sq.post(&good).unwrap();
        sq.ring();
        core.progress();
        assert_eq!(sq.poll_cq(), 3);
        assert_eq!(rbuf[0], 5);
        let st = qp_status(2, 3, &sq, &qp);
        assert_eq!((st.local_pe, st.remote_pe, st.qpn), (2, 3, 0x77));
        assert_eq!((st.reserved, st.ready, st.rung, st.completed), (3, 3, 3, 3));
        assert_eq!(
            (st.outstanding_wqebbs, st.dbrec_send, st.doorbell_pi),
            (0, 3, 3)
        );
        assert_eq!((st.doorbell_qpn, st.cq_ci, st.engine_wqes), (0x77, 3, 3));
        assert!(st.error_state && !st.cqe_pending && !st.broken);
        assert_eq!(
            st.async_events, 0,
            "an error CQE is not an asynchronous event"
        );
        assert_eq!(
            st.first_error.as_deref(),
            Some("REQ_ERR syndrome REMOTE_ACCESS (0x13) vendor 0x00 for WQE RDMA_WRITE (0x08) at index 0x0001")
        );
        // The last CQE is the flush of the third WQE.
        let c = st.last_cqe.unwrap();
        assert_eq!(c["type"], "cqe");
        assert_eq!(c["opcode"], 13);
        assert_eq!(c["wqe_counter"], 2);
        assert_eq!(c["qpn"], 0x77);
        assert_eq!(c["syndrome"], 0x05);
        assert_eq!(st.last_cqe_hex.unwrap().len(), 128);
        drop(core);
        drop(rbuf);
    }

    /// A CQ overrun shows as asynchronous events 3 (CQ_ERR | QP_FATAL) and the error state,
    /// and a status file from before the field existed still parses (events 0).
    #[test]
    fn cq_overrun_is_in_the_status() {
        use crate::mlx5::wqe::WqeOp;
        use crate::softhca::backend::LocalPeer;
        use crate::softhca::engine::{EngineCore, QpConfig};
        use crate::softhca::mr::MrTable;
        use crate::softhca::proxy::ProxyBackend;
        use crate::softhca::queue::{CqMode, QueueMemory};
        let mem = Arc::new(QueueMemory::new(8, 2).unwrap());
        let qp = EngineQp::new(
            0x78,
            QpConfig::new(
                mem.clone(),
                Arc::new(MrTable::new()),
                PeerKind::Local(LocalPeer::new(Arc::new(MrTable::new()))),
                CqMode::Normal,
            ),
        );
        let mut core = EngineCore::new(ProxyBackend::default());
        core.attach(qp.clone());
        let sq = SendQueue::new(mem, 0x78, CqMode::Normal, Duration::from_secs(5), None);
        for _ in 0..3 {
            let _ = sq.post(&WqeOp::Nop).unwrap();
        }
        sq.ring();
        core.progress();
        let st = qp_status(0, 1, &sq, &qp);
        assert_eq!(st.async_events, 3);
        assert!(st.error_state);
        let mut v = serde_json::to_value(&st).unwrap();
        v.as_object_mut().unwrap().remove("async_events");
        let old: QpStatus = serde_json::from_value(v).unwrap();
        assert_eq!(old.async_events, 0);
    }
}
