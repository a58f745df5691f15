//! The instance registry: each server and router announces itself with a
//! heartbeat; an instance whose heartbeats stop (SIGKILL, a lost host)
//! drops out after its TTL, one that shuts down cleanly deregisters.
//!
//! Keys: `{ns}:instances:{role}`, a sorted set of instance ids scored by
//! expiry (ms, Redis's clock, so hosts' clocks need not agree), and
//! `{ns}:instance:{id}`, the instance's JSON with the same TTL.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Script;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{Fleet, FleetError};

/// What kind of instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `ingot serve`.
    Worker,
    /// `ingot route`.
    Router,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Router => "router",
        }
    }
}

/// One registered instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Unique per process (host, pid and start time).
    pub id: String,
    /// Worker or router.
    pub role: Role,
    /// Where it serves (`http://host:port`).
    pub url: String,
    /// The models it serves (workers).
    pub models: Vec<String>,
    /// Its process id.
    pub pid: u32,
    /// Its host name.
    pub host: String,
    /// Start time, ms since the Unix epoch.
    pub started_at_ms: u64,
}

impl Instance {
    /// This process as a `role` instance at `url`.
    pub fn this_process(role: Role, url: String, models: Vec<String>) -> Self {
        let pid = std::process::id();
        let host = host_name();
        let started_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            id: format!("{}-{host}-{pid}-{started_at_ms}", role.as_str()),
            role,
            url,
            models,
            pid,
            host,
            started_at_ms,
        }
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// KEYS: set, instance key. ARGV: id, JSON, TTL ms. Scores by Redis's clock.
static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 10)
return now
",
    )
});

/// KEYS: set. Drops expired ids, returns the live ones.
static LIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
",
    )
});

impl Fleet {
    fn set_key(&self, role: Role) -> String {
        self.key(&format!("instances:{}", role.as_str()))
    }

    fn instance_key(&self, id: &str) -> String {
        self.key(&format!("instance:{id}"))
    }

    /// Announces `me` for `ttl`.
    pub async fn heartbeat(&self, me: &Instance, ttl: Duration) -> Result<(), FleetError> {
        let json = serde_json::to_string(me).map_err(|e| FleetError::Config(e.to_string()))?;
        let (set, key) = (self.set_key(me.role), self.instance_key(&me.id));
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let id = me.id.clone();
        self.run("heartbeat", |mut c| async move {
            HEARTBEAT
                .key(set)
                .key(key)
                .arg(id)
                .arg(json)
                .arg(ms)
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .map(drop)
    }

    /// Removes `me` at once.
    pub async fn deregister(&self, me: &Instance) -> Result<(), FleetError> {
        let (set, key) = (self.set_key(me.role), self.instance_key(&me.id));
        let id = me.id.clone();
        self.run("deregister", |mut c| async move {
            redis::pipe()
                .zrem(set, id)
                .del(key)
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// The live instances of `role`.
    pub async fn instances(&self, role: Role) -> Result<Vec<Instance>, FleetError> {
        let set = self.set_key(role);
        let ids: Vec<String> = self
            .run("instances", |mut c| async move {
                LIVE.key(set).invoke_async(&mut c).await
            })
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| self.instance_key(id)).collect();
        let values: Vec<Option<String>> = self
            .run("instances", |mut c| async move {
                redis::cmd("MGET").arg(keys).query_async(&mut c).await
            })
            .await?;
        Ok(values
            .into_iter()
            .flatten()
            .filter_map(|v| serde_json::from_str(&v).ok())
            .collect())
    }
}

/// A running heartbeat; [`Heartbeat::stop`] deregisters.
pub struct Heartbeat {
    fleet: Fleet,
    me: Instance,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Announces `me` every `interval` for `ttl` until stopped. A failed
    /// heartbeat is retried at the next tick (the instance stays listed
    /// while one in `ttl / interval` gets through).
    pub fn start(fleet: Fleet, me: Instance, interval: Duration, ttl: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let (f, m) = (fleet.clone(), me.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut announced = false;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => return,
                }
                let ok = f.heartbeat(&m, ttl).await.is_ok();
                if ok && !announced {
                    tracing::info!(id = %m.id, url = %m.url, "registered in the fleet registry");
                }
                announced = ok;
            }
        });
        Self {
            fleet,
            me,
            stop,
            task,
        }
    }

    /// This instance.
    pub fn instance(&self) -> &Instance {
        &self.me
    }

    /// Stops heartbeating and deregisters (a failure only logs: the entry
    /// then expires with its TTL).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        match self.fleet.deregister(&self.me).await {
            Ok(()) => tracing::info!(id = %self.me.id, "deregistered from the fleet registry"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot deregister; the entry expires with its TTL")
            }
        }
    }
}
