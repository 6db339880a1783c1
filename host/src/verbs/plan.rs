//! Which network path a GPU PE takes, decided from capability booleans alone (pure, so
//! it is unit-tested and shared by the doctor and the runtime).
//!
//! Paths, best first:
//! - **ibgda**: GPU threads write WQEs into the NIC's SQ, the doorbell record, and the
//!   BlueFlame register, which the GPU reaches because the UAR page was mapped with
//!   `cuMemHostRegister(uar, page, PORTABLE | DEVICEMAP | IOMEMORY)` +
//!   `cuMemHostGetDevicePointer` (done by the GPU layer, host/src/gpu/, from the page
//!   [`NicQueues::uar_page`](super::dv::NicQueues::uar_page) names).
//! - **ibgda-cpu-doorbell**: the same, except that the driver refused to map the UAR
//!   (it needs `NVreg_RegistryDwords="PeerMappingOverride=1"`): GPU threads still write
//!   WQEs and the doorbell record; a CPU thread watches the doorbell record's send counter
//!   in host memory and writes the BlueFlame register itself.
//! - **proxy**: no usable mlx5 path: GPU threads post into soft-HCA queues in host-pinned
//!   memory and the soft HCA's engine executes them (over libfabric between nodes).

use serde::Serialize;

/// What is known about this machine (from the doctor, or from the runtime's probes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
pub struct PathCaps {
    /// A CUDA GPU is present (the path is for GPU PEs).
    pub gpu: bool,
    /// libibverbs.so.1 loaded.
    pub rdma_core: bool,
    /// libmlx5.so.1 loaded (mlx5dv).
    pub libmlx5: bool,
    /// At least one device with `mlx5dv_is_supported` and an active port.
    pub mlx5_device: bool,
    /// GPU memory can be registered through dma-buf: `ibv_reg_dmabuf_mr` exists and the
    /// kernel has dma-buf (the GPU driver's export is checked only when registering).
    pub dmabuf: bool,
    /// The nvidia-peermem kernel module is loaded (GPU memory through `ibv_reg_mr`).
    pub peermem: bool,
    /// `cuMemHostRegister(IOMEMORY)` of the UAR page: Some(true) mapped, Some(false)
    /// refused, None not tried (needs a GPU and an mlx5 device).
    pub doorbell_mapping: Option<bool>,
}

/// A GPU PE's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    Ibgda,
    IbgdaCpuDoorbell,
    Proxy,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Ibgda => "ibgda",
            Path::IbgdaCpuDoorbell => "ibgda-cpu-doorbell",
            Path::Proxy => "proxy",
        }
    }
}

/// How the symmetric heap (GPU memory) is registered on the ibgda paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeapRegistration {
    /// `ibv_reg_dmabuf_mr` on a dma-buf of the heap (preferred).
    DmaBuf,
    /// `ibv_reg_mr` on the GPU address (nvidia-peermem).
    PeerMem,
}

/// The decision and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PathPlan {
    pub path: Path,
    pub heap: Option<HeapRegistration>,
    /// One line per fact that decided it, in the order checked.
    pub reasons: Vec<String>,
}

impl PathPlan {
    /// `proxy over libfabric: no mlx5 device` — the one-line summary.
    pub fn summary(&self) -> String {
        let what = match self.path {
            Path::Proxy => "proxy over libfabric",
            Path::Ibgda => "ibgda",
            Path::IbgdaCpuDoorbell => "ibgda with a CPU doorbell thread",
        };
        match self.reasons.last() {
            Some(r) => format!("{what}: {r}"),
            None => what.to_string(),
        }
    }
}

