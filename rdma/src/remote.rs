//! What a peer needs to address memory remotely ([`RemoteMemory`]: address,
//! length, rkey), and its stable wire encoding, for peers to exchange it (in
//! private data, a SEND, ...). A plain value: it holds no registration.

use crate::error::{Error, Result};

/// What a peer needs to address memory remotely: its address, length and rkey.
///
/// [`RemoteMemory::to_bytes`] is its stable wire encoding; with the `serde`
/// feature it is also `Serialize`/`Deserialize` (a struct of its three
/// fields).
///
/// ```no_run
/// # fn f(pd: &rdma::ProtectionDomain) -> rdma::Result<()> {
/// use rdma::{AccessFlags, RemoteMemory};
/// let target = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// // Sent to the peer (private data of a connection, a SEND), who writes
/// // into the first half.
/// let wire = target.remote().to_bytes();
/// let remote = RemoteMemory::from_bytes(&wire)?;
/// let half = remote.slice(0, 2048).expect("within the region");
/// # let _ = half;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemoteMemory {
    /// Virtual address (or offset for zero-based regions).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote key.
    pub rkey: u32,
}

impl RemoteMemory {
    /// The sub-range `offset..offset + len`, or `None` if it does not fit.
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteMemory> {
        (offset.checked_add(len)? <= self.len).then_some(RemoteMemory {
            addr: self.addr + offset,
            len,
            rkey: self.rkey,
        })
    }
}

impl RemoteMemory {
    /// The length of [`RemoteMemory::to_bytes`].
    pub const WIRE_LEN: usize = 20;

    /// The encoding: `addr` (8 bytes), `len` (8 bytes), `rkey` (4 bytes),
    /// each big-endian (network order), nothing else. It never changes: a
    /// peer built from another version of this crate, or written in C,
    /// reads the same fields.
    ///
    /// ```
    /// let m = rdma::RemoteMemory { addr: 0x1000, len: 64, rkey: 7 };
    /// let bytes = m.to_bytes();
    /// assert_eq!(bytes[..8], 0x1000u64.to_be_bytes());
    /// assert_eq!(rdma::RemoteMemory::from_bytes(&bytes).unwrap(), m);
    /// ```
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut out = [0u8; Self::WIRE_LEN];
        out[..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..16].copy_from_slice(&self.len.to_be_bytes());
        out[16..].copy_from_slice(&self.rkey.to_be_bytes());
        out
    }

    /// Reads [`RemoteMemory::to_bytes`]'s encoding from the start of
    /// `bytes` (bytes after the first [`RemoteMemory::WIRE_LEN`] are
    /// ignored, so it can be read out of a longer message).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `bytes` is shorter than
    /// [`RemoteMemory::WIRE_LEN`], or the range wraps past the end of the
    /// address space.
    pub fn from_bytes(bytes: &[u8]) -> Result<RemoteMemory> {
        let invalid = |reason: String| Error::InvalidArgument {
            verb: "RemoteMemory::from_bytes",
            reason,
        };
        let Some(b) = bytes.get(..Self::WIRE_LEN) else {
            return Err(invalid(format!(
                "{} bytes, the encoding has {}",
                bytes.len(),
                Self::WIRE_LEN
            )));
        };
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        let mut k = [0u8; 4];
        k.copy_from_slice(&b[16..20]);
        let m = RemoteMemory {
            addr: u64_at(0),
            len: u64_at(8),
            rkey: u32::from_be_bytes(k),
        };
        if m.addr.checked_add(m.len).is_none() {
            return Err(invalid(format!(
                "addr {:#x} + len {} wraps past the end of the address space",
                m.addr, m.len
            )));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::RemoteMemory;

    #[test]
    fn wire_encoding_is_big_endian_and_round_trips() {
        let m = RemoteMemory {
            addr: 0x0102_0304_0506_0708,
            len: 0x1112_1314_1516_1718,
            rkey: 0x2122_2324,
        };
        let b = m.to_bytes();
        assert_eq!(
            b,
            [
                1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x21, 0x22,
                0x23, 0x24
            ]
        );
        assert_eq!(RemoteMemory::from_bytes(&b).unwrap(), m);
        // A longer message: the rest is ignored.
        let mut longer = b.to_vec();
        longer.extend_from_slice(b"trailer");
        assert_eq!(RemoteMemory::from_bytes(&longer).unwrap(), m);
    }

    #[test]
    fn short_or_wrapping_encodings_are_refused() {
        let e = RemoteMemory::from_bytes(&[0; 19]).unwrap_err();
        assert!(e.to_string().contains("19 bytes"), "{e}");
        let wraps = RemoteMemory {
            addr: u64::MAX,
            len: 2,
            rkey: 1,
        };
        let e = RemoteMemory::from_bytes(&wraps.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("wraps"), "{e}");
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_keeps_the_fields() {
        let m = RemoteMemory {
            addr: 0x1000,
            len: 64,
            rkey: 7,
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"addr":4096,"len":64,"rkey":7}"#);
        assert_eq!(serde_json::from_str::<RemoteMemory>(&json).unwrap(), m);
    }
}
