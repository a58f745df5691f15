//! Helpers shared by `sweep`, `stress` and `soak`: option checks, output
//! folders and JSON files.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::serve::ServeArgs;
use crate::BenchError;

/// Checks the options every driver shares and that it sets itself.
pub(crate) fn check_serve_args(cmd: &str, serve: &ServeArgs) -> Result<(), BenchError> {
    if serve.out.is_some() {
        return Err(BenchError::Options(format!(
            "ingot bench {cmd} writes its files under --out-dir; --out is for `ingot bench serve`"
        )));
    }
    if serve.repeat > 1 {
        return Err(BenchError::Options(format!(
            "--repeat is for `ingot bench serve`; ingot bench {cmd} runs its own steps"
        )));
    }
    Ok(())
}

/// A flag set's defaults: what clap makes of no arguments.
pub(crate) fn flag_defaults<T: clap::Args + clap::FromArgMatches>(name: &'static str) -> T {
    let matches = T::augment_args(clap::Command::new(name))
        .try_get_matches_from([name])
        .expect("the flags' defaults parse. This is a bug.");
    T::from_arg_matches(&matches).expect("the flags' defaults parse. This is a bug.")
}

/// Seconds as a `Duration`, or an error naming the flag.
pub(crate) fn seconds(flag: &str, v: f64) -> Result<Duration, BenchError> {
    if v > 0.0 {
        Duration::try_from_secs_f64(v).map_err(|_| {
            BenchError::Options(format!(
                "--{flag} must be a positive number of seconds, got {v}"
            ))
        })
    } else {
        Err(BenchError::Options(format!(
            "--{flag} must be a positive number of seconds, got {v}"
        )))
    }
}

/// Creates `dir` (and parents).
pub(crate) fn create_dir(dir: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes `value` as pretty JSON.
pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| BenchError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    write_text(path, &(text + "\n"))
}

/// Writes a text file.
pub(crate) fn write_text(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The server's root URL: `--base-url`, else `http://HOST:PORT`.
pub(crate) fn base_url(serve: &ServeArgs) -> String {
    serve
        .base_url
        .clone()
        .unwrap_or_else(|| format!("http://{}:{}", serve.host, serve.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_validated() {
        assert_eq!(seconds("d", 1.5).unwrap(), Duration::from_millis(1500));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = seconds("step-duration", bad).unwrap_err().to_string();
            assert!(e.contains("--step-duration"), "{e}");
        }
    }
}
