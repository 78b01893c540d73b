//! Sharing objects between contexts: `ibv_import_device`, `ibv_import_pd`,
//! `ibv_import_mr`, `ibv_import_dm`, the handles they take
//! (`Context::cmd_fd`, `ProtectionDomain::handle`, `MemoryRegion::handle`)
//! and the unimport verbs (run by Drop).
//!
//! Measured in the VM (Linux 6.1, rdma-core 44): neither rxe0 nor siw0
//! implements any import. `ibv_import_device` on a duplicate of a context's
//! command descriptor answers `EOPNOTSUPP` (the provider has no
//! `import_context`) and leaves the descriptor open; on `/dev/null` (a
//! character device that is no RDMA device) it answers `ENODEV`.
//! `ibv_import_pd`, `ibv_import_mr` and `ibv_import_dm` answer `EOPNOTSUPP`
//! for valid and bogus handles alike, so the kernel never sees the handle.
//! The handles themselves are the kernel's per-file object ids: on both
//! devices the first PD of a fresh context is handle 0, its first MR 1, and
//! a freed handle is given to the next object (which is why an imported
//! view whose object was destroyed may name another object later).
//!
//! On a device that implements imports (mlx5), the same tests take the
//! other branch: they compare the imported objects' fields with the
//! originals and move data through a QP of the imported PD using the
//! imported region's key. That branch has not run here.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use rdma::{ffi, AccessFlags, Context, Error, MemoryRegion, ProtectionDomain, QpType};

/// The RDMA device behind a character device, from sysfs: the oracle for
/// what `Context::cmd_fd` is.
fn ibdev_of(fd: &impl AsRawFd) -> String {
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    assert!(meta.file_type().is_char_device(), "{meta:?}");
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/char/{major}:{minor}/ibdev"))
        .unwrap_or_else(|e| panic!("char device {major}:{minor} is no uverbs device: {e}"))
        .trim()
        .to_string()
}

/// True when `fd` is an open descriptor of this process.
fn is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Asserts the typed refusal of a provider without imports.
fn assert_refused(err: &Error, ctx: &Context, verb: &str) {
    common::assert_unsupported(err, ctx, verb, Some(libc::EOPNOTSUPP));
    assert_eq!(err.errno(), Some(libc::EOPNOTSUPP), "{err}");
}

/// Fills `mr` with a pattern no other test uses.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// The success branch (devices with imports): every imported field matches
/// the original, and a QP made in the imported PD sends the original
/// region's bytes, named by the imported region's lkey.
fn verify_imports(ctx: &Context, imported: &Context, pd: &ProtectionDomain, mr: &MemoryRegion) {
    assert!(imported.is_imported());
    assert_eq!(imported.name(), ctx.name());
    assert_eq!(ibdev_of(&imported.cmd_fd()), ctx.name());
    let ipd = imported.import_pd(pd.handle()).expect("ibv_import_pd");
    assert!(ipd.is_imported());
    assert_eq!(ipd.handle(), pd.handle());
    let imr = ipd.import_mr(mr.handle()).expect("ibv_import_mr");
    assert_eq!(imr.handle(), mr.handle());
    assert_eq!(imr.lkey(), mr.lkey());
    assert_eq!(imr.rkey(), mr.rkey());
    assert_eq!(imr.len(), mr.len());
    // ibv_import_mr(3): "The addr field in the imported MR is not
    // applicable, NULL value is expected."
    assert_eq!(imr.addr(), 0);

    // Traffic: A and B live in the imported PD; A sends the original
    // region's bytes (registered through the original PD, the same kernel
    // PD) with the imported lkey; B receives into a region of the imported
    // PD.
    let cq = imported.create_cq(16, None, 0).unwrap();
    let mut a = ipd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let mut b = ipd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    common::connect(imported, &a, &b, gid_index);
    common::connect(imported, &b, &a, gid_index);
    let recv = ipd.alloc_mr(mr.len(), AccessFlags::LOCAL_WRITE).unwrap();
    b.post_recv(2, recv).map_err(|e| e.error).unwrap();
    let mut sge = ffi::ibv_sge {
        addr: mr.addr(),
        length: u32::try_from(mr.len()).unwrap(),
        lkey: imr.lkey(),
    };
    let mut wr = ffi::ibv_send_wr {
        wr_id: 1,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: ffi::IBV_WR_SEND,
        send_flags: ffi::IBV_SEND_SIGNALED,
        ..Default::default()
    };
    // SAFETY: one well-formed request; `mr` (and so the memory the SGE
    // names) outlives the wait for its completion below, and nothing
    // writes it meanwhile.
    unsafe { a.post_send_raw(&mut wr) }.unwrap();
    let mut done = common::wait(&cq, 2);
    common::take(&mut done, 1)
        .ok()
        .expect("send through the imported lkey");
    let mut got = common::take(&mut done, 2).ok().unwrap();
    assert_eq!(got.byte_len as usize, mr.len());
    let recv = got.take_buffers().into_one().unwrap();
    assert_eq!(recv.to_vec(), mr.to_vec(), "byte for byte");
    assert_eq!(recv.to_vec(), pattern(mr.len()));
}

