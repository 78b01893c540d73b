//! The parameters of a connection ([`ConnParam`]: what a connect or an
//! accept sends, what its events carry) and of a datagram peer
//! ([`UdParam`]). Plain values: ids take them, events report them.

#[cfg(doc)]
use super::CmId;
use crate::{ffi, AhAttr, Error};

/// Connection parameters (`struct rdma_conn_param`): what
/// [`CmId::connect`] and [`CmId::accept`] send, and what a connect request,
/// response or established event carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer. Its room depends on the transport and port
    /// space: an InfiniBand/RoCE REQ carries 56 bytes in the TCP and UDP port
    /// spaces (92 in the IB port space), a REP 196, a REJ 148; iWARP and the
    /// C interface's `uint8_t` length cap everything at 255.
    pub private_data: Vec<u8>,
    /// Outstanding RDMA READ/atomics the peer may send us (255: the
    /// device's maximum).
    pub responder_resources: u8,
    /// Outstanding RDMA READ/atomics we may send (255: the device's maximum).
    pub initiator_depth: u8,
    /// Hardware flow control.
    pub flow_control: u8,
    /// Transport retries (ignored when accepting). Soft-RoCE takes 7 as
    /// "retry forever", like the RNR count (measured on Linux 6.1: sends
    /// across a cut link stayed pending; with 6 they failed with
    /// `RetryExcErr`), so a connection that must notice a dead peer or link
    /// on rxe asks for at most 6.
    pub retry_count: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ (set from the QP by the `_qp` helpers).
    pub srq: bool,
    /// The QP number (set from the QP by the `_qp` helpers).
    pub qp_num: u32,
}

impl Default for ConnParam {
    /// No private data, the device's maximum READ/atomic depths, 7 retries,
    /// infinite RNR retries.
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: ffi::RDMA_MAX_RESP_RES as u8,
            initiator_depth: ffi::RDMA_MAX_INIT_DEPTH as u8,
            flow_control: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

impl ConnParam {
    /// The defaults, with `private_data`.
    pub fn with_private_data(data: &[u8]) -> Self {
        ConnParam {
            private_data: data.to_vec(),
            ..Self::default()
        }
    }

    /// The C struct; it points into `self.private_data`.
    pub(crate) fn to_raw(&self) -> crate::Result<ffi::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len()).map_err(|_| Error::InvalidArgument {
            verb: "rdma_connect",
            reason: format!(
                "{} bytes of private data: the connection manager carries at most 255",
                self.private_data.len()
            ),
        })?;
        Ok(ffi::rdma_conn_param {
            private_data: if len == 0 {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: u8::from(self.srq),
            qp_num: self.qp_num,
        })
    }

    /// # Safety
    /// `raw.private_data` points at `private_data_len` readable bytes (or the
    /// length is 0).
    pub(crate) unsafe fn from_raw(raw: &ffi::rdma_conn_param) -> Self {
        ConnParam {
            // SAFETY: per the contract.
            private_data: unsafe { bytes(raw.private_data, raw.private_data_len) },
            responder_resources: raw.responder_resources,
            initiator_depth: raw.initiator_depth,
            flow_control: raw.flow_control,
            retry_count: raw.retry_count,
            rnr_retry_count: raw.rnr_retry_count,
            srq: raw.srq != 0,
            qp_num: raw.qp_num,
        }
    }
}

/// # Safety
/// `p` points at `len` readable bytes, or `len` is 0.
pub(super) unsafe fn bytes(p: *const std::ffi::c_void, len: u8) -> Vec<u8> {
    if p.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), usize::from(len)) }.to_vec()
}

/// Datagram parameters (`struct rdma_ud_param`) of a UDP/IPoIB port space
/// event or a multicast join: where to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// Private data (none for multicast events).
    pub private_data: Vec<u8>,
    /// The address to build an address handle from.
    pub ah_attr: AhAttr,
    /// The remote QP number (`0xffffff` for a multicast group).
    pub qp_num: u32,
    /// The remote Q_Key.
    pub qkey: u32,
}
