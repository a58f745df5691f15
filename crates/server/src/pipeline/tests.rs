//! The pipeline's layers over a fake engine (no model, no socket).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};
use ingot_core::{FinishReason, Priority, SamplingParams, StopCriteria};
use ingot_engine::{
    Completion, EngineRequest, GeneratedToken, PriorityHandle, RequestLimits, TokenEvent,
};
use ingot_protocol::sampling::SamplingFields;

use super::*;
use crate::generate::{Endpoint, Submission};

/// Counts generations and live (not yet dropped) ones; emits
/// `max_tokens` tokens, one per `delay`, named after the prompt's first id.
#[derive(Clone)]
struct Fake {
    generations: Arc<AtomicUsize>,
    live: Arc<AtomicUsize>,
    delay: Duration,
    /// Tiers the generations were moved to.
    moved: Arc<std::sync::Mutex<Vec<Priority>>>,
}

struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    fn new(delay_ms: u64) -> Self {
        Self {
            generations: Arc::default(),
            live: Arc::default(),
            delay: Duration::from_millis(delay_ms),
            moved: Arc::default(),
        }
    }
    fn generations(&self) -> usize {
        self.generations.load(Ordering::SeqCst)
    }
    fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

impl Generator for Fake {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        self.generations.fetch_add(1, Ordering::SeqCst);
        self.live.fetch_add(1, Ordering::SeqCst);
        let live = Live(self.live.clone());
        let n = request.engine.stop.max_tokens;
        let tag = request.engine.prompt[0];
        let seed = request.engine.sampling.seed.unwrap_or(0);
        let delay = self.delay;
        let prompt_tokens = request.engine.prompt.len();
        let events = stream::unfold((0usize, live), move |(i, live)| async move {
            if i > n {
                return None;
            }
            tokio::time::sleep(delay).await;
            let event = if i == n {
                TokenEvent::Finished(Completion {
                    reason: FinishReason::Length,
                    prompt_tokens,
                    completion_tokens: n,
                    cached_tokens: 0,
                    queue_time: Duration::ZERO,
                })
            } else {
                TokenEvent::Token(GeneratedToken {
                    token: i as u32,
                    text: format!("<{tag}.{seed}.{i}>"),
                    logprob: -0.5,
                    top_logprobs: Vec::new(),
                })
            };
            Some((event, (i + 1, live)))
        })
        .boxed();
        let status = if request.key.is_some() {
            CacheStatus::Miss
        } else {
            CacheStatus::Bypass
        };
        let moved = self.moved.clone();
        let priority = PriorityHandle::new(move |p| {
            if let Ok(mut m) = moved.lock() {
                m.push(p);
            }
        });
        Box::pin(async move {
            Ok(Generation {
                status,
                events,
                priority: Some(priority),
            })
        })
    }
}

const SHARE_ALL: Sharing = Sharing {
    coalesce: true,
    lookup: true,
    store: true,
};

fn greedy(prompt: &[u32], max_tokens: usize) -> EngineRequest {
    EngineRequest {
        prompt: prompt.to_vec(),
        sampling: SamplingParams::GREEDY,
        stop: StopCriteria {
            max_tokens,
            ..Default::default()
        },
        priority: Priority::Normal,
        grammar: None,
        speculative: true,
    }
}

fn request(engine: EngineRequest, sharing: Sharing) -> GenerateRequest {
    GenerateRequest::new("m".into(), None, engine, sharing)
}

fn settings() -> CacheSettings {
    CacheSettings {
        max_entries: 100,
        max_bytes: 1 << 20,
        ttl: Duration::from_secs(60),
    }
}

fn stack(fake: &Fake) -> ResponseCache<Coalescer<Fake>> {
    let coalescer = Coalescer::new(fake.clone(), Duration::from_secs(30));
    ResponseCache::new(coalescer, Arc::new(MemoryStore::new(settings())))
}

async fn drain(mut events: EventStream) -> Vec<TokenEvent> {
    let mut out = Vec::new();
    while let Some(e) = events.next().await {
        out.push(e);
    }
    out
}

