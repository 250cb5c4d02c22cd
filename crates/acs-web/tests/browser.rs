//! The package in headless Chromium (SwiftShader WebGPU), through the JS API the page
//! uses: a generated model, completions with several prompts × n, streaming,
//! steering, jobs to their result, a reload's saved jobs, Budgets, bad input, a file
//! streamed to either backend, a split model streamed file by file.
//!
//! Run: `wasm-pack test --headless --chrome --chromedriver /usr/bin/chromedriver
//! crates/acs-web` (`webdriver.json` beside the crate turns WebGPU on).
#![cfg(target_arch = "wasm32")]

use acs_llama::testgen::{TestModelSpec, test_model_bytes};
use acs_web::Acs;
use serde_json::{Value, json};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

fn model() -> Vec<u8> {
    test_model_bytes(&TestModelSpec::tiny()).expect("model")
}

async fn load(backend: &str) -> Acs {
    let options = js(&json!({ "backend": backend, "modelId": "tiny" }));
    Acs::load(model(), options).await.expect("the model loads")
}

fn js(v: &Value) -> JsValue {
    use serde::Serialize;
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .expect("to js")
}

fn val(v: JsValue) -> Value {
    serde_wasm_bindgen::from_value(v).expect("from js")
}

async fn complete(acs: &Acs, body: Value) -> Result<Value, JsValue> {
    JsFuture::from(acs.completions(js(&body), None, None))
        .await
        .map(val)
}

async fn create(acs: &Acs, body: &Value, key: Option<&str>) -> Result<Value, JsValue> {
    JsFuture::from(acs.create_job(js(body), key.map(str::to_owned)))
        .await
        .map(val)
}

/// A `ReadableStream` of `bytes` in chunks of `size`, as a download delivers them.
fn stream_of(bytes: &[u8], size: usize) -> JsValue {
    let make = js_sys::Function::new_with_args(
        "bytes, size",
        "let i = 0; return new ReadableStream({ pull(c) { \
           if (i >= bytes.length) { c.close(); return; } \
           c.enqueue(bytes.slice(i, i + size)); i += size; } });",
    );
    make.call2(
        &JsValue::NULL,
        &js_sys::Uint8Array::from(bytes).into(),
        &JsValue::from(size as u32),
    )
    .expect("a stream")
}

fn status(e: &JsValue) -> u16 {
    js_sys::Reflect::get(e, &"status".into())
        .ok()
        .and_then(|s| s.as_f64())
        .unwrap_or(0.0) as u16
}

async fn sleep(ms: i32) {
    let p = js_sys::Promise::new(&mut |resolve, _| {
        let f: js_sys::Function = js_sys::Reflect::get(&js_sys::global(), &"setTimeout".into())
            .unwrap()
            .unchecked_into();
        f.call2(&JsValue::NULL, &resolve, &ms.into()).unwrap();
    });
    JsFuture::from(p).await.unwrap();
}

