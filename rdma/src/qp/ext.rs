//! Queue pair verbs beyond creation, state changes and posting:
//! enhanced connection establishment (`ibv_query_ece(3)`, `ibv_set_ece(3)`)
//! and data placement order (`ibv_query_qp_data_in_order(3)`).

use std::borrow::Cow;

use super::QueuePair;
use crate::error::{check_errno_ret, Error, Result};
use crate::ffi;
use crate::wr::WrOpcode;
use crate::Ece;

impl QueuePair {
    fn describe(&self, what: impl std::fmt::Display) -> Cow<'static, str> {
        Cow::Owned(format!(
            "QP {} on {}: {what}",
            self.qp_num(),
            self.pd().context().name()
        ))
    }

    fn ece_error(&self, verb: &'static str, rc: std::ffi::c_int, what: String) -> Result<()> {
        if rc == libc::EOPNOTSUPP || rc == libc::ENOSYS {
            return Err(Error::Unsupported {
                what: format!("enhanced connection establishment ({verb})").into(),
                device: self.pd().context().name().to_string(),
                source: Some(std::io::Error::from_raw_os_error(rc)),
            });
        }
        check_errno_ret(verb, || self.describe(what), rc)
    }

    /// The ECE options the QP accepted (`ibv_query_ece(3)`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no ECE (`EOPNOTSUPP`:
    /// soft-RoCE, soft-iWARP); [`Error::Verb`] naming `ibv_query_ece`.
    pub fn query_ece(&self) -> Result<Ece> {
        let mut raw = ffi::ibv_ece::default();
        // SAFETY: valid QP and out-struct.
        let rc = unsafe { ffi::ibv_query_ece(self.as_raw(), &mut raw) };
        self.ece_error("ibv_query_ece", rc, "query".into())?;
        Ok(Ece {
            vendor_id: raw.vendor_id,
            options: raw.options,
        })
    }

    /// Sets the ECE options the QP proposes or accepts (`ibv_set_ece(3)`),
    /// before it moves to RTR; for connections made without the connection
    /// manager.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no ECE (`EOPNOTSUPP`:
    /// soft-RoCE, soft-iWARP); [`Error::Verb`] naming `ibv_set_ece` (e.g.
    /// `EINVAL` for options the device does not know).
    pub fn set_ece(&self, ece: Ece) -> Result<()> {
        let mut raw = ffi::ibv_ece {
            vendor_id: ece.vendor_id,
            options: ece.options,
            comp_mask: 0,
        };
        // SAFETY: valid QP and struct, which the verb only reads.
        let rc = unsafe { ffi::ibv_set_ece(self.as_raw(), &mut raw) };
        self.ece_error("ibv_set_ece", rc, format!("{ece:?}"))
    }

    /// Whether the device writes the data of `op` requests arriving on this
    /// QP in order, so that the last byte landing means every byte landed
    /// (`ibv_query_qp_data_in_order(3)`). `false` also when the provider
    /// cannot tell (libibverbs answers 0 for providers without the query).
    pub fn query_qp_data_in_order(&self, op: WrOpcode) -> bool {
        // SAFETY: valid QP; flags must be 0 in this rdma-core version.
        let rc = unsafe { ffi::ibv_query_qp_data_in_order(self.as_raw(), op.to_raw(), 0) };
        rc == 1
    }
}
