//! Engine metrics through the `metrics` facade; the server installs a
//! Prometheus recorder (which adds the `model` label to every series).
//!
//! ingot's own series follow Prometheus naming (`ingot_…`, counters end in
//! `_total`, base units in the name). With `vllm_names` the same
//! measurements are also exported under vLLM's names, units and labels
//! (`vllm:…`, `model_name`, `engine`), so dashboards, autoscalers and the
//! Gateway API inference extension built for vLLM read ingot unchanged.

use std::time::Duration;

use ingot_core::{FinishReason, Priority};
use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Label, Unit,
};

use crate::handle::Completion;

/// What the engine exports besides its own series.
#[derive(Debug, Clone, Default)]
pub struct MetricsConfig {
    /// The served model name: the `model_name` label of the vLLM series.
    pub model_name: String,
    /// Also export vLLM-named series.
    pub vllm_names: bool,
}

/// vLLM's `engine` label: the engine index within one server (one here).
const VLLM_ENGINE: &str = "0";

/// One measurement under one naming scheme: the handles of its unlabelled
/// series, registered once so a step costs no name lookups.
struct Series {
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge,
    prefix_queries: Counter,
    prefix_hits: Counter,
    preemptions: Counter,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    inter_token: Histogram,
    /// Per finished request: its prompt and generated lengths, its
    /// `max_tokens`, and its prefill (first scheduled to first token) and
    /// decode (first token to the end) times.
    prompt_len: Histogram,
    generation_len: Histogram,
    max_tokens: Histogram,
    prefill_time: Histogram,
    decode_time: Histogram,
    /// Speculative decoding: sequences' proposals verified, their tokens,
    /// the tokens kept, and the per-position series' name.
    spec_drafts: Counter,
    spec_draft_tokens: Counter,
    spec_accepted: Counter,
    spec_per_pos: &'static str,
}

/// A finished request's lengths and phases, besides its [`Completion`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestPhases {
    /// The request's `max_tokens`.
    pub max_tokens: usize,
    /// First scheduled to first token (none when it made no token).
    pub prefill: Option<Duration>,
    /// First token to the end.
    pub decode: Option<Duration>,
}

/// Bucket bounds of the per-request token-count histograms (vLLM's 1-2-5
/// series), for the exporter's configuration.
pub const TOKEN_COUNT_BUCKETS: [f64; 17] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5,
];

/// The per-request token-count histograms, under both naming schemes.
pub const TOKEN_COUNT_HISTOGRAMS: [&str; 6] = [
    "ingot_request_prompt_tokens",
    "ingot_request_generation_tokens",
    "ingot_request_max_tokens",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_max_num_generation_tokens",
];

/// The engine's metric handles (one per engine thread).
pub(crate) struct Metrics {
    /// The `model` label of every series (overrides the server's global
    /// one, so several engines in one process stay apart).
    model: String,
    ingot: Series,
    iteration_tokens: Histogram,
    step_duration: Histogram,
    prefill_forward: Histogram,
    prefill_steps: Histogram,
    vllm: Option<Vllm>,
}

/// The vLLM-named series and their labels.
struct Vllm {
    series: Series,
    model_name: String,
}

