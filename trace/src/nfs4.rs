//! NFSv4 COMPOUND calls (RFC 7530, 8881, 7862): the operations a call asks for, by name.
//!
//! A COMPOUND's arguments are a tag, the minor version and an array of operations, each an
//! operation number followed by its arguments, whose length depends on the operation: listing
//! the second operation needs the first one's arguments decoded. The operations NFS clients
//! send most (sessions, file handles, attributes, OPEN, READ, WRITE, COMMIT, directories) are
//! sized here; the list stops at the first operation that is not, and says how many followed.
//! A WRITE's data that moved in a read chunk is not in the inline part: the read chunk's XDR
//! position says where it was taken out.

use serde::Serialize;

use crate::bytes::{Reader, Short};

/// NFSv4 operation names by number (3-75; 10044 is OP_ILLEGAL).
pub fn op_name(op: u32) -> &'static str {
    const NAMES: [&str; 73] = [
        "ACCESS",
        "CLOSE",
        "COMMIT",
        "CREATE",
        "DELEGPURGE",
        "DELEGRETURN",
        "GETATTR",
        "GETFH",
        "LINK",
        "LOCK",
        "LOCKT",
        "LOCKU",
        "LOOKUP",
        "LOOKUPP",
        "NVERIFY",
        "OPEN",
        "OPENATTR",
        "OPEN_CONFIRM",
        "OPEN_DOWNGRADE",
        "PUTFH",
        "PUTPUBFH",
        "PUTROOTFH",
        "READ",
        "READDIR",
        "READLINK",
        "REMOVE",
        "RENAME",
        "RENEW",
        "RESTOREFH",
        "SAVEFH",
        "SECINFO",
        "SETATTR",
        "SETCLIENTID",
        "SETCLIENTID_CONFIRM",
        "VERIFY",
        "WRITE",
        "RELEASE_LOCKOWNER",
        "BACKCHANNEL_CTL",
        "BIND_CONN_TO_SESSION",
        "EXCHANGE_ID",
        "CREATE_SESSION",
        "DESTROY_SESSION",
        "FREE_STATEID",
        "GET_DIR_DELEGATION",
        "GETDEVICEINFO",
        "GETDEVICELIST",
        "LAYOUTCOMMIT",
        "LAYOUTGET",
        "LAYOUTRETURN",
        "SECINFO_NO_NAME",
        "SEQUENCE",
        "SET_SSV",
        "TEST_STATEID",
        "WANT_DELEGATION",
        "DESTROY_CLIENTID",
        "RECLAIM_COMPLETE",
        "ALLOCATE",
        "COPY",
        "COPY_NOTIFY",
        "DEALLOCATE",
        "IO_ADVISE",
        "LAYOUTERROR",
        "LAYOUTSTATS",
        "OFFLOAD_CANCEL",
        "OFFLOAD_STATUS",
        "READ_PLUS",
        "SEEK",
        "WRITE_SAME",
        "CLONE",
        "GETXATTR",
        "SETXATTR",
        "LISTXATTRS",
        "REMOVEXATTR",
    ];
    match op {
        10044 => "ILLEGAL",
        _ => op
            .checked_sub(3)
            .and_then(|i| NAMES.get(usize::try_from(i).ok()?))
            .copied()
            .unwrap_or("UNKNOWN"),
    }
}

/// The operations of a COMPOUND call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Compound {
    /// The minor version (0, 1, 2).
    pub minor: u32,
    /// Operation numbers, in order, as far as they could be followed.
    pub ops: Vec<u32>,
    /// How many operations the call holds (more than `ops` when one's arguments could not be
    /// sized).
    pub count: u32,
}

impl Compound {
    /// The operations' names, and `+N` when `N` more could not be listed.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.ops.iter().map(|&o| op_name(o).to_string()).collect();
        let rest = (self.count as usize).saturating_sub(self.ops.len());
        if rest > 0 {
            v.push(format!("+{rest}"));
        }
        v
    }
}

/// An XDR reader that knows where read chunks took data out of the stream.
struct Xdr<'a> {
    r: Reader<'a>,
    /// Offset of the reader's start in the RPC message.
    base: usize,
    chunks: &'a [u32],
}

