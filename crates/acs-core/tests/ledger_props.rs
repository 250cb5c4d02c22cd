//! Property tests: random interleavings of admit, settle, cancel, job starts and
//! finishes, expiry and restarts over many keys never overspend a Budget, never
//! release a Hold twice, and leave nothing held once every request has ended.

use std::collections::BTreeMap;

use acs_core::jobs::{self, Start};
use acs_core::response::{Completion, Usage};
use acs_core::{
    Answer, Budget, Job, JobId, JobStatus, MemoryStore, Outcome, Store, Timestamp, ledger,
};
use proptest::prelude::*;

const KEYS: usize = 4;
const RETENTION: i64 = 1_000;

#[derive(Debug, Clone)]
enum Op {
    /// A completion request of key `key` asks for a Hold of `tokens`.
    Admit { key: usize, tokens: u64 },
    /// The `pick`-th running completion ends having used `used` tokens.
    Settle { pick: usize, used: u64 },
    /// Settling the same Hold again (a duplicate end event).
    SettleAgain { pick: usize },
    /// A job is submitted.
    Submit { key: usize },
    /// The `pick`-th queued job tries to start with a Hold of `tokens`.
    StartJob { pick: usize, tokens: u64 },
    /// The `pick`-th running job ends.
    FinishJob {
        pick: usize,
        used: u64,
        cancelled: bool,
    },
    /// A cancel request for the `pick`-th job.
    Cancel { pick: usize },
    /// Time passes; expired results are purged.
    Tick { ms: i64 },
    /// The process crashes and restarts.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 0u64..120).prop_map(|(key, tokens)| Op::Admit { key, tokens }),
        3 => (any::<usize>(), 0u64..150).prop_map(|(pick, used)| Op::Settle { pick, used }),
        1 => any::<usize>().prop_map(|pick| Op::SettleAgain { pick }),
        2 => (0..KEYS).prop_map(|key| Op::Submit { key }),
        2 => (any::<usize>(), 0u64..120).prop_map(|(pick, tokens)| Op::StartJob { pick, tokens }),
        2 => (any::<usize>(), 0u64..150, any::<bool>()).prop_map(|(pick, used, cancelled)| Op::FinishJob { pick, used, cancelled }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (1i64..2_000).prop_map(|ms| Op::Tick { ms }),
        1 => Just(Op::Restart),
    ]
}

fn completion() -> Answer {
    Answer::Text(Completion {
        id: "c".into(),
        object: "text_completion".into(),
        created: 0,
        model: "m".into(),
        choices: vec![],
        usage: Usage::default(),
        activations: None,
    })
}

