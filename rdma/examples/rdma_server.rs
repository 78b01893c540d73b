//! The passive side of rdma-core's synchronous endpoint example
//! (`rdma_server`): `rdma_getaddrinfo`, `rdma_create_ep`, `rdma_listen`,
//! `rdma_get_request`, then one 16-byte message each way; pairs with
//! `rdma_client` (this example's or rdma-core's).
//!
//! ```text
//! rdma_server [-s server_address] [-p port_number]
//! ```
//!
//! Prints `rdma_server: start` and, at the end, `rdma_server: end N` with
//! N = 0 on success, as the C tool does.

mod common;

use std::process::ExitCode;

use common::cm::{getopt, OrFail, Res};
use rdma::cm::{self, AddrInfoFlags, AddrInfoHints, ConnParam, PortSpace};
use rdma::{InlineSend, SendWr, WcStatus};

/// The message size of both directions.
const MSG_LEN: usize = 16;

fn usage() -> ExitCode {
    println!("usage: rdma_server");
    println!("\t[-s server_address]");
    println!("\t[-p port_number]");
    ExitCode::from(1)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Ok(flags) = getopt(&args, "s:p:") else {
        return usage();
    };
    let mut server = "0.0.0.0".to_string();
    let mut port = "7471".to_string();
    for (flag, value) in flags {
        match (flag, value) {
            ('s', Some(v)) => server = v,
            ('p', Some(v)) => port = v,
            _ => return usage(),
        }
    }
    println!("rdma_server: start");
    let ret = match run(&server, &port) {
        Ok(()) => 0,
        Err(e) => {
            println!("{e}");
            -1
        }
    };
    println!("rdma_server: end {ret}");
    ExitCode::from(ret as u8)
}

fn run(server: &str, port: &str) -> Res<()> {
    let hints = AddrInfoHints {
        flags: AddrInfoFlags::PASSIVE,
        port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let info = cm::getaddrinfo(Some(server), Some(port), Some(&hints))
        .map_err(|e| format!("rdma_getaddrinfo: {e}"))?;
    let (listen_id, _) = cm::create_ep(&info.first(), None).or_fail("rdma_create_ep")?;
    listen_id.listen(0).or_fail("rdma_listen")?;
    let (id, _) = listen_id.get_request().or_fail("rdma_get_request")?;
    let mut qp = common::cm::endpoint_qp(&id, "rdma_create_qp", MSG_LEN as u32)?;
    let inline = qp.caps().max_inline_data as usize >= MSG_LEN;
    if !inline {
        println!("rdma_server: device doesn't support IBV_SEND_INLINE, using sge sends");
    }
    let recv = id
        .reg_msgs(vec![0u8; MSG_LEN])
        .or_fail("rdma_reg_msgs for recv_msg")?;
    qp.post_recv(0, recv)
        .map_err(|e| format!("rdma_post_recv: {e}"))?;
    id.accept(&ConnParam::default()).or_fail("rdma_accept")?;

    let result = (|| -> Res<()> {
        let c = id.get_recv_comp(&qp).or_fail("rdma_get_recv_comp")?;
        if c.status != WcStatus::Success {
            return Err(format!("rdma_get_recv_comp: {}", c.status));
        }
        let send_msg = [0u8; MSG_LEN];
        if inline {
            qp.post_send_inline(InlineSend::send(0, &send_msg))
                .or_fail("rdma_post_send")?;
        } else {
            let mr = id
                .reg_msgs(send_msg.to_vec())
                .or_fail("rdma_reg_msgs for send_msg")?;
            qp.post_send(SendWr::send(0, mr))
                .map_err(|e| format!("rdma_post_send: {e}"))?;
        }
        let c = id.get_send_comp(&qp).or_fail("rdma_get_send_comp")?;
        if c.status != WcStatus::Success {
            return Err(format!("rdma_get_send_comp: {}", c.status));
        }
        Ok(())
    })();
    let _ = id.disconnect();
    result
}
