//! XRC: domains, XRC SRQs and QPs, and `ibv_create_srq_ex`/`ibv_get_srq_num`.
//!
//! Neither soft-RoCE nor soft-iWARP (Linux 6.1, rdma-core 44) implements XRC:
//! measured in the VM, `ibv_open_xrcd`, `ibv_create_qp(_ex)` with
//! `IBV_QPT_XRC_SEND` and `ibv_get_srq_num` all answer `EOPNOTSUPP` on rxe0
//! and siw0. Without a domain, XRC SRQs, XRC target QPs and `ibv_open_qp`
//! cannot be reached on these devices; these tests check that the raw verbs
//! really fail (and how), that the safe API reports a typed `Unsupported`,
//! and that `ibv_create_srq_ex` of a basic SRQ works and carries traffic.
//! Posting on an XRC initiator (`SendWr::xrc_remote_srqn`) is untested for
//! the same reason; its checks are unit tests in `qp.rs`, and the refusal
//! of a remote SRQ number on an RC QP is checked here.

mod common;

use rdma::{ffi, AccessFlags, Context, Error, InlineSend, QpType, SendWr, SrqAttr, SrqType};

fn assert_unsupported(err: &Error, ctx: &Context, what_has: &str) {
    common::assert_unsupported(err, ctx, what_has, Some(libc::EOPNOTSUPP));
    assert_eq!(err.errno(), Some(libc::EOPNOTSUPP));
    assert!(err.to_string().contains(ctx.name()), "{err}");
}

/// The raw `ibv_open_xrcd`: Ok(()) (closed again) or the errno.
fn raw_open_xrcd(ctx: &Context) -> Result<(), i32> {
    let mut attr = ffi::ibv_xrcd_init_attr {
        comp_mask: ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: valid context and attribute struct; a domain opened here is
    // closed again right away.
    let xrcd = unsafe { ffi::ibv_open_xrcd(ctx.as_raw(), &mut attr) };
    if xrcd.is_null() {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    // SAFETY: opened above, closed once.
    assert_eq!(unsafe { ffi::ibv_close_xrcd(xrcd) }, 0);
    Ok(())
}

fn xrc_unsupported(device: &str) {
    let ctx = common::open(device);
    assert_eq!(
        raw_open_xrcd(&ctx),
        Err(libc::EOPNOTSUPP),
        "raw ibv_open_xrcd on {device}"
    );
    let err = ctx.open_xrcd().unwrap_err();
    assert_unsupported(&err, &ctx, "XRC domains");

    // An XRC initiator QP needs no domain: the provider refuses it.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let err = pd
        .qp_builder(QpType::XrcSend, &cq, &cq)
        .max_recv_wr(0)
        .build()
        .unwrap_err();
    assert_unsupported(&err, &ctx, "XrcSend");

    // The failures left the PD and CQ usable.
    let mut qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    assert_eq!(qp.qp_type(), QpType::Rc);
    assert_eq!(cq.poll(&mut Vec::new(), 1).unwrap(), 0);

    // A remote XRC SRQ number is refused on a non-XRC QP, before the verb
    // (the QP is still in RESET, where the verb itself would say EINVAL),
    // and the request's memory comes back.
    let msg = pd.reg_mr(b"xrc".to_vec(), AccessFlags::empty()).unwrap();
    let err = qp
        .post_send(SendWr::send(5, msg).xrc_remote_srqn(9))
        .unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::InvalidArgument {
                verb: "ibv_post_send",
                ..
            }
        ),
        "{}",
        err.error
    );
    assert!(
        err.error
            .to_string()
            .contains("a Rc QP does not take a remote XRC SRQ number (9)"),
        "{}",
        err.error
    );
    assert_eq!(err.returned.len(), 1);
    let (wr_id, back) = err.returned.into_iter().next().unwrap();
    assert_eq!(wr_id, 5);
    assert_eq!(back.into_one().unwrap().to_vec(), b"xrc");
    let err = qp
        .post_send_inline(InlineSend::send(6, b"").xrc_remote_srqn(9))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("a Rc QP does not take a remote XRC SRQ number (9)"),
        "{err}"
    );
    assert_eq!(qp.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn xrc_is_typed_unsupported() {
    xrc_unsupported(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_xrc_is_typed_unsupported() {
    xrc_unsupported(&common::iwarp_device_name());
}

/// `ibv_create_srq_ex` of a basic SRQ: the same queue `ibv_create_srq`
/// makes (limits, query where the device has it: siw0 answers
/// `ibv_query_srq` with `EOPNOTSUPP`), with no SRQ number on these devices.
fn basic_srq_ex(device: &str, query_supported: bool) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = pd.create_srq_ex(attr, SrqType::Basic).unwrap();
    match srq.query() {
        Ok(got) => {
            assert!(query_supported, "{device} answered ibv_query_srq");
            assert!(got.max_wr >= 16 && got.max_sge >= 1, "{got:?}");
        }
        Err(e) => {
            assert!(!query_supported, "{e}");
            assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{e}");
        }
    }
    // It takes receive requests.
    let recv = pd.reg_mr(vec![0u8; 64], AccessFlags::LOCAL_WRITE).unwrap();
    srq.post_recv(1, recv).unwrap();
    assert_eq!(srq.in_flight(), 1);
    let err = srq.get_srq_num().unwrap_err();
    assert_unsupported(&err, &ctx, "ibv_get_srq_num");

    // The raw verb agrees: EOPNOTSUPP, returned rather than set in errno.
    let mut num = 0u32;
    // SAFETY: valid SRQ and out-value.
    let rc = unsafe { ffi::ibv_get_srq_num(srq.as_raw(), &mut num) };
    assert_eq!(rc, libc::EOPNOTSUPP);

    // The limit check comes before the verb.
    let err = pd
        .create_srq_ex(SrqAttr { max_wr: 0, ..attr }, SrqType::Basic)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                verb: "ibv_create_srq_ex",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn create_srq_ex_basic_works_without_srq_num() {
    basic_srq_ex(&common::device_name(), true);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_create_srq_ex_basic_works_without_srq_num() {
    basic_srq_ex(&common::iwarp_device_name(), false);
}

/// A send from one RC QP lands in a basic SRQ made by `ibv_create_srq_ex`
/// that the other QP receives from, and the receive memory comes back with
/// the completion.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn create_srq_ex_basic_receives_a_send() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let srq = pd
        .create_srq_ex(
            SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
            SrqType::Basic,
        )
        .unwrap();
    let mut a = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let b = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .srq(&srq)
        .build()
        .unwrap();
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    common::connect(&ctx, &a, &b, gid_index);
    common::connect(&ctx, &b, &a, gid_index);

    let recv = pd.reg_mr(vec![0u8; 16], AccessFlags::LOCAL_WRITE).unwrap();
    srq.post_recv(7, recv).unwrap();
    assert_eq!(srq.in_flight(), 1);
    let msg = pd
        .reg_mr(b"through srq_ex".to_vec(), AccessFlags::empty())
        .unwrap();
    a.post_send(SendWr::send(1, msg).signaled(true)).unwrap();
    let mut done = common::wait(&cq, 2);
    let mut r = common::take(&mut done, 7).ok().unwrap();
    assert_eq!(r.qp_num, b.qp_num());
    assert_eq!(r.byte_len, 14);
    let mr = r.take_buffers().into_one().unwrap();
    assert_eq!(&mr.to_vec()[..14], b"through srq_ex");
    common::take(&mut done, 1).ok().unwrap();
    assert_eq!(srq.in_flight(), 0);
}
