//! The generated rdma-core structs rshmem reads or writes, checked against the C compiler:
//! size and offset of every field touched, from the Debian libibverbs-dev headers the
//! bindings were generated from (scripts/test installs them).

use rshmem::verbs::sys;
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

const C_PROGRAM: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#define O(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(struct t, f))
#define S(t) printf("%s %zu\n", #t, sizeof(struct t))
int main(void) {
    S(ibv_qp_attr); O(ibv_qp_attr, qp_state); O(ibv_qp_attr, path_mtu); O(ibv_qp_attr, rq_psn);
    O(ibv_qp_attr, sq_psn); O(ibv_qp_attr, dest_qp_num); O(ibv_qp_attr, qp_access_flags);
    O(ibv_qp_attr, ah_attr); O(ibv_qp_attr, pkey_index); O(ibv_qp_attr, max_rd_atomic);
    O(ibv_qp_attr, max_dest_rd_atomic); O(ibv_qp_attr, min_rnr_timer); O(ibv_qp_attr, port_num);
    O(ibv_qp_attr, timeout); O(ibv_qp_attr, retry_cnt); O(ibv_qp_attr, rnr_retry);
    S(ibv_ah_attr); O(ibv_ah_attr, grh); O(ibv_ah_attr, dlid); O(ibv_ah_attr, sl);
    O(ibv_ah_attr, is_global); O(ibv_ah_attr, port_num);
    S(ibv_global_route); O(ibv_global_route, dgid); O(ibv_global_route, flow_label);
    O(ibv_global_route, sgid_index); O(ibv_global_route, hop_limit); O(ibv_global_route, traffic_class);
    S(ibv_port_attr); O(ibv_port_attr, state); O(ibv_port_attr, active_mtu); O(ibv_port_attr, gid_tbl_len);
    O(ibv_port_attr, lid); O(ibv_port_attr, link_layer);
    S(ibv_gid_entry); O(ibv_gid_entry, gid_index); O(ibv_gid_entry, gid_type);
    S(ibv_qp_init_attr); O(ibv_qp_init_attr, send_cq); O(ibv_qp_init_attr, recv_cq);
    O(ibv_qp_init_attr, cap); O(ibv_qp_init_attr, qp_type); O(ibv_qp_init_attr, sq_sig_all);
    O(ibv_qp, qp_num); O(ibv_mr, lkey); O(ibv_mr, rkey);
    S(ibv_device_attr); O(ibv_device_attr, fw_ver); O(ibv_device_attr, max_qp_rd_atom);
    O(ibv_device_attr, max_qp_init_rd_atom);
    O(ibv_device_attr, phys_port_cnt);
    S(mlx5dv_qp); O(mlx5dv_qp, dbrec); O(mlx5dv_qp, sq); O(mlx5dv_qp, bf);
    S(mlx5dv_cq); O(mlx5dv_cq, buf); O(mlx5dv_cq, dbrec); O(mlx5dv_cq, cqe_cnt); O(mlx5dv_cq, cqe_size);
    S(mlx5dv_obj); O(mlx5dv_obj, qp); O(mlx5dv_obj, cq);
    S(mlx5dv_context); O(mlx5dv_context, flags);
    /* Fields read through nested members and function tables (from a review, 2026-12-07):
       atomic_cap decides whether ibgda is allowed, ops.post_send / ops.poll_cq are called. */
    O(ibv_device_attr, atomic_cap); O(mlx5dv_qp, sq.buf); O(mlx5dv_qp, sq.wqe_cnt);
    O(mlx5dv_qp, sq.stride); O(mlx5dv_qp, bf.reg); O(mlx5dv_qp, bf.size);
    O(ibv_context, ops); O(ibv_context_ops, post_send); O(ibv_context_ops, poll_cq);
    S(ibv_wc); O(ibv_wc, wr_id); O(ibv_wc, status); O(ibv_wc, opcode); O(ibv_wc, vendor_err);
    O(ibv_wc, byte_len); O(ibv_wc, qp_num);
    S(ibv_sge); O(ibv_sge, addr); O(ibv_sge, length); O(ibv_sge, lkey);
    S(ibv_send_wr); O(ibv_send_wr, wr_id); O(ibv_send_wr, next); O(ibv_send_wr, sg_list);
    O(ibv_send_wr, num_sge); O(ibv_send_wr, opcode); O(ibv_send_wr, send_flags);
    O(ibv_send_wr, wr.rdma.remote_addr); O(ibv_send_wr, wr.rdma.rkey);
    O(ibv_gid_entry, gid);
    return 0;
}
"#;

