//! What both ends of a 9P RDMA connection set up the same way: a PD, a CQ
//! awaited on tokio, an RC QP and its send and receive buffers.

use rdma::aio::{tokio_rt as rt, AsyncCq};

use crate::error::{rdma as rdma_err, Error};
use rdma::cm::CmId;
use rdma::{AccessFlags, BufferPool, ProtectionDomain, QpState, QpType, QueuePair};

/// Receive work requests have this bit in their `wr_id`; sends do not.
pub(crate) const RECV: u64 = 1 << 63;

/// A connection's queues and buffers, the QP in INIT.
pub(crate) struct Queues {
    pub pd: ProtectionDomain,
    pub acq: AsyncCq,
    pub qp: QueuePair,
    /// `rq` buffers of `msize` bytes, locally writable.
    pub recv_pool: BufferPool,
    /// `sq` buffers of `msize` bytes.
    pub send_pool: BufferPool,
}

impl Queues {
    /// Queues for `id` (its device known: a resolved route or a request):
    /// `sq` sends and `rq` receives of `msize` bytes.
    pub fn new(id: &CmId, sq: u32, rq: u32, msize: usize) -> Result<Queues, Error> {
        let ctx = id.context().map_err(rdma_err("context"))?;
        let pd = ctx.alloc_pd().map_err(rdma_err("ibv_alloc_pd"))?;
        let channel = ctx
            .create_comp_channel()
            .map_err(rdma_err("ibv_create_comp_channel"))?;
        let cq = ctx
            .create_cq(sq + rq, Some(&channel), 0)
            .map_err(rdma_err("ibv_create_cq"))?;
        let acq = rt::completions(&cq).map_err(rdma_err("rdma::aio"))?;
        let qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .max_send_wr(sq)
            .max_recv_wr(rq)
            .build()
            .map_err(rdma_err("ibv_create_qp"))?;
        let recv_pool = BufferPool::new(&pd, msize, rq as usize, AccessFlags::LOCAL_WRITE)
            .map_err(rdma_err("receive buffers"))?;
        let send_pool = BufferPool::new(&pd, msize, sq as usize, AccessFlags::empty())
            .map_err(rdma_err("send buffers"))?;
        id.modify_qp(&qp, QpState::Init)
            .map_err(rdma_err("ibv_modify_qp to INIT"))?;
        Ok(Queues {
            pd,
            acq,
            qp,
            recv_pool,
            send_pool,
        })
    }
}
