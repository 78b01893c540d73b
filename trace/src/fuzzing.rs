//! The fuzzing entry point: [`run`] takes arbitrary bytes and drives every decoder and
//! reassembler with them. The cargo-fuzz target in `fuzz/` calls it, and so does the test suite
//! (`tests/no_panic.rs`) on the committed corpus (`tests/corpus/decode/`, in the package) and on mutations of
//! it, with stable Rust. Nothing it reaches may panic, and memory stays within the limits it
//! sets (it checks them).
//!
//! The first byte chooses how the rest is read:
//! - 0: a pcap or pcapng file, through what `show`, `messages` and `rpc` do;
//! - 1: frames, each a link type byte (0 Ethernet, 1 Linux SLL, 2 SLL2, 3 raw IP), a 16-bit
//!   length and that many bytes;
//! - 2: TCP segments of one connection between two fixed endpoints, each a direction byte (bit
//!   0; bit 1: SYN), a 32-bit sequence number, a 16-bit length and that many bytes;
//! - anything else: the rest handed to each header parser on its own.

use crate::iwarp::{self, IwarpLimits};
use crate::reasm::{Assembler, Limits};
use crate::rpc::{RpcLimits, Tracker};
use crate::tcp::TcpLimits;
use crate::{cm, decode, for_each_frame, ib, rpcrdma, Decoded};

/// The limits [`run`] uses: small, so that the fuzzer reaches them.
const LIMITS: Limits = Limits {
    max_age: 256,
    max_pending: 32,
    max_pending_total: 48,
    max_open: 8,
    max_kept: 1 << 18,
    max_requests: 32,
    max_flows: 16,
    keep_data: 1 << 16,
    hash_kept: false,
};

const IWARP_LIMITS: IwarpLimits = IwarpLimits {
    tcp: TcpLimits { max_ahead: 1 << 16 },
    max_frame: 80 << 10,
    max_streams: 16,
};

/// Everything the decoders keep, checked against the limits after each frame.
struct Pipeline {
    roce: Assembler,
    iwarp: iwarp::Decoder,
    iwarp_messages: iwarp::Assembler,
    rpc: Tracker,
}

impl Pipeline {
    fn new() -> Self {
        Pipeline {
            roce: Assembler::with_limits(LIMITS),
            iwarp: iwarp::Decoder::with_limits(IWARP_LIMITS),
            iwarp_messages: iwarp::Assembler::with_limits(LIMITS),
            rpc: Tracker::with_limits(RpcLimits {
                max_calls: 16,
                max_ahead: 1 << 16,
            }),
        }
    }

    fn frame(&mut self, number: u64, linktype: i32, data: &[u8]) {
        match decode(linktype, data) {
            Decoded::Roce(p) => self.roce.push(number, &p),
            Decoded::Tcp(s) => self.segment(number, &s),
            _ => {}
        }
        self.drain();
    }

    fn segment(&mut self, number: u64, s: &iwarp::Segment<'_>) {
        let msgs = &mut self.iwarp_messages;
        self.iwarp.push(number, s, &mut |p, payload| {
            let _ = serde_json::to_string(p);
            msgs.push(p, payload);
        });
        self.drain();
    }

    fn drain(&mut self) {
        for m in self.roce.drain().chain(self.iwarp_messages.drain()) {
            let _ = serde_json::to_string(&m);
            self.rpc.push(&m);
        }
        self.rpc.drain().for_each(drop);
        assert!(
            self.iwarp_messages.outstanding() <= 2 * LIMITS.max_requests + 2,
            "iWARP messages"
        );
        assert!(
            self.iwarp.held() <= IWARP_LIMITS.max_streams * (IWARP_LIMITS.max_frame + (1 << 18)),
            "iWARP streams"
        );
        assert!(self.rpc.outstanding() <= 16, "RPC calls");
    }

    fn finish(mut self) {
        let msgs = &mut self.iwarp_messages;
        self.iwarp.finish(&mut |p, payload| msgs.push(p, payload));
        self.roce.finish();
        self.iwarp_messages.finish();
        self.drain();
        self.rpc.finish();
        self.rpc.drain().for_each(drop);
    }
}

/// Drives the decoders with `data` (see the module documentation). Panics only when a limit
/// is exceeded, which is a bug.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => {
            let mut p = Pipeline::new();
            let _ = for_each_frame(rest, |f| p.frame(f.number, f.linktype, f.data));
            p.finish();
        }
        1 => {
            let mut p = Pipeline::new();
            let mut r = rest;
            let mut n = 0;
            while let [link, a, b, tail @ ..] = r {
                let len = usize::from(u16::from_be_bytes([*a, *b])).min(tail.len());
                let (frame, next) = tail.split_at(len);
                let linktype = match link % 4 {
                    0 => 1,
                    1 => 113,
                    2 => 276,
                    _ => 101,
                };
                n += 1;
                p.frame(n, linktype, frame);
                r = next;
            }
            p.finish();
        }
        2 => {
            let mut p = Pipeline::new();
            let ends = [([10, 8, 0, 1], 40000u16), ([10, 8, 0, 2], 7174u16)];
            let mut r = rest;
            let mut n = 0;
            while let [flags, s0, s1, s2, s3, l0, l1, tail @ ..] = r {
                let len = usize::from(u16::from_be_bytes([*l0, *l1])).min(tail.len());
                let (payload, next) = tail.split_at(len);
                let from = usize::from(flags & 1);
                let (src, dst) = (ends[from], ends[1 - from]);
                n += 1;
                let s = iwarp::Segment {
                    src: src.0.into(),
                    dst: dst.0.into(),
                    src_port: src.1,
                    dst_port: dst.1,
                    seq: u32::from_be_bytes([*s0, *s1, *s2, *s3]),
                    syn: flags & 2 != 0,
                    payload,
                };
                p.segment(n, &s);
                r = next;
            }
            p.finish();
        }
        _ => {
            let _ = ib::parse(rest, true);
            let _ = ib::parse(rest, false);
            let _ = cm::parse(rest);
            let _ = rpcrdma::parse_header(rest);
            let _ = rpcrdma::parse_rpc(rest);
            let _ = iwarp::parse_ddp(rest);
        }
    }
}
