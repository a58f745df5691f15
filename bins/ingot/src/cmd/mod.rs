//! One module per subcommand.

pub mod bench;
pub mod bench_load;
pub mod chat;
pub mod config;
pub mod generate;
pub mod inspect;
pub mod logits;
pub mod route;
pub mod score;
pub mod serve;
