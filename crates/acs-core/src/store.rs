//! Where keys, budgets, holds, jobs, results and idempotency records live.
//!
//! The rules ([`crate::ledger`], [`crate::jobs`]) are written once against this trait;
//! the server backs it with SQLite, the edge with Durable Object storage, tests and the
//! browser with [`MemoryStore`]. Callers run each rule inside one transaction of their
//! backend, so a rule's reads and writes are atomic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::ApiError;
use crate::ids::{JobId, KeyHash};
use crate::job::{Job, JobResult, JobStatus};

/// A storage backend failed (disk, database, network).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage failed: {0}")]
pub struct StoreError(pub String);

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::internal(e.to_string())
    }
}

/// Results of the store.
pub type StoreResult<T> = Result<T, StoreError>;

/// An API key; the secret itself is never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// A short public id (`key_…`), for listings and logs.
    pub id: String,
    /// SHA-256 of the secret.
    pub hash: KeyHash,
    /// A label for people.
    pub name: Option<String>,
    /// When it was made.
    pub created_at: Timestamp,
    /// A revoked key authenticates nothing.
    pub revoked: bool,
}

/// A key's Budget and traffic limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Tokens not yet charged.
    pub tokens_left: u64,
    /// How many requests of the key may run at once.
    pub max_running: u32,
}

impl Budget {
    /// What a key without a Budget has: nothing.
    pub const NONE: Budget = Budget {
        tokens_left: 0,
        max_running: 0,
    };
}

/// A key's per-minute traffic limits, and what the current minute has used of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Requests the key may start in a minute; `None`: no limit.
    pub requests_per_minute: Option<u32>,
    /// Tokens the key's requests may hold in a minute; `None`: no limit.
    pub tokens_per_minute: Option<u64>,
    /// The start of the minute the counts are of (a multiple of 60 s).
    pub window_start: Timestamp,
    /// Requests started in that minute.
    pub requests: u32,
    /// Tokens held by the requests started in that minute, less what they gave back
    /// when they ended.
    pub tokens: u64,
}

/// Tokens set aside for one running request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The request id of the request that holds it (one Hold per request).
    pub id: String,
    /// The key whose Budget it draws on.
    pub key_id: String,
    /// Tokens held.
    pub tokens: u64,
    /// When it was taken.
    pub created_at: Timestamp,
}

/// Where an idempotency key stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdempotencyState {
    /// The first request with this key is still being accepted.
    Accepting,
    /// The first request made this job.
    Done(JobId),
}

/// What an idempotency key was first used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// The API key it is scoped to.
    pub key_id: String,
    /// The `Idempotency-Key` header.
    pub idempotency_key: String,
    /// SHA-256 of the canonical body.
    pub body_digest: String,
    /// Accepting or done.
    pub state: IdempotencyState,
    /// When it was first seen; kept 24 h from then.
    pub created_at: Timestamp,
}

/// The storage the rules need. Every method is one small read or write.
pub trait Store {
    /// The key with this hash.
    fn key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>>;
    /// The key with this id.
    fn key(&self, id: &str) -> StoreResult<Option<ApiKey>>;
    /// Every key.
    fn keys(&self) -> StoreResult<Vec<ApiKey>>;
    /// Inserts or replaces a key.
    fn put_key(&mut self, key: &ApiKey) -> StoreResult<()>;

    /// A key's Budget.
    fn budget(&self, key_id: &str) -> StoreResult<Option<Budget>>;
    /// Inserts or replaces a key's Budget.
    fn put_budget(&mut self, key_id: &str, budget: &Budget) -> StoreResult<()>;

    /// A key's per-minute limits and counts, if it has limits.
    fn rate(&self, key_id: &str) -> StoreResult<Option<Rate>>;
    /// Inserts or replaces a key's per-minute limits and counts.
    fn put_rate(&mut self, key_id: &str, rate: &Rate) -> StoreResult<()>;

    /// The Holds of one key.
    fn holds(&self, key_id: &str) -> StoreResult<Vec<Hold>>;
    /// Every Hold of every key.
    fn all_holds(&self) -> StoreResult<Vec<Hold>>;
    /// Inserts a Hold.
    fn put_hold(&mut self, hold: &Hold) -> StoreResult<()>;
    /// Removes and returns a Hold; `None` if it is gone already.
    fn take_hold(&mut self, id: &str) -> StoreResult<Option<Hold>>;

    /// A job.
    fn job(&self, id: JobId) -> StoreResult<Option<Job>>;
    /// Inserts or replaces a job.
    fn put_job(&mut self, job: &Job) -> StoreResult<()>;
    /// A key's jobs, newest first, only those older than `before` when given.
    fn jobs_of(&self, key_id: &str, before: Option<JobId>, limit: usize) -> StoreResult<Vec<Job>>;
    /// Every job in `status`, oldest first.
    fn jobs_with_status(&self, status: JobStatus) -> StoreResult<Vec<Job>>;
    /// How many of `key_id`'s jobs are queued.
    fn queued_jobs_of(&self, key_id: &str) -> StoreResult<u64>;

