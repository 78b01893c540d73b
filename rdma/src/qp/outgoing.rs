//! One send request as the submit sees it ([`Outgoing`]: checked, its
//! memory held by the caller; [`Op`]: what it does), and how it is written
//! into a legacy `struct ibv_send_wr`. The front ends in `send.rs` and
//! `bind.rs` make them; both submit paths (`send.rs`'s `ibv_post_send`,
//! `wr_ops.rs`'s `ibv_wr_*` calls) and the prepared sends read them.

use crate::ffi;
use crate::wr::{SendFlags, SendOp, UdDest};

/// One request as the submit sees it: checked, its memory held by the caller
/// (parked in the tracker after the submit).
pub(super) struct Outgoing<'a> {
    pub op: Op<'a>,
    pub flags: SendFlags,
    pub ud: Option<&'a UdDest>,
    pub xrc_srqn: Option<u32>,
    /// The scatter list; for inline data, one entry (lkey 0) over the bytes,
    /// or none.
    pub sges: &'a [ffi::ibv_sge],
    pub inline: bool,
}

/// What a request does.
#[derive(Clone, Copy)]
pub(super) enum Op<'a> {
    Send(&'a SendOp),
    /// Binds a type 2 window (`IBV_WR_BIND_MW`).
    BindMw {
        mw: *mut ffi::ibv_mw,
        rkey: u32,
        info: &'a ffi::ibv_mw_bind_info,
    },
}

impl<'a> Outgoing<'a> {
    /// A prepared request's operation (its region is set by each post).
    pub(super) fn prepared(op: &'a SendOp, flags: SendFlags, ud: Option<&'a UdDest>) -> Self {
        Outgoing {
            op: Op::Send(op),
            flags,
            ud,
            xrc_srqn: None,
            sges: &[],
            inline: false,
        }
    }
}

/// Writes what `r` does into a legacy request: the opcode and its
/// operands, the UD address, the remote XRC SRQ.
#[inline]
pub(super) fn fill_request(raw: &mut ffi::ibv_send_wr, r: &Outgoing<'_>) {
    match r.op {
        Op::Send(op) => fill_send(raw, op),
        Op::BindMw { mw, rkey, info } => {
            raw.opcode = ffi::IBV_WR_BIND_MW;
            raw.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                mw,
                rkey,
                bind_info: *info,
            };
        }
    }
    if let Some(d) = r.ud {
        raw.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: d.ah.as_raw(),
            remote_qpn: d.remote_qpn,
            remote_qkey: d.remote_qkey,
        };
    }
    if let Some(remote_srqn) = r.xrc_srqn {
        raw.qp_type = ffi::ibv_send_wr__bindgen_ty_3 {
            xrc: ffi::ibv_send_wr__bindgen_ty_3__bindgen_ty_1 { remote_srqn },
        };
    }
}

/// The opcode of `op` and its operands, in a legacy request.
fn fill_send(raw: &mut ffi::ibv_send_wr, op: &SendOp) {
    raw.opcode = op.opcode();
    if let Some(imm) = op.imm() {
        raw.__bindgen_anon_1.imm_data = imm.to_be();
    }
    if let Some(rkey) = op.invalidate() {
        raw.__bindgen_anon_1.invalidate_rkey = rkey;
    }
    match *op {
        SendOp::Write(r) | SendOp::WriteWithImm(r, _) | SendOp::Read(r) => {
            raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr: remote.addr,
                compare_add: compare,
                swap,
                rkey: remote.rkey,
            };
        }
        SendOp::FetchAdd { remote, add } => {
            raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr: remote.addr,
                compare_add: add,
                swap: 0,
                rkey: remote.rkey,
            };
        }
        // The key also goes into `wr.rdma.rkey`: rdma-core 44's libsiw
        // (`push_send_wqe`) takes the key to invalidate from there, not from
        // `invalidate_rkey`, and so sent a SEND_INV naming key 0 (the
        // receiver failed it, REM_INV_REQ_ERR); other providers read
        // `wr.rdma` only for RDMA operations.
        SendOp::SendWithInvalidate(rkey) => {
            raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: 0,
                rkey,
            };
        }
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::LocalInvalidate(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::RemoteMemory;

    const REMOTE: RemoteMemory = RemoteMemory {
        addr: 0x1000,
        len: 64,
        rkey: 7,
    };

    fn filled(op: &SendOp, xrc_srqn: Option<u32>) -> ffi::ibv_send_wr {
        let mut raw = ffi::ibv_send_wr::default();
        let mut r = Outgoing::prepared(op, SendFlags::SIGNALED, None);
        r.xrc_srqn = xrc_srqn;
        fill_request(&mut raw, &r);
        raw
    }

    #[test]
    fn legacy_request_carries_the_remote_srq_number() {
        let raw = filled(&SendOp::SendWithImm(9), Some(0x00ab_cdef));
        assert_eq!(raw.opcode, ffi::IBV_WR_SEND_WITH_IMM);
        // SAFETY: `xrc` is the union's only member, just written.
        assert_eq!(unsafe { raw.qp_type.xrc.remote_srqn }, 0x00ab_cdef);
        // SAFETY: the immediate-data member was written for SEND_WITH_IMM.
        assert_eq!(unsafe { raw.__bindgen_anon_1.imm_data }, 9u32.to_be());

        let raw = filled(&SendOp::Write(REMOTE), Some(3));
        // SAFETY: as above.
        assert_eq!(unsafe { raw.qp_type.xrc.remote_srqn }, 3);
        // SAFETY: the rdma member was written for RDMA WRITE.
        let rdma = unsafe { raw.wr.rdma };
        assert_eq!((rdma.remote_addr, rdma.rkey), (REMOTE.addr, REMOTE.rkey));

        // Without one the field stays zero.
        let raw = filled(&SendOp::Send, None);
        // SAFETY: as above (zeroed by Default).
        assert_eq!(unsafe { raw.qp_type.xrc.remote_srqn }, 0);
    }
}
