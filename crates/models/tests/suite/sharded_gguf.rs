//! A tensor-parallel rank's slices of the real SmolLM2 GGUF (Q4_1 and
//! Q8_0 blocks, 3 ranks: its 9 heads and 3 KV heads divide by 3 only),
//! read from the blocks they cover, equal the slices of each tensor
//! dequantized whole, bit for bit, on every rank.

use ingot_models::parallel::{ShardPlan, ShardedSource, LM_HEAD};
use ingot_models::{Bf16Tensor, HostTensor, LoadFormat, ModelError, QuantTensor, TensorSource};

/// `inner` without its sliced loads: the whole-tensor path.
struct Whole<'a>(&'a dyn TensorSource);

impl TensorSource for Whole<'_> {
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        self.0.load(name)
    }
    fn load_blocks(&self, name: &str) -> Result<Option<QuantTensor>, ModelError> {
        self.0.load_blocks(name)
    }
    fn load_bf16(&self, name: &str) -> Result<Option<Bf16Tensor<'_>>, ModelError> {
        self.0.load_bf16(name)
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn dtype_summary(&self) -> Vec<(String, usize)> {
        self.0.dtype_summary()
    }
}

#[test]
fn a_ranks_block_slices_equal_slices_of_the_whole() {
    let files = ingot_models::open(&ingot_testkit::smollm2_gguf(), LoadFormat::Auto).unwrap();
    let config = &files.config;
    let source = files.tensors.as_ref();
    let whole = Whole(source);
    let plan = ShardPlan::new(config, 3).unwrap();
    let mut names: Vec<String> = ingot_models::llama::expected_shapes(config)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    names.push(LM_HEAD.into());
    let mut sliced = 0;
    for rank in 0..3 {
        let fast = ShardedSource::new(source, &plan, rank);
        let slow = ShardedSource::new(&whole, &plan, rank);
        for name in &names {
            let stored = if source.contains(name) {
                name.as_str()
            } else {
                "model.embed_tokens.weight"
            };
            let split = |shape: &[usize]| plan.split(name, shape, rank);
            sliced += usize::from(source.load_slice(stored, &split).unwrap().is_some());
            let (a, b) = (fast.load(name).unwrap(), slow.load(name).unwrap());
            assert_eq!(a.shape, b.shape, "{name} rank {rank}");
            assert!(a.data == b.data, "{name} rank {rank}: values differ");
        }
    }
    // q/k/v, o, gate, up and down of 30 layers and the head, on each rank,
    // from their blocks.
    assert!(
        sliced >= 3 * (30 * 7 + 1),
        "only {sliced} tensors took the block path"
    );
}
