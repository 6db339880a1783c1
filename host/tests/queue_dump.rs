//! `rshmem doctor --queues` against a running job: two CPU PEs (threads of this process)
//! over the proxy transport with RSHMEM_DEBUG_QUEUES, stopped mid-run while PE 0 dumps
//! its queues with the real binary; every field of PE 0's QP to PE 1 is checked against
//! what the job did.

use rshmem::config::TransportMode;
use rshmem::{run_threads, Settings};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn settings() -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 4 << 20;
    s.timeout = Duration::from_secs(20);
    s.transport = TransportMode::Proxy;
    s.debug_queues = Some(Duration::from_millis(20));
    s
}

fn dump(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("doctor")
        .arg("--queues")
        .args(args)
        .output()
        .expect("run rshmem doctor --queues");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// PE 0's QP to PE 1 in a dump taken after `after_ms`, once it shows `min_reserved`.
fn qp_0_to_1(v: &Value, after_ms: u64, min_reserved: u64) -> Option<Value> {
    let snap = &v.as_array()?.first()?["snapshot"];
    if snap["written_unix_ms"].as_u64()? <= after_ms {
        return None;
    }
    let q = snap["qps"]
        .as_array()?
        .iter()
        .find(|q| q["local_pe"] == 0 && q["remote_pe"] == 1)?
        .clone();
    (q["reserved"].as_u64()? >= min_reserved).then_some(q)
}

#[test]
fn live_queue_dump_of_a_running_proxy_job() {
    let pid = std::process::id();
    let out = run_threads(2, settings(), |pe| {
        let buf = pe.calloc::<u64>(8)?;
        pe.barrier_all()?;
        let mut seen = None;
        if pe.my_pe() == 0 {
            let vals: Vec<u64> = (0..8).collect();
            for _ in 0..5 {
                pe.put(buf, &vals, 1)?;
            }
            pe.quiet();
            let after = now_ms();
            let job = pe.job_id().to_string();
            let t0 = Instant::now();
            // The job now waits (PE 1 in the barrier below) while PE 0 dumps: bounded.
            while seen.is_none() && t0.elapsed() < Duration::from_secs(10) {
                let (code, stdout, stderr) =
                    dump(&["--json", "--job", &job, "--pid", &pid.to_string()]);
                if code == 0 {
                    let v: Value = serde_json::from_str(&stdout).expect("JSON");
                    if let Some(q) = qp_0_to_1(&v, after, 5) {
                        let (tcode, table, _) = dump(&["--job", &job]);
                        seen = Some((v, q, tcode, table, job.clone()));
                    }
                } else {
                    assert!(stderr.contains("RSHMEM_DEBUG_QUEUES=1"), "{stderr}");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        pe.barrier_all()?;
        Ok(seen)
    })
    .expect("job starts");
    let mut results: Vec<_> = out.into_iter().map(|r| r.expect("PE ran")).collect();
    assert!(results[1].is_none());
    let (v, q, tcode, table, job) = results[0].take().expect("a dump showing the puts");
    let file = &v[0];
    assert_eq!(file["alive"], Value::Bool(true));
    assert_eq!(file["snapshot"]["pid"].as_u64(), Some(pid as u64));
    assert_eq!(file["snapshot"]["job"], job.as_str());
    assert_eq!(file["snapshot"]["period_ms"].as_u64(), Some(20));
    assert_eq!(file["path"], format!("/dev/shm/rshmem-{job}-queues-{pid}"));

    // Quiet returned before the dump: everything reserved was published, rung and
    // completed; every WQE of this QP is one WQEBB (64-byte staged WRITEs and the
    // barrier's fetch-adds), so the engine executed exactly `reserved` WQEs.
    let n = |k: &str| q[k].as_u64().unwrap_or_else(|| panic!("{k} in {q}"));
    let reserved = n("reserved");
    assert!(reserved >= 5, "{q}");
    for k in ["ready", "rung", "completed", "engine_wqes"] {
        assert_eq!(n(k), reserved, "{k}: {q}");
    }
    assert_eq!(n("outstanding_wqebbs"), 0);
    assert_eq!(n("dbrec_send"), reserved & 0xffff);
    assert_eq!(n("doorbell_pi"), reserved & 0xffff);
    let qpn = n("qpn");
    assert_eq!(n("doorbell_qpn"), qpn);
    assert_eq!(n("wqe_cnt"), 128);
    assert_eq!(n("cqe_cnt"), 128);
    // Selective signalling (a CQE every 32 WQEBBs on this 128-WQEBB ring, and for WQEs
    // whose poster waits), all consumed: at least the one quiet needed, at most one per
    // WQE.
    let cq_ci = n("cq_ci");
    assert!(cq_ci >= 1 && cq_ci <= reserved, "cq_ci {cq_ci}: {q}");
    assert_eq!(q["cqe_pending"], Value::Bool(false));
    assert_eq!(q["error_state"], Value::Bool(false));
    assert_eq!(q["broken"], Value::Bool(false));
    assert!(q["first_error"].is_null());
    // The last CQE: REQ at the last index — the signalled NOP that quiet posted after the
    // fifth put (0 bytes), or the put's 64-byte WRITE if that one was signalled already.
    let c = &q["last_cqe"];
    assert_eq!(c["type"], "cqe");
    assert_eq!(c["opcode"].as_u64(), Some(0));
    assert_eq!(c["qpn"].as_u64(), Some(qpn));
    assert_eq!(c["wqe_counter"].as_u64(), Some((reserved - 1) & 0xffff));
    let bytes = c["byte_cnt"].as_u64();
    assert!(bytes == Some(0) || bytes == Some(64), "{c}");
    assert!(c["syndrome"].is_null());
    assert_eq!(q["last_cqe_hex"].as_str().unwrap().len(), 128);

    assert_eq!(tcode, 0);
    assert!(
        table.contains(&format!("job {job} pid {pid} (running)")),
        "{table}"
    );
    assert!(
        table.contains(&format!("PE 0 -> PE 1  QP {qpn:#x}  ok")),
        "{table}"
    );
    assert!(table.contains("last CQE: opcode 0 REQ"), "{table}");

    // The job is over: its PEs dropped their QPs and with them the file.
    assert!(!std::path::Path::new(&format!("/dev/shm/rshmem-{job}-queues-{pid}")).exists());
    let (code, _, stderr) = dump(&["--job", &job]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains(&format!("no queue status files for job {job} in /dev/shm")),
        "{stderr}"
    );
}
