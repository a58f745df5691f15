//! Range and cross-field rules the types cannot express.
//!
//! The rule of this crate: each section's types live in their own file,
//! [`Config`] is made of them, and no section imports `Config`; every check
//! that reads more than one value lives here, importing the types (never
//! the other way round).

use crate::config::Config;
use crate::flags::valid_flag_name;
use crate::sections::{Device, Quantization, SpeculativeMethod, BLOCK_SIZE};
use crate::slo::{ShedSection, SloSpec, SloTarget};

/// A broken rule: the key it is about and the rule, in words.
#[derive(Debug, PartialEq)]
pub(crate) struct Violation {
    pub key: String,
    pub message: String,
}

pub(crate) type Check = Result<(), Violation>;

pub(crate) fn fail(key: impl Into<String>, message: impl Into<String>) -> Check {
    Err(Violation {
        key: key.into(),
        message: message.into(),
    })
}

fn at_least(key: &str, value: u64, min: u64) -> Check {
    if value < min {
        return fail(key, format!("must be at least {min}"));
    }
    Ok(())
}

/// The first rule `config` breaks, in section order.
pub(crate) fn check(config: &Config) -> Check {
    model(config)?;
    engine(config)?;
    scheduler(config)?;
    server(config)?;
    cache(config)?;
    kv_tiers(config)?;
    speculative(config)?;
    cuda(config)?;
    log(config)?;
    tracing(config)?;
    limits(config)?;
    models(config)?;
    auth(config)?;
    redis(config)?;
    flags(config)?;
    check_slos(config)?;
    check_remediation(config)
}

fn model(c: &Config) -> Check {
    let m = &c.model;
    let optional = [
        ("model.threads", m.threads),
        ("model.max_model_len", m.max_model_len),
        ("model.kv_cache_tokens", m.kv_cache_tokens),
    ];
    for (key, v) in optional {
        if let Some(v) = v {
            at_least(key, v as u64, 1)?;
        }
    }
    at_least(
        "model.tensor_parallel_size",
        m.tensor_parallel_size as u64,
        1,
    )?;
    if m.tensor_parallel_size > 1 && m.device == Device::Cpu {
        return fail(
            "model.tensor_parallel_size",
            "splits the model over GPUs and needs the CUDA backend (model.device = \"cuda\" or \"auto\")",
        );
    }
    let u = m.gpu_memory_utilization;
    if !(u > 0.0 && u <= 1.0) {
        return fail("model.gpu_memory_utilization", "must be in (0, 1]");
    }
    if m.served_model_name.as_deref() == Some("") {
        return fail("model.served_model_name", "must not be empty");
    }
    if !m.fp8_ignore.trim().is_empty() && m.quantization != Quantization::Fp8 {
        return fail(
            "model.fp8_ignore",
            "keeps matrices out of FP8 and needs model.quantization = \"fp8\"",
        );
    }
    if m.fp8_lm_head && m.quantization != Quantization::Fp8 {
        return fail(
            "model.fp8_lm_head",
            "puts the LM head in FP8 and needs model.quantization = \"fp8\"",
        );
    }
    Ok(())
}

fn engine(c: &Config) -> Check {
    if c.engine.block_size != BLOCK_SIZE {
        return fail(
            "engine.block_size",
            format!("only {BLOCK_SIZE} is supported"),
        );
    }
    if c.engine.stall_timeout.get().is_zero() {
        return fail("engine.stall_timeout", "must be more than 0");
    }
    Ok(())
}

fn scheduler(c: &Config) -> Check {
    let s = &c.scheduler;
    at_least("scheduler.max_num_seqs", s.max_num_seqs as u64, 1)?;
    // A step must hold at least one full KV block of prefill.
    if s.max_num_batched_tokens < c.engine.block_size {
        return fail(
            "scheduler.max_num_batched_tokens",
            format!(
                "must be at least engine.block_size ({})",
                c.engine.block_size
            ),
        );
    }
    Ok(())
}

