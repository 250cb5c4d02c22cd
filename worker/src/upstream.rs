//! The `acs` servers behind the edge: which ones (configuration), how to reach them
//! (the one a request's prompt maps to, so that repeated prompts meet the upstream that
//! keeps them, unless it is much busier than another; moving on past one that refuses
//! the connection) and how to read what they stream back (`acs serve --edge-secret`,
//! see `crates/acs-server/src/http/edge.rs`).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

use acs_core::response::List;
use acs_core::{Answer, ApiError, ErrorBody, ErrorCode, ModelInfo, Usage, jobs};
use wasm_bindgen::JsValue;
use worker::{AbortSignal, Delay, Env, Fetch, Headers, Method, Request, RequestInit, Response};

/// The header that carries the shared secret to an upstream.
pub const SECRET_HEADER: &str = "x-acs-edge-secret";
/// The header that names whose rules validate a body (`completions` or `jobs`).
pub const ENDPOINT_HEADER: &str = "x-acs-endpoint";
/// The header that names whose run the edge sends: an upstream shares prompts (its
/// prompt cache, prefills in progress) only among runs of one scope, so that one
/// key's `cached_tokens` never tell of another key's prompts.
pub const SCOPE_HEADER: &str = "x-acs-cache-scope";
/// The header in which an upstream reports its load: the requests running and
/// waiting there, of every key.
pub const LOAD_HEADER: &str = "x-acs-load";

/// Runs that may go to a prompt's own upstream beyond those of the least busy one:
/// above that, the run goes to the least busy instead.
const AFFINITY_SLACK: usize = 4;

/// How long an upstream has to answer a request that starts no run (a prepare, its
/// model list) before the next one is tried. A run waits as long as it takes: moving
/// it on could start it twice.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an upstream's report of its load counts: an older one says little of
/// now, and the upstream counts as loaded by this key's runs alone.
const REPORT_TTL_MS: i64 = 10_000;

/// How long an upstream that failed once (refused, broke off, did not answer in time,
/// or failed its health check) is tried after the others, unless
/// `ACS_UPSTREAM_COOLDOWN_MS` says otherwise; each failure in a row doubles it, up to
/// [`MAX_COOLDOWN_MS`].
const COOLDOWN_MS: i64 = 30_000;

/// The longest an upstream is tried after the others, however often it failed.
const MAX_COOLDOWN_MS: i64 = 10 * 60_000;

/// How long an upstream that failed has to answer its health check (`GET /health`)
/// before a request is sent to it again.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The upstreams of this edge, from the `ACS_UPSTREAMS` variable (URLs separated by
/// commas or spaces) and the `ACS_EDGE_SECRET` secret.
///
/// A run goes to the upstream its prompts map to (a hash of the beginning of the
/// body's `prompt`): an `acs` server keeps the prompts it prefilled (its prompt
/// cache), so a prompt sampled again, as rollouts are, skips its prefill there, one
/// that begins like a kept one prefills only the rest, and requests that arrive
/// together with prompts that begin alike share that beginning's prefill. Distinct
/// prompts spread over the upstreams, and so do a prompt's runs once its upstream has
/// [`AFFINITY_SLACK`] more runs than the least busy. An upstream's runs are what it
/// reported of all keys' ([`LOAD_HEADER`], on its last answer to this key's object,
/// if recent) or this key's own running there, whichever is more.
///
/// Upstreams may serve different models: one that answers a request's model with 404
/// (`model_not_found`) is passed over for the next, and remembered, so that the
/// model's later requests try the upstreams that serve it first.
///
/// An upstream that fails is tried after the others for [`COOLDOWN_MS`], twice that
/// after a second failure in a row, and so on, so that one that is down or hangs
/// costs one request its wait, not every request. Before a request goes to an
/// upstream whose last attempt failed, the upstream must answer its health check
/// within [`PROBE_TIMEOUT`]; one that does not has failed again. Any answer clears
/// its failures.
#[derive(Debug)]
pub struct Upstreams {
    urls: Vec<String>,
    secret: String,
    /// Where the next request without a prompt starts its round.
    next: Cell<usize>,
    /// Runs in flight on each upstream.
    running: Rc<[Cell<usize>]>,
    /// The [`SCOPE_HEADER`] of the runs sent: the key's own, none for a stateless
    /// caller.
    scope: Option<String>,
    /// (upstream, model) pairs where the upstream answered that it does not serve
    /// the model: those are tried last.
    missing: RefCell<HashSet<(usize, String)>>,
    /// Until when (Unix ms) each upstream is tried after the others, since it failed.
    cooling: Rc<[Cell<i64>]>,
    /// Each upstream's last report of its load, and when it came (Unix ms).
    reported: Rc<[Cell<(usize, i64)>]>,
    /// Each upstream's failures since its last answer.
    failures: Rc<[Cell<u32>]>,
    /// The cooldown after one failure (ms).
    cooldown_ms: i64,
}

