//! The seam between the registry and the engines.

/// Builds models. Called on blocking threads; never under the registry's
/// lock.
pub trait Loader: Send + Sync + 'static {
    /// A loaded model (an engine, shared by the requests leasing it).
    type Model: Send + Sync + 'static;
    /// What an evicted model leaves in host memory to reload from.
    type Warm: Send + 'static;

    /// Bytes the model takes on the device once loaded (weights, KV,
    /// workspace); the budget is accounted in these.
    fn footprint(&self, id: &str) -> Result<u64, String>;

    /// Loads the model, from `warm` when a host copy was kept.
    fn load(&self, id: &str, warm: Option<Self::Warm>) -> Result<Self::Model, String>;

    /// Releases a model no request holds. Returns a host copy to keep and
    /// its size, when the loader can make one.
    fn unload(&self, id: &str, model: Self::Model) -> Option<(Self::Warm, u64)>;

    /// Brings the model's files into host memory (the page cache) ahead of
    /// a load; returns the bytes asked for.
    fn prefetch(&self, _id: &str) -> Result<u64, String> {
        Ok(0)
    }

    /// Drops a warm copy the host budget no longer holds.
    fn discard(&self, warm: Self::Warm) {
        drop(warm);
    }
}
