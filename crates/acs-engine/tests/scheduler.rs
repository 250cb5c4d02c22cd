//! The scheduler on a generated tiny model: indexing, branching, batching that changes
//! no result, seeds, stop sequences, streaming, cancellation, memory limits.

use std::sync::{Arc, Mutex};

use acs_core::{CompletionRequest, Endpoint, FinishReason};
use acs_engine::generation::model_info;
use acs_engine::scheduler::PROMPT_CACHE_ENTRIES;
use acs_engine::{Event, Finished, Scheduler, SchedulerConfig, prepare};
use acs_llama::gguf::GgufFile;
use acs_llama::model::Model;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use serde_json::{Value, json};

fn model() -> Arc<Model> {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    Arc::new(Model::from_gguf(Arc::new(GgufFile::from_vec(bytes).unwrap())).unwrap())
}

fn scheduler(model: &Arc<Model>) -> Scheduler {
    Scheduler::new(
        Arc::clone(model),
        SchedulerConfig::with_kv_bytes(model, 64 << 20),
    )
}

/// Room for 1,024 positions, prefilling at most `prefill_chunk` prompt tokens a step.
fn chunked_scheduler(model: &Arc<Model>, prefill_chunk: usize) -> Scheduler {
    Scheduler::new(
        Arc::clone(model),
        SchedulerConfig {
            kv_capacity_tokens: 1024,
            prefill_chunk,
            prompt_cache: PROMPT_CACHE_ENTRIES,
        },
    )
}

type Log = Arc<Mutex<Vec<Event>>>;

fn submit(s: &mut Scheduler, body: Value) -> Log {
    let (log, ticket) = submit_with_ticket(s, body);
    ticket.detach();
    log
}

/// `submit`, keeping the ticket so that the test can cancel.
fn submit_with_ticket(s: &mut Scheduler, body: Value) -> (Log, acs_engine::Ticket) {
    submit_in_scope(s, body, "")
}

/// `submit_with_ticket` of a request of this sharing scope (`Generation::scope`).
fn submit_in_scope(s: &mut Scheduler, body: Value, scope: &str) -> (Log, acs_engine::Ticket) {
    let model = Arc::clone(s.model());
    let req = CompletionRequest::from_value(&body, Endpoint::Completions).unwrap();
    let mut g = prepare(
        &req,
        &model,
        &model_info(&model, "m", 0),
        &Default::default(),
        7,
    )
    .unwrap();
    g.scope = scope.to_owned();
    let log: Log = Arc::default();
    let l = Arc::clone(&log);
    let ticket = s
        .submit(
            g,
            Box::new(move |e| {
                l.lock().unwrap().push(e);
                true
            }),
        )
        .unwrap();
    (log, ticket)
}

fn run_to_end(s: &mut Scheduler) {
    let mut guard = 0;
    while !s.is_idle() {
        s.step_blocking();
        guard += 1;
        assert!(guard < 10_000, "scheduler never finished");
    }
}

fn done(log: &Log) -> Finished {
    let events = log.lock().unwrap();
    match events.last() {
        Some(Event::Done(f)) => f.clone(),
        other => panic!("request did not end with Done: {other:?}"),
    }
}

fn texts(f: &Finished) -> Vec<String> {
    f.choices.iter().map(|c| c.text.clone()).collect()
}

#[test]
fn two_prompts_n2_give_indexes_0_to_3_and_prompt_usage_once() {
    let m = model();
    let mut s = scheduler(&m);
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":["ab","cde"],"max_tokens":3,"n":2}),
    );
    run_to_end(&mut s);
    let f = done(&log);
    assert_eq!(
        f.choices.iter().map(|c| c.index).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    let lens: u64 = ["ab", "cde"]
        .iter()
        .map(|p| m.tokenizer.encode(p, true, true).unwrap().len() as u64)
        .sum();
    assert_eq!(f.usage.prompt_tokens, lens, "each prompt counted once");
    assert!(f.usage.completion_tokens <= 4 * 3);
    assert_eq!(
        f.usage.total_tokens,
        f.usage.prompt_tokens + f.usage.completion_tokens
    );
    assert_eq!(
        s.stats().prefills,
        2,
        "one prefill per prompt, not per choice"
    );
}

