//! The commands: `show` and `messages` decode a capture frame by frame and
//! print packets, iWARP units or reassembled messages as they come; `rpc`
//! reassembles messages (on a second thread with `--threads 2`) and pairs
//! them into RPCs. What the reassemblers dropped or gave up on goes to
//! standard error.

use std::io::Write;
use std::sync::mpsc::Receiver;

use rdma_trace::iwarp;
use rdma_trace::reasm::{Assembler, Limits, Message};
use rdma_trace::rpc::Tracker;
use rdma_trace::{decode, for_each_frame, CaptureError, Decoded};

use super::args::{Args, Command};
use super::print::{print_message, print_packet, print_pdu, print_rpc};

pub(crate) fn run<R: std::io::Read + Send>(
    args: &Args,
    input: R,
    out: &mut impl Write,
) -> Result<(), CaptureError> {
    if args.command == Command::Rpc {
        return run_rpc(args, input, out);
    }
    let mut asm = Assembler::new();
    let mut iw = iwarp::Decoder::new();
    let mut iasm = iwarp::Assembler::new();
    let mut write_failed = false;
    let mut last_time = 0.0;
    let messages = args.command == Command::Messages;
    let r = for_each_frame(input, |frame| {
        if write_failed {
            return;
        }
        last_time = frame.time;
        let d = decode(frame.linktype, frame.data);
        let mut res = Ok(());
        if let Decoded::Tcp(seg) = &d {
            iw.push(frame.number, seg, &mut |p, payload| {
                if messages {
                    iasm.push(p, payload);
                } else if args.filter.pdu(p) && res.is_ok() {
                    res = print_pdu(out, p, frame.time, args.json);
                }
            });
        }
        if messages {
            if let Decoded::Roce(p) = &d {
                asm.push(frame.number, p);
            }
            res = res.and_then(|()| {
                asm.drain()
                    .chain(iasm.drain())
                    .filter(|m| args.filter.message(m))
                    .try_for_each(|m| print_message(out, &m, args.json))
            });
        } else if !matches!(d, Decoded::Tcp(_)) {
            res = print_packet(out, &frame, &d, args);
        }
        write_failed = res.is_err();
    });
    if write_failed {
        return r.map(|_| ());
    }
    let mut res = Ok(());
    iw.finish(&mut |p, payload| {
        if messages {
            iasm.push(p, payload);
        } else if args.filter.pdu(p) && res.is_ok() {
            res = print_pdu(out, p, last_time, args.json);
        }
    });
    if messages {
        asm.finish();
        iasm.finish();
        for m in asm.drain().chain(iasm.drain()) {
            if args.filter.message(&m) {
                res = res.and_then(|()| print_message(out, &m, args.json));
            }
        }
        let s = asm.stats();
        eprintln!(
            "rdma-trace: {} RoCE packets, {} messages complete, {} incomplete, {} duplicate and {} out-of-order packets, {} ACKs, {} NAKs",
            s.packets, s.complete, s.incomplete, s.duplicates, s.out_of_order, s.acks, s.naks
        );
        let i = iasm.stats();
        if i.segments > 0 {
            eprintln!(
                "rdma-trace: {} iWARP DDP segments, {} messages complete, {} incomplete, {} duplicate and {} out-of-order segments, {} Terminates",
                i.segments, i.complete, i.incomplete, i.duplicates, i.out_of_order, i.terminates
            );
        }
        Bounds { roce: s, iwarp: i }.report(0);
    }
    let t = iw.stats();
    if t.connections > 0 {
        eprintln!(
            "rdma-trace: {} iWARP connections, {} FPDUs ({} CRC errors); TCP: {} retransmitted, {} overlapping and {} out-of-order segments, {} bytes missing",
            t.connections, t.fpdus, t.crc_errors, t.retransmitted, t.overlapping, t.out_of_order, t.lost_bytes
        );
    }
    let _ = res;
    r.map(|_| ())
}

/// Payload kept per message for the RPC layer: RPC-over-RDMA moves at most a few MiB per
/// RDMA operation (NFS: 1 MiB), and only messages being reassembled hold it.
const RPC_KEEP: u64 = 16 << 20;

/// Reassembled messages handed from the decoding thread to the RPC thread at a time: a batch
/// goes once it holds this much payload (or [`BATCH_MESSAGES`] messages).
const BATCH_BYTES: usize = 1 << 20;
const BATCH_MESSAGES: usize = 256;
/// Batches in flight between the two threads. With [`BATCH_BYTES`] this bounds what the
/// pipeline adds to memory: a few batches, each at most one message over the threshold. On a
/// busy host, every time one thread waits for the other it waits for the scheduler too, so
/// batches are large and several are in flight: small ones, few at a time, left the two
/// threads together less of a loaded host than tshark's one thread.
const BATCH_QUEUE: usize = 8;
/// Payload buffers on their way back to the decoder for reuse.
const SPARES: usize = 64;

