//! `GET /openapi.json`: the server's own OpenAPI 3.1 description of every
//! route it serves. Response bodies and the typed request bodies are the
//! JSON Schemas of the protocol crate's serde types (`schemars`); bodies
//! read by hand are described from the same field lists the parsers check
//! (`ingot_protocol::fields`, Anthropic's and Ollama's field lists), so a
//! field added to a parser without a description fails the tests
//! (`tests/http/openapi.rs`), as does a route added without one.
//! Errors are described in the dialect of each path (OpenAI's
//! `{"error": {...}}`, Anthropic's `{"type": "error", ...}`, Ollama's
//! `{"error": "..."}`), as `routes::dialect` shapes them.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use ingot_core::{MAX_LOGIT_BIAS, MAX_LOGPROBS};
use ingot_protocol::fields::{Field, Policy};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::routes::ROUTES;

/// The document, built once (it depends on the code only).
static DOCUMENT: LazyLock<String> = LazyLock::new(|| document().to_string());

/// The handler.
pub(crate) async fn serve() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
        .into_response()
}

/// Where the components live.
const COMPONENTS: &str = "#/components/schemas/";

/// Every (method, path) the server serves: the API routes and the web
/// page's files.
pub fn served() -> Vec<(&'static str, &'static str)> {
    let page = ingot_web::ASSETS.iter().map(|&(path, _, _)| ("get", path));
    ROUTES.iter().copied().chain(page).collect()
}

/// The OpenAPI 3.1 document.
pub fn document() -> Value {
    let mut schemas = Schemas::new();
    let mut paths = Map::new();
    for (method, path) in served() {
        let Some(mut op) = operation(&mut schemas, method, path) else {
            continue;
        };
        let params = path_parameters(path);
        if !params.is_empty() {
            op["parameters"] = Value::Array(params);
        }
        op["responses"]["default"] = error_response(path);
        op["operationId"] = Value::String(operation_id(method, path));
        if let Some(links) = links(method, path) {
            op["responses"]["200"]["links"] = links;
        }
        let entry = paths
            .entry(path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[method] = op;
    }
    let mut components = schemas.finish();
    for (name, schema) in error_schemas() {
        components.insert(name.to_string(), schema);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "ingot",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI-, Anthropic- and Ollama-compatible LLM serving (docs/apis.md).",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        // A key is needed only when the server has some (docs/config.md).
        "security": [{"bearer": []}, {"x-api-key": []}, {}],
    })
}

/// The schemas of serde types: one generator for what the server reads
/// (deserialisation's contract) and one for what it writes.
struct Schemas {
    reads: SchemaGenerator,
    writes: SchemaGenerator,
}

impl Schemas {
    fn new() -> Self {
        let settings = SchemaSettings::draft2020_12().with(|s| {
            s.definitions_path = COMPONENTS.into();
            s.meta_schema = None;
        });
        Self {
            reads: settings.clone().for_deserialize().into_generator(),
            writes: settings.for_serialize().into_generator(),
        }
    }

    /// A `$ref` to what the server writes as `T`.
    fn written<T: JsonSchema>(&mut self) -> Value {
        self.writes.subschema_for::<T>().to_value()
    }

    /// A `$ref` to what the server reads as `T`.
    fn read<T: JsonSchema>(&mut self) -> Value {
        self.reads.subschema_for::<T>().to_value()
    }

