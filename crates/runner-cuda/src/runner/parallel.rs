//! [`TpRunner`]: one model over several GPUs of a host (tensor parallel).
//!
//! One process, one thread per GPU: rank 0's [`CudaRunner`] runs on the
//! engine's thread, each other rank's on a thread of its own, every rank
//! over its share of the weights ([`ingot_models::parallel`]) and its own
//! KV pool for its heads. A step goes to every rank; each enqueues the
//! same kernels and NCCL collectives (an all-reduce after each row-parallel
//! product, an all-gather of the LM head's vocabulary rows) on its own
//! stream, graphs included, so the ranks meet on the devices, not on the
//! host. Only rank 0 samples and returns ids. Threads rather than a
//! process per GPU: the engine, scheduler and sampler stay single with no
//! IPC, and NCCL's communicators for all GPUs are made in one call.
//!
//! Every rank makes the same choices (graph or eager, padded size, split
//! counts, whether a step launched ahead is the one asked for) from the
//! same batch and rank 0's last ids, so their collectives always match:
//! rank 0 checks a batch before any rank runs it, and start-up runs the
//! parts that can fail alone (weights, workspace) before the first
//! collective. Greedy decode steps are launched ahead of the engine on
//! every rank (each takes the argmax of the same gathered logits); sampled
//! ones are not (only rank 0 samples). KV pages cannot be copied to host
//! tiers (each rank holds only its heads' part of a page).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use ingot_core::TokenId;
use ingot_kv_cache::{BlockId, BlockTable, KvLayout};
use ingot_models::parallel::{ShardPlan, ShardedSource};
use ingot_models::{ModelConfig, TensorSource};
use ingot_runner::{
    ForwardBatch, KvCacheShape, MaskSource, ModelRunner, Pick, RowSampling, RunnerError,
    ScoredChunk, SequenceChunk,
};

use super::CudaRunner;
use crate::config::CudaRunnerConfig;
use crate::memory::MemoryReport;
use crate::nccl::{self, Communicator};
use crate::CudaError;

/// A model split over `size` GPUs.
pub struct TpRunner {
    /// The whole model's config (the ranks hold their shares).
    config: ModelConfig,
    lead: CudaRunner,
    /// Ranks 1.. (rank r runs on GPU r).
    followers: Vec<Follower>,
}

/// What a follower rank's thread is asked to do.
enum Command {
    /// Run a step as rank 0 does; `last_ids`: the ids rank 0 returned for
    /// the step before (which decide, as on rank 0, whether a step launched
    /// ahead is this one).
    Step {
        batch: OwnedBatch,
        mode: Mode,
        last_ids: Vec<TokenId>,
    },
    Sleep,
    Wake,
}

/// Which of rank 0's step paths a follower mirrors.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// [`ModelRunner::forward`]: logits read back (`scored`: then the LM
    /// head of the scored positions), nothing launched ahead.
    Logits { scored: bool },
    /// [`ModelRunner::forward_greedy`] / `forward_sample`: ids picked on
    /// the device, a launched-ahead step used or launched as rank 0 does.
    Ids,
}

/// A rank past 0: its thread and the channels to it.
struct Follower {
    commands: Option<Sender<Command>>,
    replies: Receiver<Result<(), String>>,
    thread: Option<JoinHandle<()>>,
}

