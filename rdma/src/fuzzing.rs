//! The fuzzing entry point: [`run`] hands arbitrary bytes to everything in
//! this crate that reads input from outside the program: what a peer sends
//! (private data, the parameters of a CM event), what the kernel writes
//! (socket addresses in an id, sysfs attributes). The cargo-fuzz target in
//! `rdma/fuzz/` calls it, and so does the test suite
//! (`tests/no_panic.rs`) on the committed corpus (`tests/corpus/`) and on
//! mutations of it, with stable Rust. It exists only with the `fuzzing`
//! feature and is hidden from the docs: not part of the public API. Nothing
//! it reaches may panic, and whatever decodes must encode back to the same
//! value (it checks).
//!
//! The first byte chooses what the rest is read as:
//! - 0: private data and CM event parameters: [`RemoteMemory::from_bytes`],
//!   a `struct rdma_conn_param` carrying the bytes as its private data (and
//!   its other fields taken from them), a `struct ibv_ah_attr` (a UD
//!   event's address) filled with them;
//! - 1: a socket address as librdmacm hands it over (`sockaddr_in`,
//!   `sockaddr_in6`, `sockaddr_ib`, anything else), both with the length
//!   given and inside a `sockaddr_storage`;
//! - 2: a sysfs tree of one device and one port (see [`sysfs_tree`]), read
//!   through every getter of [`crate::sysfs`]; the tree is written under
//!   the system's temporary directory and removed afterwards;
//! - anything else: all three, on the rest.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cm::{CmAddr, ConnParam};
use crate::{ffi, AhAttr, RemoteMemory};

/// The deterministic random numbers of the corpus tests (this crate's and
/// the workspace's other decoders'): xorshift64*, from a fixed seed, so a
/// failing mutation is found again by running the test again.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A corpus test's time budget: the seconds in the environment variable
/// `var`, else `default`.
pub fn budget(var: &str, default: f64) -> std::time::Duration {
    let secs = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    std::time::Duration::from_secs_f64(secs)
}

/// The files of a committed corpus directory, sorted by content; at least
/// `at_least` of them, so that a test cannot pass on a corpus gone missing.
///
/// # Errors
/// The directory or a file cannot be read, or it holds fewer than
/// `at_least` files (`InvalidData`).
pub fn corpus(dir: &Path, at_least: usize) -> std::io::Result<Vec<Vec<u8>>> {
    let mut seeds = Vec::new();
    for e in std::fs::read_dir(dir)? {
        seeds.push(std::fs::read(e?.path())?);
    }
    if seeds.len() < at_least {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} seeds, fewer than the {at_least} expected", seeds.len()),
        ));
    }
    seeds.sort();
    Ok(seeds)
}

/// Mutates an input as the corpus tests do, one to five times: a bit
/// flipped, a byte set to a boundary value (0, 1, 0x7f, 0x80, 0xff: lengths
/// and counts), the input cut short, random bytes appended. The first byte
/// (a `run`'s choice of decoder) is never changed, so each seed stays with
/// its decoder.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        match rng.below(6) {
            0 | 1 if data.len() > 1 => {
                let i = 1 + rng.below(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            2 if data.len() > 1 => {
                let i = 1 + rng.below(data.len() - 1);
                data[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            3 => {
                let n = rng.below(data.len() + 1);
                data.truncate(n);
            }
            _ => {
                for _ in 0..rng.below(64) {
                    data.push(rng.next() as u8);
                }
            }
        }
    }
}

/// Runs the input through the part its first byte chooses.
///
/// # Panics
/// Only when a decoded value does not encode back to itself (a bug the
/// fuzzer is looking for); never because of the input's shape.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => private_data(rest),
        1 => socket_address(rest),
        2 => sysfs_tree(rest),
        _ => {
            private_data(rest);
            socket_address(rest);
            sysfs_tree(rest);
        }
    }
}

/// What a peer sends: [`RemoteMemory`]'s encoding, the connection
/// parameters of a CM event, a UD event's address.
fn private_data(data: &[u8]) {
    if let Ok(m) = RemoteMemory::from_bytes(data) {
        assert_eq!(
            data.get(..RemoteMemory::WIRE_LEN),
            Some(&m.to_bytes()[..]),
            "RemoteMemory round trip"
        );
    }
    let field = |i: usize| data.get(i).copied().unwrap_or(0);
    let len = u8::try_from(data.len()).unwrap_or(u8::MAX);
    let raw = ffi::rdma_conn_param {
        private_data: if data.is_empty() {
            std::ptr::null()
        } else {
            data.as_ptr().cast()
        },
        private_data_len: len,
        responder_resources: field(0),
        initiator_depth: field(1),
        flow_control: field(2),
        retry_count: field(3),
        rnr_retry_count: field(4),
        srq: field(5),
        qp_num: u32::from_le_bytes([field(6), field(7), field(8), field(9)]),
    };
    // SAFETY: `private_data` points at `data`, at least `len` bytes (or is
    // NULL with `data` empty).
    let p = unsafe { ConnParam::from_raw(&raw) };
    assert_eq!(p.private_data, &data[..usize::from(len)]);
    if let Ok(back) = p.to_raw() {
        // SAFETY: `back` points into `p.private_data`, alive here.
        let again = unsafe { ConnParam::from_raw(&back) };
        assert_eq!(again, p, "ConnParam round trip");
    }

    // SAFETY: an all-zero ibv_ah_attr is valid (integers and a byte union).
    let mut ah: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
    let n = data.len().min(std::mem::size_of::<ffi::ibv_ah_attr>());
    // SAFETY: `n` bytes fit both; every field of ibv_ah_attr is an integer
    // or a byte array, so any bytes are a valid value.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), std::ptr::addr_of_mut!(ah).cast::<u8>(), n);
    }
    let a = AhAttr::from_raw(&ah);
    assert_eq!(AhAttr::from_raw(&a.to_raw()), a, "AhAttr round trip");
}