fn server(c: &Config) -> Check {
    if c.server.host.trim().is_empty() {
        return fail("server.host", "must not be empty");
    }
    at_least("server.max_body_bytes", c.server.max_body_bytes.bytes(), 1)?;
    if c.server.header_timeout.get().is_zero() {
        return fail("server.header_timeout", "must be more than 0");
    }
    // One SSE chunk must fit, or every stream would be cut off at once.
    at_least(
        "server.max_stream_pending_bytes",
        c.server.max_stream_pending_bytes.bytes(),
        4096,
    )?;
    cors_origins(&c.server.cors_allowed_origins)
}

/// `server.cors_allowed_origins`: see [`cors_origins_error`].
fn cors_origins(origins: &[String]) -> Check {
    match cors_origins_error(origins) {
        Some((expected, got)) => fail(
            "server.cors_allowed_origins",
            format!("{expected}, got {got:?}"),
        ),
        None => Ok(()),
    }
}

/// What is wrong with a list of CORS origins, if anything: what is
/// expected, and the entry that is not. `"*"` alone, or origins
/// (`scheme://host[:port]`, no path): a browser compares its origin
/// exactly, so anything else would never match. Shared with the router.
pub fn cors_origins_error(origins: &[String]) -> Option<(&'static str, String)> {
    if origins.len() > 1 && origins.iter().any(|o| o == "*") {
        let expected = "\"*\" alone (it allows every origin)";
        return Some((expected, "*".into()));
    }
    let is_origin = |o: &str| {
        let rest = o
            .strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"));
        rest.is_some_and(|r| {
            !r.is_empty() && !r.contains('/') && r.bytes().all(|b| b.is_ascii_graphic())
        })
    };
    origins
        .iter()
        .find(|o| *o != "*" && !is_origin(o))
        .map(|o| {
            (
                "\"*\" or origins scheme://host[:port] without a path",
                o.clone(),
            )
        })
}

/// Ids and aliases name one model each.
fn models(c: &Config) -> Check {
    let mut names = std::collections::BTreeSet::new();
    for (i, m) in c.models.iter().enumerate() {
        if m.id.trim().is_empty() {
            return fail(format!("models[{i}].id"), "must not be empty");
        }
        for name in std::iter::once(&m.id).chain(&m.aliases) {
            if !names.insert(name.as_str()) {
                return fail(
                    format!("models[{i}]"),
                    format!("the name '{name}' is used twice (ids and aliases must be unique)"),
                );
            }
        }
    }
    Ok(())
}

fn limits(c: &Config) -> Check {
    if let Some(n) = c.limits.max_tokens {
        at_least("limits.max_tokens", n as u64, 1)?;
    }
    Ok(())
}

fn redis(c: &Config) -> Check {
    c.redis.check().or_else(|(key, message)| fail(key, message))
}

fn cuda(c: &Config) -> Check {
    match c.cuda.smem_carveout {
        Some(p) if p > 100 => fail("cuda.smem_carveout", "must be a percentage from 0 to 100"),
        _ => Ok(()),
    }
}

fn speculative(c: &Config) -> Check {
    let s = &c.speculative;
    if !(1..=16).contains(&s.num_speculative_tokens) {
        return fail("speculative.num_speculative_tokens", "must be from 1 to 16");
    }
    at_least(
        "speculative.prompt_lookup_min",
        s.prompt_lookup_min as u64,
        1,
    )?;
    if s.prompt_lookup_max < s.prompt_lookup_min {
        return fail(
            "speculative.prompt_lookup_max",
            "must be at least speculative.prompt_lookup_min",
        );
    }
    match (s.method, &s.model) {
        (SpeculativeMethod::Draft, None) => fail(
            "speculative.model",
            "method \"draft\" needs the draft model's path",
        ),
        (SpeculativeMethod::Eagle3, None) => fail(
            "speculative.model",
            "method \"eagle3\" needs the EAGLE-3 head's directory",
        ),
        (SpeculativeMethod::None | SpeculativeMethod::Ngram, Some(_)) => fail(
            "speculative.model",
            "is read only with method \"draft\" or \"eagle3\"",
        ),
        _ => Ok(()),
    }
}

