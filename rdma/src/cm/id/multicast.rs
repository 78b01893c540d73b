//! Multicast groups (`rdma_join_multicast(3)`, `rdma_leave_multicast(3)`).

use std::sync::atomic::Ordering;

use super::locking::{Access, Start};
use super::{addr_context, verb, CmId};
use crate::cm::addr::{to_sockaddr, CmAddr};
use crate::error::{Error, Result};
use crate::ffi;

/// Multicast join flags (`enum rdma_cm_mc_join_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum McJoinFlags {
    /// Send and receive.
    FullMember,
    /// Send only: the QP is not attached to the group.
    SendOnlyFullMember,
}

impl CmId {
    /// Joins a multicast group (`rdma_join_multicast(3)`); a
    /// `MULTICAST_JOIN` event with the group's address follows. A QP
    /// librdmacm made is attached to the group.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_join_multicast`.
    pub fn join_multicast(&self, addr: impl Into<CmAddr>) -> Result<()> {
        let addr = addr.into();
        let (mut sa, _) = to_sockaddr("rdma_join_multicast", &addr)?;
        self.start(Start::Multicast, Access::Exclusive, |raw, _| {
            // SAFETY: valid id and address (copied by librdmacm).
            let rc = unsafe {
                ffi::rdma_join_multicast(
                    raw,
                    std::ptr::addr_of_mut!(sa).cast(),
                    std::ptr::null_mut(),
                )
            };
            verb("rdma_join_multicast", || addr_context(&addr), rc)
        })
    }

    /// Joins a multicast group with `flags` (`rdma_join_multicast_ex(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_join_multicast_ex` (`EOPNOTSUPP`/`EINVAL`
    /// where the kernel lacks send-only joins).
    pub fn join_multicast_ex(&self, addr: impl Into<CmAddr>, flags: McJoinFlags) -> Result<()> {
        let addr = addr.into();
        let (mut sa, _) = to_sockaddr("rdma_join_multicast_ex", &addr)?;
        let mut attr = ffi::rdma_cm_join_mc_attr_ex {
            comp_mask: ffi::RDMA_CM_JOIN_MC_ATTR_ADDRESS | ffi::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
            join_flags: match flags {
                McJoinFlags::FullMember => ffi::RDMA_MC_JOIN_FLAG_FULLMEMBER,
                McJoinFlags::SendOnlyFullMember => ffi::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
            },
            addr: std::ptr::addr_of_mut!(sa).cast(),
        };
        self.start(Start::Multicast, Access::Exclusive, |raw, _| {
            // SAFETY: valid id; `attr` and the address live for the call.
            let rc = unsafe { ffi::rdma_join_multicast_ex(raw, &mut attr, std::ptr::null_mut()) };
            verb(
                "rdma_join_multicast_ex",
                || format!("{} {flags:?}", addr_context(&addr)),
                rc,
            )
        })
    }

    /// Leaves a multicast group (`rdma_leave_multicast(3)`).
    ///
    /// # Errors
    /// `EBUSY` while events of the id are held (librdmacm would wait for
    /// them forever); `EADDRNOTAVAIL` for a group not joined;
    /// [`Error::Verb`] naming `rdma_leave_multicast`.
    pub fn leave_multicast(&self, addr: impl Into<CmAddr>) -> Result<()> {
        let addr = addr.into();
        if self.inner.outstanding.load(Ordering::Acquire) != 0 {
            return Err(Error::verb_errno(
                "rdma_leave_multicast",
                "events of the id are still held: drop them first",
                libc::EBUSY,
            ));
        }
        let (mut sa, _) = to_sockaddr("rdma_leave_multicast", &addr)?;
        // SAFETY: valid id and address.
        let rc = self.with(Access::Exclusive, |raw, _| unsafe {
            ffi::rdma_leave_multicast(raw, std::ptr::addr_of_mut!(sa).cast())
        });
        verb("rdma_leave_multicast", || addr_context(&addr), rc)
    }
}
