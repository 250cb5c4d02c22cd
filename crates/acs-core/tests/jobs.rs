//! Jobs over the in-memory store: the tutorial's objects, idempotency, start, cancel,
//! results, expiry and recovery.

use acs_core::job::JobResult;
use acs_core::jobs::{self, Begin, Start};
use acs_core::response::{Completion, Usage};
use acs_core::{
    Answer, ApiError, Budget, ErrorCode, Job, JobId, JobStatus, MemoryStore, Outcome, Store,
    Timestamp, ledger,
};

const DAY: i64 = Timestamp::DAY_MS;

fn t(text: &str) -> Timestamp {
    Timestamp::parse(text).unwrap()
}

fn tutorial_id() -> JobId {
    "01a19d8b-338e-7a52-9329-6190679221fa".parse().unwrap()
}

fn store(tokens: u64, max_running: u32) -> MemoryStore {
    let mut s = MemoryStore::new();
    s.put_budget(
        "k",
        &Budget {
            tokens_left: tokens,
            max_running,
        },
    )
    .unwrap();
    s.put_budget(
        "other",
        &Budget {
            tokens_left: tokens,
            max_running,
        },
    )
    .unwrap();
    s
}

fn completion() -> Answer {
    Answer::Text(Completion {
        id: "cmpl-1".into(),
        object: "text_completion".into(),
        created: 1,
        model: "llama-8b".into(),
        choices: vec![],
        usage: Usage::default(),
        activations: None,
    })
}

fn submit(
    s: &mut MemoryStore,
    key: &str,
    idem: Option<&str>,
    body: &str,
    now: Timestamp,
    r: u8,
) -> Result<(Job, bool), ApiError> {
    let digest = acs_core::ids::body_digest(body);
    match jobs::begin(s, key, idem, &digest, now, DAY)? {
        Begin::Replay(j) => Ok((j, true)),
        Begin::New(claim) => {
            let job = Job::new(
                JobId::new_v7(now, [r; 10]),
                key,
                "llama-8b",
                body.into(),
                now,
            );
            Ok((jobs::create(s, job, &claim, jobs::MAX_QUEUED_JOBS)?, false))
        }
    }
}

#[test]
fn queued_job_serialises_like_the_tutorial_202() {
    let job = Job::new(
        tutorial_id(),
        "k",
        "llama-8b",
        "{}".into(),
        t("2026-11-02T18:35:08.037+00:00"),
    );
    let view = job.view(t("2026-11-02T18:35:08.040+00:00"));
    // The tutorial prints this answer with its keys sorted.
    let sorted: serde_json::Value = serde_json::to_value(&view).unwrap();
    let expected = r#"{
  "cancel_requested": false,
  "created_at": "2026-11-02T18:35:08.037+00:00",
  "expires_at": null,
  "finished_at": null,
  "id": "01a19d8b-338e-7a52-9329-6190679221fa",
  "model": "llama-8b",
  "request_id": "req_job_01a19d8b338e7a5293296190679221fa",
  "result_expired": false,
  "result_url": "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa/result",
  "started_at": null,
  "status": "queued",
  "status_url": "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa",
  "usage_pending": false
}"#;
    let sorted_text = serde_json::to_string_pretty(&sort_keys(&sorted)).unwrap();
    assert_eq!(sorted_text, expected);
}

fn sort_keys(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for k in keys {
                out.insert(k.clone(), sort_keys(&m[k]));
            }
            serde_json::Value::Object(out)
        }
        other => other.clone(),
    }
}

#[test]
fn succeeded_job_serialises_byte_for_byte_like_the_tutorial() {
    let mut job = Job::new(
        tutorial_id(),
        "k",
        "llama-8b",
        "{}".into(),
        t("2026-11-02T18:35:08.037+00:00"),
    );
    job.start(t("2026-11-02T18:35:08.065+00:00")).unwrap();
    job.finish(
        JobStatus::Succeeded,
        t("2026-11-02T18:35:08.132+00:00"),
        DAY,
    )
    .unwrap();
    let text = serde_json::to_string_pretty(&job.view(t("2026-11-02T18:40:00.000+00:00"))).unwrap();
    let expected = r#"{
  "id": "01a19d8b-338e-7a52-9329-6190679221fa",
  "request_id": "req_job_01a19d8b338e7a5293296190679221fa",
  "model": "llama-8b",
  "status": "succeeded",
  "cancel_requested": false,
  "created_at": "2026-11-02T18:35:08.037+00:00",
  "started_at": "2026-11-02T18:35:08.065+00:00",
  "finished_at": "2026-11-02T18:35:08.132+00:00",
  "expires_at": "2026-11-03T18:35:08.132+00:00",
  "result_expired": false,
  "status_url": "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa",
  "result_url": "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa/result",
  "usage_pending": false
}"#;
    assert_eq!(text, expected);
}

