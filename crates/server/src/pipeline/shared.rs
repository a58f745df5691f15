//! The shared tier of the response cache: the local [`MemoryStore`] first,
//! then Redis, so an answer computed by one server is a hit on every other
//! (docs/fleet.md). A Redis failure is a local miss, never an error: the
//! fleet client's timeout and breaker bound what a request can wait.
//!
//! Values are one format byte ([`FORMAT`]) then JSON; a value of another
//! format (a different ingot version) is ignored, as a miss.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use ingot_core::FinishReason;
use ingot_engine::{Completion, GeneratedToken, PromptLogprob, TokenLogprob};
use ingot_fleet::Fleet;
use metrics::counter;
use serde::{Deserialize, Serialize};

use super::cache::{CachedChoice, MemoryStore, ResponseStore, StoreStats};
use super::RequestKey;

/// The format of stored values; bump it when [`Wire`] changes.
pub const FORMAT: u8 = 1;

/// Answers served from Redis (after a local miss), by `result`.
pub const SHARED_LOOKUPS: &str = "ingot_response_cache_shared_total";

/// Local moka, then Redis.
pub struct TwoTierStore {
    local: MemoryStore,
    fleet: Fleet,
    ttl: Duration,
}

impl TwoTierStore {
    /// `local` in front of `fleet`; Redis entries live `ttl` (the local
    /// tier's).
    pub fn new(local: MemoryStore, fleet: Fleet, ttl: Duration) -> Self {
        for result in ["hit", "miss", "error", "rejected"] {
            counter!(SHARED_LOOKUPS, "result" => result).increment(0);
        }
        Self { local, fleet, ttl }
    }

    async fn get_shared(&self, key: RequestKey) -> Option<Arc<CachedChoice>> {
        let local = self.local.get(key).await;
        if local.is_some() {
            return local;
        }
        let result = match self.fleet.get_bytes("cache_get", &redis_key(key)).await {
            Ok(Some(bytes)) => decode(&bytes).ok_or("rejected"),
            Ok(None) => Err("miss"),
            Err(_) => Err("error"),
        };
        match result {
            Ok(choice) => {
                counter!(SHARED_LOOKUPS, "result" => "hit").increment(1);
                let choice = Arc::new(choice);
                self.local.insert(key, choice.clone()).await;
                Some(choice)
            }
            Err(why) => {
                counter!(SHARED_LOOKUPS, "result" => why).increment(1);
                None
            }
        }
    }

    async fn insert_shared(&self, key: RequestKey, value: Arc<CachedChoice>) {
        let bytes = encode(&value);
        self.local.insert(key, value).await;
        if let Some(bytes) = bytes {
            // Failure is already counted and logged by the client.
            let _ = self
                .fleet
                .set_bytes("cache_set", &redis_key(key), bytes, self.ttl)
                .await;
        }
    }
}

impl ResponseStore for TwoTierStore {
    fn get(&self, key: RequestKey) -> BoxFuture<'_, Option<Arc<CachedChoice>>> {
        Box::pin(self.get_shared(key))
    }

    fn insert(&self, key: RequestKey, value: Arc<CachedChoice>) -> BoxFuture<'_, ()> {
        Box::pin(self.insert_shared(key, value))
    }

    /// Purges the local tier; Redis entries expire with their TTL (other
    /// servers may still hold them; docs/fleet.md).
    fn purge(&self, model: Option<&str>) -> u64 {
        self.local.purge(model)
    }

    fn stats(&self) -> StoreStats {
        self.local.stats()
    }
}

fn redis_key(key: RequestKey) -> String {
    format!("cache:{key}")
}

#[derive(Serialize, Deserialize)]
struct Wire {
    model: String,
    prompt: Option<Vec<WirePrompt>>,
    tokens: Vec<WireToken>,
    reason: FinishReason,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    queue_time_us: u64,
}

#[derive(Serialize, Deserialize)]
struct WireToken {
    token: u32,
    text: String,
    logprob: f32,
    top: Vec<(u32, f32)>,
}

