//! `ingot serve ORG/NAME` against a Hub-shaped server on loopback: the
//! repo listing, `resolve` answering with the Hub's headers and a redirect
//! to a "CDN" on another port that serves the test model's bytes by range,
//! and cuts one transfer short. The first start downloads (resuming the
//! cut file), checks and serves; the second serves from the cache without
//! a request.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::bench_serve::http_status;
use crate::cli::serve_until;

const REPO: &str = "test-org/smollm2";
const FILE: &str = "SmolLM2-135M-Instruct-Q8_0.gguf";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// The first ranged request starting at or past this offset is cut
/// halfway (hf-hub fetches 10 MB chunks: two are committed before it).
const CUT_AT: u64 = 20_000_000;

/// What the fake Hub saw: every request, and the CDN's byte ranges.
#[derive(Default)]
struct Seen {
    requests: usize,
    /// `(start, end inclusive, served after the cut)` of ranged CDN reads
    /// longer than hf-hub's one-byte probes.
    ranges: Vec<(u64, u64, bool)>,
    cut: bool,
}

struct FakeHub {
    endpoint: String,
    seen: Arc<Mutex<Seen>>,
}

fn sha256_hex(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).unwrap();
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts the hub and its CDN on free loopback ports; their threads end
/// with the test process.
fn fake_hub(model: PathBuf) -> FakeHub {
    let sha = sha256_hex(&model);
    let size = std::fs::metadata(&model).unwrap().len();
    let hub = TcpListener::bind("127.0.0.1:0").unwrap();
    let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", hub.local_addr().unwrap());
    let cdn_url = format!("http://{}", cdn.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let sha2 = sha.clone();
    std::thread::spawn(move || {
        for conn in hub.incoming().map_while(Result::ok) {
            let (s, sha, cdn_url) = (s.clone(), sha2.clone(), cdn_url.clone());
            std::thread::spawn(move || {
                let _ = serve_hub(conn, &s, &sha, size, &cdn_url);
            });
        }
    });
    let s = seen.clone();
    std::thread::spawn(move || {
        for conn in cdn.incoming().map_while(Result::ok) {
            let (s, model, sha) = (s.clone(), model.clone(), sha.clone());
            std::thread::spawn(move || {
                let _ = serve_cdn(conn, &s, &model, &sha, size);
            });
        }
    });
    FakeHub { endpoint, seen }
}

/// A Range header's `(start, end)`; no end reads to the end of the file.
type Range = (u64, Option<u64>);

/// The request line's path and the Range header.
fn read_request(conn: &TcpStream) -> std::io::Result<(String, Option<Range>)> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                let spec = v.trim().trim_start_matches("bytes=");
                if let Some((a, b)) = spec.split_once('-') {
                    range = Some((a.parse().unwrap_or(0), b.parse().ok()));
                }
            }
        }
    }
    Ok((path, range))
}

fn respond(mut conn: &TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
}

fn serve_hub(
    conn: TcpStream,
    seen: &Mutex<Seen>,
    sha: &str,
    size: u64,
    cdn: &str,
) -> std::io::Result<()> {
    let (path, _) = read_request(&conn)?;
    seen.lock().unwrap().requests += 1;
    if path == format!("/api/models/{REPO}/revision/main") {
        let listing = serde_json::json!({
            "id": REPO,
            "sha": COMMIT,
            "siblings": [
                {"rfilename": ".gitattributes"},
                {"rfilename": "README.md"},
                {"rfilename": FILE},
            ],
        });
        respond(
            &conn,
            "200 OK",
            &[("content-type", "application/json".into())],
            listing.to_string().as_bytes(),
        );
    } else if path == format!("/{REPO}/resolve/main/{FILE}") {
        // As the Hub for an LFS file: the commit and the file's SHA-256
        // here, the bytes at another host (hf-hub follows that by hand).
        respond(
            &conn,
            "302 Found",
            &[
                ("location", format!("{cdn}/lfs/{sha}")),
                ("x-repo-commit", COMMIT.into()),
                ("x-linked-etag", format!("\"{sha}\"")),
                ("x-linked-size", size.to_string()),
                (
                    "etag",
                    "\"9a0364b9e99bb480dd25e1f0284c8555e9e0c4a8\"".into(),
                ),
            ],
            b"",
        );
    } else {
        // The Hub answers 401 for a repo it does not show.
        respond(
            &conn,
            "401 Unauthorized",
            &[("x-error-code", "RepoNotFound".into())],
            b"{\"error\":\"Repository not found\"}",
        );
    }
    Ok(())
}

