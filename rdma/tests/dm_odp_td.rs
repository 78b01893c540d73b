//! On-demand paging, device memory, thread and parent domains.
//!
//! Soft-RoCE and soft-iWARP on Linux 6.1 implement none of them, so these
//! tests check that the capabilities read as `ibv_devinfo -v` prints them,
//! that the raw verbs really fail on these devices (and how), that the safe
//! API reports a typed `Unsupported` (before the verb where the device
//! reports the lack), that argument checks come first, and that failed
//! constructors leave their parents usable whatever the drop order.

mod common;

use rdma::{ffi, AccessFlags, AdviseFlags, Error, MrAdvice, OdpGeneralCaps, OdpTransportCaps};

/// The value lines under `header:` in `ibv_devinfo -v` output: the lines
/// after it that are indented deeper than it.
fn section(lines: &[String], header: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let start = lines
        .iter()
        .position(|l| l.trim() == format!("{header}:"))
        .unwrap_or_else(|| panic!("ibv_devinfo printed no {header:?} section: {lines:#?}"));
    let depth = indent(&lines[start]);
    lines[start + 1..]
        .iter()
        .take_while(|l| indent(l) > depth)
        .map(|l| l.trim().to_string())
        .collect()
}

/// ibv_devinfo's general ODP caps: one line per known bit, nothing for none.
fn devinfo_general_odp(lines: &[String]) -> OdpGeneralCaps {
    section(lines, "general_odp_caps")
        .iter()
        .fold(OdpGeneralCaps::empty(), |caps, l| {
            caps | match l.as_str() {
                "ODP_SUPPORT" => OdpGeneralCaps::SUPPORT,
                "ODP_SUPPORT_IMPLICIT" => OdpGeneralCaps::SUPPORT_IMPLICIT,
                other => panic!("unexpected general_odp_caps line {other:?}"),
            }
        })
}

/// ibv_devinfo's per-transport ODP caps: "NO SUPPORT" or one line per bit.
fn devinfo_transport_odp(lines: &[String], header: &str) -> OdpTransportCaps {
    let values = section(lines, header);
    if values == ["NO SUPPORT"] {
        return OdpTransportCaps::empty();
    }
    values.iter().fold(OdpTransportCaps::empty(), |caps, l| {
        caps | match l.as_str() {
            "SUPPORT_SEND" => OdpTransportCaps::SEND,
            "SUPPORT_RECV" => OdpTransportCaps::RECV,
            "SUPPORT_WRITE" => OdpTransportCaps::WRITE,
            "SUPPORT_READ" => OdpTransportCaps::READ,
            "SUPPORT_ATOMIC" => OdpTransportCaps::ATOMIC,
            "SUPPORT_SRQ" | "SUPPORT_SRQ_RECV" => OdpTransportCaps::SRQ_RECV,
            other => panic!("unexpected {header} line {other:?}"),
        }
    })
}

/// ibv_devinfo prints "maximum available device memory: NBytes" only when
/// `max_dm_size` is not 0.
fn devinfo_max_dm_size(lines: &[String]) -> u64 {
    lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("maximum available device memory:"))
        .map(|v| common::num(v.trim().trim_end_matches("Bytes")))
        .unwrap_or(0)
}

