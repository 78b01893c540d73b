//! The wire's little-endian fields: [`Reader`] reads them and fails instead
//! of running past the end, [`Writer`] appends them and fills in the size
//! field last; [`split`] checks a message's header against its buffer. They
//! know nothing of which message holds which fields (`messages.rs` does).

use super::{DecodeError, Qid, HEADER};

/// Little-endian reads that fail instead of running past the end.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A string: `len[2]` and its bytes.
    pub fn str(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u16()?;
        self.bytes(usize::from(n))
    }
    /// A qid.
    pub fn qid(&mut self) -> Result<Qid, DecodeError> {
        Ok(Qid {
            ty: self.u8()?,
            version: self.u32()?,
            path: self.u64()?,
        })
    }
    /// What is left.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// Fails unless everything was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Little-endian writes into a `Vec`; [`Writer::finish`] fills in `size`.
#[derive(Debug)]
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// Starts a message of type `ty` with `tag` at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>, ty: u8, tag: u16) -> Self {
        let start = out.len();
        out.extend_from_slice(&[0, 0, 0, 0, ty]);
        out.extend_from_slice(&tag.to_le_bytes());
        Writer { out, start }
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }
    /// A `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.out.extend_from_slice(v);
        self
    }
    /// A string, cut at 65535 bytes (names are at most 255 on Linux).
    pub fn str(&mut self, v: &[u8]) -> &mut Self {
        let v = &v[..v.len().min(usize::from(u16::MAX))];
        self.u16(v.len() as u16).bytes(v)
    }
    /// A qid.
    pub fn qid(&mut self, q: &Qid) -> &mut Self {
        self.u8(q.ty).u32(q.version).u64(q.path)
    }
    /// Writes the size field; returns the message's length.
    pub fn finish(&mut self) -> usize {
        let len = self.out.len() - self.start;
        let size = u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes();
        self.out[self.start..self.start + 4].copy_from_slice(&size);
        len
    }
}

/// Splits a message into `(type, tag, body)` after checking its size field
/// against `buf`.
pub fn split(buf: &[u8]) -> Result<(u8, u16, &[u8]), DecodeError> {
    if buf.len() < HEADER {
        return Err(DecodeError::Short);
    }
    let mut r = Reader::new(buf);
    let size = r.u32()?;
    if usize::try_from(size).ok() != Some(buf.len()) {
        return Err(DecodeError::Size {
            declared: size,
            actual: buf.len(),
        });
    }
    let t = r.u8()?;
    let tag = r.u16()?;
    Ok((t, tag, &buf[HEADER..]))
}
