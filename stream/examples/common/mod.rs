//! What the examples share: how a failure is printed ([`chain`], [`exit`])
//! and how a host and port become an address ([`resolve`]); in [`perf`],
//! what `rstream` and `riostream` share (their flags, sizes and table).
//!
//! Each example includes the whole module (`mod common;`) and uses its part.
#![allow(dead_code)] // not every example uses every part

use std::error::Error;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use anyhow::Context as _;

pub mod perf;

/// An error and its sources, `: `-separated, leaving out a source whose
/// text the one before it already ends with (tonic's transport errors say
/// only "transport error" at the top and print some sources as
/// themselves).
pub fn chain(e: &(dyn Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// `tool: what failed: why` on standard error.
pub fn report(tool: &str, e: &anyhow::Error) {
    eprintln!("{tool}: {}", chain(e.as_ref()));
}

/// Exit status 0, or 1 with the error [`report`]ed.
pub fn exit(tool: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(tool, &e);
            ExitCode::from(1)
        }
    }
}

/// The first address of `host` with `port`.
pub fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} has no address"))
}
