//! ingot's configuration: raw sources in, one validated, typed [`Config`] out.
//!
//! Sources, later wins: built-in defaults < the TOML file (`--config`) <
//! `INGOT_*` environment variables < command-line flags. [`load`] merges
//! them, remembering who set each value, so every error is one line naming
//! the key, the value, the source (file:line, variable or flag) and the rule,
//! and `ingot config show` can say where each setting came from.
//!
//! Nothing here reads the process environment or the command line: the
//! binary passes both in ([`Layers`]), which keeps tests hermetic and makes
//! a reload re-run exactly the same inputs. The JSON schema ([`schema`]) is
//! generated from the types, so it cannot drift from what the loader takes.
//! Feature flags ([`FlagSpec`], [`bucket`]) decide with a specified hash that
//! other languages reproduce (docs/config.md).
//!
//! Layout: each section's types in their own file (`sections.rs`,
//! `models.rs`, `slo.rs`, `auth.rs`, `redis.rs`, `flags.rs`), [`Config`]
//! made of them in `config.rs`, the rules across values in `check.rs`;
//! sections never import `Config`, and checks import types, never the
//! other way round.

mod auth;
mod check;
mod config;
mod env;
mod error;
mod file;
mod flags;
mod load;
mod models;
mod redis;
mod reload;
mod schema;
mod sections;
mod slo;
mod tree;
mod units;

pub use auth::{check_keys, ApiKeyEntry, AuthSection, Tier};
pub use check::cors_origins_error;
pub use config::Config;
pub use env::{env_name, FLAG_PREFIX, LEGACY, NOT_CONFIG};
pub use error::{ConfigError, Source};
pub use flags::{bucket, FlagSpec, BUCKETS};
pub use load::{load, FlagValue, Layers, Loaded};
pub use models::{ModelEntry, RegistrySection};
pub use redis::RedisSection;
pub use reload::{diff, live, Reload};
pub use schema::schema;
pub use sections::{
    CacheSection, CpuWeights, CudaSection, CudaWeights, Device, Dtype, EngineSection, KvCacheDtype,
    KvTiersSection, LimitsSection, LoadFormat, LogFormat, LogSection, MetricsSection, ModelSection,
    PriorityDeadlines, Quantization, ReasoningParser, SchedulerSection, ServerSection,
    SpeculativeMethod, SpeculativeSection, StructuredSection, TierTimeouts, TracingSection,
    BLOCK_SIZE,
};
pub use slo::{
    BatchingSection, RemediationMode, RemediationSection, ShedHow, ShedSection, SloMetric, SloSpec,
    SloTarget,
};
pub use units::{ByteSize, Duration};

#[cfg(test)]
mod tests;
