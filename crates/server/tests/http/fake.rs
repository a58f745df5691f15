//! The fakes behind the app: a model builder that serves fronts and builds
//! only an embedding engine (over a fake encoder), and a generator in place
//! of the engine stage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};
use ingot_core::FinishReason;
use ingot_engine::{Completion, GeneratedToken, RequestLimits, TokenEvent};
use ingot_server::pipeline::{
    CacheStatus, EventStream, GenerateError, GenerateRequest, Generation, Generator,
};
use ingot_server::{LoadError, ModelBuilder, ModelFront, ServedModel};
use tokio::sync::watch;

use super::tokenizer;

/// The generative model with a chat template (the default model).
pub const CHAT: &str = "m";
/// A generative model without a chat template.
pub const PLAIN: &str = "plain";
/// An embedding model.
pub const EMBED: &str = "embed";
/// A reasoning model: Qwen3's real tokenizer and chat template, its
/// `<think>` split out by the qwen3 reasoning parser (only in servers made
/// by `Server::thinker`).
pub const THINKER: &str = "qwen3-thinker";

/// Every generative model's bounds, as its front and the fake engine see them.
pub const LIMITS: RequestLimits = RequestLimits {
    max_context: 64,
    vocab_size: tokenizer::VOCAB_SIZE,
};

/// [`THINKER`]'s bounds: Qwen3's vocabulary.
pub const THINKER_LIMITS: RequestLimits = RequestLimits {
    max_context: 4096,
    vocab_size: 151_936,
};

/// The Qwen3 tokenizer of `scripts/fetch-hf-tokenizers`.
fn qwen3() -> std::sync::Arc<ingot_tokenizer::Tokenizer> {
    let dir = ingot_testkit::fetched("fetch-hf-tokenizers").join("qwen3");
    std::sync::Arc::new(ingot_tokenizer::Tokenizer::from_hf_dir(&dir).unwrap())
}

/// What the fake engine answers: one token per byte.
pub const REPLY: &str = "Paris.";

/// Serves the fronts of [`CHAT`], [`PLAIN`] and [`EMBED`]; counts build
/// calls, which fail but for [`EMBED`]'s: generation runs on the fake
/// engine stage, never on an engine.
pub struct FakeBuilder {
    builds: AtomicUsize,
}

impl FakeBuilder {
    pub fn new() -> Self {
        Self {
            builds: AtomicUsize::new(0),
        }
    }

    /// How many times an engine was asked for.
    pub fn builds(&self) -> usize {
        self.builds.load(Ordering::SeqCst)
    }
}

impl ModelBuilder for FakeBuilder {
    fn front(&self, id: &str) -> Result<ModelFront, LoadError> {
        match id {
            CHAT => Ok(ModelFront::generative(id, tokenizer::load(true), LIMITS)),
            PLAIN => Ok(ModelFront::generative(id, tokenizer::load(false), LIMITS)),
            THINKER => Ok(ModelFront::generative(id, qwen3(), THINKER_LIMITS)
                .with_reasoning_parser(ingot_config::ReasoningParser::Qwen3)),
            EMBED => Ok(ModelFront::embedding(id)),
            _ => Err(LoadError::new(format!("no model {id}"))),
        }
    }

    fn footprint(&self, _: &str) -> Result<u64, LoadError> {
        Ok(1 << 20)
    }

    fn build(&self, id: &str, _: &ModelFront) -> Result<ServedModel, LoadError> {
        self.builds.fetch_add(1, Ordering::SeqCst);
        if id == EMBED {
            return embedding_engine(id).map(ServedModel::Embedding);
        }
        Err(LoadError::new(format!(
            "the fake builder cannot build {id}"
        )))
    }

    fn prefetch(&self, _: &str) -> Result<u64, LoadError> {
        Ok(0)
    }
}

/// [`EMBED`]'s model: one vector of [`EMBED_DIMENSIONS`] per sequence,
/// every element the sequence's length.
struct FakeEmbedder;

/// Width of [`EMBED`]'s vectors.
pub const EMBED_DIMENSIONS: usize = 4;

impl ingot_arch::Embedder for FakeEmbedder {
    fn embed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ingot_arch::ArchError> {
        Ok(sequences
            .iter()
            .map(|s| vec![s.len() as f32; EMBED_DIMENSIONS])
            .collect())
    }

    fn dimensions(&self) -> usize {
        EMBED_DIMENSIONS
    }

    fn max_tokens(&self) -> usize {
        32
    }

    fn vocab_size(&self) -> usize {
        16
    }

    fn device_name(&self) -> &str {
        "fake"
    }
}

/// A word-level tokenizer of three words, in the `tokenizer.json` shape
/// an encoder model's directory holds.
const ENCODER_TOKENIZER: &str = r#"{"version": "1.0", "truncation": null, "padding": null,
"added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
"post_processor": null, "decoder": null,
"model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1, "b": 2}, "unk_token": "[UNK]"}}"#;

