//! Worker discovery: every `discovery.interval`, the `workers.dns` entries
//! are resolved (each A/AAAA address of a "name:port" is a worker, as a
//! Kubernetes headless Service lists its ready pods) and `workers.file` is
//! read when it changed (one base URL per line). The union is reconciled
//! with the router's workers: new ones are probed at once and enter rotation
//! when ready; ones no longer listed are drained (no new requests, in-flight
//! ones finish).
//!
//! `workers.redis` lists the workers registered in Redis (docs/fleet.md):
//! one that stops heartbeating (killed) drops out of the registry after
//! its TTL and is drained here at the next tick.
//!
//! A failed resolution, unreadable file or unreachable Redis keeps the last
//! good list for that source, so a hiccup does not empty the pool.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::DiscoveryConfig;
use crate::health::probe;
use crate::state::RouterState;

/// The last good answer of each source.
#[derive(Default)]
struct Sources {
    dns: Vec<Option<BTreeSet<String>>>,
    file: Option<BTreeSet<String>>,
    file_stamp: Option<(SystemTime, u64)>,
    redis: Option<BTreeSet<String>>,
}

/// Runs discovery until the process ends (returns at once when no source is
/// configured).
pub async fn discovery_task(state: Arc<RouterState>) {
    let config = state.config.discovery.clone();
    if !config.is_enabled() {
        return;
    }
    let mut sources = Sources {
        dns: vec![None; config.dns.len()],
        ..Sources::default()
    };
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        refresh(&config, &mut sources).await;
        if config.redis {
            if let Some(fleet) = &state.fleet {
                refresh_redis(fleet, &mut sources).await;
            }
        }
        let urls: BTreeSet<String> = sources
            .dns
            .iter()
            .flatten()
            .chain(sources.file.iter())
            .chain(sources.redis.iter())
            .flatten()
            .cloned()
            .collect();
        let urls: Vec<String> = urls.into_iter().collect();
        let added = state.reconcile(&urls);
        futures_util::future::join_all(added.iter().map(|w| probe(&state, w))).await;
    }
}

async fn refresh(config: &DiscoveryConfig, sources: &mut Sources) {
    for (entry, last) in config.dns.iter().zip(sources.dns.iter_mut()) {
        match tokio::net::lookup_host(entry.as_str()).await {
            Ok(addrs) => *last = Some(addrs.map(|a| format!("http://{a}")).collect()),
            Err(e) => tracing::warn!(%entry, error = %e, "cannot resolve a workers.dns entry"),
        }
    }
    if let Some(path) = &config.file {
        let stamp = file_stamp(path);
        if stamp.is_none() || stamp != sources.file_stamp {
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    sources.file = Some(parse_url_file(&text));
                    sources.file_stamp = stamp;
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read workers.file");
                }
            }
        }
    }
}

/// The registered workers' URLs (the last good list while Redis is down).
async fn refresh_redis(fleet: &ingot_fleet::Fleet, sources: &mut Sources) {
    match fleet.instances(ingot_fleet::Role::Worker).await {
        Ok(list) => {
            sources.redis = Some(
                list.into_iter()
                    .map(|i| i.url.trim_end_matches('/').to_string())
                    .filter(|u| u.starts_with("http://"))
                    .collect(),
            );
        }
        Err(e) => tracing::debug!(error = %e, "workers.redis: keeping the last list"),
    }
}

/// Modification time and length: a rewrite changes one of them.
fn file_stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The worker URLs of a `workers.file`: one per line, blank lines and `#`
/// comments skipped, trailing slashes dropped; lines that are not http://
/// URLs are skipped with a warning.
pub fn parse_url_file(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            if l.starts_with("http://") {
                Some(l.trim_end_matches('/').to_string())
            } else {
                tracing::warn!(line = l, "workers.file: not an http:// URL, skipped");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_files_skip_comments_blanks_and_non_urls() {
        let urls = parse_url_file(
            "# workers\nhttp://10.0.0.1:8000/\n\n  http://10.0.0.2:8000 # gpu 2\nftp://x\n",
        );
        let want: BTreeSet<String> = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
            .map(String::from)
            .into();
        assert_eq!(urls, want);
    }

    #[tokio::test]
    async fn dns_entries_resolve_to_one_worker_per_address() {
        let config = DiscoveryConfig {
            dns: vec!["localhost:8123".into(), "localhost:not-a-port".into()],
            file: None,
            interval: std::time::Duration::from_secs(1),
            redis: false,
        };
        let mut sources = Sources {
            dns: vec![None; 2],
            ..Sources::default()
        };
        refresh(&config, &mut sources).await;
        let got = sources.dns[0].clone().unwrap_or_default();
        assert!(got.contains("http://127.0.0.1:8123"), "{got:?}");
        assert_eq!(sources.dns[1], None, "a failed lookup keeps no list");
    }
}
