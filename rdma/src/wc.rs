//! Work completions (`struct ibv_wc`).

use std::fmt;

use crate::ah::{AddressHandle, AhAttr};
use crate::error::{check_errno_ret, Result};
use crate::macros::c_enum;
pub use crate::status::WcStatus;
use crate::wr::WrBuffers;
use crate::{ffi, ProtectionDomain};

c_enum! {
    /// `enum ibv_wc_opcode`. Only meaningful for successful completions.
    pub enum WcOpcode: u32 {
        /// Send.
        Send = ffi::IBV_WC_SEND,
        /// RDMA write.
        RdmaWrite = ffi::IBV_WC_RDMA_WRITE,
        /// RDMA read.
        RdmaRead = ffi::IBV_WC_RDMA_READ,
        /// Compare and swap.
        CompSwap = ffi::IBV_WC_COMP_SWAP,
        /// Fetch and add.
        FetchAdd = ffi::IBV_WC_FETCH_ADD,
        /// Memory window bind.
        BindMw = ffi::IBV_WC_BIND_MW,
        /// Local invalidate.
        LocalInv = ffi::IBV_WC_LOCAL_INV,
        /// TSO send.
        Tso = ffi::IBV_WC_TSO,
        /// Atomic write.
        AtomicWrite = ffi::IBV_WC_ATOMIC_WRITE,
        /// Receive.
        Recv = ffi::IBV_WC_RECV,
        /// Receive of an RDMA write with immediate.
        RecvRdmaWithImm = ffi::IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

bitflags::bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct WcFlags: u32 {
        /// A GRH is present in the first 40 bytes of the receive buffer (UD).
        const GRH = ffi::IBV_WC_GRH;
        /// Immediate data is valid.
        const WITH_IMM = ffi::IBV_WC_WITH_IMM;
        /// IP checksum verified. (Linux 6.1's rxe sets this bit on a
        /// receive that invalidated an rkey: its kernel flag value, with the
        /// rkey in `imm_data`; see [`SendOp::LocalInvalidate`](crate::SendOp::LocalInvalidate).)
        const IP_CSUM_OK = ffi::IBV_WC_IP_CSUM_OK;
        /// An rkey was invalidated.
        const WITH_INV = ffi::IBV_WC_WITH_INV;
        const _ = !0;
    }
}

/// A polled work completion.
///
/// For work posted through the safe API, `wr_id` is the id the caller gave,
/// and [`Completion::buffers`] holds the memory the request used; the
/// memory of unsignaled requests completed before it (same send queue) comes
/// with it in [`Completion::unsignaled`].
///
/// ```no_run
/// # fn f(cq: &rdma::CompletionQueue) -> rdma::Result<()> {
/// if let Some(c) = cq.poll_one()? {
///     let mut c = c.ok()?; // an error status becomes an Err naming it
///     println!("request {} moved {} bytes", c.wr_id, c.byte_len);
///     let _memory = c.take_buffers(); // what the request lent, back
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Completion {
    /// The caller's work request id.
    pub wr_id: u64,
    /// Success or the reason of the failure.
    pub status: WcStatus,
    /// The operation (valid when `status` is `Success`).
    pub opcode: WcOpcode,
    /// Vendor error syndrome (for failures).
    pub vendor_err: u32,
    /// Bytes transferred (receives, RDMA READ, atomics).
    pub byte_len: u32,
    /// Immediate data (host byte order) or the invalidated rkey, per `wc_flags`.
    pub imm_data: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The source QP number (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI QPs).
    pub pkey_index: u16,
    /// Source LID (UD receives, InfiniBand).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
    /// The memory of this work request (safe post only).
    pub buffers: WrBuffers,
    /// `(wr_id, memory)` of unsignaled send requests this completion implies
    /// finished, oldest first (safe post only; a prepared request's sends,
    /// which hold no memory, are not listed).
    pub unsignaled: Vec<(u64, WrBuffers)>,
}

impl Completion {
    #[inline]
    pub(crate) fn from_raw(wc: &ffi::ibv_wc) -> Self {
        let mut c = Completion {
            wr_id: 0,
            status: WcStatus::from_raw(0),
            opcode: WcOpcode::from_raw(0),
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            buffers: WrBuffers::None,
            unsignaled: Vec::new(),
        };
        c.set_raw(wc);
        c
    }

    /// Overwrites every field but the memory with those of `wc`.
    #[inline]
    pub(crate) fn set_raw(&mut self, wc: &ffi::ibv_wc) {
        let wc_flags = WcFlags::from_bits_retain(wc.wc_flags);
        self.imm_data = imm_data(wc);
        self.wr_id = wc.wr_id;
        self.status = WcStatus::from_raw(wc.status);
        self.opcode = WcOpcode::from_raw(wc.opcode);
        self.vendor_err = wc.vendor_err;
        self.byte_len = wc.byte_len;
        self.qp_num = wc.qp_num;
        self.src_qp = wc.src_qp;
        self.wc_flags = wc_flags;
        self.pkey_index = wc.pkey_index;
        self.slid = wc.slid;
        self.sl = wc.sl;
        self.dlid_path_bits = wc.dlid_path_bits;
    }

    /// True when the work request succeeded.
    pub fn is_success(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// The immediate data, if the completion carries one.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }

    /// Takes the memory of this work request.
    pub fn take_buffers(&mut self) -> WrBuffers {
        std::mem::take(&mut self.buffers)
    }

    /// Whether any memory is left in it (its own, or unsignaled requests').
    #[inline]
    pub(crate) fn holds_memory(&self) -> bool {
        !matches!(self.buffers, WrBuffers::None) || !self.unsignaled.is_empty()
    }

    /// Takes all the memory left in it (what [`Completion::holds_memory`]
    /// found), to be dropped out of line.
    #[cold]
    pub(crate) fn take_memory(&mut self) -> Box<(WrBuffers, Vec<(u64, WrBuffers)>)> {
        Box::new((
            std::mem::take(&mut self.buffers),
            std::mem::take(&mut self.unsignaled),
        ))
    }

    /// The compact form of this completion, its memory (the unsignaled
    /// requests' first, then its own) appended to `memory`: what
    /// [`CompletionQueue::poll_wc`](crate::CompletionQueue::poll_wc) would
    /// have given for it.
    pub(crate) fn into_compact(self, memory: &mut Vec<(u64, WrBuffers)>) -> WorkCompletion {
        let imm = if self.wc_flags.contains(WcFlags::WITH_IMM) {
            self.imm_data.to_be()
        } else {
            self.imm_data
        };
        let wc = ffi::ibv_wc {
            wr_id: self.wr_id,
            status: self.status.to_raw(),
            opcode: self.opcode.to_raw(),
            vendor_err: self.vendor_err,
            byte_len: self.byte_len,
            __bindgen_anon_1: ffi::ibv_wc__bindgen_ty_1 { imm_data: imm },
            qp_num: self.qp_num,
            src_qp: self.src_qp,
            wc_flags: self.wc_flags.bits(),
            pkey_index: self.pkey_index,
            slid: self.slid,
            sl: self.sl,
            dlid_path_bits: self.dlid_path_bits,
        };
        memory.extend(self.unsignaled);
        if !matches!(self.buffers, WrBuffers::None) {
            memory.push((self.wr_id, self.buffers));
        }
        WorkCompletion(wc)
    }

    /// `Ok(self)` when successful, else an error describing the failure.
    ///
    /// # Errors
    /// [`crate::Error::Completion`] with the status and vendor error.
    pub fn ok(self) -> crate::Result<Self> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(crate::Error::Completion {
                wr_id: self.wr_id,
                qp_num: self.qp_num,
                status: self.status,
                vendor_err: self.vendor_err,
            })
        }
    }
}