/// A run's place on an upstream: counted in [`Upstreams`]' load until dropped.
#[derive(Debug)]
pub struct Lease {
    running: Rc<[Cell<usize>]>,
    at: usize,
    /// The upstream's URL, for the key's usage log.
    url: String,
}

impl Lease {
    /// The URL of the upstream that runs this.
    pub fn upstream(&self) -> &str {
        &self.url
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let c = &self.running[self.at];
        c.set(c.get().saturating_sub(1));
    }
}

/// 64-bit FNV-1a: a stable hash (the same on every edge instance and release), which
/// `std`'s hasher does not promise.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The bytes of a body's `prompt` (as JSON) that choose its upstream: about 50 tokens
/// of English text, more than the 16 a server needs to share a beginning, so that
/// prompts that begin alike (a system prompt, a few-shot preamble) meet on one server
/// while prompts that differ early spread.
const ROUTE_PREFIX_BYTES: usize = 256;

/// `answer`, or an error once `limit` has passed without it.
async fn within(
    limit: Duration,
    answer: impl std::future::Future<Output = worker::Result<Response>>,
) -> worker::Result<Response> {
    let answer = std::pin::pin!(answer);
    let timer = std::pin::pin!(Delay::from(limit));
    match futures_util::future::select(answer, timer).await {
        futures_util::future::Either::Left((answered, _)) => answered,
        futures_util::future::Either::Right(((), _)) => Err(worker::Error::RustError(format!(
            "no answer within {} s",
            limit.as_secs()
        ))),
    }
}

/// The cooldown after the `n`th failure in a row: `base`, doubled for each failure
/// before, at most [`MAX_COOLDOWN_MS`].
fn cooldown(base: i64, n: u32) -> i64 {
    let doublings = n.saturating_sub(1).min(20);
    base.max(0)
        .saturating_mul(1 << doublings)
        .min(MAX_COOLDOWN_MS)
}

/// The `model` a request body names, if it is JSON that names one.
fn model_of(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(v.get("model")?.as_str()?.to_owned())
}

/// The hash of the beginning of a request body's prompts (a chat body's messages), if
/// it has any.
fn prompt_hash(body: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let prompt = v.get("prompt").or_else(|| v.get("messages"))?.to_string();
    let bytes = prompt.as_bytes();
    Some(fnv1a(&bytes[..bytes.len().min(ROUTE_PREFIX_BYTES)]))
}

/// Whose rules validate a body upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completion-jobs`.
    Jobs,
}

impl Endpoint {
    /// The route, as the usage log names it.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Jobs => "/v1/completion-jobs",
        }
    }

    fn header(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
            Endpoint::Jobs => "jobs",
        }
    }
}

fn unavailable(detail: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::UpstreamUnavailable,
        format!("No model server answered: {detail}. Retry shortly."),
    )
    .with_retry_after(1)
}

