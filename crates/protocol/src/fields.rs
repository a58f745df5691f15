//! The field policy: every request field of each OpenAI endpoint ingot
//! serves is honoured, accepted as changing nothing (with the reason), or
//! refused with a 400 that names it; nothing is silently dropped. The
//! parsers check every body against these lists ([`check`]), and a test
//! walks OpenAI's published API description against them, so the lists
//! are the policy itself (docs/apis.md shows them).
//!
//! A nested field is named by its path (`stream_options.include_usage`);
//! the keys of an object are checked only when the list names some of its
//! fields. A null is as good as absent (clients serialise unset optional
//! fields as null), so it is never refused.

use serde_json::Value;

use crate::ProtocolError;

/// What ingot does with a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Read by the parser, which refuses, naming the field, the values it
    /// cannot honour.
    Honoured,
    /// Accepted and unused: it changes no answer, for the reason given.
    Unused(&'static str),
    /// Any value but null and the ones listed (compact JSON, which change
    /// nothing) is a 400 naming the field, with the reason given.
    Refused {
        /// Why.
        reason: &'static str,
        /// Values accepted because they ask for what ingot does anyway.
        allowed: &'static [&'static str],
    },
}

/// One field of an endpoint's request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Its path in the body (`temperature`, `stream_options.include_usage`).
    pub name: &'static str,
    /// What ingot does with it.
    pub policy: Policy,
}

/// What to do with a field no list names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownFields {
    /// A 400 naming it (OpenAI's behaviour; the default).
    #[default]
    Refuse,
    /// Ignore it, as vLLM does (`server.ignore_unknown_fields`).
    Ignore,
}

const fn honoured(name: &'static str) -> Field {
    Field {
        name,
        policy: Policy::Honoured,
    }
}

const fn unused(name: &'static str, reason: &'static str) -> Field {
    Field {
        name,
        policy: Policy::Unused(reason),
    }
}

const fn refused(name: &'static str, reason: &'static str) -> Field {
    refused_but(name, reason, &[])
}

const fn refused_but(
    name: &'static str,
    reason: &'static str,
    allowed: &'static [&'static str],
) -> Field {
    Field {
        name,
        policy: Policy::Refused { reason, allowed },
    }
}

const USER: &str =
    "an opaque end-user id; it changes no answer (without an API key it is the feature-flag unit)";
const METADATA: &str =
    "tags OpenAI keeps for its dashboard; ingot keeps no requests, and they change no answer";
const CACHE_HINT: &str =
    "a hint for OpenAI's prompt cache; ingot caches every prompt prefix by itself";

/// The fields chat and completions share: sampling, stopping, streaming,
/// structured output and ingot's (vLLM's) extensions.
const SHARED: [Field; 31] = [
    honoured("model"),
    honoured("max_tokens"),
    honoured("max_completion_tokens"),
    honoured("temperature"),
    honoured("top_p"),
    honoured("n"),
    honoured("stop"),
    honoured("seed"),
    honoured("presence_penalty"),
    honoured("frequency_penalty"),
    honoured("logit_bias"),
    honoured("stream"),
    honoured("stream_options"),
    honoured("stream_options.include_usage"),
    honoured("stream_options.continuous_usage_stats"),
    refused_but(
        "stream_options.include_obfuscation",
        "ingot's streams carry no obfuscation padding",
        &["false"],
    ),
    unused("user", USER),
    honoured("top_k"),
    honoured("min_p"),
    honoured("repetition_penalty"),
    honoured("ignore_eos"),
    honoured("priority"),
    honoured("speculative"),
    honoured("stop_token_ids"),
    honoured("response_format"),
    honoured("guided_json"),
    honoured("guided_regex"),
    honoured("guided_choice"),
    honoured("guided_grammar"),
    honoured("structured_outputs"),
    unused("safety_identifier", USER),
];

/// `response_format` and its `json_schema`.
const RESPONSE_FORMAT: [Field; 6] = [
    honoured("response_format.type"),
    honoured("response_format.json_schema"),
    honoured("response_format.json_schema.name"),
    honoured("response_format.json_schema.schema"),
    honoured("response_format.json_schema.strict"),
    unused(
        "response_format.json_schema.description",
        "the schema itself constrains the answer; the description is not shown to the model",
    ),
];

