//! `GET /openapi.json`: the description names every route served, each
//! request field the parsers read, and every answer's shape (errors in
//! the dialect of their path).

use axum::http::{Method, StatusCode};
use ingot_protocol::fields::{Field, Policy};
use ingot_server::openapi::{document, served};
use serde_json::{json, Map, Value};

use super::harness::*;

#[test]
fn every_route_is_described_and_nothing_else() {
    let doc = document();
    for (method, path) in served() {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is served but not described (crates/server/src/openapi.rs)"
        );
    }
    let mut described = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            described.push((method.clone(), path.clone()));
        }
    }
    assert_eq!(described.len(), served().len(), "{described:?}");
    // Operation ids are unique and every link names one.
    let ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .map(|op| op["operationId"].as_str().unwrap())
        .collect();
    let unique: std::collections::BTreeSet<&&str> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    let text = doc.to_string();
    for (i, _) in text.match_indices("\"operationId\":\"") {
        let id: String = text[i + 15..].chars().take_while(|c| *c != '"').collect();
        assert!(ids.contains(&id.as_str()), "a link to {id}");
    }
    assert_eq!(doc["openapi"], "3.1.0");
}

fn properties(doc: &Value, path: &str) -> Map<String, Value> {
    doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

fn sorted<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut names: Vec<String> = names.map(String::from).collect();
    names.sort();
    names
}

#[test]
fn request_bodies_name_and_type_every_field_the_parsers_read() {
    let doc = document();
    let policies: [(&str, &[Field]); 4] = [
        ("/v1/chat/completions", &ingot_protocol::fields::CHAT),
        ("/v1/completions", &ingot_protocol::fields::COMPLETIONS),
        ("/v1/embeddings", ingot_protocol::fields::EMBEDDINGS),
        ("/v1/responses", ingot_protocol::fields::RESPONSES),
    ];
    for (path, fields) in policies {
        let props = properties(&doc, path);
        let top = fields.iter().filter(|f| !f.name.contains('.'));
        assert_eq!(
            sorted(props.keys().map(String::as_str)),
            sorted(top.clone().map(|f| f.name)),
            "{path}"
        );
        for f in top.filter(|f| f.policy == Policy::Honoured) {
            assert_ne!(props[f.name], json!({}), "{path}: {} has no type", f.name);
        }
    }
    let lists: [(&str, &[&str]); 4] = [
        ("/v1/messages", &ingot_protocol::anthropic::FIELDS),
        ("/api/chat", &ingot_protocol::ollama::CHAT_FIELDS),
        ("/api/generate", &ingot_protocol::ollama::GENERATE_FIELDS),
        ("/api/embed", &ingot_protocol::ollama::EMBED_FIELDS),
    ];
    for (path, fields) in lists {
        let props = properties(&doc, path);
        assert_eq!(
            sorted(props.keys().map(String::as_str)),
            sorted(fields.iter().copied()),
            "{path}"
        );
        for f in fields {
            assert_ne!(props[*f], json!({}), "{path}: {f} has no type");
        }
    }
}

#[test]
fn every_reference_resolves() {
    let doc = document();
    let text = doc.to_string();
    let prefix = "#/components/schemas/";
    for (i, _) in text.match_indices(prefix) {
        let name: String = text[i + prefix.len()..]
            .chars()
            .take_while(|c| *c != '"')
            .collect();
        assert!(
            doc["components"]["schemas"][&name].is_object(),
            "{name} is referred to but not defined"
        );
    }
}

/// The error schema's required keys, checked on a real error body.
fn assert_error_shape(doc: &Value, path: &str, method: &str, reply: &Reply) {
    let reference = doc["paths"][path][method]["responses"]["default"]["content"]
        ["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap();
    let name = reference.rsplit('/').next().unwrap();
    let schema = &doc["components"]["schemas"][name];
    let body = reply.json();
    for key in schema["required"].as_array().unwrap() {
        assert!(
            body.get(key.as_str().unwrap()).is_some(),
            "{method} {path}: {body} lacks {key} ({name})"
        );
    }
    if name == "OllamaError" {
        assert!(body["error"].is_string(), "{path}: {body}");
    } else {
        assert!(body["error"]["message"].is_string(), "{path}: {body}");
    }
}

#[tokio::test]
async fn the_served_document_is_the_description_and_every_path_is_a_route() {
    let server = Server::new();
    let served_doc = server.get("/openapi.json").await;
    assert_eq!(served_doc.header("content-type"), "application/json");
    let doc = served_doc.ok();
    assert_eq!(doc, document());
    for (method, path) in served() {
        // A path parameter that names nothing: a 404 from the handler,
        // not the router's fallback.
        let concrete = path.replace("{id}", "nothing").replace("{action}", "pin");
        let request = with_method(
            raw_post(&concrete, "{\"not_a_field\": 1}"),
            Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
        );
        let reply = server.send(request).await;
        assert_ne!(
            reply.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        let fallback = reply.status == StatusCode::NOT_FOUND
            && reply.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no route for"));
        assert!(!fallback, "{method} {path} is described but not routed");
        if reply.status.is_client_error() {
            assert_error_shape(&doc, path, method, &reply);
        }
    }
}

#[tokio::test]
async fn the_description_needs_a_key_unless_open_paths_lists_it() {
    let entry = api_key("k", "sk-test-SECRET");
    let keyed = Server::with(|c| c.auth.api_keys = vec![entry.clone()]);
    let refused = keyed.get("/openapi.json").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let with_key = with_header(get("/openapi.json"), "x-api-key", "sk-test-SECRET");
    assert_eq!(keyed.send(with_key).await.ok(), document());
    let open = Server::with(|c| {
        c.auth.api_keys = vec![entry];
        c.auth.open_paths.push("/openapi.json".into());
    });
    assert_eq!(open.get("/openapi.json").await.ok(), document());
}
