//! The connection pool with its timeouts and circuit breaker.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingot_config::RedisSection;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncCommands;

use crate::{REDIS_ERRORS, REDIS_UP};

/// A failed shared-state operation; callers fall back to local state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// Redis failed recently; not asked again until `retry_after` passes.
    #[error("Redis is unavailable (recent failure; retrying later)")]
    Unavailable,
    /// The command took longer than `command_timeout`.
    #[error("Redis command `{0}` timed out")]
    Timeout(&'static str),
    /// Redis answered with an error, or the connection failed.
    #[error("Redis command `{op}` failed: {source}")]
    Redis {
        /// The operation.
        op: &'static str,
        /// The client's error.
        source: redis::RedisError,
    },
    /// The URL or settings cannot work.
    #[error("invalid Redis settings: {0}")]
    Config(String),
}

/// What [`Fleet`] needs from `[redis]`.
#[derive(Clone, Debug)]
pub struct FleetSettings {
    /// The server's URL.
    pub url: String,
    /// Key prefix.
    pub namespace: String,
    /// Per (re)connection.
    pub connect_timeout: Duration,
    /// Per command.
    pub command_timeout: Duration,
    /// Connections.
    pub pool_size: usize,
    /// Breaker open time after a failure.
    pub retry_after: Duration,
}

impl FleetSettings {
    /// The settings of `section`, `None` when no URL is configured.
    pub fn from_section(section: &RedisSection) -> Option<Self> {
        Some(Self {
            url: section.url.clone()?,
            namespace: section.namespace.clone(),
            connect_timeout: section.connect_timeout.get(),
            command_timeout: section.command_timeout.get(),
            pool_size: section.pool_size.max(1) as usize,
            retry_after: section.retry_after.get(),
        })
    }
}

/// Seconds between two "Redis is down" log lines while it stays down.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// The shared client: cheap to clone.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Vec<ConnectionManager>,
    next: AtomicUsize,
    namespace: String,
    command_timeout: Duration,
    retry_after: Duration,
    /// Process-relative clock of the breaker.
    epoch: Instant,
    /// Until when (ms since `epoch`) no command is sent; 0: closed.
    open_until: AtomicU64,
    /// Whether the last command succeeded (for the up/down log lines).
    up: AtomicBool,
    /// When (ms since `epoch`) the last "down" line was logged.
    last_log: AtomicU64,
}

impl Fleet {
    /// A pool of lazily connected managers: nothing is sent before the
    /// first command, so a server starts whether Redis is up or not. Must
    /// run inside a Tokio runtime.
    pub fn connect(settings: &FleetSettings) -> Result<Self, FleetError> {
        let client = redis::Client::open(settings.url.as_str())
            .map_err(|e| FleetError::Config(format!("{}: {e}", settings.url)))?;
        // Few, short reconnect tries: the breaker, not the client, paces
        // retries while Redis is down.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.command_timeout))
            .set_number_of_retries(1)
            .set_max_delay(settings.retry_after);
        let pool = (0..settings.pool_size.max(1))
            .map(|_| client.get_connection_manager_lazy(config.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| FleetError::Redis {
                op: "connect",
                source,
            })?;
        metrics::gauge!(REDIS_UP).set(1.0);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                next: AtomicUsize::new(0),
                namespace: settings.namespace.clone(),
                command_timeout: settings.command_timeout,
                retry_after: settings.retry_after,
                epoch: Instant::now(),
                open_until: AtomicU64::new(0),
                up: AtomicBool::new(true),
                last_log: AtomicU64::new(0),
            }),
        })
    }

    /// `{namespace}:{suffix}`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.inner.namespace)
    }

    /// Whether the last command succeeded.
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    /// Runs `f` on a pooled connection within the command timeout, unless
    /// the breaker is open; records the outcome.
    pub async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, FleetError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        if !self.inner.admit() {
            return Err(FleetError::Unavailable);
        }
        let conn = self.inner.connection();
        let result = match tokio::time::timeout(self.inner.command_timeout, f(conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(FleetError::Redis { op, source }),
            Err(_) => Err(FleetError::Timeout(op)),
        };
        match &result {
            Ok(_) => self.inner.succeeded(),
            Err(e) => self.inner.failed(op, e),
        }
        result
    }

    /// The bytes at `{namespace}:{suffix}`, if any.
    pub async fn get_bytes(
        &self,
        op: &'static str,
        suffix: &str,
    ) -> Result<Option<Vec<u8>>, FleetError> {
        let key = self.key(suffix);
        self.run(op, |mut c| async move { c.get(key).await }).await
    }

    /// Stores `value` at `{namespace}:{suffix}` for `ttl`.
    pub async fn set_bytes(
        &self,
        op: &'static str,
        suffix: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), FleetError> {
        let key = self.key(suffix);
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.run(op, |mut c| async move { c.pset_ex(key, value, ms).await })
            .await
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn connection(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len();
        self.pool[i].clone()
    }

    /// Closed breaker: yes. Open: no, except for the one caller that finds
    /// it expired and re-opens it for itself (the probe).
    fn admit(&self) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        let now = self.now_ms();
        now >= until
            && self
                .open_until
                .compare_exchange(
                    until,
                    now + self.retry_ms(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    fn retry_ms(&self) -> u64 {
        u64::try_from(self.retry_after.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn succeeded(&self) {
        self.open_until.store(0, Ordering::Release);
        if !self.up.swap(true, Ordering::Relaxed) {
            metrics::gauge!(REDIS_UP).set(1.0);
            tracing::warn!("Redis is reachable again: shared state resumes");
        }
    }

    fn failed(&self, op: &'static str, error: &FleetError) {
        metrics::counter!(REDIS_ERRORS, "op" => op).increment(1);
        let now = self.now_ms();
        self.open_until
            .store(now + self.retry_ms(), Ordering::Release);
        let was_up = self.up.swap(false, Ordering::Relaxed);
        if was_up {
            metrics::gauge!(REDIS_UP).set(0.0);
        }
        let last = self.last_log.load(Ordering::Relaxed);
        let due = was_up || now.saturating_sub(last) >= LOG_EVERY.as_millis() as u64;
        if due
            && self
                .last_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(%error, "Redis unavailable: using local state only");
        }
    }
}
