//! The checks of a send request: a quick predicate for the common case,
//! then the full checks, which explain what is wrong.

use super::{QpType, QueuePair};
use crate::error::{Error, Result};
use crate::ffi;
use crate::mr::{AccessFlags, MemoryRegion};
use crate::wr::{InlineSend, SendOp, SendWr, UdDest, WrBuffers};

impl QueuePair {
    /// The one check of a send request: the quick predicate, which accepts
    /// only what the full checks accept, then, for anything else, the full
    /// checks, which produce the error (or accept the unusual request).
    #[inline]
    pub(super) fn check_send_wr(&self, wr: &SendWr) -> Result<()> {
        if self.send_plainly_valid(wr) {
            return Ok(());
        }
        self.check_send_wr_fully(wr)
    }

    #[cold]
    fn check_send_wr_fully(&self, wr: &SendWr) -> Result<()> {
        self.check_buffers(
            &wr.buffers,
            self.caps.max_send_sge,
            wr.op.writes_local(),
            "ibv_post_send",
        )?;
        let len = Self::total_len(&wr.buffers);
        self.check_send(&wr.op, (wr.buffers.len(), len), &wr.ud, wr.xrc_srqn)
    }

    /// The checks of an inline send.
    pub(super) fn check_inline(&self, wr: &InlineSend<'_>) -> Result<()> {
        if wr.data.len() > self.caps.max_inline_data as usize {
            return Err(self.invalid(format!(
                "{} bytes of inline data, but QP {} allows {}",
                wr.data.len(),
                self.qp_num(),
                self.caps.max_inline_data
            )));
        }
        if matches!(
            wr.op,
            SendOp::Read(_) | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        ) {
            return Err(self.invalid("only SEND and RDMA WRITE can be inline".into()));
        }
        let sges = usize::from(!wr.data.is_empty());
        self.check_send(&wr.op, (sges, wr.data.len() as u64), &wr.ud, wr.xrc_srqn)
    }

    pub(super) fn check_buffers(
        &self,
        bufs: &WrBuffers,
        max_sge: u32,
        local_write: bool,
        verb: &'static str,
    ) -> Result<()> {
        if bufs.len() > max_sge as usize {
            return Err(Error::InvalidArgument {
                verb,
                reason: format!(
                    "{} scatter/gather entries, but QP {} allows {max_sge}",
                    bufs.len(),
                    self.qp_num()
                ),
            });
        }
        if local_write && bufs.is_shared() {
            return Err(Error::InvalidArgument {
                verb,
                reason: crate::wr::SHARED_IS_READ_ONLY.into(),
            });
        }
        if local_write && self.end_padding {
            let mut sges = Vec::new();
            bufs.for_each_sge(|s| sges.push(s));
            if let Some(end) = padding_spills(&sges) {
                return Err(Error::InvalidArgument {
                    verb,
                    reason: format!(
                        "a scatter entry the device writes ends at {end:#x}, but QP {} pads \
                         the device's writes to the cache line (PCI_WRITE_END_PADDING): each \
                         must end at a multiple of {END_PADDING_ALIGN}",
                        self.qp_num()
                    ),
                });
            }
        }
        if let WrBuffers::Device(d) = bufs {
            return crate::wr::check_device_slice(d, &self.pd, local_write)
                .map_err(|reason| Error::InvalidArgument { verb, reason });
        }
        let mut err = Ok(());
        bufs.for_each(|m| {
            if err.is_ok() {
                err = self.check_region(m, local_write, verb);
            }
        });
        err
    }

