//! Range and cross-field rules the types cannot express.

use crate::config::{Config, Quantization, BLOCK_SIZE};
use crate::flags::valid_flag_name;

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
    log(config)?;
    tracing(config)?;
    limits(config)?;
    models(config)?;
    auth(config)?;
    redis(config)?;
    flags(config)?;
    crate::slo::check_slos(config)?;
    crate::slo::check_remediation(config)
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
    )
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