/// The query_device_ex view of ODP and DM matches ibv_devinfo's.
fn caps_match_devinfo(device: &str) {
    let ctx = common::open(device);
    let attr = ctx.query_device().unwrap();
    let caps = attr.odp_caps();
    let lines = common::ibv_devinfo_lines(device);
    assert_eq!(caps.general, devinfo_general_odp(&lines), "{device}");
    assert_eq!(caps.rc, devinfo_transport_odp(&lines, "rc_odp_caps"));
    assert_eq!(caps.uc, devinfo_transport_odp(&lines, "uc_odp_caps"));
    assert_eq!(caps.ud, devinfo_transport_odp(&lines, "ud_odp_caps"));
    assert_eq!(caps.xrc, devinfo_transport_odp(&lines, "xrc_odp_caps"));
    assert_eq!(attr.odp_general_caps(), caps.general.bits());
    assert_eq!(attr.max_dm_size(), devinfo_max_dm_size(&lines), "{device}");
    // What Linux 6.1 soft-RoCE and soft-iWARP report (the devinfo lines
    // above agree): no on-demand paging, no device memory.
    assert!(!caps.supported() && !caps.implicit_supported(), "{caps:?}");
    assert_eq!(attr.max_dm_size(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn odp_and_dm_caps_match_ibv_devinfo() {
    caps_match_devinfo(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_odp_and_dm_caps_match_ibv_devinfo() {
    caps_match_devinfo(&common::iwarp_device_name());
}

/// The raw `ibv_reg_mr` with `access`: Ok(()) (deregistered again) or the errno.
fn raw_reg_mr(
    pd: &rdma::ProtectionDomain,
    addr: *mut u8,
    len: usize,
    access: AccessFlags,
) -> Result<(), i32> {
    let flags = i32::try_from(access.bits()).unwrap();
    // SAFETY: valid PD; the memory (or, for implicit ODP, nothing) is
    // deregistered again right away.
    let mr = unsafe { ffi::ibv_reg_mr(pd.as_raw(), addr.cast(), len, flags) };
    if mr.is_null() {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    // SAFETY: registered above, deregistered once.
    assert_eq!(unsafe { ffi::ibv_dereg_mr(mr) }, 0);
    Ok(())
}

/// ODP registration on a device without ODP: the kernel refuses the raw
/// verb; the safe constructors say Unsupported without calling it.
fn odp_registration_unsupported(device: &str, raw_errno: i32) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();
    let odp = AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND;

    let mut buf = vec![0x11u8; 4096];
    assert_eq!(
        raw_reg_mr(&pd, buf.as_mut_ptr(), buf.len(), odp),
        Err(raw_errno),
        "the raw ibv_reg_mr with IBV_ACCESS_ON_DEMAND on {device}"
    );
    // Without ON_DEMAND the same registration works: the flag is the reason.
    assert_eq!(
        raw_reg_mr(&pd, buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE),
        Ok(())
    );

    // `source: None`: refused from the capabilities, before the verb.
    let err = pd.alloc_mr(4096, odp).unwrap_err();
    common::assert_unsupported(&err, &ctx, "IBV_ACCESS_ON_DEMAND", None);
    let err = pd.reg_mr(vec![1u8; 64], odp).unwrap_err();
    common::assert_unsupported(&err, &ctx, "on-demand paging", None);
    // SAFETY: `buf` outlives the (failed) registration and is not used
    // meanwhile.
    let err = unsafe { pd.reg_mr_raw(buf.as_mut_ptr(), buf.len(), odp) }.unwrap_err();
    common::assert_unsupported(&err, &ctx, "on-demand paging", None);
    assert_eq!(
        buf,
        vec![0x11u8; 4096],
        "a refused registration leaves memory alone"
    );
    // The argument check still comes first.
    let err = pd.alloc_mr(0, odp).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // The PD is unharmed.
    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(!mr.access().contains(AccessFlags::ON_DEMAND));
}

// Linux 6.1 refuses IB_ACCESS_ON_DEMAND on a device without
// IBK_ON_DEMAND_PAGING with a bare EINVAL (measured on rxe0 and siw0): only
// the capability check tells it apart from a bad argument.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn odp_registration_is_typed_unsupported() {
    odp_registration_unsupported(&common::device_name(), libc::EINVAL);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_odp_registration_is_typed_unsupported() {
    odp_registration_unsupported(&common::iwarp_device_name(), libc::EINVAL);
}

/// Implicit ODP: remote access is refused first (it would open the whole
/// address space to peers), then the missing capability.
fn implicit_odp_unsupported(device: &str, raw_errno: i32) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();
    assert_eq!(
        raw_reg_mr(
            &pd,
            std::ptr::null_mut(),
            usize::MAX,
            AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND
        ),
        Err(raw_errno),
        "the raw implicit ibv_reg_mr on {device}"
    );
    for remote in [
        AccessFlags::REMOTE_READ,
        AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
        AccessFlags::REMOTE_ATOMIC | AccessFlags::LOCAL_WRITE,
        AccessFlags::MW_BIND,
    ] {
        let err = pd.reg_implicit_odp(remote).unwrap_err();
        match &err {
            Error::InvalidArgument { verb, reason } => {
                assert_eq!(*verb, "ibv_reg_mr");
                assert!(reason.contains("reg_implicit_odp_unchecked"), "{err}");
            }
            other => panic!("{remote:?}: expected InvalidArgument, got {other:?}"),
        }
    }
    let err = pd.reg_implicit_odp(AccessFlags::LOCAL_WRITE).unwrap_err();
    common::assert_unsupported(&err, &ctx, "implicit on-demand paging", None);
    let err = pd.reg_implicit_odp(AccessFlags::empty()).unwrap_err();
    common::assert_unsupported(&err, &ctx, "IBV_ODP_SUPPORT_IMPLICIT", None);
    // SAFETY: the registration fails (no implicit ODP on this device), so
    // no peer can ever reach memory through it.
    let err = unsafe { pd.reg_implicit_odp_unchecked(AccessFlags::REMOTE_READ) }.unwrap_err();
    common::assert_unsupported(&err, &ctx, "implicit on-demand paging", None);
}

// The raw implicit registration fails with EINVAL too (Linux 6.1).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn implicit_odp_is_typed_unsupported() {
    implicit_odp_unsupported(&common::device_name(), libc::EINVAL);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_implicit_odp_is_typed_unsupported() {
    implicit_odp_unsupported(&common::iwarp_device_name(), libc::EINVAL);
}

/// ibv_advise_mr: argument checks, then the capability; the raw verb's
/// answer on this device is `raw_rc`.
fn advise_unsupported(device: &str, raw_rc: i32) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();

    let mut sge = ffi::ibv_sge {
        addr: mr.addr(),
        length: 8192,
        lkey: mr.lkey(),
    };
    // SAFETY: valid PD and one valid entry; prefetching changes no memory.
    let rc = unsafe {
        ffi::ibv_advise_mr(
            pd.as_raw(),
            ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
            ffi::IB_UVERBS_ADVISE_MR_FLAG_FLUSH,
            &mut sge,
            1,
        )
    };
    assert_eq!(rc, raw_rc, "the raw ibv_advise_mr on {device}");

    let err = pd
        .advise_mr(MrAdvice::Prefetch, AdviseFlags::FLUSH, &[])
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { verb: "ibv_advise_mr", reason } if reason.contains("no regions")),
        "{err:?}"
    );
    let other_pd = ctx.alloc_pd().unwrap();
    let foreign = other_pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let err = pd
        .advise_mr(MrAdvice::Prefetch, AdviseFlags::empty(), &[&mr, &foreign])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("region 1 belongs to another protection domain"),
        "{err}"
    );
    for advice in [
        MrAdvice::Prefetch,
        MrAdvice::PrefetchWrite,
        MrAdvice::PrefetchNoFault,
    ] {
        let err = pd
            .advise_mr(advice, AdviseFlags::FLUSH, &[&mr])
            .unwrap_err();
        common::assert_unsupported(&err, &ctx, "on-demand paging", None);
        let err = mr.advise(advice, AdviseFlags::empty()).unwrap_err();
        common::assert_unsupported(&err, &ctx, "on-demand paging", None);
    }
    // The region is untouched and usable.
    assert_eq!(mr.to_vec(), vec![0; 8192]);
}

