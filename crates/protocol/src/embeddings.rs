//! `POST /v1/embeddings`.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::fields::UnknownFields;
use crate::{parse_json, ProtocolError};

/// OpenAI's limit on inputs per request.
pub const MAX_INPUTS: usize = 2048;

#[derive(Debug, Deserialize)]
struct RawRequest {
    model: Option<String>,
    input: Option<Value>,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    #[allow(dead_code)]
    user: Option<String>,
}

/// What to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbeddingInput {
    /// Texts, tokenized by the model's tokenizer.
    Texts(Vec<String>),
    /// Token id sequences, used as the model's input as they are.
    Tokens(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    /// Inputs in the request.
    pub fn len(&self) -> usize {
        match self {
            Self::Texts(t) => t.len(),
            Self::Tokens(t) => t.len(),
        }
    }

    /// Never true for a validated request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    /// JSON numbers.
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

/// A validated embeddings request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidEmbedding {
    /// The model asked for.
    pub model: Option<String>,
    /// The inputs.
    pub input: EmbeddingInput,
    /// How to write the vectors.
    pub format: EncodingFormat,
    /// The width asked for, if any (the server checks it against the model).
    pub dimensions: Option<usize>,
}

/// Parses and validates a request body; a field the endpoint does not know
/// is refused.
pub fn parse_embedding_request(body: &Value) -> Result<ValidEmbedding, ProtocolError> {
    parse_embedding_request_with(body, UnknownFields::Refuse)
}

/// Parses and validates a request body under the field policy
/// ([`crate::fields::policy`]), unknown fields treated as `unknown` says.
pub fn parse_embedding_request_with(
    body: &Value,
    unknown: UnknownFields,
) -> Result<ValidEmbedding, ProtocolError> {
    crate::fields::check(body, crate::fields::EMBEDDINGS, unknown)?;
    let raw: RawRequest = parse_json(body)?;
    let input = raw
        .input
        .ok_or_else(|| ProtocolError::field("input", "'input' is required"))?;
    let input = parse_input(&input)?;
    if input.len() > MAX_INPUTS {
        return Err(ProtocolError::field(
            "input",
            format!(
                "input holds {} items; at most {MAX_INPUTS} per request",
                input.len()
            ),
        ));
    }
    let format = match raw.encoding_format.as_deref() {
        None | Some("float") => EncodingFormat::Float,
        Some("base64") => EncodingFormat::Base64,
        Some(other) => {
            return Err(ProtocolError::field(
                "encoding_format",
                format!("encoding_format must be 'float' or 'base64', got '{other}'"),
            ))
        }
    };
    let dimensions = match raw.dimensions {
        None => None,
        Some(d) if d >= 1 => Some(d as usize),
        Some(d) => return Err(ProtocolError::bound("dimensions", "at least 1", d)),
    };
    Ok(ValidEmbedding {
        model: raw.model,
        input,
        format,
        dimensions,
    })
}

fn wrong_type() -> ProtocolError {
    ProtocolError::field(
        "input",
        "input must be a string, an array of strings, an array of token ids or an array of \
         token-id arrays",
    )
}

fn parse_input(input: &Value) -> Result<EmbeddingInput, ProtocolError> {
    let items = match input {
        Value::String(s) => return Ok(EmbeddingInput::Texts(vec![non_empty(s, None)?])),
        Value::Array(items) if items.is_empty() => {
            return Err(ProtocolError::field(
                "input",
                "input must not be an empty array",
            ))
        }
        Value::Array(items) => items,
        _ => return Err(wrong_type()),
    };
    match &items[0] {
        Value::String(_) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(wrong_type)
                    .and_then(|s| non_empty(s, Some(i)))
            })
            .collect::<Result<_, _>>()
            .map(EmbeddingInput::Texts),
        Value::Number(_) => Ok(EmbeddingInput::Tokens(vec![token_ids(items, None)?])),
        Value::Array(_) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Array(ids) if ids.is_empty() => Err(ProtocolError::field(
                    &format!("input[{i}]"),
                    format!("input[{i}] must not be an empty array"),
                )),
                Value::Array(ids) => token_ids(ids, Some(i)),
                _ => Err(wrong_type()),
            })
            .collect::<Result<_, _>>()
            .map(EmbeddingInput::Tokens),
        _ => Err(wrong_type()),
    }
}

fn non_empty(s: &str, index: Option<usize>) -> Result<String, ProtocolError> {
    if s.is_empty() {
        let param = index.map_or("input".to_string(), |i| format!("input[{i}]"));
        return Err(ProtocolError::field(
            &param,
            format!("{param} must not be an empty string"),
        ));
    }
    Ok(s.to_string())
}

fn token_ids(items: &[Value], index: Option<usize>) -> Result<Vec<u32>, ProtocolError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| {
                    let param = index.map_or("input".to_string(), |i| format!("input[{i}]"));
                    ProtocolError::field(
                        &param,
                        format!("{param} must hold non-negative integer token ids, got {v}"),
                    )
                })
        })
        .collect()
}

/// The response body.
pub fn embedding_response(
    model: &str,
    vectors: &[Vec<f32>],
    format: EncodingFormat,
    prompt_tokens: usize,
) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": encode(v, format)}))
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

fn encode(v: &[f32], format: EncodingFormat) -> Value {
    match format {
        EncodingFormat::Float => json!(v),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<ValidEmbedding, ProtocolError> {
        parse_embedding_request(&body)
    }

    #[test]
    fn accepts_every_input_shape() {
        let t = |v: Value| parse(json!({"input": v})).unwrap().input;
        assert_eq!(t(json!("a")), EmbeddingInput::Texts(vec!["a".into()]));
        assert_eq!(
            t(json!(["a", "b"])),
            EmbeddingInput::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(t(json!([1, 2])), EmbeddingInput::Tokens(vec![vec![1, 2]]));
        assert_eq!(
            t(json!([[1], [2, 3]])),
            EmbeddingInput::Tokens(vec![vec![1], vec![2, 3]])
        );
    }

    #[test]
    fn refuses_empty_and_mistyped_inputs() {
        for (body, param) in [
            (json!({}), "input"),
            (json!({"input": ""}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": ["a", ""]}), "input[1]"),
            (json!({"input": ["a", 1]}), "input"),
            (json!({"input": [[1], []]}), "input[1]"),
            (json!({"input": [1, -2]}), "input"),
            (json!({"input": 5}), "input"),
            (
                json!({"input": "a", "encoding_format": "hex"}),
                "encoding_format",
            ),
            (json!({"input": "a", "dimensions": 0}), "dimensions"),
        ] {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let r = embedding_response("m", &[vec![1.0, -2.0]], EncodingFormat::Base64, 3);
        let b64 = r["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat()
        );
        assert_eq!(r["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
        assert_eq!(r["object"], "list");
    }
}
