//! The binary's own modules (the library, `rdma_trace`, knows nothing of
//! them): [`args`], the command line (clap) and the filter it makes;
//! [`run`], the three commands over a capture; [`print`](mod@print), the printers of
//! packets, iWARP units, messages and RPCs, in text and JSON.

pub(crate) mod args;
pub(crate) mod print;
pub(crate) mod run;