#[test]
fn batching_changes_no_greedy_result() {
    let m = model();
    let body = |p: &str| json!({"model":"m","prompt":p,"max_tokens":12,"temperature":0,"n":3});
    let prompts = ["hello", "a much longer prompt than that", "x"];
    let alone: Vec<Vec<String>> = prompts
        .iter()
        .map(|p| {
            let mut s = scheduler(&m);
            let log = submit(&mut s, body(p));
            run_to_end(&mut s);
            texts(&done(&log))
        })
        .collect();
    let mut s = scheduler(&m);
    let logs: Vec<Log> = prompts.iter().map(|p| submit(&mut s, body(p))).collect();
    run_to_end(&mut s);
    for (log, want) in logs.iter().zip(&alone) {
        let got = texts(&done(log));
        assert_eq!(&got, want);
        assert!(got.iter().all(|t| t == &got[0]), "greedy choices agree");
    }
    assert!(s.stats().max_batch >= 9, "the requests ran side by side");
}

#[test]
fn seeds_reproduce_and_choices_differ() {
    let m = model();
    let body = json!({"model":"m","prompt":"seed","max_tokens":16,"n":4,"seed":123});
    let run = || {
        let mut s = scheduler(&m);
        let log = submit(&mut s, body.clone());
        run_to_end(&mut s);
        texts(&done(&log))
    };
    let a = run();
    assert_eq!(a, run(), "same seed, same texts");
    let distinct: std::collections::BTreeSet<_> = a.iter().collect();
    assert!(distinct.len() > 1, "choices sample on their own: {a:?}");
}

#[test]
fn streaming_deltas_add_up_to_the_texts() {
    let m = model();
    let mut s = scheduler(&m);
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":["p","q"],"max_tokens":10,"n":2,"seed":1}),
    );
    run_to_end(&mut s);
    let f = done(&log);
    let mut streamed = vec![String::new(); 4];
    let mut finished = vec![None; 4];
    for e in log.lock().unwrap().iter() {
        if let Event::Delta(cs) = e {
            for c in cs {
                streamed[c.index as usize].push_str(&c.text);
                if c.finish_reason.is_some() {
                    assert!(
                        finished[c.index as usize].is_none(),
                        "one final delta per choice"
                    );
                    finished[c.index as usize] = c.finish_reason;
                }
            }
        }
    }
    assert_eq!(streamed, texts(&f));
    assert_eq!(
        finished,
        f.choices
            .iter()
            .map(|c| c.finish_reason)
            .collect::<Vec<_>>()
    );
}

#[test]
fn stop_sequences_end_choices_without_the_stop() {
    let m = model();
    // Find what greedy decoding says, then stop on a piece of it.
    let mut s = scheduler(&m);
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":"stop","max_tokens":20,"temperature":0}),
    );
    run_to_end(&mut s);
    let full = texts(&done(&log)).remove(0);
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "greedy text too short to test: {full:?}");
    let stop: String = chars[3..5].iter().collect();
    let want: String = full[..full.find(&stop).unwrap()].to_owned();
    let mut s = scheduler(&m);
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":"stop","max_tokens":20,"temperature":0,"stop":[stop]}),
    );
    run_to_end(&mut s);
    let f = done(&log);
    assert_eq!(f.choices[0].text, want);
    assert_eq!(f.choices[0].finish_reason, Some(FinishReason::Stop));
}

#[test]
fn max_tokens_zero_and_echo() {
    let m = model();
    let mut s = scheduler(&m);
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":"echo me","max_tokens":0,"echo":true,"n":2}),
    );
    run_to_end(&mut s);
    let f = done(&log);
    assert_eq!(texts(&f), vec!["echo me", "echo me"]);
    assert_eq!(f.usage.completion_tokens, 0);
    assert!(
        f.choices
            .iter()
            .all(|c| c.finish_reason == Some(FinishReason::Length))
    );
}

#[test]
fn logprobs_report_tokens_and_alternatives() {
    let m = model();
    let mut s = scheduler(&m);
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":"lp","max_tokens":5,"logprobs":3,"temperature":0}),
    );
    run_to_end(&mut s);
    let f = done(&log);
    let lp = f.choices[0].logprobs.as_ref().unwrap();
    assert_eq!(lp.tokens.len(), f.usage.completion_tokens as usize);
    for (l, top) in lp.token_logprobs.iter().zip(&lp.top_logprobs) {
        let l = l.unwrap();
        let top = top.as_ref().unwrap();
        assert!(l <= 0.0);
        assert!(!top.is_empty() && top.len() <= 3);
        // Greedy: the chosen token is the likeliest.
        let best = top.values().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert!((best - l).abs() < 1e-4);
    }
}

