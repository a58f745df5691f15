//! `[[models]]` and `[registry]`: several models in one server.
//!
//! Without `[[models]]` the server serves `[model]` alone, loaded at start
//! and never unloaded, as before. With it, every entry is a model clients
//! can name; entries load on demand (or at start with `preload`) under
//! `[registry]`'s budget, least recently used ones making room.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sections::{Dtype, LoadFormat, ReasoningParser};
use crate::units::{ByteSize, Duration};

/// One servable model. Unset fields take `[model]`'s value.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The name clients pass as `model` (unique across ids and aliases).
    pub id: String,
    /// Other names clients may use.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// A GGUF file or a Hugging Face model directory.
    pub path: PathBuf,
    /// `auto` reads weights from the files; `dummy` makes random ones.
    #[serde(default)]
    pub load_format: Option<LoadFormat>,
    /// CPU weight storage (default: `model.dtype`).
    #[serde(default)]
    pub dtype: Option<Dtype>,
    /// Cap on the context length (default: `model.max_model_len`).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_model_len: Option<usize>,
    /// Tokens of KV cache (default: `model.kv_cache_tokens`, else 1 GiB
    /// worth on the CPU).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub kv_cache_tokens: Option<usize>,
    /// Where its reasoning goes (default: `model.reasoning_parser`).
    #[serde(default)]
    pub reasoning_parser: Option<ReasoningParser>,
    /// A chat template replacing the model's own: a Jinja file's path or
    /// the template itself (default: `model.chat_template`).
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Never evicted to make room, never unloaded for idleness.
    #[serde(default)]
    pub pinned: bool,
    /// Loaded when the server starts (`/ready` waits for it).
    #[serde(default)]
    pub preload: bool,
    /// Unloaded after this long without a request (`0s`: never).
    #[serde(default)]
    pub idle_timeout: Duration,
}

/// How several models share the machine.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrySection {
    /// Device bytes for loaded models (weights + KV + workspace). Unset:
    /// on the CPU, three quarters of physical memory; on the GPU,
    /// `model.gpu_memory_utilization` of its memory.
    pub device_budget: Option<ByteSize>,
    /// Host bytes for warm copies of evicted models (a sleeping engine:
    /// its weights in pinned host memory on the GPU, in RAM on the CPU), so
    /// bringing one back is a copy, not a load. Unset: on the GPU a quarter
    /// of physical memory; on the CPU none (there the device budget is the
    /// same RAM).
    pub host_budget: Option<ByteSize>,
    /// Longest a request waits for its model to load before a 503.
    pub load_wait: Duration,
    /// How far back requests count as recent demand for prefetching.
    pub prefetch_window: Duration,
    /// Requests within the window that make an unloaded model with no warm
    /// copy worth bringing into host memory (its files into the page cache)
    /// ahead of its next request.
    #[schemars(range(min = 1))]
    pub prefetch_min_requests: usize,
    /// Models prefetched per window at most (0: off).
    pub prefetch_max: usize,
}

impl Default for RegistrySection {
    fn default() -> Self {
        Self {
            device_budget: None,
            host_budget: None,
            load_wait: Duration::from_secs(120),
            prefetch_window: Duration::from_secs(300),
            prefetch_min_requests: 2,
            prefetch_max: 2,
        }
    }
}
