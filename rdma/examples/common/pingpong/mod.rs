//! The pingpong examples' part of [`crate::common`]: code shared by the pingpong examples (`rc_pingpong`, `uc_pingpong`,
//! `ud_pingpong`, `srq_pingpong`): flag parsing, the TCP handshake of
//! rdma-core's `ibv_*_pingpong` tools, and the ping-pong loop itself
//! (`srq_pingpong`, with its many QPs, has a loop of its own), along its
//! seams: [`flags`] (the command line), [`device`] (opening the device,
//! completion channel, on-demand paging), [`handshake`] (the TCP exchange
//! of addresses) and [`traffic`] (buffers and the ping-pong loop).
//!
//! # Handshake (rdma-core `libibverbs/examples/pingpong.c`)
//! Each side describes itself in one 52-byte message: the text
//! `LLLL:QQQQQQ:PPPPPP:GGGG...` (LID, QP number and initial PSN in lower-case
//! hex, zero-padded to 4, 6 and 6 digits, then the GID as 32 hex digits, the
//! 16 raw bytes in wire order) followed by NUL bytes up to 52.
//!
//! 1. The client connects and sends its message.
//! 2. The server reads it, moves its QP to RTR/RTS towards the client, and
//!    sends its own message.
//! 3. The client reads it and answers with the 5 bytes `"done\0"`.
//!
//! The client connects its QP after the exchange and sends the first ping.
//! `ibv_srq_pingpong` sends a fixed number of such messages each way instead
//! of one (see [`exchange_all`]).
//!
//! # Traffic
//! Both sides keep `rx_depth` receives posted and refill them when only one
//! is left. A side sends its next message once its previous send has
//! completed *and* a message has arrived; the client sends first. Each side
//! sends and receives `iters` messages of `size` bytes.

pub mod device;
pub mod flags;
pub mod handshake;
pub mod traffic;

// Each example uses some of these: unused in one is not unused in all.
#[allow(unused_imports)]
pub use device::*;
#[allow(unused_imports)]
pub use flags::*;
#[allow(unused_imports)]
pub use handshake::*;
#[allow(unused_imports)]
pub use traffic::*;

#[allow(unused_imports)]
pub use super::Res;

/// `wr_id` of every receive.
pub const RECV_WRID: u64 = 1;
/// `wr_id` of every send.
pub const SEND_WRID: u64 = 2;
/// The Q_Key both UD tools use.
pub const UD_QKEY: u32 = 0x1111_1111;
/// The Global Routing Header at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;
/// The TCP port of the handshake, unless `-p` says otherwise.
pub const DEFAULT_TCP_PORT: u16 = 18515;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::args::ArgError;
    use std::net::Ipv4Addr;

    use rdma::{Gid, Mtu};

    const RC: Tool = Tool {
        name: "rc_pingpong",
        twin: "ibv_rc_pingpong",
        default_size: 4096,
        has_mtu: true,
        rc_flags: true,
        unsupported: &[Unsupported {
            short: 'O',
            long: "iodp",
            why: "implicit ODP",
        }],
    };

    fn parse(args: &[&str]) -> Result<Opts, ArgError> {
        parse_args(&RC, args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn wire_format_matches_the_c_tools() {
        // What ibv_rc_pingpong sends for QPN 0x11, PSN 0x4c5d1e, GID ::ffff:10.8.0.1.
        let c = b"0000:000011:4c5d1e:00000000000000000000ffff0a080001\0";
        assert_eq!(c.len(), MSG_LEN);
        let d = Dest::from_wire(c).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0, 0x11, 0x4c_5d1e));
        assert_eq!(d.gid, Gid::from(Ipv4Addr::new(10, 8, 0, 1)));
        assert_eq!(&d.to_wire(), c);
        assert!(Dest::from_wire(b"0000:000011:4c5d1e:0000\0").is_err());
        assert!(Dest::from_wire(b"zz:1:2:00000000000000000000ffff0a080001\0").is_err());
    }

    #[test]
    fn flags_parse_like_getopt_long() {
        let o = parse(&["-n50", "-ec", "--size=64", "--rx", "8", "-g", "1", "host"]).unwrap();
        assert_eq!(
            (o.iters, o.size, o.rx_depth, o.gid_idx),
            (50, 64, 8, Some(1))
        );
        assert!(o.events && o.chk);
        assert_eq!(o.host.as_deref(), Some("host"));
        let o = parse(&["-p", "0x4853", "-m", "2048", "-g", "-1", "-tN"]).unwrap();
        assert!(o.ts && o.new_send && !o.odp);
        assert_eq!(
            (o.tcp_port, o.mtu, o.gid_idx),
            (0x4853, Some(Mtu::Mtu2048), None)
        );
        for bad in [
            &["-x"][..],
            &["--bogus"],
            &["-m", "1000"],
            &["-p", "70000"],
            &["-n"],
            &["-s", "0"],
            &["a", "b"],
            &["-O"],
            &["--e=1"],
        ] {
            assert!(matches!(parse(bad), Err(ArgError::Bad(_))), "{bad:?}");
        }
    }

    #[test]
    fn prefetch_is_a_flag_of_rc_pingpong() {
        let o = parse(&["-o", "--prefetch"]).unwrap();
        assert!(o.odp && o.prefetch);
        assert!(!parse(&["-o"]).unwrap().prefetch);
        assert!(usage(&RC).contains("-P, --prefetch"));
    }

    #[test]
    fn extra_flags_parse_and_validate() {
        const EXTRA: &[ExtraFlag] = &[
            ExtraFlag {
                short: 'q',
                long: "num-qp",
                kind: ExtraKind::Number { min: 1, max: 255 },
                help: "",
            },
            ExtraFlag {
                short: 'm',
                long: "mtu",
                kind: ExtraKind::Mtu,
                help: "",
            },
            ExtraFlag {
                short: 'o',
                long: "odp",
                kind: ExtraKind::Switch,
                help: "",
            },
        ];
        const SRQ: Tool = Tool {
            name: "srq_pingpong",
            twin: "ibv_srq_pingpong",
            default_size: 4096,
            has_mtu: false,
            rc_flags: false,
            unsupported: &[],
        };
        let parse =
            |args: &[&str]| parse_args_with(&SRQ, EXTRA, args.iter().map(|s| s.to_string()));
        let o = parse(&["-q4", "--num=0x10", "-eo", "--mtu", "2048", "h"]).unwrap();
        assert_eq!(o.extra('q'), Some(ExtraValue::Number(16)));
        assert_eq!(o.extra('m'), Some(ExtraValue::Mtu(Mtu::Mtu2048)));
        assert_eq!(o.extra('o'), Some(ExtraValue::Set));
        assert!(o.events && o.mtu.is_none());
        assert_eq!(parse(&[]).unwrap().extra('q'), None);
        for bad in [
            &["-q", "0"][..],
            &["-q", "256"],
            &["-q"],
            &["-m", "1000"],
            &["--odp=1"],
            &["-t"],
        ] {
            assert!(matches!(parse(bad), Err(ArgError::Bad(_))), "{bad:?}");
        }
        assert!(usage_with(&SRQ, EXTRA).contains("-q, --num-qp=<n>"));
    }

    #[test]
    fn chk_pattern_marks_page_starts() {
        let p = message_pattern(10, true, 4).unwrap();
        assert_eq!(p, [0, 0x7b, 0x7b, 0x7b, 0, 0x7b, 0x7b, 0x7b, 0, 0x7b]);
        assert!(message_pattern(5, false, 4)
            .unwrap()
            .iter()
            .all(|&b| b == 0x7b));
    }
}
