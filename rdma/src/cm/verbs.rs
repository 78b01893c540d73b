//! The helpers of `rdma_verbs.h` (`rdma_reg_msgs(3)`, `rdma_post_send(3)`,
//! `rdma_get_send_comp(3)`, ...).
//!
//! - Registration (`rdma_reg_msgs`, `rdma_reg_read`, `rdma_reg_write`)
//!   registers in the id's PD ([`CmId::pd`]) with the same access flags, as
//!   a crate [`MemoryRegion`] that owns its memory; `rdma_dereg_mr` is
//!   dropping it (or [`MemoryRegion::destroy`]).
//! - Posting: the safe way is the QP's own post path
//!   ([`QueuePair::post_send`], [`QueuePair::post_recv`]), where the memory
//!   moves into the queue and comes back with the completion. The C helpers
//!   (`rdma_post_*`) post to the id's librdmacm QP with a raw `wr_id`; they
//!   are `unsafe` here, with the same contract as [`QueuePair::post_send_raw`].
//! - Completions (`rdma_get_send_comp`, `rdma_get_recv_comp`) wait on the
//!   QP's CQs: poll, arm, poll again, wait on the CQ's channel.

use std::ffi::c_void;

use super::CmId;
use crate::error::{check_minus_one, Error, Result};
use crate::{
    ffi, AccessFlags, AddressHandle, Completion, CompletionQueue, MemoryRegion, QueuePair,
    RemoteMemory, SendFlags,
};

impl CmId {
    /// Registers `buf` for sends and receives in the id's PD (what
    /// `rdma_reg_msgs(3)` does): `LOCAL_WRITE`.
    ///
    /// # Errors
    /// As [`CmId::pd`] and [`crate::ProtectionDomain::reg_mr`].
    pub fn reg_msgs(&self, buf: impl Into<Box<[u8]>>) -> Result<MemoryRegion> {
        self.pd()?.reg_mr(buf, AccessFlags::LOCAL_WRITE)
    }

    /// Registers `buf` as an RDMA READ source for the peer (what
    /// `rdma_reg_read(3)` does): `LOCAL_WRITE | REMOTE_READ`.
    ///
    /// # Errors
    /// As [`CmId::reg_msgs`].
    pub fn reg_read(&self, buf: impl Into<Box<[u8]>>) -> Result<MemoryRegion> {
        self.pd()?
            .reg_mr(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
    }

    /// Registers `buf` as an RDMA WRITE target for the peer (what
    /// `rdma_reg_write(3)` does): `LOCAL_WRITE | REMOTE_WRITE`. The peer may
    /// write it at any time: read it with [`MemoryRegion::read_at`].
    ///
    /// # Errors
    /// As [`CmId::reg_msgs`].
    pub fn reg_write(&self, buf: impl Into<Box<[u8]>>) -> Result<MemoryRegion> {
        self.pd()?
            .reg_mr(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
    }

    fn posting(&self, verb: &'static str, context: u64) -> Result<*mut ffi::rdma_cm_id> {
        if context & (1 << 63) != 0 {
            return Err(Error::InvalidArgument {
                verb,
                reason: format!(
                    "context {context:#x} has bit 63 set (reserved for the safe post path)"
                ),
            });
        }
        if self.raw_qp().is_null() {
            return Err(Error::verb_errno(
                verb,
                "the id has no librdmacm QP (CmId::create_qp)",
                libc::EINVAL,
            ));
        }
        Ok(self.as_raw())
    }

    /// Posts a receive of `mr` on the id's QP (`rdma_post_recv(3)`), with
    /// `context` as the `wr_id`.
    ///
    /// # Safety
    /// The memory of `mr` must stay valid and must not be read or written
    /// except through the device until the receive's completion is polled or
    /// the QP is destroyed (keep `mr` alive and unused until then).
    ///
    /// # Errors
    /// `EINVAL` without a librdmacm QP; [`Error::InvalidArgument`] for a
    /// `context` with bit 63 set; [`Error::Verb`] naming `rdma_post_recv`.
    pub unsafe fn post_recv_raw(&self, context: u64, mr: &MemoryRegion) -> Result<()> {
        let id = self.posting("rdma_post_recv", context)?;
        // SAFETY: the id has a QP; the caller keeps the memory valid.
        let rc = unsafe {
            ffi::rdma_post_recv(
                id,
                context as *mut c_void,
                mr.addr() as *mut c_void,
                mr.len(),
                mr.as_raw(),
            )
        };
        check_minus_one("rdma_post_recv", || "".into(), rc).map(|_| ())
    }

    /// Posts a receive scattering into `mrs` (`rdma_post_recvv(3)`).
    ///
    /// # Safety
    /// As [`CmId::post_recv_raw`], for every region.
    ///
    /// # Errors
    /// As [`CmId::post_recv_raw`], naming `rdma_post_recvv`.
    pub unsafe fn post_recvv_raw(&self, context: u64, mrs: &[&MemoryRegion]) -> Result<()> {
        let id = self.posting("rdma_post_recvv", context)?;
        let mut sges = sge_list(mrs)?;
        // SAFETY: as above; the list is copied by the provider.
        let rc = unsafe {
            ffi::rdma_post_recvv(
                id,
                context as *mut c_void,
                sges.as_mut_ptr(),
                sges.len() as i32,
            )
        };
        check_minus_one("rdma_post_recvv", || "".into(), rc).map(|_| ())
    }

    /// Sends `mr` on the id's QP (`rdma_post_send(3)`).
    ///
    /// # Safety
    /// The memory of `mr` must stay valid and unchanged until the send's
    /// completion is polled (or a later signaled one) or the QP is destroyed.
    ///
    /// # Errors
    /// As [`CmId::post_recv_raw`], naming `rdma_post_send`.
    pub unsafe fn post_send_raw(
        &self,
        context: u64,
        mr: &MemoryRegion,
        flags: SendFlags,
    ) -> Result<()> {
        let id = self.posting("rdma_post_send", context)?;
        // SAFETY: as above.
        let rc = unsafe {
            ffi::rdma_post_send(
                id,
                context as *mut c_void,
                mr.addr() as *mut c_void,
                mr.len(),
                mr.as_raw(),
                flags.bits() as i32,
            )
        };
        check_minus_one("rdma_post_send", || "".into(), rc).map(|_| ())
    }

    /// Sends the concatenation of `mrs` (`rdma_post_sendv(3)`).
    ///
    /// # Safety
    /// As [`CmId::post_send_raw`], for every region.
    ///
    /// # Errors
    /// As [`CmId::post_send_raw`], naming `rdma_post_sendv`.
    pub unsafe fn post_sendv_raw(
        &self,
        context: u64,
        mrs: &[&MemoryRegion],
        flags: SendFlags,
    ) -> Result<()> {
        let id = self.posting("rdma_post_sendv", context)?;
        let mut sges = sge_list(mrs)?;
        // SAFETY: as above.
        let rc = unsafe {
            ffi::rdma_post_sendv(
                id,
                context as *mut c_void,
                sges.as_mut_ptr(),
                sges.len() as i32,
                flags.bits() as i32,
            )
        };
        check_minus_one("rdma_post_sendv", || "".into(), rc).map(|_| ())
    }

    /// RDMA READs `remote` into `mr` (`rdma_post_read(3)`).
    ///
    /// # Safety
    /// As [`CmId::post_recv_raw`]: the device writes `mr` until the
    /// completion.
    ///
    /// # Errors
    /// As [`CmId::post_recv_raw`], naming `rdma_post_read`.
    pub unsafe fn post_read_raw(
        &self,
        context: u64,
        mr: &MemoryRegion,
        flags: SendFlags,
        remote: RemoteMemory,
    ) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.post_rdma(Rdma::Read, context, Local::One(mr), flags, remote) }
    }