/// A socket address as the kernel and librdmacm hand it over.
fn socket_address(data: &[u8]) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = data
        .len()
        .min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: `n` bytes fit both; a sockaddr_storage is plain integers.
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            std::ptr::addr_of_mut!(storage).cast::<u8>(),
            n,
        );
    }
    let sa = std::ptr::addr_of!(storage).cast::<libc::sockaddr>();
    // The bytes as given, with their own length (unaligned: the reader
    // copies out with unaligned reads).
    // SAFETY: `data` is `data.len()` readable bytes.
    let given = unsafe { crate::cm::addr::from_sockaddr_len(data.as_ptr().cast(), data.len()) };
    // SAFETY: `sa` is a whole sockaddr_storage.
    let stored = unsafe { crate::cm::addr::from_sockaddr_storage(sa) };
    // SAFETY: as above.
    let ip: Option<SocketAddr> = unsafe { crate::cm::from_sockaddr(sa) };
    assert_eq!(ip, stored.as_ref().and_then(CmAddr::ip));
    for addr in [given, stored].into_iter().flatten() {
        let _ = addr.to_string();
        match crate::cm::addr::to_sockaddr("fuzzing", &addr) {
            Ok((back, len)) => {
                // SAFETY: `back` holds the address just written, `len` bytes.
                let again = unsafe {
                    crate::cm::addr::from_sockaddr_len(
                        std::ptr::addr_of!(back).cast(),
                        len as usize,
                    )
                };
                assert_eq!(again, Some(addr), "socket address round trip");
            }
            Err(_) => assert!(matches!(addr, CmAddr::Unknown(_)), "{addr:?}"),
        }
    }
}

/// The files of the tree [`sysfs_tree`] writes, below `class/infiniband/`.
const SYSFS_FILES: &[&str] = &[
    "fz0/node_type",
    "fz0/node_guid",
    "fz0/sys_image_guid",
    "fz0/node_desc",
    "fz0/fw_ver",
    "fz0/hw_rev",
    "fz0/hca_type",
    "fz0/board_id",
    "fz0/ports/1/state",
    "fz0/ports/1/phys_state",
    "fz0/ports/1/lid",
    "fz0/ports/1/lid_mask_count",
    "fz0/ports/1/sm_lid",
    "fz0/ports/1/sm_sl",
    "fz0/ports/1/subnet_timeout",
    "fz0/ports/1/rate",
    "fz0/ports/1/cap_mask",
    "fz0/ports/1/link_layer",
    "fz0/ports/1/gids/0",
    "fz0/ports/1/gids/1",
    "fz0/ports/1/gid_attrs/types/0",
    "fz0/ports/1/gid_attrs/types/1",
    "fz0/ports/1/gid_attrs/ndevs/0",
    "fz0/ports/1/gid_attrs/ndevs/1",
    "fz0/ports/1/pkeys/0",
    "fz0/ports/1/pkeys/1",
];

/// A directory of its own for each call (tests run them on several threads).
fn scratch_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "rdma-fuzz-sysfs-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Removes the scratch tree when dropped, whatever happened.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A sysfs tree made from the bytes: they are split at each `0xff` byte,
/// and the pieces become, in order, the contents of the device's files
/// (`node_type`, `node_guid`, `sys_image_guid`, `node_desc`, `fw_ver`,
/// `hw_rev`, `hca_type`, `board_id`), port 1's (`state`, `phys_state`,
/// `lid`, `lid_mask_count`, `sm_lid`, `sm_sl`, `subnet_timeout`, `rate`,
/// `cap_mask`, `link_layer`), and GIDs 0 and 1, their types and netdevs,
/// and P_Keys 0 and 1 (a piece that starts with `0xfe` leaves its file out),
/// then the name of an extra entry in `ports/` and in `gids/` (anything
/// but `/` and NUL). Then every getter of [`crate::sysfs`] reads it, and
/// a port is looked up by a name made of the next piece.
pub fn sysfs_tree(data: &[u8]) {
    let mut pieces = data.split(|&b| b == 0xff);
    let dir = Scratch(scratch_dir());
    let root = dir.0.join("class/infiniband");
    let write = |rel: &str, bytes: &[u8]| {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::write(path, bytes);
    };
    for rel in SYSFS_FILES {
        match pieces.next() {
            Some([0xfe, ..]) => {}
            Some(bytes) => write(rel, bytes),
            None => write(rel, b""),
        }
    }
    for parent in ["fz0/ports", "fz0/ports/1/gids"] {
        if let Some(name) = pieces.next().and_then(entry_name) {
            write(&format!("{parent}/{name}"), b"");
        }
    }
    let lookup = String::from_utf8_lossy(pieces.next().unwrap_or(b"fz0/1")).into_owned();
    read_everything(&dir.0, &lookup);
}

