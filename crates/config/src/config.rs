//! The whole configuration, [`Config`]: one field per section, each
//! section's type in its own file (`sections.rs` for the server's and
//! engine's, `models.rs`, `slo.rs`, `auth.rs`, `redis.rs`, `flags.rs`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::auth::AuthSection;
use crate::flags::FlagSpec;
use crate::models::{ModelEntry, RegistrySection};
use crate::redis::RedisSection;
use crate::sections::{
    CacheSection, CudaSection, EngineSection, KvTiersSection, LimitsSection, LogSection,
    MetricsSection, ModelSection, SchedulerSection, ServerSection, SpeculativeSection,
    StructuredSection, TracingSection,
};
use crate::slo::{RemediationSection, SloSpec};

/// The whole configuration of one ingot process.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Which model to load and how.
    pub model: ModelSection,
    /// Engine behaviour.
    pub engine: EngineSection,
    /// Batching limits and the priority policy.
    pub scheduler: SchedulerSection,
    /// The HTTP server.
    pub server: ServerSection,
    /// The response cache.
    pub cache: CacheSection,
    /// KV cache tiers below the device pool (host memory, disk).
    pub kv_tiers: KvTiersSection,
    /// CUDA backend switches (ignored on the CPU).
    pub cuda: CudaSection,
    /// Structured output (JSON schemas, regexes, grammars, tool calls).
    pub structured: StructuredSection,
    /// Speculative decoding (off by default).
    pub speculative: SpeculativeSection,
    /// Logging.
    pub log: LogSection,
    /// API keys and per-key limits.
    pub auth: AuthSection,
    /// What `/metrics` exports.
    pub metrics: MetricsSection,
    /// OpenTelemetry trace export.
    pub tracing: TracingSection,
    /// Per-request limits: output cap and timeouts.
    pub limits: LimitsSection,
    /// Several models in one server (`[[models]]`; empty: `[model]` alone).
    pub models: Vec<ModelEntry>,
    /// How the models share the machine.
    pub registry: RegistrySection,
    /// Shared state with other instances through Redis (docs/fleet.md).
    pub redis: RedisSection,
    /// Feature flags by name (`[a-z0-9_]+`).
    #[schemars(extend("propertyNames" = { "pattern": "^[a-z0-9_]+$" }))]
    pub flags: BTreeMap<String, FlagSpec>,
    /// Service-level objectives (`[[slo]]`), evaluated over live windows.
    pub slo: Vec<SloSpec>,
    /// What the SLO policy engine may do about a breach (off by default).
    pub remediation: RemediationSection,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            model: ModelSection::default(),
            engine: EngineSection::default(),
            scheduler: SchedulerSection::default(),
            server: ServerSection::default(),
            cache: CacheSection::default(),
            kv_tiers: KvTiersSection::default(),
            cuda: CudaSection::default(),
            structured: StructuredSection::default(),
            speculative: SpeculativeSection::default(),
            log: LogSection::default(),
            auth: AuthSection::default(),
            metrics: MetricsSection::default(),
            tracing: TracingSection::default(),
            limits: LimitsSection::default(),
            models: Vec::new(),
            registry: RegistrySection::default(),
            redis: RedisSection::default(),
            flags: default_flags(),
            slo: Vec::new(),
            remediation: RemediationSection::default(),
        }
    }
}

/// The built-in flags: `coalescing` on (identical in-flight deterministic
/// requests share one generation; it never changes an answer on the
/// batch-invariant CPU path), `response_cache` off (it returns stored answers,
/// which a deployment should opt into).
fn default_flags() -> BTreeMap<String, FlagSpec> {
    BTreeMap::from([
        (
            "coalescing".to_string(),
            FlagSpec {
                enabled: true,
                ..FlagSpec::default()
            },
        ),
        ("response_cache".to_string(), FlagSpec::default()),
    ])
}

impl Config {
    /// Flag `name` for `unit`; false for a flag this config does not define.
    pub fn flag(&self, name: &str, unit: &str) -> bool {
        self.flags.get(name).is_some_and(|f| f.decide(name, unit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_flag_is_false_for_unknown_flags() {
        let c = Config::default();
        assert!(c.flag("coalescing", "anyone"));
        assert!(!c.flag("response_cache", "anyone"));
        assert!(!c.flag("no_such_flag", "anyone"));
    }
}
