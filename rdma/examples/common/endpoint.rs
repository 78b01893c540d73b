//! rdma-core's synchronous endpoint example, both sides (`rdma_server`,
//! `rdma_client`): `rdma_getaddrinfo`, `rdma_create_ep`, the server's
//! `rdma_listen` and `rdma_get_request`, connect or accept, then one 16-byte
//! message each way (the client sends first).

use anyhow::{anyhow, Context as _};
use std::process::ExitCode;

use rdma::cm::{self, AddrInfoFlags, AddrInfoHints, CmId, ConnParam, PortSpace};
use rdma::{InlineSend, PostError, QueuePair, SendWr, WcStatus};

use super::args::{ArgError, Cli, Flag, Parsed};
use super::Res;

/// The message size of both directions.
const MSG_LEN: usize = 16;

/// Which side a tool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `rdma_server`: listens on `-s` (default all addresses).
    Server,
    /// `rdma_client`: connects to `-s` (default 127.0.0.1).
    Client,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Server => "rdma_server",
            Side::Client => "rdma_client",
        }
    }
}

const FLAGS: &[Flag<'static, char>] = &[
    Flag::value('s', 's', "", "server_address", "the server's address"),
    Flag::value('p', 'p', "", "port_number", "the port (default 7471)"),
];

/// The tool's `main`: prints `NAME: start` and, at the end, `NAME: end N`
/// with N = 0 on success, as the C tools do (-1 on failure, exit status 255).
pub fn main(side: Side) -> ExitCode {
    let name = side.name();
    let usage = format!("  {name} [-s server_address] [-p port_number]");
    let cli = Cli {
        name,
        usage: &usage,
        flags: FLAGS,
        bad_exit: 1,
    };
    let read = |args: Parsed<char>| -> Result<(String, String), ArgError> {
        args.no_operands()?;
        let mut server = match side {
            Side::Server => "0.0.0.0",
            Side::Client => "127.0.0.1",
        }
        .to_string();
        let mut port = "7471".to_string();
        for f in args.flags {
            match f.key {
                's' => server = f.value,
                'p' => port = f.value,
                _ => unreachable!("the flags of FLAGS"),
            }
        }
        Ok((server, port))
    };
    let (server, port) = match cli.read(read) {
        Ok(o) => o,
        Err(code) => return code,
    };
    println!("{name}: start");
    let ret = match run(side, &server, &port) {
        Ok(()) => 0,
        Err(e) => {
            println!("{}", super::Report(&e));
            -1
        }
    };
    println!("{name}: end {ret}");
    ExitCode::from(ret as u8)
}

fn run(side: Side, server: &str, port: &str) -> Res<()> {
    let hints = AddrInfoHints {
        flags: match side {
            Side::Server => AddrInfoFlags::PASSIVE,
            Side::Client => AddrInfoFlags::empty(),
        },
        port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let info =
        cm::getaddrinfo(Some(server), Some(port), Some(&hints)).context("rdma_getaddrinfo")?;
    let (ep, _) = cm::create_ep(&info.first(), None).context("rdma_create_ep")?;
    let (id, qp_verb) = match side {
        Side::Server => {
            ep.listen(0).context("rdma_listen")?;
            let (id, _) = ep.get_request().context("rdma_get_request")?;
            (id, "rdma_create_qp")
        }
        Side::Client => (ep, "rdma_create_ep"),
    };
    let mut qp = endpoint_qp(&id, qp_verb, MSG_LEN as u32)?;
    let inline = qp.caps().max_inline_data as usize >= MSG_LEN;
    if !inline {
        println!(
            "{}: device doesn't support IBV_SEND_INLINE, using sge sends",
            side.name()
        );
    }
    let recv = id
        .reg_msgs(vec![0u8; MSG_LEN])
        .context("rdma_reg_msgs for recv_msg")?;
    qp.post_recv(0, recv)
        .map_err(PostError::drop_buffers)
        .context("rdma_post_recv")?;
    match side {
        Side::Server => id.accept(&ConnParam::default()).context("rdma_accept")?,
        Side::Client => id.connect(&ConnParam::default()).context("rdma_connect")?,
    }
    let result = exchange(side, &id, &mut qp, inline);
    let _ = id.disconnect();
    result
}

/// The messages: the client sends and then receives, the server the reverse.
fn exchange(side: Side, id: &CmId, qp: &mut QueuePair, inline: bool) -> Res<()> {
    if side == Side::Server {
        receive(id, qp)?;
    }
    let send_msg = [0u8; MSG_LEN];
    if inline {
        qp.post_send_inline(InlineSend::send(0, &send_msg))
            .context("rdma_post_send")?;
    } else {
        let mr = id
            .reg_msgs(send_msg.to_vec())
            .context("rdma_reg_msgs for send_msg")?;
        qp.post_send(SendWr::send(0, mr))
            .map_err(PostError::drop_buffers)
            .context("rdma_post_send")?;
    }
    let c = id.get_send_comp(qp).context("rdma_get_send_comp")?;
    if c.status != WcStatus::Success {
        return Err(anyhow!("rdma_get_send_comp: {}", c.status));
    }
    if side == Side::Client {
        receive(id, qp)?;
    }
    Ok(())
}

fn receive(id: &CmId, qp: &QueuePair) -> Res<()> {
    let c = id.get_recv_comp(qp).context("rdma_get_recv_comp")?;
    if c.status != WcStatus::Success {
        return Err(anyhow!("rdma_get_recv_comp: {}", c.status));
    }
    Ok(())
}

/// The QP `rdma_create_ep` makes for rdma-core's `rdma_server`/`rdma_client`:
/// one send and one receive of one SGE, `inline` bytes inline, every send
/// signaled, librdmacm's PD. The CQs (with completion channels, so waiting
/// for a completion sleeps) are made here: a QP template without PD and CQs
/// cannot be expressed with the crate. `verb` names the step in errors.
fn endpoint_qp(id: &CmId, verb: &'static str, inline: u32) -> Res<QueuePair> {
    let ctx = id.context().context(verb)?;
    let pd = id.pd().context(verb)?;
    let send_ch = ctx
        .create_comp_channel()
        .context("ibv_create_comp_channel")?;
    let recv_ch = ctx
        .create_comp_channel()
        .context("ibv_create_comp_channel")?;
    let send_cq = ctx
        .create_cq(1, Some(&send_ch), 0)
        .context("ibv_create_cq")?;
    let recv_cq = ctx
        .create_cq(1, Some(&recv_ch), 0)
        .context("ibv_create_cq")?;
    let mut b = pd.qp_builder(rdma::QpType::Rc, &send_cq, &recv_cq);
    b.max_send_wr(1)
        .max_recv_wr(1)
        .max_send_sge(1)
        .max_recv_sge(1)
        .max_inline_data(inline)
        .sq_sig_all(true);
    id.create_qp(&b).context(verb)
}
