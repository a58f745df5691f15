//! `ingot inspect`: what a model file is, without loading its weights.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::model;
use crate::settings::LogArgs;

/// Flags of `ingot inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A GGUF file, a Hugging Face model directory, or a Hub model id
    /// `ORG/NAME[@REVISION][:FILE_OR_QUANT]` (the local Hub cache, else a
    /// download).
    path: PathBuf,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Runs the command. The report goes out in one write; a reader that has
/// gone (`ingot inspect M | head`) ends it quietly, as other tools do.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let report = report(&args)?;
    match std::io::stdout().lock().write_all(report.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => Ok(written?),
    }
}

/// The lines `ingot inspect` prints.
fn report(args: &InspectArgs) -> anyhow::Result<String> {
    let mut out = String::new();
    let (path, _) = crate::hub::resolve(&args.path, &crate::settings::env())?;
    let (files, tok) = model::open(&path, ingot_config::LoadFormat::Auto, None)?;
    let c = &files.config;
    writeln!(out, "path:            {}", path.display())?;
    writeln!(out, "format:          {}", files.format)?;
    writeln!(out, "architecture:    {}", c.architecture.name())?;
    writeln!(
        out,
        "parameters:      {} ({:.1} M)",
        c.num_parameters(),
        c.num_parameters() as f64 / 1e6
    )?;
    writeln!(out, "tensor types:    {}", tensor_types(&files))?;
    writeln!(out, "context length:  {}", c.max_context)?;
    writeln!(
        out,
        "shape:           {} layers, hidden {}, ffn {}, {} q heads / {} kv heads, head_dim {}",
        c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    )?;
    if let Some(moe) = &c.block.moe {
        let dense = match moe.dense_layers.as_slice() {
            [] => String::new(),
            layers => format!(", dense MLP on layers {layers:?}"),
        };
        writeln!(
            out,
            "experts:         {} per layer, top {} per token, width {}, weights {}{dense}",
            moe.num_experts,
            moe.experts_per_token,
            moe.expert_intermediate_size,
            if moe.normalize_top_k {
                "renormalised over the top k"
            } else {
                "softmax probabilities"
            },
        )?;
        writeln!(
            out,
            "active params:   {} ({:.1} M) per token",
            c.num_active_params(),
            c.num_active_params() as f64 / 1e6
        )?;
    }
    writeln!(out, "vocab size:      {}", c.vocab_size)?;
    writeln!(
        out,
        "rope:            theta {} scaling {:?}",
        c.rope.theta,
        scaling_name(&c.rope.scaling)
    )?;
    writeln!(
        out,
        "tied embeddings: {}, qkv bias: {}, qk norm: {}",
        c.tie_word_embeddings, c.qkv_bias, c.qk_norm
    )?;
    writeln!(out, "tokenizer:       {}", tok.kind())?;
    let sp = tok.special_tokens();
    let named = [
        ("bos", &sp.bos),
        ("eos", &sp.eos),
        ("unk", &sp.unk),
        ("pad", &sp.pad),
    ];
    let mut specials: Vec<String> = named
        .iter()
        .filter_map(|(name, t)| {
            t.as_ref()
                .map(|t| format!("{name}={:?} ({})", t.text, t.id))
        })
        .collect();
    let stops: Vec<String> = sp
        .stop
        .iter()
        .map(|t| format!("{:?} ({})", t.text, t.id))
        .collect();
    specials.push(format!("stop=[{}]", stops.join(", ")));
    writeln!(out, "special tokens:  {}", specials.join(", "))?;
    writeln!(
        out,
        "add bos/eos:     {}/{} ({} special tokens)",
        sp.add_bos, sp.add_eos, sp.n_special
    )?;
    match tok.chat_template() {
        Some(t) => writeln!(out, "chat template:\n{t}")?,
        None => writeln!(out, "chat template:   none")?,
    }
    Ok(out)
}

/// Each storage type with its tensor count and, for a GGUF, the bytes it
/// stores (what a backend that keeps the blocks holds: the CPU's native
/// path, CUDA's `cuda_weights = "native"` for Q8_0).
fn tensor_types(files: &ingot_models::ModelFiles) -> String {
    let Some(gguf) = &files.gguf else {
        let bytes: std::collections::BTreeMap<_, _> =
            files.tensors.dtype_bytes().into_iter().collect();
        let types = files.tensors.dtype_summary().into_iter();
        return types
            .map(|(t, n)| match bytes.get(&t) {
                Some(b) => format!("{t} x{n} ({:.1} MB)", *b as f64 / 1e6),
                None => format!("{t} x{n}"),
            })
            .collect::<Vec<_>>()
            .join(", ");
    };
    let mut by_type = std::collections::BTreeMap::<&str, (usize, usize)>::new();
    for t in gguf.tensors() {
        let entry = by_type.entry(t.ggml_type.name()).or_default();
        entry.0 += 1;
        entry.1 += gguf.tensor_bytes(t).len();
    }
    by_type
        .into_iter()
        .map(|(t, (n, bytes))| format!("{t} x{n} ({:.1} MB)", bytes as f64 / 1e6))
        .collect::<Vec<_>>()
        .join(", ")
}

fn scaling_name(s: &ingot_models::RopeScaling) -> &'static str {
    match s {
        ingot_models::RopeScaling::None => "none",
        ingot_models::RopeScaling::Linear { .. } => "linear",
        ingot_models::RopeScaling::Llama3 { .. } => "llama3",
        ingot_models::RopeScaling::FreqFactors(_) => "freq factors",
    }
}
