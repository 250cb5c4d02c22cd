//! The engine thread's end: a step that panics (a bug, a failed device) stops the
//! thread; its requests end without a result, the engine says it no longer runs, and
//! later requests are refused rather than queued forever.
#![cfg(not(target_arch = "wasm32"))]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use acs_core::{CompletionRequest, Endpoint};
use acs_engine::generation::model_info;
use acs_engine::{Backend, Engine, Event, SchedulerConfig, prepare};
use acs_llama::gguf::GgufFile;
use acs_llama::model::{KvCache, Model, ModelError, SeqInput, SeqOutput};
use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use serde_json::json;

/// The CPU model, whose step panics once `fail` is set: the fault, injected.
struct Faulty {
    model: Arc<Model>,
    fail: Arc<AtomicBool>,
}

impl Backend for Faulty {
    type Cache = KvCache;
    type Error = ModelError;

    fn new_cache(&self, positions: usize) -> KvCache {
        Backend::new_cache(&*self.model, positions)
    }
    fn fork(&self, cache: &mut KvCache, positions: usize) -> Result<KvCache, ModelError> {
        Backend::fork(&*self.model, cache, positions)
    }
    fn copy_prefix(
        &self,
        cache: &KvCache,
        prefix: usize,
        positions: usize,
    ) -> Result<KvCache, ModelError> {
        Backend::copy_prefix(&*self.model, cache, prefix, positions)
    }
    fn cache_bytes(&self, cache: &KvCache) -> usize {
        Backend::cache_bytes(&*self.model, cache)
    }
    async fn forward(
        &self,
        batch: &mut [SeqInput<'_, KvCache>],
    ) -> Result<Vec<SeqOutput>, ModelError> {
        assert!(
            !self.fail.load(Ordering::SeqCst),
            "an injected fault in a step"
        );
        Backend::forward(&*self.model, batch).await
    }
    fn describe(&self) -> String {
        "faulty cpu".into()
    }
}

#[test]
fn a_step_that_panics_stops_the_engine_and_ends_its_requests() {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let model = Arc::new(Model::from_gguf(Arc::new(GgufFile::from_vec(bytes).unwrap())).unwrap());
    let fail = Arc::new(AtomicBool::new(false));
    let backend = Arc::new(Faulty {
        model: Arc::clone(&model),
        fail: Arc::clone(&fail),
    });
    let engine = Engine::start_on(
        Arc::clone(&model),
        backend,
        SchedulerConfig::with_kv_bytes(&model, 16 << 20),
    );
    let generation = || {
        let body = json!({"model":"m","prompt":[1, 2, 3],"max_tokens":4});
        let req = CompletionRequest::from_value(&body, Endpoint::Completions).unwrap();
        prepare(
            &req,
            &model,
            &model_info(&model, "m", 0),
            &Default::default(),
            1,
        )
        .unwrap()
    };
    let events = engine.run(generation()).unwrap();
    assert!(matches!(events.last(), Some(Event::Done(_))));
    assert!(engine.is_running());

    fail.store(true, Ordering::SeqCst);
    let events = engine.run(generation()).unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Done(_) | Event::Failed(_))),
        "the request ended with the thread, without an end of its own"
    );
    let t = Instant::now();
    while engine.is_running() {
        assert!(t.elapsed() < Duration::from_secs(5), "still running");
        std::thread::sleep(Duration::from_millis(10));
    }
    let refused = engine.run(generation()).unwrap_err();
    assert_eq!(refused.status(), 500, "{refused}");
}