fn body(n: u32, extra: Value) -> Value {
    let mut b = json!({
        "model": "llama-8b",
        "prompt": ["Once upon a time", "The answer is"],
        "n": n,
        "max_tokens": 5,
        "temperature": 0.8,
        "seed": 7,
    });
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

#[wasm_bindgen_test]
async fn two_prompts_times_n_two_on_webgpu() {
    let acs = load("webgpu").await;
    assert!(acs.backend().starts_with("webgpu"), "{}", acs.backend());
    let c = complete(&acs, body(2, json!({}))).await.expect("completes");
    let choices = c["choices"].as_array().unwrap();
    let idx: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1, 2, 3]);
    let one = complete(&acs, body(1, json!({}))).await.expect("completes");
    // Each prompt counts once, whatever n.
    assert_eq!(c["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    // The second request's prompts come from the prompt cache (kept on the GPU).
    let cached = |c: &Value| c["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    assert_eq!(cached(&c), 0);
    assert_eq!(cached(&one), one["usage"]["prompt_tokens"]);
    let u = &c["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    assert!(u["completion_tokens"].as_u64().unwrap() <= 4 * 5);
    let models = val(acs.models());
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][1]["id"], "llama-8b");
}

#[wasm_bindgen_test]
async fn streaming_chunks_add_up_to_the_completion() {
    let acs = load("webgpu").await;
    let chunks = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = {
        let chunks = chunks.clone();
        wasm_bindgen::closure::Closure::<dyn FnMut(JsValue) -> bool>::new(move |c: JsValue| {
            chunks.borrow_mut().push(val(c));
            true
        })
    };
    let b = body(
        2,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let whole = JsFuture::from(acs.completions(
        js(&b),
        Some(sink.as_ref().unchecked_ref::<js_sys::Function>().clone()),
        None,
    ))
    .await
    .map(val)
    .expect("streams");
    let chunks = chunks.borrow();
    assert!(chunks.len() >= 2, "{} chunks", chunks.len());
    let mut texts = vec![String::new(); 4];
    for c in chunks.iter() {
        for ch in c["choices"].as_array().unwrap() {
            texts[ch["index"].as_u64().unwrap() as usize] += ch["text"].as_str().unwrap();
        }
    }
    for (i, ch) in whole["choices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(ch["text"].as_str().unwrap(), texts[i], "choice {i}");
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"], whole["usage"]);
}

#[wasm_bindgen_test]
async fn steering_changes_greedy_text_and_only_for_its_request() {
    let acs = load("webgpu").await;
    let greedy = json!({"temperature": 0, "max_tokens": 8});
    let plain = complete(&acs, body(1, greedy.clone())).await.unwrap();
    let again = complete(&acs, body(1, greedy.clone())).await.unwrap();
    assert_eq!(
        plain["choices"], again["choices"],
        "greedy decoding repeats"
    );
    let vector: Vec<f32> = (0..64)
        .map(|i| if i % 2 == 0 { 40.0 } else { -40.0 })
        .collect();
    let mut steered = greedy.clone();
    steered["steering"] = json!([{"layer": 0, "vector": vector, "scale": 1.0}]);
    let s = complete(&acs, body(1, steered)).await.unwrap();
    assert_ne!(s["choices"], plain["choices"], "steering changed nothing");
    let mut wrong = greedy;
    wrong["steering"] = json!([{"layer": 0, "vector": [1.0, 2.0], "scale": 1.0}]);
    let e = complete(&acs, body(1, wrong)).await.unwrap_err();
    assert_eq!(status(&e), 400);
}

async fn until_final(acs: &Acs, id: &str) -> Value {
    for _ in 0..600 {
        let j = val(acs.job(id).expect("the job exists"));
        if ["succeeded", "failed", "cancelled", "expired"].contains(&j["status"].as_str().unwrap())
        {
            return j;
        }
        sleep(20).await;
    }
    panic!("job {id} never ended");
}

#[wasm_bindgen_test]
async fn a_job_runs_to_its_result_and_replays_its_idempotency_key() {
    let acs = load("webgpu").await;
    let b = body(
        2,
        json!({"activations": {"layers": [0, 1], "positions": "last"}}),
    );
    let created = create(&acs, &b, Some("job-1")).await.expect("accepted");
    assert_eq!(created["replayed"], false);
    let id = created["job"]["id"].as_str().unwrap().to_owned();
    let replay = create(&acs, &b, Some("job-1")).await.unwrap();
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["job"]["id"], id.as_str());
    let other = json!({"model": "llama-8b", "prompt": "x", "max_tokens": 1});
    let e = create(&acs, &other, Some("job-1")).await.unwrap_err();
    assert_eq!(status(&e), 422, "a key reused with another body");
    let j = until_final(&acs, &id).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    let r = val(acs.job_result(&id).expect("a result"));
    assert_eq!(r["choices"].as_array().unwrap().len(), 4);
    assert_eq!(
        r["activations"].as_array().unwrap().len(),
        4,
        "2 prompts × 2 layers"
    );
    let list = val(acs.jobs(None, None).unwrap());
    assert_eq!(list["data"][0]["id"], id.as_str());
    let budget = val(acs.budget().unwrap());
    assert_eq!(budget["tokens_held"], 0);
}

#[wasm_bindgen_test]
async fn saved_jobs_survive_a_reload_and_run_on_the_cpu() {
    let acs = load("cpu").await;
    assert_eq!(acs.backend(), "cpu");
    let b = body(2, json!({}));
    let created = create(&acs, &b, None).await.unwrap();
    let id = created["job"]["id"].as_str().unwrap().to_owned();
    // The page goes away before the job ran: the next one starts from what it saved.
    let saved = acs.snapshot();
    drop(acs);
    let options = js(&json!({"backend": "cpu", "modelId": "tiny", "snapshot": saved}));
    let again = Acs::load(model(), options).await.expect("reloads");
    let j = until_final(&again, &id).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    assert_eq!(
        val(again.job_result(&id).unwrap())["choices"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
}

#[wasm_bindgen_test]
async fn a_budget_holds_and_charges_as_on_a_server() {
    let acs = load("cpu").await;
    acs.set_budget(60.0, 4).unwrap();
    // Hold = prompts + 4 choices × 50 tokens > 60: refused outright.
    let e = complete(&acs, body(2, json!({"max_tokens": 50})))
        .await
        .unwrap_err();
    assert_eq!(status(&e), 402);
    let c = complete(&acs, body(1, json!({"max_tokens": 3})))
        .await
        .unwrap();
    let b = val(acs.budget().unwrap());
    assert_eq!(
        b["tokens_left"].as_u64().unwrap(),
        60 - c["usage"]["total_tokens"].as_u64().unwrap()
    );
    assert_eq!(b["tokens_held"], 0);
}

#[wasm_bindgen_test]
async fn bad_input_gets_the_contracts_errors() {
    let e = Acs::load(b"GGUF but not really".to_vec(), JsValue::UNDEFINED)
        .await
        .unwrap_err();
    let msg = e.dyn_ref::<js_sys::Error>().unwrap().message();
    assert!(String::from(msg).contains("GGUF"));
    let acs = load("cpu").await;
    let e = complete(&acs, json!({"model": "nope", "prompt": "x"}))
        .await
        .unwrap_err();
    assert_eq!(status(&e), 404);
    let e = JsFuture::from(acs.completions(JsValue::from_str("{not json"), None, None))
        .await
        .unwrap_err();
    assert_eq!(status(&e), 400);
    let e = acs.job("not-a-job").unwrap_err();
    assert_eq!(status(&e), 404);
}

#[wasm_bindgen_test]
async fn a_streamed_file_goes_to_the_gpu_tensor_by_tensor() {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let on_progress = {
        let seen = seen.clone();
        wasm_bindgen::closure::Closure::<dyn FnMut(JsValue)>::new(move |p: JsValue| {
            seen.borrow_mut().push(val(p));
        })
    };
    let options = js(&json!({"backend": "webgpu", "modelId": "tiny"}));
    // Chunks of 1000 bytes: tensors span chunks, and the header takes several.
    let streamed = Acs::load_stream(
        stream_of(&bytes, 1000),
        options,
        Some(
            on_progress
                .as_ref()
                .unchecked_ref::<js_sys::Function>()
                .clone(),
        ),
    )
    .await
    .expect("loads from a stream");
    assert!(streamed.backend().starts_with("webgpu"));
    let last = seen
        .borrow()
        .last()
        .cloned()
        .expect("progress was reported");
    assert_eq!(last["loaded"].as_u64(), Some(bytes.len() as u64));
    assert!(last["tensors_total"].as_u64().unwrap() > 0);
    assert_eq!(last["tensors"], last["tensors_total"], "{last}");
    // The same greedy text as the model loaded whole, on the CPU.
    let cpu = load("cpu").await;
    let greedy = body(2, json!({"temperature": 0, "max_tokens": 6}));
    let a = complete(&streamed, greedy.clone()).await.unwrap();
    let b = complete(&cpu, greedy).await.unwrap();
    assert_eq!(a["choices"], b["choices"]);
    // Contrast steering runs its read-out on the GPU: the CPU model has no weights.
    let mut steered = body(1, json!({"temperature": 0, "max_tokens": 6}));
    steered["steering"] =
        json!([{"layer": 1, "positive": "happy glad", "negative": "sad", "scale": 8.0}]);
    let s = complete(&streamed, steered.clone())
        .await
        .expect("contrast steering on the GPU");
    let c = complete(&cpu, steered).await.unwrap();
    assert_eq!(
        s["choices"], c["choices"],
        "the same steering on both backends"
    );
}

#[wasm_bindgen_test]
async fn a_streamed_file_on_the_cpu_and_broken_streams() {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let options = || js(&json!({"backend": "cpu", "modelId": "tiny"}));
    let acs = Acs::load_stream(stream_of(&bytes, 4096), options(), None)
        .await
        .expect("loads");
    assert_eq!(acs.backend(), "cpu");
    assert_eq!(
        complete(&acs, body(2, json!({}))).await.unwrap()["choices"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let message = |e: JsValue| String::from(e.dyn_ref::<js_sys::Error>().unwrap().message());
    for backend in ["cpu", "webgpu"] {
        let o = js(&json!({"backend": backend}));
        // Cut inside the header, then inside the tensors.
        let e = Acs::load_stream(stream_of(&bytes[..100], 64), o.clone(), None)
            .await
            .unwrap_err();
        assert!(message(e).contains("header"), "{backend}");
        let e = Acs::load_stream(stream_of(&bytes[..bytes.len() - 10], 999), o, None)
            .await
            .unwrap_err();
        assert!(!message(e).is_empty(), "{backend}");
    }
    let e = Acs::load_stream(JsValue::from(3), options(), None)
        .await
        .unwrap_err();
    assert!(message(e).contains("ReadableStream"));
}

/// What the worker asks before it fetches a file whole: a prefix inside the header
/// asks for more, a whole header of a model the engine runs passes, and an
/// architecture or a weight format it does not run is refused by name from the header
/// alone (here with no tensor bytes after it).
#[wasm_bindgen_test]
fn a_file_is_judged_by_its_header_before_it_is_fetched() {
    use acs_llama::gguf::{GgufFile, GgufWriter, MetaValue};
    use acs_llama::quant::GgmlType;
    let message = |e: JsValue| String::from(e.dyn_ref::<js_sys::Error>().unwrap().message());
    let bytes = model();
    let file = GgufFile::from_vec(bytes.clone()).unwrap();
    let header_len = file.header().data_offset as usize;
    assert!(Acs::inspect_header(&bytes[..64]).unwrap() > 64.0);
    assert_eq!(Acs::inspect_header(&bytes[..header_len]).unwrap(), 0.0);

    // The same file as another architecture, and with one matrix in Q8_1 (ggml's
    // activation format, which no weight matrix uses).
    let rewrite = |arch: &str, iq4: &str| {
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata().iter() {
            if k != "general.architecture" {
                w.add(k, v.clone());
            }
        }
        w.add("general.architecture", MetaValue::String(arch.into()));
        for t in file.tensors() {
            let (ty, data) = if t.name == iq4 {
                (GgmlType::Q8_1, vec![0u8; t.n_elements() as usize / 32 * 36])
            } else {
                (t.ty, file.tensor_bytes(t).unwrap().to_vec())
            };
            w.add_tensor(t.name.clone(), &t.dims, ty, data).unwrap();
        }
        let bytes = w.to_bytes();
        let len = GgufFile::from_vec(bytes.clone())
            .unwrap()
            .header()
            .data_offset as usize;
        bytes[..len].to_vec()
    };
    let e = message(Acs::inspect_header(&rewrite("mamba", "")).unwrap_err());
    assert!(e.contains("\"mamba\"") && e.contains("gemma3"), "{e}");
    let e = message(Acs::inspect_header(&rewrite("llama", "blk.0.ffn_up.weight")).unwrap_err());
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("Q8_1"),
        "{e}"
    );
}

#[wasm_bindgen_test]
async fn auto_skips_a_software_adapter_for_the_cpu() {
    // Headless Chromium's only adapter is SwiftShader, a software one.
    let acs = load("auto").await;
    assert_eq!(acs.backend(), "cpu");
}

/// A split model's files as `Acs.loadStream` takes them: each `{stream, header}`, the
/// first file's stream given as it is, the others' as functions called in turn.
fn parts_of(parts: &[Vec<u8>], size: usize) -> JsValue {
    let files = js_sys::Array::new();
    for (i, part) in parts.iter().enumerate() {
        let file = js_sys::Object::new();
        let stream = stream_of(part, size);
        let stream = if i == 0 {
            stream
        } else {
            js_sys::Function::new_with_args("s", "return () => Promise.resolve(s);")
                .call1(&JsValue::NULL, &stream)
                .expect("a function")
        };
        js_sys::Reflect::set(&file, &"stream".into(), &stream).unwrap();
        // A prefix that holds the header: a generated model's is under 64 KiB.
        let header = js_sys::Uint8Array::from(&part[..part.len().min(1 << 16)]);
        js_sys::Reflect::set(&file, &"header".into(), &header).unwrap();
        files.push(&file);
    }
    files.into()
}

#[wasm_bindgen_test]
async fn a_split_model_streams_file_by_file_to_either_backend() {
    let bytes = model();
    let file = acs_llama::gguf::GgufFile::from_vec(bytes.clone()).unwrap();
    let parts = acs_llama::gguf::split_model(&file, 3).unwrap();
    let greedy = body(2, json!({"temperature": 0, "max_tokens": 6}));
    let expect = complete(&load("cpu").await, greedy.clone()).await.unwrap();
    for backend in ["webgpu", "cpu"] {
        let options = js(&json!({"backend": backend, "modelId": "tiny"}));
        let acs = Acs::load_stream(parts_of(&parts, 1000), options, None)
            .await
            .unwrap_or_else(|e| panic!("{backend}: {e:?}"));
        assert!(acs.backend().starts_with(backend), "{}", acs.backend());
        let got = complete(&acs, greedy.clone()).await.unwrap();
        assert_eq!(got["choices"], expect["choices"], "{backend}");
    }
    // Short of a file, or the first alone: refused, naming what is missing.
    let message = |e: JsValue| String::from(e.unchecked_into::<js_sys::Error>().message());
    let options = || js(&json!({"backend": "cpu", "modelId": "tiny"}));
    let e = Acs::load_stream(parts_of(&parts[..2], 4096), options(), None)
        .await
        .unwrap_err();
    assert!(
        message(e).contains("2 of the model's 3 parts"),
        "two files of three"
    );
    let e = Acs::load_stream(stream_of(&parts[0], 4096), options(), None)
        .await
        .unwrap_err();
    assert!(
        message(e).contains("1 of the model's 3 parts"),
        "the first file alone"
    );
}

/// The CPU backend with its weights in JS memory (`cpuWeights: "js"`, what a model
/// past wasm32's 4 GiB takes) samples what it samples with them in wasm memory, from
/// a stream, from bytes and from a split model's files; a file cut short is refused
/// with what it lacks, and an unknown choice is refused by name.
#[wasm_bindgen_test]
async fn weights_in_js_memory_sample_as_in_wasm_memory() {
    let bytes = model();
    let options =
        |weights: &str| js(&json!({"backend": "cpu", "modelId": "tiny", "cpuWeights": weights}));
    let greedy = body(2, json!({"temperature": 0, "max_tokens": 6}));
    let sampled = body(2, json!({"max_tokens": 6}));
    let wasm = Acs::load_stream(stream_of(&bytes, 3000), options("wasm"), None)
        .await
        .expect("loads");
    assert_eq!(wasm.backend(), "cpu");
    let file = acs_llama::gguf::GgufFile::from_vec(bytes.clone()).unwrap();
    let parts = acs_llama::gguf::split_model(&file, 3).unwrap();
    let loads = [
        Acs::load_stream(stream_of(&bytes, 3000), options("js"), None).await,
        Acs::load(bytes.clone(), options("js")).await,
        Acs::load_stream(parts_of(&parts, 1000), options("js"), None).await,
    ];
    for (i, acs) in loads.into_iter().enumerate() {
        let acs = acs.unwrap_or_else(|e| panic!("load {i}: {e:?}"));
        assert_eq!(acs.backend(), "cpu (weights in JS memory)", "load {i}");
        for b in [&greedy, &sampled] {
            let (want, got) = (complete(&wasm, b.clone()), complete(&acs, b.clone()));
            let (want, got) = (want.await.unwrap(), got.await.unwrap());
            assert_eq!(got["choices"], want["choices"], "load {i}");
        }
    }
    let message = |e: JsValue| String::from(e.unchecked_into::<js_sys::Error>().message());
    let cut = &bytes[..bytes.len() - 1000];
    let e = Acs::load_stream(stream_of(cut, 4096), options("js"), None)
        .await
        .unwrap_err();
    let m = message(e);
    assert!(m.contains("file 1 of the model ended after"), "{m}");
    let e = Acs::load_stream(stream_of(&bytes, 4096), options("disk"), None)
        .await
        .unwrap_err();
    assert!(message(e).contains("cpuWeights must be"));
}
