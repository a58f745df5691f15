//! Hugging Face Hub model ids (`org/name[@revision][:FILE_OR_QUANT]`) as
//! local files: the local Hub cache first, with no network when it holds
//! everything the model needs; else a download through `hf-hub` into that
//! cache (resumable, SHA-256 checked, with progress on stderr).
//!
//! The cache is the standard one (`HF_HUB_CACHE`, else `$HF_HOME/hub`,
//! default `~/.cache/huggingface/hub`; `models--org--name/{refs,snapshots,
//! blobs}`), so models fetched by Python tools are found and the other way
//! round. `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are honoured.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use hf_hub::api::tokio::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use sha2::{Digest, Sha256};

/// A model given as a Hub repo id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    /// `org/name`.
    pub repo: String,
    /// A branch, tag or commit; `main` when not given.
    pub revision: String,
    /// For a repo of GGUF files: a file name or a quantization (`Q4_K_M`).
    pub selector: Option<String>,
}

impl std::fmt::Display for HubId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.repo)?;
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        if let Some(s) = &self.selector {
            write!(f, ":{s}")?;
        }
        Ok(())
    }
}

/// `spec` as a Hub id, when it reads as one: `org/name` (letters, digits,
/// `-`, `_`, `.`; no leading or trailing `-`/`.`, no `--` or `..`),
/// optionally `@revision`, then optionally `:selector`. A spec that names a
/// GGUF or safetensors file, or starts like a path (`/`, `.`, `~`), is a
/// path whatever else it looks like.
pub fn parse(spec: &str) -> Option<HubId> {
    if spec.starts_with(['/', '.', '~']) {
        return None;
    }
    // A revision never holds `:` (git forbids it in ref names).
    let (head, selector) = match spec.split_once(':') {
        Some((_, "")) => return None,
        Some((h, s)) => (h, Some(s.to_string())),
        None => (spec, None),
    };
    let (repo, revision) = match head.split_once('@') {
        Some((r, rev)) if !rev.is_empty() && !rev.contains(['@', ' ']) => (r, rev.to_string()),
        Some(_) => return None,
        None => (head, "main".to_string()),
    };
    let (org, name) = repo.split_once('/')?;
    if !valid_part(org) || !valid_part(name) {
        return None;
    }
    let lower = name.to_ascii_lowercase();
    if lower.ends_with(".gguf") || lower.ends_with(".safetensors") {
        return None;
    }
    Some(HubId {
        repo: repo.to_string(),
        revision,
        selector,
    })
}

/// One part of a repo id, under the Hub's naming rules.
fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("--")
        && !s.contains("..")
}

/// The model at `spec`: `spec` itself when it exists or is not a Hub id,
/// else the local files of the Hub model it names (cached or fetched now),
/// with the id. `vars` is the process environment (`settings::env`).
pub fn resolve(spec: &Path, vars: &[(String, String)]) -> anyhow::Result<(PathBuf, Option<HubId>)> {
    if spec.exists() {
        return Ok((spec.to_path_buf(), None));
    }
    let Some(id) = spec.to_str().and_then(parse) else {
        return Ok((spec.to_path_buf(), None));
    };
    let env = HubEnv::from_vars(vars);
    let path = fetch(&id, &env).with_context(|| format!("{id}"))?;
    Ok((path, Some(id)))
}

