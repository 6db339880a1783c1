//! The bootstrap wire format: length-prefixed frames between PEs and the root.
//!
//! This module owns the byte layout of every bootstrap message and nothing else: it does
//! no socket setup and keeps no state. A frame is
//!
//! ```text
//! u32 LE  length   (bytes that follow: 1 type byte + payload; 1..=max)
//! u8      type
//! ...     payload  (fields below, integers little-endian, byte strings as u32 LE length + bytes)
//! ```
//!
//! Decoding never trusts a length or a count: every read is bounds-checked, no buffer is
//! sized from a count before the bytes are there, and any malformed input is a
//! [`WireError`] (never a panic).
use std::io::{self, Read, Write};

/// First bytes of every hello: "RSHMEM", NUL, and the hello layout generation.
pub(crate) const MAGIC: [u8; 8] = *b"RSHMEM\0\x01";
/// Bumped on any incompatible change of the messages after the hello, the payloads PEs
/// allgather included (2: the fabric card names the provider; the verbs address record
/// is version 3), so PEs of different builds are refused when they join.
pub(crate) const PROTOCOL_VERSION: u32 = 2;
/// Largest frame accepted after the handshake (collective payloads).
pub(crate) const MAX_FRAME: usize = 64 << 20;
/// Largest frame accepted during the handshake (hello, refusal).
pub(crate) const MAX_HELLO_FRAME: usize = 64 << 10;

/// Frame type bytes.
mod ty {
    pub const HELLO: u8 = 1;
    pub const REFUSED: u8 = 2;
    pub const WELCOME: u8 = 3;
    pub const COLLECTIVE: u8 = 4;
    pub const COLLECTIVE_DONE: u8 = 5;
    pub const COLLECTIVE_FAILED: u8 = 6;
    pub const PEER_DIED: u8 = 7;
    pub const FINALIZE: u8 = 8;
    pub const FINALIZE_ACK: u8 = 9;
    pub const JOIN_STATUS_QUERY: u8 = 10;
    pub const JOIN_STATUS: u8 = 11;
}

/// What a collective computes; the root checks that all members agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CollectiveOp {
    Allgather = 1,
    Barrier = 2,
    /// `arg` is the root's index in the member list.
    Broadcast = 3,
}

impl CollectiveOp {
    fn from_u8(b: u8) -> Result<Self, WireError> {
        match b {
            1 => Ok(Self::Allgather),
            2 => Ok(Self::Barrier),
            3 => Ok(Self::Broadcast),
            other => Err(WireError::BadValue {
                field: "collective op",
                value: other as u64,
            }),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Allgather => "allgather",
            Self::Barrier => "barrier",
            Self::Broadcast => "broadcast",
        }
    }
}

/// Why the root refused or failed a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailKind {
    /// Members disagreed on op, argument or member list.
    Mismatch = 1,
    /// The call was malformed (member list invalid, result too large).
    Invalid = 2,
}

/// A PE's hello: who it is and what job it believes it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub magic: [u8; 8],
    pub version: u32,
    pub token: Vec<u8>,
    pub rank: u32,
    pub world_size: u32,
    pub node_id: String,
}

/// One PE's contribution to a collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contribution {
    pub op: CollectiveOp,
    pub uid: u64,
    pub seq: u64,
    pub arg: u64,
    pub members: Vec<u32>,
    pub payload: Vec<u8>,
}

/// Every bootstrap message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// PE → root, first frame.
    Hello(Hello),
    /// Root → PE: the hello was refused; the root closes the connection.
    Refused { reason: String },
    /// Root → every PE once all joined: the job id and every PE's node id (index = rank).
    Welcome {
        job_id: String,
        node_ids: Vec<String>,
    },
    /// PE → root.
    Collective(Contribution),
    /// Root → each member: all payloads of the collective (which ones depends on the op).
    CollectiveDone {
        uid: u64,
        seq: u64,
        payloads: Vec<Vec<u8>>,
    },
    /// Root → members: the collective cannot complete.
    CollectiveFailed {
        uid: u64,
        seq: u64,
        kind: FailKind,
        reason: String,
    },
    /// Root → PEs: a PE's connection closed without finalize.
    PeerDied { rank: u32, detail: String },
    /// PE → root: clean leave.
    Finalize,
    /// Root → PE: the clean leave is recorded.
    FinalizeAck,
    /// PE → root while waiting for the welcome: how many joined?
    JoinStatusQuery,
    /// Root → PE: the answer (at most a few missing ranks listed).
    JoinStatus {
        joined: u32,
        world_size: u32,
        missing: Vec<u32>,
    },
}

