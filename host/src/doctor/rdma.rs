//! The rdma-core section of the doctor: libibverbs and its devices (ports, link layer,
//! GIDs) through `crate::verbs`, the mlx5 provider (libmlx5, which also carries mlx5dv),
//! and the IBGDA capabilities: mlx5 device, dma-buf, nvidia-peermem, doorbell mapping, and
//! the path GPU PEs would take ([`crate::verbs::plan_path`]).

use super::dl;
use crate::error::Error;
use crate::verbs::{self, DeviceInfo, PathCaps, PathPlan};
use serde::Serialize;
use std::path::Path;

/// rdma-core and the IBGDA prerequisites.
#[derive(Debug, Clone, Serialize)]
pub struct RdmaReport {
    /// Whether libibverbs loaded.
    pub present: bool,
    /// rdma-core release of the loaded libibverbs (`44.0`), from its file name.
    pub version: Option<String>,
    /// One line: `found (libibverbs.so.1 44.0), 0 RDMA devices`, or why nothing was.
    pub detail: String,
    pub devices: Vec<RdmaDevice>,
    /// Whether libmlx5.so.1 (the mlx5 provider, with mlx5dv) loads.
    pub mlx5: bool,
    pub mlx5_detail: String,
    /// Whether the nvidia-peermem kernel module is loaded (/sys/module/nvidia_peermem or
    /// /proc/modules).
    pub peermem: bool,
    /// Whether /proc/driver/nvidia/params contains PeerMappingOverride=1; null when that
    /// file is absent (no NVIDIA driver).
    pub peer_mapping_override: Option<bool>,
    /// Whether libibverbs exports `ibv_reg_dmabuf_mr` (rdma-core ≥ 34).
    pub reg_dmabuf_mr: bool,
    /// CONFIG_DMA_SHARED_BUFFER of the running kernel; null when the config is unreadable.
    pub kernel_dmabuf: Option<bool>,
}

/// One verbs device.
#[derive(Debug, Clone, Serialize)]
pub struct RdmaDevice {
    pub name: String,
    /// Kernel driver bound to the device (`mlx5_core`, `rdma_rxe`, ...), from sysfs.
    pub kernel_driver: Option<String>,
    /// A ConnectX (mlx5) device: the kind IBGDA drives. `mlx5dv_is_supported` when
    /// libmlx5 loads, else the sysfs driver (or the `mlx5_` name prefix).
    pub mlx5: bool,
    /// `mlx5dv_is_supported`; null when libmlx5 is not loaded.
    pub mlx5dv: Option<bool>,
    pub fw_ver: Option<String>,
    /// `ibv_device_attr.atomic_cap`: `HCA` (what IBGDA needs: 8-byte atomic results in
    /// host byte order), `NONE`, `GLOB`, else the number; null when the device could not
    /// be queried.
    pub atomic_cap: Option<String>,
    /// The device's PCI address (`0000:1b:00.0`), from sysfs; null for a device without
    /// a PCI function (rxe, siw).
    pub pci: Option<String>,
    pub ports: Vec<verbs::PortInfo>,
    /// Why the device could not be opened or queried, if so.
    pub error: Option<String>,
}

/// The NIC a GPU PE on one GPU would take (`gpu::nic::choose_port`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GpuNic {
    pub gpu: i32,
    pub pci_bus_id: Option<String>,
    /// `mlx5_0:1`, or null when none would do (see `why`).
    pub nic: Option<String>,
    pub why: String,
}

/// One IBGDA capability: `yes`, `no` or `unknown`, with what decided it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Capability {
    pub state: &'static str,
    pub detail: String,
}

fn cap(state: Option<bool>, detail: impl Into<String>) -> Capability {
    Capability {
        state: match state {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        },
        detail: detail.into(),
    }
}

/// What the real-hardware IBGDA path would find here, and the path GPU PEs take.
#[derive(Debug, Clone, Serialize)]
pub struct IbgdaReport {
    pub mlx5_device: Capability,
    pub dmabuf: Capability,
    pub peermem: Capability,
    pub doorbell_mapping: Capability,
    /// `ulimit -l` against the host memory each PE's queues pin.
    pub locked_memory: Capability,
    /// The capability booleans the planner was given.
    pub caps: PathCaps,
    pub plan: PathPlan,
    /// Per GPU, the NIC its PEs would take over `RSHMEM_TRANSPORT=ibgda` (`RSHMEM_HCA`,
    /// else the one nearest it on PCIe); empty without GPUs or an active mlx5 port.
    pub nics: Vec<GpuNic>,
    /// `plan.summary()`: e.g. `proxy over libfabric: no mlx5 device`.
    pub gpu_pe_path: String,
}