/// The Hub settings of the process environment.
#[derive(Debug, Clone)]
pub struct HubEnv {
    /// Where `models--org--name` folders live.
    pub cache: PathBuf,
    /// `HF_ENDPOINT` (no trailing `/`).
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file of `HF_HOME`.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE`: never touch the network.
    pub offline: bool,
    /// A progress bar rather than lines (stderr is a terminal indicatif
    /// draws on).
    pub bar: bool,
}

impl HubEnv {
    fn from_vars(vars: &[(String, String)]) -> Self {
        let var = |k: &str| {
            vars.iter()
                .find(|(name, v)| name == k && !v.is_empty())
                .map(|(_, v)| v.clone())
        };
        // As huggingface_hub: HF_HOME, else $XDG_CACHE_HOME/huggingface,
        // else ~/.cache/huggingface.
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let token = var("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(home.join("token"))
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        Self {
            cache: var("HF_HUB_CACHE").map_or_else(|| home.join("hub"), PathBuf::from),
            endpoint: var("HF_ENDPOINT").map_or_else(
                || "https://huggingface.co".to_string(),
                |e| e.trim_end_matches('/').to_string(),
            ),
            token,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| {
                matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
            }),
            bar: !indicatif::ProgressDrawTarget::stderr().is_hidden(),
        }
    }
}

/// The local path of `id`'s model: a GGUF file or a snapshot directory.
pub fn fetch(id: &HubId, env: &HubEnv) -> anyhow::Result<PathBuf> {
    let repo_dir = env
        .cache
        .join(format!("models--{}", id.repo.replace('/', "--")));
    if let Some(path) = cached(id, &repo_dir) {
        return Ok(path);
    }
    if env.offline {
        bail!(
            "not in the local Hub cache {} and HF_HUB_OFFLINE is set",
            env.cache.display()
        );
    }
    download(id, env, &repo_dir)
}

/// The model from the local cache alone, when every file it needs is there.
fn cached(id: &HubId, repo_dir: &Path) -> Option<PathBuf> {
    let snapshot = repo_dir
        .join("snapshots")
        .join(commit_of(repo_dir, &id.revision)?);
    let mut names = Vec::new();
    list_files(&snapshot, &snapshot, &mut names);
    if names.is_empty() {
        return None;
    }
    // Which files a model needs is decided on what the snapshot holds: a
    // GGUF repo's snapshot holds the chosen file (among any others fetched).
    match select(&names, id.selector.as_deref()).ok()? {
        Wanted::Gguf(file) => Some(snapshot.join(file)),
        Wanted::Dir(_) => complete_dir(&snapshot).then_some(snapshot),
    }
}

/// The commit `revision` names in the cache: a ref's content, or the
/// revision itself when it is a commit the cache holds a snapshot of.
fn commit_of(repo_dir: &Path, revision: &str) -> Option<String> {
    if let Ok(commit) = std::fs::read_to_string(repo_dir.join("refs").join(revision)) {
        let commit = commit.trim().to_string();
        if !commit.is_empty() {
            return Some(commit);
        }
    }
    let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
    (is_commit && repo_dir.join("snapshots").join(revision).is_dir()).then(|| revision.to_string())
}

/// Relative paths (with `/`) of the files under `dir` whose targets exist.
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            list_files(root, &path, out);
        } else if path.is_file() {
            if let Ok(rel) = path.strip_prefix(root) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
}

/// Whether a Hugging Face directory has its config, tokenizer and every
/// weight shard (those its index names, else at least one file).
fn complete_dir(dir: &Path) -> bool {
    if !dir.join("config.json").is_file() || !dir.join("tokenizer.json").is_file() {
        return false;
    }
    let index = dir.join("model.safetensors.index.json");
    if let Ok(text) = std::fs::read_to_string(&index) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            return false;
        };
        let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
            return false;
        };
        return map
            .values()
            .filter_map(|f| f.as_str())
            .all(|f| dir.join(f).is_file());
    }
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.filter_map(Result::ok)
            .any(|e| e.path().extension().is_some_and(|x| x == "safetensors") && e.path().is_file())
    })
}

/// What to fetch of a repo.
#[derive(Debug, PartialEq, Eq)]
pub enum Wanted {
    /// One GGUF file.
    Gguf(String),
    /// The files of a Hugging Face directory.
    Dir(Vec<String>),
}

/// Small files of a Hugging Face directory that ingot reads when present.
const DIR_FILES: [&str; 9] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
    // Sentence-transformers' pooling of an embedding model.
    "modules.json",
];

/// The files of a repo holding `names` to fetch: for a repo with GGUF files
/// the one `selector` picks (a file name, or a quantization such as
/// `Q4_K_M` as in llama.cpp's `-hf`), or the only one; otherwise a
/// Hugging Face directory's config, tokenizer and safetensors weights.
pub fn select(names: &[String], selector: Option<&str>) -> anyhow::Result<Wanted> {
    let ggufs: Vec<&String> = names
        .iter()
        .filter(|n| n.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    if !ggufs.is_empty() {
        let picked: Vec<&String> = match selector {
            None => ggufs.clone(),
            Some(s) => {
                let exact: Vec<&String> = ggufs
                    .iter()
                    .copied()
                    .filter(|n| *n == s || n.rsplit('/').next() == Some(s))
                    .collect();
                if exact.is_empty() {
                    ggufs.iter().copied().filter(|n| has_tag(n, s)).collect()
                } else {
                    exact
                }
            }
        };
        return match picked.as_slice() {
            [one] => Ok(Wanted::Gguf((*one).clone())),
            [] => bail!(
                "no GGUF file matches {:?}; the repo has: {}",
                selector.unwrap_or_default(),
                join(&ggufs)
            ),
            many => bail!(
                "{} GGUF files{}; pick one with ORG/NAME:QUANT or :FILE: {}",
                many.len(),
                selector.map_or_else(String::new, |s| format!(" match {s:?}")),
                join(many)
            ),
        };
    }
    if let Some(s) = selector {
        bail!("the repo has no GGUF files, so {s:?} selects nothing (drop the :{s})");
    }
    let mut files: Vec<String> = names
        .iter()
        .filter(|n| {
            DIR_FILES.contains(&n.as_str())
                || (!n.contains('/') && n.ends_with(".safetensors"))
                || n.split_once('/')
                    .is_some_and(|(d, f)| d.ends_with("_Pooling") && f == "config.json")
        })
        .cloned()
        .collect();
    files.sort();
    if !files.iter().any(|f| f.ends_with(".safetensors")) {
        bail!("the repo has neither GGUF nor safetensors files (ingot reads no others)");
    }
    if !files.iter().any(|f| f == "config.json") {
        bail!("the repo has safetensors weights but no config.json");
    }
    Ok(Wanted::Dir(files))
}

/// Whether the file name `name` carries `tag` (a quantization) as a
/// `-`/`.`/`_`-separated token, case-insensitively: `Q4_K_M` matches
/// `m-Q4_K_M.gguf`, `Q4_K` does not.
fn has_tag(name: &str, tag: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name).to_ascii_uppercase();
    let tag = tag.to_ascii_uppercase();
    if tag.is_empty() {
        return false;
    }
    base.match_indices(&tag).any(|(i, _)| {
        let before = base[..i].chars().next_back();
        let after = base[i + tag.len()..].chars().next();
        before.is_none_or(|c| matches!(c, '-' | '.' | '_'))
            && after.is_none_or(|c| matches!(c, '-' | '.'))
    })
}

fn join(names: &[&String]) -> String {
    names
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How often one file's download is tried: a transfer cut short resumes
/// from what was committed to the partial file.
const ATTEMPTS: u32 = 3;

/// Fetches what `id` needs from the Hub into the cache.
fn download(id: &HubId, env: &HubEnv, repo_dir: &Path) -> anyhow::Result<PathBuf> {
    let api = ApiBuilder::from_cache(Cache::new(env.cache.clone()))
        .with_endpoint(env.endpoint.clone())
        .with_token(env.token.clone())
        .with_progress(false)
        .build()
        .map_err(|e| anyhow!("cannot set up the Hub client: {e}"))?;
    let repo = Repo::with_revision(id.repo.clone(), RepoType::Model, id.revision.clone());
    let api = api.repo(repo.clone());
    let info = block_on(api.info())?.map_err(|e| explain(e, env, "list the repo's files"))?;
    let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let wanted = select(&names, id.selector.as_deref())?;
    let snapshot = repo_dir.join("snapshots").join(&info.sha);
    let files = match &wanted {
        Wanted::Gguf(f) => vec![f.clone()],
        Wanted::Dir(files) => files.clone(),
    };
    for file in &files {
        if snapshot.join(file).is_file() {
            continue;
        }
        download_file(&api, id, file, env)?;
    }
    // The ref lets the next start find the snapshot with no network.
    Cache::new(env.cache.clone())
        .repo(repo)
        .create_ref(&info.sha)
        .with_context(|| format!("cannot write the ref in {}", repo_dir.display()))?;
    Ok(match wanted {
        Wanted::Gguf(f) => snapshot.join(f),
        Wanted::Dir(_) => snapshot,
    })
}

/// Downloads one file (resuming a partial one), then checks its SHA-256.
fn download_file(api: &ApiRepo, id: &HubId, file: &str, env: &HubEnv) -> anyhow::Result<()> {
    let name = format!("{}/{file}", id.repo);
    let mut attempt = 1;
    let (path, progress) = loop {
        let progress = Progress::new(name.clone(), env.bar);
        // A runtime per attempt: dropping it stops the chunk tasks a failed
        // attempt leaves behind before the next one writes the same file.
        match block_on(api.download_with_progress(file, progress.clone()))? {
            Ok(path) => break (path, progress),
            Err(e) if attempt < ATTEMPTS && transient(&e) => {
                progress.abandon();
                eprintln!(
                    "download of {name} interrupted ({}); trying again ({}/{ATTEMPTS})",
                    chain(&e),
                    attempt + 1
                );
                std::thread::sleep(Duration::from_millis(500 * u64::from(attempt)));
                attempt += 1;
            }
            Err(e) => {
                progress.abandon();
                return Err(explain(e, env, &format!("download {file}")));
            }
        }
    };
    let checked = verify(&path).with_context(|| file.to_string())?;
    let sha = if checked { "; SHA-256 checked" } else { "" };
    eprintln!("downloaded {name} ({}{sha})", progress.summary());
    Ok(())
}

/// Whether another attempt may get further: a cut connection or I/O
/// trouble, not an answer the Hub gave on purpose.
fn transient(e: &ApiError) -> bool {
    match e {
        ApiError::RequestError(r) => r.status().is_none_or(|s| s.is_server_error()),
        ApiError::IoError(_) | ApiError::Join(_) => true,
        _ => false,
    }
}

/// One line saying what went wrong, for the errors a user can act on.
fn explain(e: ApiError, env: &HubEnv, what: &str) -> anyhow::Error {
    let status = match &e {
        ApiError::RequestError(r) => r.status().map(|s| s.as_u16()),
        _ => None,
    };
    match status {
        Some(404) => anyhow!(
            "no such model or revision on the Hub ({}; HTTP 404)",
            env.endpoint
        ),
        Some(401 | 403) => anyhow!(
            "the Hub ({}) refused access (HTTP {}): the repo may not exist, or it is gated or \
             private and needs HF_TOKEN{}",
            env.endpoint,
            status.unwrap_or_default(),
            if env.token.is_some() {
                " with access to it"
            } else {
                ""
            }
        ),
        _ => anyhow!(
            "cannot {what} from the Hub ({}): {}; nothing usable in the local cache {}",
            env.endpoint,
            chain(&e),
            env.cache.display()
        ),
    }
}

/// An error with its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let next = c.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = c.source();
    }
    s
}

/// Runs `f` on a runtime of its own, dropped when it returns.
fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the download runtime")?;
    Ok(rt.block_on(f))
}

/// Checks a downloaded file against its blob name, which is the Hub's
/// etag: the SHA-256 of an LFS file (64 hex digits). A file that differs is
/// removed, so the next start downloads it again. True when there was a
/// hash to check.
pub fn verify(path: &Path) -> anyhow::Result<bool> {
    let blob =
        std::fs::canonicalize(path).with_context(|| format!("cannot read {}", path.display()))?;
    let Some(expected) = blob
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.len() == 64 && n.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase)
    else {
        // A small file kept in git, named by its git hash: nothing to check.
        return Ok(false);
    };
    let actual = sha256_of(&blob)?;
    if actual != expected {
        let _ = std::fs::remove_file(&blob);
        let _ = std::fs::remove_file(path);
        bail!("SHA-256 mismatch: the Hub says {expected}, the download is {actual}; removed it");
    }
    Ok(true)
}

fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Files smaller than this report no progress lines, only their end.
const QUIET_BELOW: u64 = 16 << 20;

/// Download progress: an `indicatif` bar on a terminal, else a line at
/// each quarter of a large file (a few lines, whatever its size).
#[derive(Clone)]
struct Progress(Arc<Mutex<ProgressState>>);

struct ProgressState {
    name: String,
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    done: u64,
    /// Bytes a partial file already held when this attempt started.
    resumed: Option<u64>,
    started: Instant,
    /// The next quarter of the file to print a line at.
    next_quarter: u64,
}

impl Progress {
    fn new(name: String, bar: bool) -> Self {
        let bar = bar.then(|| {
            indicatif::ProgressBar::new(0).with_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("static template. This is a bug.")
                .progress_chars("=> "),
            )
        });
        Self(Arc::new(Mutex::new(ProgressState {
            name,
            bar,
            total: 0,
            done: 0,
            resumed: None,
            started: Instant::now(),
            next_quarter: 1,
        })))
    }

    fn with<R>(&self, f: impl FnOnce(&mut ProgressState) -> R) -> R {
        let mut s = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut s)
    }

    fn abandon(&self) {
        self.with(|s| {
            if let Some(bar) = &s.bar {
                bar.abandon();
            }
        });
    }

    /// The file's size and this attempt's rate, for the last line.
    fn summary(&self) -> String {
        self.with(|s| {
            format!(
                "{}, {}/s",
                indicatif::HumanBytes(s.total),
                indicatif::HumanBytes(s.rate())
            )
        })
    }
}

impl ProgressState {
    /// Bytes per second of this attempt (what a resume skipped aside).
    fn rate(&self) -> u64 {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        (self.done.saturating_sub(self.resumed.unwrap_or(0)) as f64 / secs) as u64
    }

    fn first_update(&mut self) {
        // hf-hub's first report is what a partial file already held.
        self.resumed = Some(self.done);
        self.started = Instant::now();
        self.next_quarter = self.done * 4 / self.total.max(1) + 1;
        let total = indicatif::HumanBytes(self.total);
        match &self.bar {
            Some(bar) => {
                bar.set_length(self.total);
                bar.set_message(self.name.clone());
                bar.set_position(self.done);
                bar.reset_eta();
            }
            None if self.done > 0 => eprintln!(
                "resuming {} at {} of {total}",
                self.name,
                indicatif::HumanBytes(self.done)
            ),
            None if self.total >= QUIET_BELOW => {
                eprintln!("downloading {} ({total})", self.name);
            }
            // A small file gets its one "downloaded" line.
            None => self.next_quarter = 4,
        }
    }
}

impl hf_hub::api::tokio::Progress for Progress {
    async fn init(&mut self, size: usize, _filename: &str) {
        self.with(|s| s.total = size as u64);
    }

    async fn update(&mut self, size: usize) {
        self.with(|s| {
            s.done += size as u64;
            if s.resumed.is_none() {
                return s.first_update();
            }
            if let Some(bar) = &s.bar {
                bar.set_position(s.done);
            } else if s.next_quarter < 4 && s.done * 4 >= s.next_quarter * s.total {
                eprintln!(
                    "downloading {}: {}% ({} of {}, {}/s)",
                    s.name,
                    s.done * 100 / s.total.max(1),
                    indicatif::HumanBytes(s.done),
                    indicatif::HumanBytes(s.total),
                    indicatif::HumanBytes(s.rate())
                );
                s.next_quarter = s.done * 4 / s.total.max(1) + 1;
            }
        });
    }

    async fn finish(&mut self) {
        self.with(|s| {
            if let Some(bar) = &s.bar {
                bar.finish_and_clear();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_ids_and_leaves_paths_alone() {
        let id = parse("Org/Some-Model_1.5@v2:Q4_K_M").unwrap();
        assert_eq!(id.repo, "Org/Some-Model_1.5");
        assert_eq!(id.revision, "v2");
        assert_eq!(id.selector.as_deref(), Some("Q4_K_M"));
        assert_eq!(id.to_string(), "Org/Some-Model_1.5@v2:Q4_K_M");
        let id = parse("org/name").unwrap();
        assert_eq!((id.revision.as_str(), id.selector), ("main", None));
        assert_eq!(parse("org/name@refs/pr/1").unwrap().revision, "refs/pr/1");
        assert_eq!(
            parse("org/name:sub/m.gguf").unwrap().selector.as_deref(),
            Some("sub/m.gguf")
        );
        for path in [
            "model.gguf",
            "dir/model.gguf",
            "dir/model.safetensors",
            "./org/name",
            "/org/name",
            "~/m",
            "a/b/c",
            "org/",
            "/name",
            "org/na--me",
            "org/-name",
            "org/name@",
            "org/name:",
            "org/na me",
        ] {
            assert_eq!(parse(path), None, "{path}");
        }
    }

    #[test]
    fn selects_one_gguf_by_quant_or_name_and_lists_the_choices() {
        let repo = names(&[
            "README.md",
            "m-Q4_K.gguf",
            "m-Q4_K_M.gguf",
            "m.q8_0.gguf",
            "sub/m-F16.gguf",
        ]);
        let pick = |s| select(&repo, Some(s)).map_err(|e| e.to_string());
        assert_eq!(pick("Q4_K_M"), Ok(Wanted::Gguf("m-Q4_K_M.gguf".into())));
        assert_eq!(pick("q4_k"), Ok(Wanted::Gguf("m-Q4_K.gguf".into())));
        assert_eq!(pick("Q8_0"), Ok(Wanted::Gguf("m.q8_0.gguf".into())));
        assert_eq!(pick("f16"), Ok(Wanted::Gguf("sub/m-F16.gguf".into())));
        assert_eq!(
            pick("m-F16.gguf"),
            Ok(Wanted::Gguf("sub/m-F16.gguf".into()))
        );
        let e = pick("Q5_K").unwrap_err();
        assert!(
            e.contains("no GGUF file matches") && e.contains("m-Q4_K_M.gguf"),
            "{e}"
        );
        let e = select(&repo, None).unwrap_err().to_string();
        assert!(
            e.contains("4 GGUF files") && e.contains("ORG/NAME:QUANT"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        assert_eq!(
            select(&names(&["a.gguf", "x.md"]), None).unwrap(),
            Wanted::Gguf("a.gguf".into())
        );
    }

    #[test]
    fn selects_a_hugging_face_directory() {
        let repo = names(&[
            ".gitattributes",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "onnx/model.safetensors",
            "1_Pooling/config.json",
        ]);
        let Wanted::Dir(files) = select(&repo, None).unwrap() else {
            panic!("not a directory")
        };
        assert_eq!(files.len(), 8, "{files:?}");
        assert!(!files
            .iter()
            .any(|f| f.contains("onnx") || f.ends_with(".bin")));
        assert!(select(&names(&["config.json", "pytorch_model.bin"]), None).is_err());
        assert!(select(&repo, Some("Q4_0")).is_err());
    }

    #[test]
    fn the_cache_alone_serves_a_complete_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--org--name");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let snap = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snap).unwrap();
        let id = parse("org/name").unwrap();
        assert_eq!(cached(&id, &repo), None, "no ref yet");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), commit).unwrap();
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        std::fs::write(snap.join("tokenizer.json"), "{}").unwrap();
        assert_eq!(cached(&id, &repo), None, "no weights");
        std::fs::write(snap.join("model.safetensors"), "").unwrap();
        assert_eq!(cached(&id, &repo), Some(snap.clone()));
        // A commit id finds its snapshot without a ref.
        let by_commit = parse(&format!("org/name@{commit}")).unwrap();
        assert_eq!(cached(&by_commit, &repo), Some(snap.clone()));
        // An index needs every shard it names.
        std::fs::write(
            snap.join("model.safetensors.index.json"),
            r#"{"weight_map":{"a":"model.safetensors","b":"model-2.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(cached(&id, &repo), None);
        let env = HubEnv {
            cache: dir.path().to_path_buf(),
            endpoint: "http://127.0.0.1:9".into(),
            token: None,
            offline: true,
            bar: false,
        };
        let e = fetch(&id, &env).unwrap_err().to_string();
        assert!(e.contains("HF_HUB_OFFLINE"), "{e}");
    }

    #[test]
    fn verify_removes_a_file_that_differs_from_its_etag() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"weights";
        let sha = sha256_of_bytes(data);
        let good = dir.path().join(&sha);
        std::fs::write(&good, data).unwrap();
        assert!(verify(&good).unwrap());
        let bad = dir.path().join("0".repeat(64));
        std::fs::write(&bad, data).unwrap();
        let e = verify(&bad).unwrap_err().to_string();
        assert!(e.contains("SHA-256 mismatch"), "{e}");
        assert!(!bad.exists());
        // Git-hashed small files are not checked.
        let small = dir.path().join("a".repeat(40));
        std::fs::write(&small, data).unwrap();
        assert!(!verify(&small).unwrap());
    }

    fn sha256_of_bytes(b: &[u8]) -> String {
        Sha256::digest(b)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}
