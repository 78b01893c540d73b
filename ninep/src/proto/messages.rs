//! The message table: [`Tmsg`] and [`Rmsg`], each message listed once with
//! its fields in wire order (each naming its codec in `field.rs`) and its
//! type number, and [`messages!`] generating the enum, decoder and encoder
//! from that list; [`Request`] and [`Rmsg::decode`] put them behind the
//! header's checks, and [`DirEntry`] is `Rreaddir`'s data.

use super::wire::{split, Reader, Writer};
use super::{field, ty, Attr, DecodeError, Flock, Qid, SetAttr, StatFs};

/// Defines a message enum, its decoder, encoder and type numbers from one
/// list: each message's name, its fields in wire order (each with its codec,
/// a module of [`field`]; a reply may have one unnamed field, or none), and
/// its type number.
macro_rules! messages {
    (
        $(#[$doc:meta])*
        enum $enum:ident; decode $decode:ident; encode $encode:ident; ty $tyof:ident;
        $(
            $name:ident
            $( { $( $f:ident : $t:ty = $codec:ident ),* $(,)? } )?
            $( ( $tf:ident : $tt:ty = $tcodec:ident ) )?
            = $ty:expr;
        )*
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum $enum<'a> {
            $( $name $( { $( $f: $t ),* } )? $( ($tt) )?, )*
        }

        fn $tyof(m: &$enum<'_>) -> u8 {
            match m {
                $( $enum::$name { .. } => $ty, )*
            }
        }

        fn $decode(t: u8, body: &[u8]) -> Result<$enum<'_>, DecodeError> {
            let r = &mut Reader::new(body);
            let m = match t {
                $( x if x == $ty => $enum::$name
                    $( { $( $f: field::$codec::get(r)? ),* } )?
                    $( (field::$tcodec::get(r)?) )?, )*
                other => return Err(DecodeError::UnknownType(other)),
            };
            r.finish()?;
            Ok(m)
        }

        fn $encode(tag: u16, m: &$enum<'_>, out: &mut Vec<u8>) -> usize {
            let mut w = Writer::new(out, $tyof(m), tag);
            match m {
                $( $enum::$name $( { $( $f ),* } )? $( ($tf) )? => {
                    $( $( field::$codec::put($f, &mut w); )* )?
                    $( field::$tcodec::put($tf, &mut w); )?
                } )*
            }
            w.finish()
        }
    };
}

