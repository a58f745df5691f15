//! One module per concern; `harness` (with `fake` and `tokenizer`) is
//! shared by all.

mod fake;
mod harness;
mod tokenizer;

mod anthropic;
mod auth;
mod chat;
mod completions;
mod cors;
mod errors;
mod fuzz;
mod info;
mod limits;
mod metrics;
mod ollama;
mod openapi;
mod reasoning;
mod request_ids;
mod responses;
mod sharing;
mod web;