/// Sampled tokens that are not among the likeliest still have their own
/// log-probability among the alternatives: `logprobs` + 1 of them at most.
#[test]
fn top_logprobs_always_hold_the_chosen_token() {
    let m = model();
    let mut s = scheduler(&m);
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":"lp","max_tokens":24,"logprobs":1,"temperature":2,"seed":5}),
    );
    run_to_end(&mut s);
    let f = done(&log);
    let lp = f.choices[0].logprobs.as_ref().unwrap();
    let mut beyond_the_best = 0;
    for ((t, l), top) in lp
        .tokens
        .iter()
        .zip(&lp.token_logprobs)
        .zip(&lp.top_logprobs)
    {
        let top = top.as_ref().unwrap();
        assert_eq!(top.get(t), l.as_ref(), "{t:?} among {top:?}");
        assert!(top.len() <= 2);
        beyond_the_best += usize::from(top.len() == 2);
    }
    assert!(
        beyond_the_best > 0,
        "at temperature 2 some draws are not the likeliest"
    );
}

#[test]
fn cancel_ends_a_request_at_the_next_step_with_partial_usage() {
    let m = model();
    let mut s = scheduler(&m);
    let (log, ticket) = submit_with_ticket(
        &mut s,
        json!({"model":"m","prompt":"long","max_tokens":200,"temperature":0}),
    );
    for _ in 0..4 {
        s.step_blocking();
    }
    assert_eq!(s.stats().running, 1);
    ticket.cancel();
    s.step_blocking();
    assert!(s.is_idle());
    // The step that only dropped the cancelled request counts it gone.
    assert_eq!((s.stats().running, s.stats().waiting), (0, 0));
    let f = done(&log);
    assert!(f.cancelled);
    assert!(f.usage.completion_tokens > 0 && f.usage.completion_tokens < 200);
}

#[test]
fn a_gone_receiver_cancels_and_a_dropped_ticket_cancels() {
    let m = model();
    let mut s = scheduler(&m);
    let req = CompletionRequest::from_value(
        &json!({"model":"m","prompt":"x","max_tokens":100}),
        Endpoint::Completions,
    )
    .unwrap();
    let g = prepare(&req, &m, &model_info(&m, "m", 0), &Default::default(), 1).unwrap();
    s.submit(g.clone(), Box::new(|e| !matches!(e, Event::Delta(_))))
        .unwrap()
        .detach();
    let ticket = s.submit(g, Box::new(|_| true)).unwrap();
    drop(ticket);
    for _ in 0..3 {
        s.step_blocking();
    }
    assert!(s.is_idle());
}

#[test]
fn requests_wait_for_kv_memory_and_huge_ones_are_refused() {
    let m = model();
    let per_token = m.config.kv_bytes_per_token();
    // Room for one request of 1 prompt token + 20 tokens, not two.
    let mut s = Scheduler::new(
        Arc::clone(&m),
        SchedulerConfig {
            kv_capacity_tokens: 30,
            prefill_chunk: 256,
            prompt_cache: PROMPT_CACHE_ENTRIES,
        },
    );
    let a = submit(
        &mut s,
        json!({"model":"m","prompt":[5],"max_tokens":20,"temperature":0}),
    );
    let b = submit(
        &mut s,
        json!({"model":"m","prompt":[6],"max_tokens":20,"temperature":0}),
    );
    s.step_blocking();
    assert!(
        a.lock().unwrap().len() == 1 && b.lock().unwrap().is_empty(),
        "b waits"
    );
    run_to_end(&mut s);
    done(&a);
    done(&b);
    let req = CompletionRequest::from_value(
        &json!({"model":"m","prompt":[5],"max_tokens":40}),
        Endpoint::Completions,
    )
    .unwrap();
    let g = prepare(&req, &m, &model_info(&m, "m", 0), &Default::default(), 1).unwrap();
    let e = s.submit(g, Box::new(|_| true)).unwrap_err();
    assert_eq!((e.status(), e.param.as_deref()), (400, Some("max_tokens")));
    assert!(per_token > 0);
}

