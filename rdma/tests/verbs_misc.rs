//! P_Keys, CQ moderation, null memory regions, ECE and data placement order
//! (`ibv_query_pkey`, `ibv_get_pkey_index`, `ibv_modify_cq`,
//! `ibv_alloc_null_mr`, `ibv_query_ece`/`ibv_set_ece`,
//! `ibv_query_qp_data_in_order`).
//!
//! Measured in the VM (Linux 6.1, rdma-core 44): rxe0 has a one-entry P_Key
//! table holding `0xffff`; siw0 has none (`pkey_tbl_len` 0, no `pkeys`
//! directory in sysfs). Both answer `EOPNOTSUPP` to `ibv_modify_cq`,
//! `ibv_alloc_null_mr`, `ibv_query_ece` and `ibv_set_ece`, and 0 (not known
//! to be in order) to `ibv_query_qp_data_in_order` for every opcode.

mod common;

use rdma::cm::Ece;
use rdma::{ffi, CqModeration, Error, QpType, WrOpcode};

/// The P_Key table of port 1 as sysfs lists it (`ports/1/pkeys/N`), in
/// index order; empty when the port has no `pkeys` directory.
fn sysfs_pkeys(device: &str) -> Vec<u16> {
    let dir = format!("/sys/class/infiniband/{device}/ports/1/pkeys");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let n = entries.count();
    (0..n)
        .map(|i| {
            let v = common::sysfs(device, &format!("ports/1/pkeys/{i}")).unwrap();
            u16::from_str_radix(v.trim_start_matches("0x"), 16).unwrap()
        })
        .collect()
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn pkeys_match_sysfs() {
    let dev = common::device_name();
    let ctx = common::open(&dev);
    let info = common::ibv_devinfo(&dev);
    let len = common::num(common::field(&info, "pkey_tbl_len"));
    let table = sysfs_pkeys(&dev);
    assert_eq!(table.len() as u64, len, "sysfs and ibv_devinfo agree");
    assert!(!table.is_empty(), "{dev} has a P_Key table");
    for (i, &pkey) in table.iter().enumerate() {
        let i = u16::try_from(i).unwrap();
        assert_eq!(ctx.query_pkey(1, i).unwrap(), pkey, "index {i}");
        let first = table.iter().position(|&p| p == pkey).unwrap();
        assert_eq!(
            ctx.get_pkey_index(1, pkey).unwrap(),
            Some(u16::try_from(first).unwrap())
        );
    }
    // RoCE: the default P_Key at index 0.
    assert_eq!(ctx.query_pkey(1, 0).unwrap(), 0xffff);
    // A P_Key the table does not hold.
    let absent = (1..=0x7fffu16).find(|p| !table.contains(p)).unwrap();
    assert_eq!(ctx.get_pkey_index(1, absent).unwrap(), None);
    // Past the table, and a port the device lacks, fail before the verb.
    let past = u16::try_from(table.len()).unwrap();
    let err = ctx.query_pkey(1, past).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                verb: "ibv_query_pkey",
                ..
            }
        ),
        "{err}"
    );
    let err = ctx.query_pkey(2, 0).unwrap_err();
    assert!(matches!(err, Error::InvalidPort { port: 2, .. }), "{err}");
    let err = ctx.get_pkey_index(0, 0xffff).unwrap_err();
    assert!(matches!(err, Error::InvalidPort { port: 0, .. }), "{err}");
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_pkeys_are_typed_unsupported() {
    let dev = common::iwarp_device_name();
    let ctx = common::open(&dev);
    let info = common::ibv_devinfo(&dev);
    assert_eq!(common::num(common::field(&info, "pkey_tbl_len")), 0);
    assert!(sysfs_pkeys(&dev).is_empty());
    // The raw verb reads sysfs, which has no entry.
    let mut pkey: ffi::__be16 = 0;
    // SAFETY: valid context and out-value.
    let rc = unsafe { ffi::ibv_query_pkey(ctx.as_raw(), 1, 0, &mut pkey) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOENT)
    );
    let err = ctx.query_pkey(1, 0).unwrap_err();
    common::assert_unsupported(&err, &ctx, "ibv_query_pkey", None);
    let err = ctx.get_pkey_index(1, 0xffff).unwrap_err();
    common::assert_unsupported(&err, &ctx, "ibv_get_pkey_index", None);
}