#[test]
fn idempotency_same_body_replays_other_body_is_422() {
    let mut s = store(1000, 4);
    let now = Timestamp(1_000_000);
    let (a, replayed) = submit(&mut s, "k", Some("rollouts-001"), r#"{"a":1}"#, now, 1).unwrap();
    assert!(!replayed);
    let (b, replayed) = submit(&mut s, "k", Some("rollouts-001"), r#"{"a":1}"#, now, 2).unwrap();
    assert!(replayed);
    assert_eq!(a.id, b.id);
    let e = submit(&mut s, "k", Some("rollouts-001"), r#"{"a":2}"#, now, 3).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::IdempotencyKeyReused, 422));
    // Scoped per API key: another key may use the same idempotency key.
    let (c, replayed) =
        submit(&mut s, "other", Some("rollouts-001"), r#"{"a":2}"#, now, 4).unwrap();
    assert!(!replayed);
    assert_ne!(c.id, a.id);
    // Kept 24 h: after that the key makes a new job.
    let (d, replayed) = submit(
        &mut s,
        "k",
        Some("rollouts-001"),
        r#"{"a":2}"#,
        now.plus_millis(DAY),
        5,
    )
    .unwrap();
    assert!(!replayed);
    assert_ne!(d.id, a.id);
    assert_eq!(
        jobs::purge(&mut s, now.plus_millis(DAY + 1), DAY)
            .unwrap()
            .1,
        1,
        "the old record of key 'other' is purged"
    );
}

#[test]
fn idempotency_key_being_accepted_is_409_until_it_times_out() {
    let mut s = store(1000, 4);
    let now = Timestamp(5_000);
    let d = acs_core::ids::body_digest("{}");
    assert!(matches!(
        jobs::begin(&mut s, "k", Some("x"), &d, now, DAY).unwrap(),
        Begin::New(_)
    ));
    let e = jobs::begin(&mut s, "k", Some("x"), &d, now.plus_millis(10), DAY).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::IdempotencyKeyInUse, 409));
    // A different body is still reuse, even while accepting.
    let other = acs_core::ids::body_digest("{\"b\":1}");
    assert_eq!(
        jobs::begin(&mut s, "k", Some("x"), &other, now, DAY)
            .unwrap_err()
            .code,
        ErrorCode::IdempotencyKeyReused
    );
    // Abandoned after a validation error: the key is free again.
    let Begin::New(first) = jobs::begin(&mut s, "k", Some("y"), &d, now, DAY).unwrap() else {
        panic!("a new key")
    };
    jobs::abandon(&mut s, "k", &first).unwrap();
    assert!(matches!(
        jobs::begin(&mut s, "k", Some("y"), &other, now, DAY).unwrap(),
        Begin::New(_)
    ));
    // A first request that died mid-acceptance does not block the key forever.
    let later = now.plus_millis(jobs::ACCEPTING_TIMEOUT_MS + 1);
    assert!(matches!(
        jobs::begin(&mut s, "k", Some("x"), &d, later, DAY).unwrap(),
        Begin::New(_)
    ));
}

/// A first submission that was slow past the claim's timeout, so that a second one
/// with the same key took the claim over, makes no job of its own (409: the key is
/// the second's) and does not free the second's claim when it gives up; one job
/// comes of the key, whichever finishes first.
#[test]
fn a_claim_taken_over_makes_no_second_job() {
    let mut s = store(1000, 4);
    let d = acs_core::ids::body_digest("{}");
    let t0 = Timestamp(5_000);
    let job = |r: u8, t| Job::new(JobId::new_v7(t, [r; 10]), "k", "m", "{}".into(), t);
    let Begin::New(slow) = jobs::begin(&mut s, "k", Some("x"), &d, t0, DAY).unwrap() else {
        panic!("a new key")
    };
    let t1 = t0.plus_millis(jobs::ACCEPTING_TIMEOUT_MS + 1);
    let Begin::New(second) = jobs::begin(&mut s, "k", Some("x"), &d, t1, DAY).unwrap() else {
        panic!("the stale claim is taken over")
    };
    let e = jobs::create(&mut s, job(1, t1), &slow, 8).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::IdempotencyKeyInUse, 409));
    jobs::abandon(&mut s, "k", &slow).unwrap();
    let made = jobs::create(&mut s, job(2, t1), &second, 8).unwrap();
    match jobs::begin(&mut s, "k", Some("x"), &d, t1, DAY).unwrap() {
        Begin::Replay(j) => assert_eq!(j.id, made.id),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.jobs_of("k", None, 10).unwrap().len(), 1);
    // Once the key made its job, a claim from before cannot make another.
    assert!(jobs::create(&mut s, job(3, t1), &slow, 8).is_err());
}

