//! The middleware: who is calling, may they, and are they within their
//! limits. It runs before routing's handlers, so a refused request costs no
//! body read, parsing or tokenization.

use std::pin::Pin;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use ingot_config::AuthSection;
use ingot_fleet::Fleet;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::{EdgeError, Rejection};
use crate::header::presented_key;
use crate::keys::{Key, KeyTable};

/// The live key table. Cheap to clone; a reload swaps the table whole, and
/// requests in flight keep the one they started with.
#[derive(Clone, Default)]
pub struct Edge {
    table: Arc<RwLock<Arc<KeyTable>>>,
    /// Where keys' limits are shared (`redis.share_rate_limits`).
    shared: Arc<OnceLock<Fleet>>,
}

impl Edge {
    /// An edge serving `auth`.
    pub fn new(auth: &AuthSection) -> Result<Self, EdgeError> {
        let table = KeyTable::build(auth, None)?;
        Ok(Self {
            table: Arc::new(RwLock::new(Arc::new(table))),
            shared: Arc::default(),
        })
    }

    /// The current table.
    pub fn table(&self) -> Arc<KeyTable> {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Rebuilds the table from `auth` (re-reading the key file); on error
    /// the running table stays. Unchanged keys keep their buckets.
    pub fn reload(&self, auth: &AuthSection) -> Result<(), EdgeError> {
        let new = KeyTable::build(auth, Some(&self.table()))?;
        if let Some(fleet) = self.shared.get() {
            new.share_limits(fleet);
        }
        tracing::info!(keys = new.len(), enabled = new.enabled(), "API keys loaded");
        *self.table.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(new);
        Ok(())
    }
}

impl Edge {
    /// Makes every key's limits fleet-wide through `fleet` (this table's
    /// keys and those of later reloads).
    pub fn share_limits(&self, fleet: Fleet) {
        self.table().share_limits(&fleet);
        let _ = self.shared.set(fleet);
    }

    /// Reserves `n` tokens of `key` (prompt + max_tokens), fleet-wide when
    /// shared.
    pub async fn reserve_tokens(&self, key: &Key, n: u64) -> Result<(), Rejection> {
        key.limits.reserve_tokens_shared(n).await
    }
}

/// Who is calling, in every request's extensions: the key, or `None` when
/// auth is off or the path is open.
#[derive(Clone, Debug, Default)]
pub struct Caller(pub Option<Arc<Key>>);

impl Caller {
    /// The key, if any.
    pub fn key(&self) -> Option<&Key> {
        self.0.as_deref()
    }
}

fn is_admin_path(path: &str) -> bool {
    path == "/admin" || path.starts_with("/admin/")
}

/// The middleware (`axum::middleware::from_fn_with_state(edge, authenticate)`):
/// 401 without a valid key, 403 for a non-admin key on `/admin/*`, 429 over
/// the key's concurrency or request rate. Answers to a limited key carry
/// `x-ratelimit-*`; the concurrency permit is held until the response body
/// ends (a stream's last byte, or the client going away).
pub async fn authenticate(State(edge): State<Edge>, mut req: Request, next: Next) -> Response {
    let table = edge.table();
    if !table.enabled() || table.is_open(req.uri().path()) {
        req.extensions_mut().insert(Caller(None));
        return next.run(req).await;
    }
    let key = match identify(&table, &req) {
        Ok(key) => key,
        Err(rejection) => return rejection.into_response(),
    };
    let admitted = match key.limits.enter() {
        Ok(permit) => key.limits.take_request_shared().await.map(|()| permit),
        Err(rejection) => Err(rejection),
    };
    let mut response = match admitted {
        Ok(permit) => {
            tracing::debug!(key_id = %key.id, "authenticated");
            req.extensions_mut().insert(Caller(Some(key.clone())));
            hold(next.run(req).await, permit)
        }
        Err(rejection) => {
            tracing::debug!(key_id = %key.id, "rate limited");
            rejection.into_response()
        }
    };
    key.limits.add_headers(response.headers_mut());
    metrics::counter!(
        KEY_REQUESTS,
        "key_id" => key.id.clone(),
        "status" => status_class(response.status())
    )
    .increment(1);
    response
}

/// Answers per API key (`key_id`, the configured id; never the key) and
/// status class.
pub const KEY_REQUESTS: &str = "ingot_key_requests_total";

/// Tokens per API key, by `kind` (`prompt` or `completion`).
pub const KEY_TOKENS: &str = "ingot_key_tokens_total";

/// `2xx`, `4xx`, ...: classes keep the series few while still separating
/// client from server errors.
pub fn status_class(status: axum::http::StatusCode) -> &'static str {
    match status.as_u16() / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

/// The key a request presents, if valid and allowed on its path.
fn identify(table: &KeyTable, req: &Request) -> Result<Arc<Key>, Rejection> {
    let path = req.uri().path();
    let Some(presented) = presented_key(req.headers()) else {
        tracing::debug!(path, "request without an API key");
        return Err(Rejection::MissingKey);
    };
    let Some(key) = table.lookup(presented) else {
        tracing::debug!(path, "request with an unknown API key");
        return Err(Rejection::InvalidKey);
    };
    if is_admin_path(path) && !key.admin {
        tracing::debug!(key_id = %key.id, path, "admin endpoint refused");
        return Err(Rejection::AdminRequired);
    }
    Ok(key)
}

/// `response` with `permit` released only when its body ends or drops.
fn hold(response: Response, permit: Option<OwnedSemaphorePermit>) -> Response {
    let Some(permit) = permit else {
        return response;
    };
    response.map(|body| {
        Body::new(HeldBody {
            inner: body,
            permit: Some(permit),
        })
    })
}

/// A body that keeps a concurrency permit until it has been read to the end.
struct HeldBody {
    inner: Body,
    permit: Option<OwnedSemaphorePermit>,
}

impl http_body::Body for HeldBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.permit = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::{Extension, Router};
    use ingot_config::ApiKeyEntry;
    use tower::ServiceExt;

