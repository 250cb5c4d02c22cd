//! The engine with its batches stepping on the WebGPU backend (lavapipe in CI): the
//! same requests give the same completions as on the CPU, including n choices that
//! branch from one prefill (a cache copied on the device) and steering.
//! Run: `cargo test -p acs-engine --features webgpu --test webgpu_engine`.
#![cfg(all(feature = "webgpu", not(target_arch = "wasm32")))]

use std::sync::Arc;

use acs_core::{CompletionRequest, Endpoint};
use acs_engine::generation::model_info;
use acs_engine::{Engine, Event, Finished, SchedulerConfig, prepare};
use acs_llama::gguf::GgufFile;
use acs_llama::model::Model;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use acs_llama::webgpu::GpuModel;
use serde_json::{Value, json};

fn finished(engine: &Engine, body: Value) -> Finished {
    let model = engine.model();
    let req = CompletionRequest::from_value(&body, Endpoint::Completions).unwrap();
    let g = prepare(
        &req,
        model,
        &model_info(model, "m", 0),
        &Default::default(),
        7,
    )
    .unwrap();
    let events = engine.run(g).unwrap();
    match events.into_iter().last() {
        Some(Event::Done(f)) => f,
        other => panic!("the request did not finish: {other:?}"),
    }
}

/// Holds the WebGPU model until the engine thread has let go of it, then drops it on
/// the test's thread. The engine thread drops its backend after its last handle is
/// gone, on its own time; a device still being torn down there as the test process
/// exits races the Vulkan driver's exit handlers (lavapipe crashed so).
struct DeviceTeardown(Arc<GpuModel>);

impl Drop for DeviceTeardown {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while Arc::strong_count(&self.0) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// The tiny model, and an engine over it on the CPU and one on WebGPU. Bind the
/// teardown first, so that it drops after both engines.
fn engines() -> (DeviceTeardown, Arc<Model>, Engine, Engine) {
    let file =
        Arc::new(GgufFile::from_vec(test_model_bytes(&TestModelSpec::tiny()).unwrap()).unwrap());
    let model = Arc::new(Model::from_gguf(Arc::clone(&file)).unwrap());
    let gpu = Arc::new(GpuModel::new(&file).expect("a WebGPU adapter (lavapipe counts)"));
    let config = SchedulerConfig::with_kv_bytes(&model, 64 << 20);
    let cpu_engine = Engine::start(Arc::clone(&model), config);
    let gpu_engine = Engine::start_on(Arc::clone(&model), Arc::clone(&gpu), config);
    (DeviceTeardown(gpu), model, cpu_engine, gpu_engine)
}

#[test]
fn webgpu_engine_gives_the_cpu_engines_completions() {
    let (_device, model, cpu_engine, gpu_engine) = engines();
    assert_eq!(cpu_engine.backend(), "cpu");
    assert!(
        gpu_engine.backend().starts_with("webgpu: "),
        "{}",
        gpu_engine.backend()
    );
    let d = model.config.d_model;
    let bodies = [
        json!({"model": "m", "prompt": [[5, 6, 7], [9, 10]], "n": 2, "max_tokens": 12,
               "temperature": 0}),
        json!({"model": "m", "prompt": [[11, 12, 13, 14]], "n": 3, "max_tokens": 10,
               "temperature": 0, "steering": [{"layer": 1, "scale": 0.5,
               "vector": (0..d).map(|i| ((i % 5) as f64 - 2.0) * 0.2).collect::<Vec<_>>()}]}),
    ];
    for body in bodies {
        let (c, g) = (
            finished(&cpu_engine, body.clone()),
            finished(&gpu_engine, body),
        );
        assert_eq!(c.usage, g.usage);
        let texts = |f: &Finished| {
            f.choices
                .iter()
                .map(|c| (c.index, c.text.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(texts(&c), texts(&g));
        assert!(
            c.choices.iter().any(|ch| !ch.text.is_empty()),
            "nothing generated"
        );
    }
    assert!(
        gpu_engine.stats().prefills >= 3,
        "prefilled once per prompt"
    );
}

/// On the GPU too (copies made on the device), a prompt sent again starts from the
/// prompt cache, one that begins like a kept prompt (by 16 tokens or more) prefills
/// only its own end, and the prompts of one request that begin alike prefill their
/// common beginning once: every completion is the CPU engine's, and usage says which
/// tokens came from the cache.
#[test]
fn webgpu_engine_keeps_prompts_and_shares_beginnings() {
    let (_device, _, cpu_engine, gpu_engine) = engines();
    let with = |first: u32, tail: std::ops::Range<u32>| -> Vec<u32> {
        (first..first + 40).chain(tail).collect()
    };
    let body = |prompts: Vec<Vec<u32>>| json!({"model": "m", "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0});
    // (request, cached tokens, tokens prefilled)
    let cases = [
        (body(vec![with(20, 100..106)]), 0, 46),
        (body(vec![with(20, 100..106)]), 46, 0),
        (body(vec![with(20, 120..130)]), 40, 10),
        (
            body(vec![with(60, 100..106), with(60, 110..116)]),
            0,
            46 + 6,
        ),
    ];
    for (b, cached, prefilled) in cases {
        let before = gpu_engine.stats().prefill_tokens;
        let (c, g) = (
            finished(&cpu_engine, b.clone()),
            finished(&gpu_engine, b.clone()),
        );
        let texts = |f: &Finished| f.choices.iter().map(|c| c.text.clone()).collect::<Vec<_>>();
        assert_eq!(texts(&c), texts(&g), "{b}");
        assert_eq!(g.usage.prompt_tokens_details.cached_tokens, cached, "{b}");
        assert_eq!(g.usage.prompt_tokens, c.usage.prompt_tokens, "{b}");
        assert_eq!(gpu_engine.stats().prefill_tokens - before, prefilled, "{b}");
    }
}
