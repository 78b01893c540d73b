//! Code the examples share: the error helpers here, the command-line parser
//! in [`args`] (which `perf`, the one example that does not include this
//! module, includes by itself), the connection manager tools' helpers in
//! [`cm`], both sides of the synchronous endpoint tools in [`endpoint`],
//! the `*_pingpong` tools' flags, device setup, handshake and traffic in
//! [`pingpong`], rping's command line and protocol in [`rping`].
//!
//! Each example includes the whole module (`mod common;`) and uses its part.
#![allow(dead_code)] // every example uses a different subset

pub mod args;
pub mod cm;
pub mod endpoint;
pub mod pingpong;
pub mod rping;

use std::fmt::Display;

/// A failure: the text to print (already in the C tool's words where it has
/// some). Every example prints `NAME: message` and exits 1.
pub type Res<T> = Result<T, String>;

/// Adds what failed to an error.
pub trait OrFail<T> {
    /// `Err(e)` becomes `Err("{what}: {e}")`.
    fn or_fail(self, what: &str) -> Res<T>;
}

impl<T, E: Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}