/// Handles, the command descriptor, and every import of valid handles.
fn imports(device: &str) {
    let failures = rdma::teardown_failures();
    let ctx = common::open(device);

    // The command descriptor is the device's uverbs character device
    // (sysfs is the oracle), and not the event descriptor.
    let cmd = ctx.cmd_fd();
    assert_eq!(ibdev_of(&cmd), device);
    assert_ne!(cmd.as_raw_fd(), ctx.async_fd().unwrap().as_raw_fd());
    assert!(!ctx.is_imported());

    // Handles are the file's object ids: distinct while alive, and a
    // freed one goes to the next object.
    let pd = ctx.alloc_pd().unwrap();
    let mut mr = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write_at(0, &pattern(256)).unwrap();
    let spare = ctx.alloc_pd().unwrap();
    let spare_handle = spare.handle();
    assert!(!pd.is_imported());
    assert_ne!(pd.handle(), mr.handle());
    assert_ne!(spare_handle, pd.handle());
    assert_ne!(spare_handle, mr.handle());
    // SAFETY: reads fields of a live PD and MR.
    let (raw_pd, raw_mr) = unsafe { ((*pd.as_raw()).handle, (*mr.as_raw()).handle) };
    assert_eq!((pd.handle(), mr.handle()), (raw_pd, raw_mr));
    drop(spare);
    let again = ctx.alloc_pd().unwrap();
    assert_eq!(again.handle(), spare_handle, "the kernel reuses handles");

    // ibv_import_device on a duplicate of the command descriptor.
    let dup = cmd.try_clone_to_owned().unwrap();
    let dup_raw = dup.as_raw_fd();
    // SAFETY: this process reads no asynchronous events while the imported
    // context (if any) has objects, and both contexts are in this process.
    match unsafe { Context::import_device(dup) } {
        Ok(imported) => verify_imports(&ctx, &imported, &pd, &mr),
        Err(err) => {
            assert_refused(&err, &ctx, "importing a device (ibv_import_device)");
            // Refused before the provider: libibverbs left the descriptor
            // open, and the crate did not close it (it cannot know).
            assert!(is_open(dup_raw), "descriptor {dup_raw} closed");
            // The raw verb agrees.
            let dup2 = ctx.cmd_fd().try_clone_to_owned().unwrap().into_raw_fd();
            // SAFETY: a valid descriptor, handed to libibverbs.
            let raw = unsafe { ffi::ibv_import_device(dup2) };
            assert!(raw.is_null());
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EOPNOTSUPP)
            );
            assert!(is_open(dup2), "libibverbs closed descriptor {dup2}");
            // SAFETY: still open (checked), and ours since: closed once.
            drop(unsafe { OwnedFd::from_raw_fd(dup2) });
            // SAFETY: `dup_raw` is still open (checked above), nothing in
            // this single-threaded test opened a descriptor since, so it is
            // the duplicate the failed import left behind; closed once.
            drop(unsafe { OwnedFd::from_raw_fd(dup_raw) });

            // Imports into the original context refuse valid handles too.
            let err = ctx.import_pd(pd.handle()).unwrap_err();
            assert_refused(&err, &ctx, "importing a PD (ibv_import_pd)");
            let err = pd.import_mr(mr.handle()).unwrap_err();
            assert_refused(&err, &ctx, "importing a memory region (ibv_import_mr)");
        }
    }

    // A descriptor of no RDMA device: a verb error naming the verb.
    let null: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    // SAFETY: nothing is imported (the import fails).
    let err = unsafe { Context::import_device(null) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Verb {
                verb: "ibv_import_device",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.errno(), Some(libc::ENODEV), "{err}");

    // The originals still work, and nothing failed in a Drop.
    assert_eq!(mr.to_vec(), pattern(256));
    pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    drop((mr, pd, again, ctx));
    assert_eq!(rdma::teardown_failures(), failures);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn import_device_pd_mr() {
    imports(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_import_device_pd_mr() {
    imports(&common::iwarp_device_name());
}

/// Handles that name nothing: a typed error, never a crash. A provider
/// without imports refuses them before the kernel sees them (the same
/// `Unsupported` as for valid handles); one with imports gets the kernel's
/// answer, a verb error naming the verb and the handle.
fn bogus_handles(device: &str) {
    let ctx = common::open(device);
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let bogus = 0x7fff_fff0;
    assert!(![pd.handle(), mr.handle()].contains(&bogus));

    let check = |err: Error, verb: &str, what: &str, text: &str| match &err {
        Error::Unsupported { .. } => assert_refused(&err, &ctx, what),
        Error::Verb { verb: v, .. } => {
            assert_eq!(*v, verb, "{err}");
            assert!(err.to_string().contains(text), "{err}");
        }
        other => panic!("{verb} of a bogus handle: {other:?}"),
    };
    let pd_err = ctx.import_pd(bogus).unwrap_err();
    let pd_errno = pd_err.errno();
    check(
        pd_err,
        "ibv_import_pd",
        "importing a PD (ibv_import_pd)",
        "PD handle 2147483632",
    );
    check(
        pd.import_mr(bogus).unwrap_err(),
        "ibv_import_mr",
        "importing a memory region (ibv_import_mr)",
        "MR handle 2147483632",
    );
    // SAFETY: nothing is imported (a bogus handle fails); were it not, the
    // copies would stay within 64 bytes, which no test makes.
    let err = unsafe { ctx.import_dm(bogus, 64) }.unwrap_err();
    check(
        err,
        "ibv_import_dm",
        "importing device memory (ibv_import_dm)",
        "device memory handle 2147483632",
    );
    // An empty length is refused before the verb.
    // SAFETY: as above.
    let err = unsafe { ctx.import_dm(bogus, 0) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                verb: "ibv_import_dm",
                ..
            }
        ),
        "{err}"
    );

    // The raw verb gives the same errno.
    // SAFETY: valid context; a PD imported here would be unimported.
    let raw = unsafe { ffi::ibv_import_pd(ctx.as_raw(), bogus) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    if raw.is_null() {
        assert_eq!(errno, pd_errno);
    } else {
        // SAFETY: imported above, unimported once.
        unsafe { ffi::ibv_unimport_pd(raw) };
        panic!("{device} imported PD handle {bogus}, which names nothing");
    }

    // Nothing broke.
    pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.len(), 64);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn import_of_bogus_handles_is_an_error() {
    bogus_handles(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_import_of_bogus_handles_is_an_error() {
    bogus_handles(&common::iwarp_device_name());
}
