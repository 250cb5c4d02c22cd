//! The one clock of the server: every "now" of the process is read here, so that
//! Holds, jobs and the `created` of completions agree on the time.

use acs_core::{Clock, Timestamp};

/// The system's real-time clock, as the contract's [`Clock`].
#[derive(Debug, Clone, Copy)]
struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Timestamp(ms)
    }
}

/// Now.
pub fn now() -> Timestamp {
    SystemClock.now()
}

/// Whole seconds since the Unix epoch (the `created` of completions and models).
pub fn unix_now() -> i64 {
    now().unix_seconds()
}