// rxe and siw leave advise_mr unset: libibverbs' default returns EOPNOTSUPP.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn advise_mr_checks_arguments_then_support() {
    advise_unsupported(&common::device_name(), libc::EOPNOTSUPP);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_advise_mr_checks_arguments_then_support() {
    advise_unsupported(&common::iwarp_device_name(), libc::EOPNOTSUPP);
}

/// Device memory: argument checks, then max_dm_size 0 → Unsupported; the raw
/// verb fails with `raw_errno`.
fn dm_unsupported(device: &str, raw_errno: i32) {
    let ctx = common::open(device);
    assert_eq!(ctx.query_device().unwrap().max_dm_size(), 0);
    let mut attr = ffi::ibv_alloc_dm_attr {
        length: 64,
        log_align_req: 0,
        comp_mask: 0,
    };
    // SAFETY: valid context and attribute struct; a DM it returned would be
    // freed below.
    let dm = unsafe { ffi::ibv_alloc_dm(ctx.as_raw(), &mut attr) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    if !dm.is_null() {
        // SAFETY: allocated above, freed once.
        unsafe { ffi::ibv_free_dm(dm) };
        panic!("the raw ibv_alloc_dm succeeded on {device}");
    }
    assert_eq!(errno, Some(raw_errno), "the raw ibv_alloc_dm on {device}");

    let err = ctx.alloc_dm(0).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { verb: "ibv_alloc_dm", reason } if reason.contains("empty")),
        "{err:?}"
    );
    let err = ctx.alloc_dm_aligned(64, 64).unwrap_err();
    assert!(err.to_string().contains("2^64"), "{err}");
    for len in [1, 64, 1 << 20] {
        let err = ctx.alloc_dm(len).unwrap_err();
        common::assert_unsupported(&err, &ctx, "device memory (max_dm_size 0)", None);
    }
    let err = ctx.alloc_dm_aligned(64, 6).unwrap_err();
    common::assert_unsupported(&err, &ctx, "device memory", None);
    assert_eq!(err_errno(ctx.alloc_dm(8)), Some(libc::EOPNOTSUPP));
}

