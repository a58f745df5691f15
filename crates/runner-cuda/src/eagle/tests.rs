//! The piece split, and (on a machine with an NVIDIA GPU, `cargo test -p
//! ingot-runner-cuda -- --ignored`, as `tests/gpu/run.sh eagle` does) the
//! hidden-state capture and the head against the CPU runner's on the same
//! random weights, bf16 on the GPU and f32 on the CPU.

use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_models::dummy::DummySource;
use ingot_models::{
    eagle, HostTensor, LlamaShape, LlamaWeights, ModelConfig, ModelError, TensorSource,
};
use ingot_runner::{DraftHead, ForwardBatch, HeadBatch, HeadInput, ModelRunner, SequenceChunk};
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig, WeightDtype};

use super::{pieces, Part};
use crate::{CudaRunner, CudaRunnerConfig};

#[test]
fn pieces_keep_chunk_order_and_split_long_chunks() {
    let part = |chunk, start, end| Part { chunk, start, end };
    assert_eq!(
        pieces(&[5, 1, 7], 6, 2),
        vec![
            vec![part(0, 0, 5), part(1, 0, 1)],
            vec![part(2, 0, 6)],
            vec![part(2, 6, 7)],
        ]
    );
    // Sequences are capped as well as tokens.
    assert_eq!(
        pieces(&[1, 1, 1], 8, 2),
        vec![vec![part(0, 0, 1), part(1, 0, 1)], vec![part(2, 0, 1)]]
    );
    assert!(pieces(&[], 8, 2).is_empty());
}

/// The same random values read from the host on both runners (the CUDA
/// runner fills a source that says it is random on the device, with
/// values of its own).
struct Hosted(DummySource);

impl TensorSource for Hosted {
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        self.0.load(name)
    }

    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        self.0.dtype_summary()
    }
}

fn target() -> ModelConfig {
    ModelConfig {
        max_context: 2048,
        ..ModelConfig::llama(LlamaShape {
            hidden: 256,
            intermediate: 512,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            vocab: 1000,
        })
    }
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let err: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (err / norm).sqrt()
}

/// Block tables holding `lens` positions, one per sequence, from a pool of
/// `runner`'s shape.
fn tables_for(pool: &mut BlockPool, lens: &[usize]) -> Vec<Vec<BlockTable>> {
    lens.iter()
        .map(|&len| {
            let mut t = pool.new_tables();
            pool.reserve_groups(&mut t, 0, len).unwrap();
            t
        })
        .collect()
}

fn pool_of(runner: &dyn ModelRunner) -> BlockPool {
    let s = runner.kv_cache_shape();
    BlockPool::with_layout(s.num_blocks, s.block_size, runner.kv_layout(), false)
}

fn head_pool(head: &dyn DraftHead) -> BlockPool {
    let s = head.kv_cache_shape();
    BlockPool::with_layout(s.num_blocks, s.block_size, head.kv_layout(), false)
}

/// One chunk per sequence: `rows[i]` from position `start[i]`.
fn chunks<'a>(
    tables: &'a [Vec<BlockTable>],
    rows: &[&'a [u32]],
    start: &[usize],
) -> Vec<SequenceChunk<'a>> {
    rows.iter()
        .zip(tables)
        .zip(start)
        .map(|((r, t), &s)| SequenceChunk::with_tables(r, s, t))
        .collect()
}

/// The head's output rows and drafts over `chunks`.
fn run(
    head: &mut Box<dyn DraftHead>,
    chunks: Vec<SequenceChunk<'_>>,
    input: HeadInput<'_>,
) -> (Vec<f32>, Vec<u32>) {
    let out = head.forward(&HeadBatch { chunks, input }).unwrap();
    let picks = head.pick(&out).unwrap();
    (out, picks)
}

/// Per sequence, the tokens of a prompt of `len`.
fn prompt(seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 997) as u32)
        .collect()
}