fn serve_cdn(
    mut conn: TcpStream,
    seen: &Mutex<Seen>,
    model: &Path,
    sha: &str,
    size: u64,
) -> std::io::Result<()> {
    let (path, range) = read_request(&conn)?;
    if path != format!("/lfs/{sha}") {
        respond(&conn, "404 Not Found", &[], b"");
        return Ok(());
    }
    let (start, end) = match range {
        Some((a, b)) => (a, b.unwrap_or(size - 1).min(size - 1)),
        None => (0, size - 1),
    };
    let len = end + 1 - start;
    let cut = {
        let mut s = seen.lock().unwrap();
        s.requests += 1;
        let cut = !s.cut && start >= CUT_AT && len > 1;
        s.cut |= cut;
        if len > 1 {
            let after = s.cut && !cut;
            s.ranges.push((start, end, after));
        }
        cut
    };
    let status = if range.is_some() {
        "206 Partial Content"
    } else {
        "200 OK"
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-range: bytes {start}-{end}/{size}\r\n\
         content-length: {len}\r\n\r\n"
    );
    conn.write_all(head.as_bytes())?;
    let mut f = std::fs::File::open(model)?;
    f.seek(SeekFrom::Start(start))?;
    // The cut: half the promised bytes, then the connection drops.
    let send = if cut { len / 2 } else { len };
    std::io::copy(&mut f.take(send), &mut conn)?;
    if cut {
        conn.shutdown(std::net::Shutdown::Both)?;
    }
    Ok(())
}

/// `ingot serve MODEL` with the fake Hub and `home` as HF_HOME, until it
/// answers `/v1/models`; returns that body and the stderr so far.
fn serve_from_hub(model: &str, hub: &FakeHub, home: &Path) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(["serve", model, "--port", "0", "--max-num-seqs", "2"])
        .env("INGOT_THREADS", "2")
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HOME", home)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("RUST_BACKTRACE");
    serve_until(cmd, 180, |url, _| {
        (http_status(url, "/ready") == Some(200)).then(|| http_get(url, "/v1/models"))
    })
}

/// The body of `GET path` (the server closes the connection).
fn http_get(url: &str, path: &str) -> String {
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn serve_org_name_downloads_resumes_verifies_serves_then_uses_the_cache() {
    let model = ingot_testkit::smollm2_gguf();
    let size = std::fs::metadata(&model).unwrap().len();
    let hub = fake_hub(model.clone());
    let home = tempfile::tempdir().unwrap();

    let (models, err) = serve_from_hub(REPO, &hub, home.path());
    assert!(
        models.contains(&format!("\"id\":\"{REPO}\"")),
        "{models}\n{err}"
    );
    {
        let seen = hub.seen.lock().unwrap();
        assert!(seen.cut, "the transfer was never cut:\n{err}");
        // Resumed: after the cut no range starts below the cut chunk, and
        // less than the whole file was sent again.
        let after: Vec<_> = seen.ranges.iter().filter(|r| r.2).collect();
        assert!(!after.is_empty(), "nothing fetched after the cut:\n{err}");
        assert!(after.iter().all(|r| r.0 >= CUT_AT), "{:?}", seen.ranges);
        let again: u64 = after.iter().map(|r| r.1 + 1 - r.0).sum();
        assert!(again < size, "{again} bytes sent again of {size}");
    }
    assert!(err.contains("resuming"), "{err}");
    assert!(err.contains(&format!("downloaded {REPO}/{FILE}")), "{err}");
    assert!(err.contains("SHA-256 checked"), "{err}");
    let progress = err.lines().filter(|l| l.contains("downloading")).count();
    assert!(
        (1..=10).contains(&progress),
        "{progress} progress lines:\n{err}"
    );
    // Checked: the file in the snapshot is the blob named by its SHA-256.
    let snapshot = home
        .path()
        .join("hub/models--test-org--smollm2/snapshots")
        .join(COMMIT)
        .join(FILE);
    let blob = std::fs::canonicalize(&snapshot).unwrap();
    assert_eq!(
        blob.file_name().unwrap().to_str().unwrap(),
        sha256_hex(&model)
    );

    // The second start finds everything in the cache: no request at all.
    let before = hub.seen.lock().unwrap().requests;
    let (models, err) = serve_from_hub(REPO, &hub, home.path());
    assert!(
        models.contains(&format!("\"id\":\"{REPO}\"")),
        "{models}\n{err}"
    );
    assert_eq!(hub.seen.lock().unwrap().requests, before, "{err}");
    assert!(!err.contains("download"), "{err}");

    // A repo the Hub does not show: one line.
    let o = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["serve", "nobody/missing", "--port", "0"])
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HOME", home.path())
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: nobody/missing: the Hub") && err.contains("HF_TOKEN"),
        "{err}"
    );
}