impl Metrics {
    /// Describes every series (HELP text and unit) and registers the
    /// gauges and counters at zero, so `/metrics` lists them before the
    /// first request.
    pub(crate) fn new(config: &MetricsConfig) -> Self {
        describe_ingot();
        let model = config.model_name.clone();
        let label = || vec![Label::new("model", model.clone())];
        let ingot = Series {
            running: gauge!("ingot_num_requests_running", label()),
            waiting: gauge!("ingot_num_requests_waiting", label()),
            kv_usage: gauge!("ingot_kv_cache_usage_perc", label()),
            prefix_queries: counter!("ingot_prefix_cache_queries_total", label()),
            prefix_hits: counter!("ingot_prefix_cache_hits_total", label()),
            preemptions: counter!("ingot_num_preemptions_total", label()),
            prompt_tokens: counter!("ingot_prompt_tokens_total", label()),
            generation_tokens: counter!("ingot_generation_tokens_total", label()),
            inter_token: histogram!("ingot_inter_token_latency_seconds", label()),
            prompt_len: histogram!("ingot_request_prompt_tokens", label()),
            generation_len: histogram!("ingot_request_generation_tokens", label()),
            max_tokens: histogram!("ingot_request_max_tokens", label()),
            prefill_time: histogram!("ingot_request_prefill_time_seconds", label()),
            decode_time: histogram!("ingot_request_decode_time_seconds", label()),
            spec_drafts: counter!("ingot_spec_decode_num_drafts_total", label()),
            spec_draft_tokens: counter!("ingot_spec_decode_num_draft_tokens_total", label()),
            spec_accepted: counter!("ingot_spec_decode_num_accepted_tokens_total", label()),
            spec_per_pos: "ingot_spec_decode_num_accepted_tokens_per_pos_total",
        };
        let vllm = config.vllm_names.then(|| Vllm::new(&config.model_name));
        let m = Self {
            ingot,
            iteration_tokens: histogram!("ingot_iteration_tokens", label()),
            step_duration: histogram!("ingot_step_duration_seconds", label()),
            prefill_forward: histogram!("ingot_request_prefill_forward_seconds", label()),
            prefill_steps: histogram!("ingot_request_prefill_steps", label()),
            vllm,
            model,
        };
        m.gauges(0, 0, 0.0);
        m.prefix_cache(0, 0);
        m.preemptions(0);
        m.each(|s| {
            s.prompt_tokens.increment(0);
            s.generation_tokens.increment(0);
        });
        request_counter(&m.model).increment(0);
        m
    }

    /// Where each grammar mask's compute time goes (structured output).
    pub(crate) fn mask_seconds(&self) -> Histogram {
        histogram!(
            "ingot_structured_mask_seconds",
            vec![Label::new("model", self.model.clone())]
        )
    }

    /// Runs `f` on every naming scheme's series.
    fn each(&self, f: impl Fn(&Series)) {
        f(&self.ingot);
        if let Some(v) = &self.vllm {
            f(&v.series);
        }
    }

    /// Running / waiting gauges and KV usage (fraction in [0, 1]).
    pub(crate) fn gauges(&self, running: usize, waiting: usize, kv_usage: f64) {
        self.each(|s| {
            s.running.set(running as f64);
            s.waiting.set(waiting as f64);
            s.kv_usage.set(kv_usage);
        });
    }

    /// Prefix-cache lookups and hits, in tokens.
    pub(crate) fn prefix_cache(&self, queries: u64, hits: u64) {
        self.each(|s| {
            s.prefix_queries.increment(queries);
            s.prefix_hits.increment(hits);
        });
    }

    /// Preemptions since the last call.
    pub(crate) fn preemptions(&self, n: u64) {
        self.each(|s| s.preemptions.increment(n));
    }

    /// One sequence's proposal of `proposed` tokens, of which the first
    /// `kept` held (per position: position `i` counts when it held).
    pub(crate) fn speculation(&self, proposed: usize, kept: usize) {
        if proposed == 0 {
            return;
        }
        self.each(|s| {
            s.spec_drafts.increment(1);
            s.spec_draft_tokens.increment(proposed as u64);
            s.spec_accepted.increment(kept as u64);
        });
        for position in 0..kept {
            let position = position.to_string();
            counter!(self.ingot.spec_per_pos, "model" => self.model.clone(), "position" => position.clone())
                .increment(1);
            if let Some(v) = &self.vllm {
                counter!(v.series.spec_per_pos, "model" => v.model_name.clone(), "model_name" => v.model_name.clone(), "engine" => VLLM_ENGINE, "position" => position)
                    .increment(1);
            }
        }
    }

    /// One engine step (ingot only: vLLM's iteration histogram is per step
    /// too, but its buckets differ, so it is not imitated).
    pub(crate) fn iteration(&self, tokens: usize, elapsed: Duration) {
        self.iteration_tokens.record(tokens as f64);
        self.step_duration.record(elapsed.as_secs_f64());
    }