fn c_layout() -> BTreeMap<String, u64> {
    let dir = std::env::temp_dir().join(format!("rshmem-verbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, C_PROGRAM).unwrap();
    let out = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc (install gcc)");
    assert!(
        out.status.success(),
        "compiling the layout probe failed (install libibverbs-dev): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

fn rust_layout() -> BTreeMap<String, u64> {
    macro_rules! o {
        ($m:ident, $t:ident, $($f:ident).+) => {
            $m.insert(
                format!("{}.{}", stringify!($t), [$(stringify!($f)),+].join(".")),
                offset_of!(sys::$t, $($f).+) as u64,
            );
        };
    }
    macro_rules! s {
        ($m:ident, $t:ident) => {
            $m.insert(stringify!($t).to_string(), size_of::<sys::$t>() as u64);
        };
    }
    let mut m = BTreeMap::new();
    s!(m, ibv_qp_attr);
    o!(m, ibv_qp_attr, qp_state);
    o!(m, ibv_qp_attr, path_mtu);
    o!(m, ibv_qp_attr, rq_psn);
    o!(m, ibv_qp_attr, sq_psn);
    o!(m, ibv_qp_attr, dest_qp_num);
    o!(m, ibv_qp_attr, qp_access_flags);
    o!(m, ibv_qp_attr, ah_attr);
    o!(m, ibv_qp_attr, pkey_index);
    o!(m, ibv_qp_attr, max_rd_atomic);
    o!(m, ibv_qp_attr, max_dest_rd_atomic);
    o!(m, ibv_qp_attr, min_rnr_timer);
    o!(m, ibv_qp_attr, port_num);
    o!(m, ibv_qp_attr, timeout);
    o!(m, ibv_qp_attr, retry_cnt);
    o!(m, ibv_qp_attr, rnr_retry);
    s!(m, ibv_ah_attr);
    o!(m, ibv_ah_attr, grh);
    o!(m, ibv_ah_attr, dlid);
    o!(m, ibv_ah_attr, sl);
    o!(m, ibv_ah_attr, is_global);
    o!(m, ibv_ah_attr, port_num);
    s!(m, ibv_global_route);
    o!(m, ibv_global_route, dgid);
    o!(m, ibv_global_route, flow_label);
    o!(m, ibv_global_route, sgid_index);
    o!(m, ibv_global_route, hop_limit);
    o!(m, ibv_global_route, traffic_class);
    s!(m, ibv_port_attr);
    o!(m, ibv_port_attr, state);
    o!(m, ibv_port_attr, active_mtu);
    o!(m, ibv_port_attr, gid_tbl_len);
    o!(m, ibv_port_attr, lid);
    o!(m, ibv_port_attr, link_layer);
    s!(m, ibv_gid_entry);
    o!(m, ibv_gid_entry, gid_index);
    o!(m, ibv_gid_entry, gid_type);
    s!(m, ibv_qp_init_attr);
    o!(m, ibv_qp_init_attr, send_cq);
    o!(m, ibv_qp_init_attr, recv_cq);
    o!(m, ibv_qp_init_attr, cap);
    o!(m, ibv_qp_init_attr, qp_type);
    o!(m, ibv_qp_init_attr, sq_sig_all);
    o!(m, ibv_qp, qp_num);
    o!(m, ibv_mr, lkey);
    o!(m, ibv_mr, rkey);
    s!(m, ibv_device_attr);
    o!(m, ibv_device_attr, fw_ver);
    o!(m, ibv_device_attr, max_qp_rd_atom);
    o!(m, ibv_device_attr, max_qp_init_rd_atom);
    o!(m, ibv_device_attr, phys_port_cnt);
    s!(m, mlx5dv_qp);
    o!(m, mlx5dv_qp, dbrec);
    o!(m, mlx5dv_qp, sq);
    o!(m, mlx5dv_qp, bf);
    s!(m, mlx5dv_cq);
    o!(m, mlx5dv_cq, buf);
    o!(m, mlx5dv_cq, dbrec);
    o!(m, mlx5dv_cq, cqe_cnt);
    o!(m, mlx5dv_cq, cqe_size);
    s!(m, mlx5dv_obj);
    o!(m, mlx5dv_obj, qp);
    o!(m, mlx5dv_obj, cq);
    s!(m, mlx5dv_context);
    o!(m, mlx5dv_context, flags);
    o!(m, ibv_device_attr, atomic_cap);
    o!(m, mlx5dv_qp, sq.buf);
    o!(m, mlx5dv_qp, sq.wqe_cnt);
    o!(m, mlx5dv_qp, sq.stride);
    o!(m, mlx5dv_qp, bf.reg);
    o!(m, mlx5dv_qp, bf.size);
    o!(m, ibv_context, ops);
    o!(m, ibv_context_ops, post_send);
    o!(m, ibv_context_ops, poll_cq);
    s!(m, ibv_wc);
    o!(m, ibv_wc, wr_id);
    o!(m, ibv_wc, status);
    o!(m, ibv_wc, opcode);
    o!(m, ibv_wc, vendor_err);
    o!(m, ibv_wc, byte_len);
    o!(m, ibv_wc, qp_num);
    s!(m, ibv_sge);
    o!(m, ibv_sge, addr);
    o!(m, ibv_sge, length);
    o!(m, ibv_sge, lkey);
    s!(m, ibv_send_wr);
    o!(m, ibv_send_wr, wr_id);
    o!(m, ibv_send_wr, next);
    o!(m, ibv_send_wr, sg_list);
    o!(m, ibv_send_wr, num_sge);
    o!(m, ibv_send_wr, opcode);
    o!(m, ibv_send_wr, send_flags);
    o!(m, ibv_send_wr, wr.rdma.remote_addr);
    o!(m, ibv_send_wr, wr.rdma.rkey);
    o!(m, ibv_gid_entry, gid);
    m
}

#[test]
fn generated_structs_match_the_c_compiler() {
    let c = c_layout();
    let r = rust_layout();
    assert_eq!(
        c.len(),
        r.len(),
        "C printed {} entries, Rust has {}",
        c.len(),
        r.len()
    );
    assert_eq!(r, c);
}