pub(super) fn probe() -> RdmaReport {
    let (mlx5, mlx5_detail) = match verbs::loader::mlx5() {
        Ok(_) => (
            true,
            "libmlx5.so.1 loaded (mlx5 provider, mlx5dv)".to_string(),
        ),
        Err(e) => (false, dl::absent_statement(&e)),
    };
    let params = std::fs::read_to_string("/proc/driver/nvidia/params").ok();
    let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    let peermem = Path::new("/sys/module/nvidia_peermem").exists()
        || module_loaded(&modules, "nvidia_peermem");
    let kernel_dmabuf = kernel_config().and_then(|c| kernel_option(&c, "CONFIG_DMA_SHARED_BUFFER"));
    let mut report = RdmaReport {
        present: false,
        version: None,
        detail: String::new(),
        devices: Vec::new(),
        mlx5,
        mlx5_detail,
        peermem,
        peer_mapping_override: params.as_deref().map(peer_mapping_override),
        reg_dmabuf_mr: false,
        kernel_dmabuf,
    };
    let lib = match verbs::loader::verbs() {
        Ok(l) => l,
        Err(e) => {
            report.detail = missing_statement(&e);
            return report;
        }
    };
    report.present = true;
    report.reg_dmabuf_mr = lib.ibv_reg_dmabuf_mr.is_ok();
    report.version = verbs::loader::verbs_file().and_then(|f| verbs::loader::rdma_core_version(&f));
    let name = verbs::loader::verbs_name().unwrap_or("libibverbs.so.1");
    let found = match &report.version {
        Some(v) => format!("found ({name} {v})"),
        None => format!("found ({name})"),
    };
    match verbs::list_devices() {
        Ok(devs) => {
            report.detail = format!("{found}, {}", devices_phrase(devs.len()));
            if devs.is_empty() && !Path::new("/sys/class/infiniband").exists() {
                report
                    .detail
                    .push_str(" (no /sys/class/infiniband: the kernel has no RDMA support)");
            }
            report.devices = devs.into_iter().map(|d| describe(d, mlx5)).collect();
        }
        Err(e) => report.detail = format!("{found}; listing devices failed: {e}"),
    }
    report
}

fn missing_statement(e: &Error) -> String {
    match e {
        Error::LibraryMissing { library, .. } => format!(
            "absent: {library} not found (install libibverbs1, and ibverbs-providers for mlx5)"
        ),
        other => format!("absent: {other}"),
    }
}

/// `0 RDMA devices`, `1 RDMA device`, `2 RDMA devices`.
fn devices_phrase(n: usize) -> String {
    if n == 1 {
        "1 RDMA device".to_string()
    } else {
        format!("{n} RDMA devices")
    }
}

fn describe(d: DeviceInfo, libmlx5: bool) -> RdmaDevice {
    let kernel_driver =
        std::fs::read_link(format!("/sys/class/infiniband/{}/device/driver", d.name))
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
    let mlx5dv = libmlx5.then_some(d.mlx5);
    let mlx5 = mlx5dv.unwrap_or_else(|| is_mlx5(&d.name, kernel_driver.as_deref()));
    let queried = d.error.is_none();
    RdmaDevice {
        pci: crate::topo::rdma_place(&crate::topo::sysfs_root(), &d.name).map(|p| p.bdf),
        name: d.name,
        kernel_driver,
        mlx5,
        mlx5dv,
        fw_ver: (!d.fw_ver.is_empty()).then_some(d.fw_ver),
        atomic_cap: queried.then(|| atomic_cap_name(d.atomic_cap)),
        ports: d.ports,
        error: d.error,
    }
}

/// `HCA`, `NONE`, `GLOB` for `ibv_atomic_cap`, else the number.
fn atomic_cap_name(v: u32) -> String {
    match v {
        verbs::sys::IBV_ATOMIC_NONE => "NONE".into(),
        verbs::sys::IBV_ATOMIC_HCA => "HCA".into(),
        verbs::sys::IBV_ATOMIC_GLOB => "GLOB".into(),
        n => n.to_string(),
    }
}