#[test]
fn bad_idempotency_keys_are_refused() {
    let mut s = store(1000, 4);
    let long = "a".repeat(256);
    for bad in ["", long.as_str(), "tab\there", "é"] {
        let e = jobs::begin(&mut s, "k", Some(bad), "d", Timestamp(0), DAY).unwrap_err();
        assert_eq!(
            (e.code, e.status()),
            (ErrorCode::InvalidIdempotencyKey, 400),
            "{bad:?}"
        );
    }
    assert!(jobs::check_idempotency_key(&"a".repeat(255)).is_ok());
}

#[test]
fn job_takes_its_hold_when_it_starts_and_is_charged_once() {
    let mut s = store(100, 4);
    let now = Timestamp(0);
    let (job, _) = submit(&mut s, "k", None, "{}", now, 1).unwrap();
    assert_eq!(
        ledger::view(&s, "k").unwrap().tokens_held,
        0,
        "queued jobs hold nothing"
    );
    let Start::Started(job) = jobs::start(&mut s, job.id, 30, now.plus_millis(5), DAY).unwrap()
    else {
        panic!("should start")
    };
    assert!(job.usage_pending);
    assert_eq!(job.status, JobStatus::Running);
    assert_eq!(ledger::view(&s, "k").unwrap().tokens_held, 30);
    let (job, settled) = jobs::finish(
        &mut s,
        job.id,
        Outcome::Succeeded(completion()),
        12,
        now.plus_millis(9),
        DAY,
    )
    .unwrap();
    assert_eq!(settled.unwrap().charged, 12);
    assert!(!job.usage_pending);
    let v = ledger::view(&s, "k").unwrap();
    assert_eq!((v.tokens_left, v.tokens_held, v.running), (88, 0, 0));
    assert_eq!(
        jobs::result(&s, "k", job.id, now.plus_millis(10)).unwrap(),
        completion()
    );
    // A second finish is refused and charges nothing.
    assert!(jobs::finish(&mut s, job.id, Outcome::Cancelled, 12, now, DAY).is_err());
    assert_eq!(ledger::view(&s, "k").unwrap().tokens_left, 88);
}

/// A result over `MAX_RESULT_BYTES` is not stored: the job fails with
/// `result_too_large`, is charged what it generated, and its Hold is released.
#[test]
fn a_result_too_large_to_store_fails_the_job_charged_once() {
    let mut s = store(100, 4);
    let now = Timestamp(0);
    let (job, _) = submit(&mut s, "k", None, "{}", now, 1).unwrap();
    let Start::Started(job) = jobs::start(&mut s, job.id, 30, now, DAY).unwrap() else {
        panic!("should start")
    };
    let Answer::Text(mut big) = completion() else {
        unreachable!()
    };
    big.id = "x".repeat(jobs::MAX_RESULT_BYTES);
    let big = Answer::Text(big);
    let (job, settled) =
        jobs::finish(&mut s, job.id, Outcome::Succeeded(big), 12, now, DAY).unwrap();
    assert_eq!(job.status, JobStatus::Failed);
    assert_eq!(settled.unwrap().charged, 12);
    let v = ledger::view(&s, "k").unwrap();
    assert_eq!((v.tokens_left, v.tokens_held, v.running), (88, 0, 0));
    let e = jobs::result(&s, "k", job.id, now).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::ResultTooLarge, 413));
    assert!(e.message.contains("16 MiB"), "{}", e.message);
}

#[test]
fn a_job_that_can_never_fit_fails_with_402_as_its_result() {
    let mut s = store(10, 4);
    let (job, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 1).unwrap();
    let Start::Failed(job) = jobs::start(&mut s, job.id, 11, Timestamp(1), DAY).unwrap() else {
        panic!("should fail")
    };
    assert_eq!(job.status, JobStatus::Failed);
    assert!(!job.usage_pending);
    let e = jobs::result(&s, "k", job.id, Timestamp(2)).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::BudgetExhausted, 402));
}