/// Sizes that would wrap saturate (a usize is 32 bits on wasm32, where a request's
/// `n × max_tokens` or its bytes of KV memory can pass 2^32): such a request is
/// refused as too big, neither admitted as a small one nor a panic.
#[test]
fn sizes_that_would_wrap_are_refused_not_admitted() {
    let m = model();
    let mut s = scheduler(&m);
    let req = CompletionRequest::from_value(
        &json!({"model":"m","prompt":[5, 6],"max_tokens":4}),
        Endpoint::Completions,
    )
    .unwrap();
    let mut g = prepare(&req, &m, &model_info(&m, "m", 0), &Default::default(), 1).unwrap();
    g.n = usize::MAX / 3;
    assert_eq!(g.kv_tokens(true), usize::MAX);
    assert_eq!(g.kv_tokens(false), usize::MAX);
    let e = s.submit(g, Box::new(|_| true)).unwrap_err();
    assert_eq!(e.status(), 400, "{e:?}");
}

/// A short prompt is prefilled at once beside a long one that is still prefilling in
/// chunks: it ends long before the long prompt has even been read.
#[test]
fn a_short_prompt_does_not_wait_behind_a_long_prefill() {
    let m = model();
    let mut s = chunked_scheduler(&m, 16);
    let long: Vec<u32> = (1..=160).collect();
    let a = submit(
        &mut s,
        json!({"model":"m","prompt":long,"max_tokens":2,"temperature":0}),
    );
    let b = submit(
        &mut s,
        json!({"model":"m","prompt":[5],"max_tokens":2,"temperature":0}),
    );
    let is_done = |log: &Log| matches!(log.lock().unwrap().last(), Some(Event::Done(_)));
    let mut steps = 0;
    while !is_done(&b) {
        s.step_blocking();
        steps += 1;
        assert!(steps < 100, "the short request never ended");
    }
    assert_eq!(steps, 2, "one step to prefill and sample, one to decode");
    assert!(!is_done(&a), "the long prompt still prefills");
    run_to_end(&mut s);
    assert_eq!(done(&a).choices.len(), 1);
}

/// The caches of running sequences take no more memory than the scheduler reserved
/// for them: a prompt's cache is allocated for the prompt and the completion at once
/// (a cache that grew by doubling took up to twice that), and its choices share the
/// prompt's positions, each with room for its own completion (copies took the
/// prompt's room once per choice).
#[test]
fn kv_memory_held_stays_within_what_was_reserved() {
    let m = model();
    let per_token = m.config.kv_bytes_per_token();
    // Exactly one request's room: 21 prompt tokens, held once, + 4 choices × 6.
    let prompt: Vec<u32> = (1..=21).collect();
    let mut s = Scheduler::new(
        Arc::clone(&m),
        SchedulerConfig {
            kv_capacity_tokens: 21 + 4 * 6,
            // Prefilled in chunks, so the prompt's cache fills over several steps.
            prefill_chunk: 8,
            prompt_cache: PROMPT_CACHE_ENTRIES,
        },
    );
    let log = submit(
        &mut s,
        json!({"model":"m","prompt":prompt,"max_tokens":6,"n":4,"temperature":1,"seed":3}),
    );
    run_to_end(&mut s);
    let done = done(&log);
    assert_eq!(done.choices.len(), 4);
    assert_eq!(done.usage.completion_tokens, 4 * 6);
    let peak = s.stats().kv_bytes_peak as usize;
    assert_eq!(
        peak,
        (21 + 4 * 6) * per_token,
        "the prompt once, and four branches with the room of their completions"
    );
}

/// The engine thread's handle refuses a request that could never fit as the
/// scheduler does, at once and in the contract's terms, and runs one that fits.
#[test]
fn the_engine_refuses_what_could_never_fit() {
    let m = model();
    let config = SchedulerConfig {
        kv_capacity_tokens: 30,
        prefill_chunk: 256,
        prompt_cache: PROMPT_CACHE_ENTRIES,
    };
    let engine = acs_engine::Engine::start(Arc::clone(&m), config);
    let generation = |max_tokens: u32| {
        let body = json!({"model":"m","prompt":[5],"max_tokens":max_tokens,"temperature":0});
        let req = CompletionRequest::from_value(&body, Endpoint::Completions).unwrap();
        prepare(&req, &m, &model_info(&m, "m", 0), &Default::default(), 1).unwrap()
    };
    let e = engine
        .submit(generation(40), Box::new(|_| true))
        .unwrap_err();
    assert_eq!((e.status(), e.param.as_deref()), (400, Some("max_tokens")));
    let events = engine.run(generation(20)).unwrap();
    match events.last() {
        Some(Event::Done(f)) => assert_eq!(f.usage.completion_tokens, 20),
        other => panic!("expected the request to finish, got {other:?}"),
    }
}