/// Per GPU `(ordinal, PCI bus id)`, the NIC `gpu::nic::choose_port` would take, with
/// `hca` (`RSHMEM_HCA`) and NIC places read under `sysfs`.
pub(super) fn nic_per_gpu(
    r: &RdmaReport,
    gpus: &[(i32, Option<String>)],
    sysfs: &Path,
    hca: Option<&str>,
) -> Vec<GpuNic> {
    let devices: Vec<DeviceInfo> = r
        .devices
        .iter()
        .map(|d| DeviceInfo {
            name: d.name.clone(),
            mlx5: d.mlx5,
            fw_ver: String::new(),
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            atomic_cap: match d.atomic_cap.as_deref() {
                Some("HCA") => verbs::sys::IBV_ATOMIC_HCA,
                Some("GLOB") => verbs::sys::IBV_ATOMIC_GLOB,
                _ => verbs::sys::IBV_ATOMIC_NONE,
            },
            ports: d.ports.clone(),
            error: d.error.clone(),
        })
        .collect();
    gpus.iter()
        .map(|(ordinal, bus)| {
            let near = crate::gpu::nic::Near {
                gpu: bus
                    .as_deref()
                    .and_then(|b| crate::topo::pci_place(sysfs, b)),
                ordinal: (*ordinal).max(0) as usize,
                sysfs: sysfs.to_path_buf(),
            };
            let (nic, why) = match crate::gpu::nic::choose_port(&devices, hca, Some(&near)) {
                Ok(c) => (Some(format!("{}:{}", c.name, c.port)), c.why),
                Err(e) => (None, e.to_string()),
            };
            GpuNic {
                gpu: *ordinal,
                pci_bus_id: bus.clone(),
                nic,
                why,
            }
        })
        .collect()
}

/// The sysfs driver decides; the `mlx5_` name prefix is the fallback when sysfs says
/// nothing (devices can be renamed, so the driver is the better witness).
fn is_mlx5(name: &str, kernel_driver: Option<&str>) -> bool {
    match kernel_driver {
        Some(d) => d == "mlx5_core",
        None => name.starts_with("mlx5"),
    }
}

/// The option is set through `NVreg_RegistryDwords="PeerMappingOverride=1;..."`, which the
/// driver echoes on its `RegistryDwords:` line.
fn peer_mapping_override(params: &str) -> bool {
    params.contains("PeerMappingOverride=1")
}

/// Whether `/proc/modules` text lists `module` (first field of a line).
fn module_loaded(proc_modules: &str, module: &str) -> bool {
    proc_modules
        .lines()
        .any(|l| l.split_whitespace().next() == Some(module))
}

/// The running kernel's config: /boot/config-<release>, else /proc/config.gz through
/// `zcat`. None when neither is readable.
fn kernel_config() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    if let Ok(c) = std::fs::read_to_string(format!("/boot/config-{}", release.trim())) {
        return Some(c);
    }
    if !Path::new("/proc/config.gz").exists() {
        return None;
    }
    let out = std::process::Command::new("zcat")
        .arg("/proc/config.gz")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `CONFIG_X=y|m` → true, `# CONFIG_X is not set` → false, absent → None.
fn kernel_option(config: &str, name: &str) -> Option<bool> {
    for l in config.lines() {
        if let Some(v) = l.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            return Some(v == "y" || v == "m");
        }
        if l == format!("# {name} is not set") {
            return Some(false);
        }
    }
    None
}

