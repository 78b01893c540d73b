//! The server that misbehaves: what it does wrong ([`Fault`], to the first
//! call; later calls get a correct reply), what it saw ([`Seen`]), and one
//! connection's loop of receives, faults and replies ([`serve_one`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma::aio::{tokio_rt as rt, AsyncCq};
use rdma::cm::ConnParam;
use rdma::{
    AccessFlags, ProtectionDomain, QpState, QpType, QueuePair, RemoteMemory, SendWr, WcOpcode,
    WcStatus,
};
use rdma_nfs::rpcrdma::{
    Body, Chunks, ConnectPrivate, Header, RdmaError, Segment, RDMA_MSG, VERSION,
};
use rdma_nfs::xdr::Writer;

/// What the server does wrong, to the first call (later calls get a
/// correct reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Nothing: every reply correct, granting `GRANT`.
    None,
    /// Every reply grants 0 credits.
    ZeroCredits,
    /// Every reply grants far more than the server posted.
    HugeCredits,
    /// `RDMA_ERROR ERR_VERS`.
    ErrVers,
    /// `RDMA_ERROR ERR_CHUNK`.
    ErrChunk,
    /// A header with an unknown procedure.
    BadProc,
    /// A header that ends inside its read list.
    Truncated,
    /// Writes 1000 bytes into the write chunk and says so.
    ShortWrite,
    /// Writes the chunk and says it wrote more than offered.
    LongWrite,
    /// Sends the reply through the reply chunk (correct, for contrast).
    ReplyChunk,
    /// Says the reply chunk holds more than offered.
    ReplyChunkOverrun,
    /// Never answers the first call.
    Drop,
    /// Answers the first call, then, when the second comes, RDMA WRITEs
    /// into the first call's write chunk (its call has ended) and records
    /// the outcome.
    LateWrite,
    /// Every reply to a call with a write chunk is a `SEND_WITH_INV` of
    /// that chunk's rkey (what Linux's server does when the client offers
    /// remote invalidation).
    Invalidate,
    /// The RPC reply inside the message carries another xid than the call's
    /// (the transport header's is right).
    WrongXid,
    /// The same through the reply chunk (`RDMA_NOMSG`).
    WrongXidReplyChunk,
    /// Fills the first call's write chunk with 0xaa; to the second, writes
    /// 100 bytes of the pattern and says it wrote the whole chunk.
    Overclaim,
    /// Answers as an NFS server whose directory never ends: FSINFO, then
    /// every READDIR with one entry and no end, its cookie the same every
    /// time (`advance` false) or a new one each time.
    EndlessDir { advance: bool },
    /// The first call with a write chunk is held until the next one comes;
    /// the next one's reply is a `SEND_WITH_INV` of the *held* call's
    /// rkey, then the held call gets a plain reply.
    StrayInvalidate,
    /// The same two calls the other way round: the held call gets its
    /// plain reply first (its call ends, and the client puts its window
    /// out of reach), and right behind it the next call's reply is a
    /// `SEND_WITH_INV` of the held call's rkey.
    InvalidateEnded,
    /// As `InvalidateEnded`, but the next call's reply waits until the test
    /// says the held call's reply was delivered ([`ended_call_delivered`]):
    /// the client has put the held call's window out of reach by then.
    InvalidateEndedAfter,
}

/// What `InvalidateEndedAfter`'s server waits for before it invalidates.
pub(crate) fn ended_call_delivered() -> &'static tokio::sync::Notify {
    static N: std::sync::OnceLock<tokio::sync::Notify> = std::sync::OnceLock::new();
    N.get_or_init(tokio::sync::Notify::new)
}

pub(crate) const GRANT: u32 = 8;
pub(crate) const RECVS: usize = 16;

#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) xids: Vec<u32>,
    pub(crate) connections: u32,
    /// Every write chunk offered, in order.
    pub(crate) write_segments: Vec<Segment>,
    /// The late write's completion status.
    pub(crate) late: Option<WcStatus>,
}

pub(crate) fn rpc_reply(xid: u32) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(xid).u32(1).u32(0).u32(0).u32(0).u32(0).u32(0xabcd);
    w.buf
}

