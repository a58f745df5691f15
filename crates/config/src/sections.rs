//! The sections of the server's and engine's configuration (`[model]`,
//! `[engine]`, `[scheduler]`, `[server]`, `[cache]`, `[cuda]`,
//! `[structured]`, `[log]`, `[metrics]`, `[tracing]`, `[limits]`) and
//! their built-in defaults.
//!
//! Every struct denies unknown fields (a typo is an error, never a silently
//! ignored setting) and defaults every field (a file names only what it
//! changes). The doc comments here become the JSON schema's descriptions.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

/// How model weights are obtained.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LoadFormat {
    /// Read the weights from the model files.
    #[default]
    Auto,
    /// Random weights of the configured shapes (benchmarks only).
    Dummy,
}

/// Where the model runs.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CUDA when a driver and this build's kernels are present, else the CPU.
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend; an error when it is unavailable.
    Cuda,
}

/// Weight storage on the CPU.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// Exact f32 weights.
    #[default]
    F32,
    /// bf16 weights: faster decode, logits differ by bf16 rounding.
    Bf16,
}

/// How the CPU backend keeps the weights of a quantized GGUF.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CpuWeights {
    /// In their GGUF blocks, multiplied natively with int8 activations
    /// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; other tensors
    /// follow `model.dtype`).
    #[default]
    Native,
    /// As `native`, with the 32-block formats (Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0) on AMX tiles (Intel Xeon from Sapphire Rapids on); refused
    /// where the CPU has no AMX-INT8.
    Amx,
    /// Dequantized at load, stored per `model.dtype`: the exact reference.
    F32,
}

/// How the CUDA backend keeps the weight matrices of a quantized GGUF.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CudaWeights {
    /// Expanded to bf16 at load (every type the CPU reads).
    #[default]
    Bf16,
    /// Decoder matrices stored in Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K
    /// (and AWQ/GPTQ checkpoints, read as Q4_1) stay in their blocks and
    /// run on kernels that read them as they are, as do the embeddings and
    /// an untied LM head in the 4- to 6-bit types; other tensors expand to
    /// bf16.
    Native,
}

/// Quantization at load of float weights (CPU: native kernels; CUDA: `fp8`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Quantization {
    /// Float weights stay as they are (per `model.dtype`).
    #[default]
    None,
    /// Float weight matrices quantized to Q8_0 blocks at load.
    Q8_0,
    /// Float weight matrices quantized to Q4_0 blocks at load.
    Q4_0,
    /// Float weight matrices quantized to Q4_K blocks at load (rows 256
    /// does not divide take Q8_0).
    #[serde(rename = "q4_k")]
    Q4K,
    /// CUDA only: the decoder's weight matrices quantized to FP8 (e4m3)
    /// at load, with one f32 scale per output channel.
    Fp8,
}

impl Quantization {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4K => "q4_k",
            Self::Fp8 => "fp8",
        }
    }
}

/// Where a reasoning model's thinking goes (vLLM's `--reasoning-parser`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningParser {
    /// Left in the answer's text.
    #[default]
    None,
    /// Qwen3's `<think>…</think>`, moved to `reasoning_content` (chat) and a
    /// reasoning item (Responses).
    Qwen3,
    /// DeepSeek-R1's: the same tags, the template opening `<think>` in the
    /// prompt (read from the rendered prompt either way).
    DeepseekR1,
}

impl ReasoningParser {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Qwen3 => "qwen3",
            Self::DeepseekR1 => "deepseek_r1",
        }
    }
}

/// Element type of the KV cache (CUDA; the CPU backend keeps f32).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// The model's compute dtype (bf16 on CUDA, f32 on the CPU).
    #[default]
    Auto,
    /// bf16 (CUDA).
    Bf16,
    /// FP8 e4m3 with a per-tensor scale of 1.0 (CUDA): half the bytes per
    /// token, so twice the tokens in the same memory; logits differ by the
    /// 3-bit-mantissa rounding of K and V.
    Fp8,
}