/// The same prompts through both runners (capturing the default aux
/// layers): their captured rows agree, in a long eager step, and in a
/// decode step replayed from a graph; the same head on both, fed the
/// CPU's rows (the 1,100-token sequence runs in two pieces), gives rows
/// that agree and the same drafts, then again from its own rows.
#[test]
#[ignore = "needs an NVIDIA GPU: tests/gpu/run.sh eagle runs it"]
fn capture_and_head_match_the_cpu_runner() {
    let config = target();
    let source = Hosted(DummySource::new(&config, 3));
    let opts = CudaRunnerConfig {
        kv_cache_tokens: Some(8192),
        max_num_seqs: 8,
        max_num_batched_tokens: 2048,
        ..CudaRunnerConfig::default()
    };
    let mut cuda = CudaRunner::new(config.clone(), &source, opts, &|_, _| {}).unwrap();
    let weights = LlamaWeights::load(&config, &source, &|_, _| {}).unwrap();
    let cpu_opts = CpuRunnerConfig {
        num_blocks: 512,
        block_size: 16,
        weight_dtype: WeightDtype::F32,
    };
    let mut cpu = CpuRunner::new(config.clone(), weights, cpu_opts).unwrap();
    let layers = eagle::default_aux_layers(config.num_layers);
    cuda.capture_hidden(&layers).unwrap();
    cpu.capture_hidden(&layers).unwrap();

    let lens = [1100, 37, 5, 1];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(s, &l)| prompt(s, l))
        .collect();
    let (mut gpu_pool, mut cpu_pool) = (pool_of(&cuda), pool_of(&cpu));
    let room: Vec<usize> = lens.iter().map(|l| l + 2).collect();
    let (gpu_tables, cpu_tables) = (
        tables_for(&mut gpu_pool, &room),
        tables_for(&mut cpu_pool, &room),
    );
    let step = |tables, rows, start| ForwardBatch {
        chunks: chunks(tables, rows, start),
        keep_hidden: true,
        ..ForwardBatch::default()
    };
    let rows: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
    let zeros = [0; 4];
    let gpu_next = cuda
        .forward_greedy(&step(&gpu_tables, &rows, &zeros))
        .unwrap();
    let gpu_rows = cuda.captured_hidden().to_vec();
    let cpu_next = cpu
        .forward_greedy(&step(&cpu_tables, &rows, &zeros))
        .unwrap();
    let cpu_rows = cpu.captured_hidden().to_vec();
    let fw = layers.len() * config.hidden_size;
    assert_eq!(cpu_rows.len(), lens.iter().sum::<usize>() * fw);
    let prefill_err = rel_l2(&gpu_rows, &cpu_rows);
    if prefill_err >= 2e-2 {
        let d = config.hidden_size;
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        for (slot, layer) in layers.iter().enumerate() {
            for token in [0, 1, 1099, 1100, 1142] {
                let at = token * fw + slot * d;
                let (g, c) = (&gpu_rows[at..at + d], &cpu_rows[at..at + d]);
                let (e, ng, nc) = (rel_l2(g, c), norm(g), norm(c));
                eprintln!("layer {layer} token {token}: rel L2 {e:.2e}, norms {ng} / {nc}");
            }
        }
        eprintln!("greedy: gpu {gpu_next:?}, cpu {cpu_next:?}");
    }
    assert!(
        prefill_err < 2e-2,
        "captured prompt rows: rel L2 {prefill_err}"
    );

    // A decode step of the CPU's tokens (a graph replay on the GPU) that
    // expects the next: the GPU launches it at once, with its own picks.
    let next: Vec<[u32; 1]> = cpu_next.iter().map(|&t| [t]).collect();
    let rows: Vec<&[u32]> = next.iter().map(|t| t.as_slice()).collect();
    let expecting = |tables, rows, start| ForwardBatch {
        expect_next: true,
        ..step(tables, rows, start)
    };
    let picked = cuda
        .forward_greedy(&expecting(&gpu_tables, &rows, &lens))
        .unwrap();
    cpu.forward_greedy(&step(&cpu_tables, &rows, &lens))
        .unwrap();
    let decode_err = rel_l2(cuda.captured_hidden(), cpu.captured_hidden());
    // The launched step, taken: its rows came back in a buffer of its own.
    let after: Vec<usize> = lens.iter().map(|l| l + 1).collect();
    let next: Vec<[u32; 1]> = picked.iter().map(|&t| [t]).collect();
    let rows: Vec<&[u32]> = next.iter().map(|t| t.as_slice()).collect();
    cuda.forward_greedy(&step(&gpu_tables, &rows, &after))
        .unwrap();
    cpu.forward_greedy(&step(&cpu_tables, &rows, &after))
        .unwrap();
    let launched_err = rel_l2(cuda.captured_hidden(), cpu.captured_hidden());
    assert_eq!(
        cuda.launch_ahead_hits(),
        1,
        "the step launched ahead was taken"
    );
    let agree = gpu_next
        .iter()
        .zip(&cpu_next)
        .filter(|(a, b)| a == b)
        .count();
    eprintln!(
        "captured rows rel L2: prompt {prefill_err:.2e}, decode {decode_err:.2e}, \
         launched ahead {launched_err:.2e}; greedy {agree}/4 equal"
    );
    assert!(
        decode_err < 2e-2,
        "captured decode rows: rel L2 {decode_err}"
    );
    assert!(
        launched_err < 2e-2,
        "captured rows of a launched step: rel L2 {launched_err}"
    );

    // The head on both, fed the CPU's prompt rows: position i reads row i
    // and the token that follows it.
    let head_config = eagle::head_like(&config);
    let head_weights = || {
        let shapes = eagle::expected_shapes(&head_config);
        eagle::load_weights(&DummySource::with_shapes(shapes, 11), &head_config).unwrap()
    };
    let mut gpu_head = cuda
        .draft_head(head_config.clone(), head_weights(), 4096)
        .unwrap();
    let mut cpu_head = cpu
        .draft_head(head_config.clone(), head_weights(), 4096)
        .unwrap();
    let (mut gpu_hpool, mut cpu_hpool) =
        (head_pool(gpu_head.as_ref()), head_pool(cpu_head.as_ref()));
    let (gpu_ht, cpu_ht) = (
        tables_for(&mut gpu_hpool, &room),
        tables_for(&mut cpu_hpool, &room),
    );
    let follow: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&cpu_next)
        .map(|(p, &n)| p[1..].iter().copied().chain([n]).collect())
        .collect();
    let tokens: Vec<&[u32]> = follow.iter().map(|f| f.as_slice()).collect();
    let input = HeadInput::Target(&cpu_rows);
    let (g_out, g_pick) = run(&mut gpu_head, chunks(&gpu_ht, &tokens, &zeros), input);
    let (c_out, c_pick) = run(&mut cpu_head, chunks(&cpu_ht, &tokens, &zeros), input);
    let head_err = rel_l2(&g_out, &c_out);
    assert!(
        head_err < 2e-2,
        "head rows from the target's: rel L2 {head_err}"
    );
    assert_eq!(g_pick, c_pick, "drafts from the target's rows");

    // A second draft from the head's own rows (the CPU's, to both).
    let drafts: Vec<[u32; 1]> = c_pick.iter().map(|&t| [t]).collect();
    let tokens: Vec<&[u32]> = drafts.iter().map(|t| t.as_slice()).collect();
    let input = HeadInput::Own(&c_out);
    let (g_out2, g_pick2) = run(&mut gpu_head, chunks(&gpu_ht, &tokens, &lens), input);
    let (c_out2, c_pick2) = run(&mut cpu_head, chunks(&cpu_ht, &tokens, &lens), input);
    let own_err = rel_l2(&g_out2, &c_out2);
    eprintln!("head rows rel L2: from the target's {head_err:.2e}, from its own {own_err:.2e}");
    assert!(own_err < 2e-2, "head rows from its own: rel L2 {own_err}");
    assert_eq!(g_pick2, c_pick2, "drafts from the head's own rows");
}
