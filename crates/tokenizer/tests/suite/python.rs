//! Running the Python reference scripts (`tests/suite/*.py`) in the venv
//! that `scripts/python-env` builds from `scripts/requirements-test.txt`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common;

/// Runs `tests/suite/<script>` with `input` as JSON on stdin and returns
/// its JSON stdout.
pub fn run(script: &str, input: &serde_json::Value) -> serde_json::Value {
    let python = common::fetch("python-env");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/suite")
        .join(script);
    let mut child = Command::new(&python)
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let mut stdin = child.stdin.take().unwrap();
    let body = serde_json::to_vec(input).unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
