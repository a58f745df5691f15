//! The seam between the registry and the engines.

/// Builds models. Called on blocking threads; never under the registry's
/// lock.
pub trait Loader: Send + Sync + 'static {
    /// What requests need of a model before (and whether or not) it is
    /// loaded: its tokenizer, chat template and limits. Built once per
    /// model on first use and kept while the registry lives, so a request
    /// answered without the engine (a cache hit) never loads or wakes it.
    type Front: Send + Sync + 'static;
    /// A loaded model (an engine, shared by the requests leasing it).
    type Model: Send + Sync + 'static;
    /// What an evicted model leaves in host memory to reload from.
    type Warm: Send + 'static;
    /// Why a model could not be opened, sized or built.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Opens the model's front: tokenizer, template, limits (no weights).
    fn front(&self, id: &str) -> Result<Self::Front, Self::Error>;

    /// Bytes the model takes on the device once loaded (weights, KV,
    /// workspace); the budget is accounted in these.
    fn footprint(&self, id: &str) -> Result<u64, Self::Error>;

    /// Loads the model, from `warm` when a host copy was kept; `front` is
    /// the model's front (its tokenizer is shared, not built again).
    fn load(
        &self,
        id: &str,
        front: &Self::Front,
        warm: Option<Self::Warm>,
    ) -> Result<Self::Model, Self::Error>;

    /// Releases a model no request holds. Returns a host copy to keep and
    /// its size, when the loader can make one.
    fn unload(&self, id: &str, model: Self::Model) -> Option<(Self::Warm, u64)>;

    /// Brings the model's files into host memory (the page cache) ahead of
    /// a load; returns the bytes asked for.
    fn prefetch(&self, _id: &str) -> Result<u64, Self::Error> {
        Ok(0)
    }

    /// Drops a warm copy the host budget no longer holds.
    fn discard(&self, warm: Self::Warm) {
        drop(warm);
    }
}

/// `error` with its causes, as one line (`outer: inner: root`): the one
/// place a loader's typed error becomes text (for the API's message).
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}
