//! Per-step timing (`cuda.profile`): GPU time by category from
//! events between kernels, the runner's wall time, and the gap between
//! steps (engine and sampling work on the CPU). Steps then run eagerly (a
//! graph hides its kernels); the summary is logged when the runner is dropped.

use std::time::Instant;

use cudarc::driver::{sys, CudaEvent};

use crate::device::Gpu;
use crate::CudaError;

/// What a stretch of GPU work was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Gemm,
    Attention,
    /// A mixture of experts' router product and top-k.
    Routing,
    /// The experts' products.
    Experts,
    /// Tensor parallel: all-reduces and the LM head's gather.
    Collective,
    Other,
}

/// Events recorded during one step.
pub struct Marks {
    start: CudaEvent,
    events: Vec<(Category, CudaEvent)>,
}

impl Marks {
    /// Starts a step's timeline.
    pub fn begin(gpu: &Gpu) -> Result<Self, CudaError> {
        Ok(Self {
            start: record(gpu)?,
            events: Vec::new(),
        })
    }

    /// The work enqueued since the previous mark was `category`.
    pub fn mark(&mut self, gpu: &Gpu, category: Category) -> Result<(), CudaError> {
        self.events.push((category, record(gpu)?));
        Ok(())
    }
}

fn record(gpu: &Gpu) -> Result<CudaEvent, CudaError> {
    Ok(gpu
        .stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Sums over steps of one kind.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    steps: usize,
    tokens: usize,
    gemm_ms: f64,
    attention_ms: f64,
    routing_ms: f64,
    experts_ms: f64,
    collective_ms: f64,
    other_ms: f64,
    wall_ms: f64,
    gap_ms: f64,
}

/// Accumulates step timings.
#[derive(Default)]
pub struct Profiler {
    decode: Totals,
    mixed: Totals,
    last_end: Option<Instant>,
}

impl Profiler {
    /// Adds a finished step (the stream has been synchronized).
    pub fn add(
        &mut self,
        marks: Marks,
        decode: bool,
        tokens: usize,
        started: Instant,
    ) -> Result<(), CudaError> {
        let t = if decode {
            &mut self.decode
        } else {
            &mut self.mixed
        };
        t.steps += 1;
        t.tokens += tokens;
        let mut prev = &marks.start;
        for (cat, ev) in &marks.events {
            let ms = prev.elapsed_ms(ev)? as f64;
            match cat {
                Category::Gemm => t.gemm_ms += ms,
                Category::Attention => t.attention_ms += ms,
                Category::Routing => t.routing_ms += ms,
                Category::Experts => t.experts_ms += ms,
                Category::Collective => t.collective_ms += ms,
                Category::Other => t.other_ms += ms,
            }
            prev = ev;
        }
        let now = Instant::now();
        t.wall_ms += (now - started).as_secs_f64() * 1e3;
        if let Some(last) = self.last_end {
            t.gap_ms += (started - last).as_secs_f64() * 1e3;
        }
        self.last_end = Some(now);
        Ok(())
    }

    /// Logs the mean per step of each kind.
    pub fn report(&self) {
        for (kind, t) in [("decode", self.decode), ("prefill/mixed", self.mixed)] {
            if t.steps == 0 {
                continue;
            }
            let n = t.steps as f64;
            let moe = if t.routing_ms + t.experts_ms > 0.0 {
                format!(
                    ", routing {:.3} ms, experts {:.3} ms",
                    t.routing_ms / n,
                    t.experts_ms / n
                )
            } else {
                String::new()
            };
            let collective = if t.collective_ms > 0.0 {
                format!(", collectives {:.3} ms", t.collective_ms / n)
            } else {
                String::new()
            };
            eprintln!(
                "ingot cuda profile: {kind} steps {} (mean {:.1} tokens): gemm {:.3} ms, attention {:.3} ms{moe}{collective}, other {:.3} ms, runner wall {:.3} ms, CPU gap between steps {:.3} ms",
                t.steps,
                t.tokens as f64 / n,
                t.gemm_ms / n,
                t.attention_ms / n,
                t.other_ms / n,
                t.wall_ms / n,
                t.gap_ms / n
            );
        }
    }
}
