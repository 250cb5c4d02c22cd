//! Steering and activation read-outs, measured on the default model and on generated
//! tiny models: steering moves what it should and nothing else.

use std::sync::{Arc, Mutex};

use acs_core::{CompletionRequest, Endpoint};
use acs_engine::generation::{contrast_vector, model_info};
use acs_engine::{Event, Scheduler, SchedulerConfig, prepare};
use acs_llama::gguf::GgufFile;
use acs_llama::model::{LayerAdd, Logits, Model, SeqInput};
use acs_llama::sample::log_sum_exp;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use serde_json::json;

/// Mean log-probability of the first token of each of `words` after `prompt`.
fn mean_logprob(model: &Model, prompt: &str, words: &[u32], steer: &[LayerAdd]) -> f32 {
    let ids = model.tokenizer.encode(prompt, true, false).unwrap();
    let mut cache = model.new_cache();
    let out = model
        .forward(&mut [SeqInput {
            cache: &mut cache,
            tokens: &ids,
            steering: steer,
            capture: &[],
            logits: Logits::Last,
        }])
        .unwrap();
    let logits = &out[0].logits;
    let lse = log_sum_exp(logits);
    words.iter().map(|&w| logits[w as usize] - lse).sum::<f32>() / words.len() as f32
}

#[test]
fn a_contrast_vector_moves_positive_words_with_its_scale() {
    let model = Model::open(acs_llama::testgen::default_model_for_tests()).unwrap();
    let layer = model.config.n_layers / 2;
    let v = contrast_vector(
        &model,
        "I love it. It is wonderful, great, lovely and happy.",
        "I hate it. It is awful, terrible, horrible and sad.",
        layer,
    )
    .unwrap();
    let words: Vec<u32> = [
        " great",
        " wonderful",
        " good",
        " amazing",
        " happy",
        " lovely",
    ]
    .iter()
    .map(|w| model.tokenizer.encode(w, false, false).unwrap()[0])
    .collect();
    let prompts = [
        "I think this movie is",
        "Today I feel",
        "The food at this restaurant was",
        "My trip to the beach was",
    ];
    // Within ±1 the effect is monotonic; past about 1.5 the vector, as large as the
    // residual stream's own differences, starts to wreck every prediction.
    let scales = [-1.0f32, -0.5, 0.0, 0.5, 1.0];
    let means: Vec<f32> = scales
        .iter()
        .map(|&s| {
            let steer = [LayerAdd {
                layer,
                vector: v.iter().map(|x| x * s).collect(),
            }];
            prompts
                .iter()
                .map(|p| mean_logprob(&model, p, &words, &steer))
                .sum::<f32>()
                / prompts.len() as f32
        })
        .collect();
    println!("layer {layer}: scale → mean log-prob of positive words");
    for (s, m) in scales.iter().zip(&means) {
        println!("  {s:+.1} → {m:.3}");
    }
    for w in means.windows(2) {
        assert!(w[1] > w[0], "not increasing with the scale: {means:?}");
    }
}

fn tiny(n_layers: usize) -> Arc<Model> {
    let spec = TestModelSpec {
        n_layers,
        ..TestModelSpec::tiny()
    };
    let bytes = test_model_bytes(&spec).unwrap();
    Arc::new(Model::from_gguf(Arc::new(GgufFile::from_vec(bytes).unwrap())).unwrap())
}

/// Runs requests in one scheduler (one batch) and returns each one's last event.
fn run_all(model: &Arc<Model>, bodies: &[serde_json::Value]) -> Vec<Event> {
    let mut s = Scheduler::new(
        Arc::clone(model),
        SchedulerConfig::with_kv_bytes(model, 64 << 20),
    );
    let info = model_info(model, "m", 0);
    let logs: Vec<Arc<Mutex<Vec<Event>>>> = bodies
        .iter()
        .map(|b| {
            let req = CompletionRequest::from_value(b, Endpoint::Completions).unwrap();
            let g = prepare(&req, model, &info, &Default::default(), 1).unwrap();
            let log: Arc<Mutex<Vec<Event>>> = Arc::default();
            let l = Arc::clone(&log);
            s.submit(
                g,
                Box::new(move |e| {
                    l.lock().unwrap().push(e);
                    true
                }),
            )
            .unwrap()
            .detach();
            log
        })
        .collect();
    while !s.is_idle() {
        s.step_blocking();
    }
    logs.iter()
        .map(|l| l.lock().unwrap().last().unwrap().clone())
        .collect()
}

