//! The request key: a specified 128-bit hash of everything that decides a
//! generation's output, so identical requests share one generation
//! (coalescing) and one stored answer (response cache), and other
//! processes can compute the same key. The byte layout is documented in
//! docs/request-key.md; the fixed vectors below pin it.

use ingot_core::GrammarSpec;
use ingot_engine::EngineRequest;

/// Bumped whenever the layout changes (old cache entries then never match).
const DOMAIN: &[u8] = b"ingot.request-key.v1\0";

/// 128 bits of BLAKE3 over the canonical encoding of a request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestKey(pub [u8; 16]);

impl std::fmt::Debug for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RequestKey({self})")
    }
}

impl std::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Whether a request's output is a function of its inputs: greedy, or
/// sampled with a fixed seed. Only those are ever shared.
pub fn is_deterministic(request: &EngineRequest) -> bool {
    request.sampling.is_greedy() || request.sampling.seed.is_some()
}

/// Little-endian, length-prefixed fields fed to BLAKE3.
struct Encoder(blake3::Hasher);

impl Encoder {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.update(&[v]);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.update(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.update(&v.to_le_bytes());
        self
    }
    fn f32(&mut self, v: f32) -> &mut Self {
        self.u32(v.to_bits())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.update(s.as_bytes());
        self
    }
    fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            Some(v) => self.u8(1).u64(v),
            None => self.u8(0),
        }
    }
}

/// The key of `request` for `model`, scoped to `tenant` (tenants never
/// share answers). A greedy request's seed is ignored: it cannot change
/// an argmax. Its output grammar is part of it, so constrained and free
/// answers are never mixed (tools reach the engine only as prompt tokens
/// and a grammar, so both are covered).
pub fn request_key(tenant: Option<&str>, model: &str, request: &EngineRequest) -> RequestKey {
    let grammar = request.grammar.as_ref().map(|g| g.spec());
    key_with_grammar(tenant, model, request, grammar)
}