    /// The checks of [`Self::check_buffers`] that concern one host region:
    /// this QP's PD, a length one SGE can describe, and `LOCAL_WRITE` when
    /// the device writes it (an owned region is never shared).
    pub(super) fn check_region(
        &self,
        m: &MemoryRegion,
        local_write: bool,
        verb: &'static str,
    ) -> Result<()> {
        let reason = if m.pd().as_raw() != self.pd.as_raw() {
            format!("a memory region ({m:?}) belongs to another protection domain")
        } else if u32::try_from(m.len()).is_err() {
            format!(
                "a memory region of {} bytes is longer than one SGE can be",
                m.len()
            )
        } else if local_write && !m.access().contains(AccessFlags::LOCAL_WRITE) {
            format!("the device must write into a region registered without LOCAL_WRITE ({m:?})")
        } else {
            return Ok(());
        };
        Err(Error::InvalidArgument { verb, reason })
    }

    pub(super) fn total_len(bufs: &WrBuffers) -> u64 {
        if let WrBuffers::Device(d) = bufs {
            return d.len() as u64;
        }
        let mut n = 0u64;
        bufs.for_each(|m| n += m.len() as u64);
        n
    }

    /// The checks of a send that concern its operation: `(sges, len)` are
    /// its scatter entries and their length in all.
    pub(super) fn check_send(
        &self,
        op: &SendOp,
        (sges, len): (usize, u64),
        ud: &Option<UdDest>,
        xrc_srqn: Option<u32>,
    ) -> Result<()> {
        let max = u64::from(self.max_msg.load(std::sync::atomic::Ordering::Relaxed));
        if len > max {
            let limit = if max == u64::from(u32::MAX) {
                "the most one request can carry"
            } else if self.qp_type == QpType::Ud {
                "the port's limit (a UD message must fit the path MTU)"
            } else {
                "the port's limit (max_msg_sz)"
            };
            return Err(self.invalid(format!("a {len}-byte message exceeds {limit}, {max} bytes")));
        }
        if let Some(remote) = op.remote() {
            if op.is_atomic() {
                atomic_buffers(sges, len).map_err(|r| self.invalid(r))?;
                if remote.addr % 8 != 0 {
                    return Err(self.invalid(format!(
                        "atomic target address {:#x} is not 8-byte aligned",
                        remote.addr
                    )));
                }
                if remote.len < 8 {
                    return Err(self.invalid(format!("atomic target of {} bytes", remote.len)));
                }
            } else if len > remote.len {
                return Err(self.invalid(format!(
                    "{len} bytes do not fit the remote range of {} bytes",
                    remote.len
                )));
            }
        }
        check_destination(self.qp_type, op, ud.is_some(), xrc_srqn).map_err(|r| self.invalid(r))
    }

    /// A quick check that accepts only requests [`Self::check_buffers`] and
    /// [`Self::check_send`] would accept: at most one region of this QP's
    /// PD, no UD destination or XRC SRQ (nor a UD or XRC_SEND QP), no
    /// atomics. Everything else (and every error)
    /// goes through the full checks.
    #[inline]
    fn send_plainly_valid(&self, wr: &SendWr) -> bool {
        if !self.plain_sends || wr.ud.is_some() || wr.xrc_srqn.is_some() {
            return false;
        }
        // `plain_sends`: the QP has a send scatter entry.
        let Some(len) = self.buffers_plainly_valid(&wr.buffers, 1, wr.op.writes_local()) else {
            return false;
        };
        if len > u64::from(self.max_msg.load(std::sync::atomic::Ordering::Relaxed)) {
            return false;
        }
        match wr.op {
            SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInvalidate(_)
            | SendOp::LocalInvalidate(_) => true,
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) | SendOp::Read(r) => len <= r.len,
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => false,
        }
    }

    /// The quick half of [`Self::check_buffers`] for the common case: no
    /// region, or one region of this QP's PD that one SGE can describe
    /// (with `LOCAL_WRITE` when the device writes it). Returns the length,
    /// or `None` for anything the full checks must look at.
    #[inline]
    pub(super) fn buffers_plainly_valid(
        &self,
        bufs: &WrBuffers,
        max_sge: u32,
        local_write: bool,
    ) -> Option<u64> {
        let m = match bufs {
            WrBuffers::None => return Some(0),
            WrBuffers::Many(_) => return None,
            _ => bufs.single()?,
        };
        // A shared region is never written by the device.
        let writable = !bufs.is_shared() && m.access().contains(AccessFlags::LOCAL_WRITE);
        (max_sge > 0
            && m.pd().as_raw() == self.pd.as_raw()
            && u32::try_from(m.len()).is_ok()
            && (!local_write || writable))
            .then_some(m.len() as u64)
    }
}