fn decode_f32(b64: &str) -> Vec<f32> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The residual stream after every block for `ids`, straight from the model.
fn residuals(model: &Model, ids: &[u32], steer: &[LayerAdd]) -> Vec<Vec<f32>> {
    let layers: Vec<usize> = (0..model.config.n_layers).collect();
    let mut cache = model.new_cache();
    let out = model
        .forward(&mut [SeqInput {
            cache: &mut cache,
            tokens: ids,
            steering: steer,
            capture: &layers,
            logits: Logits::None,
        }])
        .unwrap();
    out[0]
        .captured
        .iter()
        .map(|(_, rows)| rows.clone())
        .collect()
}

#[test]
fn read_out_activations_equal_the_models_residual_stream() {
    let model = tiny(3);
    let d = model.config.d_model;
    let prompts = ["activations please", "x"];
    let events = run_all(
        &model,
        &[
            json!({"model":"m","prompt":prompts,"max_tokens":2,"activations":{"layers":[0,2],"positions":"all"}}),
            json!({"model":"m","prompt":prompts,"max_tokens":2,"activations":{"layers":[1],"positions":"last"}}),
        ],
    );
    let (Event::Done(all), Event::Done(last)) = (&events[0], &events[1]) else {
        panic!("requests did not finish: {events:?}");
    };
    assert_eq!(all.activations.len(), 4, "2 prompts × 2 layers");
    assert_eq!(last.activations.len(), 2);
    for a in all.activations.iter().chain(&last.activations) {
        let ids = model
            .tokenizer
            .encode(prompts[a.prompt_index as usize], true, true)
            .unwrap();
        let want = &residuals(&model, &ids, &[])[a.layer as usize];
        let got = decode_f32(&a.data);
        assert_eq!(a.dtype, "f32");
        assert_eq!(a.shape[1] as usize, d);
        assert_eq!(got.len(), a.shape[0] as usize * d);
        let want = match a.positions {
            acs_core::request::Positions::All => &want[..],
            acs_core::request::Positions::Last => &want[want.len() - d..],
        };
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
}

#[test]
fn steering_at_layer_l_changes_activations_only_from_l_on() {
    let model = tiny(4);
    let ids = model.tokenizer.encode("steer here", true, true).unwrap();
    let plain = residuals(&model, &ids, &[]);
    let steer = [LayerAdd {
        layer: 2,
        vector: (0..model.config.d_model)
            .map(|i| (i as f32 * 0.37).sin())
            .collect(),
    }];
    let steered = residuals(&model, &ids, &steer);
    for l in 0..4 {
        let same = plain[l] == steered[l];
        assert_eq!(
            same,
            l < 2,
            "layer {l}: steering at 2 must change exactly layers 2.."
        );
    }
}

#[test]
fn steered_and_plain_sequences_in_one_batch_get_what_they_get_alone() {
    let model = tiny(3);
    let d = model.config.d_model;
    let vector = |seed: f32| -> Vec<f32> {
        (0..d)
            .map(|i| ((i as f32 + seed) * 0.71).sin() * 3.0)
            .collect()
    };
    let bodies: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            let mut b = json!({"model":"m","prompt":format!("sequence {i}"),"max_tokens":8,"temperature":0,"n":2});
            if i % 2 == 0 {
                b["steering"] = json!([{"layer": i % 3, "vector": vector(i as f32), "scale": 1.5}]);
            }
            b
        })
        .collect();
    let texts = |e: &Event| match e {
        Event::Done(f) => f.choices.iter().map(|c| c.text.clone()).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    let batched: Vec<Vec<String>> = run_all(&model, &bodies).iter().map(texts).collect();
    for (b, got) in bodies.iter().zip(&batched) {
        let alone = texts(&run_all(&model, std::slice::from_ref(b))[0]);
        assert_eq!(got, &alone, "{b}");
    }
    // And the steering did something: the same prompts unsteered read differently.
    let unsteered: Vec<serde_json::Value> = bodies
        .iter()
        .step_by(2)
        .map(|b| {
            let mut b = b.clone();
            b.as_object_mut().unwrap().remove("steering");
            b
        })
        .collect();
    let plain: Vec<Vec<String>> = run_all(&model, &unsteered).iter().map(texts).collect();
    let steered: Vec<&Vec<String>> = batched.iter().step_by(2).collect();
    assert!(
        plain.iter().zip(&steered).any(|(p, s)| &p != s),
        "steering changed no text"
    );
}

