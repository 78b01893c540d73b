//! Closing in the background: a dropped stream keeps its queue pair taking
//! the peer's messages until the peer closes too, or `Options::linger`
//! passes, and only then disconnects and frees it.
//!
//! Why: a reader grants credits for what it reads, so its peer's last data
//! and DISCONNECT are followed by grants. Over iWARP (siw) a message that
//! reaches a queue pair which has left RTS stays unread in its TCP socket,
//! and a socket released with unread bytes resets the connection: TCP
//! throws away what the closing side sent and was not yet acknowledged,
//! its last data or its DISCONNECT among them, and the reader sees a reset
//! instead of the end of the stream. TCP keeps a closed socket receiving in
//! the kernel (FIN_WAIT); here a thread does, one per closing stream.
//!
//! The threads are bounded: at most [`MAX_LINGERING`] at once. A stream
//! closed beyond that disconnects at once, as rdma-core's `rclose` always
//! does. A process that exits ends its threads, and with them their
//! lingering; the tools close with `RdmaStream::close`, which waits in the
//! foreground.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Streams that may linger at once.
pub(crate) const MAX_LINGERING: usize = 256;

/// Streams lingering now.
static LINGERING: AtomicUsize = AtomicUsize::new(0);

/// One lingering stream, counted until it is dropped (a panic included).
struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        LINGERING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `linger` on a thread of its own, if fewer than [`MAX_LINGERING`]
/// streams linger and the thread starts; `false` (and `linger` dropped)
/// otherwise, and the caller closes at once.
pub(crate) fn spawn(linger: impl FnOnce() + Send + 'static) -> bool {
    if LINGERING.fetch_add(1, Ordering::Relaxed) >= MAX_LINGERING {
        LINGERING.fetch_sub(1, Ordering::Relaxed);
        log::debug!("{MAX_LINGERING} streams linger already: this one closes at once");
        return false;
    }
    let started = std::thread::Builder::new()
        .name("rdma-stream-close".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            let _counted = Counted;
            linger();
        });
    match started {
        Ok(_) => true,
        Err(e) => {
            LINGERING.fetch_sub(1, Ordering::Relaxed);
            log::debug!("no thread to close the stream in the background ({e}): it closes at once");
            false
        }
    }
}