/// The alignment, in bytes, of the end of every scatter entry the device
/// writes on a QP built with
/// [`QpCreateFlags::PCI_WRITE_END_PADDING`](crate::QpCreateFlags::PCI_WRITE_END_PADDING):
/// the largest cache line of the CPUs rdma-core runs on (64 on x86 and
/// Arm, 128 on POWER), so that the padding never passes the entry's end.
pub const END_PADDING_ALIGN: u64 = 128;

/// The end of the first of `sges` past which a device that pads its writes
/// to the cache line (`PCI_WRITE_END_PADDING`) would write, if any: an end
/// that is not a multiple of [`END_PADDING_ALIGN`].
fn padding_spills(sges: &[ffi::ibv_sge]) -> Option<u64> {
    sges.iter()
        .map(|s| s.addr.wrapping_add(u64::from(s.length)))
        .find(|end| end % END_PADDING_ALIGN != 0)
}

/// The rule every atomic's local memory follows, named by its errors.
pub(crate) const ATOMIC_RULE: &str =
    "an atomic operation needs exactly one 8-byte local buffer (one scatter/gather entry)";

/// Why the local memory of an atomic (compare-swap, fetch-add), `sges`
/// scatter entries of `len` bytes in all, is refused, if it is: exactly one
/// entry of 8 bytes. The sum alone is not enough: providers treat each entry
/// on its own (mlx5's `ibv_post_send` sets every atomic entry's length to 8,
/// so the device would write 8 bytes at the first piece's address, into the
/// memory after it).
pub(crate) fn atomic_buffers(sges: usize, len: u64) -> std::result::Result<(), String> {
    if sges == 1 && len == 8 {
        return Ok(());
    }
    Err(format!(
        "{ATOMIC_RULE}; got {sges} entries of {len} bytes in all"
    ))
}