fn kv_tiers(c: &Config) -> Check {
    let t = &c.kv_tiers;
    if t.disk_path.is_some() && t.disk_bytes.bytes() == 0 {
        return fail(
            "kv_tiers.disk_bytes",
            "must be more than 0 with a disk_path",
        );
    }
    if t.disk_path.is_none() && t.disk_bytes.bytes() > 0 {
        return fail("kv_tiers.disk_path", "is needed for disk_bytes");
    }
    if c.redis.share_kv && !c.redis.enabled() {
        return fail("redis.share_kv", "needs redis.url");
    }
    if c.redis.share_kv && t.host_bytes.bytes() == 0 {
        return fail(
            "redis.share_kv",
            "needs kv_tiers.host_bytes (pages fetched from Redis land in host memory)",
        );
    }
    if c.redis.share_kv && c.redis.kv_max_bytes.bytes() == 0 {
        return fail("redis.kv_max_bytes", "must be more than 0");
    }
    Ok(())
}

fn cache(c: &Config) -> Check {
    at_least("cache.max_entries", c.cache.max_entries, 1)?;
    at_least("cache.max_bytes", c.cache.max_bytes.bytes(), 1)?;
    if c.cache.ttl.get().is_zero() {
        return fail("cache.ttl", "must be more than 0");
    }
    Ok(())
}

/// The full directive syntax is tracing's; the binary checks it with
/// `EnvFilter`. Here only what is wrong whatever the filter says.
fn log(c: &Config) -> Check {
    if c.log.level.trim().is_empty() {
        return fail("log.level", "must not be empty (e.g. \"warn\" or \"info\")");
    }
    Ok(())
}

fn tracing(c: &Config) -> Check {
    let t = &c.tracing;
    if !(0.0..=1.0).contains(&t.sample_ratio) {
        return fail("tracing.sample_ratio", "must be between 0 and 1");
    }
    if let Some(e) = &t.otlp_endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            return fail(
                "tracing.otlp_endpoint",
                "must be an http:// or https:// URL (e.g. \"http://127.0.0.1:4318\")",
            );
        }
    }
    if t.service_name.trim().is_empty() {
        return fail("tracing.service_name", "must not be empty");
    }
    Ok(())
}

fn flags(c: &Config) -> Check {
    for (name, f) in &c.flags {
        if !valid_flag_name(name) {
            return fail(
                format!("flags.{name}"),
                "flag names use lowercase letters, digits and _",
            );
        }
        let key = format!("flags.{name}.rollout_percent");
        let p = f.rollout_percent;
        if !(0.0..=100.0).contains(&p) {
            return fail(key, "must be between 0 and 100");
        }
        if ((p * 100.0) - (p * 100.0).round()).abs() > 1e-6 {
            return fail(key, "at most two decimals (the rollout has 10000 buckets)");
        }
    }
    Ok(())
}

fn auth(c: &Config) -> Check {
    if let Err((i, field, rule)) = crate::auth::check_keys(&c.auth.api_keys) {
        return fail("auth.api_keys", format!("entry {i}: {field} {rule}"));
    }
    if let Some(h) = &c.auth.api_key_sha256 {
        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return fail("auth.api_key_sha256", "must be 64 hex digits");
        }
    }
    if let Some(p) = c.auth.open_paths.iter().find(|p| !p.starts_with('/')) {
        return fail("auth.open_paths", format!("{p:?} must start with /"));
    }
    Ok(())
}

/// A tier name or `*`.
fn valid_tier(tier: &str) -> bool {
    tier == "*" || tier.parse::<ingot_core::Priority>().is_ok()
}