    /// The properties of the object the server reads as `T`, inline.
    fn read_properties<T: JsonSchema>(&mut self) -> Map<String, Value> {
        let reference = self.read::<T>();
        let name = reference["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix(COMPONENTS))
            .unwrap_or_default()
            .to_string();
        self.reads
            .definitions()
            .get(&name)
            .and_then(|d| d.get("properties"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    }

    fn finish(mut self) -> Map<String, Value> {
        let mut all = self.writes.take_definitions(true);
        all.extend(self.reads.take_definitions(true));
        all
    }
}

/// `post_v1_chat_completions`, `get_v1_models_id`, `get_root`.
fn operation_id(method: &str, path: &str) -> String {
    let words: Vec<String> = path
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let name = if words.is_empty() {
        "root".to_string()
    } else {
        words.join("_")
    };
    format!("{method}_{name}")
}

/// Where an answer's ids lead (OpenAPI links: schemathesis's stateful
/// runs follow them).
fn links(method: &str, path: &str) -> Option<Value> {
    let to = |method: &str, target: &str, id: &str| json!({"operationId": operation_id(method, target), "parameters": {"id": id}});
    match (method, path) {
        ("post", "/v1/responses") => Some(json!({
            "Retrieve": to("get", "/v1/responses/{id}", "$response.body#/id"),
            "Delete": to("delete", "/v1/responses/{id}", "$response.body#/id"),
        })),
        ("get", "/v1/models") => Some(json!({
            "Model": to("get", "/v1/models/{id}", "$response.body#/data/0/id"),
        })),
        _ => None,
    }
}

/// `{name}` segments as OpenAPI path parameters.
fn path_parameters(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| {
            let schema = if name == "action" {
                json!({"type": "string", "enum": ["load", "unload", "pin", "unpin"]})
            } else {
                json!({"type": "string"})
            };
            json!({"name": name, "in": "path", "required": true, "schema": schema})
        })
        .collect()
}

/// Every error answer of a path, in its dialect (`routes::dialect`).
fn error_response(path: &str) -> Value {
    let (name, what) = if path == "/v1/messages" {
        ("AnthropicError", "Anthropic's error shape")
    } else if path.starts_with("/api/") {
        ("OllamaError", "Ollama's error shape")
    } else {
        ("Error", "OpenAI's error shape")
    };
    json!({
        "description": format!("An error, in {what}."),
        "content": {"application/json": {"schema": reference(name)}},
    })
}

fn error_schemas() -> [(&'static str, Value); 3] {
    let nullable = json!({"type": ["string", "null"]});
    [
        (
            "Error",
            json!({
                "type": "object",
                "required": ["error"],
                "properties": {"error": {
                    "type": "object",
                    "required": ["message", "type", "param", "code"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": nullable,
                        "code": nullable,
                    },
                }},
            }),
        ),
        (
            "AnthropicError",
            json!({
                "type": "object",
                "required": ["type", "error"],
                "properties": {
                    "type": {"const": "error"},
                    "error": {
                        "type": "object",
                        "required": ["type", "message"],
                        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
            }),
        ),
        (
            "OllamaError",
            json!({
                "type": "object",
                "required": ["error"],
                "properties": {"error": {"type": "string"}},
            }),
        ),
    ]
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("{COMPONENTS}{name}") })
}

/// An operation with a JSON body (when `body` is some) and its answers.
fn op(summary: &str, body: Option<Value>, responses: Value) -> Value {
    let mut op = json!({"summary": summary, "responses": responses});
    if let Some(schema) = body {
        op["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": schema}},
        });
    }
    op
}

/// A 200 with one JSON body.
fn ok_json(schema: Value) -> Value {
    json!({"200": {"description": "OK", "content": {"application/json": {"schema": schema}}}})
}

/// A 200 that is a JSON body or, with `stream`, a stream of `media`
/// whose items are `item` (an SSE event's `data` for text/event-stream).
fn ok_streamed(schema: Value, media: &str, item: Value) -> Value {
    let streamed = if media == "text/event-stream" {
        // Open API 3.1 has no schema for a sequence: each SSE event is
        // described as its envelope, `data` the JSON of one item (or
        // OpenAI's closing `[DONE]`).
        json!({
            "type": "object",
            "required": ["data"],
            "properties": {
                "event": {"type": "string"},
                "data": {"anyOf": [
                    {"const": "[DONE]"},
                    {"type": "string", "contentMediaType": "application/json", "contentSchema": item},
                ]},
            },
        })
    } else {
        item
    };
    json!({"200": {"description": "OK; with stream, a stream of events", "content": {
        "application/json": {"schema": schema},
        (media): {"schema": streamed},
    }}})
}

/// A 200 with a body of a non-JSON type.
fn ok_text(media: &str, schema: Value) -> Value {
    json!({"200": {"description": "OK", "content": { (media): {"schema": schema} }}})
}

