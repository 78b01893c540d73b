//! The binary's own modules (the library, `rdma_trace`, knows nothing of
//! them), lowest first: [`args`], the command line (clap) and the filter it
//! makes; [`print`](mod@print), the printers of packets, iWARP units,
//! messages and RPCs, in text and JSON; [`run`], the three commands over a
//! capture. Each imports only those before it.

pub(crate) mod args;
pub(crate) mod print;
pub(crate) mod run;
