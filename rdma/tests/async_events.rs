//! Asynchronous events (rdma-core's examples/asyncwatch.c): port state
//! changes, typed and mapped to their port.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use rdma::{AsyncEventElement, AsyncEventType, PortState};

fn ip_link(netdev: &str, state: &str) {
    let st = Command::new("ip")
        .args(["link", "set", netdev, state])
        .status()
        .expect("ip runs");
    assert!(st.success(), "ip link set {netdev} {state}");
}

/// Reads events until one of `want` arrives for port 1, with a deadline.
fn wait_port_event(ctx: &rdma::Context, want: AsyncEventType) -> rdma::AsyncEvent {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut fds = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&ctx.async_fd().unwrap()),
            events: libc::POLLIN,
            revents: 0,
        }];
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {want} event within 20 s");
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis() as i32) };
        assert!(n >= 0, "poll failed");
        if n == 0 {
            continue;
        }
        let ev = ctx.get_async_event().expect("ibv_get_async_event");
        if ev.event_type == want {
            return ev;
        }
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn port_down_and_up_events() {
    let name = common::device_name();
    let netdev = common::netdev().expect("RDMA_TEST_NETDEV names the netdev to toggle");
    let ctx = common::open(&name);
    ctx.set_async_nonblocking(true).unwrap();
    let err = ctx.get_async_event().unwrap_err();
    assert_eq!(
        err.errno(),
        Some(libc::EAGAIN),
        "no event pending yet: {err}"
    );

    ip_link(&netdev, "down");
    let down = wait_port_event(&ctx, AsyncEventType::PortErr);
    ip_link(&netdev, "up");
    assert_eq!(down.element, AsyncEventElement::Port(1));
    assert_eq!(down.port(), Some(1));
    assert!(down.to_string().contains("port error"), "{down}");
    let up = wait_port_event(&ctx, AsyncEventType::PortActive);
    assert_eq!(up.port(), Some(1));
    assert!(up.to_string().contains("port active"), "{up}");
    // Leave the port as the other tests expect it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while ctx.query_port(1).unwrap().state != PortState::Active {
        assert!(Instant::now() < deadline, "port did not come back");
        std::thread::yield_now();
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn port_events_drop_the_sysfs_port_cache() {
    let name = common::device_name();
    let netdev = common::netdev().expect("RDMA_TEST_NETDEV names the netdev to toggle");
    let dev = rdma::sysfs::Sysfs::system()
        .device(&name)
        .expect("sysfs device");
    let ctx = dev.open().expect("open through sysfs watches the context");
    let port = dev.end_port(1).unwrap();
    assert_eq!(port.state().unwrap(), PortState::Active);
    ip_link(&netdev, "down");
    let ev = wait_port_event(&ctx, AsyncEventType::PortErr);
    assert!(ev.changes_port());
    // The cached ACTIVE was dropped by the event: sysfs is read again.
    let state = port.state().unwrap();
    ip_link(&netdev, "up");
    assert_ne!(state, PortState::Active, "stale cached state after {ev}");
    wait_port_event(&ctx, AsyncEventType::PortActive);
    assert_eq!(port.state().unwrap(), PortState::Active);
}

#[test]
fn event_names_come_from_libibverbs() {
    assert_eq!(AsyncEventType::PortActive.to_string(), "port active");
    assert_eq!(
        AsyncEventType::from_raw(4242),
        AsyncEventType::Unknown(4242)
    );
}