/// What `body` gives on a scheduler of its own.
fn alone(m: &Arc<Model>, body: &Value) -> Finished {
    let mut s = scheduler(m);
    let log = submit(&mut s, body.clone());
    run_to_end(&mut s);
    done(&log)
}

/// Requests that arrive together with the same prompt (as the tutorial's eight
/// parallel requests do) prefill it once: the others branch from the first one's
/// cache, and every request gets exactly the texts it gets alone. A different prompt,
/// a request that steers, and one that reads activations out prefill their own.
#[test]
fn identical_prompts_of_concurrent_requests_are_prefilled_once() {
    let m = model();
    let prompt: Vec<u32> = (1..=20).collect();
    let body = |seed: u32, n: u32, max_tokens: u32| json!({"model":"m","prompt":prompt,"max_tokens":max_tokens,"n":n,"temperature":1,"seed":seed});
    let same = [body(1, 2, 5), body(2, 1, 7), body(3, 3, 4)];
    let other = json!({"model":"m","prompt":[9, 8, 7],"max_tokens":5,"temperature":1,"seed":4});
    let mut steered = body(5, 1, 5);
    steered["steering"] = json!([{"layer": 1, "vector": vec![0.5f32; 64], "scale": 1.0}]);
    let mut read_out = body(6, 1, 5);
    read_out["activations"] = json!({"layers": [1], "positions": "last"});
    let mut s = scheduler(&m);
    let logs: Vec<Log> = same
        .iter()
        .chain([&other, &steered, &read_out])
        .map(|b| submit(&mut s, b.clone()))
        .collect();
    run_to_end(&mut s);
    assert_eq!(
        s.stats().prefills,
        4,
        "the shared prompt once; the other prompt, the steered and the read-out ones each"
    );
    for (log, b) in logs
        .iter()
        .zip(same.iter().chain([&other, &steered, &read_out]))
    {
        let (got, want) = (done(log), alone(&m, b));
        assert_eq!(texts(&got), texts(&want), "{b}");
        assert_eq!(got.usage, want.usage, "{b}");
    }
}

/// A request whose prompt waits for another request's identical one prefills it
/// itself when that request is cancelled first, and ends as it does alone.
#[test]
fn a_waiting_prompt_prefills_itself_when_the_one_it_waits_for_leaves() {
    let m = model();
    // 30 prompt tokens take several steps.
    let mut s = chunked_scheduler(&m, 8);
    let prompt: Vec<u32> = (1..=30).collect();
    let body = |seed: u32| json!({"model":"m","prompt":prompt,"max_tokens":4,"n":2,"temperature":1,"seed":seed});
    let (first, ticket) = submit_with_ticket(&mut s, body(1));
    let second = submit(&mut s, body(2));
    s.step_blocking();
    ticket.cancel();
    run_to_end(&mut s);
    assert!(done(&first).cancelled);
    let got = done(&second);
    assert!(!got.cancelled);
    assert_eq!(texts(&got), texts(&alone(&m, &body(2))));
    assert_eq!(s.stats().prefills, 1, "the second prompt's own prefill");
}

