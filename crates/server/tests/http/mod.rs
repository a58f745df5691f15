//! One module per concern; `harness` (with `fake` and `tokenizer`) is
//! shared by all.

mod fake;
mod harness;
mod tokenizer;

mod auth;
mod chat;
mod completions;
mod errors;
mod info;
mod limits;
mod request_ids;
mod sharing;