/// A malformed frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum WireError {
    #[error("frame length {len} exceeds the limit of {max} bytes")]
    Oversized { len: usize, max: usize },
    #[error("frame length 0 (no type byte)")]
    Empty,
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("truncated frame: {field} needs {need} more bytes, {have} left")]
    Truncated {
        field: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{0} trailing bytes after the frame's fields")]
    Trailing(usize),
    #[error("{field} is not valid UTF-8")]
    BadUtf8 { field: &'static str },
    #[error("invalid {field} value {value}")]
    BadValue { field: &'static str, value: u64 },
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// A socket error, a read timeout, or a close in the middle of a frame.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The bytes do not form a valid frame.
    #[error("malformed frame: {0}")]
    Malformed(#[from] WireError),
}

impl ReadError {
    /// The error as an `io::Error` (for [`crate::Error::Bootstrap`]).
    pub(crate) fn into_io(self) -> io::Error {
        match self {
            ReadError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"),
            ReadError::Io(e) => e,
            ReadError::Malformed(e) => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

// ---- encoding ----

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        // Frames are capped far below 4 GiB; a longer field cannot be sent anyway and the
        // receiver rejects the frame as oversized, so saturating here is harmless.
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        for &x in v {
            self.u32(x);
        }
    }
}

impl Frame {
    fn type_byte(&self) -> u8 {
        match self {
            Frame::Hello(_) => ty::HELLO,
            Frame::Refused { .. } => ty::REFUSED,
            Frame::Welcome { .. } => ty::WELCOME,
            Frame::Collective(_) => ty::COLLECTIVE,
            Frame::CollectiveDone { .. } => ty::COLLECTIVE_DONE,
            Frame::CollectiveFailed { .. } => ty::COLLECTIVE_FAILED,
            Frame::PeerDied { .. } => ty::PEER_DIED,
            Frame::Finalize => ty::FINALIZE,
            Frame::FinalizeAck => ty::FINALIZE_ACK,
            Frame::JoinStatusQuery => ty::JOIN_STATUS_QUERY,
            Frame::JoinStatus { .. } => ty::JOIN_STATUS,
        }
    }

    /// The whole frame, length prefix included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc(Vec::with_capacity(64));
        e.u32(0); // length, patched below
        e.u8(self.type_byte());
        match self {
            Frame::Hello(h) => {
                e.0.extend_from_slice(&h.magic);
                e.u32(h.version);
                e.bytes(&h.token);
                e.u32(h.rank);
                e.u32(h.world_size);
                e.bytes(h.node_id.as_bytes());
            }
            Frame::Refused { reason } => e.bytes(reason.as_bytes()),
            Frame::Welcome { job_id, node_ids } => {
                e.bytes(job_id.as_bytes());
                e.len(node_ids.len());
                for id in node_ids {
                    e.bytes(id.as_bytes());
                }
            }
            Frame::Collective(c) => {
                e.u8(c.op as u8);
                e.u64(c.uid);
                e.u64(c.seq);
                e.u64(c.arg);
                e.u32s(&c.members);
                e.bytes(&c.payload);
            }
            Frame::CollectiveDone { uid, seq, payloads } => {
                e.u64(*uid);
                e.u64(*seq);
                e.len(payloads.len());
                for p in payloads {
                    e.bytes(p);
                }
            }
            Frame::CollectiveFailed {
                uid,
                seq,
                kind,
                reason,
            } => {
                e.u64(*uid);
                e.u64(*seq);
                e.u8(*kind as u8);
                e.bytes(reason.as_bytes());
            }
            Frame::PeerDied { rank, detail } => {
                e.u32(*rank);
                e.bytes(detail.as_bytes());
            }
            Frame::Finalize | Frame::FinalizeAck | Frame::JoinStatusQuery => {}
            Frame::JoinStatus {
                joined,
                world_size,
                missing,
            } => {
                e.u32(*joined);
                e.u32(*world_size);
                e.u32s(missing);
            }
        }
        let len = u32::try_from(e.0.len() - 4).unwrap_or(u32::MAX);
        e.0[..4].copy_from_slice(&len.to_le_bytes());
        e.0
    }

    /// Decodes a frame's type byte and payload (the bytes after the length prefix).
    pub(crate) fn decode(body: &[u8]) -> Result<Frame, WireError> {
        let (&t, payload) = body.split_first().ok_or(WireError::Empty)?;
        let mut d = Dec(payload);
        let frame = match t {
            ty::HELLO => {
                let magic = d.array::<8>("magic")?;
                Frame::Hello(Hello {
                    magic,
                    version: d.u32("version")?,
                    token: d.bytes("token")?.to_vec(),
                    rank: d.u32("rank")?,
                    world_size: d.u32("world size")?,
                    node_id: d.string("node id")?,
                })
            }
            ty::REFUSED => Frame::Refused {
                reason: d.string("reason")?,
            },
            ty::WELCOME => {
                let job_id = d.string("job id")?;
                let n = d.count("node id count", 4)?;
                let mut node_ids = Vec::with_capacity(n);
                for _ in 0..n {
                    node_ids.push(d.string("node id")?);
                }
                Frame::Welcome { job_id, node_ids }
            }
            ty::COLLECTIVE => Frame::Collective(Contribution {
                op: CollectiveOp::from_u8(d.u8("op")?)?,
                uid: d.u64("uid")?,
                seq: d.u64("seq")?,
                arg: d.u64("arg")?,
                members: d.u32s("members")?,
                payload: d.bytes("payload")?.to_vec(),
            }),
            ty::COLLECTIVE_DONE => {
                let uid = d.u64("uid")?;
                let seq = d.u64("seq")?;
                let n = d.count("payload count", 4)?;
                let mut payloads = Vec::with_capacity(n);
                for _ in 0..n {
                    payloads.push(d.bytes("payload")?.to_vec());
                }
                Frame::CollectiveDone { uid, seq, payloads }
            }
            ty::COLLECTIVE_FAILED => Frame::CollectiveFailed {
                uid: d.u64("uid")?,
                seq: d.u64("seq")?,
                kind: match d.u8("failure kind")? {
                    1 => FailKind::Mismatch,
                    2 => FailKind::Invalid,
                    v => {
                        return Err(WireError::BadValue {
                            field: "failure kind",
                            value: v as u64,
                        })
                    }
                },
                reason: d.string("reason")?,
            },
            ty::PEER_DIED => Frame::PeerDied {
                rank: d.u32("rank")?,
                detail: d.string("detail")?,
            },
            ty::FINALIZE => Frame::Finalize,
            ty::FINALIZE_ACK => Frame::FinalizeAck,
            ty::JOIN_STATUS_QUERY => Frame::JoinStatusQuery,
            ty::JOIN_STATUS => Frame::JoinStatus {
                joined: d.u32("joined")?,
                world_size: d.u32("world size")?,
                missing: d.u32s("missing")?,
            },
            other => return Err(WireError::UnknownType(other)),
        };
        if !d.0.is_empty() {
            return Err(WireError::Trailing(d.0.len()));
        }
        Ok(frame)
    }
}

// ---- decoding ----

struct Dec<'a>(&'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated {
                field,
                need: n,
                have: self.0.len(),
            });
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(field, N)?);
        Ok(a)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    /// An element count, checked against the bytes left (each element needs at least
    /// `min_elem` bytes) so that a forged count cannot make us allocate.
    fn count(&mut self, field: &'static str, min_elem: usize) -> Result<usize, WireError> {
        let n = self.u32(field)? as usize;
        let need = n.saturating_mul(min_elem);
        if need > self.0.len() {
            return Err(WireError::Truncated {
                field,
                need,
                have: self.0.len(),
            });
        }
        Ok(n)
    }
    fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let n = self.u32(field)? as usize;
        self.take(field, n)
    }
    fn string(&mut self, field: &'static str) -> Result<String, WireError> {
        let b = self.bytes(field)?;
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|_| WireError::BadUtf8 { field })
    }
    fn u32s(&mut self, field: &'static str) -> Result<Vec<u32>, WireError> {
        let n = self.count(field, 4)?;
        (0..n).map(|_| self.u32(field)).collect()
    }
}