/// A request whose prompt an earlier request prefilled branches from the kept prompt
/// instead of prefilling it again, and gets exactly what it gets alone: the same
/// texts and the same log-probabilities, bit for bit; its usage counts the prompt's
/// tokens as cached. Requests that score their
/// prompt (echo with logprobs) neither keep their prompt nor use a kept one.
#[test]
fn a_prompt_kept_from_an_earlier_request_is_not_prefilled_again() {
    let m = model();
    let prompt: Vec<u32> = (1..=20).collect();
    let body = |seed: u32, n: u32| json!({"model":"m","prompt":prompt,"max_tokens":6,"n":n,"temperature":1,"seed":seed,"logprobs":2});
    let mut s = scheduler(&m);
    for (i, b) in [body(1, 2), body(2, 3), body(1, 2)].iter().enumerate() {
        let log = submit(&mut s, b.clone());
        run_to_end(&mut s);
        let (got, want) = (done(&log), alone(&m, b));
        assert_eq!(got.choices, want.choices, "request {i}: texts and logprobs");
        let cached = if i == 0 { 0 } else { prompt.len() as u64 };
        assert_eq!(
            got.usage,
            want.usage.with_cached_tokens(cached),
            "request {i}: the prompt still counts, and says it was cached"
        );
        let stats = s.stats();
        assert_eq!(
            (stats.prefills, stats.prompt_cache_hits),
            (1, i as u64),
            "request {i}"
        );
    }
    let mut scored = body(3, 1);
    scored["echo"] = json!(true);
    for _ in 0..2 {
        let log = submit(&mut s, scored.clone());
        run_to_end(&mut s);
        assert_eq!(done(&log).choices, alone(&m, &scored).choices);
    }
    let stats = s.stats();
    assert_eq!(
        (stats.prefills, stats.prompt_cache_hits),
        (3, 2),
        "an echo with logprobs prefills its prompt every time"
    );
}

/// Prompts are shared only within a scope (a server's API key): a request of another
/// scope neither branches from a kept prompt, nor copies its beginning, nor rides on
/// a prefill in progress, and its usage says nothing was cached; within its own
/// scope it does all three.
#[test]
fn prompts_are_shared_within_their_scope_only() {
    let m = model();
    let prompt: Vec<u32> = (1..=20).collect();
    let longer: Vec<u32> = (1..=26).collect();
    let body = |p: &[u32]| json!({"model":"m","prompt":p,"max_tokens":3,"temperature":0});
    let mut s = scheduler(&m);
    let run = |s: &mut Scheduler, b: Value, scope: &str| {
        let (log, ticket) = submit_in_scope(s, b.clone(), scope);
        ticket.detach();
        run_to_end(s);
        let got = done(&log);
        assert_eq!(got.choices, alone(&m, &b).choices, "{scope}");
        let stats = s.stats();
        (
            got.usage.prompt_tokens_details.cached_tokens,
            stats.prefills,
            stats.prompt_cache_hits,
        )
    };
    assert_eq!(run(&mut s, body(&prompt), "a"), (0, 1, 0));
    assert_eq!(
        run(&mut s, body(&prompt), "b"),
        (0, 2, 0),
        "a's kept prompt"
    );
    assert_eq!(run(&mut s, body(&longer), "c"), (0, 3, 0), "a's beginning");
    assert_eq!(run(&mut s, body(&prompt), "b"), (20, 3, 1), "b's own");
    assert_eq!(
        run(&mut s, body(&longer), "a"),
        (20, 4, 2),
        "a's own beginning"
    );
    // Two requests of one long prompt at once: across scopes each prefills it; in
    // one scope the second rides on the first's prefill.
    let long: Vec<u32> = (100..=130).collect();
    for (scopes, prefills) in [(["x", "y"], 2), (["z", "z"], 1)] {
        let mut s = chunked_scheduler(&m, 8);
        let logs: Vec<Log> = scopes
            .iter()
            .map(|scope| {
                let (log, ticket) = submit_in_scope(&mut s, body(&long), scope);
                ticket.detach();
                log
            })
            .collect();
        run_to_end(&mut s);
        for log in &logs {
            assert_eq!(done(log).choices, alone(&m, &body(&long)).choices);
        }
        assert_eq!(s.stats().prefills, prefills, "{scopes:?}");
    }
}

