//! PCIe placement from sysfs: how near a NIC is to a GPU, so that a GPU PE over
//! `RSHMEM_TRANSPORT=ibgda` takes the NIC nearest its GPU when `RSHMEM_HCA` does not name
//! one — as NCCL and NVSHMEM pick by PCI distance. On a DGX-class node each GPU shares a
//! PCIe switch with its own ConnectX; taking the first NIC instead sends every GPU's
//! traffic through one NIC and across the CPU's root complex (or the socket link).
//!
//! A device's place is its canonical sysfs path below `devices/` (`pci0000:00`, then one
//! component per bridge down to the device itself); two places share the components of
//! their nearest common ancestor. Everything takes the sysfs root as an argument so that
//! tests build a tree of their own.

use serde::Serialize;
use std::path::{Path, PathBuf};

/// The real sysfs.
pub const SYSFS: &str = "/sys";

/// Where one PCI device sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPlace {
    /// `0000:1b:00.0`.
    pub bdf: String,
    /// Components of the canonical path from the PCI root (`pci0000:00`) through the
    /// bridges to the device (whatever sits above the root — a VMBus on Hyper-V, a
    /// platform device on ARM — is left out).
    pub path: Vec<String>,
    /// The device's NUMA node; None where sysfs says -1 or nothing.
    pub numa: Option<u32>,
    /// `local_cpulist` (`0-31,64-95`): the CPUs near the device, which tells sockets
    /// apart where NUMA is off (node -1).
    pub cpus: Option<String>,
}

/// How near two PCI devices are, nearest first (NCCL's PIX/PXB, PHB, then SYS split by
/// NUMA node). The derived order is the ranking: variants in declaration order, then
/// fields in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Link {
    /// Below one PCIe bridge or switch (not the root complex). `up`: links from the GPU
    /// (the first device) to the shared bridge, so a NIC below the GPU's own switch ranks
    /// before one a level up however deep its own side is; then `hops` in all.
    Switch { up: usize, hops: usize },
    /// Same root complex (host bridge), through the CPU's PCIe root.
    HostBridge,
    /// Different root complexes on the same NUMA node (or, NUMA off, the same CPUs).
    NumaNode,
    /// Different NUMA nodes (across the socket link), or a node sysfs does not give.
    System,
}

impl Link {
    /// `shares a PCIe switch (2 hops)`, ...
    pub fn describe(self) -> String {
        match self {
            Link::Switch { hops, .. } => format!("shares a PCIe switch ({hops} hops)"),
            Link::HostBridge => "shares a PCIe root complex".into(),
            Link::NumaNode => "same NUMA node, different PCIe root".into(),
            Link::System => "across NUMA nodes (or placement unknown)".into(),
        }
    }
}