/// A read that failed after `got` of a frame's `of` bytes arrived. A timeout there is not
/// the retryable "nothing yet" of a timeout before a frame (the bytes read are gone, and
/// the next read would start inside this frame), so it becomes an error of another kind.
fn inside_frame(e: io::Error, got: usize, of: usize) -> ReadError {
    let timeout = matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    );
    ReadError::Io(io::Error::new(
        if timeout {
            io::ErrorKind::UnexpectedEof
        } else {
            e.kind()
        },
        format!("stopped inside a frame ({got} of {of} bytes received): {e}"),
    ))
}

/// Reads one frame of at most `max` bytes (after the prefix).
///
/// A close before the first byte is [`ReadError::Closed`]; a close inside a frame is an
/// `UnexpectedEof` I/O error, and so is a timeout after part of a frame
/// arrived ([`inside_frame`]); a timeout before any byte is returned as it is. The body buffer grows only as bytes arrive, so a forged
/// length costs nothing until the peer actually sends that much.
pub(crate) fn read_frame(r: &mut impl Read, max: usize) -> Result<Frame, ReadError> {
    let mut len_buf = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len_buf[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => {
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a frame's length prefix",
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got > 0 => return Err(inside_frame(e, got, 4)),
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(len_buf) as usize;
    if len > max {
        return Err(WireError::Oversized { len, max }.into());
    }
    if len == 0 {
        return Err(WireError::Empty.into());
    }
    let mut body = Vec::with_capacity(len.min(64 << 10));
    if let Err(e) = r.take(len as u64).read_to_end(&mut body) {
        return Err(inside_frame(e, 4 + body.len(), 4 + len));
    }
    if body.len() < len {
        return Err(ReadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "connection closed inside a frame ({} of {len} bytes received)",
                body.len()
            ),
        )));
    }
    Ok(Frame::decode(&body)?)
}

