//! XDR (RFC 4506): big-endian 4-byte units, opaque data padded to a
//! multiple of four. [`Writer`] appends to a `Vec`; [`Reader`] reads a slice
//! that came from the network and checks every length before it uses it.

use std::fmt;

/// Why bytes could not be decoded: what was being read, at which offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The item being read (`"fattr3.size"`, `"read list"`, ...).
    pub what: &'static str,
    /// Its byte offset in the message.
    pub at: usize,
    /// What was wrong.
    pub kind: DecodeErrorKind,
}

/// What was wrong with the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeErrorKind {
    /// The message ended before the item.
    Truncated {
        /// Bytes the item needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// A counted item longer than its protocol allows.
    TooLong {
        /// The count on the wire.
        len: u64,
        /// The protocol's limit.
        max: u64,
    },
    /// A value outside the item's range (a boolean of 2, an unknown
    /// discriminant).
    BadValue(u64),
    /// Padding bytes that are not zero.
    BadPadding,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}: ", self.what, self.at)?;
        match &self.kind {
            DecodeErrorKind::Truncated { need, have } => {
                write!(f, "truncated (needs {need} bytes, {have} left)")
            }
            DecodeErrorKind::TooLong { len, max } => {
                write!(f, "length {len} exceeds the limit {max}")
            }
            DecodeErrorKind::BadValue(v) => write!(f, "unexpected value {v}"),
            DecodeErrorKind::BadPadding => write!(f, "non-zero padding"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The result of decoding.
pub type DResult<T> = Result<T, DecodeError>;

/// Bytes of padding after `len` bytes of opaque data.
pub fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Reads XDR items from a slice, each length checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// The offset of the next item.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// An error about `what` at the current offset.
    pub fn error(&self, what: &'static str, kind: DecodeErrorKind) -> DecodeError {
        DecodeError {
            what,
            at: self.pos,
            kind,
        }
    }

    /// The next `n` bytes, unpadded.
    pub fn bytes(&mut self, what: &'static str, n: usize) -> DResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.error(
                what,
                DecodeErrorKind::Truncated {
                    need: n,
                    have: self.remaining(),
                },
            ));
        }
        let b = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self, what: &'static str) -> DResult<u32> {
        let b = self.bytes(what, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned 64-bit integer (hyper).
    pub fn u64(&mut self, what: &'static str) -> DResult<u64> {
        let b = self.bytes(what, 8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A boolean: 0 or 1, anything else is an error.
    pub fn bool(&mut self, what: &'static str) -> DResult<bool> {
        let at = self.pos;
        match self.u32(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError {
                what,
                at,
                kind: DecodeErrorKind::BadValue(v.into()),
            }),
        }
    }

    /// Fixed-length opaque data of `n` bytes, with its padding.
    pub fn fixed(&mut self, what: &'static str, n: usize) -> DResult<&'a [u8]> {
        let b = self.bytes(what, n)?;
        let p = self.bytes(what, pad(n))?;
        if p.iter().any(|&x| x != 0) {
            return Err(DecodeError {
                what,
                at: self.pos - p.len(),
                kind: DecodeErrorKind::BadPadding,
            });
        }
        Ok(b)
    }

    /// Variable-length opaque data of at most `max` bytes.
    pub fn opaque(&mut self, what: &'static str, max: usize) -> DResult<&'a [u8]> {
        let at = self.pos;
        let len = self.u32(what)? as usize;
        if len > max {
            return Err(DecodeError {
                what,
                at,
                kind: DecodeErrorKind::TooLong {
                    len: len as u64,
                    max: max as u64,
                },
            });
        }
        self.fixed(what, len)
    }

    /// A counted array's length, at most `max`, and never more elements
    /// than bytes left divided by `min_size` (a count cannot promise more
    /// than the message holds).
    pub fn count(&mut self, what: &'static str, max: usize, min_size: usize) -> DResult<usize> {
        let at = self.pos;
        let n = self.u32(what)? as usize;
        let fits = self.remaining() / min_size.max(1);
        if n > max || n > fits {
            return Err(DecodeError {
                what,
                at,
                kind: DecodeErrorKind::TooLong {
                    len: n as u64,
                    max: max.min(fits) as u64,
                },
            });
        }
        Ok(n)
    }

    /// Fails unless every byte was read.
    pub fn finish(&self, what: &'static str) -> DResult<()> {
        if self.remaining() != 0 {
            return Err(self.error(what, DecodeErrorKind::BadValue(self.remaining() as u64)));
        }
        Ok(())
    }
}

/// Appends XDR items to a `Vec`.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    /// The encoded bytes.
    pub buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer::default()
    }

    /// Bytes written.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// An unsigned 64-bit integer.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A boolean.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u32(u32::from(v))
    }

    /// Fixed-length opaque data, padded.
    pub fn fixed(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self.buf.resize(self.buf.len() + pad(b.len()), 0);
        self
    }

    /// Variable-length opaque data (its length must fit in 32 bits; the
    /// callers' items are bounded far below).
    pub fn opaque(&mut self, b: &[u8]) -> &mut Self {
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.fixed(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_cut_fails() {
        let mut w = Writer::new();
        w.u32(7)
            .u64(1 << 40)
            .bool(true)
            .opaque(b"abcde")
            .fixed(b"xy");
        assert_eq!(w.len(), 4 + 8 + 4 + 4 + 8 + 4);
        let decode = |b: &[u8]| -> DResult<()> {
            let mut r = Reader::new(b);
            assert_eq!(r.u32("a")?, 7);
            assert_eq!(r.u64("b")?, 1 << 40);
            assert!(r.bool("c")?);
            assert_eq!(r.opaque("d", 16)?, b"abcde");
            assert_eq!(r.fixed("e", 2)?, b"xy");
            r.finish("end")
        };
        decode(&w.buf).unwrap();
        for cut in 0..w.len() {
            assert!(decode(&w.buf[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn hostile_lengths_and_values_are_errors() {
        // A boolean of 2.
        let e = Reader::new(&[0, 0, 0, 2]).bool("flag").unwrap_err();
        assert_eq!(e.kind, DecodeErrorKind::BadValue(2));
        // An opaque longer than allowed, and one longer than the message.
        let e = Reader::new(&[0, 0, 0, 9, 1, 2, 3, 4])
            .opaque("fh", 8)
            .unwrap_err();
        assert!(matches!(
            e.kind,
            DecodeErrorKind::TooLong { len: 9, max: 8 }
        ));
        let e = Reader::new(&[0xff, 0xff, 0xff, 0xff])
            .opaque("data", usize::MAX)
            .unwrap_err();
        assert!(matches!(e.kind, DecodeErrorKind::Truncated { .. }));
        // Non-zero padding.
        let e = Reader::new(&[0, 0, 0, 1, 9, 1, 0, 0])
            .opaque("x", 4)
            .unwrap_err();
        assert_eq!(e.kind, DecodeErrorKind::BadPadding);
        // A count that promises more elements than bytes remain.
        let e = Reader::new(&[0, 1, 0, 0, 0, 0, 0, 0])
            .count("list", usize::MAX, 4)
            .unwrap_err();
        assert!(matches!(
            e.kind,
            DecodeErrorKind::TooLong { len: 65536, .. }
        ));
        assert!(e.to_string().contains("list at byte 0"));
    }
}