/// Whether a send's destination fits the QP type: a UD QP needs an address
/// (and sends only), an XRC_SEND QP needs the remote XRC SRQ number, and no
/// other QP type takes either. The error is the reason, for
/// [`Error::InvalidArgument`].
fn check_destination(
    qp_type: QpType,
    op: &SendOp,
    ud: bool,
    xrc_srqn: Option<u32>,
) -> std::result::Result<(), String> {
    match (qp_type, ud) {
        (QpType::Ud, false) => return Err("a UD send needs a destination (SendWr::ud)".into()),
        (QpType::Ud, true) if op.remote().is_some() => {
            return Err("UD QPs only support SEND".into())
        }
        (t, true) if t != QpType::Ud => {
            return Err(format!("a {t:?} QP does not take a UD destination"))
        }
        _ => {}
    }
    match (qp_type, xrc_srqn) {
        (QpType::XrcSend, None) => Err("an XRC_SEND QP needs the remote XRC SRQ number of \
             every request (SendWr::xrc_remote_srqn)"
            .into()),
        (t, Some(n)) if t != QpType::XrcSend => Err(format!(
            "a {t:?} QP does not take a remote XRC SRQ number ({n}): only XRC_SEND QPs do"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mr::RemoteMemory;

    const REMOTE: RemoteMemory = RemoteMemory {
        addr: 0x1000,
        len: 64,
        rkey: 7,
    };

    #[test]
    fn xrc_send_qps_need_the_remote_srq_number() {
        let err = check_destination(QpType::XrcSend, &SendOp::Send, false, None).unwrap_err();
        assert!(
            err.contains("XRC_SEND QP needs the remote XRC SRQ number"),
            "{err}"
        );
        assert!(err.contains("SendWr::xrc_remote_srqn"), "{err}");
        for op in [SendOp::Send, SendOp::Write(REMOTE), SendOp::Read(REMOTE)] {
            assert_eq!(
                check_destination(QpType::XrcSend, &op, false, Some(5)),
                Ok(())
            );
        }
        // A UD address is no substitute, and is refused on its own.
        let err = check_destination(QpType::XrcSend, &SendOp::Send, true, Some(5)).unwrap_err();
        assert!(
            err.contains("XrcSend QP does not take a UD destination"),
            "{err}"
        );
    }

    #[test]
    fn other_qps_refuse_a_remote_srq_number() {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud, QpType::XrcRecv] {
            let ud = t == QpType::Ud;
            assert_eq!(
                check_destination(t, &SendOp::Send, ud, None),
                Ok(()),
                "{t:?}"
            );
            let err = check_destination(t, &SendOp::Send, ud, Some(42)).unwrap_err();
            assert!(
                err.contains(&format!(
                    "a {t:?} QP does not take a remote XRC SRQ number (42)"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn ud_destination_rules_are_unchanged() {
        let err = check_destination(QpType::Ud, &SendOp::Send, false, None).unwrap_err();
        assert!(err.contains("needs a destination"), "{err}");
        let err = check_destination(QpType::Ud, &SendOp::Write(REMOTE), true, None).unwrap_err();
        assert!(err.contains("only support SEND"), "{err}");
        let err = check_destination(QpType::Rc, &SendOp::Send, true, None).unwrap_err();
        assert!(
            err.contains("Rc QP does not take a UD destination"),
            "{err}"
        );
    }

    /// An atomic's local memory is one 8-byte entry: pieces that add up to
    /// 8 bytes are refused (a provider may write 8 bytes at each entry's
    /// address), as are other lengths and no entry at all.
    #[test]
    fn an_atomic_takes_exactly_one_8_byte_entry() {
        assert_eq!(atomic_buffers(1, 8), Ok(()));
        for (sges, len) in [(2, 8), (8, 8), (0, 0), (0, 8), (1, 16), (1, 4), (2, 16)] {
            let err = atomic_buffers(sges, len).unwrap_err();
            assert!(err.starts_with(ATOMIC_RULE), "{err}");
            assert!(
                err.ends_with(&format!("got {sges} entries of {len} bytes in all")),
                "{err}"
            );
        }
    }

    /// On a QP that pads the device's writes, an entry may end only where
    /// the padding stops: a split region's first piece ending mid-line
    /// would have the padding written into the second.
    #[test]
    fn padding_spills_past_every_unaligned_end() {
        let sge = |addr: u64, length: u32| ffi::ibv_sge {
            addr,
            length,
            lkey: 1,
        };
        assert_eq!(padding_spills(&[]), None);
        assert_eq!(padding_spills(&[sge(0x1000, 256)]), None);
        // Any start: the padding runs from the data's end to the line's.
        assert_eq!(padding_spills(&[sge(0x1010, 0xf0)]), None);
        assert_eq!(padding_spills(&[sge(0x1000, 100)]), Some(0x1064));
        // Two pieces of one region, split at 64: the first ends mid-line
        // (for a 128-byte line), the second is fine.
        assert_eq!(
            padding_spills(&[sge(0x1000, 64), sge(0x1040, 64)]),
            Some(0x1040)
        );
        assert_eq!(padding_spills(&[sge(0x1000, 128), sge(0x1080, 128)]), None);
    }

    #[test]
    fn builders_set_the_remote_srq_number() {
        let wr = SendWr::send(1, crate::WrBuffers::None).xrc_remote_srqn(77);
        assert_eq!(wr.xrc_srqn, Some(77));
        assert_eq!(SendWr::send(1, crate::WrBuffers::None).xrc_srqn, None);
        let inline = InlineSend::send(2, b"x").xrc_remote_srqn(78);
        assert_eq!(inline.xrc_srqn, Some(78));
    }
}