    use super::*;
    use crate::keys::hash_key_hex;

    fn entry(id: &str, key: &str, admin: bool, rpm: Option<u32>) -> ApiKeyEntry {
        ApiKeyEntry {
            id: id.into(),
            sha256: hash_key_hex(key),
            tenant: Some(format!("t-{id}")),
            models: vec!["*".into()],
            max_priority: None,
            admin,
            requests_per_minute: rpm,
            tokens_per_minute: None,
            max_concurrent: None,
            request_timeout: None,
            first_token_timeout: None,
        }
    }

    fn app(edge: Edge) -> Router {
        async fn who(Extension(c): Extension<Caller>) -> String {
            c.key().map_or("anonymous".into(), |k| k.id.clone())
        }
        Router::new()
            .route("/v1/models", get(who))
            .route("/health", get(who))
            .route("/admin/flags", get(who))
            .layer(axum::middleware::from_fn_with_state(edge, authenticate))
    }

    async fn call(app: &Router, path: &str, key: Option<&str>) -> Response {
        let mut req = Request::builder().uri(path);
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        app.clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    async fn text(r: Response) -> String {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn keys_gate_every_path_but_the_open_ones() {
        let auth = AuthSection {
            api_keys: vec![
                entry("a", "sk-a", false, Some(2)),
                entry("root", "sk-root", true, None),
            ],
            ..AuthSection::default()
        };
        let app = app(Edge::new(&auth).unwrap());
        assert_eq!(text(call(&app, "/health", None).await).await, "anonymous");
        let r = call(&app, "/v1/models", None).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(text(r).await.contains("invalid_api_key"));
        assert_eq!(
            call(&app, "/v1/models", Some("sk-b")).await.status(),
            StatusCode::UNAUTHORIZED
        );
        let r = call(&app, "/v1/models", Some("sk-a")).await;
        assert_eq!(r.headers()["x-ratelimit-remaining-requests"], "1");
        assert_eq!(text(r).await, "a");
        let r = call(&app, "/admin/flags", Some("sk-a")).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(text(r).await.contains("admin_key_required"));
        let r = call(&app, "/v1/models", Some("sk-a")).await;
        assert_eq!(r.headers()["x-ratelimit-remaining-requests"], "0");
        let r = call(&app, "/v1/models", Some("sk-a")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "30");
        assert_eq!(r.headers()["x-ratelimit-remaining-requests"], "0");
        let r = call(&app, "/admin/flags", Some("sk-root")).await;
        assert_eq!(text(r).await, "root");
    }

    #[tokio::test]
    async fn without_keys_everyone_is_anonymous_and_reload_turns_auth_on() {
        let edge = Edge::new(&AuthSection::default()).unwrap();
        let app = app(edge.clone());
        assert_eq!(
            text(call(&app, "/admin/flags", None).await).await,
            "anonymous"
        );
        let auth = AuthSection {
            api_keys: vec![entry("a", "sk-a", false, None)],
            ..AuthSection::default()
        };
        edge.reload(&auth).unwrap();
        assert_eq!(
            call(&app, "/v1/models", None).await.status(),
            StatusCode::UNAUTHORIZED
        );
        let r = call(&app, "/v1/models", Some("sk-a")).await;
        assert!(r.headers().get("x-ratelimit-limit-requests").is_none());
        assert_eq!(text(r).await, "a");
    }

    #[tokio::test]
    async fn the_permit_is_held_until_the_body_ends() {
        let mut e = entry("c", "sk-c", false, None);
        e.max_concurrent = Some(1);
        let auth = AuthSection {
            api_keys: vec![e],
            ..AuthSection::default()
        };
        let app = app(Edge::new(&auth).unwrap());
        let first = call(&app, "/v1/models", Some("sk-c")).await;
        assert_eq!(first.status(), StatusCode::OK);
        let second = call(&app, "/v1/models", Some("sk-c")).await;
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(text(first).await, "c");
        assert_eq!(
            call(&app, "/v1/models", Some("sk-c")).await.status(),
            StatusCode::OK
        );
    }
}