fn modify_cq_unsupported(device: &str) {
    let ctx = common::open(device);
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let mut raw = ffi::ibv_modify_cq_attr {
        attr_mask: ffi::IBV_CQ_ATTR_MODERATE,
        moderate: ffi::ibv_moderate_cq {
            cq_count: 4,
            cq_period: 10,
        },
    };
    // SAFETY: valid CQ and attribute struct.
    let rc = unsafe { ffi::ibv_modify_cq(cq.as_raw(), &mut raw) };
    assert_eq!(rc, libc::EOPNOTSUPP, "raw ibv_modify_cq on {device}");
    let err = cq
        .modify_cq(CqModeration {
            count: 4,
            period_us: 10,
        })
        .unwrap_err();
    common::assert_unsupported(&err, &ctx, "ibv_modify_cq", Some(libc::EOPNOTSUPP));
    assert_eq!(err.errno(), Some(libc::EOPNOTSUPP));
    // The CQ still works.
    assert_eq!(cq.poll(&mut Vec::new(), 4).unwrap(), 0);
    cq.resize(32)
        .or_else(|e| match e {
            Error::Unsupported { .. } => Ok(()),
            e => Err(e),
        })
        .unwrap();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn modify_cq_is_typed_unsupported() {
    modify_cq_unsupported(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_modify_cq_is_typed_unsupported() {
    modify_cq_unsupported(&common::iwarp_device_name());
}

fn null_mr_unsupported(device: &str) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();
    let err = pd.alloc_null_mr().unwrap_err();
    common::assert_unsupported(&err, &ctx, "ibv_alloc_null_mr", Some(libc::EOPNOTSUPP));
    // The raw verb agrees.
    // SAFETY: valid PD; a region allocated here would be deregistered.
    let mr = unsafe { ffi::ibv_alloc_null_mr(pd.as_raw()) };
    assert!(mr.is_null());
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );
    // The PD still works.
    pd.reg_mr(vec![0u8; 64], rdma::AccessFlags::LOCAL_WRITE)
        .unwrap();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn alloc_null_mr_is_typed_unsupported() {
    null_mr_unsupported(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_alloc_null_mr_is_typed_unsupported() {
    null_mr_unsupported(&common::iwarp_device_name());
}

const ALL_OPS: [WrOpcode; 13] = [
    WrOpcode::RdmaWrite,
    WrOpcode::RdmaWriteWithImm,
    WrOpcode::Send,
    WrOpcode::SendWithImm,
    WrOpcode::RdmaRead,
    WrOpcode::AtomicCmpAndSwp,
    WrOpcode::AtomicFetchAndAdd,
    WrOpcode::LocalInv,
    WrOpcode::BindMw,
    WrOpcode::SendWithInv,
    WrOpcode::Tso,
    WrOpcode::Driver1,
    WrOpcode::AtomicWrite,
];

/// ECE and data-in-order on an RC QP, in RESET and in INIT.
fn ece_and_order(device: &str) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    for step in ["RESET", "INIT"] {
        if step == "INIT" {
            qp.to_init(&rdma::InitAttr::new(1)).unwrap();
        }
        let err = qp.query_ece().unwrap_err();
        common::assert_unsupported(&err, &ctx, "ibv_query_ece", Some(libc::EOPNOTSUPP));
        let err = qp
            .set_ece(Ece {
                vendor_id: 0x15b3,
                options: 1,
            })
            .unwrap_err();
        common::assert_unsupported(&err, &ctx, "ibv_set_ece", Some(libc::EOPNOTSUPP));
        let mut raw = ffi::ibv_ece::default();
        // SAFETY: valid QP and out-struct.
        let rc = unsafe { ffi::ibv_query_ece(qp.as_raw(), &mut raw) };
        assert_eq!(rc, libc::EOPNOTSUPP, "raw ibv_query_ece in {step}");
        for op in ALL_OPS {
            assert!(!qp.query_qp_data_in_order(op), "{op:?} in {step}");
        }
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ece_is_typed_unsupported_and_data_not_in_order() {
    ece_and_order(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_ece_is_typed_unsupported_and_data_not_in_order() {
    ece_and_order(&common::iwarp_device_name());
}
