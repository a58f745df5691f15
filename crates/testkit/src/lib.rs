//! Test fixtures shared by the workspace's test suites: paths to the real
//! test model and reference data, fetched on first use by the repo's scripts.
//! Dev-dependency only.

use std::path::PathBuf;
use std::process::Command;

/// The workspace root (where `scripts/` and `tests/fixtures/` live).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists. This is a bug.")
}

/// Runs a fetch script from `scripts/` and returns the path it prints.
///
/// Panics with the script's stderr when it fails (no network, checksum
/// mismatch): tests that need real assets must fail loudly, never skip.
pub fn fetched(script: &str) -> PathBuf {
    let path = workspace_root().join("scripts").join(script);
    let out = Command::new(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{} failed (is the network reachable?):\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let last = printed
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    PathBuf::from(last)
}

/// Whether this is a CI run (`CI=true`): every real part is required there.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The one rule for a real part a test needs (a `redis-server`, a tool):
/// returns `found` when it is; otherwise panics with `reason` under
/// `CI=true` (a CI run that silently skips proves nothing) and elsewhere
/// prints `skipped: <reason>` and returns false, so the test returns early.
///
/// ```ignore
/// if !ingot_testkit::require(has_redis(), "redis-server is not installed") {
///     return;
/// }
/// ```
pub fn require(found: bool, reason: &str) -> bool {
    if found {
        return true;
    }
    assert!(!in_ci(), "{reason} (CI=true: required, not skipped)");
    eprintln!("skipped: {reason}");
    false
}

/// The default test model, SmolLM2-135M-Instruct Q4_1 GGUF.
pub fn smollm2_gguf() -> PathBuf {
    fetched("fetch-test-model")
}

/// `tests/fixtures/<rel>` under the workspace root.
pub fn fixture(rel: &str) -> PathBuf {
    workspace_root().join("tests/fixtures").join(rel)
}

/// Index of the largest logit; ties go to the lowest id (numpy's argmax).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Largest absolute elementwise difference of two equal-length rows.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "rows differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Cases per fuzz property: `INGOT_FUZZ_CASES`, else `default` (CI runs the
/// small defaults; a long run sets a large count).
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("INGOT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A proptest runner of [`fuzz_cases`]`(default)` cases. Failures are
/// reported with their minimal input; nothing is written into the source
/// tree.
pub fn fuzz_runner(default: u32) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, TestRunner};
    TestRunner::new(Config {
        cases: fuzz_cases(default),
        failure_persistence: None,
        ..Config::default()
    })
}
