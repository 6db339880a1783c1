//! Doorbell records and the doorbell word.
//!
//! Ringing a send queue: WQE stores → fence → doorbell-record store (Release) → fence →
//! 8-byte doorbell store at [`BF_OFFSET`] of the UAR page. This module only encodes the
//! words; the send-queue code owns the stores and their ordering.

use super::wire::{wire_struct, Be32};

/// Offset of the doorbell (BlueFlame) register in a UAR page.
pub const BF_OFFSET: usize = 0x800;

/// QP doorbell record (two BE32 words in memory the NIC reads).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpDbRecord {
    /// [0] receive counter.
    pub recv: Be32,
    /// [1] send counter: next free WQEBB index & 0xffff.
    pub send: Be32,
}
wire_struct!(QpDbRecord, 8);

/// The send-counter word of the QP doorbell record: `BE32(pi & 0xffff)`.
pub const fn send_counter(pi: u32) -> Be32 {
    Be32::new(pi & 0xffff)
}

/// CQ doorbell record (two BE32 words).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CqDbRecord {
    /// [0] consumer index & 0xffffff.
    pub ci: Be32,
    /// [1] arm word.
    pub arm: Be32,
}
wire_struct!(CqDbRecord, 8);

/// The consumer-index word of the CQ doorbell record: `BE32(ci & 0xffffff)`.
pub const fn cq_consumer_index(ci: u32) -> Be32 {
    Be32::new(ci & 0xff_ffff)
}

/// The 8 bytes written to the doorbell register: `{BE32(pi << 8), BE32(qpn << 8)}` — the
/// synthetic control word the GPU implementations write (the NIC inspects only the WQE
/// index and the QP number). `pi` is the producer index (next free WQEBB, 16 bits).
pub const fn doorbell_bytes(pi: u16, qpn: u32) -> [u8; 8] {
    let a = ((pi as u32) << 8).to_be_bytes();
    let b = ((qpn & 0xff_ffff) << 8).to_be_bytes();
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// [`doorbell_bytes`] as the `u64` whose native-endian store writes those bytes.
pub const fn doorbell_word(pi: u16, qpn: u32) -> u64 {
    u64::from_ne_bytes(doorbell_bytes(pi, qpn))
}

/// Decodes a doorbell's 8 bytes into (producer index, QP number).
pub const fn parse_doorbell(b: [u8; 8]) -> (u16, u32) {
    let a = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let q = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
    ((a >> 8) as u16, q >> 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx5::wire::WireStruct;

    #[test]
    fn words() {
        assert_eq!(send_counter(0x1_2345).to_bytes(), [0, 0, 0x23, 0x45]);
        assert_eq!(
            cq_consumer_index(0x1234_5678).to_bytes(),
            [0, 0x34, 0x56, 0x78]
        );
        assert_eq!(
            doorbell_bytes(0x1234, 0xabcdef),
            [0x00, 0x12, 0x34, 0x00, 0xab, 0xcd, 0xef, 0x00]
        );
        assert_eq!(parse_doorbell(doorbell_bytes(0xffff, 0x77)), (0xffff, 0x77));
        let r = QpDbRecord {
            recv: Be32::new(0),
            send: send_counter(3),
        };
        assert_eq!(r.as_bytes(), [0, 0, 0, 0, 0, 0, 0, 3]);
        assert_eq!(doorbell_word(1, 1).to_ne_bytes(), doorbell_bytes(1, 1));
    }
}