/// The immediate data in host byte order, or the invalidated rkey, per the
/// flags (the provider gives immediate data in network byte order).
#[inline(always)]
fn imm_data(wc: &ffi::ibv_wc) -> u32 {
    // SAFETY: both union members are u32; reading either is defined.
    let imm = unsafe { wc.__bindgen_anon_1.imm_data };
    if wc.wc_flags & ffi::IBV_WC_WITH_IMM != 0 {
        u32::from_be(imm)
    } else {
        imm
    }
}

/// A polled work completion in the provider's own layout (`struct ibv_wc`,
/// which it is, `#[repr(transparent)]`), read through methods: what
/// [`CompletionQueue::poll_wc`](crate::CompletionQueue::poll_wc) fills in
/// place. The compact form of [`Completion`] for loops that poll many: no
/// memory travels in it (the memory of the requests it finishes comes back
/// in a list beside it), so it is `Copy` and an array of them is reused
/// from poll to poll with nothing to drop.
///
/// For work posted through the safe API, [`WorkCompletion::wr_id`] is the
/// id the caller gave.
///
/// ```no_run
/// # fn f(cq: &rdma::CompletionQueue) -> rdma::Result<()> {
/// let mut wcs = [rdma::WorkCompletion::default(); 16];
/// let mut memory = Vec::new();
/// let n = cq.poll_wc(&mut wcs, &mut memory)?;
/// for wc in &wcs[..n] {
///     wc.ok()?;
///     println!("request {} done, {} bytes", wc.wr_id(), wc.byte_len());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct WorkCompletion(ffi::ibv_wc);