/// `0000:1B:00.0`, `00000000:1b:00.0` (the forms CUDA and nvidia-smi print) or
/// `10000:e1:00.0` (a domain past 16 bits: devices behind Intel VMD) as sysfs names it:
/// `0000:1b:00.0`, `10000:e1:00.0`. None when it is not a PCI address.
pub fn normalize_bdf(s: &str) -> Option<String> {
    let mut parts = s.trim().split(':');
    let (dom, bus, devfn) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (dev, func) = devfn.split_once('.')?;
    let hex = |t: &str, max: usize| {
        (!t.is_empty() && t.len() <= max && t.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(t, 16).ok())
            .flatten()
    };
    let (dom, bus, dev, func) = (hex(dom, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
    (dev < 32 && func < 8).then(|| format!("{dom:04x}:{bus:02x}:{dev:02x}.{func}"))
}

/// The place of the PCI device at `link` (a sysfs symlink to it, or to a device below
/// it such as an mlx5 sub-function's auxiliary device), under `sysfs`.
fn place_at(sysfs: &Path, link: &Path) -> Option<PciPlace> {
    let real = std::fs::canonicalize(link).ok()?;
    let root = std::fs::canonicalize(sysfs).ok()?;
    let rel = real.strip_prefix(root.join("devices")).ok()?;
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    // The device itself: the deepest component that is a PCI address (an SF's link ends
    // in `mlx5_core.sf.N` below its PCI function).
    let last = path.iter().rposition(|c| normalize_bdf(c).is_some())?;
    let dropped = path.len() - 1 - last;
    path.truncate(last + 1);
    // From the PCI root down.
    let first = path.iter().position(|c| c.starts_with("pci"))?;
    path.drain(..first);
    if path.len() < 2 {
        return None;
    }
    let bdf = normalize_bdf(path.last()?)?;
    let mut dir = real;
    for _ in 0..dropped {
        dir.pop();
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let numa = read("numa_node")
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let cpus = read("local_cpulist")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    Some(PciPlace {
        bdf,
        path,
        numa,
        cpus,
    })
}

/// The PCI device with address `bdf` (any form [`normalize_bdf`] takes).
pub fn pci_place(sysfs: &Path, bdf: &str) -> Option<PciPlace> {
    let bdf = normalize_bdf(bdf)?;
    place_at(sysfs, &sysfs.join("bus/pci/devices").join(bdf))
}

/// The PCI device behind RDMA device `name` (`class/infiniband/<name>/device`); None for
/// a device with no PCI function (rxe, siw) or where sysfs has no entry.
pub fn rdma_place(sysfs: &Path, name: &str) -> Option<PciPlace> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    place_at(
        sysfs,
        &sysfs.join("class/infiniband").join(name).join("device"),
    )
}

/// Every NVIDIA GPU sysfs lists (vendor 0x10de, display class 0x03xxxx: not NVSwitches
/// or other NVIDIA bridges), in PCI address order — independent of
/// `CUDA_VISIBLE_DEVICES`, so every process of a node sees the same list.
pub fn nvidia_gpus(sysfs: &Path) -> Vec<PciPlace> {
    let dir = sysfs.join("bus/pci/devices");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<PciPlace> = entries
        .filter_map(|e| {
            let p = e.ok()?.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
            let vendor = read("vendor")?;
            let class = read("class")?;
            let class = u32::from_str_radix(class.trim().trim_start_matches("0x"), 16).ok()?;
            (vendor.trim() == "0x10de" && class >> 16 == 0x03).then_some(())?;
            place_at(sysfs, &p)
        })
        .collect();
    out.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    out
}

/// How near `a` (the GPU) and `b` are.
pub fn link(a: &PciPlace, b: &PciPlace) -> Link {
    let common = a
        .path
        .iter()
        .zip(&b.path)
        .take_while(|(x, y)| x == y)
        .count();
    match common {
        0 => match (a.numa, b.numa, &a.cpus, &b.cpus) {
            (Some(x), Some(y), _, _) if x == y => Link::NumaNode,
            (None, None, Some(x), Some(y)) if x == y => Link::NumaNode,
            _ => Link::System,
        },
        1 => Link::HostBridge,
        _ => Link::Switch {
            up: a.path.len() - common,
            hops: (a.path.len() - common) + (b.path.len() - common),
        },
    }
}

/// Candidates ranked for a GPU: the indices of `places` nearest to `gpu` (ties keep
/// their order), and their link. A candidate whose place is unknown ranks as
/// [`Link::System`]. None when `places` is empty.
pub fn nearest(gpu: &PciPlace, places: &[Option<PciPlace>]) -> Option<(Vec<usize>, Link)> {
    let links: Vec<Link> = places
        .iter()
        .map(|p| p.as_ref().map_or(Link::System, |p| link(gpu, p)))
        .collect();
    let best = *links.iter().min()?;
    Some((
        (0..links.len()).filter(|&i| links[i] == best).collect(),
        best,
    ))
}

/// Which of several equally near NICs `gpu` takes: its position among the node's GPUs
/// (`gpus`, in PCI address order) whose nearest NICs are the same set, modulo the set's
/// size — so GPUs sharing NICs spread over them the same way in every process. None
/// when `gpu` is not among `gpus` (sysfs lists no NVIDIA GPU there).
pub fn spread_index(
    gpu: &PciPlace,
    gpus: &[PciPlace],
    places: &[Option<PciPlace>],
    ties: &[usize],
) -> Option<usize> {
    let same: Vec<&PciPlace> = gpus
        .iter()
        .filter(|g| nearest(g, places).is_some_and(|(t, _)| t == ties))
        .collect();
    let k = same.iter().position(|g| g.bdf == gpu.bdf)?;
    Some(k % ties.len())
}

/// The real sysfs root.
pub fn sysfs_root() -> PathBuf {
    PathBuf::from(SYSFS)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fresh directory, removed on drop.
    pub(crate) struct Scratch(pub PathBuf);
    impl Scratch {
        pub(crate) fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("rshmem-topo-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// One PCI function of a test tree: its path below `devices/`, NUMA node, and
    /// `Some(class)` for an NVIDIA device (vendor 0x10de), else a Mellanox one.
    pub(crate) struct Dev<'a> {
        pub path: &'a str,
        pub numa: i32,
        pub nvidia_class: Option<u32>,
    }

    /// A sysfs tree laid out as Linux lays it out: `devices/<path>` directories with
    /// `numa_node`, `local_cpulist`, `vendor` and `class`; `bus/pci/devices/<bdf>` relative
    /// links to them; and per NIC `(name, path)` the device's `infiniband/<name>` directory
    /// with its relative `device` link, linked from `class/infiniband/<name>`.
    pub(crate) fn tree(root: &Path, devices: &[Dev], nics: &[(&str, &str)]) -> std::io::Result<()> {
        std::fs::create_dir_all(root.join("bus/pci/devices"))?;
        std::fs::create_dir_all(root.join("class/infiniband"))?;
        for d in devices {
            let dir = root.join("devices").join(d.path);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("numa_node"), format!("{}\n", d.numa))?;
            let cpus = if d.numa < 1 { "0-15" } else { "16-31" };
            std::fs::write(dir.join("local_cpulist"), format!("{cpus}\n"))?;
            let (vendor, class) = match d.nvidia_class {
                Some(c) => ("0x10de", c),
                None => ("0x15b3", 0x020700),
            };
            std::fs::write(dir.join("vendor"), format!("{vendor}\n"))?;
            std::fs::write(dir.join("class"), format!("0x{class:06x}\n"))?;
            let bdf = d.path.rsplit('/').next().unwrap();
            let at = root.join("bus/pci/devices").join(bdf);
            if !at.exists() {
                symlink(format!("../../../devices/{}", d.path), at)?;
            }
        }
        for &(name, path) in nics {
            let bdf = path.rsplit('/').next().unwrap();
            let dir = root
                .join("devices")
                .join(path)
                .join("infiniband")
                .join(name);
            std::fs::create_dir_all(&dir)?;
            symlink(format!("../../../{bdf}"), dir.join("device"))?;
            symlink(
                format!("../../devices/{path}/infiniband/{name}"),
                root.join("class/infiniband").join(name),
            )?;
        }
        Ok(())
    }

    /// An NVIDIA GPU (3D controller) or a NIC at `path`.
    pub(crate) fn gpu(path: &str, numa: i32) -> Dev<'_> {
        Dev {
            path,
            numa,
            nvidia_class: Some(0x030200),
        }
    }
    pub(crate) fn nic(path: &str, numa: i32) -> Dev<'_> {
        Dev {
            path,
            numa,
            nvidia_class: None,
        }
    }

    fn place(path: &str, numa: Option<u32>) -> PciPlace {
        PciPlace {
            bdf: normalize_bdf(path.rsplit('/').next().unwrap()).unwrap(),
            path: path.split('/').map(String::from).collect(),
            numa,
            cpus: None,
        }
    }

    #[test]
    fn pci_addresses_normalize_to_sysfs_names() {
        for (given, name) in [
            ("0000:1B:00.0", "0000:1b:00.0"),
            ("00000000:9a:1f.7", "0000:9a:1f.7"),
            (" 0001:02:03.4\n", "0001:02:03.4"),
            // Intel VMD puts its children in domains past 16 bits.
            ("10000:e1:00.0", "10000:e1:00.0"),
            ("0001ffff:00:00.0", "1ffff:00:00.0"),
        ] {
            assert_eq!(normalize_bdf(given).as_deref(), Some(name), "{given:?}");
        }
        for bad in [
            "",
            "1b:00.0",
            "0000:1b:00",
            "0000:1b:20.0",
            "0000:1b:00.8",
            "0000:xx:00.0",
            "0000:1b:00.0:1",
            "100000000:00:00.0",
            "pci0000:00",
            "mlx5_core.sf.2",
        ] {
            assert_eq!(normalize_bdf(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn links_rank_switch_then_root_then_node_then_system() {
        let gpu = place(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
            Some(0),
        );
        let same_switch = place(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
            Some(0),
        );
        let upper_switch = place("pci0000:00/0000:00:01.0/0000:05:00.0", Some(0));
        let same_root = place("pci0000:00/0000:00:02.0/0000:06:00.0", Some(0));
        let same_node = place("pci0000:40/0000:40:01.0/0000:41:00.0", Some(0));
        let other_node = place("pci0000:80/0000:80:01.0/0000:81:00.0", Some(1));
        let unknown_node = place("pci0000:80/0000:80:01.0/0000:82:00.0", None);
        assert_eq!(link(&gpu, &same_switch), Link::Switch { up: 2, hops: 4 });
        assert_eq!(link(&gpu, &upper_switch), Link::Switch { up: 3, hops: 4 });
        assert!(link(&gpu, &same_switch) < link(&gpu, &upper_switch));
        // A NIC deep below the GPU's own switch (its own switch inside) still ranks
        // before a plain one a level up: the shared bridge decides first.
        let deep_below = place(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/0000:05:00.0/0000:06:00.0",
            Some(0),
        );
        let one_up = place("pci0000:00/0000:00:01.0/0000:08:00.0/0000:09:00.0", Some(0));
        assert_eq!(link(&gpu, &deep_below), Link::Switch { up: 2, hops: 6 });
        assert_eq!(link(&gpu, &one_up), Link::Switch { up: 3, hops: 5 });
        assert!(link(&gpu, &deep_below) < link(&gpu, &one_up));
        assert_eq!(link(&gpu, &same_root), Link::HostBridge);
        assert_eq!(link(&gpu, &same_node), Link::NumaNode);
        assert_eq!(link(&gpu, &other_node), Link::System);
        assert_eq!(link(&gpu, &unknown_node), Link::System);
        assert_eq!(link(&gpu, &gpu), Link::Switch { up: 0, hops: 0 });
        let below = place(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:07:00.0",
            Some(0),
        );
        assert_eq!(link(&gpu, &below), Link::Switch { up: 0, hops: 1 });
        assert!(Link::Switch { up: 9, hops: 99 } < Link::HostBridge);
        assert!(Link::HostBridge < Link::NumaNode && Link::NumaNode < Link::System);
        // NUMA off (-1 everywhere): the CPUs near each device tell sockets apart.
        let with_cpus = |p: &PciPlace, c: &str| PciPlace {
            numa: None,
            cpus: Some(c.into()),
            ..p.clone()
        };
        assert_eq!(
            link(&with_cpus(&gpu, "0-15"), &with_cpus(&same_node, "0-15")),
            Link::NumaNode
        );
        assert_eq!(
            link(&with_cpus(&gpu, "0-15"), &with_cpus(&same_node, "16-31")),
            Link::System
        );

        let cands = [
            Some(same_root.clone()),
            None,
            Some(same_switch.clone()),
            Some(other_node),
            Some(same_switch),
        ];
        assert_eq!(
            nearest(&gpu, &cands),
            Some((vec![2, 4], Link::Switch { up: 2, hops: 4 }))
        );
        assert_eq!(
            nearest(&gpu, &[None, None]),
            Some((vec![0, 1], Link::System))
        );
        assert_eq!(nearest(&gpu, &[]), None);
    }

    #[test]
    fn places_come_from_sysfs_links() {
        let dir = Scratch::new("places");
        let root = dir.0.as_path();
        tree(
            root,
            &[
                gpu("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", 0),
                nic("pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0", 0),
                nic("pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.1", 0),
                nic("pci0000:80/0000:80:01.0/0000:81:00.0", -1),
                // Hyper-V: the PCI root sits below the VMBus.
                gpu(
                    "LNXSYSTM:00/VMBUS:00/47505500-0001/pci0001:00/0001:00:00.0",
                    0,
                ),
                // Intel VMD: a 32-bit domain below the VMD controller's function.
                nic(
                    "pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0",
                    0,
                ),
            ],
            &[
                (
                    "mlx5_0",
                    "pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0",
                ),
                ("mlx5_1", "pci0000:80/0000:80:01.0/0000:81:00.0"),
                (
                    "mlx5_vmd",
                    "pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0",
                ),
            ],
        )
        .unwrap();
        // A sub-function: its infiniband device hangs off an auxiliary device.
        let sf = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.1/mlx5_core.sf.2";
        let sf_dir = root.join("devices").join(sf).join("infiniband/mlx5_sf");
        std::fs::create_dir_all(&sf_dir).unwrap();
        symlink("../../../mlx5_core.sf.2", sf_dir.join("device")).unwrap();
        symlink(
            format!("../../devices/{sf}/infiniband/mlx5_sf"),
            root.join("class/infiniband/mlx5_sf"),
        )
        .unwrap();

        let g = pci_place(root, "0000:02:00.0").unwrap();
        assert_eq!(g.bdf, "0000:02:00.0");
        assert_eq!((g.numa, g.cpus.as_deref()), (Some(0), Some("0-15")));
        assert_eq!(g.path.len(), 4);
        assert_eq!(pci_place(root, "00000000:02:00.0"), Some(g.clone()));
        let nic0 = rdma_place(root, "mlx5_0").unwrap();
        let nic1 = rdma_place(root, "mlx5_1").unwrap();
        assert_eq!(nic0.bdf, "0000:03:00.0");
        assert_eq!(nic1.numa, None, "numa_node -1 is unknown");
        assert_eq!(link(&g, &nic0), Link::Switch { up: 1, hops: 2 });
        assert_eq!(link(&g, &nic1), Link::System);
        let sf = rdma_place(root, "mlx5_sf").unwrap();
        assert_eq!((sf.bdf.as_str(), sf.numa), ("0000:03:00.1", Some(0)));
        assert_eq!(link(&g, &sf), Link::Switch { up: 1, hops: 2 });
        let vmd = rdma_place(root, "mlx5_vmd").unwrap();
        assert_eq!(vmd.bdf, "10000:e1:00.0");
        assert_eq!(pci_place(root, "10000:E1:00.0"), Some(vmd.clone()));
        assert_eq!(link(&g, &vmd), Link::HostBridge);
        let hv = pci_place(root, "0001:00:00.0").unwrap();
        assert_eq!(hv.path, ["pci0001:00", "0001:00:00.0"]);
        assert_eq!(link(&hv, &nic0), Link::NumaNode);
        assert_eq!(rdma_place(root, "rxe0"), None);
        assert_eq!(rdma_place(root, "../mlx5_0"), None);
        assert_eq!(pci_place(root, "0000:99:00.0"), None);
        assert_eq!(pci_place(root, "garbage"), None);
        // The NVIDIA GPUs, in address order; NICs are not among them.
        let gpus: Vec<String> = nvidia_gpus(root).into_iter().map(|p| p.bdf).collect();
        assert_eq!(gpus, ["0000:02:00.0", "0001:00:00.0"]);
    }
}
