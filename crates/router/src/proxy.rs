//! Forwarding one OpenAI request: choose a worker, send, retry elsewhere
//! while nothing has reached the client, then pass the answer through frame
//! by frame (SSE chunks are never buffered).
//!
//! A request is retried only before its first byte: on a connect error, a
//! worker that sends no response head within `first_byte_timeout` (hung),
//! or a 503/429. Once the head is out, a failure of the worker ends an SSE
//! stream with an error event and `[DONE]`, never a silent retry or a hang.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use metrics::counter;
use serde_json::Value;

use crate::error::{sse_interrupted, RouteError};
use crate::metrics as m;
use crate::policy::{chunk_hashes, PolicyKind, RequestInfo};
use crate::retry::backoff;
use crate::split::window::Sample;
use crate::split::{unit_of, Assignment};
use crate::state::RouterState;
use crate::worker::{InFlight, Worker, WorkerId};

/// Largest request body the router reads (prompts are text; 64 MiB is far
/// beyond any context window).
const MAX_BODY: usize = 64 << 20;

/// Headers that belong to one hop and are not forwarded.
const HOP_BY_HOP: [header::HeaderName; 5] = [
    header::CONNECTION,
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The header that tells the client which worker answered.
pub const WORKER_HEADER: &str = "x-ingot-worker";
/// The header that tells the client its experiment or canary arm
/// (`EXPERIMENT:ARM`), when a split applies.
pub const ARM_HEADER: &str = "x-ingot-arm";

/// Why an attempt failed before the first byte.
#[derive(Clone, Copy, Debug)]
enum AttemptError {
    Connect,
    Timeout,
    Status(StatusCode),
}

impl AttemptError {
    fn reason(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Status(s) if s == StatusCode::TOO_MANY_REQUESTS => "status_429",
            Self::Status(_) => "status_503",
        }
    }
}

/// The proxy: every generating and tokenizer route (POST, or GET with no
/// body). A `POST /v1/responses` that continues a stored response
/// (`previous_response_id`) goes to the worker holding it.
pub async fn forward(State(state): State<Arc<RouterState>>, req: Request) -> Response {
    let received = Instant::now();
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return RouteError::BadRequest(format!("cannot read the request body: {e}"))
                .into_response()
        }
    };
    let info = if body.is_empty() && parts.method != Method::POST {
        // `GET /tokenizer_info?model=…`, `GET /api/tags`.
        Ok(RequestInfo {
            model: query_model(parts.uri.query()),
            ..RequestInfo::default()
        })
    } else {
        request_info(&body)
    };
    let mut info = match info {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let pinned = match previous_response(parts.uri.path(), &body) {
        Some(id) => holder(&state, &id, &parts.headers).await,
        None => None,
    };
    let unit = unit_of(&parts.headers, info.user.as_deref());
    let assignment = state.splits.assign(info.model.as_deref(), &unit);
    let shared_chunks = shared_prefix(&state, &mut info).await;
    if let Some(model) = &info.model {
        let renamed = assignment
            .as_ref()
            .is_some_and(|a| a.split.model(a.arm).is_some());
        if !renamed && !state.knows_model(model) && state.is_ready() {
            return RouteError::ModelNotFound(model.clone()).into_response();
        }
    }
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    state.budget().on_request(received);
    let retry = state.config.retry;
    let mut tried: Vec<WorkerId> = Vec::new();
    let mut last: Option<(AttemptError, Option<Response>)> = None;
    for attempt in 1..=retry.max_attempts {
        let now = Instant::now();
        let (candidates, arm) = match pinned {
            // Only the holder has the conversation.
            Some(holder) => {
                let mut c = state.candidates(&info, &tried, now);
                c.retain(|w| w.id == holder);
                (c, None)
            }
            None => choose_arm(&state, &info, assignment.as_ref(), &tried, now),
        };
        let Some(id) = state.policy.select(&info, &candidates) else {
            break;
        };
        let Some(worker) = state.worker(id) else {
            break;
        };
        tried.push(id);
        counter!(m::SELECTIONS, "worker" => worker.label.clone(), "policy" => state.config.policy.as_str())
            .increment(1);
        let guard = worker.begin();
        worker.breaker().on_send(now);
        let sent = Instant::now();
        m::overhead(now.duration_since(received).as_secs_f64());
        let observer = Observer {
            arm: assignment.clone().zip(arm),
            group: worker.group.clone(),
            sent,
        };
        let body = arm_body(&body, assignment.as_ref(), arm);
        match send(&state, &worker, &parts.method, &path, &parts.headers, body).await {
            Ok(resp) => {
                metrics::histogram!(m::UPSTREAM_HEADERS).record(received.elapsed().as_secs_f64());
                worker.breaker().on_success();
                count_request(&state, &worker, resp.status());
                record_prefix(&state, shared_chunks, worker.url());
                return pass_through(resp, guard, observer);
            }
            Err((error, resp)) => {
                m::error(&worker.label, error.reason());
                observer.finish(None, false, "error");
                fail(&worker, error);
                drop(guard);
                last = Some((error, resp));
                if attempt == retry.max_attempts {
                    break;
                }
                if !state.budget().try_retry(Instant::now()) {
                    counter!(m::RETRIES_DENIED).increment(1);
                    break;
                }
                counter!(m::RETRIES, "reason" => error.reason()).increment(1);
                let delay = backoff(&retry, attempt, &mut rand::rng());
                tokio::time::sleep(delay).await;
            }
        }
    }
    match last {
        // The worker's own refusal (503/429) is the most precise answer.
        Some((_, Some(resp))) => resp,
        Some((e, None)) => state
            .no_worker(format!(" (last attempt: {})", e.reason()), Instant::now())
            .into_response(),
        None => state
            .no_worker(String::new(), Instant::now())
            .into_response(),
    }
}

