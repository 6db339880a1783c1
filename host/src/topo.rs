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
    /// Components of the canonical path below `devices/`: the root (`pci0000:00`), the
    /// bridges, the device.
    pub path: Vec<String>,
    /// The device's NUMA node; None where sysfs says -1 or nothing.
    pub numa: Option<u32>,
}

/// How near two PCI devices are, nearest first (NCCL's PIX/PXB, PHB, then SYS split by
/// NUMA node). The derived order is the ranking: variants in declaration order, then
/// hops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Link {
    /// Below one PCIe bridge or switch (not the root complex): `hops` links between them.
    Switch { hops: usize },
    /// Same root complex (host bridge), through the CPU's PCIe root.
    HostBridge,
    /// Different root complexes on the same NUMA node.
    NumaNode,
    /// Different NUMA nodes (across the socket link), or a node sysfs does not give.
    System,
}

impl Link {
    /// `shares a PCIe switch (2 hops)`, ...
    pub fn describe(self) -> String {
        match self {
            Link::Switch { hops } => format!("shares a PCIe switch ({hops} hops)"),
            Link::HostBridge => "shares a PCIe root complex".into(),
            Link::NumaNode => "same NUMA node, different PCIe root".into(),
            Link::System => "across NUMA nodes (or placement unknown)".into(),
        }
    }
}

/// `0000:1B:00.0` or `00000000:1b:00.0` (the forms CUDA and nvidia-smi print) as sysfs
/// names it: `0000:1b:00.0`. None when it is not a PCI address.
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
    (dom <= 0xffff && dev < 32 && func < 8).then(|| format!("{dom:04x}:{bus:02x}:{dev:02x}.{func}"))
}

/// The place of the PCI device at `link` (a sysfs symlink to it), under `sysfs`.
fn place_at(sysfs: &Path, link: &Path) -> Option<PciPlace> {
    let real = std::fs::canonicalize(link).ok()?;
    let root = std::fs::canonicalize(sysfs).ok()?;
    let rel = real.strip_prefix(root.join("devices")).ok()?;
    let path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    // A PCI device's own directory is named by its address, below a `pciDDDD:BB` root.
    let bdf = normalize_bdf(path.last()?)?;
    if !path.first()?.starts_with("pci") {
        return None;
    }
    let numa = std::fs::read_to_string(real.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Some(PciPlace { bdf, path, numa })
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

/// How near `a` and `b` are.
pub fn link(a: &PciPlace, b: &PciPlace) -> Link {
    let common = a
        .path
        .iter()
        .zip(&b.path)
        .take_while(|(x, y)| x == y)
        .count();
    match common {
        0 => match (a.numa, b.numa) {
            (Some(x), Some(y)) if x == y => Link::NumaNode,
            _ => Link::System,
        },
        1 => Link::HostBridge,
        _ => Link::Switch {
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

    /// A sysfs tree: `devices/<path>` directories with `numa_node`, `bus/pci/devices/<bdf>`
    /// links to them, and `class/infiniband/<name>/device` links for the NICs given.
    pub(crate) fn tree(
        root: &Path,
        devices: &[(&str, i32)],
        nics: &[(&str, &str)],
    ) -> std::io::Result<()> {
        std::fs::create_dir_all(root.join("bus/pci/devices"))?;
        for &(path, numa) in devices {
            let dir = root.join("devices").join(path);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("numa_node"), format!("{numa}\n"))?;
            let bdf = path.rsplit('/').next().unwrap();
            // Relative links, as sysfs has them.
            let depth = 3;
            let target = format!("{}devices/{path}", "../".repeat(depth));
            let at = root.join("bus/pci/devices").join(bdf);
            if !at.exists() {
                symlink(target, at)?;
            }
        }
        for &(name, path) in nics {
            let dir = root.join("class/infiniband").join(name);
            std::fs::create_dir_all(&dir)?;
            symlink(root.join("devices").join(path), dir.join("device"))?;
        }
        Ok(())
    }

    #[test]
    fn pci_addresses_normalize_to_sysfs_names() {
        assert_eq!(
            normalize_bdf("0000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(
            normalize_bdf("00000000:9a:1f.7").as_deref(),
            Some("0000:9a:1f.7")
        );
        assert_eq!(
            normalize_bdf(" 0001:02:03.4\n").as_deref(),
            Some("0001:02:03.4")
        );
        for bad in [
            "",
            "1b:00.0",
            "0000:1b:00",
            "0000:1b:20.0",
            "0000:1b:00.8",
            "0000:xx:00.0",
            "0000:1b:00.0:1",
            "100000000:00:00.0",
            "0001ffff:00:00.0",
            "pci0000:00",
        ] {
            assert_eq!(normalize_bdf(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn links_rank_switch_then_root_then_node_then_system() {
        let place = |path: &str, numa: Option<u32>| PciPlace {
            bdf: normalize_bdf(path.rsplit('/').next().unwrap()).unwrap(),
            path: path.split('/').map(String::from).collect(),
            numa,
        };
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
        assert_eq!(link(&gpu, &same_switch), Link::Switch { hops: 4 });
        assert_eq!(link(&gpu, &upper_switch), Link::Switch { hops: 4 });
        assert_eq!(link(&gpu, &same_root), Link::HostBridge);
        assert_eq!(link(&gpu, &same_node), Link::NumaNode);
        assert_eq!(link(&gpu, &other_node), Link::System);
        assert_eq!(link(&gpu, &unknown_node), Link::System);
        assert_eq!(link(&gpu, &gpu), Link::Switch { hops: 0 });
        let below = place(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:07:00.0",
            Some(0),
        );
        assert_eq!(link(&gpu, &below), Link::Switch { hops: 1 });
        assert!(Link::Switch { hops: 9 } < Link::HostBridge);
        assert!(Link::HostBridge < Link::NumaNode && Link::NumaNode < Link::System);

        let cands = [
            Some(same_root.clone()),
            None,
            Some(same_switch.clone()),
            Some(other_node),
            Some(same_switch),
        ];
        assert_eq!(
            nearest(&gpu, &cands),
            Some((vec![2, 4], Link::Switch { hops: 4 }))
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
                ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", 0),
                ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0", 0),
                ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.1", 0),
                ("pci0000:80/0000:80:01.0/0000:81:00.0", -1),
            ],
            &[
                (
                    "mlx5_0",
                    "pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0",
                ),
                ("mlx5_1", "pci0000:80/0000:80:01.0/0000:81:00.0"),
            ],
        )
        .unwrap();
        let gpu = pci_place(root, "0000:02:00.0").unwrap();
        assert_eq!(gpu.bdf, "0000:02:00.0");
        assert_eq!(gpu.numa, Some(0));
        assert_eq!(gpu.path.len(), 4);
        assert_eq!(pci_place(root, "00000000:02:00.0"), Some(gpu.clone()));
        let nic0 = rdma_place(root, "mlx5_0").unwrap();
        let nic1 = rdma_place(root, "mlx5_1").unwrap();
        assert_eq!(nic1.numa, None, "numa_node -1 is unknown");
        assert_eq!(link(&gpu, &nic0), Link::Switch { hops: 2 });
        assert_eq!(link(&gpu, &nic1), Link::System);
        assert_eq!(rdma_place(root, "rxe0"), None);
        assert_eq!(rdma_place(root, "../mlx5_0"), None);
        assert_eq!(pci_place(root, "0000:99:00.0"), None);
        assert_eq!(pci_place(root, "garbage"), None);
    }
}
