//! Options of an id (`rdma_set_option(3)`) and the ECE options it carries
//! (`rdma_set_local_ece(3)`, `rdma_get_remote_ece(3)`).

use std::ffi::{c_int, c_void};
use std::fmt;

use super::locking::{Access, Start};
use super::{verb, CmId, IdState};
use crate::error::Result;
#[allow(unused_imports)] // used by the docs below
use crate::Error;
use crate::{ffi, Ece};

/// An option for [`CmId::set_option`] (`rdma_set_option(3)`).
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum CmOption<'a> {
    /// `RDMA_OPTION_ID_TOS`: the type of service (RFC 2474) of the
    /// connection's traffic; set before resolving the route.
    Tos(u8),
    /// `RDMA_OPTION_ID_REUSEADDR`: let the port be reused (set before
    /// binding).
    ReuseAddr(bool),
    /// `RDMA_OPTION_ID_AFONLY`: an IPv6 id does not accept IPv4 (set before
    /// binding).
    AfOnly(bool),
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's ACK timeout exponent
    /// (4.096 µs × 2^timeout).
    AckTimeout(u8),
    /// `RDMA_OPTION_IB_PATH`: InfiniBand path records to use instead of
    /// resolving the route.
    IbPath(&'a [ffi::ibv_path_data]),
}

impl fmt::Debug for CmOption<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmOption::Tos(v) => write!(f, "Tos({v})"),
            CmOption::ReuseAddr(v) => write!(f, "ReuseAddr({v})"),
            CmOption::AfOnly(v) => write!(f, "AfOnly({v})"),
            CmOption::AckTimeout(v) => write!(f, "AckTimeout({v})"),
            CmOption::IbPath(p) => write!(f, "IbPath({} paths)", p.len()),
        }
    }
}

impl CmId {
    /// Sets an option (`rdma_set_option(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_set_option` (`EINVAL` for an option the
    /// id's state does not allow, e.g. `AfOnly` after binding).
    pub fn set_option(&self, option: CmOption<'_>) -> Result<()> {
        let mut byte: u8 = 0;
        let mut int: c_int = 0;
        let (level, name, ptr, len): (u32, u32, *mut c_void, usize) = match option {
            CmOption::Tos(v) => {
                byte = v;
                (
                    ffi::RDMA_OPTION_ID,
                    ffi::RDMA_OPTION_ID_TOS,
                    std::ptr::addr_of_mut!(byte).cast(),
                    1,
                )
            }
            CmOption::AckTimeout(v) => {
                byte = v;
                (
                    ffi::RDMA_OPTION_ID,
                    ffi::RDMA_OPTION_ID_ACK_TIMEOUT,
                    std::ptr::addr_of_mut!(byte).cast(),
                    1,
                )
            }
            CmOption::ReuseAddr(v) | CmOption::AfOnly(v) => {
                int = c_int::from(v);
                let name = if matches!(option, CmOption::ReuseAddr(_)) {
                    ffi::RDMA_OPTION_ID_REUSEADDR
                } else {
                    ffi::RDMA_OPTION_ID_AFONLY
                };
                (
                    ffi::RDMA_OPTION_ID,
                    name,
                    std::ptr::addr_of_mut!(int).cast(),
                    std::mem::size_of::<c_int>(),
                )
            }
            CmOption::IbPath(paths) => (
                ffi::RDMA_OPTION_IB,
                ffi::RDMA_OPTION_IB_PATH,
                paths.as_ptr().cast_mut().cast(),
                std::mem::size_of_val(paths),
            ),
        };
        let call = |raw: *mut ffi::rdma_cm_id, _: &mut IdState| {
            // SAFETY: valid id; `ptr` points at `len` bytes alive for the
            // call (the kernel only reads them).
            let rc = unsafe { ffi::rdma_set_option(raw, level as c_int, name as c_int, ptr, len) };
            verb("rdma_set_option", || format!("{option:?}"), rc)
        };
        // Setting the path records resolves the route: the kernel queues a
        // ROUTE_RESOLVED, as for rdma_resolve_route. The other options only
        // reach the kernel.
        let r = if matches!(option, CmOption::IbPath(_)) {
            self.start(Start::Route, Access::Stable, call)
        } else {
            self.with(Access::Stable, call)
        };
        let _ = (byte, int);
        r
    }

    /// Sets the ECE options this side proposes (`rdma_set_local_ece(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_set_local_ece` (`EOPNOTSUPP` where the
    /// device has no ECE).
    pub fn set_local_ece(&self, ece: Ece) -> Result<()> {
        let mut raw_ece = ece.to_raw();
        // SAFETY: valid id and struct.
        let rc = self.with(Access::Conn, |raw, _| unsafe {
            ffi::rdma_set_local_ece(raw, &mut raw_ece)
        });
        verb("rdma_set_local_ece", || format!("{ece:?}"), rc)
    }

    /// The ECE options the peer proposed (`rdma_get_remote_ece(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_get_remote_ece`.
    pub fn remote_ece(&self) -> Result<Ece> {
        let mut e = ffi::ibv_ece::default();
        // SAFETY: valid id and out-struct.
        let rc = self.with(Access::Conn, |raw, _| unsafe {
            ffi::rdma_get_remote_ece(raw, &mut e)
        });
        verb("rdma_get_remote_ece", String::new, rc)?;
        Ok(Ece::from_raw(&e))
    }
}
