//! The unique id: where rank 0 serves the rendezvous store, and the communicator's secret.
//! Printable and parseable as `bcl://IP:PORT/SECRETHEX`, so launchers can pass it on.

use crate::error::{Error, Result};
use bcl_transport::Secret;
use std::fmt;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId {
    /// Where rank 0's store listens.
    pub addr: SocketAddr,
    /// Proves membership in every connection of this communicator.
    pub secret: Secret,
}

impl UniqueId {
    /// A fresh id for a store on `ip`, on a port that is free now.
    pub fn new(ip: IpAddr) -> Result<Self> {
        let port = TcpListener::bind(SocketAddr::new(ip, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::Unavailable(format!("no free TCP port on {ip}: {e}")))?
            .port();
        Self::at(SocketAddr::new(ip, port))
    }

    /// A fresh secret for a store at a chosen address.
    pub fn at(addr: SocketAddr) -> Result<Self> {
        let secret = Secret::random()
            .map_err(|e| Error::Unavailable(format!("no OS random source: {e}")))?;
        Ok(UniqueId { addr, secret })
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bcl://{}/{}", self.addr, self.secret.to_hex())
    }
}

impl FromStr for UniqueId {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        // The error shows the text with its secret part hidden: an id that fails to parse
        // may still carry the real secret (a typo in the address), and errors are logged.
        let shown = match text.trim().rsplit_once('/') {
            Some((head, tail)) if !tail.is_empty() => {
                format!("{head}/<{} characters hidden>", tail.chars().count())
            }
            _ => text.trim().chars().take(64).collect(),
        };
        let bad = |why: &str| Error::InvalidArgument(format!("bad unique id '{shown}': {why}"));
        let rest = text
            .trim()
            .strip_prefix("bcl://")
            .ok_or_else(|| bad("must start with bcl://"))?;
        let (addr, secret) = rest
            .rsplit_once('/')
            .ok_or_else(|| bad("missing /SECRET"))?;
        Ok(UniqueId {
            addr: addr.parse().map_err(|_| bad("address is not IP:PORT"))?,
            secret: Secret::from_hex(secret).ok_or_else(|| bad("secret is not 32 hex digits"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_text() {
        let id = UniqueId::new("127.0.0.1".parse().expect("ip")).expect("id");
        assert_eq!(id.to_string().parse::<UniqueId>().expect("parse"), id);
        for bad in [
            "",
            "bcl://x/00",
            "bcl://127.0.0.1:1/zz",
            "http://127.0.0.1:1/00",
        ] {
            assert!(bad.parse::<UniqueId>().is_err(), "{bad}");
        }
    }

    /// An id whose address is wrong still carries the real secret: the error names what is
    /// wrong and shows no secret digit.
    #[test]
    fn a_bad_id_is_refused_without_showing_its_secret() {
        let secret = "0123456789abcdef0123456789abcdef";
        for text in [
            format!("bcl://no-such-host:1/{secret}"),
            format!("bcl://127.0.0.1/{secret}"),
            format!("bcl:/127.0.0.1:1/{secret}"),
        ] {
            let e = text.parse::<UniqueId>().expect_err("bad address");
            let shown = e.to_string();
            assert!(!shown.contains("0123456789abcdef"), "{shown}");
            assert!(shown.contains("32 characters hidden"), "{shown}");
        }
        let e = "bcl://127.0.0.1:1/zz"
            .parse::<UniqueId>()
            .expect_err("bad secret");
        assert!(e.to_string().contains("secret is not 32 hex digits"), "{e}");
    }
}