    /// RDMA READs `remote` scattering into `mrs` (`rdma_post_readv(3)`).
    ///
    /// # Safety
    /// As [`CmId::post_read_raw`], for every region.
    ///
    /// # Errors
    /// As [`CmId::post_read_raw`], naming `rdma_post_readv`.
    pub unsafe fn post_readv_raw(
        &self,
        context: u64,
        mrs: &[&MemoryRegion],
        flags: SendFlags,
        remote: RemoteMemory,
    ) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.post_rdma(Rdma::Read, context, Local::Many(mrs), flags, remote) }
    }

    /// RDMA WRITEs `mr` to `remote` (`rdma_post_write(3)`).
    ///
    /// # Safety
    /// As [`CmId::post_send_raw`].
    ///
    /// # Errors
    /// As [`CmId::post_recv_raw`], naming `rdma_post_write`.
    pub unsafe fn post_write_raw(
        &self,
        context: u64,
        mr: &MemoryRegion,
        flags: SendFlags,
        remote: RemoteMemory,
    ) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.post_rdma(Rdma::Write, context, Local::One(mr), flags, remote) }
    }

    /// RDMA WRITEs the concatenation of `mrs` to `remote`
    /// (`rdma_post_writev(3)`).
    ///
    /// # Safety
    /// As [`CmId::post_send_raw`], for every region.
    ///
    /// # Errors
    /// As [`CmId::post_write_raw`], naming `rdma_post_writev`.
    pub unsafe fn post_writev_raw(
        &self,
        context: u64,
        mrs: &[&MemoryRegion],
        flags: SendFlags,
        remote: RemoteMemory,
    ) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.post_rdma(Rdma::Write, context, Local::Many(mrs), flags, remote) }
    }

    /// The RDMA READ and WRITE posts, each form: `rdma_post_read(3)` and
    /// `rdma_post_write(3)` are librdmacm's inline one-entry forms of the
    /// `v` calls (one `ibv_sge` over the region), so every form posts
    /// through `rdma_post_readv`/`rdma_post_writev`. Errors name the form
    /// the caller called.
    ///
    /// # Safety
    /// As [`CmId::post_read_raw`] (the device writes the local memory) for a
    /// READ, as [`CmId::post_write_raw`] (it reads it) for a WRITE.
    unsafe fn post_rdma(
        &self,
        op: Rdma,
        context: u64,
        local: Local<'_>,
        flags: SendFlags,
        remote: RemoteMemory,
    ) -> Result<()> {
        let verb = match (op, local) {
            (Rdma::Read, Local::One(_)) => "rdma_post_read",
            (Rdma::Read, Local::Many(_)) => "rdma_post_readv",
            (Rdma::Write, Local::One(_)) => "rdma_post_write",
            (Rdma::Write, Local::Many(_)) => "rdma_post_writev",
        };
        let id = self.posting(verb, context)?;
        let mut sges = match local {
            Local::One(mr) => vec![mr.sge()],
            Local::Many(mrs) => sge_list(mrs)?,
        };
        let post = match op {
            Rdma::Read => ffi::rdma_post_readv,
            Rdma::Write => ffi::rdma_post_writev,
        };
        // SAFETY: the id has a QP (`posting`); the caller keeps the memory
        // valid until the completion; the list is copied by the provider.
        let rc = unsafe {
            post(
                id,
                context as *mut c_void,
                sges.as_mut_ptr(),
                sges.len() as i32,
                flags.bits() as i32,
                remote.addr,
                remote.rkey,
            )
        };
        check_minus_one(verb, || "".into(), rc).map(|_| ())
    }

    /// Sends `mr` as a datagram to `ah`/`remote_qpn` with the UDP port
    /// space's Q_Key (`rdma_post_ud_send(3)`).
    ///
    /// # Safety
    /// As [`CmId::post_send_raw`]; `ah` must also stay alive until the
    /// completion.
    ///
    /// # Errors
    /// As [`CmId::post_recv_raw`], naming `rdma_post_ud_send`.
    pub unsafe fn post_ud_send_raw(
        &self,
        context: u64,
        mr: &MemoryRegion,
        flags: SendFlags,
        ah: &AddressHandle,
        remote_qpn: u32,
    ) -> Result<()> {
        let id = self.posting("rdma_post_ud_send", context)?;
        // SAFETY: as above.
        let rc = unsafe {
            ffi::rdma_post_ud_send(
                id,
                context as *mut c_void,
                mr.addr() as *mut c_void,
                mr.len(),
                mr.as_raw(),
                flags.bits() as i32,
                ah.as_raw(),
                remote_qpn,
            )
        };
        check_minus_one("rdma_post_ud_send", || "".into(), rc).map(|_| ())
    }

    /// Waits for the next completion of `qp`'s send CQ (what
    /// `rdma_get_send_comp(3)` does for librdmacm's CQs).
    ///
    /// # Errors
    /// As [`get_comp`].
    pub fn get_send_comp(&self, qp: &QueuePair) -> Result<Completion> {
        get_comp(qp.send_cq())
    }

    /// Waits for the next completion of `qp`'s receive CQ (what
    /// `rdma_get_recv_comp(3)` does).
    ///
    /// # Errors
    /// As [`get_comp`].
    pub fn get_recv_comp(&self, qp: &QueuePair) -> Result<Completion> {
        get_comp(qp.recv_cq())
    }
}