impl Xdr<'_> {
    fn u32(&mut self) -> Result<u32, Short> {
        self.r.u32("NFSv4 argument")
    }

    fn skip(&mut self, n: usize) -> Result<(), Short> {
        self.r.take(n, "NFSv4 argument").map(|_| ())
    }

    /// A variable-length opaque or string: its length, then its bytes padded to four (absent
    /// when a read chunk took them out here).
    fn opaque(&mut self) -> Result<(), Short> {
        let len = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
        let at = self.base + self.r.pos();
        if self
            .chunks
            .iter()
            .any(|&p| usize::try_from(p).is_ok_and(|p| p == at))
        {
            return Ok(());
        }
        self.skip(
            len.checked_add(3).ok_or(Short {
                what: "NFSv4 opaque",
                need: usize::MAX,
                have: 0,
            })? & !3,
        )
    }

    fn bitmap(&mut self) -> Result<(), Short> {
        let n = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
        self.skip(n.saturating_mul(4))
    }

    /// fattr4: a bitmap and the attribute values as an opaque.
    fn fattr(&mut self) -> Result<(), Short> {
        self.bitmap()?;
        self.opaque()
    }

    /// The arguments of operation `op`; `Ok(false)` when this decoder cannot size them.
    fn args(&mut self, op: u32) -> Result<bool, Short> {
        const STATEID: usize = 16;
        match op {
            // No arguments: GETFH, LOOKUPP, PUTPUBFH, PUTROOTFH, READLINK, RESTOREFH, SAVEFH.
            10 | 16 | 23 | 24 | 27 | 31 | 32 => {}
            // One word: ACCESS, SECINFO_NO_NAME, RECLAIM_COMPLETE.
            3 | 52 | 58 => self.skip(4)?,
            4 => self.skip(4 + STATEID)?,        // CLOSE
            5 => self.skip(12)?,                 // COMMIT
            8 | 45 => self.skip(STATEID)?,       // DELEGRETURN, FREE_STATEID
            9 => self.bitmap()?,                 // GETATTR
            11 | 15 | 28 | 33 => self.opaque()?, // LINK, LOOKUP, REMOVE, SECINFO
            72 | 75 => self.opaque()?,           // GETXATTR, REMOVEXATTR
            17 | 37 => self.fattr()?,            // NVERIFY, VERIFY
            20 => self.skip(STATEID + 4)?,       // OPEN_CONFIRM
            21 => self.skip(STATEID + 12)?,      // OPEN_DOWNGRADE
            22 => self.opaque()?,                // PUTFH
            25 | 68 => self.skip(STATEID + 12)?, // READ, READ_PLUS
            26 => {
                // READDIR: cookie, verifier, dircount, maxcount, attributes.
                self.skip(24)?;
                self.bitmap()?;
            }
            29 => {
                self.opaque()?; // RENAME
                self.opaque()?;
            }
            30 | 57 => self.skip(8)?, // RENEW, DESTROY_CLIENTID
            34 => {
                self.skip(STATEID)?; // SETATTR
                self.fattr()?;
            }
            38 => {
                self.skip(STATEID + 12)?; // WRITE: stateid, offset, stable, data
                self.opaque()?;
            }
            41 => self.skip(24)?, // BIND_CONN_TO_SESSION
            44 => self.skip(16)?, // DESTROY_SESSION
            53 => self.skip(32)?, // SEQUENCE
            55 => {
                let n = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
                self.skip(n.saturating_mul(STATEID))?; // TEST_STATEID
            }
            59 | 62 => self.skip(STATEID + 16)?, // ALLOCATE, DEALLOCATE
            69 => self.skip(STATEID + 12)?,      // SEEK
            74 => self.skip(12)?,                // LISTXATTRS
            6 => {
                // CREATE: type (a link carries its target, devices two numbers), name, attrs.
                match self.u32()? {
                    5 => self.opaque()?,
                    3 | 4 => self.skip(8)?,
                    _ => {}
                }
                self.opaque()?;
                self.fattr()?;
            }
            18 => return self.open(),
            42 => return self.exchange_id(),
            43 => return self.create_session(),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn open(&mut self) -> Result<bool, Short> {
        // seqid, share_access, share_deny, owner (clientid, opaque).
        self.skip(20)?;
        self.opaque()?;
        if self.u32()? == 1 {
            // OPEN4_CREATE: how.
            match self.u32()? {
                0 | 1 => self.fattr()?,
                2 => self.skip(8)?,
                3 => {
                    self.skip(8)?;
                    self.fattr()?;
                }
                _ => return Ok(false),
            }
        }
        match self.u32()? {
            0 | 3 => self.opaque()?,
            1 => self.skip(4)?,
            2 => {
                self.skip(16)?;
                self.opaque()?;
            }
            5 => self.skip(16)?,
            4 | 6 => {}
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn exchange_id(&mut self) -> Result<bool, Short> {
        // Client owner (verifier, opaque), flags.
        self.skip(8)?;
        self.opaque()?;
        self.skip(4)?;
        match self.u32()? {
            0 => {}
            1 => {
                self.bitmap()?;
                self.bitmap()?;
            }
            _ => return Ok(false),
        }
        // client_impl_id<1>: domain, name, date (seconds, nanoseconds).
        for _ in 0..self.u32()?.min(1) {
            self.opaque()?;
            self.opaque()?;
            self.skip(12)?;
        }
        Ok(true)
    }

    fn create_session(&mut self) -> Result<bool, Short> {
        // clientid, sequence, flags; fore and back channel attributes (six words and an
        // optional RDMA IRD); callback program.
        self.skip(16)?;
        for _ in 0..2 {
            self.skip(24)?;
            let n = self.u32()?.min(1);
            self.skip(4 * n as usize)?;
        }
        self.skip(4)?;
        for _ in 0..self.u32()? {
            match self.u32()? {
                0 => {}
                1 => {
                    // AUTH_SYS: stamp, machine name, uid, gid, gids.
                    self.skip(4)?;
                    self.opaque()?;
                    self.skip(8)?;
                    let n = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
                    self.skip(n.saturating_mul(4))?;
                }
                6 => {
                    self.skip(4)?;
                    self.opaque()?;
                    self.opaque()?;
                }
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// Lists the operations of a COMPOUND call whose arguments start at `at` in the RPC message
/// `msg` (its inline part); `chunks` are the XDR positions of its read chunks.
pub fn compound(msg: &[u8], at: usize, chunks: &[u32]) -> Result<Compound, Short> {
    let mut x = Xdr {
        r: Reader::new(msg.get(at..).unwrap_or(&[])),
        base: at,
        chunks,
    };
    x.opaque()?; // tag
    let minor = x.u32()?;
    let count = x.u32()?;
    let mut c = Compound {
        minor,
        ops: Vec::new(),
        count,
    };
    for _ in 0..count {
        let op = x.u32()?;
        c.ops.push(op);
        if !x.args(op)? {
            break;
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    #[test]
    fn a_write_compound_with_its_data_in_a_read_chunk() {
        // tag "t", minor 1, 4 ops: SEQUENCE, PUTFH (8-byte handle), WRITE (data moved out at
        // its position), GETATTR (2-word bitmap).
        let mut m = words(&[1]);
        m.extend_from_slice(b"t\0\0\0");
        m.extend(words(&[1, 4, 53]));
        m.extend([0u8; 32]);
        m.extend(words(&[22, 8]));
        m.extend([7u8; 8]);
        m.extend(words(&[38]));
        m.extend([0u8; 16 + 12]);
        m.extend(words(&[4096]));
        let pos = m.len() as u32;
        m.extend(words(&[9, 2, 0x10, 0x20]));
        let c = compound(&m, 0, &[pos]).unwrap();
        assert_eq!(c.names(), ["SEQUENCE", "PUTFH", "WRITE", "GETATTR"]);
        assert_eq!(c.minor, 1);
        // Without the chunk, the WRITE's 4096 bytes would be inline: the stream is short.
        assert!(compound(&m, 0, &[]).is_err());
        // An operation this decoder cannot size ends the list.
        let mut l = words(&[0, 0, 3, 24, 12]);
        l.extend([0u8; 40]);
        let c = compound(&l, 0, &[]).unwrap();
        assert_eq!(c.names(), ["PUTROOTFH", "LOCK", "+1"]);
        assert_eq!(
            (op_name(3), op_name(75), op_name(10044), op_name(2)),
            ("ACCESS", "REMOVEXATTR", "ILLEGAL", "UNKNOWN")
        );
    }
}
