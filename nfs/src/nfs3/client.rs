//! The NFSv3 client ([`Client`]): mounting, the procedures, and the
//! whole-file reads and writes with several calls in flight.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use super::read_ahead::read_in_order;
use super::{
    fattr, fh, post_op_attr, proc_, wcc_data, DirEntry, Fattr, Fh, NfsError, Options, ReadData,
    ReadRepr, Result, MAX_NAME, NFS_V3,
};
use crate::mount::{self, NFS_PROG};
use crate::rpc::{decode_reply, encode_call, Auth};
use crate::transport::{Call, Destination, Payload, Reply, Transport};
use crate::xdr::{DecodeError, Reader, Writer};

/// The most bytes [`Client::read_all`] sizes its result for at once from the
/// size the server states (a larger file is read on after it, a READ at a
/// time).
const READ_ALL_AT_ONCE: u64 = 1 << 30;

/// Copies a READ's data to its destination.
fn place(to: &Destination, data: &[u8]) -> Result<()> {
    if to.fill(data) {
        Ok(())
    } else {
        Err(NfsError::Invalid(format!(
            "READ: {} bytes do not fit the destination {to:?}",
            data.len()
        )))
    }
}

fn name_ok(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains(&b'/') || name.contains(&0) {
        return Err(NfsError::Invalid(format!(
            "bad file name {:?}: 1 to {MAX_NAME} bytes, no '/' or NUL",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// An NFSv3 client on one RPC-over-RDMA connection. Clones share it (and
/// may call concurrently).
#[derive(Debug, Clone)]
pub struct Client {
    t: Transport,
    auth: Auth,
    root: Fh,
    rsize: u32,
    wsize: u32,
    window: usize,
    max_dir_entries: usize,
    max_read_all: u64,
}

impl Client {
    /// Gets the root handle of `export` from the server's mountd (TCP),
    /// connects over RDMA and asks the server's transfer sizes (FSINFO).
    ///
    /// # Errors
    /// [`NfsError::Mount`], or the transport's failure to connect.
    pub async fn mount(server: IpAddr, export: &str, o: Options) -> Result<Client> {
        let auth = o.auth.clone().unwrap_or_else(Auth::sys_for_process);
        let root = mount::mount(server, export, &auth, o.transport.connect_timeout)
            .await
            .map_err(NfsError::Mount)?;
        Client::connect(SocketAddr::new(server, o.port), Fh(root), o).await
    }

    /// Connects with a root handle already known.
    ///
    /// # Errors
    /// The transport's failure to connect; FSINFO's failure.
    pub async fn connect(addr: SocketAddr, root: Fh, o: Options) -> Result<Client> {
        let auth = o.auth.clone().unwrap_or_else(Auth::sys_for_process);
        let t = Transport::connect(addr, o.transport.clone()).await?;
        let mut c = Client {
            t,
            auth,
            root,
            rsize: o.io_size.max(4096),
            wsize: o.io_size.max(4096),
            window: o.window.max(1),
            max_dir_entries: o.max_dir_entries,
            max_read_all: o.max_read_all,
        };
        let (rtmax, wtmax) = c.fsinfo().await?;
        c.rsize = c.rsize.min(rtmax).max(4096);
        c.wsize = c.wsize.min(wtmax).max(4096);
        Ok(c)
    }

    /// The root handle.
    pub fn root(&self) -> &Fh {
        &self.root
    }

    /// The transport.
    pub fn transport(&self) -> &Transport {
        &self.t
    }

    /// The READ and WRITE sizes in use.
    pub fn io_sizes(&self) -> (u32, u32) {
        (self.rsize, self.wsize)
    }

    /// The largest WRITE payload to `f` that goes inline (one more byte
    /// goes through a read chunk): the negotiated inline send size less
    /// the transport header and the WRITE call up to its data, rounded down
    /// to XDR's 4 bytes.
    pub fn max_inline_write(&self, f: &Fh) -> usize {
        let mut w = self.header(proc_::WRITE);
        w.opaque(&f.0).u64(0).u32(0).u32(2).u32(0);
        let room = self
            .t
            .negotiated()
            .inline_send
            .saturating_sub(crate::rpcrdma::MIN_HEADER + w.len());
        room & !3
    }

    /// Closes the connection once every call handed over has finished.
    pub async fn close(self) {
        self.t.close().await
    }

    fn header(&self, p: u32) -> Writer {
        let mut w = Writer::new();
        encode_call(&mut w, 0, NFS_PROG, NFS_V3, p, &self.auth);
        w
    }

    async fn call(&self, call: Call) -> Result<Reply> {
        Ok(self.t.call(call).await?)
    }

    /// A call with small arguments and a small reply.
    async fn simple(&self, w: Writer) -> Result<Reply> {
        self.call(Call {
            msg: w.buf,
            max_reply: 1024,
            ..Call::default()
        })
        .await
    }

    /// The results of a reply, with its status checked (what a failed
    /// reply carries after its status is not needed).
    fn results<'a>(op: &'static str, reply: &'a Reply) -> Result<Reader<'a>> {
        let (_, mut r) = decode_reply(&reply.msg).map_err(NfsError::Rpc)?;
        let status = r.u32("nfsstat3").map_err(|e| NfsError::Decode(op, e))?;
        if status != 0 {
            return Err(NfsError::Status { op, status });
        }
        Ok(r)
    }

    /// NULL.
    ///
    /// # Errors
    /// The transport's or the RPC layer's.
    pub async fn null(&self) -> Result<()> {
        let reply = self.simple(self.header(proc_::NULL)).await?;
        decode_reply(&reply.msg).map_err(NfsError::Rpc)?;
        Ok(())
    }

    /// FSINFO of the root: the largest READ and WRITE.
    ///
    /// # Errors
    /// As [`Client::null`], and a failed status.
    pub async fn fsinfo(&self) -> Result<(u32, u32)> {
        let mut w = self.header(proc_::FSINFO);
        w.opaque(&self.root.0);
        let reply = self.simple(w).await?;
        let mut r = Self::results("FSINFO", &reply)?;
        let d = |e| NfsError::Decode("FSINFO", e);
        post_op_attr(&mut r).map_err(d)?;
        let rtmax = r.u32("rtmax").map_err(d)?;
        let _rtpref = r.u32("rtpref").map_err(d)?;
        let _rtmult = r.u32("rtmult").map_err(d)?;
        let wtmax = r.u32("wtmax").map_err(d)?;
        Ok((rtmax, wtmax))
    }

    /// GETATTR.
    ///
    /// # Errors
    /// As [`Client::fsinfo`].
    pub async fn getattr(&self, f: &Fh) -> Result<Fattr> {
        let mut w = self.header(proc_::GETATTR);
        w.opaque(&f.0);
        let reply = self.simple(w).await?;
        let mut r = Self::results("GETATTR", &reply)?;
        fattr(&mut r).map_err(|e| NfsError::Decode("GETATTR", e))
    }

    /// LOOKUP of `name` in `dir`.
    ///
    /// # Errors
    /// As [`Client::fsinfo`]; [`NfsError::Invalid`] for a bad name.
    pub async fn lookup(&self, dir: &Fh, name: &[u8]) -> Result<(Fh, Option<Fattr>)> {
        name_ok(name)?;
        let mut w = self.header(proc_::LOOKUP);
        w.opaque(&dir.0).opaque(name);
        let reply = self.simple(w).await?;
        let mut r = Self::results("LOOKUP", &reply)?;
        let d = |e| NfsError::Decode("LOOKUP", e);
        let f = fh(&mut r).map_err(d)?;
        let a = post_op_attr(&mut r).map_err(d)?;
        Ok((f, a))
    }

    /// LOOKUP of each component of `path` (relative to the root; empty
    /// components and `.` are skipped).
    ///
    /// # Errors
    /// As [`Client::lookup`].
    pub async fn lookup_path(&self, path: &str) -> Result<Fh> {
        let mut f = self.root.clone();
        for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            f = self.lookup(&f, c.as_bytes()).await?.0;
        }
        Ok(f)
    }

    /// READ of up to `count` bytes at `offset`: the data and whether it
    /// reached the end of the file.
    ///
    /// # Errors
    /// As [`Client::fsinfo`]; [`NfsError::Decode`] when the data the
    /// server says it sent is not there.
    pub async fn read(&self, f: &Fh, offset: u64, count: u32) -> Result<(Vec<u8>, bool)> {
        let (data, _, eof) = self.read_to(f, offset, count, None, false).await?;
        Ok((data.map(ReadData::into_vec).unwrap_or_default(), eof))
    }

    /// READ of up to `count` bytes at `offset`, as [`Client::read`], its
    /// data not copied when it comes in a write chunk: the chunk's memory is
    /// lent ([`ReadData::is_lent`]) once no peer can reach it (see
    /// [`LentData`]; where that is not proven, it is copied as by
    /// `read`). Inline data is its own bytes.
    ///
    /// Hold the data only as long as needed: while it is held, the
    /// connection registers other memory for later calls.
    ///
    /// # Errors
    /// As [`Client::read`].
    ///
    /// [`LentData`]: crate::transport::LentData
    pub async fn read_lent(&self, f: &Fh, offset: u64, count: u32) -> Result<(ReadData, bool)> {
        let (data, _, eof) = self.read_to(f, offset, count, None, true).await?;
        Ok((data.unwrap_or(ReadData(ReadRepr::Owned(Vec::new()))), eof))
    }

    /// READ of up to `count` bytes at `offset` into `into`: how many bytes
    /// it placed there (from its start) and whether it reached the end of
    /// the file. Data that comes in a write chunk is copied once, by the
    /// transport, from the chunk memory to `into`; inline data is copied
    /// from the reply.
    ///
    /// # Errors
    /// As [`Client::read`]; [`NfsError::Invalid`] when `into` has less
    /// room than the data, or its buffer stays locked by someone else.
    pub async fn read_into(
        &self,
        f: &Fh,
        offset: u64,
        count: u32,
        into: &Destination,
    ) -> Result<(usize, bool)> {
        let (_, len, eof) = self.read_to(f, offset, count, Some(into), false).await?;
        Ok((len, eof))
    }

    /// READ: the data (`None` when it was placed in `into`), its length and
    /// the end-of-file flag.
    async fn read_to(
        &self,
        f: &Fh,
        offset: u64,
        count: u32,
        into: Option<&Destination>,
        lend: bool,
    ) -> Result<(Option<ReadData>, usize, bool)> {
        let mut w = self.header(proc_::READ);
        w.opaque(&f.0).u64(offset).u32(count);
        let inline = count as usize + 512 <= self.t.negotiated().inline_recv;
        let reply = self
            .call(Call {
                msg: w.buf,
                write_chunk: if inline { 0 } else { count as usize },
                max_reply: 1024,
                data_into: if inline { None } else { into.cloned() },
                lend_data: lend && into.is_none() && !inline,
                ..Call::default()
            })
            .await?;
        let mut r = Self::results("READ", &reply)?;
        let d = |e| NfsError::Decode("READ", e);
        post_op_attr(&mut r).map_err(d)?;
        let n = r.u32("READ3resok.count").map_err(d)?;
        let eof = r.bool("READ3resok.eof").map_err(d)?;
        let at = r.pos();
        let len = r.u32("READ3resok.data").map_err(d)? as usize;
        if len > count as usize || len != n as usize {
            return Err(NfsError::Decode(
                "READ",
                r.error(
                    "READ3resok.data",
                    crate::xdr::DecodeErrorKind::TooLong {
                        len: len as u64,
                        max: u64::from(n.min(count)),
                    },
                ),
            ));
        }
        let inline_data = r.remaining() > 0 || len == 0;
        let end_pos = r.pos();
        let truncated = |have: usize| {
            NfsError::Decode(
                "READ",
                DecodeError {
                    what: "READ3resok.data (write chunk)",
                    at: end_pos,
                    kind: crate::xdr::DecodeErrorKind::Truncated { need: len, have },
                },
            )
        };
        let data = if inline_data {
            // Inline.
            let mut r2 = Reader::new(&reply.msg[at..]);
            r2.opaque("READ3resok.data", count as usize).map_err(d)?
        } else {
            match (reply.placed, reply.data, reply.lent) {
                // Lent in place (the server may have written more than the
                // XDR length says: only `len` bytes count).
                (_, _, Some(mut data)) if data.len() >= len => {
                    data.truncate(len);
                    return Ok((Some(ReadData(ReadRepr::Lent(data))), len, eof));
                }
                (_, _, Some(data)) => return Err(truncated(data.len())),
                // In `into` already.
                (Some(p), _, None) if p >= len => return Ok((None, len, eof)),
                (Some(p), _, None) => return Err(truncated(p)),
                (None, Some(mut data), None) if data.len() >= len => {
                    data.truncate(len);
                    match into {
                        Some(to) => return place(to, &data).map(|()| (None, len, eof)),
                        None => return Ok((Some(ReadData(ReadRepr::Owned(data))), len, eof)),
                    }
                }
                (None, other, None) => return Err(truncated(other.map_or(0, |d| d.len()))),
            }
        };
        match into {
            Some(to) => place(to, data).map(|()| (None, len, eof)),
            None => Ok((Some(ReadData(ReadRepr::Owned(data.to_vec()))), len, eof)),
        }
    }

    /// WRITE of `data` at `offset`, `FILE_SYNC`: how many bytes the server
    /// wrote.
    ///
    /// # Errors
    /// As [`Client::fsinfo`].
    pub async fn write(&self, f: &Fh, offset: u64, data: Vec<u8>) -> Result<u32> {
        self.write_payload(f, offset, data.into()).await
    }

    /// WRITE of a payload (bytes of its own or a shared range), as
    /// [`Client::write`].
    ///
    /// # Errors
    /// As [`Client::fsinfo`].
    pub async fn write_payload(&self, f: &Fh, offset: u64, data: Payload) -> Result<u32> {
        let mut w = self.header(proc_::WRITE);
        let len = u32::try_from(data.len())
            .map_err(|_| NfsError::Invalid("a WRITE of more than 4 GiB".into()))?;
        w.opaque(&f.0).u64(offset).u32(len).u32(2).u32(len);
        let reply = self
            .call(Call {
                msg: w.buf,
                payload: data,
                max_reply: 1024,
                ..Call::default()
            })
            .await?;
        let mut r = Self::results("WRITE", &reply)?;
        let d = |e| NfsError::Decode("WRITE", e);
        wcc_data(&mut r).map_err(d)?;
        r.u32("WRITE3resok.count").map_err(d)
    }

    /// CREATE (UNCHECKED) of `name` in `dir` with `mode`, truncated to 0
    /// bytes if it exists.
    ///
    /// # Errors
    /// As [`Client::lookup`].
    pub async fn create(&self, dir: &Fh, name: &[u8], mode: u32) -> Result<Fh> {
        name_ok(name)?;
        let mut w = self.header(proc_::CREATE);
        w.opaque(&dir.0).opaque(name).u32(0);
        // sattr3: mode, no uid or gid, size 0, times unchanged.
        w.bool(true).u32(mode).bool(false).bool(false);
        w.bool(true).u64(0).u32(0).u32(0);
        let reply = self.simple(w).await?;
        let mut r = Self::results("CREATE", &reply)?;
        let d = |e| NfsError::Decode("CREATE", e);
        if r.bool("post_op_fh3").map_err(d)? {
            return fh(&mut r).map_err(d);
        }
        // No handle in the reply: look it up.
        Ok(self.lookup(dir, name).await?.0)
    }

    /// REMOVE of `name` in `dir`.
    ///
    /// # Errors
    /// As [`Client::lookup`].
    pub async fn remove(&self, dir: &Fh, name: &[u8]) -> Result<()> {
        name_ok(name)?;
        let mut w = self.header(proc_::REMOVE);
        w.opaque(&dir.0).opaque(name);
        let reply = self.simple(w).await?;
        Self::results("REMOVE", &reply).map(drop)
    }

    /// READDIR until the end: every entry (`.` and `..` included, as the
    /// server lists them).
    ///
    /// # Errors
    /// As [`Client::fsinfo`]; [`NfsError::Invalid`] when the server's
    /// listing does not end: a round whose cookie does not advance, or more
    /// than [`Options::max_dir_entries`] entries.
    pub async fn readdir(&self, dir: &Fh) -> Result<Vec<DirEntry>> {
        self.list(dir, false).await
    }

    /// READDIRPLUS until the end: every entry with its attributes and
    /// handle when the server sends them.
    ///
    /// # Errors
    /// As [`Client::readdir`].
    pub async fn readdirplus(&self, dir: &Fh) -> Result<Vec<DirEntry>> {
        self.list(dir, true).await
    }

    async fn list(&self, dir: &Fh, plus: bool) -> Result<Vec<DirEntry>> {
        let op = if plus { "READDIRPLUS" } else { "READDIR" };
        let count: u32 = 32 << 10;
        let mut out = Vec::new();
        let mut cookie = 0u64;
        let mut verf = [0u8; 8];
        loop {
            let mut w = self.header(if plus {
                proc_::READDIRPLUS
            } else {
                proc_::READDIR
            });
            w.opaque(&dir.0).u64(cookie).fixed(&verf).u32(count);
            if plus {
                w.u32(count);
            }
            let reply = self
                .call(Call {
                    msg: w.buf,
                    max_reply: count as usize + 1024,
                    ..Call::default()
                })
                .await?;
            let mut r = Self::results(op, &reply)?;
            let d = |e| NfsError::Decode(op, e);
            post_op_attr(&mut r).map_err(d)?;
            verf.copy_from_slice(r.fixed("cookieverf3", 8).map_err(d)?);
            let before = out.len();
            let asked = cookie;
            while r.bool("entry follows").map_err(d)? {
                if out.len() >= self.max_dir_entries {
                    return Err(NfsError::Invalid(format!(
                        "{op}: more than {} entries (Options::max_dir_entries)",
                        self.max_dir_entries
                    )));
                }
                let fileid = r.u64("entry.fileid").map_err(d)?;
                let name = r.opaque("entry.name", MAX_NAME).map_err(d)?.to_vec();
                cookie = r.u64("entry.cookie").map_err(d)?;
                let (attr, fh) = if plus {
                    let a = post_op_attr(&mut r).map_err(d)?;
                    let f = if r.bool("post_op_fh3").map_err(d)? {
                        Some(fh(&mut r).map_err(d)?)
                    } else {
                        None
                    };
                    (a, f)
                } else {
                    (None, None)
                };
                out.push(DirEntry {
                    fileid,
                    name,
                    attr,
                    fh,
                });
            }
            let eof = r.bool("dirlist.eof").map_err(d)?;
            if eof {
                return Ok(out);
            }
            if out.len() == before {
                return Err(NfsError::Invalid(format!(
                    "{op}: the server returned no entries and no end of directory"
                )));
            }
            // The next round starts after the last entry: a cookie that did
            // not move would have the server list the same entries again.
            if cookie == asked {
                return Err(NfsError::Invalid(format!(
                    "{op}: the server's cookie did not advance ({cookie:#x}) and the \
                     directory did not end"
                )));
            }
        }
    }

    /// The whole file from offset 0 to its end, piece by piece, in order,
    /// to `sink`, with up to the window's READs in flight: each piece is
    /// the READ's data where it lies ([`Client::read_lent`]: the write
    /// chunk's memory, lent, no copy), given back once `sink` returns. The
    /// bytes read (`Ok(Ok(n))`), or the first error of `sink`, which stops
    /// the reading (`Ok(Err(e))`).
    ///
    /// READs are sent ahead up to the size GETATTR states; a READ shorter
    /// than asked and not at the end of the file (a server may return less)
    /// is read on from where it ended, the READs already in flight after it
    /// awaited, their data and errors dropped; the end is the first READ that says so.
    ///
    /// # Errors
    /// As [`Client::read`].
    pub async fn read_each<E>(
        &self,
        f: &Fh,
        sink: impl FnMut(&[u8]) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<u64, E>> {
        let size = self.getattr(f).await?.size;
        let step = self.rsize.max(1);
        let read = |at| {
            let c = self.clone();
            let f = f.clone();
            async move { c.read_lent(&f, at, step).await }
        };
        read_in_order(size, step, self.window, read, sink).await
    }

    /// The whole file, with up to the window's READs in flight, each
    /// placed straight into the result ([`Client::read_into`]: one copy
    /// from chunk memory per byte), at most [`Options::max_read_all`] bytes.
    ///
    /// # Errors
    /// As [`Client::read`]; [`NfsError::Invalid`] for a file larger than
    /// [`Options::max_read_all`] (as GETATTR states it, or as read).
    pub async fn read_all(&self, f: &Fh) -> Result<Vec<u8>> {
        let size = self.getattr(f).await?.size;
        if size > self.max_read_all {
            return Err(NfsError::Invalid(format!(
                "READ: a file of {size} bytes, more than {} (Options::max_read_all)",
                self.max_read_all
            )));
        }
        let step = u64::from(self.rsize);
        // The size the server states is sized for at once (the zeroed
        // pages cost nothing until the data lands in them) up to a bound;
        // a larger file is read on in pieces after it.
        let first = size.min(READ_ALL_AT_ONCE);
        let buf = Arc::new(Mutex::new(vec![0u8; first as usize]));
        let mut q = VecDeque::new();
        let mut next = 0u64;
        // The bytes read from offset 0 on without a gap.
        let mut filled = 0u64;
        let mut short = false;
        let mut eof = false;
        while next < first || !q.is_empty() {
            while !short && next < first && q.len() < self.window {
                let c = self.clone();
                let f = f.clone();
                let n = step.min(first - next) as u32;
                let to = Destination::new(Arc::clone(&buf), next as usize);
                let at = next;
                q.push_back((
                    at,
                    n,
                    tokio::spawn(async move { c.read_into(&f, at, n, &to).await }),
                ));
                next += u64::from(n);
            }
            let Some((at, n, h)) = q.pop_front() else {
                break;
            };
            let done = h
                .await
                .map_err(|e| NfsError::Invalid(format!("READ task: {e}")))?;
            if short || at != filled {
                // After a short READ: the calls still in flight are
                // awaited (they fill `buf`), their data not counted, nor
                // their errors (past the end of a file that shrank).
                continue;
            }
            let (got, e) = done?;
            filled += got as u64;
            eof = e;
            if (got as u64) < u64::from(n) {
                // The file ended (or shrank) here: what follows is read on
                // from `filled`, below.
                short = true;
            }
        }
        let mut out = std::mem::take(&mut *buf.lock().unwrap_or_else(|p| p.into_inner()));
        out.truncate(filled as usize);
        // The file may be larger than stated, or have grown since GETATTR:
        // read on to the end.
        while !eof {
            if out.len() as u64 >= self.max_read_all {
                return Err(NfsError::Invalid(format!(
                    "READ: the file goes on past {} bytes (Options::max_read_all)",
                    self.max_read_all
                )));
            }
            let (data, e) = self.read(f, out.len() as u64, self.rsize).await?;
            out.extend_from_slice(&data);
            eof = e || data.is_empty();
        }
        Ok(out)
    }

    /// Writes `data` from offset 0, with up to the window's WRITEs in
    /// flight (each WRITE gets a copy of its piece; see
    /// [`Client::write_all_shared`] for none).
    ///
    /// # Errors
    /// As [`Client::write`]; [`NfsError::Invalid`] when the server writes
    /// less than asked.
    pub async fn write_all(&self, f: &Fh, data: &[u8]) -> Result<()> {
        self.write_pieces(f, data.len(), |r| Payload::from(data[r].to_vec()))
            .await
    }

    /// Writes `data` from offset 0 as [`Client::write_all`] does, each
    /// WRITE's payload a range of `data` instead of a copy of its piece: the
    /// bytes are copied once, into chunk memory (pooled regions, with
    /// memory windows) or a send buffer (inline). Without memory windows
    /// (a registration per chunk) each piece is still copied into a buffer
    /// of its own, which is registered, as `write_all` does.
    ///
    /// # Errors
    /// As [`Client::write_all`].
    pub async fn write_all_shared(&self, f: &Fh, data: std::sync::Arc<Vec<u8>>) -> Result<()> {
        let len = data.len();
        self.write_pieces(f, len, |r| {
            Payload::shared(std::sync::Arc::clone(&data), r).unwrap_or_default()
        })
        .await
    }

    /// WRITEs of `len` bytes from offset 0 in pieces of `wsize`, the piece
    /// at each range made by `piece`, up to the window's in flight.
    async fn write_pieces(
        &self,
        f: &Fh,
        len: usize,
        piece: impl Fn(std::ops::Range<usize>) -> Payload,
    ) -> Result<()> {
        let step = self.wsize.max(1) as usize;
        let mut q = VecDeque::new();
        let mut starts = (0..len).step_by(step);
        loop {
            while q.len() < self.window {
                let Some(at) = starts.next() else {
                    break;
                };
                let c = self.clone();
                let f = f.clone();
                let payload = piece(at..(at + step).min(len));
                let n = payload.len() as u32;
                let at = at as u64;
                q.push_back((
                    at,
                    n,
                    tokio::spawn(async move { c.write_payload(&f, at, payload).await }),
                ));
            }
            let Some((at, n, h)) = q.pop_front() else {
                return Ok(());
            };
            let wrote = h
                .await
                .map_err(|e| NfsError::Invalid(format!("WRITE task: {e}")))??;
            if wrote != n {
                return Err(NfsError::Invalid(format!(
                    "WRITE at {at}: the server wrote {wrote} of {n} bytes"
                )));
            }
        }
    }
}