#[test]
fn control_vector_files_load_and_steer_their_layers() {
    use acs_engine::control::{ControlVector, ControlVectorError};
    use acs_llama::gguf::{GgufWriter, MetaValue};
    use acs_llama::quant::GgmlType;

    let model = tiny(3);
    let d = model.config.d_model;
    let file = |arch: &str, tensors: &[(&str, usize)]| {
        let mut w = GgufWriter::new();
        w.add("general.architecture", MetaValue::String(arch.into()));
        for &(name, len) in tensors {
            let data: Vec<u8> = (0..len)
                .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
                .collect();
            w.add_tensor(name, &[len as u64], GgmlType::F32, data)
                .unwrap();
        }
        GgufFile::from_vec(w.to_bytes()).unwrap()
    };
    let cv = ControlVector::from_gguf(
        &file("controlvector", &[("direction.1", d), ("direction.2", d)]),
        3,
        d,
    )
    .unwrap();
    assert_eq!(
        cv.directions.keys().copied().collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(matches!(
        ControlVector::from_gguf(&file("llama", &[("direction.1", d)]), 3, d),
        Err(ControlVectorError::NotControlVector(_))
    ));
    for bad in [
        ("direction.1", d + 1),
        ("direction.0", d),
        ("direction.3", d),
        ("direction.x", d),
    ] {
        assert!(
            matches!(
                ControlVector::from_gguf(&file("controlvector", &[bad]), 3, d),
                Err(ControlVectorError::BadDirection { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        ControlVector::from_gguf(&file("controlvector", &[]), 3, d),
        Err(ControlVectorError::Empty)
    ));

    let controls = std::collections::HashMap::from([("calm".to_owned(), cv)]);
    let info = model_info(&model, "m", 0);
    let req = |steering: serde_json::Value| {
        CompletionRequest::from_value(
            &json!({"model":"m","prompt":"x","steering":steering}),
            Endpoint::Completions,
        )
        .unwrap()
    };
    let g = prepare(
        &req(json!([{"control_vector":"calm","scale":2}])),
        &model,
        &info,
        &controls,
        1,
    )
    .unwrap();
    assert_eq!(
        g.steering.iter().map(|s| s.layer).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!((g.steering[0].vector[1] - 0.02).abs() < 1e-6, "scaled by 2");
    let g = prepare(
        &req(json!([{"control_vector":"calm","layer":2}])),
        &model,
        &info,
        &controls,
        1,
    )
    .unwrap();
    assert_eq!(
        g.steering.iter().map(|s| s.layer).collect::<Vec<_>>(),
        vec![2]
    );
    let e = prepare(
        &req(json!([{"control_vector":"nope"}])),
        &model,
        &info,
        &controls,
        1,
    )
    .unwrap_err();
    assert_eq!(
        (e.status(), e.param.as_deref()),
        (400, Some("steering[0].control_vector"))
    );
}

/// Preparing a request with contrast pairs runs no model work: it tokenizes the
/// texts and counts them into the Hold; the engine refuses the request until
/// `resolve` has run them, and then each pair's vector is its scale times the pair's
/// contrast vector, in the place of its entry.
#[test]
fn contrast_pairs_run_only_when_resolved() {
    let model = tiny(3);
    let info = model_info(&model, "m", 0);
    let body = json!({"model":"m","prompt":"x","max_tokens":4,"n":2,"steering":[
        {"layer":1,"vector":vec![0.5; model.config.d_model],"scale":1},
        {"layer":2,"positive":"happy day","negative":"sad night","scale":3}]});
    let req = CompletionRequest::from_value(&body, Endpoint::Completions).unwrap();
    let mut g = prepare(&req, &model, &info, &Default::default(), 1).unwrap();
    let tok = |t: &str| model.tokenizer.encode(t, true, true).unwrap().len();
    let contrast = tok("happy day") + tok("sad night");
    assert_eq!(g.contrast_tokens(), contrast);
    assert_eq!(
        g.hold_tokens(),
        (g.prompts[0].len() + 2 * 4 + contrast) as u64
    );
    assert!(g.steering[1].vector.is_empty(), "no vector before resolve");
    let mut s = Scheduler::new(
        Arc::clone(&model),
        SchedulerConfig::with_kv_bytes(&model, 64 << 20),
    );
    let refused = s.submit(g.clone(), Box::new(|_| true)).unwrap_err();
    assert_eq!(refused.status(), 500, "{refused}");
    acs_engine::resolve(&mut g, &model).unwrap();
    assert!(g.contrasts.is_empty());
    let want: Vec<f32> = contrast_vector(&model, "happy day", "sad night", 2)
        .unwrap()
        .iter()
        .map(|v| v * 3.0)
        .collect();
    assert_eq!(g.steering[1].layer, 2);
    assert_eq!(g.steering[1].vector, want);
    assert_eq!(g.steering[0].vector, vec![0.5; model.config.d_model]);
    assert!(s.submit(g, Box::new(|_| true)).is_ok());
}
