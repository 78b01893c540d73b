//! Reply delivery: what a reply said, checked against what its call
//! offered ([`Outcome`]); the call waiting for its chunks' invalidations
//! ([`Ending`]); then its data read out of the chunks (a plain copy where no
//! peer can reach them any more, else the atomic copy), placed or lent,
//! the chunks given back, and the reply sent to its caller ([`deliver`]).

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::send::{Lent, Pending};
use super::{Error, Reply, Result};
use crate::chunks::{Chunk, ChunkPool, LentData, NotLent};
use crate::rpcrdma::Chunks;

/// What a reply said, checked, before its chunks' data is read (after they
/// are invalidated).
pub(super) enum Outcome {
    Failed(Error),
    /// An inline reply, and the bytes the server wrote in the write chunk.
    Msg {
        msg: Vec<u8>,
        written: Option<usize>,
    },
    /// The reply in the reply chunk (its length), and the write chunk's.
    NoMsg {
        len: usize,
        written: Option<usize>,
    },
}

/// A call whose reply came, waiting for its windows' invalidations.
pub(super) struct Ending {
    pub(super) pending: Pending,
    pub(super) outcome: Outcome,
    /// The rkeys of this call's chunks that the server invalidated (the
    /// receive completion of its reply, or of another call's, said so):
    /// they took no `LOCAL_INV`.
    pub(super) remote: Vec<u32>,
    pub(super) waiting: u32,
    /// When the invalidations count as lost.
    pub(super) deadline: Instant,
}

/// The bytes the server wrote into the call's write chunk: as many as the
/// segments it returned say, never more than offered.
pub(super) fn written(p: &Pending, c: &Chunks) -> Result<Option<usize>> {
    let Some(chunk) = c.write.first() else {
        return Ok(None);
    };
    let Some(l) = &p.write else {
        return Err(Error::Malformed(
            "a write chunk in a reply to a call that offered none".into(),
        ));
    };
    let len: u64 = chunk.iter().map(|s| u64::from(s.length)).sum();
    if len > l.len() as u64 || c.write.len() > 1 {
        return Err(Error::Malformed(format!(
            "the server returned a write list of {} chunk(s), {len} bytes, for one chunk of {}",
            c.write.len(),
            l.len()
        )));
    }
    Ok(Some(len as usize))
}

/// An `RDMA_NOMSG` reply's length in the reply chunk.
pub(super) fn nomsg_reply(p: &Pending, c: &Chunks) -> Result<usize> {
    let (Some(chunk), Some(l)) = (&c.reply, &p.reply_chunk) else {
        return Err(Error::Malformed(
            "RDMA_NOMSG without a reply chunk, or to a call that offered none".into(),
        ));
    };
    let len: u64 = chunk.iter().map(|s| u64::from(s.length)).sum();
    if len > l.len() as u64 || len < 4 {
        return Err(Error::Malformed(format!(
            "the server returned a reply chunk of {len} bytes for one of {}",
            l.len()
        )));
    }
    Ok(len as usize)
}

/// Counts a chunk read with a plain copy.
fn plain_read(l: &Option<Lent>) {
    if let Some(l) = l {
        l.stats.plain_chunk_reads.fetch_add(1, Ordering::Relaxed);
    }
}

/// Which of a call's chunks no peer can reach any more, so that they may be
/// read with a plain copy.
#[derive(Clone, Copy)]
struct Gone<'a> {
    /// Every window the call was lent was invalidated: its `LOCAL_INV`
    /// completed successfully after the reply came, or it is in `remote`.
    windows: bool,
    /// The rkeys of the call's chunks that the server invalidated, as
    /// receive completions reported (`IBV_WC_WITH_INV`).
    remote: &'a [u32],
}

impl Gone<'_> {
    /// Whether `c`'s rkey is invalid: a window, when all were invalidated;
    /// a registration of its own, when the server invalidated its rkey.
    fn unreachable(self, c: &Chunk) -> bool {
        match c.window_rkey() {
            Some(_) => self.windows,
            None => self.remote.contains(&c.segment().handle),
        }
    }
}