/// `POST /v1/chat/completions` besides [`SHARED`].
const CHAT_OWN: [Field; 23] = [
    honoured("messages"),
    honoured("logprobs"),
    honoured("top_logprobs"),
    honoured("tools"),
    honoured("tool_choice"),
    honoured("parallel_tool_calls"),
    honoured("add_generation_prompt"),
    honoured("chat_template_kwargs"),
    unused("metadata", METADATA),
    unused("prompt_cache_key", CACHE_HINT),
    unused("prompt_cache_retention", CACHE_HINT),
    unused("prompt_cache_options", CACHE_HINT),
    refused_but(
        "store",
        "ingot stores no completions (OpenAI's distillation and evals)",
        &["false"],
    ),
    refused_but(
        "service_tier",
        "ingot has one service tier; use priority",
        &["\"auto\"", "\"default\""],
    ),
    refused_but(
        "modalities",
        "this server generates text only",
        &["[\"text\"]"],
    ),
    refused("audio", "this server generates text only"),
    refused(
        "prediction",
        "predicted outputs are not supported; speculative decoding needs no prediction",
    ),
    refused(
        "reasoning_effort",
        "the reasoning effort of this model cannot be set",
    ),
    refused(
        "verbosity",
        "the verbosity of this model cannot be set; use max_tokens or the prompt",
    ),
    refused("web_search_options", "this server has no web search"),
    refused(
        "functions",
        "the deprecated functions field is not supported; send tools",
    ),
    refused(
        "function_call",
        "the deprecated function_call field is not supported; send tool_choice",
    ),
    refused(
        "moderation",
        "this server runs no moderation model; moderate before or after",
    ),
];

/// `POST /v1/completions` besides [`SHARED`].
const COMPLETIONS_OWN: [Field; 5] = [
    honoured("prompt"),
    honoured("logprobs"),
    honoured("echo"),
    honoured("best_of"),
    honoured("suffix"),
];

/// `POST /v1/embeddings`.
pub const EMBEDDINGS: &[Field] = &[
    honoured("model"),
    honoured("input"),
    honoured("encoding_format"),
    honoured("dimensions"),
    unused("user", USER),
];

/// `POST /v1/chat/completions`.
pub static CHAT: std::sync::LazyLock<Vec<Field>> =
    std::sync::LazyLock::new(|| [&SHARED[..], &RESPONSE_FORMAT, &CHAT_OWN].concat());
/// `POST /v1/completions`.
pub static COMPLETIONS: std::sync::LazyLock<Vec<Field>> =
    std::sync::LazyLock::new(|| [&SHARED[..], &RESPONSE_FORMAT, &COMPLETIONS_OWN].concat());

/// `POST /v1/responses` (its parser, `crate::responses`, refuses the
/// values of honoured fields it cannot serve: reasoning options, input
/// item and tool kinds).
pub const RESPONSES: &[Field] = &[
    honoured("model"),
    honoured("input"),
    honoured("instructions"),
    honoured("max_output_tokens"),
    honoured("temperature"),
    honoured("top_p"),
    honoured("stream"),
    honoured("stream_options"),
    refused_but(
        "stream_options.include_obfuscation",
        "ingot's streams carry no obfuscation padding",
        &["false"],
    ),
    honoured("store"),
    honoured("previous_response_id"),
    honoured("text"),
    honoured("text.format"),
    refused_but(
        "text.verbosity",
        "the verbosity of this model cannot be set; use max_output_tokens or the prompt",
        &["\"medium\""],
    ),
    honoured("tools"),
    honoured("tool_choice"),
    honoured("parallel_tool_calls"),
    honoured("metadata"),
    honoured("user"),
    honoured("safety_identifier"),
    honoured("reasoning"),
    unused("prompt_cache_key", CACHE_HINT),
    unused("prompt_cache_retention", CACHE_HINT),
    unused("prompt_cache_options", CACHE_HINT),
    unused(
        "max_tool_calls",
        "it bounds calls of built-in tools, and ingot serves none",
    ),
    refused_but(
        "top_logprobs",
        "log probabilities are not returned by /v1/responses here; use /v1/chat/completions",
        &["0"],
    ),
    refused_but(
        "background",
        "background responses are not supported; the request is answered as it runs",
        &["false"],
    ),
    refused_but(
        "include",
        "ingot produces none of the extra outputs include names",
        &["[]"],
    ),
    refused_but(
        "truncation",
        "an input longer than the context is an error, not cut",
        &["\"disabled\""],
    ),
    refused_but(
        "service_tier",
        "ingot has one service tier; use priority",
        &["\"auto\"", "\"default\""],
    ),
    refused(
        "conversation",
        "ingot keeps no conversations; use previous_response_id",
    ),
    refused("prompt", "ingot keeps no prompt templates"),
    refused(
        "context_management",
        "ingot does not compact a context; an input longer than it is an error",
    ),
    refused(
        "moderation",
        "this server runs no moderation model; moderate before or after",
    ),
    // Chat's extensions, as vLLM reads them here.
    honoured("seed"),
    honoured("top_k"),
    honoured("min_p"),
    honoured("repetition_penalty"),
    honoured("presence_penalty"),
    honoured("frequency_penalty"),
    honoured("stop"),
    honoured("stop_token_ids"),
    honoured("ignore_eos"),
    honoured("priority"),
    honoured("speculative"),
];

