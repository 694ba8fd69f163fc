//! Helpers for this crate's unit tests.

use crate::transport::Transport;
use std::time::{Duration, Instant};

/// Connect two endpoints as ranks 0 and 1 (each `connect` on its own thread, as ranks would).
pub(crate) fn connect_pair<T: Transport>(a: &mut T, b: &mut T) {
    let (aa, ba) = (a.address().clone(), b.address().clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        let t = s.spawn(|| b.connect(1, &[(0, aa)], deadline));
        a.connect(0, &[(1, ba)], deadline).expect("connect rank 0");
        t.join().expect("thread").expect("connect rank 1");
    });
}