#[tokio::test]
async fn twenty_identical_requests_share_one_generation() {
    let fake = Fake::new(2);
    let coalescer = Arc::new(Coalescer::new(fake.clone(), Duration::from_secs(30)));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let c = coalescer.clone();
        tasks.push(tokio::spawn(async move {
            let g = c
                .generate(request(greedy(&[7, 8], 20), SHARE_ALL))
                .await
                .expect("starts");
            (g.status, drain(g.events).await)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("task"));
    }
    assert_eq!(fake.generations(), 1);
    let misses = results
        .iter()
        .filter(|(s, _)| *s == CacheStatus::Miss)
        .count();
    assert_eq!(misses, 1);
    let first = &results[0].1;
    assert_eq!(first.len(), 21, "20 tokens and the end");
    assert!(results.iter().all(|(_, events)| events == first));
    assert_eq!(coalescer.in_flight(), 0);
}

#[tokio::test]
async fn a_late_joiner_gets_the_whole_stream() {
    let fake = Fake::new(5);
    let coalescer = Coalescer::new(fake.clone(), Duration::from_secs(30));
    let mut first = coalescer
        .generate(request(greedy(&[3], 20), SHARE_ALL))
        .await
        .expect("starts");
    let mut early = Vec::new();
    for _ in 0..10 {
        early.push(first.events.next().await.expect("token"));
    }
    let late = coalescer
        .generate(request(greedy(&[3], 20), SHARE_ALL))
        .await
        .expect("joins");
    assert_eq!(late.status, CacheStatus::Coalesced);
    let late_events = drain(late.events).await;
    early.extend(drain(first.events).await);
    assert_eq!(late_events, early);
    assert_eq!(late_events.len(), 21);
    assert_eq!(fake.generations(), 1);
}

#[tokio::test]
async fn the_generation_lives_until_its_last_subscriber_leaves() {
    let fake = Fake::new(5);
    let coalescer = Coalescer::new(fake.clone(), Duration::from_secs(30));
    let mut subs = Vec::new();
    for _ in 0..20 {
        subs.push(
            coalescer
                .generate(request(greedy(&[1], 30), SHARE_ALL))
                .await
                .expect("starts"),
        );
    }
    let last = subs.pop().expect("twenty");
    drop(subs);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(fake.live(), 1, "19 cancelled, one left: still generating");
    let events = drain(last.events).await;
    assert_eq!(events.len(), 31);
    assert!(matches!(events.last(), Some(TokenEvent::Finished(_))));

    // All gone: the generation is dropped at once.
    let mut subs = Vec::new();
    for _ in 0..20 {
        subs.push(
            coalescer
                .generate(request(greedy(&[2], 1000), SHARE_ALL))
                .await
                .expect("starts"),
        );
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(fake.live(), 1);
    drop(subs);
    for _ in 0..50 {
        if fake.live() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(fake.live(), 0, "cancelled with its last subscriber");
    assert_eq!(coalescer.in_flight(), 0);
}

#[tokio::test]
async fn a_coalesced_generation_runs_at_its_most_urgent_subscribers_tier() {
    let fake = Fake::new(5);
    let coalescer = Coalescer::new(fake.clone(), Duration::from_secs(30));
    let mut req = greedy(&[8], 20);
    req.priority = Priority::Low;
    let _low = coalescer
        .generate(request(req.clone(), SHARE_ALL))
        .await
        .expect("starts");
    req.priority = Priority::Background;
    let _background = coalescer
        .generate(request(req.clone(), SHARE_ALL))
        .await
        .expect("joins");
    req.priority = Priority::Critical;
    let _critical = coalescer
        .generate(request(req, SHARE_ALL))
        .await
        .expect("joins");
    let moved = fake.moved.lock().map(|m| m.clone()).unwrap_or_default();
    assert_eq!(
        moved,
        vec![Priority::Critical],
        "raised once, never lowered"
    );
}

#[tokio::test]
async fn sampling_without_a_seed_is_never_shared() {
    let fake = Fake::new(0);
    let pipeline = stack(&fake);
    let mut sampled = greedy(&[4], 5);
    sampled.sampling.temperature = 0.8;
    for _ in 0..3 {
        let g = pipeline
            .generate(request(sampled.clone(), SHARE_ALL))
            .await
            .expect("starts");
        assert_eq!(g.status, CacheStatus::Bypass);
        drain(g.events).await;
    }
    assert_eq!(fake.generations(), 3);
    // With a seed it is deterministic: stored, then a hit.
    sampled.sampling.seed = Some(11);
    for expected in [CacheStatus::Miss, CacheStatus::Hit] {
        let g = pipeline
            .generate(request(sampled.clone(), SHARE_ALL))
            .await
            .expect("starts");
        assert_eq!(g.status, expected);
        drain(g.events).await;
    }
    assert_eq!(fake.generations(), 4);
}

#[tokio::test]
async fn cache_hits_replay_the_original_and_differences_miss() {
    let fake = Fake::new(0);
    let pipeline = stack(&fake);
    let base = greedy(&[9, 9], 6);
    let first = pipeline
        .generate(request(base.clone(), SHARE_ALL))
        .await
        .expect("starts");
    assert_eq!(first.status, CacheStatus::Miss);
    let original = drain(first.events).await;
    let hit = pipeline
        .generate(request(base.clone(), SHARE_ALL))
        .await
        .expect("starts");
    assert_eq!(hit.status, CacheStatus::Hit);
    assert_eq!(drain(hit.events).await, original);
    assert_eq!(fake.generations(), 1);

    let mut variants = Vec::new();
    let mut v = base.clone();
    v.stop.stop_strings = vec!["zz".into()];
    variants.push(v);
    let mut v = base.clone();
    v.stop.max_tokens = 7;
    variants.push(v);
    let mut v = base.clone();
    v.sampling.temperature = 0.5;
    v.sampling.seed = Some(1);
    variants.push(v.clone());
    v.sampling.seed = Some(2);
    variants.push(v);
    for v in variants {
        let g = pipeline
            .generate(request(v, SHARE_ALL))
            .await
            .expect("starts");
        assert_eq!(g.status, CacheStatus::Miss);
        drain(g.events).await;
    }
    assert_eq!(fake.generations(), 5);

    // no-cache: a fresh generation; purge by model empties the store.
    let fresh = Sharing {
        coalesce: false,
        lookup: false,
        store: true,
    };
    let g = pipeline
        .generate(request(base.clone(), fresh))
        .await
        .expect("starts");
    assert_eq!(g.status, CacheStatus::Miss);
    drain(g.events).await;
    assert_eq!(pipeline.purge(Some("other")), 0);
    assert_eq!(pipeline.purge(Some("m")), 5);
    let g = pipeline
        .generate(request(base, SHARE_ALL))
        .await
        .expect("starts");
    assert_eq!(g.status, CacheStatus::Miss);
}

#[tokio::test]
async fn aborted_generations_are_not_stored() {
    let fake = Fake::new(2);
    let pipeline = stack(&fake);
    let base = greedy(&[5], 50);
    let mut g = pipeline
        .generate(request(base.clone(), SHARE_ALL))
        .await
        .expect("starts");
    g.events.next().await;
    drop(g);
    let g = pipeline
        .generate(request(base, SHARE_ALL))
        .await
        .expect("starts");
    assert_eq!(g.status, CacheStatus::Miss);
    assert_eq!(fake.generations(), 2);
}

#[tokio::test]
async fn a_stalled_subscriber_is_cut_off_without_stalling_others() {
    let fake = Fake::new(5);
    let coalescer = Coalescer::new(fake.clone(), Duration::from_millis(30));
    let reader = coalescer
        .generate(request(greedy(&[6], 40), SHARE_ALL))
        .await
        .expect("starts");
    let mut stalled = coalescer
        .generate(request(greedy(&[6], 40), SHARE_ALL))
        .await
        .expect("joins");
    let events = drain(reader.events).await;
    assert_eq!(events.len(), 41, "the reader was not held back");
    let mut rest = Vec::new();
    while let Some(e) = stalled.events.next().await {
        rest.push(e);
    }
    assert!(
        matches!(rest.first(), Some(TokenEvent::Error(m)) if m.contains("stopped reading")),
        "{rest:?}"
    );
}

#[tokio::test]
async fn readers_waiting_for_slow_events_are_not_cut_off() {
    // Every event takes longer than the stall timeout (a long prefill
    // before the first): readers that wait are not behind.
    let fake = Fake::new(60);
    let coalescer = Coalescer::new(fake.clone(), Duration::from_millis(30));
    let first = coalescer
        .generate(request(greedy(&[8], 3), SHARE_ALL))
        .await
        .expect("starts");
    let second = coalescer
        .generate(request(greedy(&[8], 3), SHARE_ALL))
        .await
        .expect("joins");
    let (a, b) = tokio::join!(drain(first.events), drain(second.events));
    for events in [a, b] {
        assert_eq!(events.len(), 4, "{events:?}");
        assert!(matches!(events.last(), Some(TokenEvent::Finished(_))));
    }
}

#[tokio::test]
async fn greedy_choices_share_a_generation_and_lengths_default_by_endpoint() {
    let fake = Fake::new(0);
    let pipeline = stack(&fake);
    let submission = |endpoint| Submission {
        model: "m".into(),
        tenant: None,
        sharing: SHARE_ALL,
        limits: RequestLimits {
            max_context: 32,
            vocab_size: 100,
        },
        endpoint,
        max_tokens_cap: None,
        deadlines: crate::generate::Deadlines::default(),
        span: tracing::Span::none(),
    };
    let sampling = |v: serde_json::Value| {
        ingot_protocol::parse_json::<SamplingFields>(&v)
            .expect("fields")
            .validate()
            .expect("valid")
    };
    // n = 3 greedy choices of one prompt: one generation, three choices.
    let s = submission(Endpoint::Completions);
    let (jobs, status) = s
        .submit(
            &pipeline,
            crate::generate::Prompts::free(&[vec![1, 2]]),
            &sampling(serde_json::json!({"n": 3, "temperature": 0, "max_tokens": 4})),
        )
        .await
        .expect("starts");
    assert_eq!(jobs.len(), 3);
    assert_eq!(status, CacheStatus::Miss);
    let results = crate::generate::collect(jobs).await.expect("completes");
    assert!(results.iter().all(|r| r.text == results[0].text));
    assert_eq!(fake.generations(), 1);
    // Completions default to 16 tokens, chat to the rest of the context.
    let defaults = |endpoint| {
        submission(endpoint)
            .requests(
                crate::generate::Prompts::free(&[vec![1, 2]]),
                &sampling(serde_json::json!({})),
            )
            .expect("valid")[0]
            .2
            .stop
            .max_tokens
    };
    assert_eq!(defaults(Endpoint::Completions), 16);
    assert_eq!(defaults(Endpoint::Chat), 30);
}

#[test]
fn the_costliest_status_names_a_response() {
    use CacheStatus::*;
    assert_eq!(Hit.combine(Miss), Miss);
    assert_eq!(Coalesced.combine(Hit), Coalesced);
    assert_eq!(Bypass.combine(Hit), Hit);
    assert_eq!(Hit.combine(Hit), Hit);
}

#[test]
fn cache_control_directives() {
    use crate::CacheControl;
    assert_eq!(CacheControl::parse(None), CacheControl::Default);
    assert_eq!(CacheControl::parse(Some("No-Cache")), CacheControl::NoCache);
    assert_eq!(
        CacheControl::parse(Some("max-age=0, no-store")),
        CacheControl::NoStore
    );
    assert_eq!(
        CacheControl::parse(Some("max-age=0")),
        CacheControl::Default
    );
}

#[tokio::test]
async fn both_bounds_hold() {
    let store = MemoryStore::new(CacheSettings {
        max_entries: 10,
        max_bytes: 1 << 20,
        ttl: Duration::from_secs(60),
    });
    let choice = Arc::new(CachedChoice {
        model: "m".into(),
        prompt: None,
        tokens: Vec::new(),
        completion: Completion {
            reason: FinishReason::Stop,
            prompt_tokens: 1,
            completion_tokens: 0,
            cached_tokens: 0,
            queue_time: Duration::ZERO,
        },
    });
    for i in 0..100u8 {
        store.insert(RequestKey([i; 16]), choice.clone()).await;
    }
    assert!(store.stats().entries <= 10, "{:?}", store.stats());
    let big = Arc::new(CachedChoice {
        prompt: None,
        tokens: vec![
            GeneratedToken {
                token: 1,
                text: "x".repeat(4096),
                logprob: 0.0,
                top_logprobs: Vec::new(),
            };
            64
        ],
        ..(*choice).clone()
    });
    let small = MemoryStore::new(CacheSettings {
        max_entries: 1000,
        max_bytes: 1 << 20,
        ttl: Duration::from_secs(60),
    });
    for i in 0..20u8 {
        small.insert(RequestKey([i; 16]), big.clone()).await;
    }
    assert!(small.stats().bytes <= 1 << 20, "{:?}", small.stats());
}
