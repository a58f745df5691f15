//! Iteration-level continuous batching (Orca, OSDI '22; vLLM v1's unified
//! scheduler): every step picks, under a token budget and a sequence cap,
//! one chunk of work per sequence: a decode token, or a chunk of a prompt
//! (chunked prefill, so a long prompt never stalls running decodes).
//!
//! Pure and deterministic: no clocks (`now` is passed in), no threads, no
//! tensors. It owns the KV block pool's bookkeeping, so admission,
//! preemption and prefix-cache reuse are decided in one place.
//!
//! Policy:
//! - Running sequences are served first, most urgent tier first; when blocks
//!   run out, the least urgent, latest-arrived running sequence is preempted
//!   (its blocks freed; it is recomputed later, mostly from the prefix cache).
//! - Waiting sequences are admitted in order of effective tier (a tier is
//!   promoted by one level per `aging` interval waited, so nothing starves),
//!   then past-deadline first (each tier has a first-token SLA), then
//!   shortest job first (remaining prompt + max_tokens), then arrival.
//! - A waiting sequence of a strictly more urgent tier may preempt running
//!   sequences of less urgent tiers to get a slot and blocks.
//!
//! Cost per step: O(r log r + w log w) for r running and w waiting.

mod queue;

pub use queue::{
    admit, AdmissionError, ScheduledChunk, Scheduler, SchedulerConfig, SchedulerOutput, SeqId,
    SeqView,
};
