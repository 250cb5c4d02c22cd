//! Time as the contract writes it, and a [`Clock`] that tests can drive.
//!
//! Core has no I/O, so it never reads the system clock itself: the server and the
//! browser pass their own [`Clock`]; tests pass a [`ManualClock`].

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;

/// The contract's time format: RFC 3339, milliseconds, `+00:00`.
const FORMAT: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]+00:00");

/// Milliseconds since the Unix epoch, in UTC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// One day, the retention of results and idempotency keys.
    pub const DAY_MS: i64 = 24 * 60 * 60 * 1000;

    /// From milliseconds since the epoch.
    pub fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the epoch.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// Whole seconds since the epoch (the `created` field of completions).
    pub fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// This time plus `ms` milliseconds.
    pub fn plus_millis(self, ms: i64) -> Self {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Parses the contract's format (`2026-11-02T18:35:08.037+00:00`).
    pub fn parse(text: &str) -> Option<Self> {
        let t = time::PrimitiveDateTime::parse(text, FORMAT).ok()?;
        let ns = t.assume_utc().unix_timestamp_nanos();
        i64::try_from(ns / 1_000_000).ok().map(Timestamp)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000)
            .map_err(|_| fmt::Error)?;
        let text = t.format(FORMAT).map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Timestamp::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not a contract timestamp: {text}")))
    }
}

/// Where "now" comes from.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// A clock that only moves when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(AtomicI64::new(start.0))
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_the_tutorial() {
        let t = Timestamp::parse("2026-11-02T18:35:08.037+00:00").unwrap();
        assert_eq!(t.to_string(), "2026-11-02T18:35:08.037+00:00");
        assert_eq!(
            t.plus_millis(Timestamp::DAY_MS).to_string(),
            "2026-11-03T18:35:08.037+00:00"
        );
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000+00:00");
    }

    #[test]
    fn rejects_other_formats() {
        assert!(Timestamp::parse("2026-11-02T18:35:08Z").is_none());
        assert!(Timestamp::parse("2026-11-02 18:35:08.037").is_none());
    }

    #[test]
    fn manual_clock_moves_when_told() {
        let c = ManualClock::new(Timestamp(5));
        c.advance(10);
        assert_eq!(c.now(), Timestamp(15));
    }
}
