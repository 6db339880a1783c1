//! rshmem jobs across "hosts" made of network namespaces (scripts/netns-hosts): every PE
//! runs in its host's namespace with its own address on a private bridge and its own
//! RSHMEM_NODE_ID, so the bootstrap really goes over TCP between namespaces and PEs on
//! different hosts do not share memory.
//!
//! The PEs are this test binary itself, re-executed with `--exact pe_entry` and
//! NETNS_PE_MODE naming what the PE does (see `pe_main`).
//!
//! These tests need root and `ip netns`. Without them they FAIL, naming what is missing,
//! unless RSHMEM_SKIP_NETNS=1 is set, in which case each prints a loud SKIPPED line.
use rshmem::bootstrap::{Bootstrap, JoinParams};
use rshmem::{Error, Pe};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "netns-support/mod.rs"]
mod netns_support;
use netns_support::{clean_command, netns_available, unique_prefix, SCRIPT};
/// Port of the bootstrap root in host 0 (each job has its own host 0 namespace).
const PORT: u16 = 29577;

// ------------------------------------------------------------------ the PE side

/// rma-fail: when this PE printed RMA-FAILED.
static FAILED_AT: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Entry point of the PE processes; a no-op when run as an ordinary test.
#[test]
fn pe_entry() {
    let Ok(mode) = std::env::var("NETNS_PE_MODE") else {
        return;
    };
    let code = match pe_main(&mode) {
        Ok(()) => 0,
        Err(e) => {
            // rma-fail: how long the Pe took to drop after the failure (teardown).
            match FAILED_AT.get() {
                Some(t) => println!(
                    "PE-ERROR {e} [dropped {} ms after RMA-FAILED]",
                    t.elapsed().as_millis()
                ),
                None => println!("PE-ERROR {e}"),
            }
            1
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

fn env_usize(k: &str) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{k} not set"))
}

fn pe_main(mode: &str) -> rshmem::Result<()> {
    if mode == "intruder" {
        return intruder();
    }
    if mode == "fail-fast" {
        // No rshmem at all: checks that run-job stops the others when one PE fails.
        println!("NETNS-READY pid {}", std::process::id());
        if env_usize("RSHMEM_RANK") == 2 {
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_secs(60));
        return Ok(());
    }
    let pe = Pe::init()?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let pph = env_usize("RSHMEM_LOCAL_SIZE");
    let host = env_usize("NETNS_HOSTS_HOST");
    assert_eq!(n, env_usize("RSHMEM_WORLD_SIZE"));
    assert_eq!(host, me / pph, "ranks are host-major");
    // The node team is exactly this host's PEs; p2p reaches exactly them.
    assert_eq!(pe.node().n_pes(), pph, "node team size on PE {me}");
    let want: Vec<u32> = (host * pph..(host + 1) * pph).map(|r| r as u32).collect();
    assert_eq!(
        pe.node().members(),
        &want[..],
        "node team members on PE {me}"
    );
    for q in 0..n {
        assert_eq!(pe.is_local(q), q / pph == host, "is_local({q}) on PE {me}");
    }
    match mode {
        "basic" => basic(pe, pph),
        "link-down" => {
            for _ in 0..20 {
                pe.barrier_all()?;
            }
            let x = pe.calloc::<u64>(1)?;
            println!("NETNS-READY pid {}", std::process::id());
            if host == 1 {
                // Waits in a world barrier (over the bootstrap) that host 0 never joins:
                // the connection to the root is idle when the link goes down, so TCP
                // keepalive (about 4 s) is what notices it.
                pe.barrier_all()?;
                return Err(Error::InvalidArgument(
                    "the world barrier completed without host 0".into(),
                ));
            }
            // Host 0: barriers among its own PEs (shared memory), checking liveness with a
            // local get each round, until the root reports host 1's PEs dead.
            let end = Instant::now() + Duration::from_secs(25);
            while Instant::now() < end {
                pe.team_barrier(pe.node())?;
                pe.g(x, me)?;
            }
            Err(Error::InvalidArgument(
                "no failure was reported within 25 s of the link going down".into(),
            ))
        }
        "kill" => {
            for _ in 0..20 {
                pe.barrier_all()?;
            }
            println!("NETNS-JOB {}", pe.job_id());
            println!("NETNS-READY pid {}", std::process::id());
            let end = Instant::now() + Duration::from_secs(25);
            while Instant::now() < end {
                pe.barrier_all()?;
            }
            Err(Error::InvalidArgument(
                "no failure was reported within 25 s".into(),
            ))
        }
        "token" => {
            for _ in 0..5 {
                pe.barrier_all()?;
            }
            println!("NETNS-READY pid {}", std::process::id());
            // The test runs the intruder from host 1 now, then creates this file.
            let go = std::env::var("NETNS_GO_FILE").expect("NETNS_GO_FILE");
            let end = Instant::now() + Duration::from_secs(25);
            while !std::path::Path::new(&go).exists() {
                assert!(Instant::now() < end, "the test never said go");
                std::thread::sleep(Duration::from_millis(20));
            }
            for _ in 0..10 {
                pe.barrier_all()?;
            }
            println!("NETNS-OK pe {me}");
            pe.finalize()
        }
        "selftest" => {
            // The whole self-test (every host RMA, atomic, signal, barrier, team op).
            let cases = rshmem::selftest::run(&pe, &[], |l| println!("{l}"))?;
            println!("NETNS-OK selftest pe {me} cases {cases}");
            pe.finalize()
        }
        "rma-fail" => {
            // RMA to a PE on another host, in a loop, until the failure the test injects.
            let remote = (me + pph) % n;
            let buf = pe.calloc::<u8>(64 << 10)?;
            let word = pe.calloc::<u64>(1)?;
            let src = vec![me as u8; 64 << 10];
            let mut dst = vec![0u8; 64 << 10];
            for _ in 0..3 {
                pe.put(buf, &src, remote)?;
                pe.get(&mut dst, buf, remote)?;
                pe.atomic_fetch_add(word, 1, remote)?;
                pe.barrier_all()?;
            }
            println!("NETNS-READY pid {}", std::process::id());
            let ready = Instant::now();
            let end = ready + Duration::from_secs(25);
            let failed = (|| {
                while Instant::now() < end {
                    pe.put(buf, &src, remote)?;
                    pe.get(&mut dst, buf, remote)?;
                    pe.atomic_fetch_add(word, 1, remote)?;
                    pe.try_quiet()?;
                }
                Err(Error::InvalidArgument(
                    "no failure was reported within 25 s".into(),
                ))
            })();
            // When the RMA path failed, before the Pe is dropped (PE-ERROR comes after the
            // drop): the test tells a late failure from a slow teardown by this line.
            println!("RMA-FAILED {} ms after ready", ready.elapsed().as_millis());
            let _ = FAILED_AT.set(Instant::now());
            let _ = std::io::stdout().flush();
            failed
        }
        "ep-shrink" => ep_shrink(pe),
        other => panic!("unknown NETNS_PE_MODE {other}"),
    }
}

/// Round trips of the "ep-shrink" mode.
/// (About 20 ms each here: 250 leave a PE 3 killed a second or two late, on a loaded
/// machine, still well before the last; 120 left about 2 s.)
const EP_SHRINK_ROUND_TRIPS: usize = 250;

/// EP LL round trips in shrink mode while the test kills PE 3, each validated with the
/// mask it ran with. A round trip whose mask changed while it ran (the one during which
/// PE 3 died) is not validated: what PE 3 sent before dying may be in it.
fn ep_shrink(pe: Pe) -> rshmem::Result<()> {
    use rshmem::ep::{bf16, check, Buffer, Config};
    let team = pe.world().clone();
    let (me, n) = (team.my_pe(), team.n_pes());
    let c = Config {
        num_max_dispatch_tokens_per_rank: 8,
        hidden: 256,
        num_experts: 8,
        num_topk: 3,
        use_fp8: true,
        round_scale: false,
    };
    let mut buf = Buffer::new(&pe, &team, c)?;
    buf.set_shrink(true);
    let r = check::random_routing(17, me, 8, &c, None, 1);
    let all = check::allgather_routing(&pe, &team, &r)?;
    let x = check::origin_x(me, 8, 256);
    let scale = |e: usize| 1.0 + (e % 4) as f32 * 0.25;
    let mut expert_out = vec![bf16::ZERO; (8 / n) * n * 8 * 256];
    let (mut before, mut validated_after) = (0, 0);
    println!("NETNS-READY pid {}", std::process::id());
    // A fixed number of round trips, the same on every PE: the calls go in lockstep, so
    // a survivor that stopped early would look dead to the others (the test kills PE 3
    // 300 ms after READY, a few dozen round trips in).
    let end = Instant::now() + Duration::from_secs(60);
    for _ in 0..EP_SHRINK_ROUND_TRIPS {
        if Instant::now() > end {
            return Err(Error::InvalidArgument(format!(
                "{EP_SHRINK_ROUND_TRIPS} round trips did not finish within 60 s"
            )));
        }
        let mask = buf.query_mask();
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        check::expert_forward(&c, n, me, &o, &scale, &mut expert_out);
        let y = buf
            .low_latency_combine(
                &expert_out,
                &r.topk_idx,
                &r.topk_weights,
                &o.handle,
                false,
                false,
            )?
            .wait()?;
        if buf.query_mask() != mask {
            continue;
        }
        check::validate_dispatch(&c, me, &all, &mask, &o)?;
        check::validate_combine(&c, n, me, &r, &mask, &scale, &y)?;
        if mask.iter().any(|&m| m) {
            assert_eq!(mask, vec![false, false, false, true], "PE {me}");
            validated_after += 1;
        } else {
            before += 1;
        }
    }
    println!(
        "EP-SHRINK-OK pe {me} before {before} after {validated_after} dead {:?}",
        pe.dead_pes()
    );
    let _ = std::io::stdout().flush();
    // Survivors leave together (files in the shared /tmp): one that left first would look
    // like one more death to the others while they still run calls.
    let tag = std::env::var("NETNS_TEST_TAG").expect("NETNS_TEST_TAG");
    std::fs::write(format!("/tmp/{tag}-ep-done-{me}"), b"")
        .map_err(|e| Error::io("writing the done file", e))?;
    let end = Instant::now() + Duration::from_secs(20);
    while (0..3).any(|p| !std::path::Path::new(&format!("/tmp/{tag}-ep-done-{p}")).exists()) {
        if Instant::now() > end {
            return Err(Error::InvalidArgument(
                "the other survivors did not finish within 20 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Finalize needs every PE: it reports the death.
    match pe.finalize() {
        Err(Error::PeerDied { pe: 3, .. }) => Ok(()),
        other => Err(Error::InvalidArgument(format!(
            "finalize after PE 3 died returned {other:?}"
        ))),
    }
}

/// Barriers across hosts, p2p RMA within a host, and RMA to another host through the
/// soft HCA over libfabric (tcp between the namespaces).
fn basic(pe: Pe, pph: usize) -> rshmem::Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let host = me / pph;
    for _ in 0..100 {
        pe.barrier_all()?;
    }
    let x = pe.calloc::<u64>(1)?;
    if pph > 1 {
        // Node-local neighbour in a ring over this host's PEs.
        let next = host * pph + (me % pph + 1) % pph;
        let prev = host * pph + (me % pph + pph - 1) % pph;
        pe.p(x, 1000 + me as u64, next)?;
        pe.barrier_all()?;
        assert_eq!(
            pe.g(x, me)?,
            1000 + prev as u64,
            "value from PE {prev} on PE {me}"
        );
    }
    for q in 0..n {
        let want = if q / pph == host {
            "p2p"
        } else {
            "proxy-fabric"
        };
        assert_eq!(
            pe.transport_to(q),
            Some(want),
            "transport to PE {q} on PE {me}"
        );
    }
    if n > pph {
        // A PE on another host: reached through the soft HCA over libfabric.
        let remote = (me + pph) % n;
        let from = (me + n - pph) % n;
        let y = pe.calloc::<u64>(1)?;
        pe.barrier_all()?;
        pe.p(y, 7000 + me as u64, remote)?;
        pe.barrier_all()?;
        assert_eq!(
            pe.g(y, me)?,
            7000 + from as u64,
            "value from PE {from} on PE {me}"
        );
        assert_eq!(
            pe.g(y, remote)?,
            7000 + me as u64,
            "read back from PE {remote}"
        );
    }
    for _ in 0..10 {
        pe.barrier_all()?;
    }
    println!("NETNS-OK pe {me} n {n} node {}", pe.node().n_pes());
    pe.finalize()
}

/// Run in host 1 during a "token" job: a wrong token and garbage bytes at the root.
fn intruder() -> rshmem::Result<()> {
    let root = std::env::var("NETNS_ROOT").expect("NETNS_ROOT");
    let world = env_usize("NETNS_WORLD");
    let r = Bootstrap::join(&JoinParams {
        rank: 1,
        world_size: world,
        root_addr: root.clone(),
        token: "not-the-job-token".into(),
        node_id: "intruder".into(),
        timeout: Duration::from_secs(5),
    });
    match r {
        Err(Error::Refused { reason, .. }) if reason.contains("wrong token") => {
            println!("INTRUDER refused: {reason}")
        }
        Err(e) => panic!("a wrong token: expected a refusal, got {e}"),
        Ok(_) => panic!("a wrong token was admitted"),
    }
    let mut junk: Vec<u8> = b"GET / HTTP/1.0\r\nHost: x\r\n\r\n".to_vec();
    let mut rnd = vec![0u8; 4096];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut rnd))
        .expect("urandom");
    for bytes in [std::mem::take(&mut junk), rnd, vec![0u8; 4]] {
        let mut s = TcpStream::connect(&root).expect("connect to the root");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(&bytes);
        // The root answers (a refusal at most) and closes: read until EOF or reset.
        let mut buf = Vec::new();
        match s.read_to_end(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the root did not close a connection sending junk: {e}"),
        }
    }
    println!("INTRUDER-OK");
    Ok(())
}

// ------------------------------------------------------------------ the test side

/// Whether network namespaces can be made here. Panics (fails the test) when they cannot,
/// unless RSHMEM_SKIP_NETNS=1, in which case it prints a loud SKIPPED line and says no.
/// A running `netns-hosts run-job` whose output is collected line by line.
struct Job {
    prefix: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn start_job(
    hosts: usize,
    pph: usize,
    mode: &str,
    timeout_ms: u64,
    grace_ms: u64,
    extra_env: &[(&str, String)],
) -> Job {
    let prefix = unique_prefix();
    let me = std::env::current_exe().unwrap();
    let mut c = clean_command(SCRIPT);
    c.args(["run-job", "--hosts", &hosts.to_string()])
        .args(["--pes-per-host", &pph.to_string()])
        .args(["--prefix", &prefix, "--port", &PORT.to_string()])
        .args(["--grace-ms", &grace_ms.to_string(), "--"])
        .arg(me)
        .args([
            "--exact",
            "pe_entry",
            "--nocapture",
            "--quiet",
            "--test-threads",
            "1",
        ])
        .env("NETNS_PE_MODE", mode)
        .env("NETNS_TEST_TAG", &prefix)
        .env("RSHMEM_SYMMETRIC_SIZE", "4M")
        .env("RSHMEM_TIMEOUT_MS", timeout_ms.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("start scripts/netns-hosts run-job");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    let outs: Vec<Box<dyn Read + Send>> = vec![
        Box::new(child.stdout.take().unwrap()),
        Box::new(child.stderr.take().unwrap()),
    ];
    for out in outs {
        let l = lines.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                l.lock().unwrap().push(line);
            }
        }));
    }
    Job {
        prefix,
        child,
        lines,
        readers,
    }
}

impl Job {
    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits until `n` lines contain `what` (bounded); panics with the output otherwise.
    fn wait_for(&self, what: &str, n: usize, limit: Duration) {
        let t0 = Instant::now();
        loop {
            let c = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(what))
                .count();
            if c >= n {
                return;
            }
            if t0.elapsed() > limit {
                panic!(
                    "{n} lines with {what:?} did not appear within {limit:?}:\n{}",
                    self.text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the script to exit (bounded: SIGTERM, which makes it clean up, then
    /// SIGKILL); returns its status and the whole output.
    fn finish(mut self, limit: Duration) -> (ExitStatus, String) {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > limit {
                self.terminate();
                panic!("the job did not finish within {limit:?}:\n{}", self.text());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let text = self.text();
        assert_clean(&self.prefix);
        (status, text)
    }

    fn terminate(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: kill on the pid of our own child, which has not been reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while self.child.try_wait().ok().flatten().is_none() {
                if t0.elapsed() > Duration::from_secs(10) {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The pid a PE printed in its READY line.
    fn pid_of(&self, rank: usize) -> i32 {
        let tag = format!(" pe {rank}] NETNS-READY pid ");
        let lines = self.lines.lock().unwrap();
        let l = lines
            .iter()
            .find(|l| l.contains(&tag))
            .unwrap_or_else(|| panic!("no READY line of PE {rank}"));
        l.rsplit(' ').next().unwrap().parse().unwrap()
    }
}

impl Drop for Job {
    /// A failing test still removes its hosts: the script cleans up on SIGTERM.
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Namespaces of `prefix` still present.
fn namespaces_of(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect()
}

/// Processes (other than zombies) carrying NETNS_TEST_TAG=`prefix`: what the job started.
fn processes_of(prefix: &str) -> Vec<String> {
    let needle = format!("NETNS_TEST_TAG={prefix}\0");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            found.push(format!(
                "{name}: {}",
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    found
}

fn assert_clean(prefix: &str) {
    let ns = namespaces_of(prefix);
    assert!(ns.is_empty(), "namespaces left behind: {ns:?}");
    // The kernel may take a moment to reap what the script killed last.
    let t0 = Instant::now();
    loop {
        let p = processes_of(prefix);
        if p.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "processes left behind: {p:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lines_of(text: &str, rank: usize) -> Vec<&str> {
    let tag = format!(" pe {rank}] ");
    text.lines()
        .filter(|l| l.starts_with("[host ") && l.contains(&tag))
        .collect()
}

/// Runs `mode` on `hosts` × `pph` PEs and checks that the job succeeds and every PE printed
/// the line `ok_line(host, pe)`.
fn run_expecting(
    hosts: usize,
    pph: usize,
    mode: &str,
    timeout_ms: u64,
    finish: Duration,
    ok_line: impl Fn(usize, usize) -> String,
) {
    let t0 = Instant::now();
    let job = start_job(hosts, pph, mode, timeout_ms, 0, &[]);
    let (status, text) = job.finish(finish);
    assert!(status.success(), "job failed ({status}):\n{text}");
    for r in 0..hosts * pph {
        let ok = ok_line(r / pph, r);
        assert!(text.lines().any(|l| l == ok), "missing {ok:?} in:\n{text}");
    }
    eprintln!("{mode}, {hosts} hosts x {pph} PEs: {:?}", t0.elapsed());
}

fn run_basic(hosts: usize, pph: usize) {
    run_expecting(
        hosts,
        pph,
        "basic",
        10_000,
        Duration::from_secs(40),
        |host, r| {
            format!(
                "[host {host} pe {r}] NETNS-OK pe {r} n {} node {pph}",
                hosts * pph
            )
        },
    );
}

#[test]
fn two_hosts_two_pes_each() {
    if netns_available("two_hosts_two_pes_each") {
        run_basic(2, 2);
    }
}

#[test]
fn three_hosts_one_pe_each() {
    if netns_available("three_hosts_one_pe_each") {
        run_basic(3, 1);
    }
}

/// Host 1's link goes down while host 0's PEs run barriers: every PE fails, host 0's
/// naming a PE of host 1, within the keepalive time (the timeout is the outer bound).
#[test]
fn link_down_is_reported() {
    if !netns_available("link_down_is_reported") {
        return;
    }
    const TIMEOUT_MS: u64 = 8000;
    let job = start_job(2, 2, "link-down", TIMEOUT_MS, 20_000, &[]);
    job.wait_for("NETNS-READY", 4, Duration::from_secs(20));
    // Let host 1's connections go idle (everything acknowledged), then pull the cable.
    std::thread::sleep(Duration::from_millis(500));
    let st = Command::new(SCRIPT)
        .args(["link-down", "1", "--prefix", &job.prefix])
        .status()
        .unwrap();
    assert!(st.success(), "link-down failed");
    let t_down = Instant::now();
    let (status, text) = job.finish(Duration::from_millis(TIMEOUT_MS + 4000 + 8000));
    let took = t_down.elapsed();
    assert!(
        !status.success(),
        "the job succeeded with a link down:\n{text}"
    );
    for r in 0..4 {
        let err = lines_of(&text, r)
            .into_iter()
            .find(|l| l.contains("PE-ERROR"))
            .unwrap_or_else(|| panic!("PE {r} reported no error:\n{text}"));
        if r < 2 {
            assert!(
                err.contains("PE 2 died") || err.contains("PE 3 died"),
                "PE {r} should name a PE of host 1: {err}\n{text}"
            );
        } else {
            assert!(
                err.contains("PE 0 died") || err.contains("timed out"),
                "PE {r} should report the lost root or a timeout: {err}\n{text}"
            );
        }
    }
    assert!(
        took < Duration::from_millis(TIMEOUT_MS + 4000 + 3000),
        "detection took {took:?}:\n{text}"
    );
    eprintln!("link down noticed and job ended after {took:?}:\n{text}");
}

/// A PE of host 1 killed with SIGKILL: the others, in both hosts, fail naming it.
#[test]
fn killed_pe_in_another_namespace_is_named() {
    if !netns_available("killed_pe_in_another_namespace_is_named") {
        return;
    }
    // A 30 s grace, for the bound below (see killed_pe_during_rma_is_named).
    let job = start_job(2, 2, "kill", 10_000, 30_000, &[]);
    job.wait_for("NETNS-READY", 4, Duration::from_secs(20));
    // A segment file of this job that a killed PE could not remove (a PE SIGKILLed while
    // its heap file still had a name): run-job must remove it, and only it.
    let job_id = job
        .lines
        .lock()
        .unwrap()
        .iter()
        .find_map(|l| {
            l.split(" pe 0] NETNS-JOB ")
                .nth(1)
                .map(|s| s.trim().to_string())
        })
        .expect("no NETNS-JOB line of PE 0");
    assert!(job_id.chars().all(|c| c.is_ascii_hexdigit()), "{job_id:?}");
    let leftover = format!("/dev/shm/rshmem-{job_id}-pe99");
    let other = format!("/dev/shm/rshmem-{job_id}x-pe0");
    std::fs::write(&leftover, b"").unwrap();
    std::fs::write(&other, b"").unwrap();
    let pid = job.pid_of(3);
    // SAFETY: kill on the pid PE 3 printed; it is alive (it waits in barriers).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    let (status, text) = job.finish(Duration::from_secs(60));
    // Which failure run-job sees first is a race (PE 3's, or a peer that noticed it
    // fast); every failure is logged, so PE 3's kill must be.
    assert!(
        !status.success(),
        "the job succeeded with PE 3 killed:\n{text}"
    );
    assert!(
        text.contains("PE 3 (host 1) was killed by signal 9"),
        "run-job must name PE 3:\n{text}"
    );
    for r in 0..3 {
        let err = lines_of(&text, r)
            .into_iter()
            .find(|l| l.contains("PE-ERROR"))
            .unwrap_or_else(|| panic!("PE {r} reported no error:\n{text}"));
        assert!(err.contains("PE 3 died"), "PE {r}: {err}\n{text}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t0.elapsed()
    );
    let other_left = std::path::Path::new(&other).exists();
    let _ = std::fs::remove_file(&other);
    assert!(
        !std::path::Path::new(&leftover).exists(),
        "run-job left {leftover}:\n{text}"
    );
    assert!(
        text.contains(&format!(
            "removed 1 leftover shared-memory segment(s) of job {job_id}"
        )),
        "{text}"
    );
    assert!(other_left, "run-job removed a file of another job");
}

/// From host 1: a join with a wrong token is refused and junk on the root port is
/// dropped; the job is unharmed and completes.
#[test]
fn wrong_token_and_junk_from_another_namespace() {
    if !netns_available("wrong_token_and_junk_from_another_namespace") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rshmem-netns-go-{}", unique_prefix()));
    let _ = std::fs::remove_file(&dir);
    let go = dir.to_string_lossy().into_owned();
    let job = start_job(2, 2, "token", 10_000, 0, &[("NETNS_GO_FILE", go.clone())]);
    job.wait_for("NETNS-READY", 4, Duration::from_secs(20));
    let me = std::env::current_exe().unwrap();
    let out = clean_command(SCRIPT)
        .args(["exec", "1", "--prefix", &job.prefix, "--"])
        .arg(me)
        .args(["--exact", "pe_entry", "--nocapture", "--quiet"])
        .env("NETNS_PE_MODE", "intruder")
        .env("NETNS_TEST_TAG", &job.prefix)
        .env("NETNS_ROOT", format!("10.77.0.1:{PORT}"))
        .env("NETNS_WORLD", "4")
        .output()
        .unwrap();
    std::fs::write(&go, b"go").unwrap();
    let intruder =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let (status, text) = job.finish(Duration::from_secs(30));
    let _ = std::fs::remove_file(&go);
    assert!(
        out.status.success() && intruder.contains("INTRUDER-OK"),
        "intruder:\n{intruder}"
    );
    assert!(
        status.success(),
        "the job must complete despite the intruder:\n{text}"
    );
    for r in 0..4 {
        assert!(
            lines_of(&text, r)
                .iter()
                .any(|l| l.contains(&format!("NETNS-OK pe {r}"))),
            "PE {r} did not finish:\n{text}"
        );
    }
    // The root (in PE 0) logged the refusals, naming the intruder's host address.
    let root_log: Vec<&str> = lines_of(&text, 0)
        .into_iter()
        .filter(|l| l.contains("refused connection from 10.77.0.2:"))
        .collect();
    assert!(
        root_log.iter().any(|l| l.contains("wrong token")),
        "no wrong-token refusal logged:\n{text}"
    );
    assert!(root_log.len() >= 3, "junk connections not refused:\n{text}");
}

/// run-job: one PE exits 3 → the others (sleeping) are stopped at once, the script exits 3.
#[test]
fn run_job_stops_the_rest_when_one_fails() {
    if !netns_available("run_job_stops_the_rest_when_one_fails") {
        return;
    }
    let t0 = Instant::now();
    let job = start_job(2, 2, "fail-fast", 10_000, 0, &[]);
    let (status, text) = job.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(3), "{text}");
    assert!(text.contains("PE 2 (host 1) exited with code 3"), "{text}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
}

/// The script by hand: up, addresses, exec, link-down/up (seen from host 0), down.
#[test]
fn script_up_exec_link_down() {
    if !netns_available("script_up_exec_link_down") {
        return;
    }
    let prefix = unique_prefix();
    let script = |args: &[&str]| {
        Command::new(SCRIPT)
            .arg(args[0])
            .args(["--prefix", &prefix])
            .args(&args[1..])
            .output()
            .unwrap()
    };
    struct Down<'a>(&'a str);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = Command::new(SCRIPT)
                .args(["down", "--prefix", self.0])
                .status();
        }
    }
    let up = script(&["up", "2"]);
    let _down = Down(&prefix);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&up.stdout).trim(), prefix);
    let mut ns = namespaces_of(&prefix);
    ns.sort();
    assert_eq!(
        ns,
        [
            format!("{prefix}-br"),
            format!("{prefix}-h0"),
            format!("{prefix}-h1")
        ]
    );
    let addr = script(&["exec", "1", "--", "ip", "-br", "-4", "addr", "show", "eth0"]);
    assert!(String::from_utf8_lossy(&addr.stdout).contains("10.77.0.2/24"));
    // A connection attempt from host 0 to host 1's port 9: refused = reachable.
    let probe = || {
        let o = script(&[
            "exec",
            "0",
            "--",
            "timeout",
            "1",
            "bash",
            "-c",
            "exec 3<>/dev/tcp/10.77.0.2/9",
        ]);
        String::from_utf8_lossy(&o.stderr).contains("refused")
    };
    assert!(probe(), "host 1 not reachable from host 0");
    assert!(script(&["link-down", "1"]).status.success());
    assert!(!probe(), "host 1 still reachable with its link down");
    assert!(script(&["link-up", "1"]).status.success());
    let t0 = Instant::now();
    while !probe() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "host 1 not back after link-up"
        );
    }
    assert!(script(&["down"]).status.success());
    assert!(namespaces_of(&prefix).is_empty());
}

fn run_selftest(hosts: usize, pph: usize) {
    run_expecting(
        hosts,
        pph,
        "selftest",
        // A bound on progress, not a timing: a barrier waits for a peer's whole case,
        // which a loaded 2-core machine stretches (20 s ran out under overload).
        60_000,
        Duration::from_secs(150),
        |host, r| {
            format!(
                "[host {host} pe {r}] NETNS-OK selftest pe {r} cases {}",
                rshmem::selftest::CASES.len()
            )
        },
    );
}

/// The full self-test with two PEs on each of two hosts: p2p within, libfabric across.
#[test]
fn selftest_two_hosts_two_pes_each() {
    if netns_available("selftest_two_hosts_two_pes_each") {
        run_selftest(2, 2);
    }
}

/// The full self-test with three hosts of one PE: every peer through libfabric.
#[test]
fn selftest_three_hosts_one_pe_each() {
    if netns_available("selftest_three_hosts_one_pe_each") {
        run_selftest(3, 1);
    }
}

/// PE 3 (host 1) killed while every PE runs RMA to a PE on the other host: the others
/// fail naming PE 3, within the timeout; nothing is left behind.
#[test]
fn killed_pe_during_rma_is_named() {
    if !netns_available("killed_pe_during_rma_is_named") {
        return;
    }
    // A 20 s timeout and a 30 s grace: the bound below (15 s) tells "noticed at once"
    // from "timed out" or "waited out the grace" with room for teardown and exit of three
    // namespaces' PEs on a loaded machine.
    const TIMEOUT_MS: u64 = 20_000;
    let job = start_job(2, 2, "rma-fail", TIMEOUT_MS, 30_000, &[]);
    job.wait_for("NETNS-READY", 4, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(200));
    let pid = job.pid_of(3);
    // SAFETY: kill on the pid PE 3 printed; it is alive (it runs RMA until told to stop).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    let (status, text) = job.finish(Duration::from_secs(60));
    let took = t0.elapsed();
    assert!(
        !status.success(),
        "the job succeeded with PE 3 killed:\n{text}"
    );
    for r in 0..3 {
        let err = lines_of(&text, r)
            .into_iter()
            .find(|l| l.contains("PE-ERROR"))
            .unwrap_or_else(|| panic!("PE {r} reported no error:\n{text}"));
        // A death report, not a timeout of an operation to PE 3 (whose text names it too).
        assert!(
            err.contains("PE 3 died"),
            "PE {r} should name PE 3's death: {err}\n{text}"
        );
    }
    // The bootstrap notices the death at once; RMA waits check it (not the timeout, nor
    // the grace).
    assert!(took < Duration::from_secs(15), "took {took:?}:\n{text}");
    eprintln!("PE 3 killed during RMA, job ended after {took:?}:\n{text}");
}

/// Host 1's link goes down while every PE runs RMA to a PE on the other host: every PE
/// fails naming a PE of the other host (or its lost bootstrap root), within the timeout.
#[test]
fn link_down_during_rma_is_reported() {
    if !netns_available("link_down_during_rma_is_reported") {
        return;
    }
    const TIMEOUT_MS: u64 = 6000;
    let job = start_job(2, 2, "rma-fail", TIMEOUT_MS, 20_000, &[]);
    job.wait_for("NETNS-READY", 4, Duration::from_secs(20));
    let t_ready = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let st = Command::new(SCRIPT)
        .args(["link-down", "1", "--prefix", &job.prefix])
        .status()
        .unwrap();
    assert!(st.success(), "link-down failed");
    let t_down = Instant::now();
    let (status, text) = job.finish(Duration::from_millis(TIMEOUT_MS + 20_000));
    let took = t_down.elapsed();
    assert!(
        !status.success(),
        "the job succeeded with a link down:\n{text}"
    );
    for r in 0..4 {
        let err = lines_of(&text, r)
            .into_iter()
            .find(|l| l.contains("PE-ERROR"))
            .unwrap_or_else(|| panic!("PE {r} reported no error:\n{text}"));
        let others: &[usize] = if r < 2 { &[2, 3] } else { &[0, 1] };
        assert!(
            others.iter().any(|o| err.contains(&format!("PE {o}"))),
            "PE {r} should name a PE of the other host: {err}\n{text}"
        );
    }
    // Each PE's RMA path failed within the bound (counted from link-down; a PE's clock
    // started at its READY line, at most the time to t_ready before it)...
    let down_ms = (t_down - t_ready).as_millis() as u64;
    for r in 0..4 {
        let line = lines_of(&text, r)
            .into_iter()
            .find(|l| l.contains("RMA-FAILED"))
            .unwrap_or_else(|| panic!("PE {r} printed no RMA-FAILED line:\n{text}"));
        let ms: u64 = line
            .split("RMA-FAILED ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("unreadable line {line:?}"));
        assert!(
            ms < down_ms + TIMEOUT_MS + 4000,
            "PE {r}'s RMA failed {ms} ms after ready, link down at {down_ms} ms:\n{text}"
        );
    }
    // ...and the job then ended (teardown and exit included) well before the 20 s grace
    // ran out (the RMA-FAILED bound above is the check that detection was fast).
    assert!(
        took < Duration::from_secs(16),
        "every PE failed in time, but the job ended {took:?} after link-down (slow \
         teardown or exit):\n{text}"
    );
    eprintln!("link down during RMA noticed, job ended after {took:?}:\n{text}");
}

/// A PE process killed during EP LL calls in shrink mode (2 hosts × 2 PEs, libfabric
/// between the hosts): PEs 0–2 mask PE 3 and go on; each finishes at least 5 more round
/// trips exact against the routing with PE 3 masked, and lists PE 3 dead.
#[test]
fn ep_shrink_survives_a_killed_pe() {
    if !netns_available("ep_shrink_survives_a_killed_pe") {
        return;
    }
    let job = start_job(2, 2, "ep-shrink", 6000, 30_000, &[]);
    job.wait_for("NETNS-READY", 4, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let pid = job.pid_of(3);
    // SAFETY: kill on the pid PE 3 printed; it is alive (it runs EP calls in a loop).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let prefix = job.prefix.clone();
    let (status, text) = job.finish(Duration::from_secs(90));
    assert!(
        !status.success(),
        "PE 3 was killed, the job cannot succeed:\n{text}"
    );
    for r in 0..3 {
        let _ = std::fs::remove_file(format!("/tmp/{prefix}-ep-done-{r}"));
    }
    for r in 0..3 {
        let ok = lines_of(&text, r)
            .into_iter()
            .find(|l| l.contains("EP-SHRINK-OK"))
            .unwrap_or_else(|| panic!("PE {r} did not go on after PE 3 died:\n{text}"));
        let after: usize = ok
            .split(" after ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("unreadable line {ok:?}"));
        assert!(
            after >= 5,
            "PE {r}: {after} validated round trips after the kill\n{text}"
        );
        assert!(ok.ends_with("dead [3]"), "PE {r}: {ok}\n{text}");
        assert!(
            !lines_of(&text, r).iter().any(|l| l.contains("PE-ERROR")),
            "PE {r} failed:\n{text}"
        );
    }
    eprintln!("{text}");
}