impl Upstreams {
    /// Reads the configuration.
    pub fn from_env(env: &Env) -> Result<Upstreams, ApiError> {
        let urls: Vec<String> = env
            .var("ACS_UPSTREAMS")
            .map(|v| v.to_string())
            .unwrap_or_default()
            .split([',', ' ', '\n'])
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Err(ApiError::internal(
                "ACS_UPSTREAMS lists no upstream acs servers",
            ));
        }
        let secret = env
            .secret("ACS_EDGE_SECRET")
            .map(|s| s.to_string())
            .or_else(|_| env.var("ACS_EDGE_SECRET").map(|s| s.to_string()))
            .map_err(|_| ApiError::internal("ACS_EDGE_SECRET is not set"))?;
        let running = urls.iter().map(|_| Cell::new(0)).collect();
        let cooling = urls.iter().map(|_| Cell::new(0)).collect();
        let reported = urls.iter().map(|_| Cell::new((0, 0))).collect();
        let failures = urls.iter().map(|_| Cell::new(0)).collect();
        let cooldown_ms = env
            .var("ACS_UPSTREAM_COOLDOWN_MS")
            .ok()
            .and_then(|v| v.to_string().trim().parse().ok())
            .unwrap_or(COOLDOWN_MS);
        Ok(Upstreams {
            urls,
            secret,
            next: Cell::new(0),
            running,
            scope: None,
            missing: RefCell::default(),
            cooling,
            reported,
            failures,
            cooldown_ms,
        })
    }

    /// These upstreams, sending runs as `scope`'s ([`SCOPE_HEADER`]).
    pub fn scoped(self, scope: String) -> Upstreams {
        Upstreams {
            scope: Some(scope),
            ..self
        }
    }

    /// How many upstreams there are.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Notes a failure of upstream `at`: it is tried after the others for the
    /// cooldown, doubled for each failure before this one since its last answer.
    fn failed(&self, at: usize) {
        let n = self.failures[at].get().saturating_add(1);
        self.failures[at].set(n);
        let wait = cooldown(self.cooldown_ms, n);
        self.cooling[at].set(crate::http::now().0 + wait);
    }

    /// Notes an answer of upstream `at`: its failures are over.
    fn answered(&self, at: usize) {
        self.failures[at].set(0);
        self.cooling[at].set(0);
    }

    /// Whether upstream `at` answers `GET /health` with 200 within [`PROBE_TIMEOUT`].
    async fn healthy(&self, at: usize) -> bool {
        let url = format!("{}/health", self.urls[at]);
        let Ok(req) = Request::new(&url, Method::Get) else {
            return false;
        };
        let answer = within(PROBE_TIMEOUT, Fetch::Request(req).send()).await;
        answer.is_ok_and(|r| r.status_code() == 200)
    }

    /// The upstream a request goes to first: its prompts' own (see [`Upstreams`]),
    /// or for a request without prompts the next of a round.
    fn first(&self, body: Option<&str>) -> usize {
        let n = self.urls.len();
        let Some(hash) = body.and_then(prompt_hash) else {
            let start = self.next.get();
            self.next.set(start.wrapping_add(1));
            return start % n;
        };
        let own = (hash % n as u64) as usize;
        let now = crate::http::now().0;
        let load = |i: usize| {
            let (reported, at) = self.reported[i].get();
            let fresh = now - at < REPORT_TTL_MS;
            self.running[i].get().max(if fresh { reported } else { 0 })
        };
        let least = (0..n).min_by_key(|&i| load(i)).unwrap_or(own);
        if load(own) <= load(least) + AFFINITY_SLACK {
            own
        } else {
            least
        }
    }

    /// Sends a request to the upstreams in turn, starting with the [`Upstreams::first`]
    /// of its body, until one answers; one that refuses the connection is skipped. Any
    /// HTTP answer is the answer, from the upstream whose index comes with it. `run`
    /// is the stop switch of a run, `None` for any other request.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, Endpoint)>,
        run: Option<&AbortSignal>,
    ) -> Result<(Response, usize), ApiError> {
        let start = self.first(body.map(|(text, _)| text));
        let model = body.and_then(|(text, _)| model_of(text));
        let n = self.urls.len();
        let mut order: Vec<usize> = (0..n).map(|i| (start + i) % n).collect();
        let now = crate::http::now().0;
        {
            let missing = self.missing.borrow();
            // Stable: the prompt's own upstream stays first among those that serve
            // its model and have not failed lately.
            order.sort_by_key(|&at| {
                let not_served = model
                    .as_ref()
                    .is_some_and(|m| missing.contains(&(at, m.clone())));
                (not_served, self.cooling[at].get() > now)
            });
        }
        let mut last = String::new();
        let mut not_served = None;
        for at in order {
            let base = &self.urls[at];
            if self.failures[at].get() > 0 && !self.healthy(at).await {
                self.failed(at);
                last = format!("{base}: no answer to its health check");
                continue;
            }
            let headers = Headers::new();
            let set = |k: &str, v: &str| {
                headers
                    .set(k, v)
                    .map_err(|e| ApiError::internal(format!("header {k}: {e}")))
            };
            set(SECRET_HEADER, &self.secret)?;
            if let Some(scope) = &self.scope {
                set(SCOPE_HEADER, scope)?;
            }
            let mut init = RequestInit::new();
            init.with_method(method.clone());
            if let Some((text, endpoint)) = body {
                set("content-type", "application/json")?;
                set(ENDPOINT_HEADER, endpoint.header())?;
                init.with_body(Some(JsValue::from_str(text)));
            }
            init.with_headers(headers);
            let req = Request::new_with_init(&format!("{base}{path}"), &init)
                .map_err(|e| ApiError::internal(format!("upstream request: {e}")))?;
            let sent = match run {
                Some(s) => Fetch::Request(req).send_with_signal(s).await,
                None => within(ANSWER_TIMEOUT, Fetch::Request(req).send()).await,
            };
            match sent {
                // A body's only 404 is its model's: another upstream may serve it.
                Ok(resp) if resp.status_code() == 404 && model.is_some() => {
                    self.answered(at);
                    if let Some(m) = &model {
                        self.missing.borrow_mut().insert((at, m.clone()));
                    }
                    not_served = Some((resp, at));
                }
                Ok(resp) => {
                    self.answered(at);
                    if let Some(m) = &model {
                        self.missing.borrow_mut().remove(&(at, m.clone()));
                    }
                    let load = resp.headers().get(LOAD_HEADER).ok().flatten();
                    if let Some(load) = load.and_then(|v| v.trim().parse().ok()) {
                        self.reported[at].set((load, crate::http::now().0));
                    }
                    return Ok((resp, at));
                }
                Err(e) => {
                    if run.is_some_and(AbortSignal::aborted) {
                        return Err(unavailable("the request was cancelled"));
                    }
                    self.failed(at);
                    worker::console_warn!("upstream {base} failed: {e}");
                    last = format!("{base}: {e}");
                }
            }
        }
        match not_served {
            Some(answer) => Ok(answer),
            None => Err(unavailable(last)),
        }
    }

    /// `GET /v1/models` of every upstream that answers (asked at once): each model
    /// once, in the order of the upstreams.
    pub async fn models(&self) -> Result<List<ModelInfo>, ApiError> {
        let asks = self.urls.iter().map(|base| async move {
            let url = format!("{base}/v1/models")
                .parse()
                .map_err(|e| format!("{base}: {e}"))?;
            match within(ANSWER_TIMEOUT, Fetch::Url(url).send()).await {
                Ok(mut resp) if resp.status_code() == 200 => resp
                    .json::<List<ModelInfo>>()
                    .await
                    .map_err(|e| format!("{base}: {e}")),
                Ok(resp) => Err(format!("{base}: {}", resp.status_code())),
                Err(e) => Err(format!("{base}: {e}")),
            }
        });
        let mut data: Vec<ModelInfo> = Vec::new();
        let mut last = String::new();
        let mut answered = false;
        for list in futures_util::future::join_all(asks).await {
            match list {
                Ok(list) => {
                    answered = true;
                    for m in list.data {
                        if !data.iter().any(|d| d.id == m.id) {
                            data.push(m);
                        }
                    }
                }
                Err(e) => last = e,
            }
        }
        if !answered {
            return Err(unavailable(last));
        }
        Ok(List {
            object: "list".into(),
            data,
            first_id: None,
            last_id: None,
            has_more: false,
        })
    }

    /// How many tokens the request would hold: the upstream validates it against its
    /// model (and answers the contract's error when it is wrong).
    pub async fn hold_tokens(&self, body: &str, endpoint: Endpoint) -> Result<u64, ApiError> {
        let (mut resp, _) = self
            .send(
                Method::Post,
                "/edge/v1/prepare",
                Some((body, endpoint)),
                None,
            )
            .await?;
        if resp.status_code() != 200 {
            return Err(error_of(&mut resp).await);
        }
        #[derive(serde::Deserialize)]
        struct Prepared {
            hold_tokens: u64,
        }
        let p: Prepared = resp
            .json()
            .await
            .map_err(|e| unavailable(format!("unreadable prepare answer: {e}")))?;
        Ok(p.hold_tokens)
    }

    /// Starts the run of a request on an upstream; read it with [`EventParser`], and
    /// keep the [`Lease`] until the run ends (it counts the run in the upstream's load).
    pub async fn run(
        &self,
        body: &str,
        endpoint: Endpoint,
        signal: &AbortSignal,
    ) -> Result<(Response, Lease), ApiError> {
        let (mut resp, at) = self
            .send(
                Method::Post,
                "/edge/v1/run",
                Some((body, endpoint)),
                Some(signal),
            )
            .await?;
        let c = &self.running[at];
        c.set(c.get() + 1);
        let lease = Lease {
            running: Rc::clone(&self.running),
            at,
            url: self.urls[at].clone(),
        };
        if resp.status_code() != 200 {
            return Err(error_of(&mut resp).await);
        }
        Ok((resp, lease))
    }
}