/// The reply of an NFS server whose directories never end (the RPC call's
/// procedure at its sixth word): FSINFO with 64 KiB transfers; READDIR with
/// one entry of cookie `cookie` and no end.
pub(crate) fn endless_dir_reply(xid: u32, call: &[u8], cookie: u64) -> Vec<u8> {
    let proc_ = call
        .get(20..24)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let mut w = Writer::new();
    w.u32(xid).u32(1).u32(0).u32(0).u32(0).u32(0);
    match proc_ {
        // FSINFO: NFS3_OK, no attributes, rtmax, rtpref, rtmult, wtmax.
        19 => {
            w.u32(0).u32(0).u32(65536).u32(65536).u32(4096).u32(65536);
        }
        // READDIR: NFS3_OK, no attributes, a verifier, one entry, no end.
        16 => {
            w.u32(0).u32(0).fixed(&[0; 8]);
            w.u32(1).u64(cookie).opaque(b"again").u64(cookie);
            w.u32(0).u32(0);
        }
        // Anything else: NFS3ERR_NOTSUPP.
        _ => {
            w.u32(10004);
        }
    }
    w.buf
}

/// One connection of the server: replies to calls until the client goes.
pub(crate) async fn serve_one(
    incoming: rdma::aio::Incoming,
    fault: Fault,
    seen: Arc<Mutex<Seen>>,
) -> Result<(), String> {
    let e = |what: &'static str| move |err: rdma::Error| format!("{what}: {err}");
    let ctx = incoming.context().map_err(e("context"))?;
    let pd = ctx.alloc_pd().map_err(e("pd"))?;
    let ch = ctx.create_comp_channel().map_err(e("channel"))?;
    let cq = ctx.create_cq(64, Some(&ch), 0).map_err(e("cq"))?;
    let mut acq = rt::completions(&cq).map_err(e("aio"))?;
    let mut qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(32)
        .max_recv_wr(RECVS as u32)
        .build()
        .map_err(e("qp"))?;
    incoming
        .id()
        .modify_qp(&qp, QpState::Init)
        .map_err(e("init"))?;
    for i in 0..RECVS {
        let buf = pd
            .alloc_mr(4096, AccessFlags::LOCAL_WRITE)
            .map_err(e("mr"))?;
        qp.post_recv(1 << 32 | i as u64, buf)
            .map_err(|err| format!("post_recv: {err}"))?;
    }
    // Inline sizes through RFC 8797: the client may send 2 KiB.
    let private = ConnectPrivate {
        version: 1,
        flags: 0,
        send_size: 4096,
        recv_size: 2048,
    }
    .encode();
    let mut id = incoming
        .accept(&qp, &ConnParam::with_private_data(&private))
        .await
        .map_err(e("accept"))?;
    let first = {
        let mut s = seen.lock().unwrap();
        s.connections += 1;
        s.connections == 1
    };
    let mut answered_first = !first;
    let mut wr = 0u64;
    let mut first_write: Option<Segment> = None;
    // StrayInvalidate: the held call's xid and write list.
    let mut held: Option<(u32, Vec<Vec<Segment>>)> = None;
    let mut stray_done = false;
    let mut calls = 0u64;
    loop {
        let c = tokio::select! {
            c = acq.next() => c.map_err(e("poll"))?,
            _ = id.next_event() => return Ok(()),
        };
        if c.status != WcStatus::Success {
            // Flushed: the client went away.
            return Ok(());
        }
        let mut c = c;
        let Some(buf) = c.take_buffers().into_one() else {
            continue;
        };
        if c.opcode != WcOpcode::Recv {
            continue;
        }
        let bytes = buf.to_vec()[..c.byte_len as usize].to_vec();
        qp.post_recv(c.wr_id, buf)
            .map_err(|err| format!("post_recv: {err}"))?;
        let (h, hlen) = Header::decode(&bytes).map_err(|err| format!("client header: {err}"))?;
        let call = bytes[hlen..].to_vec();
        calls += 1;
        // The RPC reply to this call (what this server answers with).
        let rpc = |xid| match fault {
            Fault::EndlessDir { advance } => {
                endless_dir_reply(xid, &call, if advance { calls } else { 5 })
            }
            _ => rpc_reply(xid),
        };
        seen.lock().unwrap().xids.push(h.xid);
        let chunks = match &h.body {
            Body::Msg(c) | Body::NoMsg(c) => c.clone(),
            Body::Error(_) => return Err("the client sent RDMA_ERROR".into()),
        };
        if let Some(chunk) = chunks.write.first() {
            seen.lock().unwrap().write_segments.push(chunk[0]);
        }
        if let (Fault::LateWrite, Some(old), true) = (fault, first_write, first) {
            // The first call has ended (the client sent this one after its
            // reply): its chunk must be out of reach.
            let mr = pd
                .reg_mr(vec![0xee; 64], AccessFlags::empty())
                .map_err(e("mr"))?;
            let late = 1 << 40;
            let remote = RemoteMemory {
                addr: old.offset,
                len: 64,
                rkey: old.handle,
            };
            acq.post_send(&mut qp, SendWr::write(late, mr, remote))
                .await
                .map_err(|err| format!("late RDMA WRITE: {err}"))?;
            loop {
                let c = tokio::time::timeout(Duration::from_secs(20), acq.next())
                    .await
                    .map_err(|_| "no completion for the late write within 20 s".to_string())?
                    .map_err(e("poll"))?;
                if c.wr_id == late {
                    seen.lock().unwrap().late = Some(c.status);
                    // The connection is broken either way: the client
                    // reconnects and sends this call again.
                    return Ok(());
                }
            }
        }
        let f = if answered_first { Fault::None } else { fault };
        answered_first = true;
        if first_write.is_none() {
            first_write = chunks.write.first().map(|c| c[0]);
        }
        let credits = match f {
            Fault::ZeroCredits => 0,
            Fault::HugeCredits => 1_000_000,
            _ if fault == Fault::ZeroCredits => 0,
            _ if fault == Fault::HugeCredits => 1_000_000,
            _ => GRANT,
        };
        let mut out = Writer::new();
        let header = |body: Body| Header {
            xid: h.xid,
            vers: VERSION,
            credits,
            body,
        };
        // The write chunk, filled with a pattern when offered.
        let mut write_list = Vec::new();
        if let Some(chunk) = chunks.write.first() {
            let seg = chunk[0];
            let overclaim = fault == Fault::Overclaim && calls == 2;
            let n = match f {
                Fault::ShortWrite => 1000,
                _ if overclaim => 100,
                _ => seg.length,
            };
            let data: Vec<u8> = if fault == Fault::Overclaim && calls == 1 {
                vec![0xaa; n as usize]
            } else {
                (0..n).map(|i| (i % 251) as u8).collect()
            };
            let mr = pd.reg_mr(data, AccessFlags::empty()).map_err(e("mr"))?;
            wr += 1;
            let remote = RemoteMemory {
                addr: seg.offset,
                len: u64::from(n),
                rkey: seg.handle,
            };
            acq.post_send(&mut qp, SendWr::write(wr, mr, remote))
                .await
                .map_err(|err| format!("RDMA WRITE: {err}"))?;
            let said = if f == Fault::LongWrite {
                seg.length + 4
            } else if overclaim {
                seg.length
            } else {
                n
            };
            write_list.push(vec![Segment {
                length: said,
                ..seg
            }]);
        }
        let holds = matches!(
            fault,
            Fault::StrayInvalidate | Fault::InvalidateEnded | Fault::InvalidateEndedAfter
        );
        if holds && first && !stray_done && held.is_none() && !write_list.is_empty() {
            held = Some((h.xid, write_list));
            continue;
        }
        // The rkey this reply invalidates, if any.
        let invalidate = match (fault, &held) {
            (Fault::Invalidate, _) => write_list.first().map(|c| c[0].handle),
            (
                Fault::StrayInvalidate | Fault::InvalidateEnded | Fault::InvalidateEndedAfter,
                Some((_, w)),
            ) => w.first().map(|c| c[0].handle),
            _ => None,
        };
        let via_reply_chunk = match f {
            Fault::ReplyChunk | Fault::ReplyChunkOverrun | Fault::WrongXidReplyChunk => true,
            _ => matches!(fault, Fault::EndlessDir { .. }) && chunks.reply.is_some(),
        };
        match f {
            Fault::Drop => continue,
            Fault::ErrVers => {
                header(Body::Error(RdmaError::Vers { low: 1, high: 1 })).encode(&mut out)
            }
            Fault::ErrChunk => header(Body::Error(RdmaError::Chunk)).encode(&mut out),
            Fault::BadProc => {
                out.u32(h.xid).u32(VERSION).u32(credits).u32(9);
            }
            Fault::Truncated => {
                out.u32(h.xid)
                    .u32(VERSION)
                    .u32(credits)
                    .u32(RDMA_MSG)
                    .u32(1)
                    .u32(0);
            }
            _ if via_reply_chunk => {
                let Some(reply) = chunks.reply.clone() else {
                    return Err("no reply chunk offered".into());
                };
                let seg = reply[0];
                let rpc_xid = if f == Fault::WrongXidReplyChunk {
                    h.xid ^ 1
                } else {
                    h.xid
                };
                let msg = rpc(rpc_xid);
                let mr = pd
                    .reg_mr(msg.clone(), AccessFlags::empty())
                    .map_err(e("mr"))?;
                wr += 1;
                let remote = RemoteMemory {
                    addr: seg.offset,
                    len: msg.len() as u64,
                    rkey: seg.handle,
                };
                acq.post_send(&mut qp, SendWr::write(wr, mr, remote))
                    .await
                    .map_err(|err| format!("RDMA WRITE: {err}"))?;
                let said = if f == Fault::ReplyChunkOverrun {
                    seg.length + 1
                } else {
                    msg.len() as u32
                };
                header(Body::NoMsg(Chunks {
                    read: vec![],
                    write: write_list,
                    reply: Some(vec![Segment {
                        length: said,
                        ..seg
                    }]),
                }))
                .encode(&mut out);
            }
            _ => {
                header(Body::Msg(Chunks {
                    read: vec![],
                    write: write_list,
                    reply: None,
                }))
                .encode(&mut out);
                let rpc_xid = if f == Fault::WrongXid {
                    h.xid ^ 1
                } else {
                    h.xid
                };
                out.buf.extend_from_slice(&rpc(rpc_xid));
            }
        }
        // The held call's plain reply: after this one (StrayInvalidate), or
        // before it (InvalidateEnded).
        let held_reply = |xid: u32, write: Vec<Vec<Segment>>| {
            let mut out = Writer::new();
            Header {
                xid,
                vers: VERSION,
                credits,
                body: Body::Msg(Chunks {
                    read: vec![],
                    write,
                    reply: None,
                }),
            }
            .encode(&mut out);
            out.buf.extend_from_slice(&rpc_reply(xid));
            out.buf
        };
        let (ended, stray) = match (fault, held.take()) {
            (Fault::InvalidateEnded | Fault::InvalidateEndedAfter, h) => (h, None),
            (Fault::StrayInvalidate, h) => (None, h),
            _ => (None, None),
        };
        if let Some((xid, write)) = ended {
            stray_done = true;
            send_held(&mut acq, &mut qp, &pd, &mut wr, held_reply(xid, write)).await?;
            if fault == Fault::InvalidateEndedAfter {
                tokio::time::timeout(Duration::from_secs(20), ended_call_delivered().notified())
                    .await
                    .map_err(|_| "the held call's reply not delivered within 20 s".to_string())?;
            }
        }
        let mr = pd.reg_mr(out.buf, AccessFlags::empty()).map_err(e("mr"))?;
        wr += 1;
        let send = match invalidate {
            Some(rkey) => SendWr::send_with_invalidate(wr, mr, rkey),
            None => SendWr::send(wr, mr),
        };
        acq.post_send(&mut qp, send)
            .await
            .map_err(|err| format!("SEND: {err}"))?;
        if let Some((xid, write)) = stray {
            stray_done = true;
            send_held(&mut acq, &mut qp, &pd, &mut wr, held_reply(xid, write)).await?;
        }
    }
}

/// Sends `reply`, the held call's, as the next SEND (`wr`).
async fn send_held(
    acq: &mut AsyncCq,
    qp: &mut QueuePair,
    pd: &ProtectionDomain,
    wr: &mut u64,
    reply: Vec<u8>,
) -> Result<(), String> {
    let mr = pd
        .reg_mr(reply, AccessFlags::empty())
        .map_err(|err| format!("mr: {err}"))?;
    *wr += 1;
    acq.post_send(qp, SendWr::send(*wr, mr))
        .await
        .map_err(|err| format!("SEND (held call): {err}"))
}

/// Accepts connections on `addr` until the test ends.
pub(crate) async fn serve(listener: rdma::aio::AsyncCmId, fault: Fault, seen: Arc<Mutex<Seen>>) {
    let mut listener = listener;
    while let Ok(incoming) = listener.get_request().await {
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            if let Err(e) = serve_one(incoming, fault, seen).await {
                eprintln!("test server: {e}");
            }
        });
    }
}
