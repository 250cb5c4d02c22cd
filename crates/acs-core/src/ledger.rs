//! The token ledger: Budgets, Holds, the running-request limit and the per-minute
//! limits.
//!
//! A request takes one Hold when it starts (its prompts' tokens plus
//! `prompts × n × max_tokens`); when it ends, [`settle`] charges its real usage and
//! releases the rest. A Hold is removed by the same step that charges it, so it can be
//! released exactly once, and the charge never exceeds the Hold or the Budget.
//!
//! A key may also have per-minute limits ([`set_rate_limits`]): requests started in a
//! minute, and tokens held by them. A request's Hold counts into its minute's tokens
//! when it starts, and what it gives back when it ends leaves them again, so a minute
//! counts the tokens its requests used or still hold. A minute with nothing counted
//! takes a request larger than its tokens limit, so that such a request is slowed, not
//! refused for good.

use crate::clock::Timestamp;
use crate::error::{ApiError, ErrorCode};
use crate::response::BudgetView;
use crate::sql::MAX_SAFE_INTEGER;
use crate::store::{Budget, Hold, Rate, Store};

/// Seconds a refused request should wait before it tries again.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// The length of a per-minute window.
const MINUTE_MS: i64 = 60_000;

/// The start of the minute `t` falls in.
fn minute_of(t: Timestamp) -> Timestamp {
    Timestamp(t.0.div_euclid(MINUTE_MS) * MINUTE_MS)
}

/// Sets a key's per-minute limits (`None`: no limit); the current minute's counts
/// stay.
pub fn set_rate_limits<S: Store>(
    store: &mut S,
    key_id: &str,
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u64>,
) -> Result<(), ApiError> {
    let mut rate = store.rate(key_id)?.unwrap_or_default();
    rate.requests_per_minute = requests_per_minute;
    rate.tokens_per_minute = tokens_per_minute;
    store.put_rate(key_id, &rate)?;
    Ok(())
}

/// The key's per-minute counts for the minute of `now` if a request of `tokens`
/// fits them, with that request counted; else 429 `rate_limit_exceeded`, with the
/// seconds to the next minute as its `retry-after`.
fn take_rate(rate: Rate, tokens: u64, now: Timestamp) -> Result<Rate, ApiError> {
    let minute = minute_of(now);
    let mut rate = if rate.window_start == minute {
        rate
    } else {
        Rate {
            window_start: minute,
            requests: 0,
            tokens: 0,
            ..rate
        }
    };
    let wait = ((minute.0 + MINUTE_MS - now.0 + 999) / 1000).max(1) as u32;
    if let Some(limit) = rate.requests_per_minute
        && rate.requests >= limit
    {
        return Err(ApiError::new(
            ErrorCode::RateLimitExceeded,
            format!(
                "This key may start {limit} requests a minute and started {} this minute. Retry in {wait} s.",
                rate.requests
            ),
        )
        .with_retry_after(wait));
    }
    if let Some(limit) = rate.tokens_per_minute
        && rate.tokens > 0
        && rate.tokens.saturating_add(tokens) > limit
    {
        return Err(ApiError::new(
            ErrorCode::RateLimitExceeded,
            format!(
                "This key may hold {limit} tokens a minute; this minute's requests hold or used {} and this one needs {tokens}. Retry in {wait} s.",
                rate.tokens
            ),
        )
        .with_retry_after(wait));
    }
    rate.requests = rate.requests.saturating_add(1);
    rate.tokens = rate.tokens.saturating_add(tokens);
    Ok(rate)
}

/// The outcome of settling a Hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    /// Tokens taken from the Budget.
    pub charged: u64,
    /// Tokens of the Hold given back.
    pub released: u64,
}

