//! One module per subcommand.

pub mod bench;
pub mod generate;
pub mod inspect;
pub mod logits;
pub mod serve;
