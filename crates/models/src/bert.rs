//! BERT-family encoder directories (`BertModel`, e.g. all-MiniLM-L6-v2):
//! `config.json`, safetensors weights, and the sentence-transformers files
//! (`modules.json`, `1_Pooling/config.json`) that say how token states
//! become one sentence embedding.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::hf::SafetensorsSource;
use crate::ModelError;

/// The encoder's shape, from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// Width of every token state.
    pub hidden_size: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_layers: usize,
    /// Attention heads (`hidden_size / num_heads` wide each).
    pub num_heads: usize,
    /// WordPiece vocabulary.
    pub vocab_size: usize,
    /// Longest input in tokens ([CLS] and [SEP] included).
    pub max_positions: usize,
    /// Token-type (segment) rows; single sentences use row 0.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
    /// How token states become a sentence embedding.
    pub pooling: Pooling,
    /// Whether the pooled vector is scaled to unit length.
    pub normalize: bool,
}

impl BertConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads.max(1)
    }

    /// Parameters (for memory budgets).
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let embed = (self.vocab_size + self.max_positions + self.type_vocab_size + 2) * h;
        let layer =
            4 * (h * h + h) + 2 * h * self.intermediate_size + self.intermediate_size + h + 4 * h;
        embed + self.num_layers * layer
    }
}

/// Sentence pooling over a sequence's token states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token (the attention mask's ones).
    Mean,
    /// The [CLS] token's state.
    Cls,
}

#[derive(Deserialize)]
struct RawBertConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    vocab_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "two")]
    type_vocab_size: usize,
    #[serde(default = "bert_eps")]
    layer_norm_eps: f64,
    #[serde(default = "gelu")]
    hidden_act: String,
    position_embedding_type: Option<String>,
}

fn two() -> usize {
    2
}
fn bert_eps() -> f64 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}