/// The contract's error an upstream answered, or 502 when it answered something else.
pub async fn error_of(resp: &mut Response) -> ApiError {
    let status = resp.status_code();
    let text = resp.text().await.unwrap_or_default();
    serde_json::from_str::<ErrorBody>(&text)
        .ok()
        .and_then(|b| ApiError::from_body(&b))
        .unwrap_or_else(|| unavailable(format!("the upstream answered {status}")))
}

/// One event of an upstream's run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// A chunk for a streaming client, as JSON text.
    Chunk(String),
    /// Usage so far.
    Usage(Usage),
    /// The whole answer (clients that do not stream): a Completion or a chat
    /// completion.
    Result(Box<Answer>),
    /// The run failed.
    Error(ApiError),
    /// The end.
    Done,
}

/// The longest event the edge reads: a stored job result and its framing.
pub const MAX_EVENT_BYTES: usize = jobs::MAX_RESULT_BYTES + (64 << 10);

fn too_large() -> ApiError {
    ApiError::new(
        ErrorCode::ResultTooLarge,
        format!(
            "The result is over the {} MiB the edge carries in one piece; stream it \
             (`stream: true`) or ask for fewer choices, tokens, logprobs or activation \
             positions.",
            jobs::MAX_RESULT_BYTES >> 20
        ),
    )
}

