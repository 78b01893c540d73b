//! Receive posting, shared by QPs (`ibv_post_recv`) and shared receive
//! queues (`ibv_post_srq_recv`): the C chain built from requests that carry
//! our `wr_id`s, handed to the verb.

use std::ffi::c_int;

use crate::ffi;
use crate::wr::{link, posted, WrBuffers};

/// Scatter entries one request may have without the chain touching the heap.
const SHORT: usize = 4;

/// Posts `reqs` (our `wr_id`, the request's memory) with `post`, given the
/// chain and the bad-request out-pointer. Returns the provider's code and how
/// many requests, from the first, were posted. The memory stays where the
/// caller keeps it: parked already (an SRQ, whose completions may arrive
/// before this returns) or parked after (a QP's producer publishes it).
pub(crate) fn post_chain(
    reqs: &[(u64, &WrBuffers)],
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> c_int,
) -> (c_int, usize) {
    match reqs {
        [] => (0, 0),
        [(id, b)] if b.len() <= SHORT => {
            // One request (a latency loop's): no heap, and only the entries
            // it has written on the stack: clearing all four would cost more
            // than the post's own bookkeeping (callgrind).
            let mut bad = std::ptr::null_mut();
            let rc = if let Some(m) = b.single() {
                let mut sge = m.sge();
                post(&mut request(*id, std::slice::from_mut(&mut sge)), &mut bad)
            } else {
                let mut sges = [ffi::ibv_sge::default(); SHORT];
                let mut n = 0;
                b.for_each_sge(|s| {
                    sges[n] = s;
                    n += 1;
                });
                post(&mut request(*id, &mut sges[..n]), &mut bad)
            };
            (rc, usize::from(rc == 0))
        }
        _ => {
            let mut sges: Vec<ffi::ibv_sge> = Vec::new();
            let mut sge_at = Vec::with_capacity(reqs.len());
            for (_, b) in reqs {
                sge_at.push((sges.len(), b.len()));
                b.for_each_sge(|s| sges.push(s));
            }
            let mut chain: Vec<ffi::ibv_recv_wr> = reqs
                .iter()
                .zip(&sge_at)
                .map(|((id, _), &(at, n))| request(*id, &mut sges[at..at + n]))
                .collect();
            let base = link(&mut chain);
            let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
            let rc = post(base, &mut bad);
            (rc, posted(rc, base, bad, reqs.len()))
        }
    }
}

/// One receive request over `sges` (empty: a zero-length receive).
fn request(wr_id: u64, sges: &mut [ffi::ibv_sge]) -> ffi::ibv_recv_wr {
    ffi::ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: if sges.is_empty() {
            std::ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        },
        num_sge: sges.len() as c_int,
    }
}
