//! Memory regions over a real dma-buf (`ProtectionDomain::reg_dmabuf_mr`): a dumb buffer of
//! the kernel's `vgem` driver exported through PRIME, as a GPU driver exports its memory.
//! Where the provider registers dma-bufs the region carries an RDMA WRITE, read back through
//! the buffer's own mapping; where it does not (soft-RoCE and soft-iWARP on Linux 6.1), the
//! error is `Unsupported` with the provider's errno. Bad input is refused with a typed error
//! either way. Device tests: root, the `vgem` module, an RDMA device (`ci/vm run`).

mod common;

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use rdma::{AccessFlags, DeviceSlice, Error, QpType, SendWr};

/// `struct drm_mode_create_dumb`.
#[repr(C)]
#[derive(Default)]
struct CreateDumb {
    height: u32,
    width: u32,
    bpp: u32,
    flags: u32,
    handle: u32,
    pitch: u32,
    size: u64,
}

/// `struct drm_prime_handle`.
#[repr(C)]
#[derive(Default)]
struct PrimeHandle {
    handle: u32,
    flags: u32,
    fd: i32,
}

/// `DRM_IOWR(0xB2, struct drm_mode_create_dumb)`.
const DRM_IOCTL_MODE_CREATE_DUMB: libc::c_ulong = 0xC020_64B2;
/// `DRM_IOWR(0x2d, struct drm_prime_handle)`.
const DRM_IOCTL_PRIME_HANDLE_TO_FD: libc::c_ulong = 0xC00C_642D;

/// The `/dev/dri` node of `vgem` (loaded first).
fn vgem_card() -> std::fs::File {
    let status = std::process::Command::new("modprobe")
        .arg("vgem")
        .status()
        .expect("modprobe runs");
    assert!(status.success(), "modprobe vgem failed: {status}");
    for e in std::fs::read_dir("/sys/class/drm").expect("/sys/class/drm") {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("card") || name.contains('-') {
            continue;
        }
        // vgem's card is a platform device named vgem (bound to no driver).
        let device = std::fs::read_link(e.path().join("device")).ok();
        if device.is_some_and(|d| d.file_name().is_some_and(|n| n == "vgem")) {
            return std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/dev/dri/{name}"))
                .expect("open the vgem card");
        }
    }
    panic!("no vgem card in /sys/class/drm after modprobe vgem");
}

/// A dma-buf of at least `len` bytes (a 32-bit dumb buffer one row high), and its size.
fn vgem_dmabuf(card: &std::fs::File, len: usize) -> (OwnedFd, usize) {
    let mut dumb = CreateDumb {
        height: 1,
        width: u32::try_from(len / 4).unwrap(),
        bpp: 32,
        ..CreateDumb::default()
    };
    // SAFETY: a valid DRM descriptor and the ioctl's struct.
    let rc = unsafe { libc::ioctl(card.as_raw_fd(), DRM_IOCTL_MODE_CREATE_DUMB, &mut dumb) };
    assert_eq!(
        rc,
        0,
        "DRM_IOCTL_MODE_CREATE_DUMB: {}",
        std::io::Error::last_os_error()
    );
    let mut prime = PrimeHandle {
        handle: dumb.handle,
        flags: (libc::O_CLOEXEC | libc::O_RDWR) as u32,
        fd: -1,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::ioctl(card.as_raw_fd(), DRM_IOCTL_PRIME_HANDLE_TO_FD, &mut prime) };
    assert_eq!(
        rc,
        0,
        "DRM_IOCTL_PRIME_HANDLE_TO_FD: {}",
        std::io::Error::last_os_error()
    );
    assert!(prime.fd >= 0);
    // SAFETY: a descriptor the ioctl just made, owned by nobody else.
    (
        unsafe { OwnedFd::from_raw_fd(prime.fd) },
        dumb.size as usize,
    )
}

