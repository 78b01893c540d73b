//! The unreliable QP types: SEND and WRITE over UC, SEND over UD with its GRH and
//! the reply address.

use super::*;

fn uc_send_and_write(path: PostPath) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut p = common::pair_with(QpType::Uc, access, |b| {
        b.post_path(path);
    });
    p.b.post_recv(1, p.pd.alloc_mr(256, LW).unwrap()).unwrap();
    p.a.post_send(SendWr::send(
        2,
        p.pd.reg_mr(pattern(256, 4), AccessFlags::empty()).unwrap(),
    ))
    .unwrap();
    let mut done = wait(&p.cq, 2);
    let mut r = take(&mut done, 1).ok().unwrap();
    assert_eq!(
        r.take_buffers().into_one().unwrap().to_vec(),
        pattern(256, 4)
    );
    let target = p.pd.alloc_mr(256, access).unwrap();
    p.a.post_send(SendWr::write(
        3,
        p.pd.reg_mr(pattern(256, 5), AccessFlags::empty()).unwrap(),
        target.remote(),
    ))
    .unwrap();
    wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(target.to_vec(), pattern(256, 5));
}

fn ud_send_with_grh_and_reply_address(path: PostPath) {
    let mut p = common::pair_with(QpType::Ud, AccessFlags::empty(), |b| {
        b.post_path(path);
    });
    let ah = local_ah(&p);
    // UD receives get the 40-byte GRH first.
    p.b.post_recv(1, p.pd.alloc_mr(40 + 512, LW).unwrap())
        .unwrap();
    let msg = p.pd.reg_mr(pattern(512, 6), AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::send(2, msg).ud(&ah, p.b.qp_num(), common::QKEY))
        .unwrap();
    drop(ah); // the send in flight keeps the AH alive
    let mut done = wait(&p.cq, 2);
    let mut r = take(&mut done, 1).ok().unwrap();
    assert_eq!(r.byte_len, 40 + 512);
    assert_eq!(r.src_qp, p.a.qp_num());
    assert!(r.wc_flags.contains(rdma::WcFlags::GRH));
    let buf = r.take_buffers().into_one().unwrap();
    let bytes = buf.as_slice().unwrap();
    assert_eq!(&bytes[40..], &pattern(512, 6)[..]);
    // An AH built from the completion answers the sender.
    let grh: [u8; 40] = bytes[..40].try_into().unwrap();
    let back = p.pd.create_ah_from_wc(1, &r, &grh).unwrap();
    p.a.post_recv(3, p.pd.alloc_mr(40 + 8, LW).unwrap())
        .unwrap();
    let reply = p.pd.reg_mr(vec![1u8; 8], AccessFlags::empty()).unwrap();
    p.b.post_send(SendWr::send(4, reply).ud(&back, r.src_qp, common::QKEY))
        .unwrap();
    let mut done = wait(&p.cq, 2);
    assert_eq!(take(&mut done, 3).ok().unwrap().byte_len, 48);
}

both_paths!(uc_send_and_write, ud_send_with_grh_and_reply_address);