#[test]
fn a_job_waits_while_its_hold_does_not_fit_yet() {
    let mut s = store(10, 4);
    ledger::admit(&mut s, "k", "other-request", 8, Timestamp(0)).unwrap();
    let (job, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 1).unwrap();
    let Start::Waiting(e) = jobs::start(&mut s, job.id, 5, Timestamp(1), DAY).unwrap() else {
        panic!("should wait")
    };
    assert_eq!(e.code, ErrorCode::BudgetHeld);
    assert_eq!(s.job(job.id).unwrap().unwrap().status, JobStatus::Queued);
    ledger::settle(&mut s, "other-request", 0).unwrap();
    assert!(matches!(
        jobs::start(&mut s, job.id, 5, Timestamp(2), DAY).unwrap(),
        Start::Started(_)
    ));
}

#[test]
fn cancel_queued_at_once_running_at_next_token() {
    let mut s = store(100, 4);
    let (q, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 1).unwrap();
    let q = jobs::cancel(&mut s, "k", q.id, Timestamp(3), DAY).unwrap();
    assert_eq!(
        (q.status, q.cancel_requested, q.finished_at),
        (JobStatus::Cancelled, true, Some(Timestamp(3)))
    );
    let e = jobs::result(&s, "k", q.id, Timestamp(4)).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::JobCancelled, 409));

    let (r, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 2).unwrap();
    jobs::start(&mut s, r.id, 20, Timestamp(1), DAY).unwrap();
    let r = jobs::cancel(&mut s, "k", r.id, Timestamp(2), DAY).unwrap();
    assert_eq!((r.status, r.cancel_requested), (JobStatus::Running, true));
    let e = jobs::result(&s, "k", r.id, Timestamp(2)).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::JobNotFinished, 409));
    let (r, settled) =
        jobs::finish(&mut s, r.id, Outcome::Cancelled, 3, Timestamp(5), DAY).unwrap();
    assert_eq!(r.status, JobStatus::Cancelled);
    assert_eq!(settled.unwrap().charged, 3, "charged what it generated");
    // Cancelling a finished job changes nothing.
    assert_eq!(
        jobs::cancel(&mut s, "k", r.id, Timestamp(6), DAY).unwrap(),
        r
    );
}

#[test]
fn another_keys_job_is_404() {
    let mut s = store(100, 4);
    let (j, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 1).unwrap();
    for e in [
        jobs::owned(&s, "other", j.id).unwrap_err(),
        jobs::cancel(&mut s, "other", j.id, Timestamp(1), DAY).unwrap_err(),
        jobs::result(&s, "other", j.id, Timestamp(1)).unwrap_err(),
    ] {
        assert_eq!((e.code, e.status()), (ErrorCode::NotFound, 404));
    }
    assert_eq!(jobs::parse_id("nope").unwrap_err().status(), 404);
    assert!(
        jobs::list(&s, "other", None, None, Timestamp(1))
            .unwrap()
            .data
            .is_empty()
    );
}

#[test]
fn results_expire_after_retention() {
    let mut s = store(100, 4);
    let (j, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 1).unwrap();
    jobs::start(&mut s, j.id, 20, Timestamp(1), 1000).unwrap();
    let (j, _) = jobs::finish(
        &mut s,
        j.id,
        Outcome::Succeeded(completion()),
        1,
        Timestamp(2),
        1000,
    )
    .unwrap();
    assert_eq!(j.expires_at, Some(Timestamp(1002)));
    assert!(jobs::result(&s, "k", j.id, Timestamp(1001)).is_ok());
    let e = jobs::result(&s, "k", j.id, Timestamp(1002)).unwrap_err();
    assert_eq!((e.code, e.status()), (ErrorCode::ResultExpired, 410));
    assert!(j.view(Timestamp(1002)).result_expired);
    assert_eq!(jobs::purge(&mut s, Timestamp(1002), 1000).unwrap().0, 1);
    assert!(s.result(j.id).unwrap().is_none());
    assert_eq!(
        jobs::result(&s, "k", j.id, Timestamp(1003))
            .unwrap_err()
            .code,
        ErrorCode::ResultExpired
    );
    // A day after its result expired, the job itself goes: 404, and off the list.
    let later = Timestamp(1002).plus_millis(jobs::EXPIRED_JOB_KEPT_MS);
    assert_eq!(jobs::purge(&mut s, later, 1000).unwrap().2, 0, "not yet");
    assert!(s.job(j.id).unwrap().is_some());
    assert_eq!(
        jobs::purge(&mut s, later.plus_millis(1), 1000).unwrap().2,
        1
    );
    let e = jobs::owned(&s, "k", j.id).unwrap_err();
    assert_eq!(e.status(), 404);
    assert!(s.jobs_of("k", None, 10).unwrap().is_empty());
}