impl KvCacheDtype {
    /// The value as written in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
        }
    }
}

/// Which model to load and how.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// A GGUF file, a Hugging Face model directory, or a Hub model id
    /// `org/name[@revision][:file_or_quant]` (the local Hub cache, else a
    /// download) (required to serve).
    pub path: Option<PathBuf>,
    /// The name clients pass as `model` (default: the Hub id `org/name`,
    /// else the file's stem).
    pub served_model_name: Option<String>,
    /// `auto` reads weights from the files; `dummy` makes random ones.
    pub load_format: LoadFormat,
    /// `auto`, `cpu` or `cuda`.
    pub device: Device,
    /// CPU weight storage: `f32` or `bf16`.
    pub dtype: Dtype,
    /// CPU handling of quantized GGUF tensors: `native` or `f32`.
    pub cpu_weights: CpuWeights,
    /// CPU attention's softmax weights from an 8-lane polynomial exp
    /// (within 2 ulp) instead of the C library's `expf`: faster at long
    /// contexts, not the same bits (answers may turn at near-ties). Off
    /// until measured.
    pub cpu_fast_exp: bool,
    /// CUDA handling of quantized GGUF tensors: `bf16` (expanded at load)
    /// or `native` (Q8_0, Q4_0/Q4_1 and Q4_K/Q5_K/Q6_K tensors kept in
    /// their blocks).
    pub cuda_weights: CudaWeights,
    /// CPU: quantize float weight matrices at load (`none`, `q8_0`, `q4_0`
    /// or `q4_k`); CUDA: `fp8` (e4m3 layer matrices, per-channel scales).
    pub quantization: Quantization,
    /// With `quantization = "fp8"`: comma-separated patterns of decoder
    /// matrices kept in bf16 (`down_proj`, `layers.0`, `layers.29.mlp`, ...;
    /// empty: none).
    pub fp8_ignore: String,
    /// With `quantization = "fp8"`: the LM head in e4m3 too (per-row
    /// scales; a separate copy when tied to the embeddings). Off by
    /// default: it changes answers.
    pub fp8_lm_head: bool,
    /// CPU worker threads (default: all cores).
    #[schemars(range(min = 1))]
    pub threads: Option<usize>,
    /// Cap on the context length (default: the model's).
    #[schemars(range(min = 1))]
    pub max_model_len: Option<usize>,
    /// Tokens of KV cache (default: 1 GiB worth on the CPU, the memory
    /// budget on the GPU).
    #[schemars(range(min = 1))]
    pub kv_cache_tokens: Option<usize>,
    /// KV cache element type: `auto` (the model's dtype), `bf16` or `fp8`
    /// (CUDA only).
    pub kv_cache_dtype: KvCacheDtype,
    /// Share of GPU memory for weights, workspace and KV cache, in (0, 1].
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub gpu_memory_utilization: f64,
    /// GPUs of this host to split the model over (tensor parallel, CUDA
    /// only; GPUs `0..n`); 1: one GPU.
    #[schemars(range(min = 1))]
    pub tensor_parallel_size: usize,
    /// Run every GPU step eagerly instead of replaying CUDA graphs.
    pub enforce_eager: bool,
    /// `qwen3` or `deepseek_r1`: the model's `<think>…</think>` comes back
    /// as `reasoning_content`, not in the answer (`none`: in the answer).
    pub reasoning_parser: ReasoningParser,
    /// A chat template replacing the model's own: a Jinja file's path, or
    /// the template itself (unset: the model's). Checked at start-up.
    pub chat_template: Option<String>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: None,
            served_model_name: None,
            load_format: LoadFormat::Auto,
            device: Device::Auto,
            dtype: Dtype::F32,
            cpu_weights: CpuWeights::Native,
            cpu_fast_exp: false,
            cuda_weights: CudaWeights::Bf16,
            quantization: Quantization::None,
            fp8_ignore: String::new(),
            fp8_lm_head: false,
            threads: None,
            max_model_len: None,
            kv_cache_tokens: None,
            kv_cache_dtype: KvCacheDtype::Auto,
            gpu_memory_utilization: 0.9,
            tensor_parallel_size: 1,
            enforce_eager: false,
            reasoning_parser: ReasoningParser::None,
            chat_template: None,
        }
    }
}

