//! The communicator's secret and the challenge-response that proves knowledge of it.
//!
//! Both sides send a random nonce; each answers with HMAC-SHA256(secret, role ‖ both nonces ‖
//! context). A stranger without the secret cannot answer, and a recorded answer is useless
//! against a fresh nonce. The secret itself never crosses the wire.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

/// 128 random bits shared by all ranks of a communicator (part of its unique id).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; 16]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh secret from the OS random source.
    pub fn random() -> std::io::Result<Self> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Secret(b))
    }

    /// A secret every holder of `text` derives alike (SHA-256 of it, truncated): for
    /// launchers that hand ranks no secret of ours, it keeps jobs from mixing up, not an
    /// attacker out.
    pub fn derive(text: &str) -> Self {
        use sha2::Digest;
        let digest =
            Sha256::digest([b"bcl-derived-secret-v1:".as_slice(), text.as_bytes()].concat());
        let mut b = [0u8; 16];
        b.copy_from_slice(&digest[..16]);
        Secret(b)
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 32 {
            return None;
        }
        let mut b = [0u8; 16];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Secret(b))
    }

    /// The proof that the holder of this secret took part in the exchange.
    pub fn prove(
        &self,
        role: &[u8],
        nonce_a: &[u8; 16],
        nonce_b: &[u8; 16],
        context: &[u8],
    ) -> [u8; 32] {
        // HMAC accepts keys of any length; new_from_slice cannot fail for HMAC.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(role);
        mac.update(nonce_a);
        mac.update(nonce_b);
        mac.update(context);
        mac.finalize().into_bytes().into()
    }

    /// Constant-time check of a proof.
    pub fn verify(
        &self,
        proof: &[u8; 32],
        role: &[u8],
        nonce_a: &[u8; 16],
        nonce_b: &[u8; 16],
        context: &[u8],
    ) -> bool {
        let want = self.prove(role, nonce_a, nonce_b, context);
        want.iter()
            .zip(proof)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// A fresh random nonce.
pub fn nonce() -> [u8; 16] {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // Fall back to time and address entropy: nonces need uniqueness, not secrecy.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b.copy_from_slice(&t.to_le_bytes());
    }
    b
}

/// Both sides of a connection run this over a blocking stream: each proves the secret.
pub mod exchange {
    use super::{Secret, nonce};
    use std::io::{self, Read, Write};

    fn fail(reason: &str) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, reason.to_string())
    }

    /// Connecting side. `context` binds the proof to this connection's purpose.
    pub fn client<S: Read + Write>(s: &mut S, secret: &Secret, context: &[u8]) -> io::Result<()> {
        let mine = nonce();
        s.write_all(b"BCLH")?;
        s.write_all(&mine)?;
        let mut reply = [0u8; 4 + 16 + 32];
        s.read_exact(&mut reply)?;
        if &reply[..4] != b"BCLC" {
            return Err(fail("peer is not a BCL endpoint"));
        }
        let theirs: [u8; 16] = reply[4..20].try_into().map_err(|_| fail("short"))?;
        let proof: [u8; 32] = reply[20..52].try_into().map_err(|_| fail("short"))?;
        if !secret.verify(&proof, b"server", &mine, &theirs, context) {
            return Err(fail("peer does not know the communicator's secret"));
        }
        s.write_all(&secret.prove(b"client", &theirs, &mine, context))?;
        let mut ok = [0u8; 4];
        s.read_exact(&mut ok)?;
        if &ok != b"BCLK" {
            return Err(fail("peer refused our proof"));
        }
        Ok(())
    }

    /// Accepting side.
    pub fn server<S: Read + Write>(s: &mut S, secret: &Secret, context: &[u8]) -> io::Result<()> {
        server_then(s, secret, context, || {})
    }

    /// Accepting side, calling `proven` once the client has proved the secret and before it
    /// is told so: a listener frees the connection's handshake slot there, so a member that
    /// has read its acceptance can no longer be cut as a stranger.
    pub fn server_then<S: Read + Write>(
        s: &mut S,
        secret: &Secret,
        context: &[u8],
        proven: impl FnOnce(),
    ) -> io::Result<()> {
        let mut hello = [0u8; 4 + 16];
        s.read_exact(&mut hello)?;
        if &hello[..4] != b"BCLH" {
            return Err(fail("connection did not start with a BCL hello"));
        }
        let theirs: [u8; 16] = hello[4..].try_into().map_err(|_| fail("short"))?;
        let mine = nonce();
        s.write_all(b"BCLC")?;
        s.write_all(&mine)?;
        s.write_all(&secret.prove(b"server", &theirs, &mine, context))?;
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof)?;
        if !secret.verify(&proof, b"client", &mine, &theirs, context) {
            return Err(fail("client does not know the communicator's secret"));
        }
        proven();
        s.write_all(b"BCLK")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn hex_round_trip() {
        let s = Secret([7; 16]);
        assert_eq!(Secret::from_hex(&s.to_hex()), Some(s));
        assert_eq!(Secret::from_hex("xyz"), None);
    }

    #[test]
    fn same_secret_passes_other_secret_fails() {
        for (client_secret, ok) in [(Secret([1; 16]), true), (Secret([2; 16]), false)] {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = l.local_addr().expect("addr");
            let t = std::thread::spawn(move || {
                let (mut s, _) = l.accept().expect("accept");
                exchange::server(&mut s, &Secret([1; 16]), b"ctx").is_ok()
            });
            let mut c = TcpStream::connect(addr).expect("connect");
            let client_ok = exchange::client(&mut c, &client_secret, b"ctx").is_ok();
            drop(c);
            assert_eq!(client_ok, ok);
            assert_eq!(t.join().expect("join"), ok);
        }
    }
}
