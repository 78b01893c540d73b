//! `rdma link delete` of the device under live QPs and CM ids, then the
//! device added again and used again by the same process.
//!
//! The removal runs in a child process (this test binary again, with
//! `RDMA_REMOVAL_CHILD=1`): if it hangs, the parent kills it, which closes
//! every context the kernel is waiting for, and the parent puts the device
//! back in any case, so the tests after this one find it as before.
//!
//! What held the device (Linux 6.1, rdma-core 44): rxe has no
//! `disassociate_ucontext`, so the kernel's removal waits until every
//! descriptor of the device's `uverbs` node is closed; after the crate's
//! objects were dropped one was left, librdmacm's own context, which it
//! closes only once it has noticed the device missing from the device list
//! (`rdma_get_devices` runs that check; nothing in librdmacm does on
//! `DEVICE_REMOVAL`). The crate now runs it when it reads a
//! `DEVICE_REMOVAL` event (`cm::device::forget_removed_devices`); the child
//! counts the descriptors of the device's node after each drop and shows
//! the last one going with the last id.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use common::iwarp::{iwarp_connection, iwarp_ip, next_event, End};
use rdma::cm::{CmEventType, EventChannel, PortSpace};
use rdma::{AccessFlags, QpType, SendWr, WcStatus};
use rdma_test_support::link::{
    device_present, fds_on, netdev_of, port_active, run_child, uverbs_node, wait_child, wait_for,
    Link,
};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn netdev() -> String {
    common::netdev().expect("RDMA_TEST_NETDEV names the netdev the device sits on")
}

/// `dev` as `rdma link add` makes it again; on rxe with the IPv4 GID the
/// tests use, at the same index.
fn link(dev: &str, kind: &str, netdev: &str) -> Link {
    Link {
        dev: dev.to_string(),
        kind: kind.to_string(),
        netdev: netdev.to_string(),
        gid: (kind == "rxe").then(|| (common::ip(), common::gid_index())),
    }
}