/// The candidates of an attempt and the arm they serve: the request's own
/// arm's group while it has an untried available worker, else the other
/// arm's (a rollback or a failing arm never fails a request that the other
/// group can serve); any worker when no split applies.
fn choose_arm(
    state: &RouterState,
    info: &RequestInfo,
    assignment: Option<&Assignment>,
    tried: &[WorkerId],
    now: Instant,
) -> (Vec<Arc<Worker>>, Option<usize>) {
    let Some(a) = assignment else {
        return (state.candidates(info, tried, now), None);
    };
    for arm in [a.arm, 1 - a.arm] {
        let model = a.split.model(arm).or(info.model.as_deref());
        let c = state.candidates_in(Some(a.split.group(arm)), model, tried, now);
        if !c.is_empty() {
            return (c, Some(arm));
        }
    }
    (Vec::new(), None)
}

/// The body an attempt on `arm` sends: the client's, with `model` replaced
/// when the arm names its own.
fn arm_body(body: &Bytes, assignment: Option<&Assignment>, arm: Option<usize>) -> Bytes {
    let Some(model) = assignment.zip(arm).and_then(|(a, arm)| a.split.model(arm)) else {
        return body.clone();
    };
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(body) else {
        return body.clone();
    };
    obj.insert("model".into(), Value::String(model.to_string()));
    serde_json::to_vec(&obj).map_or_else(|_| body.clone(), Bytes::from)
}

/// Measures one attempt for its worker group and, under a split, its arm.
struct Observer {
    arm: Option<(Assignment, usize)>,
    group: String,
    sent: Instant,
}

impl Observer {
    /// Records the attempt: `chunks` are the body chunk times (none for a
    /// failed attempt).
    fn finish(&self, chunks: Option<&ChunkTimes>, ok: bool, status: &str) {
        let now = Instant::now();
        let sample = Sample {
            ttft_s: chunks
                .and_then(|c| c.first)
                .map(|t| t.duration_since(self.sent).as_secs_f64()),
            itl_s: chunks.and_then(ChunkTimes::mean_gap),
            e2e_s: chunks.map(|_| now.duration_since(self.sent).as_secs_f64()),
            ok,
        };
        m::group_sample(&self.group, status, &sample);
        if let Some((a, arm)) = &self.arm {
            a.split.record(*arm, now, sample);
        }
    }

    fn arm_header(&self) -> Option<HeaderValue> {
        let (a, arm) = self.arm.as_ref()?;
        HeaderValue::from_str(&format!("{}:{}", a.split.label(), a.split.arm_name(*arm))).ok()
    }
}

