//! The rate at which the forward pass's threads read from memory: the ceiling of one
//! sequence's decode of a model larger than the caches, which reads every weight once
//! a token. `acs bench` sets the bytes its decode reads against it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{caches, team};

/// Bytes read per pass at least: far beyond the caches of most CPUs.
const MIN_BYTES: usize = 512 << 20;
/// Bytes read per pass at most, however large the caches say they are.
const MAX_BYTES: usize = 4 << 30;
/// Bytes a task reads: whole pages, and enough tasks for every thread.
const CHUNK: usize = 4 << 20;

/// Bytes per second that every thread of the forward pass, reading its own parts of
/// one buffer in turn, gets from memory: the best of three passes over a buffer of
/// twice the largest cache (at least 512 MiB), so that the reads come from memory
/// even where the last-level cache holds hundreds of MiB.
pub fn read_bandwidth() -> f64 {
    let bytes = buffer_bytes(caches::largest());
    let words = vec![1u64; bytes / 8];
    let sink = AtomicU64::new(0);
    let mut best = 0f64;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        team::session(|| {
            team::run(bytes / CHUNK, |i| {
                let part = &words[i * CHUNK / 8..(i + 1) * CHUNK / 8];
                // A sum the compiler vectorises, kept so that the reads stay.
                let sum = part.iter().fold(0u64, |a, &w| a.wrapping_add(w));
                sink.fetch_add(sum, Ordering::Relaxed);
            })
        });
        best = best.max(bytes as f64 / start.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.load(Ordering::Relaxed));
    best
}

/// The buffer [`read_bandwidth`] reads: twice `cache` bytes, within its bounds, in
/// whole tasks.
fn buffer_bytes(cache: Option<usize>) -> usize {
    let bytes = cache.map_or(MIN_BYTES, |c| c.saturating_mul(2));
    bytes.clamp(MIN_BYTES, MAX_BYTES).next_multiple_of(CHUNK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_outgrows_the_largest_cache() {
        assert_eq!(buffer_bytes(None), MIN_BYTES);
        assert_eq!(buffer_bytes(Some(32 << 20)), MIN_BYTES);
        assert_eq!(buffer_bytes(Some(480 << 20)), 960 << 20);
        assert_eq!(buffer_bytes(Some(usize::MAX)), MAX_BYTES);
        assert_eq!(buffer_bytes(Some((300 << 20) + 1)) % CHUNK, 0);
    }
}