/// Reads `len` bytes of a lent chunk: a plain copy when `gone` proves it
/// unreachable, else the crate's atomic copy.
fn read_lent(l: &Option<Lent>, len: usize, what: &str, gone: Gone) -> Result<Vec<u8>> {
    let Some(c) = l.as_ref().and_then(|l| l.chunk.as_ref()) else {
        return Err(Error::Malformed(format!("{what}: never offered")));
    };
    if gone.unreachable(c) {
        // SAFETY: `gone` says this chunk's rkey is invalid: a window whose
        // `LOCAL_INV` (posted in `Engine::finish`, after its reply came)
        // completed successfully (`Engine::invalidated`), or whose rkey, or
        // a registration whose rkey, the reply's receive completion reported
        // invalidated by the server; windows are not bound again before
        // `deliver` puts them back, registrations are dropped after.
        if let Some(b) = unsafe { c.invalidated_bytes(len) } {
            plain_read(l);
            return Ok(b.to_vec());
        }
    }
    let mut v = vec![0; len];
    c.read(&mut v)
        .map_err(|e| Error::Malformed(format!("{what}: {e}")))?;
    Ok(v)
}

/// The reply, read out of its chunks: with a plain copy where `gone`
/// proves no peer can reach them, else with the atomic copy (the windows'
/// QP may be in error, or a registration still valid until it is dropped).
fn outcome(p: &Pending, o: Outcome, gone: Gone, lent: Result<Option<LentData>>) -> Result<Reply> {
    let (msg, written) = match o {
        Outcome::Failed(e) => return Err(e),
        Outcome::Msg { msg, written } => (msg, written),
        Outcome::NoMsg { len, written } => (
            read_lent(&p.reply_chunk, len, "reply chunk", gone)?,
            written,
        ),
    };
    check_reply_xid(&p.call.msg, &msg)?;
    if let Some(d) = lent? {
        return Ok(Reply {
            msg,
            data: None,
            placed: None,
            lent: Some(d),
        });
    }
    let Some(n) = written else {
        return Ok(Reply {
            msg,
            data: None,
            placed: None,
            lent: None,
        });
    };
    if let (Some(d), Some(c)) = (
        &p.call.data_into,
        p.write.as_ref().and_then(|l| l.chunk.as_ref()),
    ) {
        let plain = if gone.unreachable(c) {
            // SAFETY: as in `read_lent`: this chunk's rkey is invalid (its
            // `LOCAL_INV` completed after the reply came, or the server
            // invalidated it with the reply), and it is neither bound again
            // nor deregistered before `deliver` is done with it.
            unsafe { c.invalidated_bytes(n) }
        } else {
            None
        };
        let placed = if let Some(b) = plain {
            let r = d.try_fill(n, |dst| dst.copy_from_slice(b));
            if r.is_some() {
                plain_read(&p.write);
            }
            r
        } else {
            d.try_fill(n, |dst| c.read(dst).is_ok())
                .filter(|ok| *ok)
                .map(|_| ())
        };
        if placed.is_some() {
            if let Some(l) = &p.write {
                l.stats.data_placed.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Reply {
                msg,
                data: None,
                placed: Some(n),
                lent: None,
            });
        }
    }
    Ok(Reply {
        msg,
        data: Some(read_lent(&p.write, n, "write chunk", gone)?),
        placed: None,
        lent: None,
    })
}

/// The write chunk's data lent in place ([`Call::lend_data`]), when the call
/// asked for it, the reply says the server wrote it, and the chunk can be
/// lent ([`ChunkPool::lend`]: a window proven invalidated, a registration
/// of its own deregistered); the chunk is then out of the call, and is not
/// put back or discarded with the others. `Ok(None)`: read it with a copy.
///
/// [`Call::lend_data`]: super::Call::lend_data
fn lend_write(
    p: &mut Pending,
    o: &Outcome,
    gone: Gone,
    pool: Option<&mut ChunkPool>,
) -> Result<Option<LentData>> {
    let (Outcome::Msg {
        written: Some(n), ..
    }
    | Outcome::NoMsg {
        written: Some(n), ..
    }) = *o
    else {
        return Ok(None);
    };
    let (true, Some(pool), Some(l)) = (p.call.lend_data, pool, p.write.as_mut()) else {
        return Ok(None);
    };
    let Some(c) = l.chunk.take() else {
        return Ok(None);
    };
    let invalidated = gone.unreachable(&c);
    match pool.lend(c, n, invalidated) {
        Ok(d) => {
            l.stats.data_lent.fetch_add(1, Ordering::Relaxed);
            Ok(Some(d))
        }
        Err(NotLent::Kept(c)) => {
            l.chunk = Some(c);
            Ok(None)
        }
        Err(NotLent::Lost(e)) => Err(Error::Permanent(format!(
            "deregistering the write chunk to lend its data: {e}"
        ))),
    }
}