impl TpRunner {
    /// Loads `config` split over GPUs `0..size`, rank `r` on GPU `r`.
    /// `opts.device` is ignored; `progress` follows rank 0's load.
    pub fn new(
        config: ModelConfig,
        source: &dyn TensorSource,
        opts: CudaRunnerConfig,
        size: usize,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, CudaError> {
        let plan = ShardPlan::new(&config, size)?;
        if opts.deterministic && size > 2 {
            // Two partial sums add the same either way; more do not.
            return Err(CudaError::Unsupported(format!(
                "engine.deterministic with tensor_parallel_size {size}: NCCL's ring adds more than two \
                 ranks' parts in an order that depends on the message size; use a size of 1 or 2"
            )));
        }
        let present = crate::device_count()?;
        if size > present {
            return Err(CudaError::InvalidOption(format!(
                "tensor_parallel_size {size} needs {size} GPUs and this host has {present}; lower it"
            )));
        }
        let devices: Vec<usize> = (0..size).collect();
        let version = nccl::version()?;
        let comms = Communicator::for_devices(&devices)?;
        tracing::info!(size, nccl = %version, "tensor parallel: communicators ready");
        let mut ranks = load_ranks(&plan, source, &opts, comms, progress)?;
        if opts.custom_all_reduce {
            let gpus: Vec<_> = ranks.iter().map(|r| &r.gpu).collect();
            if let Some(peers) = crate::peer::connect(&gpus)? {
                for (rank, peer) in ranks.iter_mut().zip(peers) {
                    rank.peer = Some(peer);
                }
            }
        }
        // The least any rank fits, so every rank's pool has the same pages.
        let pages = on_every_rank(&mut ranks, |r| r.measure_kv_pages())?;
        let pages = pages.into_iter().min().unwrap_or(0);
        on_every_rank(&mut ranks, |r| r.finish(pages))?;
        let mut ranks = ranks.into_iter();
        let lead = ranks
            .next()
            .ok_or_else(|| CudaError::InvalidOption("tensor_parallel_size 0".into()))?;
        let followers = ranks.map(Follower::spawn).collect();
        Ok(Self {
            config,
            lead,
            followers,
        })
    }

    /// Ranks (and GPUs) in the group.
    fn size(&self) -> usize {
        self.followers.len() + 1
    }

    /// Device memory of one GPU (every rank holds the same shares).
    pub fn memory(&self) -> MemoryReport {
        self.lead.memory()
    }

    /// Sends the step to every follower, after checking it (so no rank
    /// starts a step another refuses).
    fn broadcast(&mut self, batch: &ForwardBatch<'_>, mode: Mode) -> Result<(), RunnerError> {
        self.lead.check_batch(batch)?;
        for f in &self.followers {
            f.send(Command::Step {
                batch: OwnedBatch::of(batch),
                mode,
                last_ids: self.lead.last_ids.clone(),
            })?;
        }
        Ok(())
    }

    /// Waits until every follower has enqueued its part.
    fn gather(&self) -> Result<(), RunnerError> {
        self.followers.iter().try_for_each(Follower::wait)
    }
}

/// Loads every rank's weights at once (rank 0 on this thread), each from
/// its slices of `source`; no collective runs yet.
fn load_ranks(
    plan: &ShardPlan,
    source: &dyn TensorSource,
    opts: &CudaRunnerConfig,
    comms: Vec<Communicator>,
    progress: &dyn Fn(usize, usize),
) -> Result<Vec<CudaRunner>, CudaError> {
    let load = |rank: usize, comm: Communicator, progress: &dyn Fn(usize, usize)| {
        let shard = ShardedSource::new(source, plan, rank);
        let opts = CudaRunnerConfig {
            device: rank,
            ..opts.clone()
        };
        CudaRunner::load(plan.rank_config(rank), &shard, opts, progress, Some(comm))
    };
    let mut comms = comms.into_iter();
    let first = comms
        .next()
        .ok_or_else(|| CudaError::InvalidOption("tensor_parallel_size 0".into()))?;
    std::thread::scope(|s| {
        let others: Vec<_> = comms
            .enumerate()
            .map(|(i, comm)| s.spawn(move || load(i + 1, comm, &|_, _| {})))
            .collect();
        let lead = load(0, first, progress);
        let mut ranks = vec![lead];
        ranks.extend(others.into_iter().map(joined));
        ranks.into_iter().collect()
    })
}

/// `f` on every rank at once, each on its own thread (they meet in
/// collectives); the results in rank order.
fn on_every_rank<T: Send>(
    ranks: &mut [CudaRunner],
    f: impl Fn(&mut CudaRunner) -> Result<T, CudaError> + Sync,
) -> Result<Vec<T>, CudaError> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = ranks.iter_mut().map(|r| s.spawn(move || f(r))).collect();
        handles.into_iter().map(joined).collect()
    })
}

fn joined<T>(h: std::thread::ScopedJoinHandle<'_, Result<T, CudaError>>) -> Result<T, CudaError> {
    h.join()
        .unwrap_or_else(|_| Err(CudaError::Unsupported("a rank's thread panicked".into())))
}