/// The IBGDA capabilities from the rdma-core report and the CUDA GPUs
/// (`(ordinal, PCI bus id)`), with each GPU's NIC ([`nic_per_gpu`], from `sysfs` and
/// `hca`, which is `RSHMEM_HCA`).
pub(super) fn ibgda(
    r: &RdmaReport,
    gpu_list: &[(i32, Option<String>)],
    sysfs: &Path,
    hca: Option<&str>,
) -> IbgdaReport {
    let gpus = gpu_list.len();
    let active = |d: &RdmaDevice| {
        d.ports
            .iter()
            .any(|p| p.state == verbs::device::PORT_ACTIVE)
    };
    let mlx5_devs: Vec<&RdmaDevice> = r.devices.iter().filter(|d| d.mlx5).collect();
    let mlx5_active: Vec<&str> = mlx5_devs
        .iter()
        .filter(|d| active(d))
        .map(|d| d.name.as_str())
        .collect();
    let mlx5_device = if !r.present {
        cap(Some(false), "rdma-core missing")
    } else if mlx5_devs.is_empty() {
        cap(Some(false), "no mlx5 device")
    } else if mlx5_active.is_empty() {
        let names: Vec<&str> = mlx5_devs.iter().map(|d| d.name.as_str()).collect();
        cap(
            Some(false),
            format!("{} present but no port is ACTIVE", names.join(", ")),
        )
    } else {
        cap(Some(true), mlx5_active.join(", "))
    };
    let kernel = match r.kernel_dmabuf {
        Some(true) => "kernel CONFIG_DMA_SHARED_BUFFER=y",
        Some(false) => "kernel without CONFIG_DMA_SHARED_BUFFER",
        None => "kernel dma-buf support unknown (config unreadable)",
    };
    let dmabuf_ok = r.reg_dmabuf_mr && r.kernel_dmabuf != Some(false);
    let dmabuf = if !r.present {
        cap(Some(false), "rdma-core missing")
    } else if !r.reg_dmabuf_mr {
        cap(
            Some(false),
            format!("ibv_reg_dmabuf_mr not exported by libibverbs; {kernel}"),
        )
    } else {
        cap(
            if r.kernel_dmabuf == Some(false) { Some(false) } else { r.kernel_dmabuf },
            format!("ibv_reg_dmabuf_mr present; {kernel}; the GPU driver's export is checked when registering"),
        )
    };
    let peermem = cap(
        Some(r.peermem),
        if r.peermem {
            "nvidia_peermem module loaded"
        } else {
            "nvidia_peermem module not loaded"
        },
    );
    let both = gpus > 0 && !mlx5_active.is_empty();
    let doorbell_mapping = if both {
        cap(
            None,
            format!(
                "unknown until a GPU PE maps the UAR (cuMemHostRegister IOMEMORY); PeerMappingOverride=1 {}",
                match r.peer_mapping_override {
                    Some(true) => "set",
                    Some(false) => "not set (the mapping will likely be refused)",
                    None => "unknown",
                }
            ),
        )
    } else {
        cap(None, "unknown: needs a GPU and an mlx5 device")
    };
    let locked_memory = locked_memory_cap(
        crate::verbs::memlock::limit(),
        crate::verbs::memlock::has_ipc_lock(),
    );
    let caps = PathCaps {
        gpu: gpus > 0,
        rdma_core: r.present,
        libmlx5: r.mlx5,
        mlx5_device: !mlx5_active.is_empty(),
        dmabuf: dmabuf_ok,
        peermem: r.peermem,
        doorbell_mapping: None,
    };
    let plan = verbs::plan_path(&caps);
    IbgdaReport {
        mlx5_device,
        dmabuf,
        peermem,
        doorbell_mapping,
        locked_memory,
        caps,
        gpu_pe_path: match plan.path {
            verbs::Path::Proxy => plan.summary(),
            _ => format!(
                "{} (opt-in: RSHMEM_TRANSPORT=ibgda; never run on a NIC yet, docs/ibgda.md)",
                plan.summary()
            ),
        },
        plan,
        nics: if both {
            nic_per_gpu(r, gpu_list, sysfs, hca)
        } else {
            Vec::new()
        },
    }
}