/// An object of these properties and no others (the parsers refuse an
/// unknown field).
fn closed(properties: Map<String, Value>, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// Optional values are nullable: the parsers read a null as absent.
fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

/// The body of an OpenAI endpoint from its field policy: each top-level
/// field, typed by `typed` (honoured fields, which it must name), any value
/// for an unused one, and only null or the allowed values for a refused one.
fn policy_body(fields: &[Field], typed: &Map<String, Value>, required: &[&str]) -> Value {
    let mut properties = Map::new();
    for f in fields.iter().filter(|f| !f.name.contains('.')) {
        let schema = match f.policy {
            Policy::Honoured | Policy::Unused(_) => typed.get(f.name).cloned().unwrap_or(json!({})),
            Policy::Refused { allowed, .. } => {
                let values = allowed
                    .iter()
                    .filter_map(|a| serde_json::from_str::<Value>(a).ok());
                json!({ "enum": std::iter::once(Value::Null).chain(values).collect::<Vec<_>>() })
            }
        };
        properties.insert(f.name.to_string(), schema);
    }
    closed(properties, required)
}

/// A message of a chat conversation (roles and content as the parser reads
/// them; other fields pass to the template).
fn chat_message() -> Value {
    let part = json!({
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    });
    json!({
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"enum": ["system", "user", "assistant", "tool", "developer"]},
            "content": nullable(json!({"anyOf": [{"type": "string"}, {"type": "array", "items": part}]})),
            "name": {"type": "string"},
            "tool_call_id": {"type": "string"},
            "tool_calls": {"type": "array", "items": {"type": "object"}},
        },
    })
}

fn tools() -> Value {
    json!({"type": "array", "items": {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                    "description": {"type": "string"},
                    "parameters": {"type": "object"},
                    "strict": {"type": ["boolean", "null"]},
                },
            },
        },
    }})
}

fn tool_choice() -> Value {
    json!({"anyOf": [
        {"enum": ["none", "auto", "required"]},
        {"type": "object", "required": ["type", "function"], "properties": {
            "type": {"const": "function"},
            "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
        }},
    ]})
}

/// Structured output: `response_format` and vLLM's `guided_*` fields.
fn structured(typed: &mut Map<String, Value>) {
    typed.insert(
        "response_format".into(),
        nullable(json!({
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"enum": ["text", "json_object", "json_schema"]},
                "json_schema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "schema": {"type": "object"},
                        "strict": {"type": ["boolean", "null"]},
                        "description": {"type": "string"},
                    },
                    "additionalProperties": false,
                },
            },
            "additionalProperties": false,
        })),
    );
    typed.insert(
        "guided_json".into(),
        // A schema as an object (a string holding one is read too).
        json!({"type": ["object", "null"]}),
    );
    typed.insert("guided_regex".into(), json!({"type": ["string", "null"]}));
    typed.insert(
        "guided_choice".into(),
        json!({"type": ["array", "null"], "minItems": 1, "items": {"type": "string", "minLength": 1}}),
    );
    typed.insert("guided_grammar".into(), json!({"type": ["string", "null"]}));
    typed.insert(
        "structured_outputs".into(),
        json!({"type": ["object", "null"]}),
    );
}

/// Token ids or text: a prompt or an embedding input.
fn text_or_tokens() -> Value {
    let id = json!({"type": "integer", "minimum": 0, "maximum": u32::MAX});
    let ids = json!({"type": "array", "minItems": 1, "items": id});
    let many = ingot_protocol::completions::MAX_PROMPTS;
    json!({"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "maxItems": many, "items": {"type": "string", "minLength": 1}},
        ids,
        {"type": "array", "minItems": 1, "maxItems": many, "items": ids},
    ]})
}