messages! {
    /// A request (T-message) body.
    enum Tmsg; decode decode_t; encode encode_t; ty type_t;
    Version { msize: u32 = int, version: &'a [u8] = string } = ty::TVERSION;
    Auth {
        afid: u32 = int, uname: &'a [u8] = string, aname: &'a [u8] = string, n_uname: u32 = int
    } = ty::TAUTH;
    Attach {
        fid: u32 = int, afid: u32 = int, uname: &'a [u8] = string, aname: &'a [u8] = string,
        n_uname: u32 = int,
    } = ty::TATTACH;
    Flush { oldtag: u16 = short } = ty::TFLUSH;
    Walk { fid: u32 = int, newfid: u32 = int, names: Vec<&'a [u8]> = names } = ty::TWALK;
    Read { fid: u32 = int, offset: u64 = long, count: u32 = int } = ty::TREAD;
    Write { fid: u32 = int, offset: u64 = long, data: &'a [u8] = data } = ty::TWRITE;
    Clunk { fid: u32 = int } = ty::TCLUNK;
    Remove { fid: u32 = int } = ty::TREMOVE;
    Statfs { fid: u32 = int } = ty::TSTATFS;
    Lopen { fid: u32 = int, flags: u32 = int } = ty::TLOPEN;
    Lcreate {
        fid: u32 = int, name: &'a [u8] = string, flags: u32 = int, mode: u32 = int, gid: u32 = int
    } = ty::TLCREATE;
    Symlink {
        fid: u32 = int, name: &'a [u8] = string, target: &'a [u8] = string, gid: u32 = int
    } = ty::TSYMLINK;
    Mknod {
        dfid: u32 = int, name: &'a [u8] = string, mode: u32 = int, major: u32 = int,
        minor: u32 = int, gid: u32 = int,
    } = ty::TMKNOD;
    Rename { fid: u32 = int, dfid: u32 = int, name: &'a [u8] = string } = ty::TRENAME;
    Readlink { fid: u32 = int } = ty::TREADLINK;
    Getattr { fid: u32 = int, mask: u64 = long } = ty::TGETATTR;
    Setattr { fid: u32 = int, attr: SetAttr = setattr } = ty::TSETATTR;
    Xattrwalk { fid: u32 = int, newfid: u32 = int, name: &'a [u8] = string } = ty::TXATTRWALK;
    Xattrcreate {
        fid: u32 = int, name: &'a [u8] = string, size: u64 = long, flags: u32 = int
    } = ty::TXATTRCREATE;
    Readdir { fid: u32 = int, offset: u64 = long, count: u32 = int } = ty::TREADDIR;
    Fsync { fid: u32 = int, datasync: u32 = opt_int } = ty::TFSYNC;
    Lock { fid: u32 = int, lock: Flock<'a> = lock } = ty::TLOCK;
    Getlock { fid: u32 = int, lock: Flock<'a> = getlock } = ty::TGETLOCK;
    Link { dfid: u32 = int, fid: u32 = int, name: &'a [u8] = string } = ty::TLINK;
    Mkdir { dfid: u32 = int, name: &'a [u8] = string, mode: u32 = int, gid: u32 = int } = ty::TMKDIR;
    Renameat {
        olddirfid: u32 = int, oldname: &'a [u8] = string, newdirfid: u32 = int,
        newname: &'a [u8] = string,
    } = ty::TRENAMEAT;
    Unlinkat { dfid: u32 = int, name: &'a [u8] = string, flags: u32 = int } = ty::TUNLINKAT;
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// Its tag, echoed by the reply.
    pub tag: u16,
    /// What it asks.
    pub msg: Tmsg<'a>,
}

/// Why a request could not be decoded, with its tag when the header was
/// sound (then the server answers `Rlerror`; otherwise it closes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    /// The tag, when the header was sound.
    pub tag: Option<u16>,
    /// What was wrong.
    pub error: DecodeError,
}

impl<'a> Request<'a> {
    /// Decodes one whole message.
    ///
    /// # Errors
    /// [`BadRequest`] for anything that is not a well-formed request.
    pub fn decode(buf: &'a [u8]) -> Result<Request<'a>, BadRequest> {
        let (t, tag, body) = split(buf).map_err(|error| BadRequest { tag: None, error })?;
        let msg = decode_t(t, body).map_err(|error| BadRequest {
            tag: Some(tag),
            error,
        })?;
        Ok(Request { tag, msg })
    }

    /// Encodes the request at the end of `out`; returns its length.
    pub fn encode(&self, out: &mut Vec<u8>) -> usize {
        encode_t(self.tag, &self.msg, out)
    }
}

messages! {
    /// A reply (R-message) body. `Read` and `Readdir` carry their data, which
    /// `Readdir` holds already encoded (see [`DirEntry::encode`]).
    enum Rmsg; decode decode_r; encode encode_r; ty type_r;
    Lerror { ecode: u32 = int } = ty::RLERROR;
    Version { msize: u32 = int, version: &'a [u8] = string } = ty::TVERSION + 1;
    Attach { qid: Qid = qid } = ty::TATTACH + 1;
    Flush = ty::TFLUSH + 1;
    Walk { qids: Vec<Qid> = qids } = ty::TWALK + 1;
    Read { data: &'a [u8] = data } = ty::TREAD + 1;
    Write { count: u32 = int } = ty::TWRITE + 1;
    Clunk = ty::TCLUNK + 1;
    Remove = ty::TREMOVE + 1;
    Statfs(s: StatFs = statfs) = ty::TSTATFS + 1;
    Lopen { qid: Qid = qid, iounit: u32 = int } = ty::TLOPEN + 1;
    Lcreate { qid: Qid = qid, iounit: u32 = int } = ty::TLCREATE + 1;
    Symlink { qid: Qid = qid } = ty::TSYMLINK + 1;
    Mknod { qid: Qid = qid } = ty::TMKNOD + 1;
    Rename = ty::TRENAME + 1;
    Readlink { target: &'a [u8] = string } = ty::TREADLINK + 1;
    Getattr(a: Box<Attr> = attr) = ty::TGETATTR + 1;
    Setattr = ty::TSETATTR + 1;
    Readdir { data: &'a [u8] = data } = ty::TREADDIR + 1;
    Fsync = ty::TFSYNC + 1;
    Lock { status: u8 = byte } = ty::TLOCK + 1;
    Getlock { lock: Flock<'a> = getlock } = ty::TGETLOCK + 1;
    Link = ty::TLINK + 1;
    Mkdir { qid: Qid = qid } = ty::TMKDIR + 1;
    Renameat = ty::TRENAMEAT + 1;
    Unlinkat = ty::TUNLINKAT + 1;
}

impl Rmsg<'_> {
    /// The message type.
    pub fn ty(&self) -> u8 {
        type_r(self)
    }

    /// Encodes the reply with `tag` at the end of `out`; returns its length.
    pub fn encode(&self, tag: u16, out: &mut Vec<u8>) -> usize {
        encode_r(tag, self, out)
    }

    /// Decodes a reply; returns its tag too.
    ///
    /// # Errors
    /// [`DecodeError`] for anything that is not a well-formed reply.
    pub fn decode(buf: &[u8]) -> Result<(u16, Rmsg<'_>), DecodeError> {
        let (t, tag, body) = split(buf)?;
        Ok((tag, decode_r(t, body)?))
    }
}

/// One entry of `Rreaddir`'s data: `qid[13] offset[8] type[1] name[s]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// The entry's qid.
    pub qid: Qid,
    /// The offset to resume after this entry.
    pub offset: u64,
    /// `d_type` (`DT_DIR` ...).
    pub ty: u8,
    /// Its name.
    pub name: &'a [u8],
}

impl<'a> DirEntry<'a> {
    /// Its encoded length.
    pub fn len(&self) -> usize {
        13 + 8 + 1 + 2 + self.name.len()
    }
    /// Never empty (kept for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Appends the entry to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let q = &self.qid;
        out.push(q.ty);
        out.extend_from_slice(&q.version.to_le_bytes());
        out.extend_from_slice(&q.path.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.push(self.ty);
        let name = &self.name[..self.name.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
    }
    /// Decodes every entry of `Rreaddir`'s data.
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] when an entry runs past the end.
    pub fn decode_all(data: &'a [u8]) -> Result<Vec<DirEntry<'a>>, DecodeError> {
        let r = &mut Reader::new(data);
        let mut v = Vec::new();
        while r.remaining() > 0 {
            v.push(DirEntry {
                qid: r.qid()?,
                offset: r.u64()?,
                ty: r.u8()?,
                name: r.str()?,
            });
        }
        Ok(v)
    }
}
