//! `POST /v1/completions`.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingot_core::TokenId;

use ingot_engine::{Completion as EngineCompletion, GeneratedToken, PromptLogprob};
use ingot_protocol::completions::{
    Completion, CompletionChoice, CompletionLogprobs, Prompt, ValidCompletionRequest,
};
use ingot_protocol::sampling::ValidSampling;
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::usage::Usage;
use ingot_tokenizer::Tokenizer;

use super::sse::Event;
use super::{json_body, sse, unknown_fields, Shared};
use crate::generate::{self, ChoiceResult, Job};
use crate::logprobs::{push_prompt, resolve};
use crate::models::ModelFront;
use crate::prepare::{self, Head, Incoming, Shape, WireFormat};
use crate::ApiError;

/// Token ids and display text of every prompt (runs on a blocking thread).
fn encode_prompts(
    prompts: &[Prompt],
    tokenizer: &Tokenizer,
) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    prompts
        .iter()
        .map(|p| match p {
            Prompt::Text(t) => tokenizer
                .encode(t, true)
                .map(|ids| (ids, t.clone()))
                .map_err(|e| ApiError::Internal(e.to_string())),
            Prompt::Ids(ids) => {
                let text = tokenizer.decode(ids, false).unwrap_or_default();
                Ok((ids.clone(), text))
            }
        })
        .collect()
}

/// The handler: parse, then the shared path (`prepare::generate`).
pub async fn completions(
    State((state, limit)): State<Shared>,
    incoming: Incoming,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = ValidCompletionRequest::parse_with(&json_body(body, limit)?, unknown_fields(&state))?;
    prepare::generate(state, incoming, req).await
}

impl WireFormat for ValidCompletionRequest {
    const ENDPOINT: generate::Endpoint = generate::Endpoint::Completions;
    /// The prompts' texts (echoed when asked).
    type Extra = Vec<String>;
    type Answer = Meta;

    fn sampling(&self) -> &ValidSampling {
        &self.sampling
    }

    fn grammar(&self, _: &ModelFront) -> Result<Option<OutputGrammar>, ApiError> {
        Ok(self.sampling.grammar.clone())
    }

    fn encode(&self, front: &ModelFront) -> Result<(Vec<Vec<TokenId>>, Vec<String>), ApiError> {
        Ok(encode_prompts(&self.prompts, front.tokenizer()?)?
            .into_iter()
            .unzip())
    }

    fn answer(self, head: Head, _: &ModelFront, texts: Vec<String>) -> Meta {
        Meta {
            head,
            prompt_logprobs: self.sampling.params.prompt_logprobs.is_some(),
            echo: self.echo.then_some(texts),
        }
    }
}

impl Shape for Meta {
    fn stream(self, jobs: Vec<Job>, include_usage: bool, delivery: sse::Delivery) -> Response {
        let meta = self;
        let usage = sse::ChunkUsage::at_start(include_usage, &delivery);
        // With echo, each choice starts with its prompt (with its logprobs,
        // the prompt goes out when they arrive).
        let mut offsets = HashMap::new();
        let head: Vec<_> = jobs
            .iter()
            .filter(|_| meta.echo.is_some() && !meta.prompt_logprobs)
            .map(|j| {
                let text = meta.echo_of(j.prompt_index).to_string();
                offsets.insert(j.index, text.len());
                let choice = CompletionChoice {
                    index: j.index,
                    text,
                    logprobs: None,
                    finish_reason: None,
                };
                sse::data(&meta.chunk(vec![choice], usage))
            })
            .collect();
        let prompt_index = jobs.iter().map(|j| (j.index, j.prompt_index)).collect();
        let format = CompletionChunks {
            meta,
            usage,
            offsets,
            prompt_index,
        };
        sse::stream_choices(head, jobs, format, include_usage, delivery)
    }

    fn whole(self, results: &[ChoiceResult], usage: Usage) -> Response {
        let tokenizer = &self.head.tokenizer;
        let choices = results
            .iter()
            .map(|r| {
                let prefix = self.echo_of(r.prompt_index);
                let mut logprobs = CompletionLogprobs::default();
                if let Some(prompt) = &r.prompt {
                    push_prompt(&mut logprobs, tokenizer, prompt);
                }
                let mut offset = prefix.len();
                for t in &r.tokens {
                    logprobs.push(&resolve(tokenizer, t), offset);
                    offset += t.text.len();
                }
                CompletionChoice {
                    index: r.index,
                    text: format!("{prefix}{}", r.text),
                    logprobs: self.head.logprobs.then_some(logprobs),
                    finish_reason: Some(r.completion.reason.as_str()),
                }
            })
            .collect();
        Json(Completion {
            id: self.head.id,
            object: "text_completion",
            created: self.head.created,
            model: self.head.model,
            choices,
            usage: Some(Some(usage)),
            system_fingerprint: None,
        })
        .into_response()
    }
}

/// What every chunk repeats.
pub struct Meta {
    head: Head,
    /// Echoed prompts come with their logprobs (sent when they arrive).
    prompt_logprobs: bool,
    /// Prompt texts when echoing.
    echo: Option<Vec<String>>,
}

impl Meta {
    fn echo_of(&self, prompt_index: usize) -> &str {
        self.echo
            .as_ref()
            .and_then(|e| e.get(prompt_index))
            .map_or("", String::as_str)
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: sse::ChunkUsage) -> Completion {
        Completion {
            id: self.head.id.clone(),
            object: "text_completion",
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage: usage.field(),
            system_fingerprint: None,
        }
    }
}

struct CompletionChunks {
    meta: Meta,
    usage: sse::ChunkUsage,
    /// Text sent so far per choice (for logprob text offsets).
    offsets: HashMap<usize, usize>,
    /// Choice index → prompt index.
    prompt_index: HashMap<usize, usize>,
}

impl sse::ChunkFormat for CompletionChunks {
    fn prompt(&mut self, index: usize, prompt: Vec<PromptLogprob>) -> Option<Event> {
        let m = &self.meta;
        let text = m
            .echo_of(self.prompt_index.get(&index).copied()?)
            .to_string();
        let mut logprobs = CompletionLogprobs::default();
        push_prompt(&mut logprobs, &m.head.tokenizer, &prompt);
        self.offsets.insert(index, text.len());
        let choice = CompletionChoice {
            index,
            text,
            logprobs: Some(logprobs),
            finish_reason: None,
        };
        Some(sse::data(&m.chunk(vec![choice], self.usage)))
    }

    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<Event> {
        let m = &self.meta;
        if token.text.is_empty() && !m.head.logprobs {
            return None;
        }
        let offset = self.offsets.entry(index).or_insert(0);
        let logprobs = m.head.logprobs.then(|| {
            let mut l = CompletionLogprobs::default();
            l.push(&resolve(&m.head.tokenizer, &token), *offset);
            l
        });
        *offset += token.text.len();
        let choice = CompletionChoice {
            index,
            text: token.text,
            logprobs,
            finish_reason: None,
        };
        Some(sse::data(&m.chunk(vec![choice], self.usage)))
    }

    fn finish(&mut self, index: usize, completion: &EngineCompletion) -> Event {
        let choice = CompletionChoice {
            index,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(completion.reason.as_str()),
        };
        sse::data(&self.meta.chunk(vec![choice], self.usage))
    }

    fn usage(&self, usage: Usage) -> Event {
        let mut chunk = self.meta.chunk(Vec::new(), self.usage);
        chunk.usage = Some(Some(usage));
        sse::data(&chunk)
    }

    fn running_usage(&mut self, usage: Usage) {
        self.usage.running = Some(usage);
    }
}
