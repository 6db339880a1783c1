//! libfabric completion errors → the mlx5 CQE syndromes the soft HCA reports, so the
//! device code sees the same error CQEs a ConnectX would produce.
//!
//! | libfabric `err` (fi_errno.h, Linux values)                     | syndrome |
//! |----------------------------------------------------------------|----------|
//! | FI_EACCES 13, FI_EPERM 1, FI_EKEYREJECTED 129, FI_ENOKEY 266    | REMOTE_ACCESS 0x13 |
//! | FI_EIO 5, FI_ETIMEDOUT 110, FI_ECONNRESET 104, FI_ECONNREFUSED 111, FI_ECONNABORTED 103, FI_ENOTCONN 107, FI_EHOSTUNREACH 113, FI_ENETUNREACH 101, FI_ENETDOWN 100 | TRANSPORT_RETRY_EXC 0x15 |
//! | FI_ENORX 269 (receiver not ready)                               | RNR_RETRY_EXC 0x16 |
//! | FI_ECANCELED 125                                                | WR_FLUSH 0x05 |
//! | FI_EINVAL 22, FI_EMSGSIZE 90, FI_EOPNOTSUPP 95, FI_ETRUNC 265, FI_EOVERRUN 268 | REMOTE_INVAL_REQ 0x12 |
//! | anything else (FI_EREMOTEIO 121, FI_EOTHER 256, ...)            | REMOTE_OP 0x14 |
//!
//! The syndrome values are `MLX5_CQE_SYNDROME_*` from rdma-core's `mlx5dv.h`.

use super::sys::*;

/// `MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR`.
pub const LOCAL_LENGTH: u8 = 0x01;
/// `MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR`.
pub const LOCAL_QP_OP: u8 = 0x02;
/// `MLX5_CQE_SYNDROME_LOCAL_PROT_ERR`.
pub const LOCAL_PROT: u8 = 0x04;
/// `MLX5_CQE_SYNDROME_WR_FLUSH_ERR`.
pub const WR_FLUSH: u8 = 0x05;
/// `MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR`.
pub const LOCAL_ACCESS: u8 = 0x11;
/// `MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR`.
pub const REMOTE_INVAL_REQ: u8 = 0x12;
/// `MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR`.
pub const REMOTE_ACCESS: u8 = 0x13;
/// `MLX5_CQE_SYNDROME_REMOTE_OP_ERR`.
pub const REMOTE_OP: u8 = 0x14;
/// `MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR`.
pub const TRANSPORT_RETRY_EXC: u8 = 0x15;
/// `MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR`.
pub const RNR_RETRY_EXC: u8 = 0x16;

/// The syndrome for a libfabric error code (`fi_cq_err_entry.err`; the sign is ignored,
/// so `-FI_EACCES` and `FI_EACCES` map alike). See the module table.
pub fn syndrome_for(err: i32) -> u8 {
    let e = err.unsigned_abs();
    match e {
        FI_EACCES | FI_EPERM | FI_EKEYREJECTED | FI_ENOKEY => REMOTE_ACCESS,
        FI_EIO | FI_ETIMEDOUT | FI_ECONNRESET | FI_ECONNREFUSED | FI_ECONNABORTED | FI_ENOTCONN
        | FI_EHOSTUNREACH | FI_ENETUNREACH | FI_ENETDOWN => TRANSPORT_RETRY_EXC,
        FI_ENORX => RNR_RETRY_EXC,
        FI_ECANCELED => WR_FLUSH,
        FI_EINVAL | FI_EMSGSIZE | FI_EOPNOTSUPP | FI_ETRUNC | FI_EOVERRUN => REMOTE_INVAL_REQ,
        _ => REMOTE_OP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_linux_values_in_the_table() {
        // The module table quotes these numbers; fi_errno.h maps them to errno.h.
        assert_eq!(
            [
                FI_EPERM,
                FI_EIO,
                FI_EACCES,
                FI_EINVAL,
                FI_EMSGSIZE,
                FI_EOPNOTSUPP
            ],
            [1, 5, 13, 22, 90, 95]
        );
        assert_eq!(
            [
                FI_ENETDOWN,
                FI_ENETUNREACH,
                FI_ECONNABORTED,
                FI_ECONNRESET,
                FI_ENOTCONN
            ],
            [100, 101, 103, 104, 107]
        );
        assert_eq!(
            [
                FI_ETIMEDOUT,
                FI_ECONNREFUSED,
                FI_EHOSTUNREACH,
                FI_ECANCELED,
                FI_EKEYREJECTED
            ],
            [110, 111, 113, 125, 129]
        );
        assert_eq!(
            [FI_ETRUNC, FI_ENOKEY, FI_EOVERRUN, FI_ENORX],
            [265, 266, 268, 269]
        );
    }

    #[test]
    fn table() {
        let cases: &[(u32, u8)] = &[
            (FI_EACCES, 0x13),
            (FI_EKEYREJECTED, 0x13),
            (FI_ENOKEY, 0x13),
            (FI_EIO, 0x15),
            (FI_ETIMEDOUT, 0x15),
            (FI_ECONNRESET, 0x15),
            (FI_ECONNREFUSED, 0x15),
            (FI_ENORX, 0x16),
            (FI_ECANCELED, 0x05),
            (FI_EINVAL, 0x12),
            (FI_ETRUNC, 0x12),
            (FI_EREMOTEIO, 0x14),
            (FI_EOTHER, 0x14),
        ];
        for &(code, syn) in cases {
            assert_eq!(syndrome_for(code as i32), syn, "code {code}");
            assert_eq!(syndrome_for(-(code as i32)), syn, "code -{code}");
        }
    }
}