    /// Stores a finished job's result.
    fn put_result(&mut self, id: JobId, result: &JobResult) -> StoreResult<()>;
    /// A job's result, if still kept.
    fn result(&self, id: JobId) -> StoreResult<Option<JobResult>>;
    /// Deletes the results of finished jobs whose `expires_at` is at or before `now`;
    /// returns how many went.
    fn purge_results(&mut self, now: Timestamp) -> StoreResult<usize>;
    /// Deletes the jobs whose results expired before `before` (with any result
    /// left); returns how many.
    fn purge_jobs(&mut self, before: Timestamp) -> StoreResult<usize>;
    /// Each key's oldest queued job, oldest first.
    fn oldest_queued_per_key(&self) -> StoreResult<Vec<Job>>;

    /// An idempotency record.
    fn idempotency(&self, key_id: &str, idem: &str) -> StoreResult<Option<IdempotencyRecord>>;
    /// Inserts or replaces an idempotency record.
    fn put_idempotency(&mut self, rec: &IdempotencyRecord) -> StoreResult<()>;
    /// Deletes an idempotency record.
    fn delete_idempotency(&mut self, key_id: &str, idem: &str) -> StoreResult<()>;
    /// Deletes records created before `before`; returns how many went.
    fn purge_idempotency(&mut self, before: Timestamp) -> StoreResult<usize>;
}

/// A [`Store`] in memory: for tests, the browser and single-process use.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    keys: BTreeMap<String, ApiKey>,
    budgets: BTreeMap<String, Budget>,
    rates: BTreeMap<String, Rate>,
    holds: BTreeMap<String, Hold>,
    jobs: BTreeMap<JobId, Job>,
    results: BTreeMap<JobId, JobResult>,
    idempotency: BTreeMap<(String, String), IdempotencyRecord>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything the store holds, to be kept elsewhere (the browser keeps it in
    /// IndexedDB so that jobs survive a reload).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            keys: self.keys.values().cloned().collect(),
            budgets: self.budgets.clone(),
            rates: self.rates.clone(),
            holds: self.holds.values().cloned().collect(),
            jobs: self.jobs.values().cloned().collect(),
            results: self
                .results
                .iter()
                .map(|(id, r)| (*id, r.clone()))
                .collect(),
            idempotency: self.idempotency.values().cloned().collect(),
        }
    }

    /// The store a [`Snapshot`] was taken of.
    pub fn from_snapshot(s: Snapshot) -> Self {
        MemoryStore {
            keys: s.keys.into_iter().map(|k| (k.id.clone(), k)).collect(),
            budgets: s.budgets,
            rates: s.rates,
            holds: s.holds.into_iter().map(|h| (h.id.clone(), h)).collect(),
            jobs: s.jobs.into_iter().map(|j| (j.id, j)).collect(),
            results: s.results.into_iter().collect(),
            idempotency: s
                .idempotency
                .into_iter()
                .map(|r| ((r.key_id.clone(), r.idempotency_key.clone()), r))
                .collect(),
        }
    }
}

/// A [`MemoryStore`]'s contents in a serialisable form.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Keys.
    pub keys: Vec<ApiKey>,
    /// Budgets by key id.
    pub budgets: BTreeMap<String, Budget>,
    /// Per-minute limits by key id (absent from snapshots made before them).
    #[serde(default)]
    pub rates: BTreeMap<String, Rate>,
    /// Holds.
    pub holds: Vec<Hold>,
    /// Jobs.
    pub jobs: Vec<Job>,
    /// Results of finished jobs.
    pub results: Vec<(JobId, JobResult)>,
    /// Idempotency records.
    pub idempotency: Vec<IdempotencyRecord>,
}