/// `ulimit -l` (`limit`, None: unlimited) against the queues of a job: each PE's GPU
/// pins about `QP_CAPS.pinned_estimate()` ([`crate::gpu::nic::QP_CAPS`]) of host memory
/// per PE of the job. "no" when fewer than 8 PEs' queues fit (one node of 8 GPUs), unless
/// CAP_IPC_LOCK lifts it.
fn locked_memory_cap(limit: Option<u64>, ipc_lock: bool) -> Capability {
    let per = crate::gpu::nic::QP_CAPS.pinned_estimate();
    match (limit, ipc_lock) {
        (None, _) => cap(Some(true), "unlimited"),
        (Some(l), true) => cap(
            Some(true),
            format!(
                "{} but lifted by CAP_IPC_LOCK",
                crate::doctor::human_bytes(l)
            ),
        ),
        (Some(l), false) => {
            let fit = l / per;
            cap(
                Some(fit >= 8),
                format!(
                    "{}: queues for a job of about {fit} PEs with one GPU PE per process \
                     (about {} per PE of the job){}",
                    crate::doctor::human_bytes(l),
                    crate::doctor::human_bytes(per),
                    if fit >= 8 {
                        String::new()
                    } else {
                        format!("; {}", crate::verbs::memlock::cure(l))
                    }
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_memory_against_the_queues_of_a_job() {
        assert_eq!(locked_memory_cap(None, false).state, "yes");
        let c = locked_memory_cap(Some(64 << 10), false);
        assert_eq!(c.state, "no");
        assert!(
            c.detail.starts_with(
                "64.0 KiB: queues for a job of about 0 PEs with one GPU PE per process (about \
                 388.0 KiB per PE of the job)"
            ),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("ulimit -l unlimited"), "{}", c.detail);
        assert_eq!(locked_memory_cap(Some(8 << 20), false).state, "yes");
        assert_eq!(locked_memory_cap(Some(64 << 10), true).state, "yes");
    }

    #[test]
    fn mlx5_detection_prefers_kernel_driver() {
        assert!(is_mlx5("mlx5_0", Some("mlx5_core")));
        assert!(is_mlx5("ibp3s0", Some("mlx5_core")));
        assert!(!is_mlx5("rxe0", Some("rdma_rxe")));
        assert!(is_mlx5("mlx5_1", None));
        assert!(!is_mlx5("efa_0", None));
    }

    #[test]
    fn peer_mapping_override_is_read_from_registry_dwords() {
        let on = "ModifyDeviceFiles: 1\nRegistryDwords: \"PeerMappingOverride=1;\"\n";
        let off = "ModifyDeviceFiles: 1\nRegistryDwords: \"\"\n";
        assert!(peer_mapping_override(on));
        assert!(!peer_mapping_override(off));
    }

    #[test]
    fn modules_and_kernel_config() {
        let m = "nvidia_uvm 1388544 0 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\n";
        assert!(module_loaded(m, "nvidia_peermem"));
        assert!(!module_loaded(m, "nvidia"));
        let c = "CONFIG_DMA_SHARED_BUFFER=y\n# CONFIG_INFINIBAND is not set\nCONFIG_FOO=m\n";
        assert_eq!(kernel_option(c, "CONFIG_DMA_SHARED_BUFFER"), Some(true));
        assert_eq!(kernel_option(c, "CONFIG_INFINIBAND"), Some(false));
        assert_eq!(kernel_option(c, "CONFIG_FOO"), Some(true));
        assert_eq!(kernel_option(c, "CONFIG_BAR"), None);
        assert_eq!(devices_phrase(0), "0 RDMA devices");
        assert_eq!(devices_phrase(1), "1 RDMA device");
    }

    fn report(devices: Vec<RdmaDevice>) -> RdmaReport {
        RdmaReport {
            present: true,
            version: Some("44.0".into()),
            detail: String::new(),
            devices,
            mlx5: true,
            mlx5_detail: String::new(),
            peermem: false,
            peer_mapping_override: None,
            reg_dmabuf_mr: true,
            kernel_dmabuf: Some(true),
        }
    }

    fn dev(name: &str, mlx5: bool, active: bool) -> RdmaDevice {
        RdmaDevice {
            name: name.into(),
            kernel_driver: None,
            mlx5,
            mlx5dv: Some(mlx5),
            fw_ver: None,
            atomic_cap: Some("HCA".into()),
            pci: None,
            ports: vec![verbs::PortInfo {
                port: 1,
                state: if active {
                    verbs::device::PORT_ACTIVE
                } else {
                    1
                },
                link_layer: 1,
                active_mtu: 5,
                lid: 1,
                gids: vec![],
            }],
            error: None,
        }
    }

    /// GPUs 0..n with unknown PCI addresses.
    fn gpus(n: i32) -> Vec<(i32, Option<String>)> {
        (0..n).map(|i| (i, None)).collect()
    }

    #[test]
    fn each_gpu_gets_the_nic_nearest_it() {
        use crate::topo::tests::{gpu, nic, tree, Scratch};
        let dir = Scratch::new("doctor-nics");
        let root = dir.0.as_path();
        let sw = |i: u32| format!("pci0000:00/0000:00:0{i}.0/0000:{i}0:00.0");
        let (g1, n1) = (
            format!("{}/0000:11:00.0", sw(1)),
            format!("{}/0000:12:00.0", sw(1)),
        );
        let (g2, n2) = (
            format!("{}/0000:21:00.0", sw(2)),
            format!("{}/0000:22:00.0", sw(2)),
        );
        tree(
            root,
            &[gpu(&g1, 0), nic(&n1, 0), gpu(&g2, 0), nic(&n2, 0)],
            &[("mlx5_0", &n2), ("mlx5_1", &n1)],
        )
        .unwrap();
        let rep = report(vec![dev("mlx5_0", true, true), dev("mlx5_1", true, true)]);
        let gpus = [
            (0, Some("0000:11:00.0".to_string())),
            (1, Some("0000:21:00.0".to_string())),
            (2, None),
        ];
        let r = ibgda(&rep, &gpus, root, None);
        let got: Vec<(i32, Option<&str>)> =
            r.nics.iter().map(|n| (n.gpu, n.nic.as_deref())).collect();
        assert_eq!(
            got,
            vec![
                (0, Some("mlx5_1:1")),
                (1, Some("mlx5_0:1")),
                (2, Some("mlx5_0:1"))
            ]
        );
        assert_eq!(
            r.nics[0].why,
            "nearest GPU 0000:11:00.0: shares a PCIe switch (2 hops)"
        );
        assert!(
            r.nics[2].why.contains("place is unknown"),
            "{}",
            r.nics[2].why
        );
        // RSHMEM_HCA is what every GPU takes; a bad one is its error.
        let r = ibgda(&rep, &gpus, root, Some("mlx5_0"));
        assert!(r.nics.iter().all(|n| n.nic.as_deref() == Some("mlx5_0:1")));
        let r = ibgda(&rep, &gpus, root, Some("mlx5_7"));
        assert!(r
            .nics
            .iter()
            .all(|n| n.nic.is_none() && n.why.contains("no RDMA device mlx5_7")));
        // Without a GPU there is nothing to place.
        assert!(ibgda(&rep, &[], root, None).nics.is_empty());
    }

    #[test]
    fn ibgda_capabilities() {
        // This machine's shape: libibverbs, no devices, no GPU.
        let none = Path::new("/nonexistent-sysfs");
        let ibgda = |r: &RdmaReport, n: i32| ibgda(r, &gpus(n), none, None);
        let r = ibgda(&report(vec![]), 0);
        assert_eq!(r.mlx5_device, cap(Some(false), "no mlx5 device"));
        assert_eq!(
            r.doorbell_mapping,
            cap(None, "unknown: needs a GPU and an mlx5 device")
        );
        assert_eq!(r.gpu_pe_path, "proxy over libfabric: no mlx5 device");
        assert_eq!(r.dmabuf.state, "yes");
        // A down mlx5 port does not count.
        let r = ibgda(&report(vec![dev("mlx5_0", true, false)]), 8);
        assert_eq!(
            r.mlx5_device,
            cap(Some(false), "mlx5_0 present but no port is ACTIVE")
        );
        assert_eq!(r.plan.path, verbs::Path::Proxy);
        // GPU + active mlx5 + dma-buf: ibgda, mapping still unknown.
        let r = ibgda(
            &report(vec![dev("rxe0", false, true), dev("mlx5_1", true, true)]),
            8,
        );
        assert_eq!(r.mlx5_device, cap(Some(true), "mlx5_1"));
        assert_eq!(r.plan.path, verbs::Path::Ibgda);
        assert_eq!(r.plan.heap, Some(verbs::HeapRegistration::DmaBuf));
        assert!(
            r.gpu_pe_path.starts_with("ibgda: ")
                && r.gpu_pe_path.contains("(opt-in: RSHMEM_TRANSPORT=ibgda;"),
            "{}",
            r.gpu_pe_path
        );
        assert_eq!(r.doorbell_mapping.state, "unknown");
        assert!(r
            .doorbell_mapping
            .detail
            .ends_with("PeerMappingOverride=1 unknown"));
        // No dma-buf in the kernel, no peermem: proxy.
        let mut rep = report(vec![dev("mlx5_0", true, true)]);
        rep.kernel_dmabuf = Some(false);
        let r = ibgda(&rep, 1);
        assert_eq!(r.dmabuf.state, "no");
        assert_eq!(
            r.gpu_pe_path,
            "proxy over libfabric: GPU memory cannot be registered: no dma-buf and no nvidia-peermem"
        );
    }
}