/// When a response's tokens arrived. In a stream the first token is the
/// first chunk that carries text: OpenAI's chat streams open with a role
/// chunk (`"content":""`) sent before the prefill, which would make every
/// TTFT look instant.
#[derive(Default)]
struct ChunkTimes {
    first: Option<Instant>,
    last: Option<Instant>,
    chunks: u32,
    /// The observer has recorded the response (at its `[DONE]`).
    recorded: bool,
}

impl ChunkTimes {
    fn on_chunk(&mut self, now: Instant, data: &[u8], sse: bool) {
        if self.first.is_none() && sse && !carries_text(data) {
            return;
        }
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.chunks += 1;
    }

    /// The mean gap between token chunks (≥ 2 of them).
    fn mean_gap(&self) -> Option<f64> {
        let (first, last) = (self.first?, self.last?);
        (self.chunks >= 2)
            .then(|| last.duration_since(first).as_secs_f64() / f64::from(self.chunks - 1))
    }
}

/// Whether an SSE chunk ends the stream (`data: [DONE]`).
fn ends_stream(data: &[u8]) -> bool {
    data.trim_ascii_end().ends_with(b"data: [DONE]")
}

/// Whether an SSE chunk carries generated text: a non-empty `"content"`
/// (chat) or `"text"` (completions) string.
fn carries_text(data: &[u8]) -> bool {
    [&b"\"content\":\""[..], &b"\"text\":\""[..]]
        .iter()
        .any(|key| {
            data.windows(key.len())
                .enumerate()
                .any(|(i, w)| w == *key && data.get(i + key.len()).is_some_and(|b| *b != b'"'))
        })
}

/// One attempt. A 503/429 comes back as an error with the worker's
/// response, so that the last one can be returned as is.
async fn send(
    state: &RouterState,
    worker: &Worker,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, (AttemptError, Option<Response>)> {
    let uri = format!("{}{path}", worker.url());
    let mut builder = axum::http::Request::builder()
        .method(method.clone())
        .uri(uri);
    for (k, v) in headers {
        if !HOP_BY_HOP.contains(k) {
            builder = builder.header(k, v);
        }
    }
    let Ok(req) = builder.body(Full::new(body)) else {
        return Err((AttemptError::Connect, None));
    };
    let resp = match tokio::time::timeout(
        state.config.retry.first_byte_timeout,
        state.client.send(req),
    )
    .await
    {
        Err(_) => return Err((AttemptError::Timeout, None)),
        Ok(Err(_)) => return Err((AttemptError::Connect, None)),
        Ok(Ok(resp)) => resp,
    };
    let status = resp.status();
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        let (parts, body) = resp.into_parts();
        let bytes = tokio::time::timeout(state.config.retry.first_byte_timeout, body.collect())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let mut r = Response::from_parts(parts, Body::from(bytes));
        strip_hop_by_hop(r.headers_mut());
        return Err((AttemptError::Status(status), Some(r)));
    }
    Ok(resp)
}

/// Passive health: a failed attempt feeds the breaker; a refused connection
/// also marks the worker down until its next successful probe.
fn fail(worker: &Worker, error: AttemptError) {
    if matches!(error, AttemptError::Status(s) if s == StatusCode::TOO_MANY_REQUESTS) {
        // Overload is not a fault: the worker is healthy, just full.
        return;
    }
    if matches!(error, AttemptError::Connect) {
        worker.set_healthy(false);
    }
    if worker.breaker().on_failure(Instant::now()) {
        counter!(m::BREAKER_OPENS, "worker" => worker.label.clone()).increment(1);
        tracing::warn!(worker = %worker.label, reason = error.reason(), "circuit breaker open");
    }
}

fn count_request(state: &RouterState, worker: &Worker, status: StatusCode) {
    counter!(
        m::REQUESTS,
        "worker" => worker.label.clone(),
        "policy" => state.config.policy.as_str(),
        "status" => status.as_u16().to_string()
    )
    .increment(1);
}