fn chat_body(s: &mut Schemas) -> Value {
    let mut typed = s.read_properties::<ingot_protocol::sampling::SamplingFields>();
    structured(&mut typed);
    typed.extend(
        json!({
            "messages": {"type": "array", "minItems": 1, "items": chat_message()},
            "logprobs": {"type": ["boolean", "null"]},
            "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_LOGPROBS},
            "tools": nullable(tools()),
            "tool_choice": nullable(tool_choice()),
            "parallel_tool_calls": {"type": ["boolean", "null"]},
            "add_generation_prompt": {"type": ["boolean", "null"]},
            "chat_template_kwargs": {"type": ["object", "null"]},
            "logit_bias": {"type": ["object", "null"], "maxProperties": MAX_LOGIT_BIAS, "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,8})$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
            "safety_identifier": {"type": ["string", "null"]},
        })
        .as_object()
        .cloned()
        .unwrap_or_default(),
    );
    policy_body(&ingot_protocol::fields::CHAT, &typed, &["messages"])
}

fn completions_body(s: &mut Schemas) -> Value {
    let mut typed = s.read_properties::<ingot_protocol::sampling::SamplingFields>();
    structured(&mut typed);
    typed.extend(
        json!({
            "prompt": text_or_tokens(),
            "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_LOGPROBS},
            "echo": {"type": ["boolean", "null"]},
            "best_of": {"type": ["integer", "null"], "minimum": 1},
            "suffix": {"type": ["string", "null"]},
            "logit_bias": {"type": ["object", "null"], "maxProperties": MAX_LOGIT_BIAS, "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,8})$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
            "safety_identifier": {"type": ["string", "null"]},
        })
        .as_object()
        .cloned()
        .unwrap_or_default(),
    );
    policy_body(&ingot_protocol::fields::COMPLETIONS, &typed, &["prompt"])
}

fn embeddings_body() -> Value {
    let typed = json!({
        "model": {"type": ["string", "null"]},
        "input": text_or_tokens(),
        "encoding_format": {"enum": ["float", "base64", null]},
        "dimensions": {"type": ["integer", "null"], "minimum": 1},
        "user": {"type": ["string", "null"]},
    });
    policy_body(
        ingot_protocol::fields::EMBEDDINGS,
        typed.as_object().unwrap_or(&Map::new()),
        &["input"],
    )
}

fn responses_body(s: &mut Schemas) -> Value {
    let mut typed = s.read_properties::<ingot_protocol::sampling::SamplingFields>();
    // Message items (function calls and their outputs are read too).
    let part = json!({"type": "object", "required": ["type", "text"], "additionalProperties": false, "properties": {
        "type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"},
    }});
    let item = json!({"type": "object", "required": ["role", "content"], "additionalProperties": false, "properties": {
        "type": {"const": "message"},
        "role": {"enum": ["system", "user", "assistant", "developer"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": part}]},
    }});
    typed.extend(
        json!({
            "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": item}]},
            "instructions": {"type": ["string", "null"]},
            "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
            "store": {"type": ["boolean", "null"]},
            "previous_response_id": {"type": ["string", "null"]},
            "text": {"type": ["object", "null"], "additionalProperties": false, "properties": {
                "format": {"type": "object"},
                "verbosity": {"enum": ["medium", null]},
            }},
            "tools": {"type": ["array", "null"], "items": {"type": "object"}},
            "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required", null]}, {"type": "object"}]},
            "parallel_tool_calls": {"type": ["boolean", "null"]},
            "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "user": {"type": ["string", "null"]},
            "safety_identifier": {"type": ["string", "null"]},
            // No reasoning option can be set (docs/apis.md).
            "reasoning": {"type": ["object", "null"], "additionalProperties": false},
            "max_tool_calls": {"type": ["integer", "null"], "minimum": 0},
        })
        .as_object()
        .cloned()
        .unwrap_or_default(),
    );
    policy_body(ingot_protocol::fields::RESPONSES, &typed, &["input"])
}