fn key(i: usize) -> String {
    format!("key{i}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn ledger_invariants_hold(
        budgets in proptest::collection::vec((0u64..400, 1u32..4), KEYS),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let mut s = MemoryStore::new();
        let mut charged = BTreeMap::<String, u64>::new();
        for (i, (tokens, max_running)) in budgets.iter().enumerate() {
            s.put_budget(&key(i), &Budget { tokens_left: *tokens, max_running: *max_running }).unwrap();
        }
        let mut now = Timestamp(1_000);
        let mut running: Vec<(String, String, u64)> = Vec::new(); // (hold id, key, tokens)
        let mut settled: Vec<String> = Vec::new();
        let mut next = 0u64;

        for op in ops {
            match op {
                Op::Admit { key: k, tokens } => {
                    next += 1;
                    let id = format!("req{next}");
                    if ledger::admit(&mut s, &key(k), &id, tokens, now).is_ok() {
                        running.push((id, key(k), tokens));
                    }
                }
                Op::Settle { pick, used } if !running.is_empty() => {
                    let (id, k, tokens) = running.remove(pick % running.len());
                    let st = ledger::settle(&mut s, &id, used).unwrap().expect("a running Hold settles");
                    prop_assert!(st.charged <= tokens && st.charged <= used);
                    prop_assert_eq!(st.charged + st.released, tokens);
                    *charged.entry(k).or_default() += st.charged;
                    settled.push(id);
                }
                Op::SettleAgain { pick } if !settled.is_empty() => {
                    let id = &settled[pick % settled.len()];
                    prop_assert_eq!(ledger::settle(&mut s, id, 50).unwrap(), None, "released twice");
                }
                Op::Submit { key: k } => {
                    next += 1;
                    // Distinct ids within one millisecond: the counter goes into the
                    // bits that UUIDv7 keeps as they are.
                    let mut random = [0u8; 10];
                    random[2..].copy_from_slice(&next.to_be_bytes());
                    let job = Job::new(JobId::new_v7(now, random), &key(k), "m", "{}".into(), now);
                    let Ok(jobs::Begin::New(claim)) = jobs::begin(&mut s, &key(k), None, "d", now, RETENTION) else {
                        unreachable!("a submission without a key is always new")
                    };
                    jobs::create(&mut s, job, &claim, u64::MAX).unwrap();
                }
                Op::StartJob { pick, tokens } => {
                    let queued = s.jobs_with_status(JobStatus::Queued).unwrap();
                    if !queued.is_empty() {
                        let j = &queued[pick % queued.len()];
                        match jobs::start(&mut s, j.id, tokens, now, RETENTION).unwrap() {
                            Start::Started(j) => prop_assert!(j.usage_pending),
                            Start::Failed(j) => prop_assert_eq!(j.status, JobStatus::Failed),
                            Start::Waiting(e) => prop_assert_eq!(e.status(), 429),
                        }
                    }
                }
                Op::FinishJob { pick, used, cancelled } => {
                    let run = s.jobs_with_status(JobStatus::Running).unwrap();
                    if !run.is_empty() {
                        let j = &run[pick % run.len()];
                        let held = s.all_holds().unwrap().into_iter().find(|h| h.id == j.hold_id()).expect("a running job holds").tokens;
                        let outcome = if cancelled { Outcome::Cancelled } else { Outcome::Succeeded(completion()) };
                        let (j, st) = jobs::finish(&mut s, j.id, outcome, used, now, RETENTION).unwrap();
                        let st = st.expect("settled once");
                        prop_assert!(st.charged <= held);
                        prop_assert!(!j.usage_pending);
                        *charged.entry(j.key_id.clone()).or_default() += st.charged;
                    }
                }
                Op::Cancel { pick } => {
                    let all: Vec<Job> = (0..KEYS).flat_map(|k| s.jobs_of(&key(k), None, 1000).unwrap()).collect();
                    if !all.is_empty() {
                        let j = &all[pick % all.len()];
                        let before = j.status;
                        let after = jobs::cancel(&mut s, &j.key_id, j.id, now, RETENTION).unwrap();
                        match before {
                            JobStatus::Queued => prop_assert_eq!(after.status, JobStatus::Cancelled),
                            JobStatus::Running => prop_assert!(after.cancel_requested && after.status == JobStatus::Running),
                            other => prop_assert_eq!(after.status, other),
                        }
                    }
                }
                Op::Tick { ms } => {
                    now = now.plus_millis(ms);
                    jobs::purge(&mut s, now, RETENTION).unwrap();
                }
                Op::Restart => {
                    jobs::recover(&mut s, now, RETENTION).unwrap();
                    running.clear();
                }
                _ => {}
            }
            // Invariant: per key, held ≤ tokens_left, and charges never exceed the budget.
            for (i, (initial, _)) in budgets.iter().enumerate() {
                let v = ledger::view(&s, &key(i)).unwrap();
                prop_assert!(v.tokens_held <= v.tokens_left, "held {} > left {}", v.tokens_held, v.tokens_left);
                let c = charged.get(&key(i)).copied().unwrap_or(0);
                prop_assert_eq!(v.tokens_left + c, *initial, "charged beyond the budget or lost tokens");
                prop_assert!(v.running <= v.max_running);
            }
        }
        // End every request: settle running completions, finish running jobs.
        for (id, k, _) in running.drain(..) {
            let st = ledger::settle(&mut s, &id, 0).unwrap().unwrap();
            *charged.entry(k).or_default() += st.charged;
        }
        for j in s.jobs_with_status(JobStatus::Running).unwrap() {
            jobs::finish(&mut s, j.id, Outcome::Cancelled, 0, now, RETENTION).unwrap();
        }
        prop_assert!(s.all_holds().unwrap().is_empty(), "held tokens return to zero");
        for i in 0..KEYS {
            let v = ledger::view(&s, &key(i)).unwrap();
            prop_assert_eq!((v.tokens_held, v.running), (0, 0));
        }
    }
}
