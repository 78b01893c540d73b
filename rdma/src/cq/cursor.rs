//! An extended CQ's polls (`ibv_start_poll(3)`, `ibv_next_poll`,
//! `ibv_end_poll`): one cursor at a time, lending each completion.

use std::fmt;
use std::ptr::NonNull;

use super::{thread_mark, CompletionQueue};
use crate::error::{check_errno_ret, Error, Result};
use crate::ffi;
use crate::wc::Completion;

impl CompletionQueue {
    /// Starts an extended poll (`ibv_start_poll(3)`): `None` when the CQ is
    /// empty, otherwise a cursor on the first completion. The cursor lends
    /// each completion; [`PollCursor::next`] moves on, and dropping the
    /// cursor ends the poll (`ibv_end_poll`).
    ///
    /// ```compile_fail
    /// # fn f(cq: &rdma::CompletionQueue) -> rdma::Result<()> {
    /// let mut cursor = cq.start_poll()?.unwrap();
    /// let first = cursor.completion();
    /// cursor.next()?; // the completion borrowed above would dangle
    /// println!("{}", first.wr_id);
    /// # Ok(()) }
    /// ```
    ///
    /// One cursor is open on a CQ at a time, and no other poll runs while it
    /// is: a poll or `start_poll` from another thread waits for it to be
    /// dropped.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a CQ not made with `create_cq_ex`;
    /// `EBUSY` when this thread has a cursor open on it already;
    /// [`Error::Verb`] naming `ibv_start_poll`.
    pub fn start_poll(&self) -> Result<Option<PollCursor<'_>>> {
        let Some(ex) = self.inner.ex else {
            return Err(Error::Unsupported {
                what: "ibv_start_poll on a CQ made with ibv_create_cq".into(),
                device: self.inner.ctx.name().to_string(),
                source: None,
            });
        };
        if let Some(n) = self.inner.take_failure() {
            return Err(self.poll_failed(n));
        }
        let guard = self.poll_lock("ibv_start_poll")?;
        let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: live extended CQ; the lock makes this the only sequence.
        let rc = unsafe { ffi::ibv_start_poll(ex.as_ptr(), &mut attr) };
        match rc {
            0 => {
                self.inner
                    .cursor_thread
                    .store(thread_mark(), std::sync::atomic::Ordering::Relaxed);
                let mut cursor = PollCursor {
                    cq: self,
                    ex,
                    current: None,
                    _guard: guard,
                };
                cursor.load();
                Ok(Some(cursor))
            }
            libc::ENOENT => {
                self.inner.registry.resolver().cq_empty();
                Ok(None)
            }
            rc => check_errno_ret("ibv_start_poll", || "".into(), rc).map(|()| None),
        }
    }
}

/// An open extended poll of a CQ (`ibv_start_poll` ... `ibv_end_poll`).
/// See [`CompletionQueue::start_poll`].
pub struct PollCursor<'cq> {
    cq: &'cq CompletionQueue,
    ex: NonNull<ffi::ibv_cq_ex>,
    current: Option<Completion>,
    _guard: std::sync::MutexGuard<'cq, ()>,
}

impl PollCursor<'_> {
    /// Reads the current completion's fields and resolves its memory.
    fn load(&mut self) {
        let q = self.ex.as_ptr();
        // SAFETY: the poll is open and positioned on a completion; the read
        // functions are those of the flags the CQ was created with
        // (IBV_WC_STANDARD_FLAGS).
        let wc = unsafe {
            let mut wc = ffi::ibv_wc {
                wr_id: (*q).wr_id,
                status: (*q).status,
                opcode: ffi::ibv_wc_read_opcode(q),
                vendor_err: ffi::ibv_wc_read_vendor_err(q),
                byte_len: ffi::ibv_wc_read_byte_len(q),
                qp_num: ffi::ibv_wc_read_qp_num(q),
                src_qp: ffi::ibv_wc_read_src_qp(q),
                wc_flags: ffi::ibv_wc_read_wc_flags(q),
                slid: ffi::ibv_wc_read_slid(q) as u16,
                sl: ffi::ibv_wc_read_sl(q),
                dlid_path_bits: ffi::ibv_wc_read_dlid_path_bits(q),
                ..Default::default()
            };
            if wc.wc_flags & ffi::IBV_WC_WITH_IMM != 0 {
                wc.__bindgen_anon_1.imm_data = ffi::ibv_wc_read_imm_data(q);
            } else if wc.wc_flags & ffi::IBV_WC_WITH_INV != 0 {
                wc.__bindgen_anon_1.invalidated_rkey = ffi::ibv_wc_read_invalidated_rkey(q);
            }
            wc
        };
        let mut c = Completion::from_raw(&wc);
        self.cq.inner.registry.resolver().attach(&mut c);
        self.current = Some(c);
    }

    /// The current completion.
    pub fn completion(&self) -> &Completion {
        self.current
            .as_ref()
            .expect("a cursor always has a current completion until taken")
    }

    /// Takes the current completion (with its memory) out of the cursor.
    /// Calling it again before [`PollCursor::next`] returns `None`.
    pub fn take(&mut self) -> Option<Completion> {
        self.current.take()
    }

    /// The completion timestamp of the current completion, in device clock
    /// ticks, when the CQ was created with timestamps.
    pub fn completion_ts(&self) -> Option<u64> {
        (self.cq.inner.ex_flags & u64::from(ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) != 0)
            // SAFETY: the CQ was created with the timestamp flag and the poll
            // is positioned on a completion.
            .then(|| unsafe { ffi::ibv_wc_read_completion_ts(self.ex.as_ptr()) })
    }

    /// Moves to the next completion (`ibv_next_poll(3)`): `false` when there
    /// is none. A completion not taken is dropped, its memory with it.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_next_poll`.
    #[allow(clippy::should_implement_trait)] // a lending cursor, not an Iterator
    pub fn next(&mut self) -> Result<bool> {
        self.current = None;
        // SAFETY: the poll is open (started by start_poll, not yet ended).
        let rc = unsafe { ffi::ibv_next_poll(self.ex.as_ptr()) };
        match rc {
            0 => {
                self.load();
                Ok(true)
            }
            libc::ENOENT => {
                self.cq.inner.registry.resolver().cq_empty();
                Ok(false)
            }
            rc => check_errno_ret("ibv_next_poll", || "".into(), rc).map(|()| false),
        }
    }
}

impl Drop for PollCursor<'_> {
    fn drop(&mut self) {
        // SAFETY: ends the poll started by start_poll, exactly once.
        unsafe { ffi::ibv_end_poll(self.ex.as_ptr()) };
        // Before the lock (a field) is released.
        self.cq
            .inner
            .cursor_thread
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl fmt::Debug for PollCursor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollCursor")
            .field("current", &self.current)
            .finish()
    }
}
