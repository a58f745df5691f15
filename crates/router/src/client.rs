//! How the router reaches a worker: one seam, [`WorkerClient`], with one
//! method that sends a request and returns the worker's response head with
//! its body still streaming. The router runs on [`HyperClient`] (a
//! keep-alive pool of HTTP/1 connections); tests put in-process fake
//! workers behind the same trait, so the router's HTTP behaviour is tested
//! without sockets.
//!
//! Deadlines are the caller's (`first_byte_timeout`, the probe timeout), so
//! a fake worker that hangs is given up on by the same code as a real one.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A request to a worker: the router always has the whole body in hand.
pub type WorkerRequest = Request<Full<Bytes>>;

/// What [`WorkerClient::send`] returns.
pub type SendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Response<Body>, ConnectError>> + Send + 'a>>;

/// The worker could not be reached (refused, reset, no route, DNS): nothing
/// was answered, so the request may go elsewhere.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the worker: {0}")]
pub struct ConnectError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// Sends requests to workers.
pub trait WorkerClient: Send + Sync {
    /// Sends `req` (its URI is absolute: the worker's base URL and the
    /// path); resolves once the response head is in, its body streaming.
    fn send(&self, req: WorkerRequest) -> SendFuture<'_>;
}

/// The production client: hyper-util's pool of HTTP/1 connections.
pub struct HyperClient(Client<HttpConnector, Full<Bytes>>);

impl HyperClient {
    /// A pool whose connects give up after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        // Token streams are many small writes: no Nagle delay.
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Self(client)
    }
}

impl WorkerClient for HyperClient {
    fn send(&self, req: WorkerRequest) -> SendFuture<'_> {
        let response = self.0.request(req);
        // One box per response for the body; its frames pass through as is.
        Box::pin(async move {
            let resp = response.await.map_err(|e| ConnectError(Box::new(e)))?;
            Ok(resp.map(Body::new))
        })
    }
}
