//! siw's refused mmap key, plugged once per librdmacm device context.
//!
//! siw (Linux 6.1) maps each CQ, send queue, receive queue and SRQ of a
//! device context to user space under an mmap key that the kernel hands out
//! first fit, in pages from 0, and rdma-core's provider (44, and its current
//! `siw.c`) refuses the object whose key is `0x90000` (page 144 with 4 KiB
//! pages), which it takes for its "invalid key" sentinel, without setting
//! errno ([`crate::Error::NoReason`]). With three pages a connection (a CQ, an
//! SQ, an RQ), a process's 49th connection on a siw device fails; with two
//! 2-entry queues per QP and shared CQs, its 71st QP.
//!
//! librdmacm opens one context per device for the whole process and every
//! id shares it, so the refused key is a property of that context: this
//! module holds, while anything of this crate uses a siw context of
//! librdmacm's ([`crate::cm::CmId::context`]), one CQ that covers the key.
//! Only an object's first key is checked, so a queue that starts at or
//! below page 144 and ends past it takes the page for good: every later
//! object's key lies below or beyond it.
//!
//! The plug is made the first time the crate meets the context (no object of
//! the crate on it yet: every one holds a [`crate::Context`], and with it
//! the plug), so its queue starts at key 0 (or just past what librdmacm made
//! itself) and must be longer than 144 pages. siw rounds a CQ's entries up
//! to a power of two, 32 bytes each, plus a control word (a page more):
//! 16,384 entries (512 KiB, 129 pages) end short of page 144, so 32,768
//! (1 MiB, 257 pages) is the smallest single CQ that covers it, whatever the
//! page size up to 448 KiB
//! (`load::iwarp_the_smallest_cq_that_covers_siws_refused_key` measures
//! both). Its cost: that much vmalloc'd kernel memory, mapped into the
//! process, for as long as the context is in use, and a `create_cq` and
//! `destroy_cq` (zeroing and mapping 1 MiB, far more than a one-page CQ
//! costs) each time the crate's use of the context starts again. A program
//! whose connections come and go one at a time pays that per connection
//! unless it holds a context of the device (a server: its bound listening
//! id's, as rdma-stream's listeners do). It has no channel, is never polled,
//! and is not a crate [`crate::CompletionQueue`] (it holds no id alive; the
//! ids of the contexts that hold it keep librdmacm's context open).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use crate::error::call_ptr;
use crate::ffi;

/// siw's vendor id (`ibv_devinfo`: `0x626d74`, "bmt").
const SIW_VENDOR_ID: u32 = 0x0062_6d74;

/// The plug's entries (see the module doc).
const PLUG_CQE: i32 = 32 * 1024;

/// The CQ that covers the refused key of one context.
pub(crate) struct KeyPlug {
    cq: NonNull<ffi::ibv_cq>,
    device: String,
}

// SAFETY: the CQ is only destroyed, once, in Drop; libibverbs verbs are
// thread-safe.
unsafe impl Send for KeyPlug {}
// SAFETY: as above; nothing reads it.
unsafe impl Sync for KeyPlug {}

impl Drop for KeyPlug {
    fn drop(&mut self) {
        // SAFETY: made by ibv_create_cq below, destroyed once; every holder
        // of the plug also holds an id on the context (`plugged`), so the
        // context is still open.
        let rc = unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_destroy_cq of the siw key plug on {} failed: rc {rc}",
                self.device
            ));
        }
    }
}

/// The live plugs, by context address. An entry's plug lives while a
/// borrowed context of that device does, so a live entry's context is open
/// and its address cannot have been reused.
static PLUGS: Mutex<Vec<(usize, Weak<KeyPlug>)>> = Mutex::new(Vec::new());

/// The plug of `ctx` (made now if none lives) when its device is siw;
/// `None` for any other device, or when it cannot be made (then only siw's
/// limit stays, logged).
///
/// # Safety
/// `ctx` is an open context that stays open while the returned plug lives
/// (its holder also holds an id on it).
pub(crate) unsafe fn plugged(
    ctx: NonNull<ffi::ibv_context>,
    attr: &ffi::ibv_device_attr,
    device: &str,
) -> Option<Arc<KeyPlug>> {
    if attr.vendor_id != SIW_VENDOR_ID {
        return None;
    }
    let key = ctx.as_ptr() as usize;
    let mut plugs = PLUGS.lock().unwrap_or_else(|p| p.into_inner());
    plugs.retain(|(_, w)| w.strong_count() > 0);
    if let Some(plug) = plugs
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade())
    {
        return Some(plug);
    }
    // Made under the lock: two threads meeting the context at once make one.
    let cq = match call_ptr(
        "ibv_create_cq",
        || format!("{device} siw key plug, cqe {PLUG_CQE}").into(),
        || {
            // SAFETY: an open context (the caller's contract); no channel.
            unsafe {
                ffi::ibv_create_cq(
                    ctx.as_ptr(),
                    PLUG_CQE,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                )
            }
        },
    ) {
        Ok(cq) => cq,
        Err(e) => {
            log::warn!(
                "no siw key plug: {e}; this process's object at mmap key 0x90000 on {device} will be refused"
            );
            return None;
        }
    };
    let plug = Arc::new(KeyPlug {
        cq,
        device: device.to_string(),
    });
    plugs.push((key, Arc::downgrade(&plug)));
    Some(plug)
}

/// What a borrowed context of an id keeps: the plug first, so that it is
/// destroyed while the id (and so librdmacm's context) still lives.
pub(crate) struct Keep {
    pub(crate) _plug: Option<Arc<KeyPlug>>,
    pub(crate) _id: Arc<dyn Send + Sync>,
}
