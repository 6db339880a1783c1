//! `rshmem mlx5 decode`: hex bytes → a WQE or CQE field listing (text or JSON).
//!
//! Input is hex with or without spaces or colons, split over any number of arguments
//! (concatenated). A WQE must be whole 64-byte WQEBBs and exactly one WQE; a CQE exactly
//! 64 bytes. Malformed input is an error (exit status 2) naming what is wrong and, for a
//! WQE, the syndrome the soft HCA would report.

use std::fmt::Write as _;
use std::io;

use serde::Serialize;

use super::cqe::{parse_cqe, Cqe64, CqeError, CqeOpcode, Syndrome};
use super::wqe::{
    opcode, parse_wqe_with, FenceMode, ParsedWqe, Segment, WqeError, DEFAULT_MAX_INLINE, WQEBB,
};

/// Arguments of `rshmem mlx5`.
#[derive(clap::Args, Debug)]
pub struct Mlx5Args {
    #[command(subcommand)]
    pub command: Mlx5Command,
}

/// Subcommands of `rshmem mlx5`.
#[derive(clap::Subcommand, Debug)]
pub enum Mlx5Command {
    /// Decode a WQE (default) or a CQE given as hex into its fields.
    Decode(DecodeArgs),
}

/// Arguments of `rshmem mlx5 decode`.
#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// The bytes are a send-queue WQE (one or more 64-byte WQEBBs); the default.
    #[arg(long, conflicts_with = "cqe")]
    pub wqe: bool,
    /// The bytes are a 64-byte CQE.
    #[arg(long)]
    pub cqe: bool,
    /// Print JSON instead of a listing.
    #[arg(long)]
    pub json: bool,
    /// Inline payload limit for WQE validation (the QP's max_inline_data).
    #[arg(long, default_value_t = DEFAULT_MAX_INLINE)]
    pub max_inline: u32,
    /// Hex bytes, e.g. `08123408 abcdef03 ...` or `08:12:34:08`; arguments are concatenated.
    #[arg(required = true, num_args = 1..)]
    pub hex: Vec<String>,
}

/// Why `decode` could not decode its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("bad hex: {0}")]
    Hex(String),
    #[error("a WQE is whole 64-byte WQEBBs; got {len} bytes")]
    NotWholeWqebbs { len: usize },
    #[error("malformed WQE: {err} (soft HCA syndrome {name} {code:#04x})", name = err.syndrome().name(), code = err.syndrome() as u8)]
    Wqe { err: WqeError },
    #[error("the WQE spans {wqe} bytes but {len} were given (decode one WQE at a time)")]
    Trailing { wqe: usize, len: usize },
    #[error("malformed CQE: {0}")]
    Cqe(#[from] CqeError),
}

/// Concatenates hex arguments, ignoring whitespace, ':' separators and a leading `0x` on
/// each whitespace-separated word (`"0x0812 0x3408"` as one argument, as a shell quote or a
/// paste gives it).
pub fn decode_hex<S: AsRef<str>>(args: &[S]) -> Result<Vec<u8>, DecodeError> {
    let mut digits = Vec::new();
    for a in args
        .iter()
        .flat_map(|a| a.as_ref().split_ascii_whitespace())
    {
        let a = a
            .strip_prefix("0x")
            .or_else(|| a.strip_prefix("0X"))
            .unwrap_or(a);
        for c in a.chars() {
            match c {
                c if c.is_ascii_whitespace() || c == ':' => {}
                c => match c.to_digit(16) {
                    Some(d) => digits.push(d as u8),
                    None => return Err(DecodeError::Hex(format!("{c:?} is not a hex digit"))),
                },
            }
        }
    }
    if digits.is_empty() {
        return Err(DecodeError::Hex("no bytes given".into()));
    }
    if digits.len() % 2 != 0 {
        return Err(DecodeError::Hex(format!(
            "odd number of hex digits ({})",
            digits.len()
        )));
    }
    Ok(digits.chunks_exact(2).map(|p| (p[0] << 4) | p[1]).collect())
}

/// Decodes one WQE for display: whole WQEBBs, exactly one WQE.
pub fn decode_wqe(bytes: &[u8], max_inline: u32) -> Result<ParsedWqe<'_>, DecodeError> {
    if bytes.is_empty() || bytes.len() % WQEBB != 0 {
        return Err(DecodeError::NotWholeWqebbs { len: bytes.len() });
    }
    let p = parse_wqe_with(bytes, max_inline).map_err(|err| DecodeError::Wqe { err })?;
    if p.size.bytes() != bytes.len() {
        return Err(DecodeError::Trailing {
            wqe: p.size.bytes(),
            len: bytes.len(),
        });
    }
    Ok(p)
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum SegJson {
    Ctrl {
        opcode: u8,
        opmod: u8,
        wqe_index: u16,
        qpn: u32,
        ds: u8,
        fm_ce_se: u8,
        imm: u32,
    },
    Raddr {
        raddr: u64,
        rkey: u32,
    },
    Data {
        byte_count: u32,
        lkey: u32,
        addr: u64,
    },
    Inline {
        len: usize,
        data: String,
    },
    Atomic {
        swap_add: u64,
        compare: u64,
    },
    MaskedCs32 {
        swap: u32,
        compare: u32,
        swap_mask: u32,
        compare_mask: u32,
    },
    MaskedFa32 {
        add: u32,
        field_boundary: u32,
    },
    MaskedCs64 {
        swap: u64,
        compare: u64,
        swap_mask: u64,
        compare_mask: u64,
    },
    MaskedFa64 {
        add: u64,
        field_boundary: u64,
    },
}

