//! Teardown: any drop order, with work in flight, finishes without hang,
//! crash or leak (the device's resource counts return to where they were).

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicPtr, Ordering};

use rdma::{AccessFlags, AhAttr, QpType, SendWr};

/// `rdma resource show` counts of the test device: (pd, cq, qp, mr).
fn resources(dev: &str) -> (u64, u64, u64, u64) {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("rdma (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&format!(" {dev}:")))
        .unwrap_or_else(|| panic!("no {dev} in `rdma resource show`: {text}"));
    let count = |key: &str| -> u64 {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == key {
                return words.next().unwrap().parse().unwrap();
            }
        }
        panic!("no {key} in {line:?}")
    };
    (count("pd"), count("cq"), count("qp"), count("mr"))
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for i in 0..=p.len() {
            let mut q = p.clone();
            q.insert(i, n - 1);
            out.push(q);
        }
    }
    out
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn every_drop_order_with_work_in_flight() {
    let dev = common::device_name();
    let gid_index = common::gid_index();
    let before = resources(&dev);
    let orders = permutations(5);
    assert_eq!(orders.len(), 120);
    for order in orders {
        let ctx = common::open(&dev);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None, 0).unwrap();
        let mut qp = pd.qp_builder(QpType::Ud, &cq, &cq).build().unwrap();
        let mut init = rdma::InitAttr::new(1);
        init.qkey = common::QKEY;
        qp.to_init(&init).unwrap();
        qp.to_rtr(None).unwrap();
        qp.to_rts(&rdma::RtsAttr::new(0)).unwrap();
        let mut mr = pd.alloc_mr(8 * 256, AccessFlags::LOCAL_WRITE).unwrap();
        let posted = mr.split_off(256).unwrap().chunks(256).unwrap();
        // Receives in flight hold pieces of `mr`'s registration.
        qp.post_recv_batch(
            posted
                .into_iter()
                .enumerate()
                .map(|(i, m)| (i as u64, m.into())),
        )
        .unwrap();
        // An unsignaled send to itself, maybe still in flight.
        let gid = ctx.query_gid(1, gid_index).unwrap();
        let ah = pd
            .create_ah(&AhAttr::global(1, gid, gid_index as u8))
            .unwrap();
        let msg = pd.reg_mr(vec![9u8; 64], AccessFlags::empty()).unwrap();
        qp.post_send(
            SendWr::send(99, msg)
                .signaled(false)
                .ud(&ah, qp.qp_num(), common::QKEY),
        )
        .unwrap();
        drop(ah);
        let mut ctx = Some(ctx);
        let mut pd = Some(pd);
        let mut mr = Some(mr);
        let mut cq = Some(cq);
        let mut qp = Some(qp);
        for &i in &order {
            match i {
                0 => drop(ctx.take()),
                1 => drop(pd.take()),
                2 => drop(mr.take()),
                3 => drop(cq.take()),
                _ => drop(qp.take()),
            }
        }
    }
    assert_eq!(
        resources(&dev),
        before,
        "(pd, cq, qp, mr) counts are back to the baseline"
    );
    assert_eq!(rdma::teardown_failures(), 0, "no destroy failed in Drop");
}

/// The region `forgotten_memory_region_piece_stays_valid` forgets.
static FORGOTTEN: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn forgotten_memory_region_piece_stays_valid() {
    // Leaking a handle never frees memory the device may use: a forgotten
    // piece keeps the registration; everything else tears down.
    let dev = common::device_name();
    let before = resources(&dev);
    {
        let mut p = common::pair(QpType::Rc, AccessFlags::empty());
        let mut mr = p.pd.alloc_mr(128, AccessFlags::LOCAL_WRITE).unwrap();
        let recv = mr.split_off(64).unwrap();
        p.b.post_recv(1, recv).unwrap();
        // Forgotten, as `mem::forget` would, but kept reachable from a static so
        // that LeakSanitizer (`ci/sanitize --device address`) does not report the
        // leak this test makes on purpose: its destructor never runs either way.
        FORGOTTEN.store(Box::into_raw(Box::new(mr)).cast(), Ordering::Relaxed);
        let msg = p.pd.reg_mr(vec![5u8; 64], AccessFlags::empty()).unwrap();
        p.a.post_send(SendWr::send(2, msg)).unwrap();
        let mut done = common::wait(&p.cq, 2);
        let mut r = common::take(&mut done, 1);
        assert_eq!(r.take_buffers().into_one().unwrap().to_vec(), vec![5u8; 64]);
    }
    let (pd, cq, qp, mr) = resources(&dev);
    // The forgotten piece pins its registration, and so its PD (and context).
    assert_eq!((cq, qp), (before.1, before.2));
    assert_eq!(mr, before.3 + 1);
    assert_eq!(pd, before.0 + 1);
    assert_eq!(rdma::teardown_failures(), 0, "no destroy failed in Drop");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn explicit_destroy_reports_success() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    p.b.post_recv(1, p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap())
        .unwrap();
    let qp = std::mem::replace(
        &mut p.b,
        p.pd.qp_builder(QpType::Rc, &p.cq, &p.cq).build().unwrap(),
    );
    qp.destroy().map_err(|(_, e)| e).expect("ibv_destroy_qp");
    let mr = p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    mr.destroy().map_err(|(_, e)| e).expect("ibv_dereg_mr");
    // A piece whose sibling still exists cannot deregister the whole region.
    let mut mr = p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let tail = mr.split_off(32).unwrap();
    let (back, err) = mr.destroy().unwrap_err();
    assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
    let mut back = back.expect("the piece comes back");
    back.unsplit(tail).unwrap();
    back.destroy().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn shared_region_lives_while_requests_hold_it_and_goes_with_its_queue_pair() {
    // Requests that share a region (`WrBuffers::Shared`) keep it registered
    // after the caller dropped its own reference; dropping their QP (to ERR,
    // flushed) releases them, and with the last one the registration.
    let dev = common::device_name();
    let before = resources(&dev);
    {
        let mut p = common::pair(QpType::Rc, AccessFlags::empty());
        let with_pair = resources(&dev);
        let shared =
            std::sync::Arc::new(p.pd.reg_mr(vec![3u8; 4096], AccessFlags::empty()).unwrap());
        let weak = std::sync::Arc::downgrade(&shared);
        // No receive at the peer: the sends wait (RNR) or fail there, but
        // stay the QP's until polled or flushed.
        for i in 0..3 {
            p.a.post_send(SendWr::send(
                i,
                rdma::WrBuffers::Shared(std::sync::Arc::clone(&shared)),
            ))
            .unwrap();
        }
        drop(shared);
        assert_eq!(weak.strong_count(), 3, "the requests hold the region");
        assert_eq!(resources(&dev).3, with_pair.3 + 1);
        drop(p.a);
        assert_eq!(weak.strong_count(), 0, "the flushed requests let it go");
        assert_eq!(resources(&dev).3, with_pair.3, "and it is deregistered");
        // Whatever the CQ still holds for the dropped QP polls harmlessly.
        let mut left = Vec::new();
        p.cq.poll(&mut left, 16).unwrap();
    }
    assert_eq!(
        resources(&dev),
        before,
        "(pd, cq, qp, mr) back to the baseline"
    );
    assert_eq!(rdma::teardown_failures(), 0, "no destroy failed in Drop");
}