fn err_errno<T: std::fmt::Debug>(r: rdma::Result<T>) -> Option<i32> {
    r.unwrap_err().errno()
}

// rxe and siw leave alloc_dm unset: libibverbs' default sets EOPNOTSUPP.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn device_memory_is_typed_unsupported() {
    dm_unsupported(&common::device_name(), libc::EOPNOTSUPP);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_device_memory_is_typed_unsupported() {
    dm_unsupported(&common::iwarp_device_name(), libc::EOPNOTSUPP);
}

/// Thread and parent domains: no capability bit announces them, so the
/// verbs are called and their `raw_errno` becomes Unsupported.
fn td_unsupported(device: &str, raw_errno: i32) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();

    let mut td_attr = ffi::ibv_td_init_attr { comp_mask: 0 };
    // SAFETY: valid context and attribute struct.
    let td = unsafe { ffi::ibv_alloc_td(ctx.as_raw(), &mut td_attr) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert!(td.is_null(), "the raw ibv_alloc_td succeeded on {device}");
    assert_eq!(errno, Some(raw_errno), "the raw ibv_alloc_td on {device}");
    let mut pd_attr = ffi::ibv_parent_domain_init_attr {
        pd: pd.as_raw(),
        ..Default::default()
    };
    // SAFETY: valid context, PD and attribute struct (no allocators).
    let parent = unsafe { ffi::ibv_alloc_parent_domain(ctx.as_raw(), &mut pd_attr) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert!(
        parent.is_null(),
        "the raw ibv_alloc_parent_domain succeeded on {device}"
    );
    assert_eq!(
        errno,
        Some(raw_errno),
        "the raw ibv_alloc_parent_domain on {device}"
    );

    let err = ctx.alloc_td().unwrap_err();
    common::assert_unsupported(&err, &ctx, "thread domains", Some(raw_errno));
    let err = pd.alloc_parent_domain(None).unwrap_err();
    common::assert_unsupported(&err, &ctx, "parent domains", Some(raw_errno));
    let err: std::io::Error = pd.alloc_parent_domain(None).unwrap_err().into();
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
}

// rxe and siw leave alloc_td/alloc_parent_domain unset: EOPNOTSUPP.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn thread_and_parent_domains_are_typed_unsupported() {
    td_unsupported(&common::device_name(), libc::EOPNOTSUPP);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_thread_and_parent_domains_are_typed_unsupported() {
    td_unsupported(&common::iwarp_device_name(), libc::EOPNOTSUPP);
}

/// Failed constructors take nothing with them: the handles they were called
/// on stay usable and can be dropped in any order.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn failed_constructors_leave_parents_usable_in_any_drop_order() {
    let device = common::device_name();
    // Context dropped first: the PD keeps it open.
    let ctx = common::open(&device);
    let pd = ctx.alloc_pd().unwrap();
    assert!(ctx.alloc_dm(64).is_err());
    assert!(ctx.alloc_td().is_err());
    assert!(pd.alloc_parent_domain(None).is_err());
    assert!(pd.reg_implicit_odp(AccessFlags::LOCAL_WRITE).is_err());
    assert!(pd.alloc_mr(64, AccessFlags::ON_DEMAND).is_err());
    drop(ctx);
    let mut mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write_at(0, b"still here").unwrap();
    assert!(mr.advise(MrAdvice::Prefetch, AdviseFlags::empty()).is_err());
    // PD dropped before its region: the region keeps it (and the context).
    drop(pd);
    assert_eq!(&mr.to_vec()[..10], b"still here");
    let pd = mr.pd().clone();
    assert!(pd.alloc_parent_domain(None).is_err());
    assert_eq!(pd.context().name(), device);
    drop(mr);
    // The last handle closes the device; a new context opens it again.
    drop(pd);
    let ctx = common::open(&device);
    assert!(matches!(ctx.alloc_td(), Err(Error::Unsupported { .. })));
}