#[derive(Serialize)]
struct WqeJson {
    segments: Vec<SegJson>,
}

#[derive(Serialize)]
struct CqeJson {
    #[serde(rename = "type")]
    kind: &'static str,
    opcode: u8,
    owner: u8,
    wqe_counter: u16,
    byte_cnt: u32,
    qpn: u32,
    syndrome: Option<u8>,
    vendor_err_synd: Option<u8>,
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

fn seg_json(s: &Segment<'_>) -> SegJson {
    match *s {
        Segment::Ctrl(c) => SegJson::Ctrl {
            opcode: c.opcode(),
            opmod: c.opmod(),
            wqe_index: c.wqe_index(),
            qpn: c.qpn(),
            ds: c.ds(),
            fm_ce_se: c.fm_ce_se,
            imm: c.imm.get(),
        },
        Segment::Raddr(r) => SegJson::Raddr {
            raddr: r.raddr.get(),
            rkey: r.rkey.get(),
        },
        Segment::Data(d) => SegJson::Data {
            byte_count: d.byte_count.get(),
            lkey: d.lkey.get(),
            addr: d.addr.get(),
        },
        Segment::Inline(d) => SegJson::Inline {
            len: d.len(),
            data: hex(d),
        },
        Segment::Atomic(a) => SegJson::Atomic {
            swap_add: a.swap_add.get(),
            compare: a.compare.get(),
        },
        Segment::MaskedCs32(m) => SegJson::MaskedCs32 {
            swap: m.swap.get(),
            compare: m.compare.get(),
            swap_mask: m.swap_mask.get(),
            compare_mask: m.compare_mask.get(),
        },
        Segment::MaskedFa32(m) => SegJson::MaskedFa32 {
            add: m.add.get(),
            field_boundary: m.field_boundary.get(),
        },
        Segment::MaskedCs64(m) => SegJson::MaskedCs64 {
            swap: m.swap.get(),
            compare: m.compare.get(),
            swap_mask: m.swap_mask.get(),
            compare_mask: m.compare_mask.get(),
        },
        Segment::MaskedFa64(m) => SegJson::MaskedFa64 {
            add: m.add.get(),
            field_boundary: m.field_boundary.get(),
        },
    }
}

/// serde_json formatting with `", "` and `": "` separators (as Python's `json.dumps`).
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

fn to_json<T: Serialize>(v: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    // Serialising these plain structs into a Vec cannot fail.
    v.serialize(&mut ser).expect("JSON of plain structs");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// `{"segments": [{"type": "ctrl", ...}, ...]}` for a parsed WQE.
pub fn wqe_json(p: &ParsedWqe<'_>) -> String {
    to_json(&WqeJson {
        segments: p.segments().iter().map(seg_json).collect(),
    })
}

/// `{"type": "cqe", ...}` for a CQE; `syndrome` and `vendor_err_synd` are null unless the
/// CQE opcode is REQ_ERR or RESP_ERR.
pub fn cqe_json(c: &Cqe64) -> String {
    let err = CqeOpcode::from_u8(c.opcode()).is_some_and(CqeOpcode::is_error);
    let e = c.as_err();
    to_json(&CqeJson {
        kind: "cqe",
        opcode: c.opcode(),
        owner: c.owner(),
        wqe_counter: c.wqe_counter.get(),
        byte_cnt: c.byte_cnt.get(),
        qpn: c.qpn(),
        syndrome: err.then_some(e.syndrome),
        vendor_err_synd: err.then_some(e.vendor_err_synd),
    })
}

fn fm_ce_se_text(b: u8) -> String {
    let fence = match FenceMode::from_fm_ce_se(b) {
        Some(f) => format!("{f:?}"),
        None => format!("reserved {}", b >> 5),
    };
    // CE, bits 3:2: 2 is rdma-core's MLX5_WQE_CTRL_CQ_UPDATE, 3 its
    // MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE (a CQE always, plus an event).
    let ce = match (b >> 2) & 3 {
        0 => "no CQE",
        1 => "CQE on error",
        2 => "CQ update",
        _ => "CQ update + EQE",
    };
    let se = if b & 2 != 0 { ", solicited" } else { "" };
    format!("fence {fence}, {ce}{se}")
}

/// A readable listing of a parsed WQE, one line per segment.
pub fn wqe_listing(p: &ParsedWqe<'_>) -> String {
    let mut s = format!("WQE: {} ds, {} WQEBB(s)\n", p.size.ds, p.size.wqebbs());
    for seg in p.segments() {
        let line = match seg {
            Segment::Ctrl(c) => format!(
                "ctrl         opcode {:#04x} {}  opmod {:#04x}  wqe_index {:#06x}  qpn {:#08x}  ds {}  fm_ce_se {:#04x} ({})  imm {:#010x}",
                c.opcode(),
                opcode::name(c.opcode()).unwrap_or("?"),
                c.opmod(),
                c.wqe_index(),
                c.qpn(),
                c.ds(),
                c.fm_ce_se,
                fm_ce_se_text(c.fm_ce_se),
                c.imm.get()
            ),
            Segment::Raddr(r) => format!("raddr        raddr {:#018x}  rkey {:#010x}", r.raddr.get(), r.rkey.get()),
            Segment::Data(d) => format!(
                "data         byte_count {}  lkey {:#010x}  addr {:#018x}",
                d.byte_count.get(),
                d.lkey.get(),
                d.addr.get()
            ),
            Segment::Inline(d) => format!("inline       len {}  data {}", d.len(), hex(d)),
            Segment::Atomic(a) => format!("atomic       swap_add {:#018x}  compare {:#018x}", a.swap_add.get(), a.compare.get()),
            Segment::MaskedCs32(m) => format!(
                "masked_cs32  swap {:#010x}  compare {:#010x}  swap_mask {:#010x}  compare_mask {:#010x}",
                m.swap.get(),
                m.compare.get(),
                m.swap_mask.get(),
                m.compare_mask.get()
            ),
            Segment::MaskedFa32(m) => format!("masked_fa32  add {:#010x}  field_boundary {:#010x}", m.add.get(), m.field_boundary.get()),
            Segment::MaskedCs64(m) => format!(
                "masked_cs64  swap {:#018x}  compare {:#018x}  swap_mask {:#018x}  compare_mask {:#018x}",
                m.swap.get(),
                m.compare.get(),
                m.swap_mask.get(),
                m.compare_mask.get()
            ),
            Segment::MaskedFa64(m) => format!("masked_fa64  add {:#018x}  field_boundary {:#018x}", m.add.get(), m.field_boundary.get()),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s
}

/// A readable listing of a CQE.
pub fn cqe_listing(c: &Cqe64) -> String {
    let op = CqeOpcode::from_u8(c.opcode());
    let mut s = format!(
        "CQE: opcode {} {}  owner {}  wqe_counter {:#06x}  byte_cnt {}  wqe_opcode {:#04x}  qpn {:#08x}\n",
        c.opcode(),
        op.map_or("?", CqeOpcode::name),
        c.owner(),
        c.wqe_counter.get(),
        c.byte_cnt.get(),
        c.wqe_opcode(),
        c.qpn()
    );
    if op.is_some_and(CqeOpcode::is_error) {
        let e = c.as_err();
        let _ = writeln!(
            s,
            "     syndrome {:#04x} {}  vendor_err_synd {:#04x}",
            e.syndrome,
            Syndrome::from_u8(e.syndrome).map_or("?", Syndrome::name),
            e.vendor_err_synd
        );
    }
    s
}

/// Decodes per `args` into the text to print.
pub fn decode(args: &DecodeArgs) -> Result<String, DecodeError> {
    let bytes = decode_hex(&args.hex)?;
    if args.cqe {
        let c = parse_cqe(&bytes)?;
        return Ok(if args.json {
            cqe_json(&c) + "\n"
        } else {
            cqe_listing(&c)
        });
    }
    let p = decode_wqe(&bytes, args.max_inline)?;
    Ok(if args.json {
        wqe_json(&p) + "\n"
    } else {
        wqe_listing(&p)
    })
}

/// Runs `rshmem mlx5 ...`; returns the exit status (2 for malformed input).
pub fn run_cli(args: Mlx5Args) -> i32 {
    match args.command {
        Mlx5Command::Decode(a) => match decode(&a) {
            Ok(out) => {
                print!("{out}");
                0
            }
            Err(e) => {
                eprintln!("rshmem mlx5 decode: {e}");
                2
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_hex, fm_ce_se_text};

    #[test]
    fn hex_words_may_each_carry_0x() {
        let want = vec![0x08, 0x12, 0x34, 0x08, 0xab];
        assert_eq!(decode_hex(&["0x0812 0x3408", "0Xab"]).unwrap(), want);
        assert_eq!(decode_hex(&["08:12:34", "08ab"]).unwrap(), want);
        assert!(decode_hex(&["0x08 1x"]).is_err());
        assert!(decode_hex(&["0x", " "]).is_err(), "no bytes");
    }

    #[test]
    fn fm_ce_se_text_names_every_ce_value() {
        assert_eq!(fm_ce_se_text(0x00), "fence None, no CQE");
        assert_eq!(fm_ce_se_text(0x04), "fence None, CQE on error");
        assert_eq!(fm_ce_se_text(0x08), "fence None, CQ update");
        // CE 3: rdma-core's MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE.
        assert_eq!(fm_ce_se_text(0x0c), "fence None, CQ update + EQE");
        assert_eq!(
            fm_ce_se_text(0x40 | 0x0c | 0x02),
            "fence Fence, CQ update + EQE, solicited"
        );
    }
}
