//! The fuzzing entry point: [`run`] hands arbitrary bytes to every decoder
//! of what a peer sends: requests (what the server reads from clients),
//! replies (what the client transport reads from servers) and `Rreaddir`'s
//! entries. The cargo-fuzz target in `ninep/fuzz/` calls it, and so does the
//! test suite (`tests/no_panic.rs`) on the committed corpus
//! (`tests/corpus/parse/`) and on mutations of it, with stable Rust. What
//! the server does with a decoded request is fuzzed by
//! `tests/session.rs`'s `mutated_requests_never_panic_or_escape`. Nothing
//! here may panic, and whatever decodes must decode again, unchanged, from
//! its own encoding (it checks).
//!
//! The first byte chooses what the rest is read as:
//! - 0: a request ([`Request::decode`]);
//! - 1: a reply ([`Rmsg::decode`]);
//! - 2: `Rreaddir` data ([`DirEntry::decode_all`]), which must also encode
//!   back to the same bytes;
//! - anything else: all three, on the rest.

use crate::proto::{DirEntry, Request, Rmsg};

/// Runs the input through the part its first byte chooses.
///
/// # Panics
/// Only when a decoded value does not survive its own encoding (a bug the
/// fuzzer is looking for); never because of the input's shape.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => request(rest),
        1 => reply(rest),
        2 => dir_entries(rest),
        _ => {
            request(rest);
            reply(rest);
            dir_entries(rest);
        }
    }
}

fn request(data: &[u8]) {
    let Ok(req) = Request::decode(data) else {
        return;
    };
    let mut out = Vec::new();
    let n = req.encode(&mut out);
    assert_eq!(n, out.len(), "request length");
    assert_eq!(
        Request::decode(&out).as_ref(),
        Ok(&req),
        "request round trip"
    );
}

fn reply(data: &[u8]) {
    let Ok((tag, msg)) = Rmsg::decode(data) else {
        return;
    };
    let mut out = Vec::new();
    let n = msg.encode(tag, &mut out);
    assert_eq!(n, out.len(), "reply length");
    assert_eq!(Rmsg::decode(&out), Ok((tag, msg)), "reply round trip");
}

fn dir_entries(data: &[u8]) {
    let Ok(entries) = DirEntry::decode_all(data) else {
        return;
    };
    let mut out = Vec::new();
    for e in &entries {
        e.encode(&mut out);
    }
    assert_eq!(out, data, "Rreaddir entries round trip");
}
