//! On-demand paging capabilities ([`OdpCaps`], from `ibv_query_device_ex`)
//! and the checks every ODP entry point makes before calling into C: the
//! kernel answers `IBV_ACCESS_ON_DEMAND` on a device without ODP with a bare
//! `EINVAL`, so a missing capability is reported as [`Error::Unsupported`]
//! first. Below the memory regions, whose registration checks them; the
//! implicit regions and `ibv_advise_mr` are in `odp.rs`.

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::{ffi, Context, DeviceAttr};

bitflags::bitflags! {
    /// General on-demand paging capabilities (`enum ibv_odp_general_caps`).
    /// Unknown bits are kept.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct OdpGeneralCaps: u64 {
        /// On-demand paging is supported (`IBV_ODP_SUPPORT`).
        const SUPPORT = ffi::IBV_ODP_SUPPORT as u64;
        /// Implicit registrations of the whole address space are supported
        /// (`IBV_ODP_SUPPORT_IMPLICIT`).
        const SUPPORT_IMPLICIT = ffi::IBV_ODP_SUPPORT_IMPLICIT as u64;
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// What one transport may do with on-demand paged memory
    /// (`enum ibv_odp_transport_cap_bits`). Unknown bits are kept.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct OdpTransportCaps: u32 {
        /// Sends from ODP memory.
        const SEND = ffi::IBV_ODP_SUPPORT_SEND;
        /// Receives into ODP memory.
        const RECV = ffi::IBV_ODP_SUPPORT_RECV;
        /// RDMA WRITE to or from ODP memory.
        const WRITE = ffi::IBV_ODP_SUPPORT_WRITE;
        /// RDMA READ to or from ODP memory.
        const READ = ffi::IBV_ODP_SUPPORT_READ;
        /// Atomics on ODP memory.
        const ATOMIC = ffi::IBV_ODP_SUPPORT_ATOMIC;
        /// SRQ receives into ODP memory.
        const SRQ_RECV = ffi::IBV_ODP_SUPPORT_SRQ_RECV;
        const _ = !0;
    }
}

/// A device's on-demand paging capabilities (`struct ibv_odp_caps` and
/// `xrc_odp_caps` of `struct ibv_device_attr_ex`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct OdpCaps {
    /// `general_caps`.
    pub general: OdpGeneralCaps,
    /// `per_transport_caps.rc_odp_caps`.
    pub rc: OdpTransportCaps,
    /// `per_transport_caps.uc_odp_caps`.
    pub uc: OdpTransportCaps,
    /// `per_transport_caps.ud_odp_caps`.
    pub ud: OdpTransportCaps,
    /// `xrc_odp_caps`.
    pub xrc: OdpTransportCaps,
}

impl OdpCaps {
    /// True when the device can register memory on demand at all.
    pub fn supported(&self) -> bool {
        self.general.contains(OdpGeneralCaps::SUPPORT)
    }

    /// True when the device can register the whole address space implicitly.
    pub fn implicit_supported(&self) -> bool {
        self.general
            .contains(OdpGeneralCaps::SUPPORT | OdpGeneralCaps::SUPPORT_IMPLICIT)
    }
}

impl DeviceAttr {
    /// The device's on-demand paging capabilities, typed.
    pub fn odp_caps(&self) -> OdpCaps {
        let raw = self.as_raw();
        let t = &raw.odp_caps.per_transport_caps;
        OdpCaps {
            general: OdpGeneralCaps::from_bits_retain(raw.odp_caps.general_caps),
            rc: OdpTransportCaps::from_bits_retain(t.rc_odp_caps),
            uc: OdpTransportCaps::from_bits_retain(t.uc_odp_caps),
            ud: OdpTransportCaps::from_bits_retain(t.ud_odp_caps),
            xrc: OdpTransportCaps::from_bits_retain(raw.xrc_odp_caps),
        }
    }
}

pub(crate) const ODP: &str = "on-demand paging (IBV_ACCESS_ON_DEMAND)";
pub(crate) const IMPLICIT_ODP: &str = "implicit on-demand paging (IBV_ODP_SUPPORT_IMPLICIT)";

/// Fails with [`Error::Unsupported`] unless `ctx` reports ODP (and implicit
/// ODP when `implicit`). Costs one `ibv_query_device_ex`.
pub(crate) fn require_odp(ctx: &Context, implicit: bool) -> Result<()> {
    let caps = ctx.query_device()?.odp_caps();
    let (ok, what) = if implicit {
        (caps.implicit_supported(), IMPLICIT_ODP)
    } else {
        (caps.supported(), ODP)
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Unsupported {
            what: Cow::Owned(format!("{what}: general_odp_caps {:#x}", caps.general)),
            device: ctx.name().to_string(),
            source: None,
        })
    }
}

/// Turns `EOPNOTSUPP`/`ENOSYS` from an ODP verb into [`Error::Unsupported`].
pub(crate) fn odp_unsupported(e: Error, what: &'static str, ctx: &Context) -> Error {
    match e.errno() {
        Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) if matches!(e, Error::Verb { .. }) => {
            Error::Unsupported {
                what: what.into(),
                device: ctx.name().to_string(),
                source: Some(std::io::Error::from_raw_os_error(errno)),
            }
        }
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_keep_unknown_bits() {
        let g = OdpGeneralCaps::from_bits_retain(0x8000_0003);
        assert!(g.contains(OdpGeneralCaps::SUPPORT | OdpGeneralCaps::SUPPORT_IMPLICIT));
        assert_eq!(g.bits(), 0x8000_0003);
        let t = OdpTransportCaps::from_bits_retain(0x41);
        assert!(t.contains(OdpTransportCaps::SEND));
        assert_eq!(t.bits(), 0x41);
    }

    #[test]
    fn implicit_needs_both_bits() {
        let mut caps = DeviceAttr::from_raw(Default::default()).odp_caps();
        assert!(!caps.supported() && !caps.implicit_supported());
        caps.general = OdpGeneralCaps::SUPPORT_IMPLICIT;
        assert!(!caps.implicit_supported());
        caps.general |= OdpGeneralCaps::SUPPORT;
        assert!(caps.supported() && caps.implicit_supported());
    }
}
