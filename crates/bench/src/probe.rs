//! What `soak` watches on the server besides its answers: the Prometheus
//! text of `/metrics` (gauges and counters) and the process's resident
//! memory (`VmRSS` of `/proc/<pid>/status`, Linux), with the pid given or
//! found as the owner of the listening socket of the server's port.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Gauges and counters of a Prometheus text exposition, keyed by the
/// sample's name with its labels (`name{a="b"}`). Histogram and summary
/// series are left out: their buckets are not levels to trend.
pub fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (it.next(), it.next()) {
                types.insert(name, kind);
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = split_sample(line) else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        // Histogram and summary samples carry a suffix after the family name.
        let family = ["_bucket", "_sum", "_count", "_created"]
            .iter()
            .find_map(|suffix| {
                let base = name.strip_suffix(suffix)?;
                types.contains_key(base).then_some(base)
            })
            .unwrap_or(name);
        if !matches!(types.get(family), Some(&"gauge") | Some(&"counter") | None) {
            continue;
        }
        if let Some(v) = parse_value(value) {
            out.insert(series.to_string(), v);
        }
    }
    out
}

/// `name{labels} value [timestamp]` → (`name{labels}`, `value`). Label
/// values may hold spaces and escaped quotes, so the closing brace is
/// found outside quotes.
fn split_sample(line: &str) -> Option<(&str, &str)> {
    let end = match line.find('{') {
        None => line.find(char::is_whitespace)?,
        Some(open) => {
            let (mut quoted, mut escaped) = (false, false);
            let mut close = None;
            for (i, c) in line[open..].char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' if quoted => escaped = true,
                    '"' => quoted = !quoted,
                    '}' if !quoted => {
                        close = Some(open + i + 1);
                        break;
                    }
                    _ => {}
                }
            }
            close?
        }
    };
    let value = line[end..].split_whitespace().next()?;
    Some((&line[..end], value))
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

/// Resident set size of `pid` in MiB (`VmRSS`), `None` when unreadable.
pub fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The pid owning a TCP socket listening on `port` (Linux: the socket's
/// inode from `/proc/net/tcp{,6}`, then the process holding it among
/// `/proc/*/fd`). `None` when not found or not permitted.
pub fn find_listener_pid(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if cols.len() < 10 || cols[3] != "0A" {
                continue; // 0A: LISTEN
            }
            let local_port = cols[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && cols[9] != "0" {
                inodes.push(format!("socket:[{}]", cols[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// Whether `host` names this machine (a pid can only be found there).
pub fn is_local_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

/// `scheme://authority/metrics` of a base URL.
pub fn metrics_url(base_url: &str) -> Result<Uri, String> {
    let base: Uri = base_url
        .parse()
        .map_err(|e| format!("invalid base URL {base_url:?}: {e}"))?;
    let (Some(scheme), Some(authority)) = (base.scheme_str(), base.authority()) else {
        return Err(format!("base URL {base_url:?} needs a scheme and a host"));
    };
    format!("{scheme}://{authority}/metrics")
        .parse()
        .map_err(|e| format!("invalid metrics URL: {e}"))
}

/// A blocking GET of text pages for a sampling thread (its own
/// current-thread runtime: the sampler must not share the load's workers).
pub struct TextGetter {
    rt: tokio::runtime::Runtime,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl TextGetter {
    /// A getter with a fresh runtime.
    pub fn new() -> std::io::Result<TextGetter> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(TextGetter { rt, client })
    }

    /// The body of a 2xx answer to GET `uri` within `timeout`.
    pub fn get(&self, uri: &Uri, timeout: Duration) -> Result<String, String> {
        self.rt.block_on(async {
            let fetch = async {
                let resp = self
                    .client
                    .get(uri.clone())
                    .await
                    .map_err(|e| format!("GET {uri}: {e}"))?;
                let status = resp.status();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("GET {uri}: {e}"))?
                    .to_bytes();
                if !status.is_success() {
                    return Err(format!("GET {uri}: HTTP {status}"));
                }
                String::from_utf8(body.to_vec()).map_err(|_| format!("GET {uri}: not UTF-8"))
            };
            tokio::time::timeout(timeout, fetch)
                .await
                .map_err(|_| format!("GET {uri}: no answer within {timeout:?}"))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gauges_and_counters_only() {
        let text = "\
# HELP ingot:num_requests_running Running.
# TYPE ingot:num_requests_running gauge
ingot:num_requests_running 3
# TYPE ingot:prompt_tokens_total counter
ingot:prompt_tokens_total 1234 1700000000000
# TYPE ingot:ttft_seconds histogram
ingot:ttft_seconds_bucket{le=\"0.1\"} 5
ingot:ttft_seconds_sum 0.4
ingot:ttft_seconds_count 5
# TYPE ingot:request_success_total counter
ingot:request_success_total{finish_reason=\"length\",priority=\"normal }\"} 7
untyped_thing +Inf
broken_line
";
        let m = parse_prometheus(text);
        assert_eq!(m["ingot:num_requests_running"], 3.0);
        assert_eq!(m["ingot:prompt_tokens_total"], 1234.0);
        assert_eq!(
            m["ingot:request_success_total{finish_reason=\"length\",priority=\"normal }\"}"],
            7.0
        );
        assert_eq!(m["untyped_thing"], f64::INFINITY);
        assert!(!m.keys().any(|k| k.contains("ttft_seconds")));
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn urls_and_hosts() {
        assert_eq!(
            metrics_url("http://127.0.0.1:8000/v1").unwrap().to_string(),
            "http://127.0.0.1:8000/metrics"
        );
        assert!(metrics_url("not a url").is_err());
        assert!(is_local_host("localhost") && is_local_host("127.0.0.1") && is_local_host("[::1]"));
        assert!(!is_local_host("example.com") && !is_local_host("10.0.0.1"));
    }

    #[test]
    fn finds_its_own_listener_and_rss() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(find_listener_pid(port), Some(std::process::id()));
        let rss = rss_mib(std::process::id()).unwrap();
        assert!(rss > 0.0, "{rss}");
        assert!(rss_mib(u32::MAX).is_none());
    }
}
