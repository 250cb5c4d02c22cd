//! The token ledger: Budgets, Holds and the running-request limit.
//!
//! A request takes one Hold when it starts (its prompts' tokens plus
//! `prompts × n × max_tokens`); when it ends, [`settle`] charges its real usage and
//! releases the rest. A Hold is removed by the same step that charges it, so it can be
//! released exactly once, and the charge never exceeds the Hold or the Budget.

use crate::clock::Timestamp;
use crate::error::{ApiError, ErrorCode};
use crate::response::BudgetView;
use crate::sql::MAX_SAFE_INTEGER;
use crate::store::{Budget, Hold, Store};

/// Seconds a refused request should wait before it tries again.
pub const RETRY_AFTER_SECONDS: u32 = 1;

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
/// - 429 `budget_held` when it fits the Budget but not beside the running Holds.
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
