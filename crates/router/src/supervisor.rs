//! Local workers: `ingot serve` children on free loopback ports, restarted
//! with exponential backoff when they die, and on request (rolling restart).
//!
//! Each child is started with `--port 0` and the router learns its address
//! from the `listening on http://...` line the server prints, so there is no
//! window in which another process could take a port picked in advance.
//! Children get SIGTERM (the server drains) on a requested restart and when
//! the router stops; on Linux they also die with the router
//! (`PR_SET_PDEATHSIG`), so a killed router leaves no orphans.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

use crate::config::LocalWorkers;
use crate::metrics as m;
use crate::worker::Worker;

/// A child that lived this long resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// Longest wait for a child to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(30);

/// Supervises the child of `worker` until `shutdown` turns true; a message
/// on `restart` restarts it at once (after a graceful stop).
pub async fn supervise_task(
    worker: Arc<Worker>,
    config: LocalWorkers,
    mut restart: mpsc::UnboundedReceiver<()>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut delay = config.backoff;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = Instant::now();
        let mut child = match spawn(&worker, &config) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(worker = %worker.label, error = %e, "cannot start worker");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => return,
                }
                delay = (delay * 2).min(config.backoff_max);
                continue;
            }
        };
        let requested = tokio::select! {
            status = child.wait() => {
                tracing::warn!(worker = %worker.label, ?status, "worker exited");
                false
            }
            Some(()) = restart.recv() => {
                tracing::info!(worker = %worker.label, "restarting worker");
                terminate(&mut child).await;
                true
            }
            _ = shutdown.changed() => {
                terminate(&mut child).await;
                worker.set_exited();
                return;
            }
        };
        worker.set_exited();
        metrics::counter!(m::WORKER_RESTARTS, "worker" => worker.label.clone()).increment(1);
        if requested {
            delay = config.backoff;
            continue;
        }
        if started.elapsed() >= STABLE_AFTER {
            delay = config.backoff;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => return,
        }
        delay = (delay * 2).min(config.backoff_max);
    }
}

/// Starts the child and a task that forwards its stderr (prefixed with the
/// worker's label) and records its address when it prints it.
fn spawn(worker: &Arc<Worker>, config: &LocalWorkers) -> std::io::Result<Child> {
    let mut cmd = Command::new(&config.binary);
    cmd.arg("serve")
        .args(&config.args)
        .args(["--host", "127.0.0.1", "--port", "0"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let pid = child.id().unwrap_or(0);
    tracing::info!(worker = %worker.label, pid, "worker started");
    if let Some(stderr) = child.stderr.take() {
        let worker = Arc::clone(worker);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = listening_url(&line) {
                    worker.set_started(url.to_string(), pid);
                }
                eprintln!("[{}] {line}", worker.label);
            }
        });
    }
    Ok(child)
}

/// The URL in the server's `listening on http://HOST:PORT` line.
fn listening_url(line: &str) -> Option<&str> {
    let rest = &line[line.find("listening on http://")? + "listening on ".len()..];
    Some(rest.split_whitespace().next().unwrap_or(rest))
}

/// SIGTERM, then SIGKILL if the child has not exited within the grace time.
async fn terminate(child: &mut Child) {
    #[cfg(unix)]
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        if tokio::time::timeout(TERM_GRACE, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.kill().await;
}

#[cfg(test)]
mod tests {
    use super::listening_url;

    #[test]
    fn finds_the_address_in_the_servers_line() {
        assert_eq!(
            listening_url("2026-01-01 INFO listening on http://127.0.0.1:41234"),
            Some("http://127.0.0.1:41234")
        );
        assert_eq!(listening_url("loading model"), None);
    }
}
