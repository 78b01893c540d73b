//! [`Error`]: why the server, or one of its connections, stopped: what
//! failed (the call or the step) and why, in the same words as the log
//! lines and the binary's message.

use std::io;

use crate::proto::DecodeError;

/// Why the server, or one of its connections, stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An RDMA call failed: which (`rdma_listen`, `ibv_post_recv`,
    /// `QP to RTS`, `send buffer`, ...), and the error.
    #[error("{what}: {source}")]
    Rdma {
        /// The call or the step.
        what: &'static str,
        /// What it returned.
        #[source]
        source: rdma::Error,
    },
    /// A system call failed, or the served directory cannot be opened:
    /// what (`RLIMIT_NOFILE`, `tokio runtime`, `cannot serve DIR`), and the
    /// OS error.
    #[error("{what}: {source}")]
    Io {
        /// The call or the step.
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The descriptor limit leaves none for clients' open files.
    #[error(
        "RLIMIT_NOFILE {nofile} leaves no descriptors for open files with {connections} \
         connections (the server and its connections need {reserve}): raise the limit \
         (ulimit -Hn) or lower --max-connections"
    )]
    Descriptors {
        /// The limit in force.
        nofile: u64,
        /// `--max-connections`.
        connections: u64,
        /// What the server and its connections need besides open files.
        reserve: u64,
    },
    /// A peer's message has a malformed header (the connection closes: a
    /// request whose body is malformed is answered `Rlerror` instead).
    #[error("malformed message, closing: {0}")]
    Malformed(#[source] DecodeError),
    /// A work request completed with an error (other than a flush).
    #[error("completion {wr_id:#x}: {status}")]
    Completion {
        /// Its `wr_id`.
        wr_id: u64,
        /// The completion's status.
        status: rdma::WcStatus,
    },
    /// A request's handler did not return (it panicked or was cancelled).
    #[error("a request's handler failed: {0}")]
    Handler(String),
    /// The server's own bookkeeping went wrong (a bug): what was found.
    #[error("{0}")]
    Internal(&'static str),
}

/// `map_err` for an RDMA call: `what` failed.
pub(crate) fn rdma(what: &'static str) -> impl FnOnce(rdma::Error) -> Error {
    move |source| Error::Rdma { what, source }
}

/// `map_err` for a post (`what`) that failed: the requests' memory, handed
/// back, is dropped (the connection ends).
pub(crate) fn post(what: &'static str) -> impl FnOnce(rdma::PostError) -> Error {
    move |e| Error::Rdma {
        what,
        source: e.drop_buffers(),
    }
}

/// `map_err` for a system call or step: `what` failed.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