/// Splits a server-sent event stream into [`RunEvent`]s as its bytes arrive.
#[derive(Debug, Default)]
pub struct EventParser {
    buf: Vec<u8>,
    /// An event grew past [`MAX_EVENT_BYTES`]: the rest of the stream is skipped.
    overflowed: bool,
    /// How much of `buf` was searched for an event's end already: a search resumes
    /// one byte before it (an end split over two pushes), so that a big event that
    /// arrives in many small pieces costs its length once, not once per piece.
    searched: usize,
}

impl EventParser {
    /// Takes more bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<RunEvent>, ApiError> {
        if self.overflowed {
            return Ok(Vec::new());
        }
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        let (mut start, mut at) = (0, self.searched.saturating_sub(1));
        while let Some(i) = self.buf[at..].windows(2).position(|w| w == b"\n\n") {
            let end = at + i + 2;
            if let Some(e) = parse_event(&self.buf[start..end])? {
                events.push(e);
            }
            (start, at) = (end, end);
        }
        self.buf.drain(..start);
        self.searched = self.buf.len();
        if self.buf.len() > MAX_EVENT_BYTES {
            // The isolate's memory bounds what one event (a whole result) may be.
            self.overflowed = true;
            self.buf = Vec::new();
            events.push(RunEvent::Error(too_large()));
        }
        Ok(events)
    }
}