/// The KV block size: the only one the kernels and the block manager support.
pub const BLOCK_SIZE: usize = 16;

/// What `/metrics` exports.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Also export vLLM's series (`vllm:num_requests_waiting`, ...) with
    /// vLLM's names, units and labels, so dashboards and autoscalers built
    /// for vLLM read ingot unchanged.
    pub vllm_names: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self { vllm_names: true }
    }
}

/// OpenTelemetry trace export (OTLP over HTTP/protobuf).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TracingSection {
    /// The OTLP/HTTP collector, e.g. `http://127.0.0.1:4318` (spans are
    /// POSTed to `<endpoint>/v1/traces`). Unset: no export.
    pub otlp_endpoint: Option<String>,
    /// The share of new traces sampled (0 to 1); a request with an incoming
    /// `traceparent` follows its parent's decision.
    pub sample_ratio: f64,
    /// The `service.name` resource attribute.
    pub service_name: String,
}

impl Default for TracingSection {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: "ingot".to_string(),
        }
    }
}

/// Engine behaviour.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSection {
    /// Reuse KV blocks across requests with a common prefix.
    pub prefix_caching: bool,
    /// A client that reads nothing for this long is cut off.
    pub stall_timeout: Duration,
    /// Token slots per KV block (only 16 is supported).
    #[schemars(range(min = 16, max = 16))]
    pub block_size: usize,
    /// Batch-invariant kernels: a greedy (or seeded) answer does not depend
    /// on what else runs beside it. The CPU backend always is; on the GPU
    /// this picks slower kernels, so it is off by default.
    pub deterministic: bool,
}

impl Default for EngineSection {
    fn default() -> Self {
        Self {
            prefix_caching: true,
            stall_timeout: Duration::from_secs(30),
            block_size: BLOCK_SIZE,
            deterministic: false,
        }
    }
}

/// Batching limits and the priority policy.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerSection {
    /// Most sequences running at once.
    #[schemars(range(min = 1))]
    pub max_num_seqs: usize,
    /// Most tokens per engine step (prefill chunks + decodes); at least
    /// `engine.block_size`.
    #[schemars(range(min = 16))]
    pub max_num_batched_tokens: usize,
    /// Most tokens of a step in which no sequence decodes (only prompts,
    /// as when a request arrives at an idle server): such a step delays
    /// no running request's next token, so a prompt up to this long is
    /// computed in one step instead of chunks of `max_num_batched_tokens`.
    /// At or below `max_num_batched_tokens` (0: off) it changes nothing.
    pub max_prefill_only_tokens: usize,
    /// Waiting-queue bound; beyond it requests get 429 (low tiers first).
    pub max_waiting: usize,
    /// Waiting this long promotes a request by one tier.
    pub aging: Duration,
    /// First-token deadline per tier; a request past its deadline is
    /// scheduled before others of its tier.
    pub priority_deadlines: PriorityDeadlines,
}

impl SchedulerSection {
    /// The prefill-only step budget in effect: `max_prefill_only_tokens`,
    /// except that a `max_num_batched_tokens` lowered below its default
    /// stays the cap of every step while this key keeps its default (a
    /// smaller budget is asked for memory or latency; set this key to a
    /// value other than 2048 to have both).
    pub fn prefill_only_tokens(&self) -> usize {
        let d = Self::default();
        if self.max_num_batched_tokens < d.max_num_batched_tokens
            && self.max_prefill_only_tokens == d.max_prefill_only_tokens
        {
            self.max_num_batched_tokens
        } else {
            self.max_prefill_only_tokens
        }
    }
}