/// The worker's response, its body streamed frame by frame; `guard` keeps
/// the request counted on the worker until the body ends or the client goes.
/// The time to the first chunk and between chunks feed the worker's latency
/// averages (the latency-aware policy reads them); at the end of the body
/// (for a stream: its `data: [DONE]`, after which a client may close
/// before the body's end is polled) the observer records the request for
/// its group and arm (a client that leaves early records nothing: its
/// times would be the client's).
fn pass_through(resp: Response, guard: InFlight, observer: Observer) -> Response {
    let (mut parts, body) = resp.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    strip_hop_by_hop(&mut parts.headers);
    if let Ok(v) = HeaderValue::from_str(&guard.worker().label) {
        parts.headers.insert(WORKER_HEADER, v);
    }
    if let Some(v) = observer.arm_header() {
        parts.headers.insert(ARM_HEADER, v);
    }
    let status = parts.status;
    let start = (body, guard, observer, ChunkTimes::default());
    let ok = !status.is_server_error();
    let stream = futures_util::stream::unfold(Some(start), move |s| async move {
        let (mut body, guard, observer, mut times) = s?;
        loop {
            match body.frame().await {
                None => {
                    if !times.recorded {
                        observer.finish(Some(&times), ok, status.as_str());
                    }
                    return None;
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let now = Instant::now();
                        match times.last {
                            None => guard
                                .worker()
                                .record_ttft(now.duration_since(observer.sent).as_secs_f64()),
                            Some(t) => guard
                                .worker()
                                .record_itl(now.duration_since(t).as_secs_f64()),
                        }
                        times.on_chunk(now, &data, sse);
                        if sse && !times.recorded && ends_stream(&data) {
                            times.recorded = true;
                            observer.finish(Some(&times), ok, status.as_str());
                        }
                        return Some((
                            Ok::<_, std::io::Error>(data),
                            Some((body, guard, observer, times)),
                        ));
                    }
                    Err(_trailers) => continue,
                },
                Some(Err(e)) => {
                    let worker = guard.worker();
                    tracing::warn!(worker = %worker.label, error = %e, "worker failed mid-response");
                    counter!(m::INTERRUPTED, "worker" => worker.label.clone()).increment(1);
                    observer.finish(Some(&times), false, "interrupted");
                    fail(worker, AttemptError::Connect);
                    if sse {
                        return Some((Ok(sse_interrupted(&worker.label)), None));
                    }
                    return Some((Err(std::io::Error::other(e)), None));
                }
            }
        }
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
}

/// `GET` and `DELETE /v1/responses/{id}`. A stored response lives in the
/// memory of the worker that answered it, so each healthy worker is asked
/// in turn until one does not answer 404; the last 404 (OpenAI-shaped, from
/// the worker) is the answer when none holds it. Any router finds it
/// (nothing is kept here), at the cost of one request per worker asked.
pub async fn by_response(State(state): State<Arc<RouterState>>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let mut last = None;
    for worker in state
        .workers()
        .iter()
        .filter(|w| w.is_healthy() && !w.is_removed())
    {
        match send(
            &state,
            worker,
            &parts.method,
            path,
            &parts.headers,
            Bytes::new(),
        )
        .await
        {
            Ok(resp) if resp.status() == StatusCode::NOT_FOUND => last = Some(resp),
            Ok(mut resp) => {
                strip_hop_by_hop(resp.headers_mut());
                if let Ok(v) = HeaderValue::from_str(&worker.label) {
                    resp.headers_mut().insert(WORKER_HEADER, v);
                }
                return resp;
            }
            Err((_, Some(resp))) => last = Some(resp),
            Err((error, None)) => m::error(&worker.label, error.reason()),
        }
    }
    last.unwrap_or_else(|| {
        state
            .no_worker(String::new(), Instant::now())
            .into_response()
    })
}

/// The worker holding stored response `id` (asked as `GET
/// /v1/responses/{id}` with the client's headers, so a key sees only its
/// own), if a healthy one does.
async fn holder(state: &RouterState, id: &str, headers: &HeaderMap) -> Option<WorkerId> {
    let path = format!("/v1/responses/{id}");
    for worker in state
        .workers()
        .iter()
        .filter(|w| w.is_healthy() && !w.is_removed())
    {
        let found = send(state, worker, &Method::GET, &path, headers, Bytes::new()).await;
        if found.is_ok_and(|r| r.status().is_success()) {
            return Some(worker.id);
        }
    }
    None
}

/// The `model` query parameter, if any.
fn query_model(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .find_map(|p| p.strip_prefix("model="))
        .filter(|m| !m.is_empty() && !m.contains('%') && !m.contains('+'))
        .map(String::from)
}

/// The `previous_response_id` of a `POST /v1/responses` body, if any (an
/// id that could not be put in a path is left to the worker to refuse).
fn previous_response(path: &str, body: &[u8]) -> Option<String> {
    if path != "/v1/responses" {
        return None;
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    let id = v.get("previous_response_id")?.as_str()?;
    id.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        .then(|| id.to_string())
}

/// The parts of the body the router routes on. The body must be a JSON
/// object; everything else about it is the worker's to validate.
fn request_info(body: &[u8]) -> Result<RequestInfo, RouteError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| RouteError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(RouteError::BadRequest(
            "the body must be a JSON object".into(),
        ));
    };
    Ok(RequestInfo {
        model: obj.get("model").and_then(Value::as_str).map(str::to_string),
        user: obj.get("user").and_then(Value::as_str).map(str::to_string),
        stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
        text: prompt_text(&obj),
        holders: Vec::new(),
    })
}