fn anthropic_body() -> Value {
    let text = json!({"type": "object", "required": ["type", "text"], "additionalProperties": false, "properties": {
        "type": {"const": "text"}, "text": {"type": "string"},
    }});
    let block = json!({"anyOf": [
        text,
        {"type": "object", "required": ["type", "id", "name", "input"], "additionalProperties": false, "properties": {
            "type": {"const": "tool_use"}, "id": {"type": "string"}, "name": {"type": "string"},
            "input": {"type": "object"},
        }},
        {"type": "object", "required": ["type", "tool_use_id"], "additionalProperties": false, "properties": {
            "type": {"const": "tool_result"}, "tool_use_id": {"type": "string"},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": text}]},
        }},
    ]});
    let content = json!({"anyOf": [{"type": "string"}, {"type": "array", "items": block}]});
    let typed = json!({
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "additionalProperties": false,
            "required": ["role", "content"],
            "properties": {"role": {"enum": ["user", "assistant"]}, "content": content},
        }},
        "max_tokens": {"type": "integer", "minimum": 1},
        "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": text}]},
        "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1, "maximum": i32::MAX},
        "tools": {"type": "array", "items": {"type": "object", "required": ["name", "input_schema"], "properties": {
            "name": {"type": "string"},
            "description": {"type": "string"},
            "input_schema": {"type": "object"},
        }}},
        "tool_choice": {"type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["auto", "any", "tool", "none"]},
            "name": {"type": "string"},
        }},
        "metadata": {"type": "object"},
    });
    let typed = typed.as_object().cloned().unwrap_or_default();
    closed(
        listed(&ingot_protocol::anthropic::FIELDS, &typed),
        &["model", "messages", "max_tokens"],
    )
}

/// The properties `fields` names, typed by `typed` (any value where it
/// names none).
fn listed(fields: &[&str], typed: &Map<String, Value>) -> Map<String, Value> {
    fields
        .iter()
        .map(|f| (f.to_string(), typed.get(*f).cloned().unwrap_or(json!({}))))
        .collect()
}

/// The fields of Ollama's `/api/chat`, `/api/generate` and `/api/embed`.
fn ollama_typed() -> Map<String, Value> {
    let mut options: Map<String, Value> = ingot_protocol::ollama::OPTIONS
        .iter()
        .map(|(name, _)| {
            let schema = match *name {
                // The bounds of the chat fields they set.
                "seed" => json!({"type": "integer"}),
                "top_k" => json!({"type": "integer", "minimum": -1, "maximum": i32::MAX}),
                "stop" => json!({"anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1}},
                ]}),
                "temperature" => json!({"type": "number", "minimum": 0, "maximum": 2}),
                "top_p" => json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
                "min_p" => json!({"type": "number", "minimum": 0, "maximum": 1}),
                "repeat_penalty" => json!({"type": "number", "exclusiveMinimum": 0, "maximum": 2}),
                _ => json!({"type": "number", "minimum": -2, "maximum": 2}),
            };
            (name.to_string(), schema)
        })
        .collect();
    options.insert("num_ctx".into(), json!({"type": "integer"}));
    options.insert(
        "num_predict".into(),
        json!({"anyOf": [{"enum": [-1, -2]}, {"type": "integer", "minimum": 1}]}),
    );
    let call = json!({"type": "object", "required": ["function"], "additionalProperties": false, "properties": {
        "function": {"type": "object", "required": ["name", "arguments"], "properties": {
            "name": {"type": "string"}, "arguments": {"type": "object"},
        }},
    }});
    let message = json!({"type": "object", "required": ["role"], "additionalProperties": false, "properties": {
        "role": {"enum": ["system", "user", "assistant", "tool"]},
        "content": {"type": "string"},
        "tool_calls": {"type": "array", "items": call},
    }});
    json!({
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": message},
        "prompt": {"type": "string", "minLength": 1},
        "system": {"type": "string"},
        "raw": {"type": "boolean"},
        "tools": tools(),
        "format": {"anyOf": [{"const": "json"}, {"type": "object"}]},
        "options": {"type": "object", "properties": options, "additionalProperties": false},
        "stream": {"type": "boolean"},
        "keep_alive": {"type": ["string", "number"]},
        // Thinking is not separated: only false (or absent).
        "think": {"const": false},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "truncate": {"type": "boolean"},
        "dimensions": {"type": "integer", "minimum": 1},
    })
    .as_object()
    .cloned()
    .unwrap_or_default()
}