impl Store for MemoryStore {
    fn key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        Ok(self.keys.values().find(|k| &k.hash == hash).cloned())
    }
    fn key(&self, id: &str) -> StoreResult<Option<ApiKey>> {
        Ok(self.keys.get(id).cloned())
    }
    fn keys(&self) -> StoreResult<Vec<ApiKey>> {
        Ok(self.keys.values().cloned().collect())
    }
    fn put_key(&mut self, key: &ApiKey) -> StoreResult<()> {
        self.keys.insert(key.id.clone(), key.clone());
        Ok(())
    }
    fn budget(&self, key_id: &str) -> StoreResult<Option<Budget>> {
        Ok(self.budgets.get(key_id).copied())
    }
    fn put_budget(&mut self, key_id: &str, budget: &Budget) -> StoreResult<()> {
        self.budgets.insert(key_id.to_owned(), *budget);
        Ok(())
    }
    fn rate(&self, key_id: &str) -> StoreResult<Option<Rate>> {
        Ok(self.rates.get(key_id).copied())
    }
    fn put_rate(&mut self, key_id: &str, rate: &Rate) -> StoreResult<()> {
        self.rates.insert(key_id.to_owned(), *rate);
        Ok(())
    }
    fn holds(&self, key_id: &str) -> StoreResult<Vec<Hold>> {
        Ok(self
            .holds
            .values()
            .filter(|h| h.key_id == key_id)
            .cloned()
            .collect())
    }
    fn all_holds(&self) -> StoreResult<Vec<Hold>> {
        Ok(self.holds.values().cloned().collect())
    }
    fn put_hold(&mut self, hold: &Hold) -> StoreResult<()> {
        self.holds.insert(hold.id.clone(), hold.clone());
        Ok(())
    }
    fn take_hold(&mut self, id: &str) -> StoreResult<Option<Hold>> {
        Ok(self.holds.remove(id))
    }
    fn job(&self, id: JobId) -> StoreResult<Option<Job>> {
        Ok(self.jobs.get(&id).cloned())
    }
    fn put_job(&mut self, job: &Job) -> StoreResult<()> {
        self.jobs.insert(job.id, job.clone());
        Ok(())
    }
    fn jobs_of(&self, key_id: &str, before: Option<JobId>, limit: usize) -> StoreResult<Vec<Job>> {
        Ok(self
            .jobs
            .values()
            .rev()
            .filter(|j| j.key_id == key_id && before.is_none_or(|b| j.id < b))
            .take(limit)
            .cloned()
            .collect())
    }
    fn jobs_with_status(&self, status: JobStatus) -> StoreResult<Vec<Job>> {
        Ok(self
            .jobs
            .values()
            .filter(|j| j.status == status)
            .cloned()
            .collect())
    }
    fn queued_jobs_of(&self, key_id: &str) -> StoreResult<u64> {
        Ok(self
            .jobs
            .values()
            .filter(|j| j.key_id == key_id && j.status == JobStatus::Queued)
            .count() as u64)
    }
    fn put_result(&mut self, id: JobId, result: &JobResult) -> StoreResult<()> {
        self.results.insert(id, result.clone());
        Ok(())
    }
    fn result(&self, id: JobId) -> StoreResult<Option<JobResult>> {
        Ok(self.results.get(&id).cloned())
    }
    fn purge_jobs(&mut self, before: Timestamp) -> StoreResult<usize> {
        let gone: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.expires_at.is_some_and(|e| e < before))
            .map(|j| j.id)
            .collect();
        for id in &gone {
            self.jobs.remove(id);
            self.results.remove(id);
        }
        Ok(gone.len())
    }
    fn oldest_queued_per_key(&self) -> StoreResult<Vec<Job>> {
        let mut seen = std::collections::HashSet::new();
        // The map is ordered by id, and a UUIDv7 id by creation time.
        Ok(self
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Queued && seen.insert(j.key_id.clone()))
            .cloned()
            .collect())
    }
    fn purge_results(&mut self, now: Timestamp) -> StoreResult<usize> {
        let before = self.results.len();
        let jobs = &self.jobs;
        self.results.retain(|id, _| {
            jobs.get(id)
                .and_then(|j| j.expires_at)
                .is_none_or(|e| e > now)
        });
        Ok(before - self.results.len())
    }
    fn idempotency(&self, key_id: &str, idem: &str) -> StoreResult<Option<IdempotencyRecord>> {
        Ok(self
            .idempotency
            .get(&(key_id.to_owned(), idem.to_owned()))
            .cloned())
    }
    fn put_idempotency(&mut self, rec: &IdempotencyRecord) -> StoreResult<()> {
        self.idempotency.insert(
            (rec.key_id.clone(), rec.idempotency_key.clone()),
            rec.clone(),
        );
        Ok(())
    }
    fn delete_idempotency(&mut self, key_id: &str, idem: &str) -> StoreResult<()> {
        self.idempotency
            .remove(&(key_id.to_owned(), idem.to_owned()));
        Ok(())
    }
    fn purge_idempotency(&mut self, before: Timestamp) -> StoreResult<usize> {
        let n = self.idempotency.len();
        self.idempotency.retain(|_, r| r.created_at >= before);
        Ok(n - self.idempotency.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{jobs, ledger};

    #[test]
    fn a_snapshot_restores_the_same_store_through_json() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let mut s = MemoryStore::new();
        s.put_budget(
            "key_a",
            &Budget {
                tokens_left: 100,
                max_running: 2,
            },
        )
        .unwrap();
        ledger::admit(&mut s, "key_a", "req_1", 40, now).unwrap();
        let job = Job::new(JobId::new_v7(now, [7; 10]), "key_a", "m", "{}".into(), now);
        let jobs::Begin::New(claim) = jobs::begin(
            &mut s,
            "key_a",
            Some("idem-1"),
            "digest",
            now,
            Timestamp::DAY_MS,
        )
        .unwrap() else {
            panic!("a new key")
        };
        let job = jobs::create(&mut s, job, &claim, 1).unwrap();
        let json = serde_json::to_string(&s.snapshot()).unwrap();
        let back = MemoryStore::from_snapshot(serde_json::from_str(&json).unwrap());
        assert_eq!(back.snapshot(), s.snapshot());
        assert_eq!(back.holds("key_a").unwrap().len(), 1);
        assert_eq!(back.job(job.id).unwrap(), Some(job));
        assert!(back.idempotency("key_a", "idem-1").unwrap().is_some());
    }
}
