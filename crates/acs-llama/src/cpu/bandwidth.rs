//! The rate at which the forward pass's threads read from memory: the ceiling of one
//! sequence's decode of a model larger than the caches, which reads every weight once
//! a token. `acs bench` sets the bytes its decode reads against it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::team;

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
    let bytes = buffer_bytes(largest_cache());
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

/// The largest of the first CPU's caches, as Linux lists them; `None` where it does
/// not.
fn largest_cache() -> Option<usize> {
    std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache")
        .ok()?
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path().join("size")).ok())
        .filter_map(|size| cache_size(size.trim()))
        .max()
}

/// A cache size as sysfs writes it: digits and a unit (`48K`, `2048K`, `480M`).
fn cache_size(text: &str) -> Option<usize> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let scale: usize = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    number.parse::<usize>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_size("48K"), Some(48 << 10));
        assert_eq!(cache_size("491520K"), Some(480 << 20));
        assert_eq!(cache_size("32M"), Some(32 << 20));
        assert_eq!(cache_size("64"), Some(64));
        assert_eq!(cache_size("K"), None);
        assert_eq!(cache_size("12Q"), None);
    }

    #[test]
    fn the_buffer_outgrows_the_largest_cache() {
        assert_eq!(buffer_bytes(None), MIN_BYTES);
        assert_eq!(buffer_bytes(Some(32 << 20)), MIN_BYTES);
        assert_eq!(buffer_bytes(Some(480 << 20)), 960 << 20);
        assert_eq!(buffer_bytes(Some(usize::MAX)), MAX_BYTES);
        assert_eq!(buffer_bytes(Some((300 << 20) + 1)) % CHUNK, 0);
    }
}
