//! Address handles and address vectors (`ibv_create_ah(3)`; the handle
//! that answers a received completion, `ibv_create_ah_from_wc(3)`, is made
//! in `wc.rs`, above the completions it reads).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{call_ptr, Result};
use crate::{ffi, Gid, ProtectionDomain};

/// The global route header of an address (RoCE always needs one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index (for RoCE v2 over IPv4: the IPv4-mapped GID's index).
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// An address vector (`struct ibv_ah_attr`): where packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (0: port rate).
    pub static_rate: u8,
    /// Local port.
    pub port_num: u8,
    /// The GRH, required on RoCE.
    pub grh: Option<GlobalRoute>,
}

impl AhAttr {
    /// An address over a GRH (RoCE, or InfiniBand across subnets).
    pub fn global(port_num: u8, dgid: Gid, sgid_index: u8) -> Self {
        AhAttr {
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port_num,
            grh: Some(GlobalRoute {
                dgid,
                flow_label: 0,
                sgid_index,
                hop_limit: 1,
                traffic_class: 0,
            }),
        }
    }

    /// An address by LID (InfiniBand, same subnet).
    pub fn local(port_num: u8, dlid: u16) -> Self {
        AhAttr {
            dlid,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port_num,
            grh: None,
        }
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_ah_attr {
        let mut raw = ffi::ibv_ah_attr {
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            port_num: self.port_num,
            ..Default::default()
        };
        if let Some(g) = self.grh {
            raw.is_global = 1;
            raw.grh = ffi::ibv_global_route {
                dgid: g.dgid.to_ffi(),
                flow_label: g.flow_label,
                sgid_index: g.sgid_index,
                hop_limit: g.hop_limit,
                traffic_class: g.traffic_class,
            };
        }
        raw
    }

    pub(crate) fn from_raw(raw: &ffi::ibv_ah_attr) -> Self {
        AhAttr {
            dlid: raw.dlid,
            sl: raw.sl,
            src_path_bits: raw.src_path_bits,
            static_rate: raw.static_rate,
            port_num: raw.port_num,
            grh: (raw.is_global != 0).then(|| GlobalRoute {
                // SAFETY: any bit pattern is a valid `[u8; 16]`.
                dgid: Gid::from_raw(unsafe { raw.grh.dgid.raw }),
                flow_label: raw.grh.flow_label,
                sgid_index: raw.grh.sgid_index,
                hop_limit: raw.grh.hop_limit,
                traffic_class: raw.grh.traffic_class,
            }),
        }
    }
}

pub(crate) struct AhInner {
    ah: NonNull<ffi::ibv_ah>,
    // Dropped after the AH is destroyed (field order).
    pd: ProtectionDomain,
}

// SAFETY: an AH is an immutable kernel/provider object after creation.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: every in-flight UD send that uses the AH holds an Arc to it;
        // destroyed once.
        let rc = unsafe { ffi::ibv_destroy_ah(self.ah.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!("ibv_destroy_ah failed: errno {rc}"));
        }
    }
}

/// An address handle (`struct ibv_ah`) for UD sends. A cheap `Clone` handle;
/// a UD send in flight keeps its AH alive.
///
/// ```no_run
/// # fn f(pd: &rdma::ProtectionDomain, peer: rdma::Gid) -> rdma::Result<()> {
/// // The route to a UD peer, named by its GID (RoCE) on port 1, source GID 1.
/// let ah = pd.create_ah(&rdma::AhAttr::global(1, peer, 1))?;
/// # let _ = ah;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AddressHandle {
    inner: Arc<AhInner>,
}

impl ProtectionDomain {
    /// Creates an address handle (`ibv_create_ah(3)`).
    ///
    /// # Errors
    /// [`crate::Error::Verb`] naming `ibv_create_ah` (e.g. `EINVAL` for a
    /// RoCE address without GRH, or a bad sgid index).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        let mut raw = attr.to_raw();
        let ah = call_ptr(
            "ibv_create_ah",
            || format!("{attr:?}").into(),
            || {
                // SAFETY: valid PD and attribute struct.
                unsafe { ffi::ibv_create_ah(self.as_raw(), &mut raw) }
            },
        )?;
        Ok(AddressHandle {
            inner: Arc::new(AhInner {
                ah,
                pd: self.clone(),
            }),
        })
    }
}

impl AddressHandle {
    /// The raw AH, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_ah {
        self.inner.ah.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("ah", &self.inner.ah)
            .finish()
    }
}
