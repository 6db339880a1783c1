//! `rshmem doctor`: what this machine offers rshmem.
//!
//! Owns the probing of the host (CPU PEs and /dev/shm), the CUDA driver, rdma-core and
//! libfabric, and the report printed as a table or JSON. It only observes: it opens
//! libraries and asks them questions (it opens verbs devices to read their ports and GID
//! tables), but never allocates device memory, creates a verbs PD or queue, or creates a
//! fabric. A missing library is a line in the report, never an error
//! or a panic; the command fails only when it cannot print its report.

mod cpu;
mod cuda;
mod dl;
mod fabric;
pub mod queues;
mod rdma;

pub use cpu::{CpuReport, EnvVar, ShmReport};
pub use cuda::{CudaDevice, CudaReport};
pub use fabric::{FabricProvider, FabricReport};
pub use rdma::{Capability, IbgdaReport, RdmaDevice, RdmaReport};

use serde::Serialize;
use std::io::Write;

/// Arguments of `rshmem doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Dump the live soft-HCA queue state of running jobs (published by PE processes
    /// started with RSHMEM_DEBUG_QUEUES=1) instead of probing the machine.
    #[arg(long)]
    pub queues: bool,
    /// With --queues: only this job id.
    #[arg(long, requires = "queues")]
    pub job: Option<String>,
    /// With --queues: only this process.
    #[arg(long, requires = "queues")]
    pub pid: Option<u32>,
}

/// Everything `rshmem doctor` found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub cpu: CpuReport,
    pub cuda: CudaReport,
    pub rdma: RdmaReport,
    /// The real-hardware IBGDA path: each capability and the path GPU PEs would take.
    pub ibgda: IbgdaReport,
    pub libfabric: FabricReport,
    /// Which transports have the hardware/software they need here (not whether the
    /// transport itself is implemented).
    pub summary: Vec<TransportLine>,
}

/// One line of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct TransportLine {
    pub transport: String,
    pub available: bool,
    pub detail: String,
}

/// Probes the machine. Never fails: whatever is missing is described in the report.
pub fn probe() -> Report {
    let cpu = cpu::probe();
    let cuda = cuda::probe();
    let rdma = rdma::probe();
    let libfabric = fabric::probe();
    let summary = summarize(&cuda, &rdma, &libfabric);
    let gpus: Vec<(i32, Option<String>)> = cuda
        .devices
        .iter()
        .map(|d| (d.ordinal, d.pci_bus_id.clone()))
        .collect();
    // Not valid UTF-8: no such device name; the IBGDA report says it found no such HCA.
    let hca = std::env::var_os("RSHMEM_HCA").map(|v| v.to_string_lossy().into_owned());
    let ibgda = rdma::ibgda(&rdma, &gpus, &crate::topo::sysfs_root(), hca.as_deref());
    Report {
        cpu,
        cuda,
        rdma,
        ibgda,
        libfabric,
        summary,
    }
}

/// Runs `rshmem doctor`; returns the process exit code.
pub fn run_cli(args: DoctorArgs) -> i32 {
    if args.queues {
        return queues::run(args.job.as_deref(), args.pid, args.json);
    }
    let report = probe();
    let text = if args.json {
        match serde_json::to_string(&report) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("rshmem doctor: cannot encode the report as JSON: {e}");
                return 1;
            }
        }
    } else {
        render_table(&report)
    };
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rshmem doctor: cannot write the report: {e}");
            1
        }
    }
}

fn summarize(cuda: &CudaReport, rdma: &RdmaReport, fab: &FabricReport) -> Vec<TransportLine> {
    let line = |t: &str, available: bool, detail: String| TransportLine {
        transport: t.to_string(),
        available,
        detail,
    };
    let gpus = cuda.devices.len();
    let gpu_line = if gpus > 0 {
        line("p2p (GPUs)", true, format!("{gpus} CUDA device(s)"))
    } else if cuda.present {
        line("p2p (GPUs)", false, "no CUDA device".into())
    } else {
        line(
            "p2p (GPUs)",
            false,
            "needs the NVIDIA driver (libcuda.so.1)".into(),
        )
    };
    let rma: Vec<&str> = fab
        .providers
        .iter()
        .filter(|p| p.rma)
        .map(|p| p.name.as_str())
        .collect();
    let proxy = if !fab.present {
        line(
            "proxy over libfabric",
            false,
            "needs libfabric (install libfabric1)".into(),
        )
    } else if rma.is_empty() {
        line(
            "proxy over libfabric",
            false,
            "no libfabric provider offers RMA".into(),
        )
    } else {
        line("proxy over libfabric", true, rma.join(", "))
    };
    let mlx5_devices: Vec<&str> = rdma
        .devices
        .iter()
        .filter(|d| d.mlx5)
        .map(|d| d.name.as_str())
        .collect();
    let ibgda = if !rdma.present {
        line(
            "ibgda",
            false,
            "needs rdma-core (install libibverbs1 and ibverbs-providers)".into(),
        )
    } else if mlx5_devices.is_empty() {
        line("ibgda", false, "no mlx5 device".into())
    } else if !rdma.mlx5 {
        line(
            "ibgda",
            false,
            "mlx5 device but libmlx5.so.1 missing (install ibverbs-providers)".into(),
        )
    } else if gpus == 0 {
        line(
            "ibgda",
            false,
            format!("mlx5 device(s) {} but no CUDA GPU", mlx5_devices.join(", ")),
        )
    } else {
        let mem = if rdma.peermem {
            "nvidia-peermem loaded"
        } else {
            "nvidia-peermem not loaded (dma-buf needed)"
        };
        line(
            "ibgda",
            true,
            format!("GPU + mlx5 device(s) {}; {mem}", mlx5_devices.join(", ")),
        )
    };
    vec![
        line("p2p (CPU PEs)", true, "yes".into()),
        gpu_line,
        proxy,
        ibgda,
    ]
}