/// Takes a Hold of `tokens` for request `hold_id` of key `key_id`, or says why not.
///
/// - 402 `budget_exhausted` when the Hold exceeds the Budget itself (it can never fit);
/// - 429 `too_many_running` when the key runs its limit of requests already;
/// - 429 `budget_held` when it fits the Budget but not beside the running Holds;
/// - 429 `rate_limit_exceeded` when the key's per-minute limits are reached.
pub fn admit<S: Store>(
    store: &mut S,
    key_id: &str,
    hold_id: &str,
    tokens: u64,
    now: Timestamp,
) -> Result<Hold, ApiError> {
    let budget = store.budget(key_id)?.unwrap_or(Budget::NONE);
    let holds = store.holds(key_id)?;
    let held: u64 = holds.iter().map(|h| h.tokens).sum();
    if tokens > budget.tokens_left {
        return Err(ApiError::new(
            ErrorCode::BudgetExhausted,
            format!(
                "This request needs a Hold of {tokens} tokens; the Budget has {} tokens left. Top up the key or ask for fewer tokens.",
                budget.tokens_left
            ),
        ));
    }
    if holds.len() >= budget.max_running as usize {
        return Err(ApiError::new(
            ErrorCode::TooManyRunning,
            format!(
                "This key already runs {} requests, its limit. Retry when one ends.",
                holds.len()
            ),
        )
        .with_retry_after(RETRY_AFTER_SECONDS));
    }
    let free = budget.tokens_left.saturating_sub(held);
    if tokens > free {
        return Err(ApiError::new(
            ErrorCode::BudgetHeld,
            format!(
                "This request needs a Hold of {tokens} tokens; {free} are free while running requests hold {held}. Retry when they end."
            ),
        )
        .with_retry_after(RETRY_AFTER_SECONDS));
    }
    if holds.iter().any(|h| h.id == hold_id) {
        return Err(ApiError::internal(format!("hold {hold_id} exists already")));
    }
    if let Some(rate) = store.rate(key_id)? {
        let rate = take_rate(rate, tokens, now)?;
        store.put_rate(key_id, &rate)?;
    }
    let hold = Hold {
        id: hold_id.to_owned(),
        key_id: key_id.to_owned(),
        tokens,
        created_at: now,
    };
    store.put_hold(&hold)?;
    Ok(hold)
}

/// Ends Hold `hold_id`: charges `used` tokens (never more than the Hold or the
/// Budget) and releases the rest. `None` when the Hold was released already, so a
/// second call charges nothing.
pub fn settle<S: Store>(
    store: &mut S,
    hold_id: &str,
    used: u64,
) -> Result<Option<Settlement>, ApiError> {
    let Some(hold) = store.take_hold(hold_id)? else {
        return Ok(None);
    };
    let mut budget = store.budget(&hold.key_id)?.unwrap_or(Budget::NONE);
    let charged = used.min(hold.tokens).min(budget.tokens_left);
    budget.tokens_left -= charged;
    store.put_budget(&hold.key_id, &budget)?;
    // What the request gives back leaves its minute's tokens, if that minute is still
    // the one counted.
    if let Some(mut rate) = store.rate(&hold.key_id)?
        && rate.window_start == minute_of(hold.created_at)
    {
        rate.tokens = rate.tokens.saturating_sub(hold.tokens - charged);
        store.put_rate(&hold.key_id, &rate)?;
    }
    Ok(Some(Settlement {
        charged,
        released: hold.tokens - charged,
    }))
}

/// Releases every Hold uncharged: what a server does when it starts, since no request
/// of an earlier process still runs. Jobs that were running are re-run (see
/// [`crate::jobs::recover`]) and charged when they finish. Returns how many went.
pub fn release_all<S: Store>(store: &mut S) -> Result<usize, ApiError> {
    let holds = store.all_holds()?;
    for h in &holds {
        store.take_hold(&h.id)?;
    }
    Ok(holds.len())
}

/// A key's Budget as `GET /v1/budget` shows it.
pub fn view<S: Store>(store: &S, key_id: &str) -> Result<BudgetView, ApiError> {
    let budget = store.budget(key_id)?.unwrap_or(Budget::NONE);
    let holds = store.holds(key_id)?;
    Ok(BudgetView {
        tokens_left: budget.tokens_left,
        tokens_held: holds.iter().map(|h| h.tokens).sum(),
        running: holds.len() as u32,
        max_running: budget.max_running,
    })
}