impl Follower {
    /// Moves `rank` to a thread of its own that runs commands until the
    /// channel closes.
    fn spawn(mut rank: CudaRunner) -> Self {
        let (commands, inbox) = channel::<Command>();
        let (outbox, replies) = channel();
        let thread = std::thread::Builder::new()
            .name("ingot-tp-rank".into())
            .spawn(move || {
                while let Ok(command) = inbox.recv() {
                    let done = match command {
                        Command::Step {
                            batch,
                            mode,
                            last_ids,
                        } => rank.follow(&batch.view(), mode, last_ids),
                        Command::Sleep => rank.sleep().map(|_| ()).map_err(RunnerError::from),
                        Command::Wake => rank.wake().map_err(RunnerError::from),
                    };
                    if outbox.send(done.map_err(|e| e.to_string())).is_err() {
                        break;
                    }
                }
            })
            .ok();
        Self {
            commands: Some(commands),
            replies,
            thread,
        }
    }

    fn send(&self, command: Command) -> Result<(), RunnerError> {
        self.commands
            .as_ref()
            .and_then(|c| c.send(command).ok())
            .ok_or_else(|| RunnerError::Backend("a tensor-parallel rank has stopped".into()))
    }

    fn wait(&self) -> Result<(), RunnerError> {
        match self.replies.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(RunnerError::Backend(format!("tensor-parallel rank: {e}"))),
            Err(_) => Err(RunnerError::Backend(
                "a tensor-parallel rank has stopped".into(),
            )),
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl CudaRunner {
    /// A follower rank's part of a step rank 0 checked: the same forward
    /// pass (graph or eager, launched ahead or not, as rank 0 decides from
    /// the same inputs), and the LM head over scored positions, nothing
    /// read back.
    fn follow(
        &mut self,
        batch: &ForwardBatch<'_>,
        mode: Mode,
        last_ids: Vec<TokenId>,
    ) -> Result<(), RunnerError> {
        self.last_ids = last_ids;
        let scored = match mode {
            Mode::Ids => return self.follow_ids(batch),
            Mode::Logits { scored } => scored,
        };
        // As `forward`: a step launched ahead runs first, unused.
        self.pending = None;
        self.run(batch, !scored)?;
        if !scored {
            return Ok(());
        }
        let rows = super::scored_rows(batch);
        for group in rows.chunks(self.buffers.max_seqs) {
            self.buffers.upload_last_rows(&self.gpu, group)?;
            crate::ops::project_rows(&self.model(), group.len())?;
            // The staging of the rows is rewritten by the next group.
            self.gpu.sync()?;
        }
        Ok(())
    }
}

/// A batch the follower threads own (a [`ForwardBatch`] borrows).
struct OwnedBatch {
    chunks: Vec<OwnedChunk>,
    expect_next: bool,
    score: Vec<(usize, Vec<TokenId>, usize)>,
}

/// A [`SequenceChunk`]'s tokens, start and tables.
struct OwnedChunk {
    tokens: Vec<TokenId>,
    start_pos: usize,
    block_table: Vec<BlockId>,
    group_tables: Vec<BlockTable>,
}

impl OwnedBatch {
    fn of(batch: &ForwardBatch<'_>) -> Self {
        Self {
            chunks: batch
                .chunks
                .iter()
                .map(|c| OwnedChunk {
                    tokens: c.tokens.to_vec(),
                    start_pos: c.start_pos,
                    block_table: c.block_table.to_vec(),
                    group_tables: c.group_tables.to_vec(),
                })
                .collect(),
            expect_next: batch.expect_next,
            score: batch
                .score
                .iter()
                .map(|s| (s.chunk, s.next.to_vec(), s.top))
                .collect(),
        }
    }

    fn view(&self) -> ForwardBatch<'_> {
        ForwardBatch {
            chunks: self
                .chunks
                .iter()
                .map(|c| SequenceChunk {
                    tokens: &c.tokens,
                    start_pos: c.start_pos,
                    block_table: &c.block_table,
                    group_tables: &c.group_tables,
                })
                .collect(),
            expect_next: self.expect_next,
            // Tensor parallel keeps no hidden rows (no EAGLE head yet).
            keep_hidden: false,
            score: self
                .score
                .iter()
                .map(|(chunk, next, top)| ScoredChunk {
                    chunk: *chunk,
                    next,
                    top: *top,
                })
                .collect(),
        }
    }
}

impl ModelRunner for TpRunner {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.lead.kv_shape
    }