/// Kept prompts take only KV room that no request reserved, give it up (the least
/// recently used first) as soon as a request needs it, and stay within the number of
/// prompts the config keeps: the memory held never passes the capacity.
#[test]
fn kept_prompts_give_their_room_to_requests() {
    let m = model();
    let per_token = m.config.kv_bytes_per_token();
    let mut s = Scheduler::new(
        Arc::clone(&m),
        SchedulerConfig {
            kv_capacity_tokens: 40,
            prefill_chunk: 256,
            prompt_cache: 2,
        },
    );
    let body = |first: u32, len: u32, max_tokens: u32| {
        let prompt: Vec<u32> = (first..first + len).collect();
        json!({"model":"m","prompt":prompt,"max_tokens":max_tokens,"temperature":0})
    };
    let run = |s: &mut Scheduler, b: Value| {
        let log = submit(s, b.clone());
        run_to_end(s);
        let got = done(&log);
        assert_eq!(got.choices, alone(&m, &b).choices, "{b}");
        s.stats()
    };
    let hits = |stats: acs_engine::Stats| (stats.prefills, stats.prompt_cache_hits);
    // Two prompts of 10 tokens are kept (20 of the 40 positions); a third takes the
    // place of the least recently used (the first), which then prefills again.
    run(&mut s, body(1, 10, 5));
    run(&mut s, body(20, 10, 5));
    run(&mut s, body(40, 10, 5));
    assert_eq!(hits(run(&mut s, body(1, 10, 5))), (4, 0));
    assert_eq!(hits(run(&mut s, body(1, 10, 5))), (4, 1));
    // Prompts 40 and 1 are kept; a request of 30 positions (that keeps nothing: it
    // scores its prompt) needs the room of one of them, and the least recently
    // used (40) goes.
    let mut scored = body(60, 10, 20);
    scored["echo"] = json!(true);
    scored["logprobs"] = json!(1);
    run(&mut s, scored);
    assert_eq!(hits(run(&mut s, body(1, 10, 5))), (5, 2));
    // A request of all 40 positions takes the room of every kept prompt.
    run(&mut s, body(80, 20, 20));
    let stats = run(&mut s, body(1, 10, 5));
    assert_eq!(hits(stats), (7, 2));
    assert!(
        stats.kv_bytes_peak as usize <= 40 * per_token,
        "held {} bytes, room for {}",
        stats.kv_bytes_peak,
        40 * per_token
    );
}

/// A prompt that begins with a kept prompt's first tokens (at least 16 of them)
/// starts from a copy of them and prefills only the rest, with exactly the results it
/// gets alone; its usage counts those tokens as cached. A prompt that is the
/// beginning of a kept one prefills its last token (for its logits), and one that
/// shares fewer than 16 tokens prefills them all.
#[test]
fn a_prompt_that_begins_with_a_kept_one_prefills_only_the_rest() {
    let m = model();
    let body = |prompt: Vec<u32>| json!({"model":"m","prompt":prompt,"max_tokens":5,"n":2,"temperature":1,"seed":9,"logprobs":1});
    let kept: Vec<u32> = (1..=40).collect();
    let longer: Vec<u32> = (1..=30).chain(100..110).collect();
    let shorter: Vec<u32> = (1..=20).collect();
    let few: Vec<u32> = (1..=10).chain(200..220).collect();
    let mut s = scheduler(&m);
    let log = submit(&mut s, body(kept));
    run_to_end(&mut s);
    assert!(!done(&log).cancelled);
    for (prompt, prefilled, cached) in [(longer, 10, 30), (shorter, 1, 19), (few, 30, 0)] {
        let before = s.stats().prefill_tokens;
        let b = body(prompt);
        let log = submit(&mut s, b.clone());
        run_to_end(&mut s);
        let (got, want) = (done(&log), alone(&m, &b));
        assert_eq!(got.choices, want.choices, "{b}");
        assert_eq!(got.usage, want.usage.with_cached_tokens(cached), "{b}");
        assert_eq!(s.stats().prefill_tokens - before, prefilled, "{b}");
    }
}