/// The embedding engine of `id` over [`FakeEmbedder`].
fn embedding_engine(id: &str) -> Result<ingot_engine::EmbeddingHandle, LoadError> {
    let dir = tempfile::tempdir().map_err(|e| LoadError::new(e.to_string()))?;
    std::fs::write(dir.path().join("tokenizer.json"), ENCODER_TOKENIZER)
        .map_err(|e| LoadError::new(e.to_string()))?;
    let tokenizer = ingot_tokenizer::EncoderTokenizer::from_dir(dir.path())
        .map_err(|e| LoadError::new(e.to_string()))?;
    let config = ingot_engine::EmbeddingConfig {
        model_name: id.to_string(),
        max_batch_tokens: 64,
        threads: 1,
        idle_priority: false,
        decode_share: None,
    };
    ingot_engine::EmbeddingHandle::start(Box::new(FakeEmbedder), tokenizer, config)
        .map_err(|e| LoadError::new(e.to_string()))
}

/// How the fake engine answers its next requests.
#[derive(Clone)]
pub enum Mode {
    /// [`REPLY`], cut at the request's max_tokens.
    Answer,
    /// Refuses at submission.
    Refuse(GenerateError),
    /// Answers once the gate opens.
    Held(watch::Receiver<bool>),
    /// Never sends an event.
    Hang,
    /// Sends `n` tokens, then an engine error.
    BreakAfter(usize),
    /// This text instead of [`REPLY`] (one token per byte), cut at
    /// max_tokens, ended by a stop string as the engine ends it.
    Say(String),
}

/// Opens a [`Mode::Held`] engine's streams.
pub struct Gate(watch::Sender<bool>);

impl Gate {
    pub fn open(&self) {
        self.0.send_replace(true);
    }
}

/// The engine stage's stand-in: checks requests as the engine does at
/// submission, records them, and answers as its mode says.
pub struct FakeEngine {
    mode: Mutex<Mode>,
    seen: Mutex<Vec<GenerateRequest>>,
}

impl FakeEngine {
    pub fn new() -> Self {
        Self {
            mode: Mutex::new(Mode::Answer),
            seen: Mutex::new(Vec::new()),
        }
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Holds every stream until the returned gate opens.
    pub fn hold(&self) -> Gate {
        let (tx, rx) = watch::channel(false);
        self.set(Mode::Held(rx));
        Gate(tx)
    }

    /// The requests that reached the engine stage.
    pub fn seen(&self) -> Vec<GenerateRequest> {
        self.seen.lock().unwrap().clone()
    }

    pub fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn start(&self, request: &GenerateRequest) -> Result<EventStream, GenerateError> {
        self.seen.lock().unwrap().push(request.clone());
        // The engine's own admission check (sampling, empty prompt, ids, length).
        let limits = if request.model == THINKER {
            THINKER_LIMITS
        } else {
            LIMITS
        };
        limits.check(&request.engine)?;
        let mode = self.mode.lock().unwrap().clone();
        let events = match &mode {
            Mode::Say(text) => answer(request, text),
            _ => answer(request, REPLY),
        };
        Ok(match mode {
            Mode::Answer | Mode::Say(_) => stream::iter(events).boxed(),
            Mode::Refuse(e) => return Err(e),
            Mode::Held(mut gate) => stream::once(async move {
                let _ = gate.wait_for(|open| *open).await;
                stream::iter(events)
            })
            .flatten()
            .boxed(),
            Mode::Hang => stream::pending().boxed(),
            Mode::BreakAfter(n) => {
                let tokens = events.into_iter().take(n);
                let broken = TokenEvent::Error("the fake engine broke".into());
                stream::iter(tokens.chain([broken])).boxed()
            }
        })
    }
}

impl Generator for FakeEngine {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        Box::pin(async move {
            let events = self.start(&request)?;
            // As the engine stage: shareable requests (with a key) are misses.
            let status = if request.key.is_some() {
                CacheStatus::Miss
            } else {
                CacheStatus::Bypass
            };
            Ok(Generation {
                status,
                events,
                priority: None,
            })
        })
    }
}

/// `text`'s tokens up to max_tokens (or up to a stop string, whose token
/// carries no text, as the engine's), then how it finished.
fn answer(request: &GenerateRequest, text: &str) -> Vec<TokenEvent> {
    let max = request.engine.stop.max_tokens;
    let stops = &request.engine.stop.stop_strings;
    let mut said = String::new();
    let mut stopped = false;
    let tokens: Vec<TokenEvent> = text
        .bytes()
        .take(max)
        .map_while(|b| {
            if stopped {
                return None;
            }
            said.push(char::from(b));
            stopped = stops.iter().any(|s| said.ends_with(s.as_str()));
            Some(TokenEvent::Token(GeneratedToken {
                token: u32::from(b),
                text: if stopped {
                    String::new()
                } else {
                    char::from(b).to_string()
                },
                logprob: -0.5,
                top_logprobs: Vec::new(),
            }))
        })
        .collect();
    let finished = Completion {
        reason: if !stopped && max < text.len() {
            FinishReason::Length
        } else {
            FinishReason::Stop
        },
        prompt_tokens: request.engine.prompt.len(),
        completion_tokens: tokens.len(),
        cached_tokens: 0,
        queue_time: Duration::ZERO,
    };
    tokens
        .into_iter()
        .chain([TokenEvent::Finished(finished)])
        .collect()
}
