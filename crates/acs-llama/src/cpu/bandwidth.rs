//! The rate at which the forward pass's threads read from memory: the ceiling of one
//! sequence's decode of a model larger than the caches, which reads every weight once
//! a token. `acs bench` sets the bytes its decode reads against it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::team;

/// Bytes read per pass: far beyond any last-level cache, so that the reads come from
/// memory.
const BYTES: usize = 512 << 20;
/// Bytes a task reads: whole pages, and enough tasks for every thread.
const CHUNK: usize = 4 << 20;

/// Bytes per second that every thread of the forward pass, reading its own parts of
/// one buffer in turn, gets from memory: the best of three passes over 512 MiB.
pub fn read_bandwidth() -> f64 {
    let words = vec![1u64; BYTES / 8];
    let sink = AtomicU64::new(0);
    let mut best = 0f64;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        team::session(|| {
            team::run(BYTES / CHUNK, |i| {
                let part = &words[i * CHUNK / 8..(i + 1) * CHUNK / 8];
                // A sum the compiler vectorises, kept so that the reads stay.
                let sum = part.iter().fold(0u64, |a, &w| a.wrapping_add(w));
                sink.fetch_add(sum, Ordering::Relaxed);
            })
        });
        best = best.max(BYTES as f64 / start.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.load(Ordering::Relaxed));
    best
}
