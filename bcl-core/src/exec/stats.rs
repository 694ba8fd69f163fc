//! What the executor measures while it runs a plan, for the health layer to read: bytes per
//! peer (the flight recorder) and the rates behind slow-node detection. The executor owns
//! these figures; health only reads them.

use serde::Serialize;

/// Messages smaller than this carry no bandwidth information (latency dominates): their
/// wire rate and device time are not recorded (nor is the clock read for them).
pub const RATE_MIN_BYTES: usize = 64 << 10;

/// Bytes one operation moved to and from one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PeerBytes {
    pub peer: usize,
    pub sent: u64,
    pub received: u64,
}

/// What one operation measured for slow-node detection.
#[derive(Debug, Default)]
pub struct Measurements {
    /// Wire rates (peer, GB/s) of the large messages received.
    pub link_rates: Vec<(usize, f32)>,
    /// Bytes reduced or copied into this rank's buffers, and the seconds it took.
    pub device_bytes: u64,
    pub device_secs: f64,
}
