//! The address record each PE allgathers over the bootstrap to connect its RC queue pairs:
//! its port's LID, GID (and GID index), MTU and link layer, its symmetric heap's base,
//! length and rkey, and for every peer the QP number and first PSN of the QP it created
//! for that peer.
//!
//! Wire format (little-endian, fixed, versioned):
//!
//! | off | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `b"RSQA"` |
//! | 4 | 2 | version (3) |
//! | 6 | 2 | number of QP entries `n` |
//! | 8 | 2 | LID |
//! | 10 | 1 | port number |
//! | 11 | 1 | active MTU (`ibv_mtu`: 1 = 256 B … 5 = 4096 B) |
//! | 12 | 1 | link layer (1 InfiniBand, 2 Ethernet) |
//! | 13 | 1 | GID present (0/1) |
//! | 14 | 2 | GID index |
//! | 16 | 16 | GID |
//! | 32 | 8 | heap base (virtual address or iova) |
//! | 40 | 8 | heap length |
//! | 48 | 4 | heap rkey |
//! | 52 | 1 | responder resources: outstanding READs/atomics this PE accepts per QP (≥ 1) |
//! | 53 | 1 | GID type: 0 none or InfiniBand, 1 RoCE v1, 2 RoCE v2 |
//! | 54 | 2 | reserved (0) |
//! | 56 | 8·n | per peer: QP number (u32, 24 bits), PSN (u32, 24 bits) |

/// `b"RSQA"`.
pub const MAGIC: [u8; 4] = *b"RSQA";
/// The version this build writes and reads (2: responder resources at byte 52; 3: the GID
/// type at byte 53).
pub const VERSION: u16 = 3;
/// Bytes before the per-peer entries.
pub const HEADER_LEN: usize = 56;

/// One PE's connection data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressRecord {
    pub lid: u16,
    pub port: u8,
    /// `ibv_mtu` value of the port's active MTU.
    pub mtu: u8,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// `(index, gid)` when the peer must be addressed with a GRH (RoCE; IB across subnets).
    pub gid: Option<(u16, [u8; 16])>,
    pub heap_base: u64,
    pub heap_len: u64,
    pub heap_rkey: u32,
    /// RDMA READs/atomics this PE accepts outstanding as target on each QP
    /// (`max_dest_rd_atomic`): peers' initiator depth toward it stays within.
    pub responder_resources: u8,
    /// The GID's type: [`GID_KIND_NONE`] (no GID, or an InfiniBand one),
    /// [`GID_KIND_ROCE_V1`] or [`GID_KIND_ROCE_V2`]. Peers whose RoCE versions differ
    /// cannot talk (v1 is an Ethernet frame, v2 a UDP/IP packet).
    pub gid_kind: u8,
    /// `qps[j]` = (QP number, first PSN) of this PE's QP connected to PE `j`.
    pub qps: Vec<(u32, u32)>,
}

/// [`AddressRecord::gid_kind`]: no GID, or an InfiniBand one.
pub const GID_KIND_NONE: u8 = 0;
/// [`AddressRecord::gid_kind`]: RoCE v1.
pub const GID_KIND_ROCE_V1: u8 = 1;
/// [`AddressRecord::gid_kind`]: RoCE v2.
pub const GID_KIND_ROCE_V2: u8 = 2;

/// A record that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddrError {
    #[error("address record of {len} bytes is shorter than its {need}-byte header/entries")]
    Short { len: usize, need: usize },
    #[error("address record of {len} bytes: {n} QP entries need exactly {need}")]
    Length { len: usize, n: usize, need: usize },
    #[error("address record has magic {found:02x?}, not \"RSQA\"")]
    Magic { found: [u8; 4] },
    #[error("address record version {found}; this build reads version {VERSION}")]
    Version { found: u16 },
    #[error("address record field {field} = {value:#x} is out of range")]
    Field { field: &'static str, value: u64 },
    #[error("address record holds {n} QP entries but the job has {n_pes} PEs")]
    Count { n: usize, n_pes: usize },
}