/// An RDMA post's direction.
#[derive(Clone, Copy)]
enum Rdma {
    Read,
    Write,
}

/// An RDMA post's local memory: one region, or a scatter/gather list.
#[derive(Clone, Copy)]
enum Local<'a> {
    One(&'a MemoryRegion),
    Many(&'a [&'a MemoryRegion]),
}

fn sge_list(mrs: &[&MemoryRegion]) -> Result<Vec<ffi::ibv_sge>> {
    if mrs.is_empty() || i32::try_from(mrs.len()).is_err() {
        return Err(Error::InvalidArgument {
            verb: "rdma_post_*v",
            reason: format!("{} scatter/gather entries", mrs.len()),
        });
    }
    Ok(mrs.iter().map(|m| m.sge()).collect())
}

/// Waits for the next completion of `cq`: poll, arm, poll again, then wait on
/// the CQ's completion channel (or keep polling if it has none). The loop of
/// `rdma_get_send_comp(3)`/`rdma_get_recv_comp(3)`.
///
/// # Errors
/// The errors of [`CompletionQueue::poll`], [`CompletionQueue::req_notify`]
/// and [`crate::CompletionChannel::get_event`].
pub fn get_comp(cq: &CompletionQueue) -> Result<Completion> {
    let mut out = Vec::with_capacity(1);
    loop {
        if cq.poll(&mut out, 1)? > 0 {
            break;
        }
        let Some(channel) = cq.channel() else {
            std::thread::yield_now();
            continue;
        };
        cq.req_notify(false)?;
        if cq.poll(&mut out, 1)? > 0 {
            break;
        }
        drop(channel.get_event()?);
    }
    out.pop()
        .ok_or_else(|| Error::verb_errno("ibv_poll_cq", "", libc::EIO))
}
