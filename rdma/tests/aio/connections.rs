//! Connection steps as futures: eight connections from eight tasks, two-phase
//! accept carrying an rkey (tokio and async-io), steps dropped at each await
//! point, and sixty-four connections served on one thread.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn eight_connections_on_one_channel_from_eight_tasks() {
    const N: usize = 8;
    const MSGS: u64 = 20;
    let rt = runtime();
    let ctx = common::open(&common::device_name());
    let channel = ctx.create_comp_channel().unwrap();
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    rt.block_on(async {
        let driver = CqChannel::new(&channel, &Tokio).unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..N {
            let pd = ctx.alloc_pd().unwrap();
            let cq_a = ctx.create_cq(64, Some(&channel), 0).unwrap();
            let cq_b = ctx.create_cq(64, Some(&channel), 0).unwrap();
            let mut a = pd.qp_builder(QpType::Rc, &cq_a, &cq_a).build().unwrap();
            let mut b = pd.qp_builder(QpType::Rc, &cq_b, &cq_b).build().unwrap();
            common::connect(&ctx, &a, &b, gid_index);
            common::connect(&ctx, &b, &a, gid_index);
            let mut acq_a = AsyncCq::new(&driver, &cq_a).unwrap();
            let mut acq_b = AsyncCq::new(&driver, &cq_b).unwrap();
            tasks.spawn(async move {
                for i in 0..MSGS {
                    let tag = (n as u64) << 32 | i;
                    b.post_recv(tag, pd.alloc_mr(8, LW).unwrap()).unwrap();
                    a.post_send(SendWr::send(tag, msg(&pd, tag))).unwrap();
                    check_recv(acq_b.next().await.unwrap(), tag);
                    assert_eq!(acq_a.next().await.unwrap().wr_id, tag);
                }
                n
            });
        }
        let mut done = Vec::new();
        bounded("eight connections", async {
            while let Some(n) = tasks.join_next().await {
                done.push(n.unwrap());
            }
        })
        .await;
        done.sort_unstable();
        assert_eq!(done, (0..N).collect::<Vec<_>>());
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

/// Client and server on `reactor`: the server accepts in two phases, its
/// private data carrying the rkey of a region registered on the new
/// connection's PD; the client RDMA WRITEs into it and SENDs a note; both
/// disconnect.
async fn two_phase(ip: IpAddr, reactor: &dyn aio::Reactor) {
    let cm = CmChannel::new(&EventChannel::new().unwrap(), reactor).unwrap();
    let mut listener = cm.listen(SocketAddr::new(ip, 0), 16).unwrap();
    let addr = SocketAddr::new(ip, listener.id().src_port());
    let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7)).collect();
    let server = async {
        let incoming = listener.get_request().await.unwrap();
        // RoCE pads a REQ's private data to its fixed size; iWARP does not.
        assert!(
            incoming.private_data().starts_with(b"hello"),
            "{incoming:?}"
        );
        // Phase two: the connection's own PD, memory and QP.
        let ctx = incoming.context().unwrap();
        let mut s = end(&ctx, reactor);
        let target = s.pd.alloc_mr(64, LW | AccessFlags::REMOTE_WRITE).unwrap();
        // iWARP has no RNR retry: the receive goes in before the accept
        // (in INIT: providers refuse receives in RESET).
        incoming.id().modify_qp(&s.qp, QpState::Init).unwrap();
        s.qp.post_recv(1, s.pd.alloc_mr(8, LW).unwrap()).unwrap();
        let param = ConnParam::with_private_data(&target.remote().to_bytes());
        let mut conn = incoming.accept(&s.qp, &param).await.unwrap();
        let c = s.acq.next().await.unwrap();
        assert_eq!((c.wr_id, c.status), (1, WcStatus::Success), "{c:?}");
        let mut seen = vec![0u8; 64];
        target.read_at(0, &mut seen).unwrap();
        conn.disconnected().await.unwrap();
        (seen, s)
    };
    let client = async {
        let mut id = cm.create_id(PortSpace::Tcp).unwrap();
        id.resolve_addr(None, addr, T).await.unwrap();
        id.resolve_route(T).await.unwrap();
        let ctx = id.id().context().unwrap();
        let mut c = end(&ctx, reactor);
        let peer = id
            .connect(&c.qp, &ConnParam::with_private_data(b"hello"))
            .await
            .unwrap();
        let remote = RemoteMemory::from_bytes(&peer.private_data).unwrap();
        assert_eq!(remote.len, 64);
        let src = c.pd.reg_mr(pattern.clone(), AccessFlags::empty()).unwrap();
        c.qp.post_send(SendWr::write(10, src, remote)).unwrap();
        c.qp.post_send(SendWr::send(11, msg(&c.pd, 11))).unwrap();
        for want in [10, 11] {
            let done = c.acq.next().await.unwrap();
            assert_eq!((done.wr_id, done.status), (want, WcStatus::Success));
        }
        id.disconnect().await.unwrap();
        c
    };
    let ((seen, _s), _c) = futures_lite::future::zip(server, client).await;
    assert_eq!(
        seen, pattern,
        "the RDMA WRITE landed in the region the accept advertised"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_two_phase_accept_carries_an_rkey_of_the_new_connection() {
    runtime().block_on(async { bounded("the connection", two_phase(roce_ip(), &Tokio)).await });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_tokio_two_phase_accept_carries_an_rkey_of_the_new_connection() {
    runtime().block_on(async { bounded("the connection", two_phase(iwarp_ip(), &Tokio)).await });
    assert_eq!(rdma::teardown_failures(), 0);
}

/// The same on async-io: the core is not tied to tokio.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_io_two_phase_accept_carries_an_rkey_of_the_new_connection() {
    async_io::block_on(async {
        let timeout = async {
            async_io::Timer::after(Duration::from_secs(10)).await;
            panic!("lost wake-up: the connection not within 10 s on async-io");
        };
        futures_lite::future::or(two_phase(roce_ip(), &AsyncIo), timeout).await
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn dropped_connection_steps_lose_no_event_and_block_no_destroy() {
    let ip = roce_ip();
    runtime().block_on(async {
        let cm = aio::tokio_rt::cm_channel().unwrap();
        let mut listener = cm.listen(SocketAddr::new(ip, 0), 16).unwrap();
        let addr = SocketAddr::new(ip, listener.id().src_port());
        // A wait for a request, dropped before any came.
        {
            let mut f = pin!(listener.get_request());
            assert!(poll_once(f.as_mut()).is_pending());
        }
        let mut id = cm.create_id(PortSpace::Tcp).unwrap();
        // resolve_addr dropped after its call, before its event: the event
        // stays in the id's mailbox.
        {
            let mut f = pin!(id.resolve_addr(None, addr, T));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        let e = bounded("ADDR_RESOLVED", id.next_event()).await.unwrap();
        assert_eq!(e.event_type(), CmEventType::AddrResolved);
        drop(e);
        bounded("the route", id.resolve_route(T)).await.unwrap();
        let ctx = id.id().context().unwrap();
        let c = end(&ctx, &Tokio);
        // connect dropped after the request went out.
        let param = ConnParam::default();
        {
            let mut f = pin!(id.connect(&c.qp, &param));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        // The request the dropped get_request did not take arrives.
        let incoming = bounded("the connect request", listener.get_request())
            .await
            .unwrap();
        // The server abandons it (its id is destroyed: a reject); the client
        // id's answer waits in its mailbox.
        drop(incoming);
        let e = bounded("the answer to the abandoned request", id.next_event())
            .await
            .unwrap();
        assert_eq!(e.event_type(), CmEventType::Rejected, "{e:?}");
        // Drop everything while the event is held: the ids go after it.
        drop((c, listener, cm));
        drop(id);
        drop(e);
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

/// 64 clients and their 64 server connections, all on one thread: the
/// server serves them at once.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sixty_four_connections_on_one_thread() {
    sixty_four(roce_ip());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_sixty_four_connections_on_one_thread() {
    sixty_four(iwarp_ip());
}

fn sixty_four(ip: IpAddr) {
    const N: u64 = 64;
    let rt = runtime();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let cm = aio::tokio_rt::cm_channel().unwrap();
        let mut listener = cm.listen(SocketAddr::new(ip, 0), 128).unwrap();
        let addr = SocketAddr::new(ip, listener.id().src_port());
        let server = tokio::task::spawn_local(async move {
            let mut served = tokio::task::JoinSet::new();
            for _ in 0..N {
                let incoming = listener.get_request().await.unwrap();
                served.spawn_local(async move {
                    let n = u64::from_be_bytes(incoming.private_data()[..8].try_into().unwrap());
                    let ctx = incoming.context().unwrap();
                    let mut s = end(&ctx, &Tokio);
                    incoming.id().modify_qp(&s.qp, QpState::Init).unwrap();
                    s.qp.post_recv(n, s.pd.alloc_mr(8, LW).unwrap()).unwrap();
                    let mut conn = incoming.accept(&s.qp, &ConnParam::default()).await.unwrap();
                    let mut r = s.acq.next().await.unwrap();
                    assert_eq!(r.status, WcStatus::Success, "{r:?}");
                    let got = r.take_buffers().into_one().unwrap().to_vec();
                    // The answer: the number plus one.
                    let v = u64::from_be_bytes(got.try_into().unwrap()) + 1;
                    s.qp.post_send(SendWr::send(v, msg(&s.pd, v))).unwrap();
                    assert_eq!(s.acq.next().await.unwrap().status, WcStatus::Success);
                    conn.disconnected().await.unwrap();
                    n
                });
            }
            let mut done = Vec::new();
            while let Some(n) = served.join_next().await {
                done.push(n.unwrap());
            }
            done
        });
        let mut clients = tokio::task::JoinSet::new();
        for n in 0..N {
            let cm = cm.clone();
            clients.spawn_local(async move {
                let mut id = cm.create_id(PortSpace::Tcp).unwrap();
                id.resolve_addr(None, addr, T).await.unwrap();
                id.resolve_route(T).await.unwrap();
                let ctx = id.id().context().unwrap();
                let mut c = end(&ctx, &Tokio);
                id.id().modify_qp(&c.qp, QpState::Init).unwrap();
                c.qp.post_recv(n, c.pd.alloc_mr(8, LW).unwrap()).unwrap();
                id.connect(&c.qp, &ConnParam::with_private_data(&n.to_be_bytes()))
                    .await
                    .unwrap();
                c.qp.post_send(SendWr::send(n, msg(&c.pd, n))).unwrap();
                let mut got = None;
                for _ in 0..2 {
                    let mut done = c.acq.next().await.unwrap();
                    assert_eq!(done.status, WcStatus::Success, "{done:?}");
                    if done.opcode == WcOpcode::Recv {
                        got = Some(done.take_buffers().into_one().unwrap().to_vec());
                    }
                }
                assert_eq!(got.unwrap(), (n + 1).to_be_bytes(), "connection {n}");
                id.disconnect().await.unwrap();
                n
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(90), async {
            let mut done = Vec::new();
            while let Some(n) = clients.join_next().await {
                done.push(n.unwrap());
            }
            done.sort_unstable();
            let mut served = server.await.unwrap();
            served.sort_unstable();
            (done, served)
        })
        .await
        .expect("64 connections within 90 s");
        assert_eq!(all.0, (0..N).collect::<Vec<_>>());
        assert_eq!(all.1, (0..N).collect::<Vec<_>>());
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn dropped_batch_accept_and_disconnect_futures_leave_nothing_behind() {
    let ip = roce_ip();
    runtime().block_on(async {
        let cm = aio::tokio_rt::cm_channel().unwrap();
        let mut listener = cm.listen(SocketAddr::new(ip, 0), 16).unwrap();
        let addr = SocketAddr::new(ip, listener.id().src_port());
        let mut id = cm.create_id(PortSpace::Tcp).unwrap();
        bounded("the address", id.resolve_addr(None, addr, T))
            .await
            .unwrap();
        bounded("the route", id.resolve_route(T)).await.unwrap();
        let ctx = id.id().context().unwrap();
        let mut c = end(&ctx, &Tokio);
        // batch() dropped while waiting: no completion is lost (none yet).
        {
            let mut out = Vec::new();
            let mut f = pin!(c.acq.batch(&mut out, 4));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        let param = ConnParam::default();
        let mut connect = Box::pin(id.connect(&c.qp, &param));
        assert!(poll_once(connect.as_mut()).is_pending());
        let incoming = bounded("the request", listener.get_request())
            .await
            .unwrap();
        let ctx = incoming.context().unwrap();
        let s = end(&ctx, &Tokio);
        // The accept is sent, then its future dropped before ESTABLISHED:
        // the connection is abandoned and the server's id destroyed.
        let accept_param = ConnParam::default();
        {
            let mut accept = pin!(incoming.accept(&s.qp, &accept_param));
            assert!(poll_once(accept.as_mut()).is_pending());
        }
        drop(s);
        // The client hears about it one way or another, in bounded time.
        let connected = bounded("the client's connect", connect.as_mut()).await;
        drop(connect);
        match connected {
            Ok(_) => {
                // Connected before the server's id went (its REP was out). A
                // disconnect dropped after its call: its DISCONNECTED (which
                // waits for the CM's DREQ timeout, the peer being gone) would
                // go to the mailbox; dropping the id with the event pending
                // or held must not hang.
                {
                    let mut f = pin!(id.disconnect());
                    let _ = poll_once(f.as_mut());
                }
                drop(c);
                drop(id);
            }
            Err(e) => assert!(matches!(e, Error::CmEvent { .. }), "{e}"),
        }
    });
    assert_eq!(rdma::teardown_failures(), 0);
}