/// Decides the path of GPU PEs from `c`.
pub fn plan_path(c: &PathCaps) -> PathPlan {
    let proxy = |reasons: Vec<&str>| PathPlan {
        path: Path::Proxy,
        heap: None,
        reasons: reasons.into_iter().map(String::from).collect(),
    };
    if !c.rdma_core {
        return proxy(vec![
            "rdma-core missing (install libibverbs1 and ibverbs-providers)",
        ]);
    }
    if !c.mlx5_device {
        return proxy(vec!["no mlx5 device"]);
    }
    if !c.libmlx5 {
        return proxy(vec![
            "mlx5 device but libmlx5.so.1 missing (install ibverbs-providers)",
        ]);
    }
    if !c.gpu {
        return proxy(vec![
            "mlx5 device present",
            "no CUDA GPU (ibgda is for GPU PEs)",
        ]);
    }
    let mut reasons = vec!["mlx5 device present".to_string()];
    let heap = if c.dmabuf {
        reasons.push("heap registered with ibv_reg_dmabuf_mr (dma-buf)".into());
        HeapRegistration::DmaBuf
    } else if c.peermem {
        reasons.push("heap registered with ibv_reg_mr (nvidia-peermem)".into());
        HeapRegistration::PeerMem
    } else {
        reasons.push("GPU memory cannot be registered: no dma-buf and no nvidia-peermem".into());
        return PathPlan {
            path: Path::Proxy,
            heap: None,
            reasons,
        };
    };
    let path = match c.doorbell_mapping {
        Some(true) => {
            reasons.push("UAR mapped into the GPU (cuMemHostRegister IOMEMORY)".into());
            Path::Ibgda
        }
        Some(false) => {
            reasons.push(
                "cuMemHostRegister(IOMEMORY) of the UAR refused (PeerMappingOverride=1 not set?): a CPU thread rings the doorbell"
                    .into(),
            );
            Path::IbgdaCpuDoorbell
        }
        None => {
            reasons.push(
                "doorbell mapping not tried yet: ibgda if cuMemHostRegister(IOMEMORY) maps the UAR, else a CPU thread rings the doorbell"
                    .into(),
            );
            Path::Ibgda
        }
    };
    PathPlan {
        path,
        heap: Some(heap),
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> PathCaps {
        PathCaps {
            gpu: true,
            rdma_core: true,
            libmlx5: true,
            mlx5_device: true,
            dmabuf: true,
            peermem: true,
            doorbell_mapping: Some(true),
        }
    }

    #[test]
    fn full_ibgda() {
        let p = plan_path(&all());
        assert_eq!(p.path, Path::Ibgda);
        assert_eq!(p.heap, Some(HeapRegistration::DmaBuf));
        assert_eq!(
            p.reasons,
            [
                "mlx5 device present",
                "heap registered with ibv_reg_dmabuf_mr (dma-buf)",
                "UAR mapped into the GPU (cuMemHostRegister IOMEMORY)"
            ]
        );
    }

    #[test]
    fn fallbacks() {
        let with = |f: &dyn Fn(&mut PathCaps)| {
            let mut c = all();
            f(&mut c);
            plan_path(&c)
        };
        let p = with(&|c| c.doorbell_mapping = Some(false));
        assert_eq!(
            (p.path, p.heap),
            (Path::IbgdaCpuDoorbell, Some(HeapRegistration::DmaBuf))
        );
        let p = with(&|c| c.dmabuf = false);
        assert_eq!(
            (p.path, p.heap),
            (Path::Ibgda, Some(HeapRegistration::PeerMem))
        );
        let p = with(&|c| {
            c.dmabuf = false;
            c.peermem = false
        });
        assert_eq!((p.path, p.heap), (Path::Proxy, None));
        assert_eq!(
            p.summary(),
            "proxy over libfabric: GPU memory cannot be registered: no dma-buf and no nvidia-peermem"
        );
        let p = with(&|c| c.doorbell_mapping = None);
        assert_eq!(p.path, Path::Ibgda);
        assert!(p.reasons[2].starts_with("doorbell mapping not tried yet"));
        assert_eq!(
            with(&|c| c.gpu = false).summary(),
            "proxy over libfabric: no CUDA GPU (ibgda is for GPU PEs)"
        );
        assert_eq!(with(&|c| c.libmlx5 = false).path, Path::Proxy);
    }

    #[test]
    fn this_machine_shape() {
        // libibverbs loads, no devices, no GPU: what the doctor prints here.
        let c = PathCaps {
            rdma_core: true,
            libmlx5: true,
            ..PathCaps::default()
        };
        assert_eq!(
            plan_path(&c).summary(),
            "proxy over libfabric: no mlx5 device"
        );
        assert_eq!(
            plan_path(&PathCaps::default()).summary(),
            "proxy over libfabric: rdma-core missing (install libibverbs1 and ibverbs-providers)"
        );
    }
}