/// With the shared prefix index on, the prompt's chunk hashes, and
/// `info.holders` filled from Redis (left empty when Redis does not answer:
/// the local index decides alone).
async fn shared_prefix(state: &RouterState, info: &mut RequestInfo) -> Option<Vec<[u8; 16]>> {
    let fleet = state.fleet.as_ref()?;
    if state.config.policy != PolicyKind::PrefixCache || !state.config.redis.share_prefix_index {
        return None;
    }
    let chunks = chunk_hashes(&info.text);
    if chunks.is_empty() {
        return None;
    }
    if let Ok(holders) = fleet.prefix_holders(&chunks).await {
        info.holders = holders;
    }
    Some(chunks)
}

/// Records in the shared index that `worker` got `chunks` (in the
/// background: the response does not wait on Redis).
fn record_prefix(state: &RouterState, chunks: Option<Vec<[u8; 16]>>, worker: String) {
    let (Some(fleet), Some(chunks)) = (state.fleet.clone(), chunks) else {
        return;
    };
    let ttl = state.config.redis.prefix_ttl.get();
    tokio::spawn(async move {
        let _ = fleet.prefix_record(&chunks, &worker, ttl).await;
    });
}

/// The text a prompt starts with: chat messages' (or Responses input
/// items') string contents in order (role-tagged, so a system prompt and a
/// user turn with the same words differ), or a string `prompt` or `input`.
fn prompt_text(obj: &serde_json::Map<String, Value>) -> String {
    let mut text = String::new();
    // Chat's messages, or a Responses input given as items.
    let messages = obj.get("messages").or_else(|| obj.get("input"));
    if let Some(messages) = messages.and_then(Value::as_array) {
        for m in messages {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("");
            text.push_str(role);
            text.push('\n');
            match m.get("content") {
                Some(Value::String(s)) => text.push_str(s),
                Some(Value::Array(parts)) => {
                    for p in parts {
                        if let Some(s) = p.get("text").and_then(Value::as_str) {
                            text.push_str(s);
                        }
                    }
                }
                _ => {}
            }
            text.push('\n');
        }
    } else if let Some(p) = obj.get("prompt").and_then(Value::as_str) {
        text.push_str(p);
    } else if let Some(p) = obj.get("input").and_then(Value::as_str) {
        // A Responses input given as text.
        text.push_str(p);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_token_is_the_first_chunk_with_text() {
        let role = br#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        let token = br#"data: {"choices":[{"index":0,"delta":{"content":"H"}}]}"#;
        let text = br#"data: {"choices":[{"index":0,"text":" the"}]}"#;
        assert!(!carries_text(role));
        assert!(carries_text(token));
        assert!(carries_text(text));
        assert!(!carries_text(b"data: [DONE]"));
        let t0 = Instant::now();
        let mut times = ChunkTimes::default();
        times.on_chunk(t0, role, true);
        assert!(times.first.is_none());
        let t1 = t0 + std::time::Duration::from_millis(100);
        times.on_chunk(t1, token, true);
        times.on_chunk(t1 + std::time::Duration::from_millis(20), token, true);
        times.on_chunk(t1 + std::time::Duration::from_millis(40), token, true);
        assert_eq!(times.first, Some(t1));
        assert!((times.mean_gap().unwrap() - 0.02).abs() < 1e-9);
        // A JSON body (not a stream): its first byte is the answer.
        let mut body = ChunkTimes::default();
        body.on_chunk(t0, b"{}", false);
        assert_eq!(body.first, Some(t0));
    }
}