#[derive(Serialize, Deserialize)]
struct WirePrompt {
    token: u32,
    logprob: Option<f32>,
    top: Vec<(u32, f32)>,
}

fn top_to_wire(top: &[TokenLogprob]) -> Vec<(u32, f32)> {
    top.iter().map(|t| (t.token, t.logprob)).collect()
}

fn top_from_wire(top: Vec<(u32, f32)>) -> Vec<TokenLogprob> {
    top.into_iter()
        .map(|(token, logprob)| TokenLogprob { token, logprob })
        .collect()
}

/// [`FORMAT`] then the JSON of `choice`.
pub fn encode(choice: &CachedChoice) -> Option<Vec<u8>> {
    let c = &choice.completion;
    let wire = Wire {
        model: choice.model.clone(),
        prompt: choice.prompt.as_ref().map(|p| {
            p.iter()
                .map(|p| WirePrompt {
                    token: p.token,
                    logprob: p.logprob,
                    top: top_to_wire(&p.top_logprobs),
                })
                .collect()
        }),
        tokens: choice
            .tokens
            .iter()
            .map(|t| WireToken {
                token: t.token,
                text: t.text.clone(),
                logprob: t.logprob,
                top: top_to_wire(&t.top_logprobs),
            })
            .collect(),
        reason: c.reason,
        prompt_tokens: c.prompt_tokens,
        completion_tokens: c.completion_tokens,
        cached_tokens: c.cached_tokens,
        queue_time_us: u64::try_from(c.queue_time.as_micros()).unwrap_or(u64::MAX),
    };
    let mut out = vec![FORMAT];
    serde_json::to_writer(&mut out, &wire).ok()?;
    Some(out)
}

/// The choice in `bytes`, `None` for another format or a damaged value.
pub fn decode(bytes: &[u8]) -> Option<CachedChoice> {
    let (&format, json) = bytes.split_first()?;
    if format != FORMAT {
        tracing::debug!(format, "shared cache entry of another format ignored");
        return None;
    }
    let wire: Wire = serde_json::from_slice(json).ok()?;
    Some(CachedChoice {
        model: wire.model,
        prompt: wire.prompt.map(|p| {
            p.into_iter()
                .map(|p| PromptLogprob {
                    token: p.token,
                    logprob: p.logprob,
                    top_logprobs: top_from_wire(p.top),
                })
                .collect()
        }),
        tokens: wire
            .tokens
            .into_iter()
            .map(|t| GeneratedToken {
                token: t.token,
                text: t.text,
                logprob: t.logprob,
                top_logprobs: top_from_wire(t.top),
            })
            .collect(),
        completion: Completion {
            reason: wire.reason,
            prompt_tokens: wire.prompt_tokens,
            completion_tokens: wire.completion_tokens,
            cached_tokens: wire.cached_tokens,
            queue_time: Duration::from_micros(wire.queue_time_us),
        },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn choice() -> CachedChoice {
        CachedChoice {
            model: "m".into(),
            prompt: Some(vec![PromptLogprob {
                token: 1,
                logprob: None,
                top_logprobs: vec![],
            }]),
            tokens: vec![GeneratedToken {
                token: 7,
                text: "hé".into(),
                logprob: -0.125,
                top_logprobs: vec![TokenLogprob {
                    token: 8,
                    logprob: -2.5,
                }],
            }],
            completion: Completion {
                reason: FinishReason::Length,
                prompt_tokens: 3,
                completion_tokens: 1,
                cached_tokens: 0,
                queue_time: Duration::from_micros(42),
            },
        }
    }

    #[test]
    fn a_choice_survives_the_wire_exactly() {
        let bytes = encode(&choice()).unwrap();
        assert_eq!(bytes[0], FORMAT);
        assert_eq!(decode(&bytes).unwrap(), choice());
    }

    #[test]
    fn another_format_or_damage_is_ignored() {
        let mut bytes = encode(&choice()).unwrap();
        bytes[0] = FORMAT + 1;
        assert!(decode(&bytes).is_none());
        assert!(decode(&[FORMAT, b'{']).is_none());
        assert!(decode(&[]).is_none());
    }
}
