//! Code the examples share: the error helpers here, the command-line parser
//! in [`args`], the connection manager tools' helpers in
//! [`cm`], both sides of the synchronous endpoint tools in [`endpoint`],
//! the `*_pingpong` tools' flags, device setup, handshake and traffic in
//! [`pingpong`], rping's command line and protocol in [`rping`].
//!
//! Each example includes the whole module (`mod common;`) and uses its part.
#![allow(dead_code)] // every example uses a different subset

pub mod args;
pub mod cm;
pub mod cmatose;
pub mod endpoint;
pub mod pingpong;
pub mod rping;

use std::fmt;

/// How every example fails: an [`anyhow::Error`] whose contexts say what
/// was being done (`.context("rdma_connect")`, in the C tool's words where
/// it has some), printed with [`Report`].
pub type Res<T> = anyhow::Result<T>;

/// An error as the examples print it: each context and cause after the
/// other, `what: why`, leaving out a cause whose text the one before it
/// already shows (an [`rdma::Error`] prints its OS error and also returns
/// it as its source).
pub struct Report<'a>(pub &'a anyhow::Error);

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = String::new();
        for cause in self.0.chain() {
            let text = cause.to_string();
            if shown.is_empty() {
                shown = text;
            } else if !shown.ends_with(&text) {
                shown = format!("{shown}: {text}");
            }
        }
        f.write_str(&shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn reports_name_each_cause_once() {
        let verb = rdma::Error::Verb {
            verb: "rdma_connect",
            context: "".into(),
            source: std::io::Error::from_raw_os_error(libc::ECONNREFUSED),
        };
        let e = Err::<(), _>(verb).context("connect").unwrap_err();
        let os = std::io::Error::from_raw_os_error(libc::ECONNREFUSED).to_string();
        assert_eq!(
            Report(&e).to_string(),
            format!("connect: rdma_connect failed: {os}")
        );
        let e = anyhow::anyhow!("bare").context("outer");
        assert_eq!(Report(&e).to_string(), "outer: bare");
    }
}
