//! The crate documentation's tour (`src/lib.rs`, "Tour"), run on a device:
//! the code between the `tour:` markers is the tour's code block line for
//! line, which `the_tour_is_the_crate_docs_tour` checks on the host.

mod common;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tour() -> rdma::Result<()> {
    let ip = std::net::IpAddr::V4(common::ip());
    // tour:begin
    use std::net::SocketAddr;

    use rdma::cm::blocking::{ConnectOptions, Connection, Listener};
    use rdma::{AccessFlags, PostError, RemoteMemory, SendWr, WcOpcode};

    // Server: listen on port 0 (any free port) and read back the port.
    let listener = Listener::bind(SocketAddr::new(ip, 0), 8)?;
    let addr = listener.local_addr().expect("bound to an address");
    let server = std::thread::spawn(move || -> rdma::Result<(Vec<u8>, Option<u32>)> {
        // Before accepting: the region the client may write, and the receive
        // its WRITE with immediate will consume (it carries no bytes).
        let mut target = None;
        let mut conn = listener.accept_with(&ConnectOptions::default(), |qp, pd| {
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            target = Some(pd.alloc_mr(4096, access)?);
            qp.post_recv(1, Vec::new()).map_err(PostError::drop_buffers)
        })?;
        let target = target.expect("set by the closure");
        // Tell the client where to write: a SEND of the region's description.
        let desc = target.remote().to_bytes().to_vec();
        let desc = conn.pd().reg_mr(desc, AccessFlags::empty())?;
        conn.qp()
            .post_send(SendWr::send(2, desc))
            .map_err(PostError::drop_buffers)?;
        // Two completions: the SEND's (its memory comes back) and the receive's.
        let mut done = Vec::new();
        while done.len() < 2 {
            conn.cq().poll(&mut done, 2)?;
        }
        let mut imm = None;
        for c in done {
            let c = c.ok()?;
            if c.opcode == WcOpcode::RecvRdmaWithImm {
                imm = c.imm();
            }
        }
        // The region grants remote write, so it is read by copying out.
        let mut bytes = vec![0; 15];
        target.read_at(0, &mut bytes)?;
        conn.wait_disconnected()?;
        Ok((bytes, imm))
    });

    // Client: post the receive for the description before connecting (on
    // iWARP a SEND that finds no receive breaks the connection).
    let opts = ConnectOptions::default();
    let mut conn = Connection::connect_with(addr, &opts, |qp, pd| {
        let buf = pd.alloc_mr(RemoteMemory::WIRE_LEN, AccessFlags::LOCAL_WRITE)?;
        qp.post_recv(1, buf).map_err(PostError::drop_buffers)
    })?;
    let mut c = loop {
        if let Some(c) = conn.cq().poll_one()? {
            break c.ok()?;
        }
    };
    let buf = c.take_buffers().into_one().expect("the receive's region");
    let remote = RemoteMemory::from_bytes(&buf.as_slice()?[..c.byte_len as usize])?;
    // RDMA WRITE with immediate: the bytes land in the server's region, the
    // immediate value in the completion of the server's receive.
    let msg = conn
        .pd()
        .reg_mr(b"hello over RDMA".to_vec(), AccessFlags::empty())?;
    conn.qp()
        .post_send(SendWr::write(2, msg, remote).with_imm(42))
        .map_err(PostError::drop_buffers)?;
    loop {
        if let Some(c) = conn.cq().poll_one()? {
            c.ok()?;
            break;
        }
    }
    // Tear down: disconnect, then drop. Dropping in any order is fine: each
    // object keeps what it needs alive and the last drop frees it.
    conn.disconnect()?;
    drop(conn);
    let (bytes, imm) = server.join().expect("the server thread")?;
    assert_eq!((&bytes[..], imm), (&b"hello over RDMA"[..], Some(42)));
    // tour:end
    assert_eq!(rdma::teardown_failures(), 0);
    Ok(())
}

/// The visible lines of the crate docs' tour (hidden `# ` lines left out).
fn docs_tour() -> Vec<String> {
    let lib = include_str!("../src/lib.rs");
    let start = lib.find("//! # Tour").expect("the crate docs have a tour");
    let mut lines = lib[start..].lines().map(|l| {
        l.strip_prefix("//! ")
            .or_else(|| l.strip_prefix("//!"))
            .unwrap_or(l)
    });
    lines.by_ref().find(|l| *l == "```no_run");
    lines
        .take_while(|l| *l != "```")
        .filter(|l| !(l.starts_with("# ") || *l == "#"))
        .map(str::to_owned)
        .collect()
}

/// The lines between this file's markers, less the function's indentation.
fn tested_tour() -> Vec<String> {
    let me = include_str!("tour.rs");
    let begin = me.find("// tour:begin\n").expect("begin marker") + "// tour:begin\n".len();
    let end = me.find("    // tour:end").expect("end marker");
    me[begin..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l).to_owned())
        .collect()
}

#[test]
fn the_tour_is_the_crate_docs_tour() {
    let (docs, tested) = (docs_tour(), tested_tour());
    assert!(docs.len() > 40, "the tour was not found: {docs:?}");
    for (i, (d, t)) in docs.iter().zip(&tested).enumerate() {
        assert_eq!(
            d,
            t,
            "line {} of the tour differs from tests/tour.rs",
            i + 1
        );
    }
    assert_eq!(
        docs.len(),
        tested.len(),
        "the tour and tests/tour.rs differ in length"
    );
}