/// `ACTIVE, InfiniBand, MTU 4096, LID 0x7, 2 GIDs (RoCE v2 at 3)`.
fn port_line(p: &crate::verbs::PortInfo) -> String {
    let state = if p.state == crate::verbs::device::PORT_ACTIVE {
        "ACTIVE".to_string()
    } else {
        format!("state {}", p.state)
    };
    let link = match p.link_layer {
        crate::verbs::device::LINK_LAYER_IB => "InfiniBand",
        crate::verbs::device::LINK_LAYER_ETHERNET => "Ethernet (RoCE)",
        _ => "link layer unknown",
    };
    let mtu = match p.active_mtu {
        m @ 1..=5 => (128u32 << m).to_string(),
        m => format!("?({m})"),
    };
    let mut s = format!(
        "{state}, {link}, MTU {mtu}, LID {:#x}, {} GIDs",
        p.lid,
        p.gids.len()
    );
    // RSHMEM_IB_GID_INDEX as a job would read it (a bad value is the job's error).
    let want = crate::config::IbSettings::from_env()
        .ok()
        .and_then(|ib| ib.gid_index);
    match crate::verbs::qp::choose_gid_at(p, want) {
        Ok(Some(g)) => s.push_str(&format!(" (would use index {}, {:?})", g.index, g.kind)),
        Err(e) if want.is_some() => s.push_str(&format!(" ({e})")),
        _ => {}
    }
    s
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// [`human_bytes`] of a sum the memory checks add up in u128 (saturating at u64::MAX).
pub(crate) fn human_bytes_wide(n: u128) -> String {
    human_bytes(u64::try_from(n).unwrap_or(u64::MAX))
}

/// `12.3 GiB`.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn render_table(r: &Report) -> String {
    // Sections are built as (header | row) items, then formatted.
    let mut lines: Vec<(Option<&str>, String)> = Vec::new();
    let c = &r.cpu;
    lines.push((Some("CPU PEs"), String::new()));
    let kv = |k: &str, v: String| (None, format!("{k:<22} {v}"));
    lines.push(kv("available", "yes".into()));
    lines.push(kv(
        "CPUs",
        c.count
            .map(|n| n.to_string())
            .unwrap_or_else(|| "unknown".into()),
    ));
    let shm = match (c.shm.total_bytes, c.shm.free_bytes, &c.shm.error) {
        (Some(t), Some(f), _) => format!(
            "{} total, {} free (a heap that does not fit goes to a memfd)",
            human_bytes(t),
            human_bytes(f)
        ),
        (_, _, Some(e)) => format!("unknown ({e})"),
        _ => "unknown".into(),
    };
    lines.push(kv(&c.shm.path, shm));
    lines.push(kv("hostname", c.hostname.clone()));
    lines.push(kv(
        "node id",
        format!("{} (from {})", c.node_id, c.node_id_source),
    ));
    if c.env.is_empty() {
        lines.push(kv("RSHMEM_* set", "none".into()));
    } else {
        for (i, v) in c.env.iter().enumerate() {
            let k = if i == 0 { "RSHMEM_* set" } else { "" };
            lines.push(kv(k, format!("{}={}", v.name, v.value)));
            if let Some(why) = &v.unknown {
                lines.push(kv("", format!("  warning: {why}")));
            }
        }
    }

    lines.push((Some("CUDA"), String::new()));
    lines.push(kv("libcuda", r.cuda.detail.clone()));
    for d in &r.cuda.devices {
        let mut v = format!(
            "{}, {}, compute capability {}",
            d.name.as_deref().unwrap_or("?"),
            d.total_mem_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "? memory".into()),
            d.compute_capability.as_deref().unwrap_or("?"),
        );
        if let Some(bus) = &d.pci_bus_id {
            v.push_str(&format!(", PCI {bus}"));
        }
        if let Some(e) = &d.error {
            v.push_str(&format!(" [{e}]"));
        }
        lines.push(kv(&format!("GPU {}", d.ordinal), v));
        let yn = |b: Option<bool>| match b {
            Some(true) => "yes",
            Some(false) => "no",
            None => "?",
        };
        lines.push(kv(
            "",
            format!(
                "VMM {}, POSIX-fd handles {}, GPUDirect RDMA with VMM {}, dma-buf {}, \
                 RDMA write ordering {}",
                yn(d.vmm),
                yn(d.posix_fd_handles),
                yn(d.gpudirect_rdma_vmm),
                yn(d.dma_buf),
                d.gpudirect_rdma_writes_ordering.as_deref().unwrap_or("?")
            ),
        ));
    }
    if let Some(why) = &r.cuda.p2p_detail {
        lines.push(kv("P2P", why.clone()));
    }
    if let Some(q) = &r.cuda.hardware_queues_detail {
        lines.push(kv("HW queues", q.clone()));
    }
    if let Some(f) = &r.cuda.fd_export {
        lines.push(kv("heap fd export", f.clone()));
    }
    for m in &r.cuda.modules {
        lines.push(kv(&format!("module {}", m.module), m.load.clone()));
    }
    for p in &r.cuda.p2p {
        let v = match (p.access, &p.error) {
            (Some(true), _) => match p.native_atomics {
                Some(true) => "yes, native atomics".to_string(),
                Some(false) => "yes, without native atomics (read-modify-write atomics and \
                                signal ADDs to PEs there are refused)"
                    .to_string(),
                None => "yes".to_string(),
            },
            (Some(false), _) => "no".to_string(),
            (None, e) => e.clone().unwrap_or_default(),
        };
        lines.push(kv(&format!("P2P {} -> {}", p.from, p.to), v));
    }

    lines.push((Some("rdma-core"), String::new()));
    lines.push(kv("rdma-core", r.rdma.detail.clone()));
    if r.rdma.present {
        for d in &r.rdma.devices {
            let mut v = format!(
                "driver {}{}",
                d.kernel_driver.as_deref().unwrap_or("unknown"),
                if d.mlx5 { " (mlx5)" } else { "" }
            );
            if let Some(fw) = &d.fw_ver {
                v.push_str(&format!(", firmware {fw}"));
            }
            if let Some(a) = &d.atomic_cap {
                v.push_str(&format!(", atomics {a}"));
            }
            if let Some(pci) = &d.pci {
                v.push_str(&format!(", PCI {pci}"));
            }
            if let Some(e) = &d.error {
                v.push_str(&format!(" [{e}]"));
            }
            lines.push(kv(&format!("device {}", d.name), v));
            for p in &d.ports {
                lines.push(kv(&format!("  port {}", p.port), port_line(p)));
            }
        }
    }
    lines.push(kv("mlx5 provider", r.rdma.mlx5_detail.clone()));
    lines.push(kv(
        "nvidia-peermem",
        if r.rdma.peermem {
            "loaded"
        } else {
            "not loaded"
        }
        .into(),
    ));
    lines.push(kv(
        "PeerMappingOverride=1",
        match r.rdma.peer_mapping_override {
            Some(b) => yes_no(b).into(),
            None => "unknown (no NVIDIA driver)".into(),
        },
    ));

    lines.push((Some("IBGDA (real mlx5 path for GPU PEs)"), String::new()));
    let g = &r.ibgda;
    for (k, c) in [
        ("mlx5 device", &g.mlx5_device),
        ("dma-buf", &g.dmabuf),
        ("nvidia-peermem", &g.peermem),
        ("doorbell mapping", &g.doorbell_mapping),
        ("locked memory", &g.locked_memory),
    ] {
        let v = if c.detail.starts_with(c.state) {
            c.detail.clone()
        } else {
            format!("{}: {}", c.state, c.detail)
        };
        lines.push(kv(k, v));
    }
    lines.push(kv("GPU PE path", g.gpu_pe_path.clone()));
    for n in &g.nics {
        lines.push(kv(
            &format!("NIC of GPU {}", n.gpu),
            match &n.nic {
                Some(nic) => format!("{nic} ({})", n.why),
                None => n.why.clone(),
            },
        ));
    }

    lines.push((Some("libfabric"), String::new()));
    lines.push(kv("libfabric", r.libfabric.detail.clone()));
    for p in &r.libfabric.providers {
        lines.push(kv(
            &format!("provider {}", p.name),
            format!("RMA {}, atomic {}", yes_no(p.rma), yes_no(p.atomic)),
        ));
    }

    lines.push((
        Some("Summary (hardware/software available here; not every transport is implemented yet)"),
        String::new(),
    ));
    for t in &r.summary {
        lines.push((None, format!("{}: {}", t.transport, t.detail)));
    }

    let mut s = String::new();
    for (i, (header, text)) in lines.iter().enumerate() {
        match header {
            Some(h) => {
                if i > 0 {
                    s.push('\n');
                }
                s.push_str(h);
                s.push('\n');
            }
            None => {
                s.push_str("  ");
                s.push_str(text.trim_end());
                s.push('\n');
            }
        }
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuda(devices: usize) -> CudaReport {
        CudaReport {
            present: true,
            detail: String::new(),
            driver_version: Some(13000),
            devices: (0..devices as i32)
                .map(|ordinal| CudaDevice {
                    ordinal,
                    name: Some("H200".into()),
                    total_mem_bytes: Some(1 << 30),
                    compute_capability: Some("9.0".into()),
                    pci_bus_id: None,
                    error: None,
                    vmm: Some(true),
                    posix_fd_handles: Some(true),
                    gpudirect_rdma_vmm: Some(true),
                    dma_buf: Some(true),
                    gpudirect_rdma_writes_ordering: Some("owner".into()),
                })
                .collect(),
            p2p: Vec::new(),
            p2p_detail: None,
            hardware_queues: Some(32),
            hardware_queues_detail: None,
            fd_export: None,
            modules: Vec::new(),
        }
    }

    fn rdma(devices: &[(&str, bool)], libmlx5: bool, peermem: bool) -> RdmaReport {
        RdmaReport {
            present: true,
            version: None,
            reg_dmabuf_mr: true,
            kernel_dmabuf: None,
            detail: String::new(),
            devices: devices
                .iter()
                .map(|&(name, mlx5)| RdmaDevice {
                    name: name.into(),
                    kernel_driver: None,
                    mlx5,
                    mlx5dv: Some(mlx5),
                    fw_ver: None,
                    atomic_cap: Some("HCA".into()),
                    pci: None,
                    ports: Vec::new(),
                    error: None,
                })
                .collect(),
            mlx5: libmlx5,
            mlx5_detail: String::new(),
            peermem,
            peer_mapping_override: None,
        }
    }

    fn fabric(providers: &[(&str, bool)]) -> FabricReport {
        FabricReport {
            present: true,
            detail: String::new(),
            version: Some("1.17".into()),
            providers: providers
                .iter()
                .map(|&(name, rma)| FabricProvider {
                    name: name.into(),
                    rma,
                    atomic: rma,
                })
                .collect(),
        }
    }

    fn lines(s: &[TransportLine]) -> Vec<(String, bool, String)> {
        s.iter()
            .map(|t| (t.transport.clone(), t.available, t.detail.clone()))
            .collect()
    }

    #[test]
    fn summary_with_gpu_mlx5_and_libfabric() {
        let s = summarize(
            &cuda(8),
            &rdma(
                &[("mlx5_0", true), ("mlx5_1", true), ("rxe0", false)],
                true,
                true,
            ),
            &fabric(&[("tcp;ofi_rxm", true), ("udp", false)]),
        );
        let l = |t: &str, a: bool, d: &str| (t.to_string(), a, d.to_string());
        assert_eq!(
            lines(&s),
            vec![
                l("p2p (CPU PEs)", true, "yes"),
                l("p2p (GPUs)", true, "8 CUDA device(s)"),
                l("proxy over libfabric", true, "tcp;ofi_rxm"),
                l(
                    "ibgda",
                    true,
                    "GPU + mlx5 device(s) mlx5_0, mlx5_1; nvidia-peermem loaded"
                ),
            ]
        );
    }

    #[test]
    fn summary_names_what_is_missing() {
        let mut no_fabric = fabric(&[]);
        no_fabric.present = false;
        let s = summarize(
            &cuda(0),
            &rdma(&[("mlx5_0", true)], true, false),
            &no_fabric,
        );
        assert_eq!(s[1].detail, "no CUDA device");
        assert_eq!(s[2].detail, "needs libfabric (install libfabric1)");
        assert_eq!(s[3].detail, "mlx5 device(s) mlx5_0 but no CUDA GPU");
        let s = summarize(
            &cuda(1),
            &rdma(&[], true, false),
            &fabric(&[("udp", false)]),
        );
        assert_eq!(s[2].detail, "no libfabric provider offers RMA");
        assert_eq!(s[3].detail, "no mlx5 device");
        assert!(s[1..]
            .iter()
            .all(|t| t.available == (t.transport == "p2p (GPUs)")));
    }

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(143771 << 20), "140.4 GiB");
    }
}