/// The field list of an endpoint by its path in OpenAI's description
/// (`/chat/completions`), or `None` for an endpoint without one.
pub fn policy(path: &str) -> Option<&'static [Field]> {
    match path {
        "/chat/completions" => Some(CHAT.as_slice()),
        "/completions" => Some(COMPLETIONS.as_slice()),
        "/embeddings" => Some(EMBEDDINGS),
        "/responses" => Some(RESPONSES),
        _ => None,
    }
}

/// Checks `body` against `fields`: a refused field with a value it does
/// not allow is a 400 naming it, and so is a field no entry names unless
/// `unknown` says to ignore it. Honoured fields are left to the parser.
pub fn check(body: &Value, fields: &[Field], unknown: UnknownFields) -> Result<(), ProtocolError> {
    let mut parents: Vec<&str> = vec![""];
    for f in fields {
        if let Some((parent, _)) = f.name.rsplit_once('.') {
            if !parents.contains(&parent) {
                parents.push(parent);
            }
        }
    }
    for parent in parents {
        let Some(Value::Object(obj)) = at(body, parent) else {
            continue;
        };
        for (key, value) in obj.iter().filter(|(_, v)| !v.is_null()) {
            let name = if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            };
            match fields.iter().find(|f| f.name == name).map(|f| f.policy) {
                Some(Policy::Refused { reason, allowed })
                    if !allowed.contains(&value.to_string().as_str()) =>
                {
                    return Err(ProtocolError::field(
                        &name,
                        format!("{name} is not supported: {reason}"),
                    ));
                }
                None if unknown == UnknownFields::Refuse => {
                    return Err(ProtocolError::field(
                        &name,
                        format!(
                            "{name} is not a field of this endpoint (a server started with server.ignore_unknown_fields = true ignores unknown fields)"
                        ),
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The value at a dotted path of objects (`""`: the body).
fn at<'a>(body: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(body);
    }
    path.split('.').try_fold(body, |v, key| v.get(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(body: Value, fields: &[Field]) -> Option<String> {
        check(&body, fields, UnknownFields::Refuse)
            .err()
            .and_then(|e| e.param)
    }

    #[test]
    fn names_are_unique_and_parents_are_listed() {
        for (path, fields) in [
            ("/chat/completions", &CHAT[..]),
            ("/completions", &COMPLETIONS[..]),
            ("/embeddings", EMBEDDINGS),
            ("/responses", RESPONSES),
        ] {
            for (i, f) in fields.iter().enumerate() {
                assert!(
                    !fields[i + 1..].iter().any(|g| g.name == f.name),
                    "{path}: {} twice",
                    f.name
                );
                if let Some((parent, _)) = f.name.rsplit_once('.') {
                    assert!(
                        fields.iter().any(|g| g.name == parent),
                        "{path}: {} without {parent}",
                        f.name
                    );
                }
            }
        }
    }

    #[test]
    fn refused_and_unknown_fields_are_named_and_nulls_pass() {
        assert_eq!(param(json!({"audio": {}}), &CHAT), Some("audio".into()));
        assert_eq!(param(json!({"audio": null, "store": false}), &CHAT), None);
        assert_eq!(param(json!({"store": true}), &CHAT), Some("store".into()));
        assert_eq!(param(json!({"modalities": ["text"]}), &CHAT), None);
        assert_eq!(
            param(json!({"modalities": ["text", "audio"]}), &CHAT),
            Some("modalities".into())
        );
        assert_eq!(
            param(json!({"frobnicate": 1}), &COMPLETIONS),
            Some("frobnicate".into())
        );
        assert_eq!(
            param(
                json!({"stream_options": {"include_usage": true, "x": 1}}),
                &CHAT
            ),
            Some("stream_options.x".into())
        );
        assert_eq!(
            param(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "extra": 1}}}),
                &CHAT
            ),
            Some("response_format.json_schema.extra".into())
        );
        // A schema's own keys are the schema's, not fields.
        assert_eq!(
            param(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"title": "t"}}}}),
                &CHAT
            ),
            None
        );
        assert_eq!(
            param(json!({"messages": []}), &COMPLETIONS),
            Some("messages".into())
        );
        assert!(check(&json!({"frobnicate": 1}), &CHAT, UnknownFields::Ignore).is_ok());
        assert!(check(&json!({"audio": 1}), &CHAT, UnknownFields::Ignore).is_err());
    }
}
