//! `--load-format dummy`: deterministic random weights in the configured
//! shapes, so realistic model sizes can be benchmarked without downloads.

use crate::llama::expected_shapes;
use crate::{HostTensor, ModelConfig, ModelError, TensorSource};

/// Random weights for every tensor the config implies.
pub struct DummySource {
    shapes: Vec<(String, Vec<usize>)>,
    seed: u64,
}

impl DummySource {
    /// Weights are a pure function of (seed, tensor name).
    pub fn new(config: &ModelConfig, seed: u64) -> Self {
        Self::with_shapes(expected_shapes(config), seed)
    }

    /// Random tensors of the given names and shapes (an EAGLE head's, see
    /// [`crate::eagle::expected_shapes`]).
    pub fn with_shapes(shapes: Vec<(String, Vec<usize>)>, seed: u64) -> Self {
        Self { shapes, seed }
    }
}

impl TensorSource for DummySource {
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        let (_, shape) = self.shapes.iter().find(|(n, _)| n == name).ok_or_else(|| {
            ModelError::MissingTensor {
                name: name.to_string(),
            }
        })?;
        let n: usize = shape.iter().product();
        let is_norm = name.contains("norm");
        let mut state = name
            .bytes()
            .fold(self.seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
                (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
            });
        // Norm weights near 1, everything else small and centred, so
        // activations stay finite through many layers.
        let data = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if is_norm {
                    1.0 + 0.1 * u
                } else {
                    0.04 * u
                }
            })
            .collect();
        Ok(HostTensor::new(shape.clone(), data))
    }

    fn contains(&self, name: &str) -> bool {
        self.shapes.iter().any(|(n, _)| n == name)
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        vec![("random f32".to_string(), self.shapes.len())]
    }

    fn random_seed(&self) -> Option<u64> {
        Some(self.seed)
    }
}