    /// A request's first token came: the forward time of the steps that
    /// computed its prompt, and their number.
    pub(crate) fn prefill(&self, forward: Duration, steps: u32) {
        self.prefill_forward.record(forward.as_secs_f64());
        self.prefill_steps.record(f64::from(steps));
    }

    /// Arrival to first scheduling.
    pub(crate) fn queue_time(&self, d: Duration, p: Priority) {
        histogram!("ingot_request_queue_time_seconds", "model" => self.model.clone(), "priority" => p.as_str())
            .record(d.as_secs_f64());
        if let Some(v) = &self.vllm {
            v.histogram("vllm:request_queue_time_seconds")
                .record(d.as_secs_f64());
        }
    }

    /// Arrival to first token.
    pub(crate) fn time_to_first_token(&self, d: Duration, p: Priority) {
        histogram!("ingot_time_to_first_token_seconds", "model" => self.model.clone(), "priority" => p.as_str())
            .record(d.as_secs_f64());
        if let Some(v) = &self.vllm {
            v.histogram("vllm:time_to_first_token_seconds")
                .record(d.as_secs_f64());
        }
    }

    /// Gap between consecutive tokens of a request.
    pub(crate) fn inter_token_latency(&self, d: Duration) {
        self.each(|s| s.inter_token.record(d.as_secs_f64()));
    }

    /// A request that ran to its end.
    pub(crate) fn request_done(
        &self,
        c: &Completion,
        phases: RequestPhases,
        e2e: Duration,
        p: Priority,
    ) {
        self.each(|s| {
            s.prompt_tokens.increment(c.prompt_tokens as u64);
            s.generation_tokens.increment(c.completion_tokens as u64);
            s.prompt_len.record(c.prompt_tokens as f64);
            s.generation_len.record(c.completion_tokens as f64);
            s.max_tokens.record(phases.max_tokens as f64);
            if let Some(d) = phases.prefill {
                s.prefill_time.record(d.as_secs_f64());
            }
            if let Some(d) = phases.decode {
                s.decode_time.record(d.as_secs_f64());
            }
        });
        histogram!("ingot_e2e_request_latency_seconds", "model" => self.model.clone(), "priority" => p.as_str())
            .record(e2e.as_secs_f64());
        if let Some(v) = &self.vllm {
            v.histogram("vllm:e2e_request_latency_seconds")
                .record(e2e.as_secs_f64());
        }
        self.request_finished(c.reason, p);
    }

    /// Counts a request by how it ended.
    pub(crate) fn request_finished(&self, reason: FinishReason, p: Priority) {
        counter!(
            "ingot_request_success_total",
            "model" => self.model.clone(),
            "finish_reason" => reason.as_str(),
            "priority" => p.as_str()
        )
        .increment(1);
        if let Some(v) = &self.vllm {
            counter!(
                "vllm:request_success_total",
                "model" => v.model_name.clone(),
                "model_name" => v.model_name.clone(),
                "engine" => VLLM_ENGINE,
                "finished_reason" => reason.as_str()
            )
            .increment(1);
        }
    }
}