/// Adds `tokens` to a key's Budget, keeping its limits. A Budget stops at
/// [`MAX_SAFE_INTEGER`], the most that is stored and that JSON clients read exactly, so
/// the Budget returned is the one stored.
pub fn top_up<S: Store>(store: &mut S, key_id: &str, tokens: u64) -> Result<Budget, ApiError> {
    let mut budget = store
        .budget(key_id)?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("No key with id {key_id}.")))?;
    budget.tokens_left = budget
        .tokens_left
        .saturating_add(tokens)
        .min(MAX_SAFE_INTEGER);
    store.put_budget(key_id, &budget)?;
    Ok(budget)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn store_with(tokens: u64, max_running: u32) -> MemoryStore {
        let mut s = MemoryStore::new();
        s.put_budget(
            "k",
            &Budget {
                tokens_left: tokens,
                max_running,
            },
        )
        .unwrap();
        s
    }

    #[test]
    fn top_ups_stop_at_the_largest_stored_count() {
        let mut s = store_with(10, 4);
        assert_eq!(top_up(&mut s, "k", 5).unwrap().tokens_left, 15);
        let b = top_up(&mut s, "k", u64::MAX).unwrap();
        assert_eq!(b.tokens_left, MAX_SAFE_INTEGER);
        assert_eq!(
            s.budget("k").unwrap().unwrap().tokens_left,
            MAX_SAFE_INTEGER
        );
        assert_eq!(
            top_up(&mut s, "k", 1).unwrap().tokens_left,
            MAX_SAFE_INTEGER
        );
    }

    #[test]
    fn requests_per_minute_are_counted_by_the_minute() {
        let mut s = store_with(1000, 8);
        set_rate_limits(&mut s, "k", Some(2), None).unwrap();
        let t = Timestamp(120_000 + 45_500);
        admit(&mut s, "k", "r1", 1, t).unwrap();
        admit(&mut s, "k", "r2", 1, t).unwrap();
        let e = admit(&mut s, "k", "r3", 1, t).unwrap_err();
        assert_eq!((e.code, e.status()), (ErrorCode::RateLimitExceeded, 429));
        assert_eq!(e.code.kind(), "rate_limit_error");
        // 14.5 s are left of the minute: retry in 15.
        assert_eq!(e.retry_after, Some(15));
        // Ending requests frees no request of the minute; the next minute does.
        settle(&mut s, "r1", 1).unwrap();
        assert!(admit(&mut s, "k", "r3", 1, t.plus_millis(14_000)).is_err());
        admit(&mut s, "k", "r3", 1, Timestamp(180_000)).unwrap();
        // A refused request left no Hold behind.
        assert_eq!(s.holds("k").unwrap().len(), 2);
    }

    #[test]
    fn tokens_per_minute_count_what_is_held_or_used() {
        let mut s = store_with(10_000, 8);
        set_rate_limits(&mut s, "k", None, Some(100)).unwrap();
        let t = Timestamp(60_000);
        admit(&mut s, "k", "a", 60, t).unwrap();
        let e = admit(&mut s, "k", "b", 50, t).unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimitExceeded);
        // `a` used 10 of its 60: the 50 it gave back leave the minute.
        settle(&mut s, "a", 10).unwrap();
        assert_eq!(s.rate("k").unwrap().unwrap().tokens, 10);
        admit(&mut s, "k", "b", 50, t).unwrap();
        // A request over the limit runs in a minute of its own, not never.
        let later = Timestamp(120_000);
        settle(&mut s, "b", 50).unwrap();
        admit(&mut s, "k", "big", 500, later).unwrap();
        assert!(admit(&mut s, "k", "small", 1, later).is_err());
        settle(&mut s, "big", 0).unwrap();
        assert_eq!(s.rate("k").unwrap().unwrap().tokens, 0);
        // What a request of an earlier minute gives back leaves the minute counted now
        // as it is.
        admit(&mut s, "k", "c", 30, later).unwrap();
        admit(&mut s, "k", "d", 40, Timestamp(180_000)).unwrap();
        settle(&mut s, "c", 0).unwrap();
        assert_eq!(s.rate("k").unwrap().unwrap().tokens, 40);
        // Without limits nothing is counted.
        set_rate_limits(&mut s, "k", None, None).unwrap();
        for i in 0..5 {
            admit(&mut s, "k", &format!("x{i}"), 500, later).unwrap();
        }
    }

    #[test]
    fn refuses_a_hold_over_the_budget_with_402() {
        let mut s = store_with(10, 4);
        let e = admit(&mut s, "k", "r1", 11, Timestamp(0)).unwrap_err();
        assert_eq!(e.code, ErrorCode::BudgetExhausted);
        assert_eq!(e.status(), 402);
        assert_eq!(e.code.kind(), "insufficient_quota");
        assert_eq!(e.retry_after, None);
    }

    #[test]
    fn refuses_a_hold_beside_running_holds_with_429() {
        let mut s = store_with(10, 4);
        admit(&mut s, "k", "r1", 6, Timestamp(0)).unwrap();
        let e = admit(&mut s, "k", "r2", 6, Timestamp(0)).unwrap_err();
        assert_eq!(e.code, ErrorCode::BudgetHeld);
        assert_eq!(e.retry_after, Some(RETRY_AFTER_SECONDS));
        settle(&mut s, "r1", 2).unwrap();
        admit(&mut s, "k", "r2", 6, Timestamp(0)).unwrap();
    }

    #[test]
    fn refuses_past_the_running_limit() {
        let mut s = store_with(100, 2);
        admit(&mut s, "k", "a", 1, Timestamp(0)).unwrap();
        admit(&mut s, "k", "b", 1, Timestamp(0)).unwrap();
        let e = admit(&mut s, "k", "c", 1, Timestamp(0)).unwrap_err();
        assert_eq!(e.code, ErrorCode::TooManyRunning);
        assert_eq!(e.status(), 429);
        assert!(e.retry_after.is_some());
    }

    #[test]
    fn settle_charges_usage_and_releases_the_rest_once() {
        let mut s = store_with(100, 4);
        admit(&mut s, "k", "r", 40, Timestamp(0)).unwrap();
        assert_eq!(view(&s, "k").unwrap().tokens_held, 40);
        let st = settle(&mut s, "r", 15).unwrap().unwrap();
        assert_eq!(
            st,
            Settlement {
                charged: 15,
                released: 25
            }
        );
        assert_eq!(settle(&mut s, "r", 15).unwrap(), None, "released once");
        let v = view(&s, "k").unwrap();
        assert_eq!((v.tokens_left, v.tokens_held, v.running), (85, 0, 0));
    }

    #[test]
    fn settle_never_charges_beyond_the_hold() {
        let mut s = store_with(100, 4);
        admit(&mut s, "k", "r", 10, Timestamp(0)).unwrap();
        let st = settle(&mut s, "r", 1_000).unwrap().unwrap();
        assert_eq!(st.charged, 10);
        assert_eq!(view(&s, "k").unwrap().tokens_left, 90);
    }

    #[test]
    fn unknown_key_has_nothing() {
        let mut s = MemoryStore::new();
        let e = admit(&mut s, "nobody", "r", 1, Timestamp(0)).unwrap_err();
        assert_eq!(e.code, ErrorCode::BudgetExhausted);
    }

    #[test]
    fn release_all_frees_every_hold_uncharged() {
        let mut s = store_with(100, 4);
        admit(&mut s, "k", "a", 10, Timestamp(0)).unwrap();
        admit(&mut s, "k", "b", 20, Timestamp(0)).unwrap();
        assert_eq!(release_all(&mut s).unwrap(), 2);
        let v = view(&s, "k").unwrap();
        assert_eq!((v.tokens_left, v.tokens_held, v.running), (100, 0, 0));
    }
}
