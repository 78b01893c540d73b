//! RDMA WRITE, READ and WRITE with immediate, and the atomics (compare-and-swap,
//! fetch-and-add), checked byte for byte.

use super::*;

fn rdma_write_read_and_write_with_immediate(path: PostPath) {
    let remote_access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut p = common::pair_with(QpType::Rc, remote_access, |b| {
        b.post_path(path);
    });
    let target = p.pd.alloc_mr(8192, remote_access).unwrap();
    let remote = target.remote();
    let data = pattern(8192, 3);
    let src = p.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, remote)).unwrap();
    let c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    // The target grants remote write: no safe slice, but a copy works.
    assert!(target.as_slice().is_err());
    assert_eq!(target.to_vec(), data);

    // READ it back into a fresh buffer.
    let dst = p.pd.alloc_mr(8192, LW).unwrap();
    p.a.post_send(SendWr::read(2, dst, remote)).unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::RdmaRead);
    assert_eq!(
        c.take_buffers().into_one().unwrap().as_slice().unwrap(),
        &data[..]
    );

    // WRITE_WITH_IMM consumes a receive at the target QP.
    p.b.post_recv(3, Vec::new()).unwrap();
    let small = p.pd.reg_mr(vec![0xab; 16], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(4, small, remote.slice(100, 16).unwrap()).with_imm(77))
        .unwrap();
    let mut done = wait(&p.cq, 2);
    let r = take(&mut done, 3);
    assert_eq!(r.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(r.imm(), Some(77));
    let mut now = vec![0; 16];
    target.read_at(100, &mut now).unwrap();
    assert_eq!(now, [0xab; 16]);
}

fn atomics_compare_swap_and_fetch_add(path: PostPath) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let mut p = common::pair_with(QpType::Rc, access, |b| {
        b.post_path(path);
    });
    let mut word = p.pd.alloc_mr(8, access).unwrap();
    word.write_at(0, &5u64.to_ne_bytes()).unwrap();
    let remote = word.remote();
    let result = p.pd.alloc_mr(8, LW).unwrap();
    p.a.post_send(SendWr::fetch_add(1, result, remote, 10))
        .unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::FetchAdd);
    let result = c.take_buffers().into_one().unwrap();
    assert_eq!(result.as_slice().unwrap(), &5u64.to_ne_bytes());
    let mut now = [0; 8];
    word.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 15);

    p.a.post_send(SendWr::compare_swap(2, result, remote, 15, 99))
        .unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::CompSwap);
    let result = c.take_buffers().into_one().unwrap();
    assert_eq!(result.as_slice().unwrap(), &15u64.to_ne_bytes());
    word.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 99);
    // A compare that does not match leaves the word alone.
    p.a.post_send(SendWr::compare_swap(3, result, remote, 1, 2))
        .unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(
        c.take_buffers().into_one().unwrap().as_slice().unwrap(),
        &99u64.to_ne_bytes()
    );
    word.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 99);
}

both_paths!(
    rdma_write_read_and_write_with_immediate,
    atomics_compare_swap_and_fetch_add
);