#[derive(Deserialize)]
struct RawPooling {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

#[derive(Deserialize)]
struct RawModule {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

/// Whether `path` is a directory (or its `config.json`) holding a BERT
/// encoder, read from `config.json`'s `model_type` / `architectures`.
pub fn is_bert(path: &Path) -> bool {
    let Some(config) = config_path(path) else {
        return false;
    };
    #[derive(Deserialize)]
    struct Names {
        #[serde(default)]
        architectures: Vec<String>,
        model_type: Option<String>,
    }
    std::fs::read_to_string(config)
        .ok()
        .and_then(|t| serde_json::from_str::<Names>(&t).ok())
        .is_some_and(|n| names_bert(&n.architectures, n.model_type.as_deref()))
}

fn names_bert(architectures: &[String], model_type: Option<&str>) -> bool {
    model_type == Some("bert") || architectures.iter().any(|a| a == "BertModel")
}

fn config_path(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        Some(path.join("config.json")).filter(|p| p.is_file())
    } else if path.file_name().is_some_and(|n| n == "config.json") {
        Some(path.to_path_buf())
    } else {
        None
    }
}

/// An opened encoder directory: its config and memory-mapped weights.
pub struct BertFiles {
    /// The directory.
    pub dir: PathBuf,
    /// The resolved config.
    pub config: BertConfig,
    /// The weights.
    pub tensors: SafetensorsSource,
}

/// Opens the BERT directory at `path` (or its `config.json`).
pub fn open_bert(path: &Path) -> Result<BertFiles, ModelError> {
    let config_file = config_path(path).ok_or_else(|| ModelError::UnknownFormat {
        path: path.to_path_buf(),
    })?;
    let dir = config_file.parent().unwrap_or(Path::new(".")).to_path_buf();
    let config = load_config(&config_file, &dir)?;
    let tensors = SafetensorsSource::open(&dir)?;
    Ok(BertFiles {
        dir,
        config,
        tensors,
    })
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::ConfigFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn load_config(config_file: &Path, dir: &Path) -> Result<BertConfig, ModelError> {
    let raw: RawBertConfig = read_json(config_file)?;
    if !names_bert(&raw.architectures, raw.model_type.as_deref()) {
        return Err(ModelError::InvalidConfig(
            "not a BERT encoder (model_type bert / BertModel)".into(),
        ));
    }
    if raw.hidden_act != "gelu" {
        return Err(ModelError::InvalidConfig(format!(
            "hidden_act '{}' is not supported for BERT (only gelu)",
            raw.hidden_act
        )));
    }
    if let Some(p) = raw.position_embedding_type.filter(|p| p != "absolute") {
        return Err(ModelError::InvalidConfig(format!(
            "position_embedding_type '{p}' is not supported (only absolute)"
        )));
    }
    if raw.num_attention_heads == 0 || !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
        return Err(ModelError::InvalidConfig(
            "hidden_size must be a multiple of num_attention_heads".into(),
        ));
    }
    let (pooling, normalize) = sentence_head(dir)?;
    Ok(BertConfig {
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_layers: raw.num_hidden_layers,
        num_heads: raw.num_attention_heads,
        vocab_size: raw.vocab_size,
        max_positions: raw.max_position_embeddings,
        type_vocab_size: raw.type_vocab_size.max(1),
        layer_norm_eps: raw.layer_norm_eps as f32,
        pooling,
        normalize,
    })
}

/// Pooling and normalisation from sentence-transformers' `modules.json`;
/// a plain BertModel directory without it gets mean pooling and unit
/// length, the sentence-transformers defaults.
fn sentence_head(dir: &Path) -> Result<(Pooling, bool), ModelError> {
    let modules_file = dir.join("modules.json");
    if !modules_file.is_file() {
        return Ok((Pooling::Mean, true));
    }
    let modules: Vec<RawModule> = read_json(&modules_file)?;
    let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
    let Some(pool) = modules.iter().find(|m| m.kind.ends_with(".Pooling")) else {
        return Ok((Pooling::Mean, normalize));
    };
    let raw: RawPooling = read_json(&dir.join(&pool.path).join("config.json"))?;
    let pooling = match (raw.pooling_mode_mean_tokens, raw.pooling_mode_cls_token) {
        (true, false) => Pooling::Mean,
        (false, true) => Pooling::Cls,
        _ => {
            return Err(ModelError::InvalidConfig(
                "1_Pooling: only one of mean or cls pooling is supported".into(),
            ))
        }
    };
    Ok((pooling, normalize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir.join(name).parent().unwrap()).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    const CONFIG: &str = r#"{"architectures":["BertModel"],"model_type":"bert","hidden_size":384,
        "intermediate_size":1536,"num_hidden_layers":6,"num_attention_heads":12,"vocab_size":30522,
        "max_position_embeddings":512,"hidden_act":"gelu","layer_norm_eps":1e-12}"#;

    #[test]
    fn reads_pooling_from_sentence_transformers_modules() {
        let dir = std::env::temp_dir().join(format!("bert-cfg-{}", std::process::id()));
        write(&dir, "config.json", CONFIG);
        assert!(is_bert(&dir));
        let c = load_config(&dir.join("config.json"), &dir).unwrap();
        assert_eq!(
            (c.pooling, c.normalize, c.head_dim()),
            (Pooling::Mean, true, 32)
        );
        write(
            &dir,
            "modules.json",
            r#"[{"type":"sentence_transformers.models.Transformer","path":""},
                {"type":"sentence_transformers.models.Pooling","path":"1_Pooling"}]"#,
        );
        write(
            &dir,
            "1_Pooling/config.json",
            r#"{"pooling_mode_cls_token":true}"#,
        );
        let c = load_config(&dir.join("config.json"), &dir).unwrap();
        assert_eq!((c.pooling, c.normalize), (Pooling::Cls, false));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_other_activations() {
        let dir = std::env::temp_dir().join(format!("bert-act-{}", std::process::id()));
        write(&dir, "config.json", &CONFIG.replace("\"gelu\"", "\"relu\""));
        let e = load_config(&dir.join("config.json"), &dir).unwrap_err();
        assert!(e.to_string().contains("relu"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
