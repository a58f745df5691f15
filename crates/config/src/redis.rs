//! `[redis]`: the shared state of a fleet of servers and routers
//! (docs/fleet.md). Off unless `url` is set; the same section configures
//! `ingot serve` and `ingot route`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

/// `[redis]`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSection {
    /// `redis://[user:password@]host:port[/db]`. Unset: no shared state.
    pub url: Option<String>,
    /// Prefix of every key (`{namespace}:...`), so fleets can share a Redis.
    pub namespace: String,
    /// Longest wait for a (re)connection.
    pub connect_timeout: Duration,
    /// Longest wait for one command; a slower Redis counts as down for the
    /// request (it falls back to local state).
    pub command_timeout: Duration,
    /// Multiplexed connections (commands are spread over them).
    #[schemars(range(min = 1, max = 64))]
    pub pool_size: u32,
    /// After a failed command, how long Redis is not asked again (requests
    /// use local state meanwhile); one probe then decides.
    pub retry_after: Duration,
    /// Time between an instance's registry heartbeats.
    pub heartbeat_interval: Duration,
    /// An instance that missed heartbeats for this long is gone (more than
    /// `heartbeat_interval`).
    pub heartbeat_ttl: Duration,
    /// The URL other instances reach this one at (registered). Unset: the
    /// listening address (`http://host:port`).
    pub advertise_url: Option<String>,
    /// Share the response cache through Redis (server).
    pub share_cache: bool,
    /// Share per-key rate limits through Redis (server).
    pub share_rate_limits: bool,
    /// Share the prefix-cache policy's index through Redis, so several
    /// routers send a prefix to the same worker (router,
    /// `policy = "prefix_cache"`).
    pub share_prefix_index: bool,
    /// How long a prefix-index entry outlives its last use (router).
    pub prefix_ttl: Duration,
    /// Share KV cache pages through Redis (server, with `kv_tiers`): a
    /// prefix one instance computed is fetched by another instead of
    /// recomputed. Off by default.
    pub share_kv: bool,
    /// How long a shared KV page outlives its last write.
    pub kv_ttl: Duration,
    /// Most bytes of shared KV pages per namespace (oldest out first).
    pub kv_max_bytes: ByteSize,
}

impl Default for RedisSection {
    fn default() -> Self {
        Self {
            url: None,
            namespace: "ingot".into(),
            connect_timeout: Duration::from_millis(500),
            command_timeout: Duration::from_millis(100),
            pool_size: 2,
            retry_after: Duration::from_secs(1),
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_ttl: Duration::from_secs(6),
            advertise_url: None,
            share_cache: true,
            share_rate_limits: true,
            share_prefix_index: true,
            prefix_ttl: Duration::from_secs(600),
            share_kv: false,
            kv_ttl: Duration::from_secs(3600),
            kv_max_bytes: ByteSize::mib(1024),
        }
    }
}

impl RedisSection {
    /// Whether shared state is configured.
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    /// The first rule broken, as (dotted key, what is wrong).
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if let Some(url) = &self.url {
            if !(url.starts_with("redis://") || url.starts_with("unix://")) {
                return Err(("redis.url", "must be a redis:// or unix:// URL"));
            }
        }
        let ns = &self.namespace;
        if ns.is_empty()
            || !ns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err((
                "redis.namespace",
                "must be non-empty letters, digits, '-', '_' or '.'",
            ));
        }
        if !(1..=64).contains(&self.pool_size) {
            return Err(("redis.pool_size", "must be between 1 and 64"));
        }
        let zero = [
            self.connect_timeout,
            self.command_timeout,
            self.retry_after,
            self.heartbeat_interval,
            self.prefix_ttl,
            self.kv_ttl,
        ];
        if zero.iter().any(|d| d.get().is_zero()) {
            return Err((
                "redis.connect_timeout",
                "timeouts, retry_after, heartbeat_interval, prefix_ttl and kv_ttl must be more than 0",
            ));
        }
        if self.heartbeat_ttl.get() <= self.heartbeat_interval.get() {
            return Err((
                "redis.heartbeat_ttl",
                "must be more than heartbeat_interval",
            ));
        }
        if let Some(u) = &self.advertise_url {
            if !u.starts_with("http://") {
                return Err(("redis.advertise_url", "must be an http:// URL"));
            }
        }
        Ok(())
    }
}