impl AddressRecord {
    /// The wire bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN + 8 * self.qps.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.qps.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.push(self.port);
        b.push(self.mtu);
        b.push(self.link_layer);
        let (has, idx, gid) = match self.gid {
            Some((i, g)) => (1u8, i, g),
            None => (0, 0, [0; 16]),
        };
        b.push(has);
        b.extend_from_slice(&idx.to_le_bytes());
        b.extend_from_slice(&gid);
        b.extend_from_slice(&self.heap_base.to_le_bytes());
        b.extend_from_slice(&self.heap_len.to_le_bytes());
        b.extend_from_slice(&self.heap_rkey.to_le_bytes());
        b.push(self.responder_resources);
        b.push(self.gid_kind);
        b.extend_from_slice(&[0; 2]);
        for &(qpn, psn) in &self.qps {
            b.extend_from_slice(&qpn.to_le_bytes());
            b.extend_from_slice(&psn.to_le_bytes());
        }
        b
    }

    /// Parses wire bytes; every field is range-checked (QPN and PSN are 24-bit, MTU
    /// 1..=5, link layer 1..=2, GID flag 0/1).
    pub fn decode(b: &[u8]) -> Result<AddressRecord, AddrError> {
        if b.len() < HEADER_LEN {
            return Err(AddrError::Short {
                len: b.len(),
                need: HEADER_LEN,
            });
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(AddrError::Magic { found: magic });
        }
        let version = u16_at(4);
        if version != VERSION {
            return Err(AddrError::Version { found: version });
        }
        let n = u16_at(6) as usize;
        let need = HEADER_LEN + 8 * n;
        if b.len() != need {
            return Err(AddrError::Length {
                len: b.len(),
                n,
                need,
            });
        }
        let field = |field, value: u64| AddrError::Field { field, value };
        let (port, mtu, link_layer, has_gid) = (b[10], b[11], b[12], b[13]);
        if !(1..=5).contains(&mtu) {
            return Err(field("mtu", mtu as u64));
        }
        if !(1..=2).contains(&link_layer) {
            return Err(field("link_layer", link_layer as u64));
        }
        if port == 0 {
            return Err(field("port", 0));
        }
        if b[52] == 0 {
            return Err(field("responder_resources", 0));
        }
        if b[53] > GID_KIND_ROCE_V2 {
            return Err(field("gid_kind", b[53] as u64));
        }
        let gid = match has_gid {
            0 => None,
            1 => Some((u16_at(14), b[16..32].try_into().expect("16 bytes"))),
            v => return Err(field("gid_present", v as u64)),
        };
        let mut qps = Vec::with_capacity(n);
        for i in 0..n {
            let (qpn, psn) = (u32_at(HEADER_LEN + 8 * i), u32_at(HEADER_LEN + 8 * i + 4));
            if qpn > 0xff_ffff {
                return Err(field("qpn", qpn as u64));
            }
            if psn > 0xff_ffff {
                return Err(field("psn", psn as u64));
            }
            qps.push((qpn, psn));
        }
        Ok(AddressRecord {
            lid: u16_at(8),
            port,
            mtu,
            link_layer,
            gid,
            heap_base: u64_at(32),
            heap_len: u64_at(40),
            heap_rkey: u32_at(48),
            responder_resources: b[52],
            gid_kind: b[53],
            qps,
        })
    }
}