impl Vllm {
    /// Describes and registers vLLM's series for `model_name`.
    fn new(model_name: &str) -> Self {
        describe_vllm();
        let labels = || {
            vec![
                Label::new("model", model_name.to_string()),
                Label::new("model_name", model_name.to_string()),
                Label::new("engine", VLLM_ENGINE),
            ]
        };
        Self {
            series: Series {
                running: gauge!("vllm:num_requests_running", labels()),
                waiting: gauge!("vllm:num_requests_waiting", labels()),
                kv_usage: gauge!("vllm:kv_cache_usage_perc", labels()),
                prefix_queries: counter!("vllm:prefix_cache_queries_total", labels()),
                prefix_hits: counter!("vllm:prefix_cache_hits_total", labels()),
                preemptions: counter!("vllm:num_preemptions_total", labels()),
                prompt_tokens: counter!("vllm:prompt_tokens_total", labels()),
                generation_tokens: counter!("vllm:generation_tokens_total", labels()),
                inter_token: histogram!("vllm:inter_token_latency_seconds", labels()),
                prompt_len: histogram!("vllm:request_prompt_tokens", labels()),
                generation_len: histogram!("vllm:request_generation_tokens", labels()),
                max_tokens: histogram!("vllm:request_max_num_generation_tokens", labels()),
                prefill_time: histogram!("vllm:request_prefill_time_seconds", labels()),
                decode_time: histogram!("vllm:request_decode_time_seconds", labels()),
                spec_drafts: counter!("vllm:spec_decode_num_drafts_total", labels()),
                spec_draft_tokens: counter!("vllm:spec_decode_num_draft_tokens_total", labels()),
                spec_accepted: counter!("vllm:spec_decode_num_accepted_tokens_total", labels()),
                spec_per_pos: "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            },
            model_name: model_name.to_string(),
        }
    }

    /// A vLLM histogram with vLLM's labels.
    fn histogram(&self, name: &'static str) -> Histogram {
        histogram!(name, "model" => self.model_name.clone(), "model_name" => self.model_name.clone(), "engine" => VLLM_ENGINE)
    }
}

/// A request entered the engine (one generation; coalesced and cached
/// answers never reach here). Called from the submitting thread, which has
/// no `Metrics`.
pub(crate) fn request_submitted(model: &str) {
    request_counter(model).increment(1);
}

fn request_counter(model: &str) -> Counter {
    counter!("ingot_engine_requests_total", "model" => model.to_string())
}

/// HELP text and units of ingot's own engine series.
fn describe_ingot() {
    describe_counter!(
        "ingot_spec_decode_num_drafts_total",
        "Speculative decoding: proposals verified (one per sequence and step)."
    );
    describe_counter!(
        "ingot_spec_decode_num_draft_tokens_total",
        "Speculative decoding: tokens proposed."
    );
    describe_counter!(
        "ingot_spec_decode_num_accepted_tokens_total",
        "Speculative decoding: proposed tokens kept."
    );
    describe_counter!(
        "ingot_spec_decode_num_accepted_tokens_per_pos_total",
        "Speculative decoding: proposed tokens kept, by position in the proposal."
    );
    describe_histogram!(
        "ingot_structured_mask_seconds",
        Unit::Seconds,
        "Time to compute one grammar token mask (structured output), on the grammar thread during the forward pass."
    );
    describe_gauge!(
        "ingot_num_requests_running",
        Unit::Count,
        "Requests in the running batch."
    );
    describe_gauge!(
        "ingot_num_requests_waiting",
        Unit::Count,
        "Requests waiting to be scheduled."
    );
    describe_gauge!(
        "ingot_kv_cache_usage_perc",
        Unit::Percent,
        "Fraction of KV cache blocks in use, 0 to 1."
    );
    describe_counter!(
        "ingot_prefix_cache_queries_total",
        Unit::Count,
        "Prompt tokens looked up in the prefix cache."
    );
    describe_counter!(
        "ingot_prefix_cache_hits_total",
        Unit::Count,
        "Prompt tokens found in the prefix cache."
    );
    describe_counter!(
        "ingot_num_preemptions_total",
        Unit::Count,
        "Sequences preempted (recomputed later) because KV blocks ran out."
    );
    describe_counter!(
        "ingot_prompt_tokens_total",
        Unit::Count,
        "Prompt tokens of finished requests."
    );
    describe_counter!(
        "ingot_generation_tokens_total",
        Unit::Count,
        "Generated tokens of finished requests."
    );
    describe_counter!(
        "ingot_engine_requests_total",
        Unit::Count,
        "Generations submitted to the engine (cached and coalesced answers excluded)."
    );
    describe_counter!(
        "ingot_request_success_total",
        Unit::Count,
        "Requests that ended, by finish reason and priority tier."
    );
    describe_histogram!(
        "ingot_iteration_tokens",
        Unit::Count,
        "Tokens per engine step."
    );
    describe_histogram!(
        "ingot_step_duration_seconds",
        Unit::Seconds,
        "Wall time of one engine step."
    );
    describe_histogram!(
        "ingot_request_prefill_forward_seconds",
        Unit::Seconds,
        "Forward-pass time of the engine steps that computed a request's prompt, until its first token (the engine's own prefill time)."
    );
    describe_histogram!(
        "ingot_request_prefill_steps",
        Unit::Count,
        "Engine steps that computed a request's prompt, until its first token."
    );
    describe_histogram!(
        "ingot_request_queue_time_seconds",
        Unit::Seconds,
        "Arrival to first scheduling, by priority tier."
    );
    describe_histogram!(
        "ingot_time_to_first_token_seconds",
        Unit::Seconds,
        "Arrival to first token, by priority tier."
    );
    describe_histogram!(
        "ingot_inter_token_latency_seconds",
        Unit::Seconds,
        "Gap between consecutive tokens of a request."
    );
    describe_histogram!(
        "ingot_e2e_request_latency_seconds",
        Unit::Seconds,
        "Arrival to the last token, by priority tier."
    );
    describe_histogram!(
        "ingot_request_prompt_tokens",
        Unit::Count,
        "Prompt length of each finished request, in tokens."
    );
    describe_histogram!(
        "ingot_request_generation_tokens",
        Unit::Count,
        "Tokens generated by each finished request."
    );
    describe_histogram!(
        "ingot_request_max_tokens",
        Unit::Count,
        "The max_tokens of each finished request."
    );
    describe_histogram!(
        "ingot_request_prefill_time_seconds",
        Unit::Seconds,
        "From a request's first scheduling to its first token."
    );
    describe_histogram!(
        "ingot_request_decode_time_seconds",
        Unit::Seconds,
        "From a request's first token to its last."
    );
}

/// HELP text of the vLLM-named series (vLLM's own wording).
fn describe_vllm() {
    describe_counter!(
        "vllm:spec_decode_num_drafts_total",
        "Number of spec decoding drafts."
    );
    describe_counter!(
        "vllm:spec_decode_num_draft_tokens_total",
        "Number of draft tokens."
    );
    describe_counter!(
        "vllm:spec_decode_num_accepted_tokens_total",
        "Number of accepted tokens."
    );
    describe_counter!(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "Accepted tokens per draft position."
    );
    describe_gauge!(
        "vllm:num_requests_running",
        "Number of requests in model execution batches."
    );
    describe_gauge!(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed."
    );
    describe_gauge!(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage."
    );
    describe_counter!(
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens."
    );
    describe_counter!(
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens."
    );
    describe_counter!(
        "vllm:num_preemptions_total",
        "Cumulative number of preemption from the engine."
    );
    describe_counter!(
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed."
    );
    describe_counter!(
        "vllm:generation_tokens_total",
        "Number of generation tokens processed."
    );
    describe_counter!(
        "vllm:request_success_total",
        "Count of successfully processed requests."
    );
    describe_histogram!(
        "vllm:request_queue_time_seconds",
        Unit::Seconds,
        "Histogram of time spent in WAITING phase for request."
    );
    describe_histogram!(
        "vllm:time_to_first_token_seconds",
        Unit::Seconds,
        "Histogram of time to first token in seconds."
    );
    describe_histogram!(
        "vllm:inter_token_latency_seconds",
        Unit::Seconds,
        "Histogram of inter-token latency in seconds."
    );
    describe_histogram!(
        "vllm:e2e_request_latency_seconds",
        Unit::Seconds,
        "Histogram of e2e request latency in seconds."
    );
    describe_histogram!(
        "vllm:request_prompt_tokens",
        Unit::Count,
        "Number of prefill tokens processed."
    );
    describe_histogram!(
        "vllm:request_generation_tokens",
        Unit::Count,
        "Number of generation tokens processed."
    );
    describe_histogram!(
        "vllm:request_max_num_generation_tokens",
        Unit::Count,
        "Histogram of maximum number of requested generation tokens."
    );
    describe_histogram!(
        "vllm:request_prefill_time_seconds",
        Unit::Seconds,
        "Histogram of time spent in PREFILL phase for request."
    );
    describe_histogram!(
        "vllm:request_decode_time_seconds",
        Unit::Seconds,
        "Histogram of time spent in DECODE phase for request."
    );
}
