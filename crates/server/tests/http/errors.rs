//! Bad input: every refusal is a status and the OpenAI error shape, decided
//! before the engine stage (it never sees the request).

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use super::harness::*;

const INVALID: &str = "invalid_request_error";

/// Posts `body` to `path`; asserts a 400 naming `param`; the message.
async fn refused(server: &Server, path: &str, body: Value, param: &str) -> String {
    server.post(path, body).await.invalid(Some(param))
}

#[tokio::test]
async fn malformed_json_and_non_objects_are_400() {
    let server = Server::new();
    for path in ["/v1/chat/completions", "/v1/completions", "/tokenize"] {
        let reply = server
            .send(raw_post(path, r#"{"model": "m", "messages": ["#))
            .await;
        let message = reply.invalid(None);
        assert!(message.starts_with("malformed JSON body"), "{message}");
    }
    let reply = server
        .send(raw_post("/v1/chat/completions", "not json at all"))
        .await;
    reply.invalid(None);
    let reply = server
        .send(raw_post("/v1/chat/completions", "[1, 2, 3]"))
        .await;
    assert_eq!(
        reply.invalid(None),
        "the request body must be a JSON object"
    );
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn a_wrong_type_names_the_field() {
    let server = Server::new();
    let cases = [
        ("temperature", json!("hot")),
        ("max_tokens", json!("many")),
        ("n", json!(1.5)),
        ("stream", json!("yes")),
        ("messages", json!("hello")),
        ("stop", json!(7)),
    ];
    for (field, value) in cases {
        let body = chat(CHAT, json!({ field: value }));
        let message = refused(&server, "/v1/chat/completions", body, field).await;
        assert!(message.contains(field), "{field}: {message}");
    }
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn an_out_of_range_value_names_the_field_and_the_value() {
    let server = Server::new();
    let cases = [
        ("temperature", json!(-1)),
        ("temperature", json!(-0.5)),
        ("temperature", json!(5)),
        ("top_p", json!(2)),
        ("top_p", json!(1.5)),
        ("top_p", json!(0)),
        ("n", json!(0)),
        ("n", json!(17)),
        ("max_tokens", json!(-1)),
        ("max_tokens", json!(0)),
        ("max_completion_tokens", json!(-1)),
        ("presence_penalty", json!(3)),
        ("frequency_penalty", json!(-3)),
        ("top_k", json!(-5)),
        ("min_p", json!(1.5)),
        ("repetition_penalty", json!(0)),
        ("priority", json!("urgent")),
    ];
    for (field, value) in cases {
        let body = chat(CHAT, json!({ field: value }));
        let message = refused(&server, "/v1/chat/completions", body, field).await;
        let shown = value.as_str().map_or(value.to_string(), String::from);
        assert!(message.contains(field), "{field}: {message}");
        assert!(message.contains(&shown), "{field}: {message}");
    }
    let body = chat(CHAT, json!({"logprobs": true, "top_logprobs": 50}));
    let message = refused(&server, "/v1/chat/completions", body, "top_logprobs").await;
    assert!(message.contains("50"), "{message}");
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn the_temperature_bound_is_in_the_message() {
    let server = Server::new();
    let body = chat(CHAT, json!({"temperature": 5}));
    let message = refused(&server, "/v1/chat/completions", body, "temperature").await;
    assert!(message.contains('5') && message.contains('2'), "{message}");
}

#[tokio::test]
async fn completions_name_their_out_of_range_fields() {
    let server = Server::new();
    let cases = [
        ("logprobs", json!(50)),
        ("temperature", json!(5)),
        ("max_tokens", json!(-1)),
    ];
    for (field, value) in cases {
        let body = completion(CHAT, json!({ field: value }));
        let message = refused(&server, "/v1/completions", body, field).await;
        assert!(message.contains(&value.to_string()), "{field}: {message}");
    }
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn stop_strings_are_bounded_in_number() {
    let server = Server::new();
    let stops: Vec<String> = (0..100).map(|i| format!("stop{i}")).collect();
    let body = chat(CHAT, json!({ "stop": stops }));
    refused(&server, "/v1/chat/completions", body, "stop").await;
    let body = chat(CHAT, json!({"stop": &stops[..4]}));
    server.post("/v1/chat/completions", body).await.ok();
    assert_eq!(server.engine.seen()[0].engine.stop.stop_strings, stops[..4]);
}

#[tokio::test]
async fn unknown_fields_are_refused_by_name_unless_configured_away() {
    let server = Server::new();
    let body = chat(CHAT, json!({"frobnicate": {"deep": [1]}}));
    refused(&server, "/v1/chat/completions", body, "frobnicate").await;
    let body = completion(
        CHAT,
        json!({"stream": true, "stream_options": {"bogus": true}}),
    );
    refused(&server, "/v1/completions", body, "stream_options.bogus").await;
    let body = json!({"model": CHAT, "input": "x", "frobnicate": 1});
    refused(&server, "/v1/embeddings", body, "frobnicate").await;
    // Nulls are as good as absent; known fields pass.
    let body = chat(
        CHAT,
        json!({"audio": null, "metadata": {"k": "v"}, "store": false}),
    );
    server.post("/v1/chat/completions", body).await.ok();
    assert_eq!(server.engine.calls(), 1);

    let lenient = Server::with(|c| c.server.ignore_unknown_fields = true);
    let body = chat(
        CHAT,
        json!({"frobnicate": {"deep": [1]}, "logit_bias_v2": 3}),
    );
    lenient.post("/v1/chat/completions", body).await.ok();
    let body = completion(CHAT, json!({"frobnicate": true}));
    lenient.post("/v1/completions", body).await.ok();
    // Known fields ingot cannot honour are refused either way.
    let body = chat(CHAT, json!({"audio": {"voice": "alloy"}}));
    refused(&lenient, "/v1/chat/completions", body, "audio").await;
}

#[tokio::test]
async fn fields_ingot_cannot_honour_are_refused_by_name() {
    let server = Server::new();
    let chats = [
        ("audio", json!({"voice": "alloy", "format": "wav"})),
        ("modalities", json!(["text", "audio"])),
        ("prediction", json!({"type": "content", "content": "x"})),
        ("store", json!(true)),
        ("service_tier", json!("flex")),
        ("web_search_options", json!({})),
        ("functions", json!([{"name": "f"}])),
    ];
    for (field, value) in chats {
        let body = chat(CHAT, json!({ field: value }));
        let message = refused(&server, "/v1/chat/completions", body, field).await;
        assert!(
            message.starts_with(&format!("{field} is not supported")),
            "{message}"
        );
    }
    for (field, value) in [("suffix", json!("the end")), ("best_of", json!(3))] {
        let body = completion(CHAT, json!({ field: value }));
        refused(&server, "/v1/completions", body, field).await;
    }
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn logit_bias_reaches_the_engine_sorted_and_bad_ones_are_named() {
    let server = Server::new();
    let body = chat(CHAT, json!({"logit_bias": {"20": 100, "3": -100}}));
    server.post("/v1/chat/completions", body).await.ok();
    let seen = server.engine.seen();
    assert_eq!(
        seen[0].engine.sampling.logit_bias,
        [(3, -100.0), (20, 100.0)]
    );
    for bad in [json!({"3": 101}), json!({"x": 1}), json!({"3": -100.5})] {
        let body = completion(CHAT, json!({ "logit_bias": bad }));
        let reply = server.post("/v1/completions", body).await;
        let (status, error) = (reply.status, reply.json());
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        let param = error["error"]["param"].as_str().unwrap_or_default();
        assert!(param.starts_with("logit_bias"), "{bad}: {error}");
    }
}

#[tokio::test]
async fn missing_or_empty_prompts_name_their_field() {
    let server = Server::new();
    let chats = [json!({"model": CHAT}), chat(CHAT, json!({"messages": []}))];
    for body in chats {
        refused(&server, "/v1/chat/completions", body, "messages").await;
    }
    let no_role = chat(CHAT, json!({"messages": [{"content": "no role"}]}));
    refused(&server, "/v1/chat/completions", no_role, "messages[0].role").await;
    for body in [
        json!({"model": CHAT}),
        completion(CHAT, json!({"prompt": []})),
    ] {
        refused(&server, "/v1/completions", body, "prompt").await;
    }
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn an_unknown_model_is_404_listing_the_models() {
    let server = Server::new();
    let replies = [
        server
            .post("/v1/chat/completions", chat("nope", json!({})))
            .await,
        server
            .post("/v1/completions", completion("nope", json!({})))
            .await,
        server
            .post("/tokenize", json!({"model": "nope", "prompt": "hi"}))
            .await,
    ];
    for reply in replies {
        let message = reply.error(
            StatusCode::NOT_FOUND,
            INVALID,
            Some("model"),
            Some("model_not_found"),
        );
        assert_eq!(
            message,
            "the model 'nope' does not exist; available: m, plain, embed"
        );
    }
    server.assert_never_built();
}

#[tokio::test]
async fn an_embedding_model_serves_no_generation() {
    let server = Server::new();
    for reply in [
        server
            .post("/v1/chat/completions", chat(EMBED, json!({})))
            .await,
        server
            .post("/v1/completions", completion(EMBED, json!({})))
            .await,
    ] {
        let message = reply.error(
            StatusCode::BAD_REQUEST,
            INVALID,
            Some("model"),
            Some("model_not_supported"),
        );
        assert!(message.contains("it serves /v1/embeddings"), "{message}");
    }
    server.assert_never_built();
}

#[tokio::test]
async fn a_model_without_chat_template_refuses_chat() {
    let server = Server::new();
    let body = chat(PLAIN, json!({}));
    let message = refused(&server, "/v1/chat/completions", body, "messages").await;
    assert_eq!(
        message,
        "this model has no chat template; use /v1/completions"
    );
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_with_or_without_a_length() {
    let server = Server::new();
    let content = "x".repeat(MAX_BODY);
    let big = chat(
        CHAT,
        json!({"messages": [{"role": "user", "content": content}]}),
    );
    let reply = server.post("/v1/chat/completions", big.clone()).await;
    let message = reply.error(
        StatusCode::PAYLOAD_TOO_LARGE,
        INVALID,
        None,
        Some("request_too_large"),
    );
    assert!(message.contains(&MAX_BODY.to_string()), "{message}");
    // Chunked: no Content-Length to refuse on, the limit counts the bytes.
    let bytes = big.to_string().into_bytes();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(256).map(|c| Ok(c.to_vec())).collect();
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    let reply = server.send(raw_post("/v1/chat/completions", body)).await;
    reply.error(
        StatusCode::PAYLOAD_TOO_LARGE,
        INVALID,
        None,
        Some("request_too_large"),
    );
    assert_eq!(server.engine.calls(), 0);
    // Under the limit, the next request is served.
    server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await
        .ok();
}

#[tokio::test]
async fn unknown_routes_are_404_and_wrong_methods_405() {
    let server = Server::new();
    let reply = server.get("/v1/nothing").await;
    let message = reply.error(StatusCode::NOT_FOUND, INVALID, None, None);
    assert_eq!(message, "no route for /v1/nothing");
    let reply = server.get("/v1/chat/completions").await;
    let message = reply.error(StatusCode::METHOD_NOT_ALLOWED, INVALID, None, None);
    assert_eq!(message, "method not allowed: GET /v1/chat/completions");
    let reply = server
        .send(with_method(get("/v1/models"), Method::DELETE))
        .await;
    reply.error(StatusCode::METHOD_NOT_ALLOWED, INVALID, None, None);
}

#[tokio::test]
async fn tokenizer_endpoints_refuse_bad_input() {
    let server = Server::new();
    refused(&server, "/tokenize", json!({}), "prompt").await;
    let message = refused(
        &server,
        "/detokenize",
        json!({"tokens": [100_000]}),
        "tokens",
    )
    .await;
    assert!(message.contains("100000"), "{message}");
    refused(&server, "/detokenize", json!({"tokens": "abc"}), "tokens").await;
}

#[tokio::test]
async fn an_answer_breaking_unique_items_is_a_422_naming_the_field() {
    let server = Server::new();
    server.engine.set(Mode::Say(r#"{"tags":["a","a"]}"#.into()));
    let schema = json!({"type": "object", "properties": {"tags": {"type": "array",
        "items": {"type": "string"}, "uniqueItems": true}}, "required": ["tags"]});
    let format = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}});
    let body = chat(CHAT, json!({"max_tokens": 30, "response_format": format}));
    let reply = server.post("/v1/chat/completions", body).await;
    let message = reply.error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request_error",
        Some("response_format.json_schema.schema"),
        Some("invalid_output"),
    );
    assert!(
        message.contains("/tags") && message.contains("uniqueItems"),
        "{message}"
    );
    // An answer that keeps the items apart passes.
    server.engine.set(Mode::Say(r#"{"tags":["a","b"]}"#.into()));
    let body = chat(CHAT, json!({"max_tokens": 30, "response_format": format}));
    server.post("/v1/chat/completions", body).await.ok();
}

/// A chat request whose answer follows JSON schema `schema`.
fn with_schema(schema: &Value) -> Value {
    let format = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}});
    chat(CHAT, json!({"max_tokens": 8, "response_format": format}))
}

/// A chat request offering one tool with `parameters` under `choice`.
fn with_tool(parameters: &Value, choice: &str) -> Value {
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": parameters}});
    chat(
        CHAT,
        json!({"max_tokens": 8, "tools": [tool], "tool_choice": choice}),
    )
}

#[tokio::test]
async fn a_self_referential_schema_is_a_400_naming_the_field() {
    let server = Server::new();
    let itself = json!({"$ref": "#"});
    let def = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
        "$defs": {"a": {"$ref": "#/$defs/a"}}});
    for schema in [&itself, &def] {
        let body = with_schema(schema);
        let message = refused(
            &server,
            "/v1/chat/completions",
            body,
            "response_format.json_schema.schema",
        )
        .await;
        assert!(message.contains("refers to itself"), "{message}");
    }
    // A tool's parameters, whatever the tool_choice: the same refusal.
    for choice in ["required", "auto", "none"] {
        let message = refused(
            &server,
            "/v1/chat/completions",
            with_tool(&itself, choice),
            "tools[0].function.parameters",
        )
        .await;
        assert!(message.contains("refers to itself"), "{choice}: {message}");
    }
    // Recursion that nests is fine.
    let tree = json!({"type": "object", "properties": {"child": {"$ref": "#"}}});
    server
        .post("/v1/chat/completions", with_schema(&tree))
        .await
        .ok();
    assert_eq!(server.engine.calls(), 1);
}

/// xorshift64*: a fixed sequence of schemas on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }
}

/// A random schema of at most `depth` levels: every keyword family the
/// grammar engine knows, contradictory bounds, junk values and references
/// (to the root, to `$defs`, to nowhere; nested or not).
fn random_schema(rng: &mut Rng, depth: u32) -> Value {
    let leaf = depth == 0;
    match rng.below(if leaf { 9 } else { 17 }) {
        0 => {
            let t = rng.pick(&["string", "integer", "number", "boolean", "null"]);
            json!({ "type": t })
        }
        1 => json!({"type": "string", "minLength": rng.below(6), "maxLength": rng.below(6)}),
        2 => {
            let (lo, hi) = (rng.below(9) as i64 - 4, rng.below(9) as i64 - 4);
            json!({"type": "integer", "minimum": lo, "maximum": hi})
        }
        3 => {
            let n = rng.below(5) as usize;
            let values: Vec<Value> = [json!("a"), json!(1), json!(null), json!([]), json!({})]
                .into_iter()
                .take(n)
                .collect();
            json!({ "enum": values })
        }
        4 => json!({ "const": rng.pick(&["x", "1", "{}"]) }),
        5 => {
            let pattern = rng.pick(&["^a+$", "(", "[a-", "a{2,1}", "\\d{3}"]);
            json!({"type": "string", "pattern": pattern})
        }
        6 => {
            let target = rng.pick(&["#", "#/$defs/d0", "#/$defs/d1", "#/nowhere", "other.json"]);
            json!({ "$ref": target })
        }
        7 => {
            let kind = rng.pick(&[json!("str"), json!(5), json!([]), json!("object")]);
            json!({"type": kind, "format": rng.pick(&["date", "email", "nope"])})
        }
        8 => rng.pick(&[json!(true), json!(false), json!({}), json!({"not": {}})]),
        9 | 10 => {
            let n = rng.below(4);
            let props: serde_json::Map<String, Value> = (0..n)
                .map(|i| (format!("p{i}"), random_schema(rng, depth - 1)))
                .collect();
            let required: Vec<String> = (0..rng.below(n + 1)).map(|i| format!("p{i}")).collect();
            let extra = rng.below(2) == 0;
            json!({"type": "object", "properties": props, "required": required,
                "additionalProperties": extra})
        }
        11 | 12 => {
            let items = random_schema(rng, depth - 1);
            json!({"type": "array", "items": items, "minItems": rng.below(4), "maxItems": rng.below(4)})
        }
        13 => json!({"anyOf": [random_schema(rng, depth - 1), random_schema(rng, depth - 1)]}),
        14 => json!({"oneOf": [random_schema(rng, depth - 1)]}),
        15 => json!({"allOf": [random_schema(rng, depth - 1), {"$ref": "#"}]}),
        _ => {
            let required = rng.pick(&[json!(["next"]), json!([])]);
            json!({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": required})
        }
    }
}

#[tokio::test]
async fn no_random_schema_gets_a_5xx() {
    let server = Server::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut refused = 0;
    // `INGOT_FUZZ_CASES` runs more (10,000 for issue 37's figure).
    let cases = ingot_testkit::fuzz_cases(300) as usize;
    for i in 0..cases {
        let mut schema = random_schema(&mut rng, 3);
        if rng.below(2) == 0 {
            if let Value::Object(map) = &mut schema {
                let defs = json!({"d0": random_schema(&mut rng, 2), "d1": {"$ref": "#/$defs/d0"}});
                map.insert("$defs".into(), defs);
            }
        }
        let body = match i % 3 {
            0 => with_tool(&schema, ["required", "auto"][rng.below(2) as usize]),
            _ => with_schema(&schema),
        };
        let reply = server.post("/v1/chat/completions", body).await;
        assert!(
            !reply.status.is_server_error(),
            "{schema}: {} {}",
            reply.status,
            reply.text()
        );
        if reply.status.is_client_error() {
            let body = reply.json();
            assert!(body["error"]["message"].is_string(), "{body}");
            refused += 1;
        }
    }
    // Both kinds occur: the generator is not degenerate.
    assert!(
        (1..cases).contains(&refused),
        "{refused} of {cases} refused"
    );
}

#[tokio::test]
async fn a_tiny_positive_top_p_is_accepted() {
    let server = Server::new();
    let body = chat(CHAT, json!({"top_p": 1e-300, "max_tokens": 2}));
    server.post("/v1/chat/completions", body).await.ok();
    let top_p = server.engine.seen()[0].engine.sampling.top_p;
    assert!(top_p > 0.0 && top_p < 1e-30, "{top_p}");
    let message = refused(
        &server,
        "/v1/chat/completions",
        chat(CHAT, json!({"top_p": 0})),
        "top_p",
    )
    .await;
    assert!(message.ends_with("got 0"), "{message}");
}

#[tokio::test]
async fn a_tiny_positive_repetition_penalty_is_accepted() {
    // Found by schemathesis over /openapi.json (Ollama's repeat_penalty):
    // refused as "got 0" like top_p once was.
    let server = Server::new();
    let body = chat(CHAT, json!({"repetition_penalty": 1e-300, "max_tokens": 2}));
    server.post("/v1/chat/completions", body).await.ok();
    let penalty = server.engine.seen()[0].engine.sampling.repetition_penalty;
    assert!(penalty > 0.0 && penalty < 1e-30, "{penalty}");
    let body = json!({"model": CHAT, "prompt": "hi", "stream": false, "options": {"repeat_penalty": 1e-300}});
    server.post("/api/generate", body).await.ok();
}

#[tokio::test]
async fn an_empty_stop_string_is_refused_by_name() {
    let server = Server::new();
    for stop in [json!([""]), json!(["x", ""]), json!("")] {
        let body = completion(CHAT, json!({ "stop": stop }));
        let message = refused(&server, "/v1/completions", body, "stop").await;
        assert_eq!(message, "stop strings must not be empty");
    }
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn a_body_that_is_not_json_is_415() {
    let server = Server::new();
    let body = chat(CHAT, json!({})).to_string();
    for kind in [
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/xml",
    ] {
        let request = with_header(
            raw_post("/v1/chat/completions", body.clone()),
            "content-type",
            kind,
        );
        let reply = server.send(request).await;
        let message = reply.error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID,
            None,
            Some("unsupported_media_type"),
        );
        assert!(message.contains(kind), "{message}");
    }
    assert_eq!(server.engine.calls(), 0);
    // JSON by any of its names, no type, or curl -d's default: read as JSON.
    for kind in [
        Some("application/json; charset=utf-8"),
        Some("application/vnd.api+json"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut request = raw_post("/v1/chat/completions", body.clone());
        match kind {
            Some(kind) => request = with_header(request, "content-type", kind),
            None => {
                request.headers_mut().remove("content-type");
            }
        }
        server.send(request).await.ok();
    }
}

#[tokio::test]
async fn an_absurd_content_length_is_413_in_the_error_shape() {
    let server = Server::new();
    let request = with_header(
        raw_post("/v1/chat/completions", chat(CHAT, json!({})).to_string()),
        "content-length",
        "999999999999999",
    );
    let reply = server.send(request).await;
    reply.error(
        StatusCode::PAYLOAD_TOO_LARGE,
        INVALID,
        None,
        Some("request_too_large"),
    );
    assert_eq!(reply.header("connection"), "close");
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn a_tool_schema_feature_the_engine_cannot_enforce_is_refused_only_when_enforced() {
    let server = Server::new();
    let params =
        json!({"type": "object", "properties": {"d": {"type": "string", "format": "credit-card"}}});
    let reply = server
        .post("/v1/chat/completions", with_tool(&params, "required"))
        .await;
    let message = reply.error(
        StatusCode::BAD_REQUEST,
        INVALID,
        Some("tools[0].function.parameters"),
        Some("unsupported_feature"),
    );
    assert!(message.contains("credit-card"), "{message}");
    // Under auto nothing enforces it: the request goes on (to the fake
    // model's short context, which the tool preamble overflows).
    let reply = server
        .post("/v1/chat/completions", with_tool(&params, "auto"))
        .await;
    reply.error(
        StatusCode::BAD_REQUEST,
        INVALID,
        Some("messages"),
        Some("context_length_exceeded"),
    );
}