impl WorkCompletion {
    /// The caller's work request id.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// Success or the reason of the failure.
    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status)
    }

    /// True when the work request succeeded (one comparison: no
    /// conversion of the status).
    #[inline]
    pub fn is_success(&self) -> bool {
        self.0.status == ffi::IBV_WC_SUCCESS
    }

    /// The operation (valid when the status is success).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.0.opcode)
    }

    /// Vendor error syndrome (for failures).
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// Bytes transferred (receives, RDMA READ, atomics).
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Immediate data (host byte order) or the invalidated rkey, per
    /// [`WorkCompletion::wc_flags`]; as [`Completion::imm_data`].
    #[inline]
    pub fn imm_data(&self) -> u32 {
        imm_data(&self.0)
    }

    /// The immediate data, if the completion carries one.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags()
            .contains(WcFlags::WITH_IMM)
            .then(|| self.imm_data())
    }

    /// The local QP number.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// The source QP number (UD receives).
    #[inline]
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// Flags.
    #[inline]
    pub fn wc_flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.0.wc_flags)
    }

    /// P_Key index (GSI QPs).
    #[inline]
    pub fn pkey_index(&self) -> u16 {
        self.0.pkey_index
    }

    /// Source LID (UD receives, InfiniBand).
    #[inline]
    pub fn slid(&self) -> u16 {
        self.0.slid
    }

    /// Service level.
    #[inline]
    pub fn sl(&self) -> u8 {
        self.0.sl
    }

    /// Destination LID path bits.
    #[inline]
    pub fn dlid_path_bits(&self) -> u8 {
        self.0.dlid_path_bits
    }

    /// `Ok(self)` when successful, else an error describing the failure.
    ///
    /// # Errors
    /// [`crate::Error::Completion`] with the status and vendor error.
    #[inline]
    pub fn ok(&self) -> crate::Result<&Self> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(self.failed())
        }
    }

    #[cold]
    fn failed(&self) -> crate::Error {
        crate::Error::Completion {
            wr_id: self.wr_id(),
            qp_num: self.qp_num(),
            status: self.status(),
            vendor_err: self.vendor_err(),
        }
    }

    /// The provider's entry.
    pub fn as_raw(&self) -> &ffi::ibv_wc {
        &self.0
    }

    /// The provider's entry, to be resolved in place by a poll.
    pub(crate) fn raw_mut(&mut self) -> &mut ffi::ibv_wc {
        &mut self.0
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("vendor_err", &self.vendor_err())
            .field("byte_len", &self.byte_len())
            .field("imm_data", &self.imm_data())
            .field("qp_num", &self.qp_num())
            .field("src_qp", &self.src_qp())
            .field("wc_flags", &self.wc_flags())
            .finish_non_exhaustive()
    }
}