    fn kv_layout(&self) -> KvLayout {
        self.lead.kv_layout()
    }

    fn device_name(&self) -> String {
        let ids: Vec<String> = (0..self.size()).map(|d| d.to_string()).collect();
        format!(
            "cuda:{} {} (tensor parallel {})",
            ids.join(","),
            self.lead.gpu.name,
            self.size()
        )
    }

    fn launches_ahead(&self) -> bool {
        true
    }

    fn verifies_as_decode_rows(&self) -> bool {
        true
    }

    fn sleep(&mut self) -> Result<u64, RunnerError> {
        self.followers
            .iter()
            .try_for_each(|f| f.send(Command::Sleep))?;
        let bytes = self.lead.sleep().map_err(RunnerError::from);
        self.gather()?;
        // Every rank holds the same bytes.
        Ok(bytes? as u64 * self.size() as u64)
    }

    fn wake(&mut self) -> Result<(), RunnerError> {
        self.followers
            .iter()
            .try_for_each(|f| f.send(Command::Wake))?;
        let woke = self.lead.wake().map_err(RunnerError::from);
        self.gather()?;
        woke
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<&[f32], RunnerError> {
        let scored = !batch.score.is_empty();
        self.broadcast(batch, Mode::Logits { scored })?;
        let out = self.lead.forward(batch);
        self.followers.iter().try_for_each(Follower::wait)?;
        out
    }

    /// Every rank picks the same argmax from the same gathered logits, so
    /// each can chain the next step on its own picks (launch-ahead).
    fn forward_greedy(&mut self, batch: &ForwardBatch<'_>) -> Result<Vec<TokenId>, RunnerError> {
        self.broadcast(batch, Mode::Ids)?;
        let ids = self.lead.forward_greedy(batch);
        self.gather()?;
        ids
    }

    /// Only rank 0 samples: nothing is launched ahead after a sampled step
    /// (the others have no picks to chain it on).
    fn forward_sample(
        &mut self,
        batch: &ForwardBatch<'_>,
        rows: &[RowSampling<'_>],
        masks: &mut dyn MaskSource,
    ) -> Result<Vec<Pick>, RunnerError> {
        ingot_runner::check_rows(batch, rows)?;
        let batch = ForwardBatch {
            chunks: batch.chunks.clone(),
            score: batch.score.clone(),
            ..ForwardBatch::default()
        };
        self.broadcast(&batch, Mode::Ids)?;
        let picks = self.lead.forward_sample(&batch, rows, masks);
        self.gather()?;
        picks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_kv_cache::BlockPool;

    /// A follower sees the batch rank 0 was given: tokens, positions,
    /// tables of every group, the launch-ahead hint and scored positions.
    #[test]
    fn an_owned_batch_views_as_the_batch_it_copied() {
        let mut pool = BlockPool::new(16, 4, false);
        let mut tables = [BlockTable::new(), BlockTable::new()];
        for (t, n) in tables.iter_mut().zip([9, 3]) {
            assert!(pool.reserve(t, n).is_ok());
        }
        let (a, b) = ([5u32, 6, 7], [8u32]);
        let next = [6u32, 7];
        let batch = ForwardBatch {
            chunks: vec![
                SequenceChunk::with_tables(&a, 0, &tables),
                SequenceChunk::with_tables(&b, 2, &tables[1..]),
            ],
            expect_next: true,
            keep_hidden: false,
            score: vec![ScoredChunk {
                chunk: 0,
                next: &next,
                top: 2,
            }],
        };
        let owned = OwnedBatch::of(&batch);
        let view = owned.view();
        let parts = |b: &ForwardBatch<'_>| -> Vec<_> {
            b.chunks
                .iter()
                .map(|c| {
                    (
                        c.tokens.to_vec(),
                        c.start_pos,
                        c.block_table.to_vec(),
                        c.group_tables.to_vec(),
                    )
                })
                .collect()
        };
        assert_eq!(parts(&view), parts(&batch));
        assert_eq!(view.score, batch.score);
        assert!(view.expect_next);
    }
}