impl Default for SchedulerSection {
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            max_prefill_only_tokens: 2048,
            max_waiting: 256,
            aging: Duration::from_secs(10),
            priority_deadlines: PriorityDeadlines::default(),
        }
    }
}

/// First-token deadlines per priority tier.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PriorityDeadlines {
    /// Tier `critical`.
    pub critical: Duration,
    /// Tier `high`.
    pub high: Duration,
    /// Tier `normal` (the default tier).
    pub normal: Duration,
    /// Tier `low`.
    pub low: Duration,
    /// Tier `background`.
    pub background: Duration,
}

impl PriorityDeadlines {
    /// The five deadlines, most urgent tier first (the scheduler's order).
    pub fn as_array(&self) -> [std::time::Duration; 5] {
        [
            self.critical.get(),
            self.high.get(),
            self.normal.get(),
            self.low.get(),
            self.background.get(),
        ]
    }
}

impl Default for PriorityDeadlines {
    fn default() -> Self {
        Self {
            critical: Duration::from_millis(250),
            high: Duration::from_secs(1),
            normal: Duration::from_secs(5),
            low: Duration::from_secs(30),
            background: Duration::from_secs(120),
        }
    }
}

/// The HTTP server.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// Address to listen on.
    pub host: String,
    /// Port (0: any free port; the bound address is printed).
    pub port: u16,
    /// Largest request body.
    pub max_body_bytes: ByteSize,
    /// How long in-flight requests may finish after SIGTERM.
    pub shutdown_timeout: Duration,
    /// Longest a connection may take to send a request's headers, counted
    /// from when it is ready for the next request: a client trickling
    /// headers, or a keep-alive connection idle this long, is closed.
    pub header_timeout: Duration,
    /// Most open connections (0: no cap). At the cap a new connection
    /// takes the slot of the connection idle longest (no request in
    /// flight, idle at least 250 ms); when all are busy it is answered 503
    /// and closed.
    pub max_connections: usize,
    /// Most open connections from one client address; one more is answered
    /// 503 and closed (0, the default: no per-address cap, as behind a
    /// proxy every client has the proxy's address).
    pub max_connections_per_client: usize,
    /// While a streaming client lags (its socket holds unacknowledged
    /// bytes), what is pending goes out as one write at most this often.
    pub stream_flush_interval: Duration,
    /// Most bytes a stream may hold for a client that does not read; beyond
    /// it the stream is cut off at once (before the stall timeout).
    pub max_stream_pending_bytes: ByteSize,
    /// Origins a browser page may call the API from (CORS): `["*"]` for
    /// any, or exact origins (`"https://app.example.com"`). Empty (the
    /// default): no CORS headers, so browsers keep pages of other origins
    /// out.
    pub cors_allowed_origins: Vec<String>,
    /// Ignore request fields an OpenAI endpoint does not know, as vLLM
    /// does, instead of refusing them with a 400 naming the field (the
    /// default, as OpenAI does). Read per request.
    pub ignore_unknown_fields: bool,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_string(),
            port: 8000,
            max_body_bytes: ByteSize::mib(4),
            shutdown_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(30),
            max_connections: 4096,
            max_connections_per_client: 0,
            stream_flush_interval: Duration::from_millis(20),
            max_stream_pending_bytes: ByteSize::mib(4),
            cors_allowed_origins: Vec::new(),
            ignore_unknown_fields: false,
        }
    }
}

/// Per-request limits. Every timeout is off by default (`0s`): a request
/// runs until it ends, as before these existed.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSection {
    /// Cap on `max_tokens` (a request asking more gets 400; one asking none
    /// gets at most this). Unset: the context is the cap.
    #[schemars(range(min = 1))]
    pub max_tokens: Option<usize>,
    /// Longest a request may run, from arrival to its last token, per
    /// priority tier (`0s`: no limit). Past it: 504 `request_timeout`, or an
    /// error event on a stream; the generation is cancelled.
    pub request_timeout: TierTimeouts,
    /// Longest a request may wait for its first token, per tier (`0s`: no
    /// limit). Past it: 504 `first_token_timeout`; the generation is
    /// cancelled.
    pub first_token_timeout: TierTimeouts,
}