fn ollama_body(fields: &[&str], required: &[&str]) -> Value {
    closed(listed(fields, &ollama_typed()), required)
}

/// A JSON object with these required fields (a body built by hand).
fn object_with(required: &[&str]) -> Value {
    json!({"type": "object", "required": required})
}

/// The description of one route; `None` for one this module does not know
/// (the tests make sure there is none).
fn operation(s: &mut Schemas, method: &str, path: &str) -> Option<Value> {
    use ingot_protocol::{anthropic, chat, completions, models, ollama, responses, tokenize};

    let page = ingot_web::ASSETS.iter().find(|a| a.0 == path);
    if let (Some(&(_, content_type, _)), "get") = (page, method) {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or(content_type)
            .trim();
        return Some(op(
            "A file of the web page (docs/web.md).",
            None,
            ok_text(media, json!({"type": "string"})),
        ));
    }
    let sse = "text/event-stream";
    Some(match (method, path) {
        ("post", "/v1/chat/completions") => op(
            "Chat completion (OpenAI).",
            Some(chat_body(s)),
            ok_streamed(
                s.written::<chat::ChatCompletion>(),
                sse,
                s.written::<chat::ChatCompletionChunk>(),
            ),
        ),
        ("post", "/v1/completions") => op(
            "Text completion (OpenAI).",
            Some(completions_body(s)),
            ok_streamed(
                s.written::<completions::Completion>(),
                sse,
                s.written::<completions::Completion>(),
            ),
        ),
        ("get", "/v1/models") => op(
            "The served models.",
            None,
            ok_json(s.written::<models::ModelList>()),
        ),
        ("get", "/v1/models/{id}") => op(
            "One served model.",
            None,
            ok_json(s.written::<models::ModelCard>()),
        ),
        ("post", "/v1/embeddings") => {
            let embedding = json!({"type": "object", "required": ["object", "index", "embedding"], "properties": {
                "object": {"const": "embedding"},
                "index": {"type": "integer"},
                "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]},
            }});
            op(
                "Embeddings (OpenAI).",
                Some(embeddings_body()),
                ok_json(json!({"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
                    "object": {"const": "list"},
                    "data": {"type": "array", "items": embedding},
                    "model": {"type": "string"},
                    "usage": {"type": "object"},
                }})),
            )
        }
        ("post", "/v1/messages") => op(
            "Messages (Anthropic).",
            Some(anthropic_body()),
            ok_streamed(
                s.written::<anthropic::Message>(),
                sse,
                json!({"type": "object", "required": ["type"]}),
            ),
        ),
        ("post", "/v1/responses") => {
            let response = json!({"type": "object", "required": ["id", "object", "status", "output"],
                "properties": {"object": {"const": "response"}, "output": {"type": "array"}}});
            op(
                "Create a response (OpenAI Responses).",
                Some(responses_body(s)),
                ok_streamed(response, sse, json!({"type": "object", "required": ["type"]})),
            )
        }
        ("get", "/v1/responses/{id}") => op(
            "A stored response.",
            None,
            ok_json(object_with(&["id", "object", "status", "output"])),
        ),
        ("delete", "/v1/responses/{id}") => op(
            "Delete a stored response.",
            None,
            ok_json(s.written::<responses::Deleted>()),
        ),
        ("post", "/api/chat") => op(
            "Chat (Ollama).",
            Some(ollama_body(&ollama::CHAT_FIELDS, &["model", "messages"])),
            ok_streamed(
                s.written::<ollama::ChatChunk>(),
                "application/x-ndjson",
                s.written::<ollama::ChatChunk>(),
            ),
        ),
        ("post", "/api/generate") => op(
            "Generate (Ollama).",
            Some(ollama_body(&ollama::GENERATE_FIELDS, &["model", "prompt"])),
            ok_streamed(
                s.written::<ollama::GenerateChunk>(),
                "application/x-ndjson",
                s.written::<ollama::GenerateChunk>(),
            ),
        ),
        ("post", "/api/embed") => op(
            "Embeddings (Ollama).",
            Some(ollama_body(&ollama::EMBED_FIELDS, &["model", "input"])),
            ok_json(json!({"type": "object", "required": ["model", "embeddings"], "properties": {
                "embeddings": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            }})),
        ),
        ("get", "/api/tags") => op(
            "The served models (Ollama).",
            None,
            ok_json(json!({"type": "object", "required": ["models"], "properties": {
                "models": {"type": "array", "items": object_with(&["name", "model"])},
            }})),
        ),
        ("post", "/api/show") => op(
            "A model's details (Ollama).",
            Some(closed(
                listed(
                    &["model", "name", "verbose"],
                    json!({"model": {"type": "string"}, "name": {"type": "string"}, "verbose": {"type": "boolean"}})
                        .as_object()
                        .unwrap_or(&Map::new()),
                ),
                &[],
            )),
            ok_json(json!({"type": "object"})),
        ),
        ("get", "/api/version") => op(
            "The Ollama API version served.",
            None,
            ok_json(json!({"type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}})),
        ),
        ("post", "/tokenize") => op(
            "Token ids of a prompt or a conversation (vLLM's).",
            Some(json!({"allOf": [s.read::<tokenize::TokenizeRequest>(), {"oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}}},
                {"required": ["messages"], "properties": {
                    "messages": {"type": "array", "minItems": 1, "items": chat_message()},
                    "prompt": {"type": "null"},
                }},
            ]}]})),
            ok_json(s.written::<tokenize::TokenizeResponse>()),
        ),
        ("post", "/detokenize") => op(
            "Text of token ids (vLLM's).",
            Some(s.read::<tokenize::DetokenizeRequest>()),
            ok_json(s.written::<tokenize::DetokenizeResponse>()),
        ),
        ("get", "/tokenizer_info") => op(
            "The tokenizer's special tokens (vLLM's).",
            None,
            ok_json(s.written::<tokenize::TokenizerInfo>()),
        ),
        ("get", "/health") => op(
            "Liveness: 200 with no body.",
            None,
            json!({"200": {"description": "Alive"}}),
        ),
        ("get", "/ready") => op(
            "Readiness: 200 once the models are loaded, 503 before and while draining.",
            None,
            ok_text("text/plain", json!({"type": "string"})),
        ),
        ("get", "/metrics") => op(
            "Prometheus metrics (text exposition format).",
            None,
            ok_text("text/plain", json!({"type": "string"})),
        ),
        ("get", "/openapi.json") => op(
            "This description.",
            None,
            ok_json(json!({"type": "object", "required": ["openapi", "paths"]})),
        ),
        ("get", "/admin/flags") => op(
            "Feature flags and their rollout (admin).",
            None,
            ok_json(object_with(&["object", "data"])),
        ),
        ("get", "/admin/config") => op(
            "The running configuration, key hashes redacted (admin).",
            None,
            ok_json(object_with(&["config", "sources", "api_keys"])),
        ),
        ("post", "/admin/reload") => op(
            "Re-read the configuration (admin).",
            None,
            ok_json(object_with(&["applied", "needs_restart"])),
        ),
        ("post", "/admin/cache/purge") => op(
            "Empty the response cache, of one model or all (admin); the body may be empty.",
            Some(closed(
                listed(
                    &["model"],
                    json!({"model": {"type": ["string", "null"]}})
                        .as_object()
                        .unwrap_or(&Map::new()),
                ),
                &[],
            )),
            ok_json(object_with(&["purged", "model"])),
        ),
        ("get", "/admin/models") => op(
            "Every configured model, its state and memory (admin).",
            None,
            ok_json(object_with(&["object", "data"])),
        ),
        ("get", "/admin/slo") => op(
            "The SLO report (admin).",
            None,
            ok_json(json!({"type": "object"})),
        ),
        ("post", "/admin/models/{id}/{action}") => op(
            "Load, unload, pin or unpin a model (admin).",
            None,
            ok_json(object_with(&["id", "action", "state"])),
        ),
        ("get", "/ui/live") => op(
            "The dashboard's figures (docs/web.md).",
            None,
            ok_json(json!({"type": "object"})),
        ),
        _ => return None,
    })
}
