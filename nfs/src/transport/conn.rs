//! Connection setup: RDMA CM's steps within one deadline, the QP, CQ and
//! buffer pools, every receive posted before it connects, the RFC 8797
//! private data offered and taken ([`Conn::connect`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdma::aio::{tokio_rt as rt, AsyncCmId, AsyncCq};
use rdma::cm::{CmEventType, ConnParam, PortSpace};
use rdma::{AccessFlags, BufferPool, MemoryRegion, QpState, QpType, QueuePair, WcFlags};
use tokio::time::Instant;

use super::{EndAccess, Error, Negotiated, Options, Result, Stats};
use crate::chunks::ChunkPool;
use crate::rpcrdma::{ConnectPrivate, CP_FLAG_REMOTE_INVALIDATE, DEFAULT_INLINE};

fn rdma_err(what: &'static str) -> impl FnOnce(rdma::Error) -> Error {
    move |e| Error::NotConnected(format!("{what}: {e}"))
}

/// One connection step, bounded by what is left of the connection's
/// deadline (`total`, named in the error).
async fn step<T>(
    t: Duration,
    total: Duration,
    what: &'static str,
    f: impl std::future::Future<Output = rdma::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(t, f).await {
        Err(_) => Err(Error::NotConnected(format!(
            "{what}: not done within the connection's timeout of {total:?}"
        ))),
        Ok(r) => r.map_err(rdma_err(what)),
    }
}

/// Receive work requests carry this bit.
pub(super) const RECV: u64 = 1 << 63;

/// One connection: its resources, field order = drop order (QP before CQ,
/// the id last).
pub(super) struct Conn {
    pub(super) qp: QueuePair,
    pub(super) acq: AsyncCq,
    pub(super) send_pool: BufferPool,
    /// Its slots are posted as receives (and reposted) for the connection's life.
    _recv_pool: BufferPool,
    /// After the QP: windows bound on it are deallocated once it is gone.
    pub(super) chunks: ChunkPool,
    pub(super) id: AsyncCmId,
    pub(super) negotiated: Negotiated,
    /// Unused tails of send buffers in flight, by work request.
    pub(super) tails: HashMap<u64, MemoryRegion>,
    pub(super) next_wr: u64,
    /// The receive completion flags that say the server invalidated an
    /// rkey (its value in the immediate data field): [`remote_inv_flags`].
    pub(super) inv_flags: WcFlags,
    /// Windows the server did not invalidate are deallocated, not
    /// invalidated with a `LOCAL_INV` ([`EndAccess::Deallocate`]).
    pub(super) dealloc: bool,
    /// The work request of the latest send queue completion seen (a send
    /// queue completes in order, so every request posted before it is done
    /// and its completion resolved: a window's bind holds the window until
    /// then, and deallocating it earlier would wait for that).
    pub(super) sq_done: u64,
}

/// The vendor id soft-RoCE (rxe) reports.
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// The flags by which a device's receive completions say the sender
/// invalidated an rkey. `IBV_WC_WITH_INV` everywhere; on soft-RoCE also
/// bit 2: its kernel driver writes the kernel's flag values into the CQ it
/// shares with user space, and the kernel's `IB_WC_WITH_INVALIDATE` is bit
/// 2, which libibverbs calls `IBV_WC_IP_CSUM_OK` (measured: Linux 6.1 and
/// rdma-core 44 report a `SEND_WITH_INV` as flags `0x5`, the rkey in the
/// immediate data field; rxe never reports a checksum). Soft-iWARP's
/// provider reports no flags at all (measured: 0), so its remote
/// invalidations go unseen and it keeps deregistering each chunk.
fn remote_inv_flags(vendor_id: u32) -> WcFlags {
    if vendor_id == RXE_VENDOR_ID {
        WcFlags::WITH_INV | WcFlags::IP_CSUM_OK
    } else {
        WcFlags::WITH_INV
    }
}