/// A timeout per priority tier; `0s` is none.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct TierTimeouts {
    /// Tier `critical`.
    pub critical: Duration,
    /// Tier `high`.
    pub high: Duration,
    /// Tier `normal` (the default tier).
    pub normal: Duration,
    /// Tier `low`.
    pub low: Duration,
    /// Tier `background`.
    pub background: Duration,
}

impl TierTimeouts {
    /// The timeout of tier `rank` (0 = critical … 4 = background); `None`
    /// when it is off.
    pub fn get(&self, rank: usize) -> Option<std::time::Duration> {
        let d = match rank {
            0 => self.critical,
            1 => self.high,
            2 => self.normal,
            3 => self.low,
            _ => self.background,
        }
        .get();
        (!d.is_zero()).then_some(d)
    }
}

/// The response cache (used when the `response_cache` flag is on).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSection {
    /// Most cached responses.
    #[schemars(range(min = 1))]
    pub max_entries: u64,
    /// Most bytes of cached responses.
    pub max_bytes: ByteSize,
    /// How long a cached response stays valid (more than zero).
    pub ttl: Duration,
}

impl Default for CacheSection {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_bytes: ByteSize::mib(256),
            ttl: Duration::from_secs(600),
        }
    }
}

/// `[kv_tiers]`: prefix blocks evicted from the KV pool kept in host memory
/// and on local disk (docs/kv-cache.md, "Tiers"). Off by default.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct KvTiersSection {
    /// Host memory for evicted KV pages (0: no host tier).
    pub host_bytes: ByteSize,
    /// Directory of the disk tier (unset: none). Pages go in a
    /// subdirectory named by the model's namespace and survive restarts.
    pub disk_path: Option<std::path::PathBuf>,
    /// Most bytes of the disk tier's files.
    pub disk_bytes: ByteSize,
}

impl KvTiersSection {
    /// Whether any tier is configured.
    pub fn enabled(&self) -> bool {
        self.host_bytes.bytes() > 0 || self.disk_path.is_some()
    }
}

/// Speculative decoding (docs/speculative.md). Off by default
/// (`method = "none"`): it never changes a greedy answer, but a step with
/// proposals costs more than one without, which pays only when enough of
/// them hold; turn it on per deployment once measured.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SpeculativeSection {
    /// `none`, `ngram` (prompt lookup: what followed the latest earlier
    /// occurrence of the last tokens, in the prompt or the output),
    /// `draft` (`draft_model` too: a smaller model of the same tokenizer,
    /// `model`, run ahead greedily) or `eagle3` (an EAGLE-3 head, `model`,
    /// reading the target's hidden states; CPU backend).
    pub method: SpeculativeMethod,
    /// The draft model for `method = "draft"`: a GGUF file or a Hugging
    /// Face directory whose tokenizer is the target's (loaded on the
    /// target's device, before it, with the target's model settings). For
    /// `"eagle3"`: the head's directory (`config.json` and
    /// `model.safetensors` as the EAGLE-3 authors publish them).
    pub model: Option<std::path::PathBuf>,
    /// Tokens of KV cache the draft model (or head) keeps. Unset: room for
    /// every sequence that may propose (`disable_by_batch_size`, at most
    /// `scheduler.max_num_seqs`) at the target's context length.
    pub draft_kv_cache_tokens: Option<usize>,
    /// Most tokens proposed per sequence and step.
    #[schemars(range(min = 1, max = 16))]
    pub num_speculative_tokens: usize,
    /// Shortest suffix the n-gram proposer matches.
    #[schemars(range(min = 1))]
    pub prompt_lookup_min: usize,
    /// Longest suffix the n-gram proposer matches (tried first).
    #[schemars(range(min = 1))]
    pub prompt_lookup_max: usize,
    /// Steps running more sequences than this propose nothing.
    pub disable_by_batch_size: usize,
    /// Propose only the tokens the cost model says pay (each sequence's
    /// acceptance against the step's measured cost per token); `false`:
    /// always `num_speculative_tokens` where the proposer has them.
    pub adaptive: bool,
    /// n-gram only, with `adaptive`: look up `num_speculative_tokens` every
    /// step and cut each guess by how often guesses backed by as long a
    /// match were kept (across sequences), instead of each sequence's own
    /// acceptance deciding before the lookup. Off by default: on the CPU it
    /// proposed more of the input-grounded tokens at the same speed, and on
    /// CUDA it was slower (docs/benchmarks.md, "Speculative decoding").
    pub rate_by_match: bool,
    /// n-gram only: a sequence whose lookup finds nothing to copy in its
    /// tokens so far does not hold back the GPU's early launch of the next
    /// decode step (its next guess then waits one step once a match
    /// appears). Answers are unchanged; `false`: no step is launched ahead
    /// while a sequence may propose.
    pub launch_ahead_unmatched: bool,
}