/// Writes one encoded frame.
pub(crate) fn write_frame(w: &mut impl Write, frame: &Frame) -> io::Result<()> {
    w.write_all(&frame.encode())?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out `chunks` in turn, each followed by one WouldBlock (a read timeout).
    struct Stalling {
        chunks: Vec<Vec<u8>>,
        stalled: bool,
    }

    impl Read for Stalling {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if !self.stalled {
                self.stalled = true;
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            if self.chunks.is_empty() {
                return Ok(0);
            }
            self.stalled = false;
            let c = self.chunks.remove(0);
            buf[..c.len()].copy_from_slice(&c);
            Ok(c.len())
        }
    }

    /// A timeout before a frame is the caller's "nothing yet" (the next read starts the
    /// frame); one after part of a frame arrived is an error of another kind naming how
    /// much arrived, so that no later read starts inside the frame.
    #[test]
    fn a_timeout_inside_a_frame_is_not_a_timeout() {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &Frame::Finalize).unwrap();
        assert!(bytes.len() > 4);
        let timeout = |e: &ReadError| matches!(e, ReadError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut));
        for cut in [2, 4, 5] {
            if cut >= bytes.len() {
                continue;
            }
            let mut r = Stalling {
                chunks: vec![bytes[..cut].to_vec(), bytes[cut..].to_vec()],
                stalled: false,
            };
            // Before any byte: a timeout.
            assert!(timeout(&read_frame(&mut r, 1 << 10).unwrap_err()));
            // After `cut` bytes: not a timeout, and it says how much arrived.
            let e = read_frame(&mut r, 1 << 10).unwrap_err();
            assert!(!timeout(&e), "cut {cut}: {e:?}");
            let ReadError::Io(io) = e else {
                panic!("cut {cut}: {e:?}")
            };
            assert!(
                io.to_string().contains(&format!(
                    "({cut} of {} bytes received)",
                    if cut < 4 { 4 } else { bytes.len() }
                )),
                "cut {cut}: {io}"
            );
        }
    }

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION,
                token: b"tok\0en".to_vec(),
                rank: 3,
                world_size: 8,
                node_id: "host:0a1b2c3d".into(),
            }),
            Frame::Refused {
                reason: "wrong token".into(),
            },
            Frame::Welcome {
                job_id: "0123456789abcdef".into(),
                node_ids: vec!["a".into(), "".into(), "ccc".into()],
            },
            Frame::Collective(Contribution {
                op: CollectiveOp::Broadcast,
                uid: u64::MAX,
                seq: 7,
                arg: 2,
                members: vec![0, 2, 4],
                payload: vec![1, 2, 3, 255],
            }),
            Frame::Collective(Contribution {
                op: CollectiveOp::Barrier,
                uid: 0,
                seq: 0,
                arg: 0,
                members: vec![],
                payload: vec![],
            }),
            Frame::CollectiveDone {
                uid: 5,
                seq: 1 << 40,
                payloads: vec![vec![], vec![9; 100], vec![1]],
            },
            Frame::CollectiveFailed {
                uid: 1,
                seq: 2,
                kind: FailKind::Mismatch,
                reason: "members differ".into(),
            },
            Frame::CollectiveFailed {
                uid: 1,
                seq: 2,
                kind: FailKind::Invalid,
                reason: String::new(),
            },
            Frame::PeerDied {
                rank: 12,
                detail: "exited".into(),
            },
            Frame::Finalize,
            Frame::FinalizeAck,
            Frame::JoinStatusQuery,
            Frame::JoinStatus {
                joined: 3,
                world_size: 8,
                missing: vec![3, 4, 5],
            },
        ]
    }

    #[test]
    fn round_trips() {
        for f in samples() {
            let bytes = f.encode();
            let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            assert_eq!(len, bytes.len() - 4, "{f:?}");
            assert_eq!(Frame::decode(&bytes[4..]), Ok(f.clone()));
            let mut r = &bytes[..];
            assert_eq!(read_frame(&mut r, MAX_FRAME).unwrap(), f);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn hello_layout() {
        let f = Frame::Hello(Hello {
            magic: MAGIC,
            version: 1,
            token: b"ab".to_vec(),
            rank: 2,
            world_size: 3,
            node_id: "n".into(),
        });
        let mut want = vec![];
        want.extend_from_slice(&(1u32 + 8 + 4 + 4 + 2 + 4 + 4 + 4 + 1).to_le_bytes());
        want.push(1);
        want.extend_from_slice(b"RSHMEM\0\x01");
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"ab");
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(b"n");
        assert_eq!(f.encode(), want);
    }

    #[test]
    fn every_truncation_is_an_error() {
        for f in samples() {
            let bytes = f.encode();
            let body = &bytes[4..];
            for cut in 0..body.len() {
                assert!(
                    Frame::decode(&body[..cut]).is_err(),
                    "{f:?} cut at {cut} decoded"
                );
            }
            // A stream that closes mid-frame is an I/O error, never a frame or Closed.
            for cut in 1..bytes.len() {
                let mut r = &bytes[..cut];
                match read_frame(&mut r, MAX_FRAME) {
                    Err(ReadError::Io(e)) => {
                        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof)
                    }
                    other => panic!("{f:?} cut at {cut}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn empty_stream_is_closed() {
        let mut r: &[u8] = &[];
        assert!(matches!(
            read_frame(&mut r, MAX_FRAME),
            Err(ReadError::Closed)
        ));
    }

    #[test]
    fn oversized_is_rejected_before_reading() {
        let mut bytes = ((MAX_HELLO_FRAME + 1) as u32).to_le_bytes().to_vec();
        bytes.push(ty::HELLO);
        let mut r = &bytes[..];
        match read_frame(&mut r, MAX_HELLO_FRAME) {
            Err(ReadError::Malformed(WireError::Oversized { len, max })) => {
                assert_eq!((len, max), (MAX_HELLO_FRAME + 1, MAX_HELLO_FRAME))
            }
            other => panic!("{other:?}"),
        }
        let mut r: &[u8] = &u32::MAX.to_le_bytes();
        assert!(matches!(
            read_frame(&mut r, MAX_FRAME),
            Err(ReadError::Malformed(WireError::Oversized { .. }))
        ));
    }

    #[test]
    fn zero_length_and_unknown_type() {
        let mut r: &[u8] = &[0, 0, 0, 0];
        assert!(matches!(
            read_frame(&mut r, MAX_FRAME),
            Err(ReadError::Malformed(WireError::Empty))
        ));
        for t in [0u8, 12, 99, 255] {
            let mut r: &[u8] = &[1, 0, 0, 0, t];
            match read_frame(&mut r, MAX_FRAME) {
                Err(ReadError::Malformed(WireError::UnknownType(got))) => assert_eq!(got, t),
                other => panic!("type {t}: {other:?}"),
            }
        }
    }

    #[test]
    fn trailing_bytes_rejected() {
        let mut body = Frame::FinalizeAck.encode()[4..].to_vec();
        body.push(0);
        assert_eq!(Frame::decode(&body), Err(WireError::Trailing(1)));
    }

    #[test]
    fn forged_counts_and_bad_values() {
        // Welcome claiming 2^32-1 node ids in a tiny frame.
        let mut body = vec![ty::WELCOME];
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Frame::decode(&body),
            Err(WireError::Truncated {
                field: "node id count",
                ..
            })
        ));
        // A byte string longer than the frame.
        let mut body = vec![ty::REFUSED];
        body.extend_from_slice(&1000u32.to_le_bytes());
        body.extend_from_slice(b"short");
        assert!(matches!(
            Frame::decode(&body),
            Err(WireError::Truncated {
                field: "reason",
                ..
            })
        ));
        // Invalid UTF-8.
        let mut body = vec![ty::REFUSED];
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(
            Frame::decode(&body),
            Err(WireError::BadUtf8 { field: "reason" })
        );
        // Unknown collective op.
        let mut body = Frame::Collective(Contribution {
            op: CollectiveOp::Allgather,
            uid: 0,
            seq: 0,
            arg: 0,
            members: vec![0],
            payload: vec![],
        })
        .encode()[4..]
            .to_vec();
        body[1] = 9;
        assert_eq!(
            Frame::decode(&body),
            Err(WireError::BadValue {
                field: "collective op",
                value: 9
            })
        );
        // Unknown failure kind.
        let mut body = Frame::CollectiveFailed {
            uid: 0,
            seq: 0,
            kind: FailKind::Mismatch,
            reason: String::new(),
        }
        .encode()[4..]
            .to_vec();
        body[17] = 0;
        assert!(matches!(
            Frame::decode(&body),
            Err(WireError::BadValue {
                field: "failure kind",
                ..
            })
        ));
    }

    #[test]
    fn random_junk_never_panics() {
        // A fixed xorshift sequence: reproducible junk of many shapes.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let mut buf = Vec::with_capacity(len + 1);
            buf.push((x >> 8) as u8 % 13);
            let mut y = x;
            for _ in 0..len {
                y = y.wrapping_mul(6364136223846793005).wrapping_add(1);
                buf.push((y >> 33) as u8);
            }
            // Whatever decodes is canonical: it re-encodes to exactly the same bytes.
            if let Ok(f) = Frame::decode(&buf) {
                assert_eq!(&f.encode()[4..], &buf[..]);
            }
            let mut r = &buf[..];
            let _ = read_frame(&mut r, MAX_HELLO_FRAME);
        }
    }
}
