//! Host tests of the generated bindings: no device needed.

use std::ffi::{c_void, CStr};

/// rdma-core 44 has 96 `static inline` functions in verbs.h (one of them only
/// under `RDMA_STATIC_PROVIDERS`), 16 in rdma_verbs.h and 2 in rdma_cma.h.
const RDMA_CORE_44_INLINES: usize = 95 + 16 + 2;

#[test]
fn every_static_inline_function_is_wrapped() {
    // The macro takes the address of each function the build script found in
    // the installed headers; one without a C wrapper fails to compile or link.
    let addrs: Vec<(&str, *const c_void)> = rdma_sys::__rdma_sys_inline_fn_addrs!().to_vec();
    assert_eq!(addrs.len(), rdma_sys::STATIC_INLINE_FUNCTIONS.len());
    assert!(
        addrs.len() >= RDMA_CORE_44_INLINES,
        "the header scan found only {} static inline functions",
        addrs.len()
    );
    for (name, addr) in &addrs {
        assert!(!addr.is_null(), "{name} has no address");
    }
    for must in [
        "ibv_post_send",
        "ibv_post_recv",
        "ibv_poll_cq",
        "ibv_req_notify_cq",
        "ibv_wr_start",
        "ibv_wr_complete",
        "ibv_start_poll",
        "ibv_next_poll",
        "ibv_end_poll",
        "ibv_wc_read_opcode",
        "ibv_create_cq_ex",
        "ibv_create_qp_ex",
        "ibv_query_device_ex",
        "___ibv_query_port",
        "__ibv_reg_mr",
        "rdma_post_send",
        "rdma_get_recv_comp",
        "rdma_get_local_addr",
    ] {
        assert!(
            addrs.iter().any(|(n, _)| *n == must),
            "{must} missing from the scan"
        );
    }
}

/// The symbol the dynamic linker gives for `name` (libibverbs' export).
fn exported(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

#[test]
fn macro_named_functions_are_not_the_compat_exports() {
    let ours = [
        (c"ibv_query_port", rdma_sys::ibv_query_port as *const c_void),
        (c"ibv_reg_mr", rdma_sys::ibv_reg_mr as *const c_void),
        (
            c"ibv_reg_mr_iova",
            rdma_sys::ibv_reg_mr_iova as *const c_void,
        ),
    ];
    for (name, addr) in ours {
        let compat = exported(name);
        assert!(!compat.is_null(), "libibverbs exports {name:?}");
        assert_ne!(
            compat.cast_const(),
            addr,
            "{name:?} binds the ABI-compat export"
        );
    }
    // And the macro forwards to the extended entry points.
    assert!(!exported(c"ibv_reg_mr_iova2").is_null());
}

#[test]
fn enums_are_plain_integers() {
    // A value no header lists is still representable (no Rust enum UB).
    let state: rdma_sys::ibv_qp_state = 1000;
    assert_ne!(state, rdma_sys::IBV_QPS_RTS);
    let status: rdma_sys::ibv_wc_status = 0xffff;
    assert_ne!(status, rdma_sys::IBV_WC_SUCCESS);
    // verbs_api.h aliases are re-exported under their IBV_ names.
    assert_eq!(
        rdma_sys::IBV_ACCESS_OPTIONAL_RANGE,
        rdma_sys::IB_UVERBS_ACCESS_OPTIONAL_RANGE
    );
}

#[test]
fn libc_socket_types_are_shared() {
    let addr = rdma_sys::rdma_addr::default();
    // SAFETY: reading a union member of a zeroed POD value.
    let sa: libc::sockaddr = unsafe { addr.__bindgen_anon_1.src_addr };
    assert_eq!(sa.sa_family, 0);
}

/// The committed docs.rs snapshot must equal what bindgen generates now from
/// the same rdma-core release. `RDMA_SYS_BLESS=1` rewrites it.
#[test]
fn docs_snapshot_is_current() {
    let out = env!("OUT_DIR");
    let now = std::fs::read_to_string(format!("{out}/bindings.rs")).unwrap()
        + &std::fs::read_to_string(format!("{out}/macro_aliases.rs")).unwrap();
    let header = format!(
        "// Snapshot for docs.rs: libibverbs {}, librdmacm {}. Regenerate with\n\
         // RDMA_SYS_BLESS=1 cargo test -p rdma-verbs-sys --test bindings docs_snapshot\n",
        rdma_sys::IBVERBS_VERSION,
        rdma_sys::RDMACM_VERSION
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/docsrs_bindings.rs");
    let expected = header.clone() + &now;
    if std::env::var_os("RDMA_SYS_BLESS").is_some() {
        std::fs::write(path, &expected).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap();
    let committed_header: String = committed
        .lines()
        .take(2)
        .map(|l| format!("{l}\n"))
        .collect();
    if committed_header != header {
        // Generated from another rdma-core release than the one installed:
        // the comparison would say nothing. CI installs the snapshot's release.
        assert!(
            std::env::var_os("RDMA_SYS_REQUIRE_SNAPSHOT").is_none(),
            "snapshot header {committed_header:?} is not for the installed rdma-core ({header:?})"
        );
        eprintln!("skipped: the docs.rs snapshot is for another rdma-core release");
        return;
    }
    assert!(
        committed == expected,
        "src/docsrs_bindings.rs is stale: run RDMA_SYS_BLESS=1 cargo test -p rdma-verbs-sys --test bindings docs_snapshot"
    );
}