impl Default for SpeculativeSection {
    fn default() -> Self {
        Self {
            method: SpeculativeMethod::None,
            model: None,
            draft_kv_cache_tokens: None,
            num_speculative_tokens: 4,
            prompt_lookup_min: 2,
            prompt_lookup_max: 4,
            disable_by_batch_size: 8,
            adaptive: true,
            rate_by_match: false,
            launch_ahead_unmatched: true,
        }
    }
}

/// Where speculative proposals come from.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SpeculativeMethod {
    /// No speculation.
    None,
    /// Prompt lookup (n-gram matching).
    Ngram,
    /// A draft model (`speculative.model`).
    #[serde(alias = "draft_model")]
    Draft,
    /// An EAGLE-3 head (`speculative.model`).
    Eagle3,
}

/// CUDA backend switches (ignored on the CPU).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CudaSection {
    /// Log a per-step GPU time breakdown.
    pub profile: bool,
    /// Synchronize after every kernel launch and name the one that faulted
    /// (debugging only: slow).
    pub check: bool,
    /// `<MiB>[:<mode>]`: how much of o_proj's weights small-batch decode
    /// attention prefetches into L2 (unset: a sixth of L2; 0 turns it off).
    pub l2_prefetch: Option<String>,
    /// Programmatic dependent launch on sm_90+ (each kernel may start while
    /// the previous one drains).
    pub pdl: bool,
    /// Small models (hidden size up to 1,024) at batch 1-8: run each
    /// layer's attention combine, o_proj, MLP and the next layer's q/k/v as
    /// one kernel with grid-wide barriers instead of five (same bits, fewer
    /// launches). Off: measured slower on the H100 (docs/perf/small-models.md).
    pub fused_block: bool,
    /// Decode steps of this many rows up to 8 (speculative verification,
    /// small batches) run the bf16 GEMVs of models wider than 2,048 on
    /// tensor cores, with the norms, activation and rope as kernels of
    /// their own, instead of the CUDA-core GEMVs that fuse them (0: never).
    /// Default 3: from 3 rows it paid on an H200 (the 8B: 3 rows +12 %, 4
    /// +19 %, 8 +78 %; 2 rows -3 %; docs/benchmarks.md). Batch 1 and
    /// `engine.deterministic` never take it; the kernels match float64
    /// within f32 rounding, and a row's bits already depend on its step's
    /// size without it (the default kernels are not batch-invariant).
    /// Narrower models take them for their LM head only (nothing fused
    /// into it).
    pub tc_gemv_min_rows: usize,
    /// Decode steps with at least this many decode rows run the tensor-core
    /// decode attention kernel (0: never; head sizes 64 and 128). Default
    /// 64: on an H100 it was faster than the SIMT kernel at 64 and 256
    /// sequences once large batches took one split (docs/perf/large-batch.md).
    pub tc_decode_min_rows: usize,
    /// With an FP8 KV cache, decode steps with at least this many decode
    /// rows run the tensor-core decode attention (0: never; the smaller
    /// non-zero of this and `tc_decode_min_rows` applies). Default 64, as
    /// above.
    pub tc_decode_fp8_min_rows: usize,
    /// Tensor parallel: small all-reduces (decode steps, up to 2 MiB) run
    /// ingot's one-shot kernel over peer memory instead of NCCL (false:
    /// NCCL for all, as vLLM's `--disable-custom-all-reduce`).
    pub custom_all_reduce: bool,
    /// Mixture of experts: steps of at least this many tokens (prefill
    /// chunks, large batches) run the experts as grouped tensor-core GEMMs
    /// over the step's slots sorted by expert, reading each expert once per
    /// tile of 64 slots, instead of a GEMV per slot (0: never). Default 48:
    /// the crossover measured on an H200 at the Qwen3-30B-A3B shape
    /// (`tests/gpu/bench_moe.py`); the grouped GEMMs match transformers
    /// within its own bf16 error, and `engine.deterministic` turns them off.
    pub moe_grouped_min_tokens: usize,
    /// The share of each SM's unified L1 / shared memory that every kernel
    /// prefers as shared memory, in percent (unset: the driver picks per
    /// kernel). Consecutive kernels whose picks differ make the SM change
    /// its split between them, which loses the overlap PDL gives: on an
    /// H200, SmolLM2's decode steps of 4-8 rows took 14-17 % less time at
    /// 25, its batch 1 6 % more (docs/perf/small-models.md). Unset by
    /// default until a setting that pays everywhere is measured.
    #[schemars(range(max = 100))]
    pub smem_carveout: Option<u8>,
}