/// A file name made of the bytes, or `None` when none can be.
fn entry_name(bytes: &[u8]) -> Option<String> {
    let name = String::from_utf8_lossy(bytes);
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
        && name.len() < 200;
    ok.then(|| name.into_owned())
}

fn read_everything(root: &Path, lookup: &str) {
    let sysfs = crate::sysfs::Sysfs::at(root);
    let Ok(devices) = sysfs.devices() else {
        return;
    };
    for d in &devices {
        let _ = (d.node_type(), d.transport_type());
        let _ = (d.node_guid(), d.sys_image_guid(), d.node_desc());
        let _ = (d.fw_ver(), d.hw_rev(), d.hca_type(), d.board_id());
        let _ = d.phys_port_count();
        let _ = d.first_end_port();
        let Ok(ports) = d.end_ports() else { continue };
        for p in &ports {
            let _ = (p.state(), p.phys_state(), p.lid(), p.lmc());
            let _ = (p.sm_lid(), p.sm_sl(), p.subnet_timeout(), p.rate());
            let _ = (p.cap_mask(), p.link_layer(), p.default_gid(), p.port_guid());
            let _ = p.gids().indices();
            for i in 0..3 {
                let _ = (p.gids().get(i), p.gid_type(i), p.gid_netdev(i));
            }
            if let Ok(Some(pkeys)) = p.pkeys() {
                for i in 0..3 {
                    let _ = pkeys.get(i);
                }
            }
            let _ = format!("{p:?}");
        }
    }
    let _ = sysfs.find_port_name(lookup);
    let _ = crate::sysfs::find_port_name(&devices, lookup);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "writes a directory tree (Miri isolates the file system)"
    )]
    fn a_well_formed_tree_reads_back() {
        let mut data = vec![2u8];
        let files: [&[u8]; 18] = [
            b"1: CA\n",
            b"0002:c903:0010:abcd\n",
            b"0002:c903:0010:abcd\n",
            b"fuzz\n",
            b"1.0\n",
            b"\xfe",
            b"\xfe",
            b"\xfe",
            b"4: ACTIVE\n",
            b"5: LinkUp\n",
            b"0x1\n",
            b"0\n",
            b"0x0\n",
            b"0\n",
            b"18\n",
            b"100 Gb/sec (4X EDR)\n",
            b"0x00010000\n",
            b"InfiniBand\n",
        ];
        for f in files {
            data.extend_from_slice(f);
            data.push(0xff);
        }
        data.extend_from_slice(b"fe80:0000:0000:0000:0002:c903:0010:abcd\n");
        // Everything else empty; the tree is read without a panic, and the
        // port reads back what was written (checked through the public API
        // on a tree written the same way).
        run(&data);
        let dir = Scratch(scratch_dir());
        let root = dir.0.join("class/infiniband/fz0");
        std::fs::create_dir_all(root.join("ports/1")).unwrap();
        std::fs::write(root.join("ports/1/state"), "4: ACTIVE\n").unwrap();
        let sysfs = crate::sysfs::Sysfs::at(&dir.0);
        let p = sysfs.find_port_name("fz0/1").unwrap();
        assert_eq!(p.state().unwrap(), crate::PortState::Active);
    }

    #[test]
    fn private_data_and_addresses_of_every_short_length() {
        // Every length up to past the largest struct read (sockaddr_ib, 48
        // bytes), then the longest private data (kept short for Miri).
        let bytes: Vec<u8> = (0..=255u8).collect();
        for n in (0..=64).chain([128, 255, 256]) {
            private_data(&bytes[..n]);
            socket_address(&bytes[..n]);
        }
        let mut sin = vec![0u8; 16];
        sin[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        sin[2..4].copy_from_slice(&7471u16.to_be_bytes());
        sin[4..8].copy_from_slice(&[10, 8, 0, 1]);
        socket_address(&sin);
        // SAFETY: `sin` is 16 readable bytes.
        let a = unsafe { crate::cm::addr::from_sockaddr_len(sin.as_ptr().cast(), sin.len()) };
        assert_eq!(a, Some(CmAddr::Ip("10.8.0.1:7471".parse().unwrap())));
    }
}
