//! RPC-over-RDMA reassembly: reassembled RDMA messages (from [`crate::reasm`]) into RPC calls
//! and replies with their chunks.
//!
//! The model is nfstest's (`packet.transport.rdmainfo`): an RPC message is made of chunks, a
//! chunk of segments identified by their handle (rkey), and a segment may be moved by several
//! RDMA operations (sub-segments: each RDMA WRITE or READ request with the segment's handle and
//! a shorter length, at an address further into it).
//!
//! - A call's SEND (RDMA_MSG or RDMA_NOMSG) announces its chunks: read chunks (the read list's
//!   segments grouped by XDR position), write chunks and a reply chunk. Each segment's handle is
//!   remembered until the call completes.
//! - RDMA READ responses (server reading the client's memory: the call's read chunks) and RDMA
//!   WRITEs (server writing into it: write chunks and the reply chunk) are matched to the
//!   segment by the client's address and the rkey, and placed by their address inside it. Each
//!   chunk's data is hashed in segment order and address order as soon as it is contiguous;
//!   data ahead of a gap is kept until the gap fills.
//! - The reply (matched to its call by client, server and XID) says how much of each write
//!   chunk and of the reply chunk was used; the RPC is complete when its reply is in and every
//!   chunk holds the bytes the call (read chunks) or the reply (write and reply chunks) says.
//! - Read chunks' data belongs at their XDR position in the call: a call with one read chunk
//!   gets the digest of the whole message, the inline part with the chunk's data (XDR-padded)
//!   spliced in at its position, hashed as the chunk's data comes. A position-zero read chunk
//!   (RDMA_NOMSG) or the reply chunk holds the whole RPC message, whose header is decoded from
//!   it. A call's reassembled length is its inline part plus its read chunks, a reply's its
//!   inline part plus its write chunks (or its reply chunk); where a write chunk's data sits in
//!   the reply is the upper protocol's business (NFS), so such a reply has chunk digests only.
//! - What never completes (a call without its reply, a reply without its call, a chunk missing
//!   data) is reported as incomplete, with why.
//!
//! Here: what comes out (RPCs and their chunks, counters) and the limits. `chunk.rs`: a chunk,
//! its data put in order and hashed. `tracker.rs`: the reassembler ([`Tracker`]).

use std::net::IpAddr;

use serde::Serialize;

/// Bytes of a position-zero read chunk or a reply chunk kept to decode the RPC header in it.
const HEAD: usize = 512;

/// What kind of chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkKind {
    /// A read chunk: the client's data the server READs, at an XDR position of the call.
    Read,
    /// A write chunk: the server WRITEs a reply's bulk data into it.
    Write,
    /// The reply chunk: the server WRITEs the whole reply into it.
    Reply,
}

/// One segment of a chunk, as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentReport {
    /// rkey.
    pub handle: u32,
    /// Address.
    pub offset: u64,
    /// Length the call offered.
    pub offered: u32,
    /// Length the reply says was used (write and reply chunks).
    pub used: Option<u32>,
    /// Bytes seen moving into (or out of) it.
    pub received: u64,
}

/// A chunk of an RPC, as reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkReport {
    /// Read, write or reply chunk.
    pub kind: ChunkKind,
    /// Read chunks: the XDR position.
    pub position: Option<u32>,
    /// Its segments in order.
    pub segments: Vec<SegmentReport>,
    /// Bytes of the chunk reassembled in order.
    pub length: u64,
    /// SHA-256 of the chunk's data (segments in order); `None` unless it is complete.
    pub sha256: Option<String>,
}

/// One side (call or reply) of an RPC as its SEND carried it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Side {
    /// Frame number of the SEND's first packet (the one with the transport header).
    pub frame: u64,
    /// Frame number of its last packet.
    pub last_frame: u64,
    /// RPC-over-RDMA procedure (`RDMA_MSG`, `RDMA_NOMSG`, `RDMA_ERROR`).
    pub proc: &'static str,
    /// Credits asked for (call) or granted (reply).
    pub credits: u32,
    /// Bytes of the RPC message carried in the SEND after the transport header.
    pub inline: u64,
    /// The RPC message: inline part plus its chunks' data.
    pub length: u64,
    /// SHA-256 of the SEND's payload (transport header included).
    pub send_sha256: Option<String>,
    /// SHA-256 of the reassembled RPC message: the inline part with its read chunk spliced in
    /// at its XDR position (padded to 4 bytes), the position-zero read chunk or the reply chunk
    /// that holds it, or the inline part alone. `None` when it cannot be formed here: a reply
    /// with write chunks (where their data sits is the upper protocol's business), several
    /// read chunks, or a chunk incomplete.
    pub sha256: Option<String>,
}

/// An RPC call and its reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rpc {
    /// Transaction id.
    pub xid: u32,
    /// The caller.
    pub client: IpAddr,
    /// The server.
    pub server: IpAddr,
    /// RPC program (100003 for NFS).
    pub program: Option<u32>,
    /// Program version.
    pub version: Option<u32>,
    /// Procedure.
    pub procedure: Option<u32>,
    /// The reply's status: `SUCCESS`, ..., or `RDMA_ERROR ...`.
    pub status: Option<String>,
    /// The call's SEND.
    pub call: Option<Side>,
    /// The reply's SEND.
    pub reply: Option<Side>,
    /// The chunks: read chunks, write chunks, then the reply chunk.
    pub chunks: Vec<ChunkReport>,
    /// Copies of the call seen again while it was outstanding.
    pub retransmissions: u32,
    /// NFSv4 COMPOUND (program 100003, version 4, procedure 1): the operations the call asks
    /// for, by name, and `+N` when `N` more followed one whose arguments are not decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfs_ops: Option<Vec<String>>,
    /// NFS (program 100003): the status the reply's results start with (`nfsstat3`, or
    /// `nfsstat4` for a COMPOUND), when the reply is an accepted success sent inline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfs_status: Option<u32>,
    /// `None` when complete, else why not.
    pub incomplete: Option<String>,
}

/// Counters over the whole capture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RpcStats {
    /// Calls seen.
    pub calls: u64,
    /// Replies seen.
    pub replies: u64,
    /// RPCs complete (call, reply, every chunk).
    pub complete: u64,
    /// RPCs reported incomplete.
    pub incomplete: u64,
    /// SENDs that are not RPC-over-RDMA version 1 (or not kept whole).
    pub other_sends: u64,
    /// RDMA WRITEs and READs that belong to no outstanding chunk.
    pub unmatched_rdma: u64,
    /// Chunks whose data ahead of a gap was dropped to stay within
    /// [`RpcLimits::max_ahead`] (their RPCs are reported incomplete, saying so).
    pub ahead_dropped: u64,
}

/// Limits that bound memory.
#[derive(Clone, Copy, Debug)]
pub struct RpcLimits {
    /// Outstanding calls kept; the oldest is reported incomplete beyond it.
    pub max_calls: usize,
    /// Bytes of chunk data kept ahead of a gap (waiting for the data before it) over all
    /// outstanding calls: a chunk whose data would take more gives up its gap, drops what it
    /// kept and is reported incomplete ([`RpcStats::ahead_dropped`]).
    pub max_ahead: usize,
}

impl Default for RpcLimits {
    fn default() -> Self {
        RpcLimits {
            max_calls: 1 << 14,
            max_ahead: 16 << 20,
        }
    }
}

mod chunk;
#[cfg(test)]
mod tests;
mod tracker;

pub use tracker::Tracker;