/// Decode and RDMA reassembly of a capture into messages, handed to `emit` in capture order
/// (the order `rpc` must see them in): the first half of `rpc`, whichever thread it runs on.
/// `emit` returns false when the consumer has stopped; the rest of the capture is then read
/// without decoding it. Payload buffers the consumer is done with come back through `spares`
/// to be reused.
fn rpc_messages<R: std::io::Read + Send>(
    input: R,
    spares: &Receiver<Vec<u8>>,
    mut emit: impl FnMut(Message) -> bool,
) -> Result<Bounds, CaptureError> {
    let limits = Limits {
        keep_data: RPC_KEEP,
        // The tracker hashes chunks; hashing each WRITE and READ as well doubled the cost.
        hash_kept: false,
        ..Limits::default()
    };
    let mut asm = Assembler::with_limits(limits);
    let mut iw = iwarp::Decoder::new();
    let mut iasm = iwarp::Assembler::with_limits(limits);
    let mut stopped = false;
    let r = for_each_frame(input, |frame| {
        if stopped {
            return;
        }
        match decode(frame.linktype, frame.data) {
            Decoded::Roce(p) => {
                // Only a FIRST or ONLY packet opens a message and takes a buffer: looking at
                // the channel on every packet cost 1% of `rpc --threads 1`.
                if matches!(
                    p.ib.op.position(),
                    Some(rdma_trace::ib::Position::First | rdma_trace::ib::Position::Only)
                ) {
                    for b in spares.try_iter() {
                        asm.recycle(b);
                    }
                }
                asm.push(frame.number, &p);
                stopped = !asm.drain().all(&mut emit);
            }
            Decoded::Tcp(seg) => {
                iw.push(frame.number, &seg, &mut |p, payload| iasm.push(p, payload));
                stopped = !iasm.drain().all(&mut emit);
            }
            _ => {}
        }
    });
    if !stopped {
        asm.finish();
        iw.finish(&mut |p, payload| iasm.push(p, payload));
        iasm.finish();
        let _ = asm.drain().chain(iasm.drain()).all(&mut emit);
    }
    r.map(|_| Bounds {
        roce: asm.stats(),
        iwarp: iasm.stats(),
    })
}

/// What the reassemblers gave up or left out to stay within their memory bounds.
struct Bounds {
    roce: rdma_trace::reasm::Stats,
    iwarp: iwarp::AssemblerStats,
}

impl Bounds {
    /// A line on standard error saying what was dropped to stay in bounds, when anything was
    /// (`rpc`: also the chunk data the tracker dropped).
    fn report(&self, ahead_dropped: u64) {
        let (r, i) = (&self.roce, &self.iwarp);
        let data = r.data_dropped + i.data_dropped;
        let open = r.open_dropped + i.open_dropped;
        if data + open + r.pending_dropped + ahead_dropped == 0 {
            return;
        }
        eprintln!(
            "rdma-trace: to stay within its memory bounds: {open} open messages given up, {} \
             packets ahead of a gap dropped, {data} messages without their kept payload, \
             {ahead_dropped} chunks' data ahead of a gap dropped (each reported incomplete)",
            r.pending_dropped
        );
    }
}

/// `rpc`: messages into RPCs, printed as they complete. With `threads` > 1, decoding and
/// reassembly run on a second thread, this one tracks RPCs, hashes chunks and prints; the
/// tracker sees the same messages in the same order either way, so the output is the same.
fn run_rpc<R: std::io::Read + Send>(
    args: &Args,
    input: R,
    out: &mut impl Write,
) -> Result<(), CaptureError> {
    // A call's digest with its read chunk spliced in is printed only in JSON: forming it
    // hashes that chunk a second time.
    let mut rpcs = Tracker::new().spliced_digests(args.json);
    let mut write_failed = false;
    let (spare_tx, spares) = std::sync::mpsc::sync_channel(SPARES);
    let mut take = |rpcs: &mut Tracker, m: Message| {
        if write_failed {
            return false;
        }
        rpcs.push(&m);
        if let Some(d) = m.data {
            // Dropped when the decoder has enough.
            let _ = spare_tx.try_send(d);
        }
        write_failed = rpcs
            .drain()
            .filter(|r| args.filter.addrs(r.client, r.server))
            .try_for_each(|r| print_rpc(out, &r, args.json))
            .is_err();
        !write_failed
    };
    let r = if args.threads <= 1 {
        rpc_messages(input, &spares, |m| take(&mut rpcs, m))
    } else {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Message>>(BATCH_QUEUE);
        std::thread::scope(|s| {
            let decoder = s.spawn(move || {
                let mut batch = Vec::new();
                let mut bytes = 0;
                let r = rpc_messages(input, &spares, |m| {
                    bytes += m.data.as_ref().map_or(0, Vec::len);
                    batch.push(m);
                    if bytes < BATCH_BYTES && batch.len() < BATCH_MESSAGES {
                        return true;
                    }
                    bytes = 0;
                    tx.send(std::mem::take(&mut batch)).is_ok()
                });
                if !batch.is_empty() {
                    let _ = tx.send(batch);
                }
                r
            });
            for batch in &rx {
                if !batch.into_iter().all(|m| take(&mut rpcs, m)) {
                    break;
                }
            }
            // The decoder stops at its next send once this end is gone.
            drop(rx);
            decoder
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    };
    if !write_failed {
        rpcs.finish();
        let res = rpcs
            .drain()
            .filter(|r| args.filter.addrs(r.client, r.server))
            .try_for_each(|r| print_rpc(out, &r, args.json));
        let s = rpcs.stats();
        eprintln!(
            "rdma-trace: {} calls, {} replies, {} RPCs complete, {} incomplete, {} other SENDs, {} RDMA operations outside any chunk",
            s.calls, s.replies, s.complete, s.incomplete, s.other_sends, s.unmatched_rdma
        );
        if let Ok(b) = &r {
            b.report(s.ahead_dropped);
        }
        let _ = res;
    }
    r.map(|_| ())
}