/// The child: live verbs objects and CM ids on the device, the device
/// deleted under them, everything dropped, the device added again and used.
fn removal_child(dev: &str) {
    let ip = IpAddr::V4(common::ip());
    // Verbs: an RC pair with a receive and a send in flight.
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    p.b.post_recv(1, p.pd.alloc_mr(64, LW).unwrap()).unwrap();
    // CM: a listener and a resolved client id.
    let ch = EventChannel::new().unwrap();
    let listener = ch.create_id(PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    listener.listen(4).unwrap();
    let client = ch.create_id(PortSpace::Tcp).unwrap();
    client
        .resolve_addr(
            None,
            SocketAddr::new(ip, listener.src_port()),
            Duration::from_secs(5),
        )
        .unwrap();
    let e = ch
        .get_event_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("ADDR_RESOLVED");
    assert_eq!(e.event_type(), CmEventType::AddrResolved, "{e:?}");
    drop(e);

    let node = uverbs_node(dev);
    let start = Instant::now();
    let mut delete = Command::new("rdma")
        .args(["link", "delete", dev])
        .spawn()
        .expect("rdma link delete");
    // DEVICE_REMOVAL on both ids.
    let mut removed = 0;
    while removed < 2 {
        let e = ch
            .get_event_timeout(Duration::from_secs(20))
            .unwrap()
            .unwrap_or_else(|| panic!("{removed} of 2 DEVICE_REMOVAL events within 20 s"));
        eprintln!("event {} on {:?}", e.event_type(), e.id());
        if e.event_type() == CmEventType::DeviceRemoval {
            assert!(e.id().same_id(&listener) || e.id().same_id(&client));
            removed += 1;
        }
    }
    eprintln!("DEVICE_REMOVAL on both ids after {:?}", start.elapsed());
    // Everything dropped, ids and verbs objects interleaved; the
    // descriptors on the device's node counted after each drop.
    let fds = || fds_on(&node);
    let mut trail = vec![("live", fds())];
    let common::Pair {
        ctx, pd, cq, a, b, ..
    } = p;
    drop(b);
    trail.push(("qp b", fds()));
    drop(client);
    trail.push(("client id", fds()));
    drop(pd);
    trail.push(("pd", fds()));
    drop(cq);
    trail.push(("cq", fds()));
    drop(a);
    trail.push(("qp a", fds()));
    drop(ctx);
    trail.push(("context", fds()));
    drop(listener);
    trail.push(("listener id", fds()));
    drop(ch);
    trail.push(("channel", fds()));
    eprintln!("descriptors on /dev/infiniband/{node} after each drop: {trail:?}");
    assert_eq!(
        trail[trail.len() - 3].1,
        1,
        "with the crate's context closed, one is left (librdmacm's): {trail:?}"
    );
    assert_eq!(
        trail[trail.len() - 2].1,
        0,
        "librdmacm closed its context with the last id: {trail:?}"
    );
    let st = wait_child(&mut delete, Duration::from_secs(30))
        .expect("rdma link delete finished once the process let go of the device");
    assert!(st.success(), "rdma link delete: {st}");
    assert!(!device_present(dev));
    eprintln!("device gone after {:?}", start.elapsed());
    assert_eq!(rdma::teardown_failures(), 0, "no destroy failed in Drop");

    // Back, and used again by this process: verbs and CM.
    link(dev, "rxe", &netdev()).add();
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    p.b.post_recv(1, p.pd.alloc_mr(64, LW).unwrap()).unwrap();
    let msg = p.pd.reg_mr(vec![9u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::send(2, msg)).unwrap();
    let mut done = common::wait(&p.cq, 2);
    let mut r = common::take(&mut done, 1);
    assert_eq!(r.status, WcStatus::Success, "{r:?}");
    assert_eq!(r.take_buffers().into_one().unwrap().to_vec(), vec![9u8; 64]);
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    assert_eq!(
        id.context().unwrap().name(),
        dev,
        "librdmacm finds the new device"
    );
    eprintln!("used again after {:?}", start.elapsed());
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE) it may delete and add again (rxe)"]
fn device_deleted_under_live_qps_and_cm_ids_then_added_again() {
    let dev = common::device_name();
    if std::env::var_os("RDMA_REMOVAL_CHILD").is_some() {
        removal_child(&dev);
        return;
    }
    run_child_and_restore(
        "device_deleted_under_live_qps_and_cm_ids_then_added_again",
        &dev,
        "rxe",
        &netdev(),
    );
}

/// Runs this binary's `test` again as the child (`RDMA_REMOVAL_CHILD=1`),
/// waits for it (45 s, then kills it) and puts `dev` (of `kind`, on
/// `netdev`) back whatever happened.
fn run_child_and_restore(test: &str, dev: &str, kind: &str, netdev: &str) {
    assert!(port_active(dev), "{dev} is up before the test");
    let status = run_child(test, "RDMA_REMOVAL_CHILD", Duration::from_secs(45));
    // Whatever happened, the device is put back for the tests after this:
    // a killed child lets the pending delete finish first.
    assert!(
        link(dev, kind, netdev).restore(),
        "{dev}: the pending delete did not finish within 30 s"
    );
    assert!(
        wait_for(Duration::from_secs(20), || port_active(dev)),
        "{dev}: the device not up within 20 s after the test"
    );
    let status = status.expect(
        "the child finished within 45 s (killed: rdma link delete still waited after it had dropped every object)",
    );
    assert!(status.success(), "the child failed: {status}");
}

// ---------------------------------------------------------------------------
// The same over iWARP (siw). siw has no connection without RDMA CM, so the
// live QPs are the two ends of a connection in this process
// (`common::iwarp`).

/// The child over siw: a listener, a connection (two connected ids, two
/// QPs with a receive posted each), the device deleted under them, every
/// object dropped, the device added again, a new connection over it.
fn iwarp_removal_child(dev: &str) {
    let netdev = netdev_of(dev);
    // librdmacm's contexts, opened before the baseline: it keeps one per
    // device for the life of the process, and the crate's
    // `rdma_get_devices` on DEVICE_REMOVAL opens every other device's
    // (rxe0's here: two descriptors, measured).
    let warm = |ch: &EventChannel| {
        for ip in [iwarp_ip(), IpAddr::V4(common::ip())] {
            let id = ch.create_id(PortSpace::Tcp).unwrap();
            id.bind_addr(SocketAddr::new(ip, 0)).unwrap();
            drop(id.context().expect("the bound id has a device"));
        }
    };
    warm(&EventChannel::new().unwrap());
    let before = common::baseline();
    let ch = EventChannel::new().unwrap();
    let listener = common::iwarp::listener(&ch);
    let (client, server) = iwarp_connection(&ch, &listener);
    assert_eq!(client.id.context().unwrap().name(), dev);

    let node = uverbs_node(dev);
    let start = Instant::now();
    let mut delete = Command::new("rdma")
        .args(["link", "delete", dev])
        .spawn()
        .expect("rdma link delete");
    // DEVICE_REMOVAL on the three ids; other events (a connection's
    // DISCONNECTED) may come first and are counted.
    let mut removed = [false; 3];
    let mut others = Vec::new();
    while removed.iter().any(|r| !r) {
        let e = ch
            .get_event_timeout(Duration::from_secs(20))
            .unwrap()
            .unwrap_or_else(|| panic!("DEVICE_REMOVAL on {removed:?} (listener, client, server) within 20 s; other events {others:?}"));
        eprintln!(
            "event {} status {} after {:?}",
            e.event_type(),
            e.status(),
            start.elapsed()
        );
        let which = [&listener, &client.id, &server.id]
            .iter()
            .position(|id| e.id().same_id(id))
            .expect("an event of one of the three ids");
        if e.event_type() == CmEventType::DeviceRemoval {
            assert!(!removed[which], "one DEVICE_REMOVAL per id");
            removed[which] = true;
        } else {
            others.push((which, e.event_type()));
        }
    }
    eprintln!(
        "DEVICE_REMOVAL on the three ids after {:?}; before them: {others:?}",
        start.elapsed()
    );
    // The receives posted on each end come back (flushed) or are taken
    // back with reset: none is lost.
    let fds = || fds_on(&node);
    let mut trail = vec![("live", fds())];
    let End {
        qp: sqp,
        cq: scq,
        pd: spd,
        id: sid,
    } = server;
    let End {
        qp: cqp,
        cq: ccq,
        pd: cpd,
        id: cid,
    } = client;
    for (end, qp, cq) in [("server", &sqp, &scq), ("client", &cqp, &ccq)] {
        let mut out = Vec::new();
        cq.poll(&mut out, 16).expect("poll after removal");
        for c in &out {
            assert_eq!(c.wr_id, 1, "{end}: only the posted receive is left: {c:?}");
        }
        let reset = qp.reset().expect("reset after DEVICE_REMOVAL");
        eprintln!(
            "{end}: receive back from the CQ {:?}, from reset {:?}",
            out.iter().map(|c| c.status).collect::<Vec<_>>(),
            reset.iter().map(|r| r.0).collect::<Vec<_>>()
        );
        assert_eq!(
            out.len() + reset.len(),
            1,
            "{end}: the posted receive comes back once"
        );
    }
    drop(sqp);
    trail.push(("server qp", fds()));
    drop(cid);
    trail.push(("client id", fds()));
    drop(spd);
    trail.push(("server pd", fds()));
    drop(ccq);
    trail.push(("client cq", fds()));
    drop(sid);
    trail.push(("server id", fds()));
    drop(cqp);
    trail.push(("client qp", fds()));
    drop(scq);
    trail.push(("server cq", fds()));
    drop(listener);
    trail.push(("listener id", fds()));
    drop(cpd);
    trail.push(("client pd", fds()));
    drop(ch);
    trail.push(("channel", fds()));
    eprintln!("descriptors on /dev/infiniband/{node} after each drop: {trail:?}");
    assert_eq!(
        trail.last().unwrap().1,
        0,
        "librdmacm's context closed with the last object on it: {trail:?}"
    );
    let st = wait_child(&mut delete, Duration::from_secs(30))
        .expect("rdma link delete finished once the process let go of the device");
    assert!(st.success(), "rdma link delete: {st}");
    assert!(!device_present(dev));
    eprintln!("device gone after {:?}", start.elapsed());
    assert_eq!(rdma::teardown_failures(), 0, "no destroy failed in Drop");

    // Back, and used again by this process: a new connection, a SEND each way.
    link(dev, "siw", &netdev).add();
    let ch = EventChannel::new().unwrap();
    let listener = ch.create_id(PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(iwarp_ip(), 0)).unwrap();
    assert_eq!(
        listener.context().unwrap().name(),
        dev,
        "librdmacm finds the new device"
    );
    listener.listen(4).unwrap();
    let (client, server) = iwarp_connection(&ch, &listener);
    eprintln!("used again after {:?}", start.elapsed());
    client.id.disconnect().unwrap();
    drop(next_event(&ch, CmEventType::Disconnected));
    drop(next_event(&ch, CmEventType::Disconnected));
    drop((client, server, listener, ch));
    warm(&EventChannel::new().unwrap());
    common::assert_back_to(before);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE) it may delete and add again (siw)"]
fn iwarp_device_deleted_under_live_qps_and_cm_ids_then_added_again() {
    let dev = common::iwarp_device_name();
    if std::env::var_os("RDMA_REMOVAL_CHILD").is_some() {
        iwarp_removal_child(&dev);
        return;
    }
    let netdev = netdev_of(&dev);
    run_child_and_restore(
        "iwarp_device_deleted_under_live_qps_and_cm_ids_then_added_again",
        &dev,
        "siw",
        &netdev,
    );
}