/// One event block (its lines and the blank line after them); `None` for an event
/// of a name this parser does not know.
fn parse_event(block: &[u8]) -> Result<Option<RunEvent>, ApiError> {
    let text = std::str::from_utf8(block)
        .map_err(|_| unavailable("the upstream sent an event that is not UTF-8"))?;
    let (mut name, mut data) = (None, String::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    let bad = |what: &str, e: serde_json::Error| {
        unavailable(format!("the upstream sent a bad {what} event: {e}"))
    };
    Ok(Some(match name {
        None if data == "[DONE]" => RunEvent::Done,
        None => RunEvent::Chunk(data),
        Some("usage") => RunEvent::Usage(serde_json::from_str(&data).map_err(|e| bad("usage", e))?),
        Some("result") => {
            RunEvent::Result(serde_json::from_str(&data).map_err(|e| bad("result", e))?)
        }
        Some("error") => {
            let body: ErrorBody = serde_json::from_str(&data).map_err(|e| bad("error", e))?;
            RunEvent::Error(
                ApiError::from_body(&body)
                    .unwrap_or_else(|| ApiError::internal(body.error.message)),
            )
        }
        Some(_) => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_in_a_row_doubles_the_cooldown_up_to_its_cap() {
        assert_eq!(cooldown(30_000, 1), 30_000);
        assert_eq!(cooldown(30_000, 2), 60_000);
        assert_eq!(cooldown(30_000, 3), 120_000);
        assert_eq!(cooldown(30_000, 6), MAX_COOLDOWN_MS);
        assert_eq!(cooldown(30_000, u32::MAX), MAX_COOLDOWN_MS);
        assert_eq!(cooldown(-5, 3), 0);
    }

    /// The same events whether the stream arrives whole or a byte at a time, a big
    /// event and an event end split over two pieces included.
    #[test]
    fn events_are_the_same_however_the_bytes_arrive() {
        let big = "x".repeat(100_000);
        let stream = format!(
            "data: {{\"a\":1}}\n\nevent: ping\ndata: 1\n\ndata: {big}\n\nevent: usage\ndata: {{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\ndata: [DONE]\n\n"
        );
        let mut whole = EventParser::default();
        let want = whole.push(stream.as_bytes()).unwrap();
        assert_eq!(want.len(), 4, "{want:?}");
        assert_eq!(want[0], RunEvent::Chunk("{\"a\":1}".into()));
        assert_eq!(want[1], RunEvent::Chunk(big.clone()));
        assert!(matches!(&want[2], RunEvent::Usage(u) if u.total_tokens == 5));
        assert_eq!(want[3], RunEvent::Done);
        let mut bytewise = EventParser::default();
        let mut got = Vec::new();
        for b in stream.as_bytes() {
            got.extend(bytewise.push(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(got, want);
        assert!(bytewise.buf.is_empty());
    }

    /// An event longer than the edge carries ends the run with `result_too_large`
    /// once, after the events before it, and the buffer holds no more of it.
    #[test]
    fn an_event_past_the_limit_is_refused_and_not_kept() {
        let mut p = EventParser::default();
        let first = p.push(b"event: usage\ndata: {\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}\n\nevent: result\ndata: ").unwrap();
        assert!(matches!(&first[..], [RunEvent::Usage(_)]), "{first:?}");
        let piece = vec![b'x'; 1 << 20];
        let mut errors = Vec::new();
        for _ in 0..(MAX_EVENT_BYTES >> 20) + 2 {
            errors.extend(p.push(&piece).unwrap());
            assert!(p.buf.len() <= MAX_EVENT_BYTES + piece.len());
        }
        assert!(
            matches!(&errors[..], [RunEvent::Error(e)] if e.code == ErrorCode::ResultTooLarge),
            "{errors:?}"
        );
        assert!(p.buf.is_empty());
        assert!(p.push(b"\n\ndata: [DONE]\n\n").unwrap().is_empty());
    }
}
