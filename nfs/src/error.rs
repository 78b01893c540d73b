//! The transport's errors, [`crate::transport::Error`] and its `Result`:
//! below `chunks` and `transport`, which both return them (they are
//! re-exported from `transport`, where callers name them).

use std::fmt;

use crate::rpcrdma::RdmaError;
use crate::xdr::DecodeError;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// No connection (it could not be made, or broke and could not be
    /// remade): connect again and retry.
    NotConnected(String),
    /// Memory for the call could not be registered: try again later.
    NoBuffers(String),
    /// The reply did not come within the timeout, after every retry.
    TimedOut {
        /// The call's xid.
        xid: u32,
        /// How often it was sent.
        sent: u32,
    },
    /// The server answered `RDMA_ERROR`.
    Rdma(RdmaError),
    /// The server's transport header or chunks were malformed or broke the
    /// protocol (a chunk longer than offered, a reply chunk never offered).
    Malformed(String),
    /// The RPC reply inside the transport's message names another call than
    /// the transport header it came with (RFC 8166 requires both xids to be
    /// the call's): the reply is not this call's, and is not delivered.
    XidMismatch {
        /// The call's xid (and its reply's transport header's).
        call: u32,
        /// The xid of the RPC reply the server sent with it.
        reply: u32,
    },
    /// The call cannot be sent at all (too large), or the transport is
    /// closed: do not retry.
    Permanent(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotConnected(why) => write!(f, "not connected: {why}"),
            Error::NoBuffers(why) => write!(f, "no buffers: {why}"),
            Error::TimedOut { xid, sent } => {
                write!(f, "call {xid:#x} got no reply (sent {sent} times)")
            }
            Error::Rdma(e) => write!(f, "{e}"),
            Error::Malformed(why) => write!(f, "malformed reply from the server: {why}"),
            Error::XidMismatch { call, reply } => write!(
                f,
                "the server answered call {call:#x} with the RPC reply of call {reply:#x}"
            ),
            Error::Permanent(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for Error {}

/// The result of a call.
pub type Result<T> = std::result::Result<T, Error>;

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Error::Malformed(e.to_string())
    }
}
