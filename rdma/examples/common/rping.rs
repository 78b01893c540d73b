//! rping's protocol, shared by `rping` and `async_rping`: the control
//! message, the ping text and the limits of `-S`.

use rdma::RemoteMemory;

/// Length of a control message (`struct rping_rdma_info`).
pub const INFO_LEN: usize = 16;
/// Largest ping (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// Smallest ping: room for `rdma-ping-2147483647: ` and the NUL
/// (`sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT)`).
pub const MIN_SIZE: usize = 26;
/// Send queue depth; the CQ has twice this many entries.
pub const SQ_DEPTH: u32 = 16;

/// The control message describing `mem` (`rping_format_send`).
pub fn info(mem: RemoteMemory, size: usize) -> [u8; INFO_LEN] {
    let mut m = [0u8; INFO_LEN];
    m[..8].copy_from_slice(&mem.addr.to_be_bytes());
    m[8..12].copy_from_slice(&mem.rkey.to_be_bytes());
    m[12..].copy_from_slice(&(size as u32).to_be_bytes());
    m
}

/// Decodes a control message: (address, rkey, length).
pub fn parse_info(m: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    let [a0, a1, a2, a3, a4, a5, a6, a7, k0, k1, k2, k3, l0, l1, l2, l3] = *m;
    (
        u64::from_be_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
        u32::from_be_bytes([k0, k1, k2, k3]),
        u32::from_be_bytes([l0, l1, l2, l3]),
    )
}

/// The ping text: `rdma-ping-N: `, then letters from `first` up to `z`
/// wrapping to `A`, then a NUL in the last byte.
pub fn fill(buf: &mut [u8], ping: u64, first: u8) {
    let head = format!("rdma-ping-{}: ", ping as i32);
    let n = head.len().min(buf.len() - 1);
    buf[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = first;
    for b in &mut buf[n..] {
        *b = c;
        c = if c >= 122 { 65 } else { c + 1 };
    }
    let last = buf.len() - 1;
    buf[last] = 0;
}
