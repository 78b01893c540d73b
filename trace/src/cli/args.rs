//! The command line, parsed with clap's derive: three subcommands (`show`,
//! `messages`, `rpc`) that take the same options and one capture file, and
//! the [`Filter`] those options make.

use std::net::IpAddr;

use anyhow::{anyhow, bail};
use clap::{Parser, Subcommand};
use rdma_trace::iwarp::Pdu;
use rdma_trace::reasm::Message;
use rdma_trace::RocePacket;

use rdma_trace::iwarp::MpaUnit;

/// What follows every command's help.
const FILE_NOTE: &str = "\
FILE is a pcap or pcapng capture; `-` reads standard input. iWARP is found in any TCP
connection that starts with an MPA Request (the capture must hold its start).";

/// RDMA traffic from a packet capture, packet by packet or as messages.
#[derive(Parser)]
#[command(name = "rdma-trace", after_help = FILE_NOTE)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// One line per RDMA packet (RoCEv2, IB CM on QP1) or iWARP unit (MPA
    /// Request/Reply, FPDU with its DDP and RDMAP headers)
    #[command(args_override_self = true, after_help = FILE_NOTE)]
    Show(Options),
    /// Packets reassembled into messages: SEND, WRITE, READ, atomics, with
    /// their length and the SHA-256 of their payload; incomplete ones say why
    #[command(args_override_self = true, after_help = FILE_NOTE)]
    Messages(Options),
    /// RPC-over-RDMA: calls paired with their replies by XID, with their
    /// chunks (read, write, reply) reassembled from the RDMA READs and WRITEs
    /// that moved them, their sizes and digests; incomplete ones say why
    #[command(args_override_self = true, after_help = FILE_NOTE)]
    Rpc(Options),
}

/// The options every command takes.
#[derive(clap::Args)]
struct Options {
    /// One JSON object per line
    #[arg(long)]
    json: bool,
    /// Only this QP (destination QP, or UD source QP); decimal or 0x hex
    /// (show, messages; RoCE only: iWARP has no QP numbers)
    #[arg(long, value_name = "QPN", value_parser = parse_qp)]
    qp: Option<u32>,
    /// Only traffic from or to IP (with two, only between them)
    #[arg(long, value_name = "IP[,IP]", value_delimiter = ',', value_parser = parse_ip)]
    conn: Vec<IpAddr>,
    /// Only opcodes (show) or kinds (messages) whose name contains NAME
    #[arg(long, value_name = "NAME")]
    op: Option<String>,
    /// rpc: 1 decodes, reassembles and hashes on one thread; 2 decodes and
    /// reassembles on a second one (the output is the same)
    #[arg(long, value_name = "N", default_value = "2", value_parser = parse_threads)]
    threads: usize,
    /// A pcap or pcapng capture; `-` reads standard input
    #[arg(value_name = "FILE")]
    file: String,
}

/// The command to run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Show,
    Messages,
    Rpc,
}

/// The command line, parsed.
pub(crate) struct Args {
    pub(crate) command: Command,
    pub(crate) json: bool,
    pub(crate) filter: Filter,
    pub(crate) file: String,
    pub(crate) threads: usize,
}

impl Args {
    /// The process's command line; on an error, or for `--help`, clap prints
    /// and exits (status 2 for an error).
    pub(crate) fn parse() -> Args {
        let (command, o) = match Cli::parse().command {
            Commands::Show(o) => (Command::Show, o),
            Commands::Messages(o) => (Command::Messages, o),
            Commands::Rpc(o) => (Command::Rpc, o),
        };
        Args {
            command,
            json: o.json,
            filter: Filter {
                qp: o.qp,
                conn: o.conn,
                op: o.op,
            },
            file: o.file,
            threads: o.threads,
        }
    }
}

fn parse_qp(s: &str) -> anyhow::Result<u32> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|_| anyhow!("'{s}' is not a QP number"))
}

fn parse_ip(s: &str) -> anyhow::Result<IpAddr> {
    s.parse().map_err(|_| anyhow!("'{s}' is not an IP address"))
}

fn parse_threads(s: &str) -> anyhow::Result<usize> {
    match s.parse() {
        Ok(n @ 1..=2) => Ok(n),
        _ => bail!("'{s}' is not 1 or 2"),
    }
}

/// The name of an iWARP unit: what `--op` matches and `show` prints.
pub(crate) fn pdu_name(p: &Pdu) -> &'static str {
    match &p.unit {
        MpaUnit::Frame(f) if f.request => "MPA_REQUEST",
        MpaUnit::Frame(_) => "MPA_REPLY",
        MpaUnit::Fpdu(f) => f.ddp.as_ref().map_or("FPDU", |d| d.op_name()),
        MpaUnit::Lost { .. } => "MPA_LOST",
    }
}

/// What `--qp`, `--conn` and `--op` select.
pub(crate) struct Filter {
    pub(crate) qp: Option<u32>,
    pub(crate) conn: Vec<IpAddr>,
    pub(crate) op: Option<String>,
}

impl Filter {
    pub(crate) fn addrs(&self, src: IpAddr, dst: IpAddr) -> bool {
        match self.conn.as_slice() {
            [] => true,
            [a] => src == *a || dst == *a,
            [a, b, ..] => (src == *a && dst == *b) || (src == *b && dst == *a),
        }
    }

    fn name(&self, name: &str) -> bool {
        self.op.as_deref().is_none_or(|want| {
            name.to_ascii_uppercase()
                .contains(&want.to_ascii_uppercase())
        })
    }

    pub(crate) fn packet(&self, p: &RocePacket<'_>) -> bool {
        self.addrs(p.src, p.dst)
            && self
                .qp
                .is_none_or(|q| p.ib.bth.dest_qp == q || p.ib.deth.is_some_and(|d| d.src_qp == q))
            && self.name(p.ib.op.name())
    }

    pub(crate) fn pdu(&self, p: &Pdu) -> bool {
        self.addrs(p.src, p.dst) && self.qp.is_none() && self.name(pdu_name(p))
    }

    pub(crate) fn message(&self, m: &Message) -> bool {
        self.addrs(m.flow.src, m.flow.dst)
            && self
                .qp
                .is_none_or(|q| m.tcp_ports.is_none() && (m.flow.qp == q || m.src_qp == Some(q)))
            && self.name(m.kind.name())
    }
}
