//! `ingot logits`: a prompt through the model (a prefill, then its last
//! token as a decode step), the last position's logits written to a file. The cross-backend and cross-framework
//! correctness checks (`tests/gpu/`) compare these files.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ingot_core::TokenId;
use ingot_kv_cache::BlockTable;
use ingot_runner::{ForwardBatch, SequenceChunk};

use crate::model::{load_runner, ModelArgs};
use crate::settings::FlagSet;

/// Flags of `ingot logits`.
#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Token ids, comma-separated.
    #[arg(long, conflicts_with = "prompt", value_delimiter = ',')]
    prompt_ids: Vec<TokenId>,
    /// Text to tokenize (with the tokenizer's BOS handling).
    #[arg(long)]
    prompt: Option<String>,
    /// Where to write the logits (little-endian f32, one row of vocab_size).
    #[arg(long)]
    out: PathBuf,
}

/// Runs the command: prints `{"device", "prompt_ids", "top": [[id, logit], ...]}`.
pub fn run(args: LogitsArgs) -> anyhow::Result<()> {
    let config = args.model.load(FlagSet::default())?.config;
    let (mut runner, tokenizer) = load_runner(&config, 1)?;
    let ids = match &args.prompt {
        Some(text) => tokenizer.encode(text, true)?,
        None => args.prompt_ids.clone(),
    };
    anyhow::ensure!(!ids.is_empty(), "give --prompt-ids or --prompt");
    let table = ingot_runner::solo_tables(runner.as_ref(), ids.len())?;
    // The prompt runs as a prefill of all but the last token, then the last
    // token as a decode step: the logits come from the decode path (the one
    // every generated token takes), with the prefill path behind its cache.
    let last = ids.len() - 1;
    if last > 0 {
        runner.forward(&one_chunk(&ids[..last], 0, &table))?;
    }
    let device = runner.device_name();
    let logits = runner.forward(&one_chunk(&ids[last..], last, &table))?;
    let mut file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    for v in logits {
        file.write_all(&v.to_le_bytes())?;
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top: Vec<(usize, f32)> = order.iter().take(5).map(|&i| (i, logits[i])).collect();
    println!(
        "{}",
        serde_json::json!({"device": device, "prompt_ids": ids, "top": top})
    );
    Ok(())
}

fn one_chunk<'a>(
    tokens: &'a [TokenId],
    start_pos: usize,
    tables: &'a [BlockTable],
) -> ForwardBatch<'a> {
    ForwardBatch {
        chunks: vec![SequenceChunk::with_tables(tokens, start_pos, tables)],
        ..ForwardBatch::default()
    }
}