/// A dispatch pass looks at each key's oldest queued job only.
#[test]
fn the_oldest_queued_job_of_each_key() {
    let mut s = store(1000, 4);
    let mut made = Vec::new();
    for (i, key) in ["k", "other", "k", "other", "k"].iter().enumerate() {
        let (j, _) = submit(&mut s, key, None, "{}", Timestamp(i as i64 * 10), i as u8).unwrap();
        made.push(j.id);
    }
    let oldest = |s: &MemoryStore| -> Vec<JobId> {
        let queued = s.oldest_queued_per_key().unwrap();
        queued.iter().map(|j| j.id).collect()
    };
    assert_eq!(oldest(&s), vec![made[0], made[1]]);
    jobs::start(&mut s, made[0], 1, Timestamp(100), DAY).unwrap();
    assert_eq!(oldest(&s), vec![made[1], made[2]]);
}

#[test]
fn list_is_newest_first_with_limit_and_after() {
    let mut s = store(100, 4);
    let ids: Vec<JobId> = (0..5)
        .map(|i| {
            submit(&mut s, "k", None, "{}", Timestamp(i * 10), i as u8)
                .unwrap()
                .0
                .id
        })
        .collect();
    let page = jobs::list(&s, "k", Some("2"), None, Timestamp(100)).unwrap();
    assert_eq!(
        page.data.iter().map(|j| j.id.clone()).collect::<Vec<_>>(),
        vec![ids[4].to_string(), ids[3].to_string()]
    );
    assert!(page.has_more);
    let next = jobs::list(&s, "k", Some("10"), page.last_id.as_deref(), Timestamp(100)).unwrap();
    assert_eq!(next.data.len(), 3);
    assert_eq!(next.data[0].id, ids[2].to_string());
    assert!(!next.has_more);
    for bad in ["0", "101", "x"] {
        assert_eq!(
            jobs::list(&s, "k", Some(bad), None, Timestamp(0))
                .unwrap_err()
                .param
                .as_deref(),
            Some("limit")
        );
    }
    assert_eq!(
        jobs::list(&s, "k", None, Some("zz"), Timestamp(0))
            .unwrap_err()
            .param
            .as_deref(),
        Some("after")
    );
}

#[test]
fn recovery_releases_holds_and_requeues_running_jobs() {
    let mut s = store(100, 4);
    let (j, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 1).unwrap();
    jobs::start(&mut s, j.id, 40, Timestamp(1), DAY).unwrap();
    ledger::admit(&mut s, "k", "a-completion", 10, Timestamp(1)).unwrap();
    assert_eq!(jobs::recover(&mut s, Timestamp(1), DAY).unwrap(), 1);
    let v = ledger::view(&s, "k").unwrap();
    assert_eq!((v.tokens_left, v.tokens_held, v.running), (100, 0, 0));
    let j = s.job(j.id).unwrap().unwrap();
    assert_eq!((j.status, j.usage_pending), (JobStatus::Queued, false));
    // It runs again and is charged once.
    jobs::start(&mut s, j.id, 40, Timestamp(2), DAY).unwrap();
    jobs::finish(
        &mut s,
        j.id,
        Outcome::Succeeded(completion()),
        7,
        Timestamp(3),
        DAY,
    )
    .unwrap();
    assert_eq!(ledger::view(&s, "k").unwrap().tokens_left, 93);
}

/// A job whose runs a stop of the server cut short `MAX_JOB_RUNS` times fails at the
/// next recovery instead of running again (a job that kills the process would kill
/// every restart), with an internal error as its result, charged nothing.
#[test]
fn a_job_cut_short_too_often_fails_instead_of_running_again() {
    let mut s = store(100, 4);
    let (j, _) = submit(&mut s, "k", None, "{}", Timestamp(0), 1).unwrap();
    for run in 1..=jobs::MAX_JOB_RUNS {
        jobs::start(&mut s, j.id, 40, Timestamp(run as i64), DAY).unwrap();
        let requeued = jobs::recover(&mut s, Timestamp(run as i64), DAY).unwrap();
        let j = s.job(j.id).unwrap().unwrap();
        if run < jobs::MAX_JOB_RUNS {
            assert_eq!((requeued, j.status), (1, JobStatus::Queued), "run {run}");
        } else {
            assert_eq!((requeued, j.status), (0, JobStatus::Failed), "run {run}");
            assert!(!j.usage_pending && j.expires_at.is_some());
        }
    }
    match s.result(j.id).unwrap() {
        Some(JobResult::Error(e)) => assert_eq!(e.error.code.as_deref(), Some("internal_error")),
        other => panic!("{other:?}"),
    }
    let v = ledger::view(&s, "k").unwrap();
    assert_eq!((v.tokens_left, v.tokens_held, v.running), (100, 0, 0));
}