/// Decodes every PE's record of an allgather and checks each holds one entry per PE.
pub fn decode_all(all: &[Vec<u8>]) -> Result<Vec<AddressRecord>, AddrError> {
    all.iter()
        .map(|b| {
            let r = AddressRecord::decode(b)?;
            if r.qps.len() != all.len() {
                return Err(AddrError::Count {
                    n: r.qps.len(),
                    n_pes: all.len(),
                });
            }
            Ok(r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AddressRecord {
        AddressRecord {
            lid: 0x1234,
            port: 1,
            mtu: 5,
            link_layer: 2,
            gid: Some((3, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7])),
            heap_base: 0x7f00_1122_3344_5566,
            heap_len: 1 << 30,
            heap_rkey: 0xdead_beef,
            responder_resources: 16,
            gid_kind: GID_KIND_ROCE_V2,
            qps: vec![(0x00_0101, 0x00_abcd), (0xff_ffff, 0x12_3456)],
        }
    }

    #[test]
    fn exact_bytes() {
        let b = sample().encode();
        assert_eq!(b.len(), HEADER_LEN + 16);
        assert_eq!(
            &b[0..16],
            b"RSQA\x03\x00\x02\x00\x34\x12\x01\x05\x02\x01\x03\x00"
        );
        assert_eq!(
            &b[16..32],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7]
        );
        assert_eq!(&b[32..40], &0x7f00_1122_3344_5566u64.to_le_bytes());
        assert_eq!(&b[40..48], &[0, 0, 0, 0x40, 0, 0, 0, 0]);
        assert_eq!(&b[48..56], &[0xef, 0xbe, 0xad, 0xde, 16, 2, 0, 0]);
        assert_eq!(&b[56..64], &[1, 1, 0, 0, 0xcd, 0xab, 0, 0]);
        assert_eq!(&b[64..72], &[0xff, 0xff, 0xff, 0, 0x56, 0x34, 0x12, 0]);
        assert_eq!(AddressRecord::decode(&b), Ok(sample()));
        let ib = AddressRecord {
            gid: None,
            link_layer: 1,
            gid_kind: GID_KIND_NONE,
            ..sample()
        };
        assert_eq!(AddressRecord::decode(&ib.encode()), Ok(ib));
    }

    #[test]
    fn bad_records() {
        let good = sample().encode();
        assert_eq!(
            AddressRecord::decode(&good[..10]),
            Err(AddrError::Short { len: 10, need: 56 })
        );
        assert_eq!(
            AddressRecord::decode(&good[..good.len() - 1]),
            Err(AddrError::Length {
                len: 71,
                n: 2,
                need: 72
            })
        );
        let with = |o: usize, v: u8| {
            let mut b = good.clone();
            b[o] = v;
            AddressRecord::decode(&b)
        };
        assert_eq!(with(0, b'X'), Err(AddrError::Magic { found: *b"XSQA" }));
        assert_eq!(with(4, 1), Err(AddrError::Version { found: 1 }));
        assert_eq!(
            with(52, 0),
            Err(AddrError::Field {
                field: "responder_resources",
                value: 0
            })
        );
        assert_eq!(
            with(53, 3),
            Err(AddrError::Field {
                field: "gid_kind",
                value: 3
            })
        );
        assert_eq!(
            with(11, 6),
            Err(AddrError::Field {
                field: "mtu",
                value: 6
            })
        );
        assert_eq!(
            with(12, 0),
            Err(AddrError::Field {
                field: "link_layer",
                value: 0
            })
        );
        assert_eq!(
            with(10, 0),
            Err(AddrError::Field {
                field: "port",
                value: 0
            })
        );
        assert_eq!(
            with(13, 2),
            Err(AddrError::Field {
                field: "gid_present",
                value: 2
            })
        );
        assert_eq!(
            with(59, 1),
            Err(AddrError::Field {
                field: "qpn",
                value: 0x0100_0101
            })
        );
        assert_eq!(
            with(63, 1),
            Err(AddrError::Field {
                field: "psn",
                value: 0x0100_abcd
            })
        );
        assert_eq!(
            decode_all(&[good.clone(), good.clone(), good.clone()]),
            Err(AddrError::Count { n: 2, n_pes: 3 })
        );
        assert_eq!(decode_all(&[good.clone(), good]).unwrap().len(), 2);
    }
}
