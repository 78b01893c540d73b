//! The private data each connection message can carry: at most 255 bytes
//! through librdmacm's interface, and on InfiniBand/RoCE what the CM's
//! message has room for (`ib_cm.h`), less the IP header the CM puts in front
//! of a request outside the IB port space. Checked before the verb, so that
//! too much data is a clear error rather than the kernel's `EINVAL`.

use super::CmId;
use crate::cm::PortSpace;
use crate::error::{Error, Result};
use crate::ffi;

/// The limits of private data per message on InfiniBand/RoCE (`ib_cm.h`),
/// and the IP header the CM puts in front of a REQ outside the IB port space.
const IB_REQ: usize = 92;
const IB_REP: usize = 196;
const IB_REJ: usize = 148;
const IB_SIDR_REQ: usize = 216;
const IB_SIDR_REP: usize = 136;
const CMA_IP_HEADER: usize = 36;

#[derive(Clone, Copy)]
pub(super) enum Message {
    Connect,
    Accept,
    Reject,
}

impl CmId {
    pub(super) fn check_private_data(
        &self,
        raw: *mut ffi::rdma_cm_id,
        data: &[u8],
        msg: Message,
        verb: &'static str,
    ) -> Result<()> {
        let too_long = |limit: usize, what: &str| Error::InvalidArgument {
            verb,
            reason: format!(
                "{} bytes of private data, but {what} carries at most {limit}",
                data.len()
            ),
        };
        if data.len() > 255 {
            return Err(too_long(255, "the connection manager's interface"));
        }
        // SAFETY: the caller holds the id's locks; the device outlives the id.
        let transport = unsafe {
            let verbs = (*raw).verbs;
            if verbs.is_null() {
                return Ok(());
            }
            (*(*verbs).device).transport_type
        };
        if transport != ffi::IBV_TRANSPORT_IB {
            return Ok(());
        }
        let header = if self.inner.ps == PortSpace::Ib {
            0
        } else {
            CMA_IP_HEADER
        };
        let datagram = self.inner.ps.is_datagram();
        let (limit, what) = match (msg, datagram) {
            (Message::Connect, false) => {
                (IB_REQ - header, "an InfiniBand/RoCE REQ in this port space")
            }
            (Message::Connect, true) => (
                IB_SIDR_REQ - header,
                "an InfiniBand/RoCE SIDR REQ in this port space",
            ),
            (Message::Accept, false) => (IB_REP, "an InfiniBand/RoCE REP"),
            (Message::Reject, false) => (IB_REJ, "an InfiniBand/RoCE REJ"),
            (_, true) => (IB_SIDR_REP, "an InfiniBand/RoCE SIDR REP"),
        };
        if data.len() > limit {
            return Err(too_long(limit, what));
        }
        Ok(())
    }
}