impl Default for CudaSection {
    fn default() -> Self {
        Self {
            profile: false,
            check: false,
            l2_prefetch: None,
            pdl: true,
            fused_block: false,
            tc_gemv_min_rows: 3,
            tc_decode_min_rows: 64,
            tc_decode_fp8_min_rows: 64,
            custom_all_reduce: true,
            moe_grouped_min_tokens: 48,
            smem_carveout: None,
        }
    }
}

/// Structured output (JSON schemas, regexes, grammars, tool calls).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StructuredSection {
    /// Once a constrained output's tokens left fall to a quarter of its
    /// budget (or 16), or to about twice what finishing the document would
    /// take (estimated in its last 96 tokens), allow only tokens that head
    /// for the end of the document, so a looping model still finishes
    /// valid output within `max_tokens`.
    pub close_near_limit: bool,
}

impl Default for StructuredSection {
    fn default() -> Self {
        Self {
            close_near_limit: true,
        }
    }
}

/// Logging.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// A tracing `EnvFilter` directive, e.g. `info` or
    /// `warn,ingot_server=debug`.
    pub level: String,
    /// Line format on stderr: `text` (human-readable) or `json` (one JSON
    /// object per line). Chosen at start-up.
    pub format: LogFormat,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            // Quiet unless something needs attention, but for the few
            // lines that say what `ingot serve` is serving and where.
            level: "warn,ingot::startup=info".to_string(),
            format: LogFormat::Text,
        }
    }
}

/// How log lines are written.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// tracing's human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (fields, the span list with the request id).
    Json,
}

impl LoadFormat {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Dummy => "dummy",
        }
    }
}

impl Device {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        }
    }
}

impl CpuWeights {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Amx => "amx",
            Self::F32 => "f32",
        }
    }

    /// Whether quantized tensors stay in their blocks.
    pub fn keeps_blocks(self) -> bool {
        self != Self::F32
    }
}

impl CudaWeights {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Native => "native",
        }
    }
}

impl Dtype {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }
}
