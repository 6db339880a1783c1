#!/usr/bin/env python3
"""Regenerates the seed corpus of malformed WQEs in wqe/ (run from this folder).

File name: <case>.<WqeError kind>.<syndrome>.hex; content: hex, 16 bytes a line.
host/tests/mlx5_corpus.rs parses every file and checks the recorded kind and syndrome.
New cases (e.g. minimised fuzz findings) may be added by hand in the same format."""
import struct

def ctrl(op, ds, opmod=0, idx=0x10, qpn=0x42, fm=0x08, imm=0):
    return struct.pack(">IIBxxBI", (opmod << 24) | (idx << 8) | op, (qpn << 8) | ds, 0, fm, imm)

raddr = struct.pack(">QII", 0x1000, 0x77, 0)
atom = struct.pack(">QQ", 1, 2)

def data(n, lkey=0x66, addr=0x2000):
    return struct.pack(">IIQ", n, lkey, addr)

def inl(n):
    seg = struct.pack(">I", n | 0x80000000) + bytes(i % 256 for i in range(n))
    return seg + b"\0" * ((-len(seg)) % 16)

def pad(b, n=None):
    n = n or ((len(b) + 63) // 64 * 64)
    return b + b"\0" * (n - len(b))

cases = {
    "truncated.Truncated.LOCAL_QP_OP": ctrl(0x08, 3)[:8],
    "unknown_opcode_07.UnknownOpcode.LOCAL_QP_OP": pad(ctrl(0x07, 3) + raddr + data(8)),
    "unknown_opcode_ff.UnknownOpcode.LOCAL_QP_OP": pad(ctrl(0xff, 1)),
    "umr.UnsupportedOpcode.LOCAL_QP_OP": pad(ctrl(0x25, 3) + raddr + data(8)),
    "send_inval.UnsupportedOpcode.LOCAL_QP_OP": pad(ctrl(0x01, 2) + data(8)),
    "write_ds0.ZeroDs.LOCAL_QP_OP": pad(ctrl(0x08, 0) + raddr + data(8)),
    "nop_ds0.ZeroDs.LOCAL_QP_OP": pad(ctrl(0x00, 0)),
    "ds65.DsTooLarge.LOCAL_QP_OP": pad(ctrl(0x08, 65) + raddr + data(8), 17 * 64),
    "ds255.DsTooLarge.LOCAL_QP_OP": pad(ctrl(0x08, 255) + raddr + data(8)),
    "ds5_one_wqebb.DsPastBuffer.LOCAL_QP_OP": pad(ctrl(0x08, 5) + raddr + data(8)),
    "masked_cs_opmod_0a.BadOpmod.LOCAL_QP_OP": pad(ctrl(0x14, 4, opmod=0x0a) + raddr + atom + data(8)),
    "masked_fa_opmod_0.BadOpmod.LOCAL_QP_OP": pad(ctrl(0x15, 4, opmod=0) + raddr + atom + data(4)),
    "write_no_raddr.MissingSegment.LOCAL_QP_OP": pad(ctrl(0x08, 1)),
    "atomic_fa_no_result.MissingSegment.LOCAL_QP_OP": pad(ctrl(0x12, 3) + raddr + atom),
    "masked_cs64_ds4.MissingSegment.LOCAL_QP_OP": pad(ctrl(0x14, 4, opmod=0x09) + raddr + atom + atom),
    "dump_no_data.MissingSegment.LOCAL_QP_OP": pad(ctrl(0x23, 1)),
    "atomic_ds5.ExtraSegments.LOCAL_QP_OP": pad(ctrl(0x11, 5) + raddr + atom + data(8) + data(8)),
    "dump_two_data.ExtraSegments.LOCAL_QP_OP": pad(ctrl(0x23, 3) + data(1) + data(1)),
    "read_inline.InlineNotAllowed.LOCAL_QP_OP": pad(ctrl(0x10, 3) + raddr + inl(8)),
    "atomic_inline_result.InlineNotAllowed.LOCAL_QP_OP": pad(ctrl(0x12, 4) + raddr + atom + inl(8)),
    "write_data_then_inline.InlineMixed.LOCAL_QP_OP": pad(ctrl(0x08, 4) + raddr + data(8) + inl(8)),
    "write_inline_then_data.InlineMixed.LOCAL_QP_OP": pad(ctrl(0x08, 4) + raddr + inl(8) + data(8)),
    "write_inline_300.InlineTooLong.LOCAL_LENGTH": pad(ctrl(0x08, 2 + 20) + raddr + inl(300)),
    "write_inline_len_overrun.InlineOverrun.LOCAL_LENGTH": pad(ctrl(0x08, 3) + raddr + inl(40)[:16]),
    "send_inline_overrun.InlineOverrun.LOCAL_LENGTH": pad(ctrl(0x0a, 2) + inl(13)[:16]),
    "atomic_cs_result_4.AtomicLength.LOCAL_LENGTH": pad(ctrl(0x11, 4) + raddr + atom + data(4)),
    "masked_cs32_result_8.AtomicLength.LOCAL_LENGTH": pad(ctrl(0x14, 4, opmod=0x08) + raddr + atom + data(8)),
}

for name, b in cases.items():
    h = b.hex()
    lines = [" ".join(h[i + j:i + j + 8] for j in range(0, 32, 8)) for i in range(0, len(h), 32)]
    with open(f"wqe/{name}.hex", "w") as f:
        f.write("\n".join(lines) + "\n")
print(f"{len(cases)} files")