fn key_with_grammar(
    tenant: Option<&str>,
    model: &str,
    request: &EngineRequest,
    grammar: Option<&GrammarSpec>,
) -> RequestKey {
    let s = &request.sampling;
    let stop = &request.stop;
    let seed = if s.is_greedy() { None } else { s.seed };
    let mut e = Encoder(blake3::Hasher::new());
    e.0.update(DOMAIN);
    match tenant {
        Some(t) => e.u8(1).str(t),
        None => e.u8(0),
    };
    e.str(model).u64(request.prompt.len() as u64);
    for &id in &request.prompt {
        e.u32(id);
    }
    e.f32(s.temperature)
        .u64(s.top_k as u64)
        .f32(s.top_p)
        .f32(s.min_p)
        .f32(s.repetition_penalty)
        .f32(s.frequency_penalty)
        .f32(s.presence_penalty)
        .opt_u64(seed)
        .opt_u64(s.logprobs.map(|n| n as u64))
        .u64(stop.max_tokens as u64)
        .u64(stop.stop_strings.len() as u64);
    for text in &stop.stop_strings {
        e.str(text);
    }
    e.u64(stop.stop_token_ids.len() as u64);
    for &id in &stop.stop_token_ids {
        e.u32(id);
    }
    e.u8(u8::from(stop.ignore_eos));
    // Each appended only when present, so keys without them are unchanged.
    if let Some(g) = grammar {
        e.u8(1).u8(g.tag()).str(g.source());
    }
    if let Some(n) = s.prompt_logprobs {
        e.u8(b'P').u64(n as u64);
    }
    if !s.logit_bias.is_empty() {
        e.u8(b'B').u64(s.logit_bias.len() as u64);
        for &(id, bias) in &s.logit_bias {
            e.u32(id).f32(bias);
        }
    }
    let digest = e.0.finalize();
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest.as_bytes()[..16]);
    RequestKey(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_core::{Priority, SamplingParams, StopCriteria};

    fn request(prompt: &[u32]) -> EngineRequest {
        EngineRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingParams::GREEDY,
            stop: StopCriteria {
                max_tokens: 16,
                ..Default::default()
            },
            priority: Priority::Normal,
            grammar: None,
            speculative: true,
        }
    }

    #[test]
    fn every_output_relevant_field_changes_the_key() {
        let base = request(&[1, 2, 3]);
        let k = |r: &EngineRequest| request_key(None, "m", r);
        let k0 = k(&base);
        let mut variants: Vec<EngineRequest> = Vec::new();
        let mut push = |f: &dyn Fn(&mut EngineRequest)| {
            let mut r = base.clone();
            f(&mut r);
            variants.push(r);
        };
        push(&|r| r.prompt.push(4));
        push(&|r| r.prompt = vec![1, 2]);
        push(&|r| r.stop.max_tokens = 17);
        push(&|r| r.stop.stop_strings = vec!["x".into()]);
        push(&|r| r.stop.stop_strings = vec!["".into()]);
        push(&|r| r.stop.stop_token_ids = vec![3]);
        push(&|r| r.stop.ignore_eos = true);
        push(&|r| r.sampling.logprobs = Some(0));
        push(&|r| r.sampling.logprobs = Some(2));
        push(&|r| r.sampling.repetition_penalty = 1.1);
        push(&|r| r.sampling.frequency_penalty = 0.5);
        push(&|r| r.sampling.presence_penalty = 0.5);
        push(&|r| r.sampling.logit_bias = vec![(5, -100.0)]);
        push(&|r| r.sampling.logit_bias = vec![(5, 100.0)]);
        push(&|r| r.sampling.logit_bias = vec![(6, -100.0)]);
        push(&|r| {
            r.sampling.temperature = 0.7;
            r.sampling.seed = Some(1);
        });
        push(&|r| {
            r.sampling.temperature = 0.7;
            r.sampling.seed = Some(2);
        });
        push(&|r| {
            r.sampling.temperature = 0.7;
            r.sampling.seed = Some(1);
            r.sampling.top_p = 0.9;
        });
        let mut keys: Vec<RequestKey> = variants.iter().map(k).collect();
        keys.push(k0);
        keys.push(request_key(None, "other", &base));
        keys.push(request_key(Some("tenant-a"), "m", &base));
        keys.push(request_key(Some(""), "m", &base));
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "{keys:?}");
    }

    #[test]
    fn priority_and_greedy_seed_do_not_change_the_key() {
        let base = request(&[5, 6]);
        let mut other = base.clone();
        other.priority = Priority::Critical;
        other.sampling.seed = Some(9);
        assert_eq!(
            request_key(None, "m", &base),
            request_key(None, "m", &other)
        );
    }

    #[test]
    fn determinism() {
        let mut r = request(&[1]);
        assert!(is_deterministic(&r));
        r.sampling.temperature = 0.8;
        assert!(!is_deterministic(&r));
        r.sampling.seed = Some(3);
        assert!(is_deterministic(&r));
    }

    /// Pins the layout of docs/request-key.md. The expected values were
    /// computed independently with Python's `blake3` package from the
    /// layout as documented (scripts in docs/request-key.md).
    #[test]
    fn fixed_vectors() {
        let r = request(&[1, 2, 3]);
        assert_eq!(request_key(None, "smollm2", &r).to_string(), VECTOR_GREEDY);
        let mut s = request(&[42]);
        s.sampling.temperature = 0.5;
        s.sampling.seed = Some(7);
        s.stop.stop_strings = vec!["\n\n".into()];
        s.sampling.logprobs = Some(2);
        assert_eq!(
            request_key(Some("acme"), "smollm2", &s).to_string(),
            VECTOR_SEEDED
        );
        let mut p = request(&[1, 2, 3]);
        p.sampling.logprobs = Some(1);
        p.sampling.prompt_logprobs = Some(1);
        p.stop.max_tokens = 0;
        assert_eq!(
            request_key(None, "smollm2", &p).to_string(),
            VECTOR_PROMPT_LOGPROBS
        );
    }

    #[test]
    fn the_output_grammar_changes_the_key() {
        let r = request(&[1, 2, 3]);
        let k = |g: Option<&GrammarSpec>| key_with_grammar(None, "smollm2", &r, g);
        let object = GrammarSpec::JsonSchema(r#"{"type":"object"}"#.into());
        let keys = [
            k(None),
            k(Some(&object)),
            k(Some(&GrammarSpec::Regex(r#"{"type":"object"}"#.into()))),
            k(Some(&GrammarSpec::Lark("start: \"a\"".into()))),
        ];
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len());
        assert_eq!(k(None).to_string(), VECTOR_GREEDY);
        assert_eq!(k(Some(&object)).to_string(), VECTOR_JSON_OBJECT);
    }

    const VECTOR_JSON_OBJECT: &str = "2d243435409cab391dace6489f4ca415";
    const VECTOR_PROMPT_LOGPROBS: &str = "aa6d4e3e3a24a73af50a3ac642ba596b";
    const VECTOR_GREEDY: &str = "b29398efdccf87f5f4ed3796628ef544";
    const VECTOR_SEEDED: &str = "99f907e6f43fc299ed053721b024d206";
}