fn dmabuf_regions(device: &str) {
    let card = vgem_card();
    let (buf, size) = vgem_dmabuf(&card, 64 << 10);
    assert!(size >= 64 << 10, "a dumb buffer of {size} bytes");
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // On RoCE, two connected QPs whose PD the region is registered in, for the traffic;
    // (iWARP QPs connect only through the CM: a PD alone there).
    let pair = (device == common::device_name()).then(|| common::pair(QpType::Rc, rw));
    let pd = match &pair {
        Some(p) => p.pd.clone(),
        None => common::open(device).alloc_pd().unwrap(),
    };
    // Bad input first, refused whatever the provider: an empty region (by the crate), a
    // descriptor that is no dma-buf, a range past the buffer, remote write without local.
    let typed = |e: Error, what: &str| {
        assert!(
            matches!(e, Error::Unsupported { .. })
                || e.verb() == Some("ibv_reg_dmabuf_mr") && e.errno().is_some(),
            "{what}: {e:?}"
        );
        eprintln!("{what}: {e}");
    };
    let e = pd.reg_dmabuf_mr(buf.as_fd(), 0, 0, 0, rw).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let not_a_dmabuf = std::fs::File::open("/dev/null").unwrap();
    typed(
        pd.reg_dmabuf_mr(not_a_dmabuf.as_fd(), 0, 4096, 0, rw)
            .unwrap_err(),
        "/dev/null",
    );
    typed(
        pd.reg_dmabuf_mr(buf.as_fd(), size as u64, 4096, 0, rw)
            .unwrap_err(),
        "past the buffer",
    );
    typed(
        pd.reg_dmabuf_mr(buf.as_fd(), 0, size, 0, AccessFlags::REMOTE_WRITE)
            .unwrap_err(),
        "REMOTE_WRITE without LOCAL_WRITE",
    );
    match pd.reg_dmabuf_mr(buf.as_fd(), 0, size, 0x10_0000, rw) {
        Err(Error::Unsupported { source, .. }) => {
            let errno = source.and_then(|e| e.raw_os_error());
            assert!(errno.is_some(), "Unsupported without the provider's errno");
            eprintln!("{device} does not register dma-bufs: errno {errno:?}");
        }
        Err(e) => panic!("a good dma-buf refused with {e:?}"),
        Ok(region) => match pair {
            Some(p) => written_through_the_region(p, region, &buf, size),
            None => eprintln!("{device} registered a dma-buf: {region:?}"),
        },
    }
    drop(buf);
    drop(card);
}

/// An RDMA WRITE into `region` from a peer QP lands in the dma-buf (read back through its
/// mapping); a local request takes a piece of it as a `DeviceSlice`.
fn written_through_the_region(
    p: common::Pair,
    region: rdma::DeviceMemoryRegion,
    buf: &OwnedFd,
    size: usize,
) {
    let remote = region.remote();
    assert_eq!(remote.addr, 0x10_0000);
    let src = p.pd.reg_mr(vec![0x5a; 4096], AccessFlags::empty()).unwrap();
    let mut a = p.a;
    a.post_send(SendWr::write(1, src, remote.slice(0, 4096).unwrap()))
        .unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    // SAFETY: a shared read-only mapping of the dma-buf, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ,
            libc::MAP_SHARED,
            buf.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "mmap of the dma-buf");
    // SAFETY: `size` mapped bytes, read after the write completed.
    let bytes = unsafe { std::slice::from_raw_parts(map.cast::<u8>(), 4096) };
    assert!(bytes.iter().all(|&b| b == 0x5a), "the WRITE did not land");
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, size) };
    let _slice = DeviceSlice::new(region, 0, 64);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE), root and the vgem module: run in ci/vm"]
fn a_dmabuf_region_carries_traffic_or_is_typed_unsupported() {
    dmabuf_regions(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE), root and the vgem module: run in ci/vm"]
fn iwarp_a_dmabuf_region_carries_traffic_or_is_typed_unsupported() {
    dmabuf_regions(&common::iwarp_device_name());
}