/// Prompts that begin alike, in one request or in requests that arrive together,
/// prefill what they share once: each waits for the first to reach the end of their
/// common beginning (at least 16 tokens) and branches from its cache there, then
/// prefills only its own rest, and a repeated prompt prefills nothing; a prompt that
/// arrives when the first has passed that point starts from a copy. Every choice gets
/// exactly the tokens and log-probabilities its prompt gets alone, and usage counts
/// every prompt token (none of them from the prompt cache).
#[test]
fn prompts_that_begin_alike_prefill_their_common_beginning_once() {
    let m = model();
    let preamble: Vec<u32> = (1..=30).collect();
    let with =
        |tail: std::ops::Range<u32>| -> Vec<u32> { preamble.iter().copied().chain(tail).collect() };
    let body = |prompts: &[Vec<u32>]| json!({"model":"m","prompt":prompts,"max_tokens":5,"temperature":0,"logprobs":5});
    let first = with(100..112);
    let one = body(&[first.clone(), with(200..212), first.clone()]);
    let two = body(&[with(300..312), (1..=20).collect()]);
    // 8 prompt tokens a step: the first prompt stops at 19 and 30 for the prompts
    // riding on it, and is at 38 of its 42 after six steps.
    let mut s = chunked_scheduler(&m, 8);
    let logs = [submit(&mut s, one.clone()), submit(&mut s, two.clone())];
    for _ in 0..6 {
        s.step_blocking();
    }
    let late = body(&[first[..34].iter().copied().chain(250..260).collect()]);
    let late_log = submit(&mut s, late.clone());
    run_to_end(&mut s);
    let stats = s.stats();
    assert_eq!(
        (stats.prefill_tokens, stats.prefills),
        (42 + 12 + 12 + 1 + 10, 5),
        "the first prompt whole, the rests of the others, nothing of the repeated one"
    );
    for (log, b) in logs.iter().chain([&late_log]).zip([&one, &two, &late]) {
        let got = done(log);
        let prompts: Vec<Vec<u32>> = serde_json::from_value(b["prompt"].clone()).unwrap();
        assert_eq!(got.choices.len(), prompts.len());
        for (c, p) in got.choices.iter().zip(&prompts) {
            let mut want = alone(&m, &body(std::slice::from_ref(p))).choices.remove(0);
            want.index = c.index;
            assert_eq!(c, &want, "prompt {p:?}");
        }
        let tokens: usize = prompts.iter().map(Vec::len).sum();
        assert_eq!(got.usage.prompt_tokens, tokens as u64, "{b}");
        assert_eq!(got.usage.prompt_tokens_details.cached_tokens, 0, "{b}");
    }
}

/// A read-out of the last position, of a prompt prefilled in chunks, is the last row
/// of the read-out of every position (the rows of the chunks before are not kept).
#[test]
fn a_last_position_read_out_over_chunks_is_the_last_row() {
    let m = model();
    let prompt: Vec<u32> = (1..=30).collect();
    let read = |positions: &str| {
        let body = json!({"model":"m","prompt":prompt,"max_tokens":1,"temperature":0,
            "activations":{"layers":[0, 1],"positions":positions}});
        let mut s = chunked_scheduler(&m, 8);
        let log = submit(&mut s, body);
        run_to_end(&mut s);
        done(&log).activations
    };
    let (last, all) = (read("last"), read("all"));
    let d = m.config.d_model;
    let decode = |a: &acs_core::response::Activation| -> Vec<u8> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&a.data)
            .unwrap()
    };
    assert_eq!((last.len(), all.len()), (2, 2));
    for (l, a) in last.iter().zip(&all) {
        assert_eq!(
            (l.layer, l.shape, a.shape),
            (a.layer, [1, d as u32], [30, d as u32])
        );
        let (l, a) = (decode(l), decode(a));
        assert_eq!(l, a[a.len() - 4 * d..]);
    }
}

/// A waiting request that does not fit yet lets smaller ones behind it start (and
/// end) meanwhile, and itself starts once room frees; each gets what it gets alone.
#[test]
fn a_request_waiting_for_room_does_not_block_smaller_ones() {
    let m = model();
    let mut s = Scheduler::new(
        Arc::clone(&m),
        SchedulerConfig {
            kv_capacity_tokens: 40,
            prefill_chunk: 256,
            prompt_cache: 0,
        },
    );
    let body = |first: u32, len: u32, max_tokens: u32| {
        let prompt: Vec<u32> = (first..first + len).collect();
        json!({"model":"m","prompt":prompt,"max_tokens":max_tokens,"temperature":0,
               "logit_bias": {"0": -100, "1": -100, "2": -100}})
    };
    // 30 positions run; the next 30 cannot fit beside them; 6 can.
    let (running, big, small) = (body(1, 10, 20), body(40, 10, 20), body(80, 3, 3));
    let logs: Vec<Log> = [&running, &big, &small]
        .iter()
        .map(|b| submit(&mut s, (*b).clone()))
        .collect();
    let is_done = |log: &Log| matches!(log.lock().unwrap().last(), Some(Event::Done(_)));
    let started = |log: &Log| !log.lock().unwrap().is_empty();
    let mut steps = 0;
    while !is_done(&logs[2]) {
        s.step_blocking();
        steps += 1;
        assert!(steps < 20, "the small request never ended");
    }
    assert!(!started(&logs[1]), "the big request still waits for room");
    run_to_end(&mut s);
    for (log, b) in logs.iter().zip([&running, &big, &small]) {
        assert_eq!(done(log).choices, alone(&m, b).choices, "{b}");
    }
}
