//! The sizes of the first CPU's caches, as Linux lists them in sysfs: what sizes the
//! bandwidth benchmark's buffer and the prefill's chunks of activations.

use std::path::Path;

const CACHES: &str = "/sys/devices/system/cpu/cpu0/cache";

/// The largest of the caches; `None` where Linux does not list them.
pub(crate) fn largest() -> Option<usize> {
    entries()?.map(|(_, size)| size).max()
}

/// The size of the level-2 cache that holds data (a core's own, on the CPUs this
/// runs on); `None` where Linux does not list it. Only the x86 kernels size their
/// work by it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn level2() -> Option<usize> {
    entries()?
        .find(|&(level, _)| level == 2)
        .map(|(_, size)| size)
}

/// Each data or unified cache's level and size.
fn entries() -> Option<impl Iterator<Item = (u32, usize)>> {
    let read = |dir: &Path, what: &str| std::fs::read_to_string(dir.join(what)).ok();
    let caches = std::fs::read_dir(CACHES).ok()?.filter_map(move |entry| {
        let dir = entry.ok()?.path();
        if read(&dir, "type")?.trim() == "Instruction" {
            return None;
        }
        let level = read(&dir, "level")?.trim().parse().ok()?;
        Some((level, cache_size(read(&dir, "size")?.trim())?))
    });
    Some(caches)
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
}