/// An address handle from a completion: here rather than in `ah.rs`,
/// which completions are above.
impl ProtectionDomain {
    /// Creates an address handle that answers the sender of a received UD
    /// completion (`ibv_create_ah_from_wc(3)`). `grh` is the first 40 bytes of
    /// the receive buffer.
    ///
    /// # Errors
    /// [`crate::Error::Verb`] naming `ibv_create_ah_from_wc`.
    pub fn create_ah_from_wc(
        &self,
        port_num: u8,
        wc: &Completion,
        grh: &[u8; 40],
    ) -> Result<AddressHandle> {
        let mut raw_wc = ffi::ibv_wc {
            wr_id: wc.wr_id,
            status: wc.status.to_raw(),
            opcode: wc.opcode.to_raw(),
            vendor_err: wc.vendor_err,
            byte_len: wc.byte_len,
            qp_num: wc.qp_num,
            src_qp: wc.src_qp,
            wc_flags: wc.wc_flags.bits(),
            pkey_index: wc.pkey_index,
            slid: wc.slid,
            sl: wc.sl,
            dlid_path_bits: wc.dlid_path_bits,
            ..Default::default()
        };
        raw_wc.__bindgen_anon_1.imm_data = wc.imm_data;
        let mut attr = ffi::ibv_ah_attr::default();
        // SAFETY: valid context, wc and grh (40 bytes as the verb reads);
        // fills `attr`.
        let rc = unsafe {
            ffi::ibv_init_ah_from_wc(
                self.context().as_raw(),
                port_num,
                &mut raw_wc,
                grh.as_ptr().cast_mut().cast(),
                &mut attr,
            )
        };
        check_errno_ret("ibv_init_ah_from_wc", || "".into(), rc.abs())?;
        self.create_ah(&AhAttr::from_raw(&attr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "calls into rdma-core, which Miri cannot run")]
    fn status_text_comes_from_libibverbs() {
        assert_eq!(WcStatus::Success.to_string(), "success");
        assert_eq!(WcStatus::RemAccessErr.to_string(), "remote access error");
        assert_eq!(WcStatus::from_raw(999), WcStatus::Unknown(999));
    }

    #[test]
    fn immediate_data_is_host_order() {
        let mut wc = ffi::ibv_wc {
            wc_flags: ffi::IBV_WC_WITH_IMM,
            ..Default::default()
        };
        wc.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        let c = Completion::from_raw(&wc);
        assert_eq!(c.imm(), Some(0x1234_5678));
        let c = Completion::from_raw(&ffi::ibv_wc::default());
        assert_eq!(c.imm(), None);
    }

    /// A buffered `Completion` turned compact reads as the provider's entry
    /// it came from, and gives its memory to the list, oldest first.
    #[test]
    fn a_completion_turned_compact_reads_as_the_entry_it_came_from() {
        let mut wc = ffi::ibv_wc {
            wr_id: 7,
            status: ffi::IBV_WC_REM_ACCESS_ERR,
            opcode: ffi::IBV_WC_RECV_RDMA_WITH_IMM,
            vendor_err: 0x33,
            byte_len: 4096,
            qp_num: 17,
            src_qp: 18,
            wc_flags: ffi::IBV_WC_WITH_IMM | ffi::IBV_WC_GRH,
            pkey_index: 2,
            slid: 3,
            sl: 4,
            dlid_path_bits: 5,
            ..Default::default()
        };
        wc.__bindgen_anon_1.imm_data = 0x0102_0304u32.to_be();
        let mut c = Completion::from_raw(&wc);
        c.unsignaled.push((5, WrBuffers::None));
        let mut memory = vec![(1, WrBuffers::None)];
        let w = c.into_compact(&mut memory);
        let ids: Vec<u64> = memory.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [1, 5], "appended, the unsignaled first; no own memory");
        assert_eq!(w.wr_id(), 7);
        assert_eq!(w.status(), WcStatus::RemAccessErr);
        assert!(!w.is_success() && w.ok().is_err());
        assert_eq!(w.opcode(), WcOpcode::RecvRdmaWithImm);
        assert_eq!((w.vendor_err(), w.byte_len()), (0x33, 4096));
        assert_eq!(w.imm(), Some(0x0102_0304));
        assert_eq!((w.qp_num(), w.src_qp()), (17, 18));
        assert_eq!(w.wc_flags(), WcFlags::WITH_IMM | WcFlags::GRH);
        assert_eq!(
            (w.pkey_index(), w.slid(), w.sl(), w.dlid_path_bits()),
            (2, 3, 4, 5)
        );
        // SAFETY: both union members are u32.
        let raw_imm = unsafe { w.as_raw().__bindgen_anon_1.imm_data };
        assert_eq!(
            raw_imm,
            0x0102_0304u32.to_be(),
            "network order, as the provider's"
        );
    }
}