/// Every `[[slo]]` entry: known tier, a target of the metric's kind, a
/// quantile in (0, 1], a window, a unique label.
fn check_slos(c: &Config) -> Check {
    let mut labels = std::collections::BTreeSet::new();
    for (i, s) in c.slo.iter().enumerate() {
        let key = |field: &str| format!("slo[{i}].{field}");
        if s.model.trim().is_empty() {
            return fail(key("model"), "must be a model name or \"*\"");
        }
        if !valid_tier(&s.tier) {
            return fail(
                key("tier"),
                "must be critical, high, normal, low, background or \"*\"",
            );
        }
        check_target(s, &key("target"))?;
        if s.metric.is_latency() && !(s.quantile > 0.0 && s.quantile <= 1.0) {
            return fail(key("quantile"), "must be in (0, 1]");
        }
        if s.window.get().is_zero() {
            return fail(key("window"), "must be more than 0");
        }
        if s.min_samples == 0 {
            return fail(key("min_samples"), "must be at least 1");
        }
        if s.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return fail(key("name"), "must not be empty");
        }
        // Two SLOs of one name would share (and fight over) one series.
        if !labels.insert((s.label(), s.model.clone(), s.tier.clone())) {
            return fail(
                format!("slo[{i}]"),
                format!(
                    "the SLO '{}' is defined twice for this model and tier",
                    s.label()
                ),
            );
        }
    }
    Ok(())
}

fn check_target(s: &SloSpec, key: &str) -> Check {
    match (s.metric.is_latency(), s.target) {
        (true, SloTarget::Duration(d)) if !d.get().is_zero() => Ok(()),
        (true, _) => fail(
            key,
            format!(
                "a {} target is a duration such as \"500ms\"",
                s.metric.as_str()
            ),
        ),
        (false, SloTarget::Ratio(r)) if (0.0..=1.0).contains(&r) => Ok(()),
        (false, _) => fail(
            key,
            "an error_rate target is a ratio in [0, 1] such as 0.01",
        ),
    }
}

fn check_remediation(c: &Config) -> Check {
    let r = &c.remediation;
    if r.interval.get().is_zero() {
        return fail("remediation.interval", "must be more than 0");
    }
    check_shed(&r.shed)?;
    check_batching(c)
}

fn check_shed(s: &ShedSection) -> Check {
    let mut seen = std::collections::BTreeSet::new();
    for t in &s.tiers {
        let p = t.parse::<ingot_core::Priority>().map_err(|e| Violation {
            key: "remediation.shed.tiers".into(),
            message: e,
        })?;
        if !seen.insert(p) {
            return fail("remediation.shed.tiers", format!("'{t}' is listed twice"));
        }
    }
    if seen.contains(&ingot_core::Priority::Critical) {
        return fail(
            "remediation.shed.tiers",
            "critical traffic is never shed or delayed",
        );
    }
    if !(s.exit_ratio > 0.0 && s.exit_ratio <= 1.0) {
        return fail("remediation.shed.exit_ratio", "must be in (0, 1]");
    }
    Ok(())
}

fn check_batching(c: &Config) -> Check {
    let b = &c.remediation.batching;
    let key = |f: &str| format!("remediation.batching.{f}");
    if b.target_itl.get().is_zero() {
        return fail(key("target_itl"), "must be more than 0");
    }
    if !(b.quantile > 0.0 && b.quantile <= 1.0) {
        return fail(key("quantile"), "must be in (0, 1]");
    }
    if !(0.0..1.0).contains(&b.band) {
        return fail(key("band"), "must be in [0, 1)");
    }
    if b.window.get().is_zero() {
        return fail(key("window"), "must be more than 0");
    }
    if b.min_samples == 0 {
        return fail(key("min_samples"), "must be at least 1");
    }
    if b.min_tokens < c.engine.block_size {
        return fail(
            key("min_tokens"),
            format!(
                "must be at least engine.block_size ({})",
                c.engine.block_size
            ),
        );
    }
    let max = b.max_tokens.unwrap_or(c.scheduler.max_num_batched_tokens);
    if max < b.min_tokens {
        return fail(
            key("max_tokens"),
            format!("must be at least min_tokens ({})", b.min_tokens),
        );
    }
    Ok(())
}