impl Conn {
    pub(super) async fn connect(addr: SocketAddr, o: &Options, stats: &Arc<Stats>) -> Result<Conn> {
        // One deadline for every step: "no server" fails within it.
        let deadline = Instant::now() + o.connect_timeout;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let at = |e: Error| match e {
            Error::NotConnected(m) => Error::NotConnected(format!("connecting to {addr}: {m}")),
            e => e,
        };
        let cm = rt::cm_channel().map_err(rdma_err("rdma_create_event_channel"))?;
        let mut id = cm
            .create_id(PortSpace::Tcp)
            .map_err(rdma_err("rdma_create_id"))?;
        step(
            left(),
            o.connect_timeout,
            "rdma_resolve_addr",
            id.resolve_addr(None, addr, left()),
        )
        .await
        .map_err(at)?;
        step(
            left(),
            o.connect_timeout,
            "rdma_resolve_route",
            id.resolve_route(left()),
        )
        .await
        .map_err(at)?;
        let ctx = id.id().context().map_err(rdma_err("rdma_cm context"))?;
        let pd = ctx.alloc_pd().map_err(rdma_err("ibv_alloc_pd"))?;
        let vendor = ctx
            .query_device()
            .map_err(rdma_err("ibv_query_device"))?
            .vendor_id();
        let inv_flags = remote_inv_flags(vendor);
        let dealloc = match o.end_access {
            EndAccess::Auto => vendor == RXE_VENDOR_ID,
            EndAccess::LocalInvalidate => false,
            EndAccess::Deallocate => true,
        };
        let channel = ctx
            .create_comp_channel()
            .map_err(rdma_err("ibv_create_comp_channel"))?;
        // Send queue: a SEND per call in flight, and a bind and an
        // invalidation per pooled region.
        let regions = o.chunk_regions.max(3);
        let send_wr = o.credits + 2 * u32::try_from(regions).unwrap_or(u32::MAX / 4) + 4;
        let cq = ctx
            .create_cq(send_wr + o.credits + 2, Some(&channel), 0)
            .map_err(rdma_err("ibv_create_cq"))?;
        let acq = rt::completions(&cq).map_err(rdma_err("rdma::aio completions"))?;
        let mut qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .max_send_wr(send_wr)
            .max_recv_wr(o.credits)
            .max_send_sge(1)
            .max_recv_sge(1)
            .build()
            .map_err(rdma_err("ibv_create_qp"))?;
        let recv_pool = BufferPool::new(
            &pd,
            o.inline_recv,
            o.credits as usize,
            AccessFlags::LOCAL_WRITE,
        )
        .map_err(rdma_err("receive buffers"))?;
        let send_pool =
            BufferPool::new(&pd, o.inline_send, o.credits as usize, AccessFlags::empty())
                .map_err(rdma_err("send buffers"))?;
        id.id()
            .modify_qp(&qp, QpState::Init)
            .map_err(rdma_err("ibv_modify_qp(INIT)"))?;
        // Every receive is posted before the first call can be sent (siw
        // has no RNR retry: a SEND without a receive breaks the connection).
        let mut next_wr = 0;
        while let Some(buf) = recv_pool.take() {
            next_wr += 1;
            qp.post_recv(RECV | next_wr, buf)
                .map_err(|e| Error::NotConnected(format!("ibv_post_recv: {e}")))?;
        }
        let chunks = ChunkPool::new(&pd, o.memory_windows, regions, stats);
        stats
            .memory_windows
            .store(chunks.windows(), Ordering::Relaxed);
        // Remote invalidation only for windows (`Negotiated::remote_invalidation`).
        let offer_inv = o.private_data && o.remote_invalidation && chunks.windows();
        let mut param = ConnParam::default();
        if o.private_data {
            param.private_data = ConnectPrivate {
                version: 1,
                flags: if offer_inv {
                    CP_FLAG_REMOTE_INVALIDATE
                } else {
                    0
                },
                send_size: o.inline_send,
                recv_size: o.inline_recv,
            }
            .encode()
            .to_vec();
        }
        let peer = match tokio::time::timeout(left(), id.connect(&qp, &param)).await {
            Err(_) => {
                return Err(Error::NotConnected(format!(
                    "rdma_connect to {addr}: no answer within {:?} of the connection's start",
                    o.connect_timeout
                )))
            }
            Ok(Err(rdma::Error::CmEvent {
                event: CmEventType::Rejected,
                ..
            })) => {
                return Err(Error::NotConnected(format!(
                    "rdma_connect to {addr}: rejected (is an NFS server listening for RDMA \
                     on port {}?)",
                    addr.port()
                )))
            }
            Ok(Err(e)) => return Err(Error::NotConnected(format!("rdma_connect to {addr}: {e}"))),
            Ok(Ok(p)) => p,
        };
        let server = ConnectPrivate::decode(&peer.private_data);
        let negotiated = match server {
            Some(s) => Negotiated {
                inline_send: o.inline_send.min(s.recv_size),
                inline_recv: o.inline_recv,
                server_private: true,
                remote_invalidation: offer_inv,
            },
            None => Negotiated {
                inline_send: o.inline_send.min(DEFAULT_INLINE),
                inline_recv: o.inline_recv,
                server_private: false,
                remote_invalidation: offer_inv,
            },
        };
        Ok(Conn {
            qp,
            acq,
            send_pool,
            _recv_pool: recv_pool,
            chunks,
            id,
            negotiated,
            tails: HashMap::new(),
            next_wr,
            inv_flags,
            dealloc,
            sq_done: 0,
        })
    }

    pub(super) fn next_id(&mut self) -> u64 {
        next_id(&mut self.next_wr)
    }
}

pub(super) fn next_id(next: &mut u64) -> u64 {
    *next = (*next + 1) & !RECV;
    *next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_invalidation_is_read_from_rxe_s_kernel_bit_only_on_rxe() {
        // rxe: IBV_WC_WITH_INV, or bit 2 (its kernel's IB_WC_WITH_INVALIDATE).
        let rxe = remote_inv_flags(RXE_VENDOR_ID);
        assert!(rxe.contains(WcFlags::WITH_INV));
        assert!(
            WcFlags::from_bits_retain(0x5).intersects(rxe),
            "rxe's SEND_WITH_INV"
        );
        assert!(
            !WcFlags::from_bits_retain(0x1).intersects(rxe),
            "rxe's plain SEND"
        );
        // Any other device: IBV_WC_WITH_INV only (a checksum flag is not an
        // invalidation there).
        let other = remote_inv_flags(0x02c9);
        assert_eq!(other, WcFlags::WITH_INV);
        assert!(!WcFlags::from_bits_retain(0x5).intersects(other));
    }
}
