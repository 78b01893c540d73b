//! Bounds-checked big-endian reads: every read of packet data goes through here.

/// A packet or header was shorter than its format needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Short {
    /// What was being read.
    pub what: &'static str,
    /// Bytes it needs.
    pub need: usize,
    /// Bytes there were.
    pub have: usize,
}

/// A cursor over a byte slice whose reads fail instead of panicking.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    /// The next `n` bytes, named `what` in the error.
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Short> {
        let rest = self.rest();
        match rest.get(..n) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(Short {
                what,
                need: n,
                have: rest.len(),
            }),
        }
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Short> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, Short> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, Short> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u24(&mut self, what: &'static str) -> Result<u32, Short> {
        let [a, b, c] = self.array(what)?;
        Ok(u32::from_be_bytes([0, a, b, c]))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, Short> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, Short> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }
}

/// Lower-case hex of `b`, for private data and payload prefixes.
pub fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 15)]));
    }
    s
}

/// Serialises bytes as lower-case hex (for `--json`): `#[serde(serialize_with = ...)]`.
pub(crate) fn ser_hex<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fail_past_the_end_without_moving() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16("a"), Ok(0x0102));
        assert_eq!(
            r.u16("b"),
            Err(Short {
                what: "b",
                need: 2,
                have: 1
            })
        );
        assert_eq!(r.u8("c"), Ok(3));
        assert_eq!(r.rest(), &[] as &[u8]);
        assert_eq!(Reader::new(&[0xab, 0xcd, 0xef]).u24("x"), Ok(0xabcdef));
        assert_eq!(hex(&[0x0f, 0xa0]), "0fa0");
    }
}
