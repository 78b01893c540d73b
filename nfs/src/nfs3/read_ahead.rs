//! How [`Client::read_each`](super::Client::read_each) sends READs ahead
//! and hands their data on in file order ([`read_in_order`]), apart from
//! the client so that its unit test needs no server.

use std::collections::VecDeque;

use super::{NfsError, Result};

/// [`Client::read_each`]'s order: `read(at)` (a READ of up to `step` bytes
/// at `at`, run as a task of its own) sent ahead up to `size` with up to
/// `window` in flight, each piece given to `sink` in file order. A piece
/// shorter than `step` and not the end starts a new run from where it
/// ended: the READs of the old run still in flight are awaited and their
/// data and errors ignored (they lie past a file that shrank).
///
/// [`Client::read_each`]: super::Client::read_each
pub(super) async fn read_in_order<D, E, Fut>(
    size: u64,
    step: u32,
    window: usize,
    read: impl Fn(u64) -> Fut,
    mut sink: impl FnMut(&[u8]) -> std::result::Result<(), E>,
) -> Result<std::result::Result<u64, E>>
where
    D: std::ops::Deref<Target = [u8]> + Send + 'static,
    Fut: std::future::Future<Output = Result<(D, bool)>> + Send + 'static,
{
    let mut q = VecDeque::new();
    // The next offset to ask for, the bytes given to `sink`, and the run
    // of READs (a short READ starts a new one: those of the old run still
    // in flight are dropped). Past `size` (the file grew) one READ at a
    // time, until one says end of file.
    let (mut next, mut done, mut run) = (0u64, 0u64, 0u64);
    let mut eof = false;
    loop {
        while !eof && q.len() < window && (next < size || q.is_empty()) {
            q.push_back((next, run, tokio::spawn(read(next))));
            next += u64::from(step);
        }
        let Some((at, r, h)) = q.pop_front() else {
            return Ok(Ok(done));
        };
        let piece = h
            .await
            .map_err(|e| NfsError::Invalid(format!("READ task: {e}")))?;
        if eof || r != run || at != done {
            // Sent ahead of a short READ or of the end: neither its data
            // nor its error counts.
            continue;
        }
        let (data, e) = piece?;
        if let Err(e) = sink(&data) {
            return Ok(Err(e));
        }
        done += data.len() as u64;
        if e || data.is_empty() {
            eof = true;
        } else if data.len() < step as usize {
            run += 1;
            next = done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that shrank to 12 bytes after GETATTR said 16: the READ at 4
    /// is short, those sent ahead at 8 and 12 fail, and reading goes on
    /// from 6 to the end without their errors.
    #[tokio::test]
    async fn reads_sent_past_a_short_read_do_not_fail_the_whole_read() {
        let file: Vec<u8> = (0..12).collect();
        let read = |at: u64| {
            let file = file.clone();
            async move {
                let at = at as usize;
                match at {
                    4 => Ok((file[4..6].to_vec(), false)),
                    8 | 12 => Err(NfsError::Invalid(format!("READ at {at} past the end"))),
                    _ if at >= file.len() => Ok((Vec::new(), true)),
                    _ => {
                        let end = (at + 4).min(file.len());
                        Ok((file[at..end].to_vec(), end == file.len()))
                    }
                }
            }
        };
        let mut got = Vec::new();
        let n = read_in_order(16, 4, 4, read, |p| {
            got.extend_from_slice(p);
            Ok::<(), ()>(())
        })
        .await
        .expect("the stale READs' errors are ignored")
        .expect("the sink never fails");
        assert_eq!(n, 12);
        assert_eq!(got, file);
    }
}
