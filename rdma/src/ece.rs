//! Enhanced connection establishment (`struct ibv_ece`): options a QP
//! proposes and accepts (`ibv_set_ece(3)`, `ibv_query_ece(3)`), which the
//! connection manager carries in its messages (`rdma_set_local_ece(3)`,
//! `rdma_get_remote_ece(3)`).

use crate::ffi;

/// Enhanced connection establishment options (`struct ibv_ece`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    /// The vendor (IEEE OUI).
    pub vendor_id: u32,
    /// Vendor-specific option bits.
    pub options: u32,
}

impl Ece {
    /// The C struct, with `comp_mask` 0.
    pub(crate) fn to_raw(self) -> ffi::ibv_ece {
        ffi::ibv_ece {
            vendor_id: self.vendor_id,
            options: self.options,
            comp_mask: 0,
        }
    }

    /// The options of a C struct (its `comp_mask` is not kept).
    pub(crate) fn from_raw(raw: &ffi::ibv_ece) -> Self {
        Ece {
            vendor_id: raw.vendor_id,
            options: raw.options,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_c_struct() {
        let ece = Ece {
            vendor_id: 0x02c9,
            options: 0x8000_0001,
        };
        let raw = ece.to_raw();
        assert_eq!(
            (raw.vendor_id, raw.options, raw.comp_mask),
            (0x02c9, 0x8000_0001, 0)
        );
        assert_eq!(Ece::from_raw(&raw), ece);
    }
}