/// Delivers a reply: its chunks go back to `pool` (the connection they were
/// bound on), or are dropped without one. `windows`: every window the call
/// was lent is invalidated (its `LOCAL_INV` completed, it was deallocated
/// and replaced, or the server invalidated it with the reply); only then does a window's region go back
/// to the pool, whose regions are all unbound; a call with windows and no
/// such proof has them discarded.
pub(super) fn deliver(e: Ending, pool: Option<&mut ChunkPool>, windows: bool) {
    let Ending {
        mut pending,
        outcome: o,
        remote,
        ..
    } = e;
    let gone = Gone {
        windows,
        remote: &remote,
    };
    let mut pool = pool;
    let lent = lend_write(&mut pending, &o, gone, pool.as_deref_mut());
    let r = outcome(&pending, o, gone, lent);
    match pool {
        Some(pool) => {
            for l in pending.lent() {
                if let Some(c) = l.chunk.take() {
                    if windows || c.window_rkey().is_none() {
                        pool.put(c);
                    } else {
                        pool.discard(c);
                    }
                }
            }
        }
        None => drop(std::mem::take(&mut pending.chunks)),
    }
    let Pending { reply, .. } = pending;
    let _ = reply.send(r);
}

/// Delivers a reply whose invalidations cannot complete (the connection
/// broke; its QP is in error): its windows are deallocated.
pub(super) fn deliver_discarding(e: Ending, pool: &mut ChunkPool) {
    let Ending {
        mut pending,
        outcome: o,
        remote: e_remote,
        ..
    } = e;
    // A registration the server invalidated is still unreachable (the
    // windows are read with the atomic copy: their QP is in error).
    let gone = Gone {
        windows: false,
        remote: &e_remote,
    };
    // A registration of its own can still be lent (deregistered first).
    let lent = lend_write(&mut pending, &o, gone, Some(&mut *pool));
    let r = outcome(&pending, o, gone, lent);
    for l in pending.lent() {
        if let Some(c) = l.chunk.take() {
            pool.discard(c);
        }
    }
    let Pending { reply, .. } = pending;
    let _ = reply.send(r);
}

/// Whether the RPC reply `msg` (inline, or read from the reply chunk of a
/// `RDMA_NOMSG` reply) is the reply to `call`: both start with the xid.
fn check_reply_xid(call: &[u8], msg: &[u8]) -> Result<()> {
    let xid = |b: &[u8]| {
        b.get(..4)
            .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
    };
    match (xid(call), xid(msg)) {
        (Some(call), Some(reply)) if call != reply => Err(Error::XidMismatch { call, reply }),
        (Some(_), None) => Err(Error::Malformed(format!(
            "an RPC reply of {} bytes, shorter than its xid",
            msg.len()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RPC reply's own xid is the call's, or the reply is refused as a
    /// typed error (the transport header's xid alone matched it).
    #[test]
    fn a_reply_whose_rpc_xid_is_another_call_s_is_refused() {
        let call = [0, 0, 0, 7, 0, 0, 0, 0];
        assert_eq!(check_reply_xid(&call, &[0, 0, 0, 7, 0, 0, 0, 1]), Ok(()));
        assert_eq!(
            check_reply_xid(&call, &[0, 0, 0, 8, 0, 0, 0, 1]),
            Err(Error::XidMismatch { call: 7, reply: 8 })
        );
        assert!(matches!(
            check_reply_xid(&call, &[0, 0]),
            Err(Error::Malformed(m)) if m.contains("shorter than its xid")
        ));
        assert_eq!(
            Error::XidMismatch { call: 7, reply: 8 }.to_string(),
            "the server answered call 0x7 with the RPC reply of call 0x8"
        );
    }
}
