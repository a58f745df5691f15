// Picking each row's next token on the device, so that at large batch only
// ids leave the GPU. One block per row of f32 logits.
//
//   argmax_rows:  greedy (lowest id on ties, as the host sampler).
//   sample_rows:  penalties in place, then temperature, top-k, min-p and
//                 top-p (over the top-k mass) as the host sampler orders
//                 them, then a draw among the survivors; for rows that ask,
//                 also the logprobs of the pick and of the most likely
//                 tokens under the raw distribution (before penalties), so
//                 logprobs requests need no logits on the host either.
//
// Thresholds are found without sorting: the k-th largest logit (top-k) and
// the logit where the mass from the top reaches top_p (top-p) are searched
// over the order-preserving 32-bit keys of the logits, 16 sub-ranges per
// pass over the row, so at most 8 passes each. The draw is Gumbel-max,
// argmax(x_i + g_i) over the survivors, with g_i a pure function of the
// row's random bits and i: the same as an inverse-CDF draw in distribution,
// without a prefix sum over the vocabulary.
#include "common.cuh"

constexpr int SAMPLE_THREADS = 512;
constexpr int PIVOTS = 15;

// Per-row parameters, as `encode_rows` in ingot-runner-cuda's sampling.rs
// writes them (12 words).
struct SampleParams {
  float temperature, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty;
  int top_k;  // 0: off
  int seen_start, seen_count;
  int logprobs;  // -1: none; else how many top alternatives (<= MAX_TOP_LOGPROBS)
  unsigned long long random;
};

constexpr int MAX_TOP_LOGPROBS = 20;
// A row's logprobs (natural log, raw distribution): the picked token's and
// the `count` most likely tokens', largest first, ties to the lower id (as
// the host sampler's top_n). 42 words, as sampling.rs reads them.
struct RowLogprobs {
  float chosen;
  int count;
  int ids[MAX_TOP_LOGPROBS];
  float values[MAX_TOP_LOGPROBS];
};

// Calls f(i, row[i]) for this thread's share of the row. Rows of a
// multiple of 4 are read as float4, four per thread per round, so each
// thread keeps 16 values in flight (the passes are latency-bound otherwise).
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ row, int vocab, F f) {
  if ((vocab & 3) != 0) {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) f(i, row[i]);
    return;
  }
  const float4* r4 = reinterpret_cast<const float4*>(row);
  const int n4 = vocab >> 2, stride = blockDim.x;
  int i = threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = r4[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = 4 * (i + u * stride);
      f(j, v[u].x);
      f(j + 1, v[u].y);
      f(j + 2, v[u].z);
      f(j + 3, v[u].w);
    }
  }
  for (; i < n4; i += stride) {
    const float4 v = r4[i];
    f(4 * i, v.x);
    f(4 * i + 1, v.y);
    f(4 * i + 2, v.z);
    f(4 * i + 3, v.w);
  }
}

// Keys that order like the floats they come from.
__device__ __forceinline__ unsigned ordered_key(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (value, index) maximum over the block, lowest index on ties; every thread
// gets the winner's index.
__device__ __forceinline__ int block_argmax(float v, int idx) {
  __shared__ float best_v[32];
  __shared__ int best_i[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { best_v[warp] = v; best_i[warp] = idx; }
  __syncthreads();
  const int nw = blockDim.x >> 5;
  v = lane < nw ? best_v[lane] : -INFINITY;
  idx = lane < nw ? best_i[lane] : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
  }
  __syncthreads();  // best_* may be reused by the caller's next call
  return idx;
}

__device__ __forceinline__ int row_argmax(const float* row, int vocab) {
  float v = -INFINITY;
  int idx = 0x7fffffff;
  // Visits in increasing i per thread: ">" keeps the lowest index on ties.
  for_each_logit(row, vocab, [&](int i, float x) {
    if (x > v) { v = x; idx = i; }
  });
  idx = block_argmax(v, idx);
  // A row of NaNs has no maximum: report token 0 rather than garbage.
  return idx == 0x7fffffff ? 0 : idx;
}

// Greedy pick per row. Grid: rows; block: 1024 threads.
extern "C" __global__ void argmax_rows(const float* __restrict__ logits, int vocab, int* __restrict__ out) {
  pdl_begin();
  const int idx = row_argmax(logits + (size_t)blockIdx.x * vocab, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = idx;
}

// Sums PIVOTS values over the block; every thread gets the totals.
__device__ __forceinline__ void block_sums(float (&v)[PIVOTS]) {
  __shared__ float part[32][PIVOTS];
  __shared__ float total[PIVOTS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < PIVOTS; ++j) {
    const float s = warp_sum(v[j]);
    if (lane == 0) part[warp][j] = s;
  }
  __syncthreads();
  if (threadIdx.x < PIVOTS) {
    float s = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += part[w][threadIdx.x];
    total[threadIdx.x] = s;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < PIVOTS; ++j) v[j] = total[j];
  __syncthreads();
}

// The largest key t in [lo, hi] with weight(keys >= t) >= target, where an
// entry weighs 1 (MASS false: t is the target-th largest) or its
// probability relative to the best, exp2((l - max) * scale) (MASS true).
// Requires weight(keys >= lo) >= target.
template <bool MASS>
__device__ unsigned search_threshold(const float* row, int vocab, unsigned lo, unsigned hi, float target,
                                     float max, float scale) {
  while (lo < hi) {
    const unsigned long long step = ((unsigned long long)(hi - lo) + PIVOTS + 1) / (PIVOTS + 1);
    unsigned pivot[PIVOTS];  // past hi: clamped, never chosen
    float w_at[PIVOTS];      // weight of keys >= pivot[j]
#pragma unroll
    for (int j = 0; j < PIVOTS; ++j) {
      pivot[j] = (unsigned)min(lo + (j + 1) * step, 0xffffffffull);
      w_at[j] = 0.f;
    }
    for_each_logit(row, vocab, [&](int, float l) {
      const unsigned key = ordered_key(l);
      if (key < pivot[0]) return;
      const float w = MASS ? exp2f((l - max) * scale) : 1.f;
#pragma unroll
      for (int j = 0; j < PIVOTS; ++j) w_at[j] += key >= pivot[j] ? w : 0.f;
    });
    block_sums(w_at);
    int best = 0;
#pragma unroll
    for (int j = 0; j < PIVOTS; ++j)
      if (lo + (j + 1) * step <= hi && w_at[j] >= target) best = j + 1;
    const unsigned long long next_lo = lo + best * step;
    hi = (unsigned)min((unsigned long long)hi, next_lo + step - 1);
    lo = (unsigned)next_lo;
  }
  return lo;
}

// The row's largest and smallest logit; every thread gets both.
__device__ __forceinline__ void row_range(const float* row, int vocab, float& mx, float& mn) {
  mx = -INFINITY;
  mn = INFINITY;
  for_each_logit(row, vocab, [&](int, float l) {
    mx = fmaxf(mx, l);
    mn = fminf(mn, l);
  });
  mx = block_max(mx);
  mn = -block_max(-mn);
}

// log Z of the raw row, and its n largest entries as logprobs into lp (all
// threads call it; thread 0 writes). The n-th largest key t is searched as
// top-k's threshold; the entries above it (fewer than n) are gathered and
// sorted, and the rest of the n are the lowest ids whose key equals t.
__device__ float raw_logprobs(const float* row, int vocab, int n, RowLogprobs& lp) {
  float mx, mn;
  row_range(row, vocab, mx, mn);
  float z = 0.f;
  for_each_logit(row, vocab, [&](int, float l) { z += __expf(l - mx); });
  const float log_z = mx + logf(block_sum(z));
  n = min(min(n, MAX_TOP_LOGPROBS), vocab);
  if (n <= 0) {
    if (threadIdx.x == 0) lp.count = 0;
    return log_z;
  }
  const unsigned t = search_threshold<false>(row, vocab, ordered_key(mn), ordered_key(mx), (float)n, mx, 1.f);
  __shared__ int s_count;
  __shared__ int s_ids[MAX_TOP_LOGPROBS];
  __shared__ float s_vals[MAX_TOP_LOGPROBS];
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  for_each_logit(row, vocab, [&](int i, float l) {
    if (ordered_key(l) <= t) return;
    const int at = atomicAdd(&s_count, 1);  // < n by the choice of t
    s_ids[at] = i;
    s_vals[at] = l;
  });
  __syncthreads();
  const int above = s_count;
  // Ties at t, lowest ids first: one pass per slot (usually one).
  int count = above;
  for (int last = -1; count < n; ++count) {
    int best = 0x7fffffff;
    for_each_logit(row, vocab, [&](int i, float l) {
      if (i > last && i < best && ordered_key(l) == t) best = i;
    });
    best = block_argmax(0.f, best);  // equal values: the lowest id
    if (best == 0x7fffffff) break;   // fewer than n comparable entries (NaNs)
    last = best;
    if (threadIdx.x == 0) {
      s_ids[count] = best;
      s_vals[count] = row[best];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Insertion sort of the entries above t (equal values: lower id first).
    for (int a = 1; a < above; ++a) {
      const int id = s_ids[a];
      const float v = s_vals[a];
      int b = a - 1;
      for (; b >= 0 && (s_vals[b] < v || (s_vals[b] == v && s_ids[b] > id)); --b) {
        s_ids[b + 1] = s_ids[b];
        s_vals[b + 1] = s_vals[b];
      }
      s_ids[b + 1] = id;
      s_vals[b + 1] = v;
    }
    lp.count = count;
    for (int k = 0; k < count; ++k) {
      lp.ids[k] = s_ids[k];
      lp.values[k] = s_vals[k] - log_z;
    }
  }
  return log_z;
}

__device__ int pick(const float* row, int vocab, const SampleParams& p);

// Grid: rows; block: SAMPLE_THREADS. `seen` holds (token, count in output)
// pairs, `params[r].seen_count` of them from `seen_start`; `seen_raw`
// (same indexing) receives their logits before the penalties, so the
// pick's raw logprob survives them. `lp` (one per row) may be null.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(float* __restrict__ logits, int vocab, const SampleParams* __restrict__ params,
                const int2* __restrict__ seen, int* __restrict__ out, float* __restrict__ seen_raw,
                RowLogprobs* __restrict__ lp) {
  pdl_begin();
  const SampleParams p = params[blockIdx.x];
  float* row = logits + (size_t)blockIdx.x * vocab;
  const bool want_lp = lp != nullptr && p.logprobs >= 0;
  const float log_z = want_lp ? raw_logprobs(row, vocab, p.logprobs, lp[blockIdx.x]) : 0.f;

  // Penalties: each seen token once, so no two threads write one logit.
  for (int e = threadIdx.x; e < p.seen_count; e += blockDim.x) {
    const int2 s = seen[p.seen_start + e];
    if (s.x < 0 || s.x >= vocab) continue;
    float l = row[s.x];
    if (want_lp) seen_raw[p.seen_start + e] = l;
    if (p.repetition_penalty != 1.f) l = l > 0.f ? l / p.repetition_penalty : l * p.repetition_penalty;
    if (s.y > 0) l -= p.frequency_penalty * (float)s.y + p.presence_penalty;
    row[s.x] = l;
  }
  __syncthreads();

  const int idx = pick(row, vocab, p);
  if (threadIdx.x == 0) out[blockIdx.x] = idx;
  if (!want_lp) return;
  // The pick's raw logit: its penalised one, unless it was seen.
  __shared__ float s_raw;
  if (threadIdx.x == 0) s_raw = row[idx];
  __syncthreads();
  for (int e = threadIdx.x; e < p.seen_count; e += blockDim.x)
    if (seen[p.seen_start + e].x == idx) s_raw = seen_raw[p.seen_start + e];
  __syncthreads();
  if (threadIdx.x == 0) lp[blockIdx.x].chosen = s_raw - log_z;
}

// The row's token after penalties: argmax when greedy, else the draw.
__device__ int pick(const float* row, int vocab, const SampleParams& p) {
  if (p.temperature == 0.f || p.top_k == 1) return row_argmax(row, vocab);
  // Weights relative to the best token: exp2((l - max) * scale).
  const float scale = LOG2E / p.temperature;
  float mx, mn;
  row_range(row, vocab, mx, mn);
  unsigned floor_key = ordered_key(mn);
  const unsigned top_key = ordered_key(mx);
  if (p.top_k > 1 && p.top_k < vocab)
    floor_key = search_threshold<false>(row, vocab, floor_key, top_key, (float)p.top_k, mx, scale);
  if (p.top_p < 1.f) {
    // Mass of the top-k survivors, then where top_p of it is reached.
    float z = 0.f;
    for_each_logit(row, vocab, [&](int, float l) {
      if (ordered_key(l) >= floor_key) z += exp2f((l - mx) * scale);
    });
    z = block_sum(z);
    floor_key = search_threshold<true>(row, vocab, floor_key, top_key, p.top_p * z, mx, scale);
  }
  // Gumbel-max over the survivors (min-p: weight >= min_p).
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for_each_logit(row, vocab, [&](int i, float l) {
    const float x = (l - mx) * scale;  // log2 of the relative weight
    if (ordered_key(l) < floor_key || exp2f(x) < p.min_p) return;
    // argmax of x_i + Gumbel_i; Gumbel = -log(E) with E = -log(v) ~ Exp(1)
    // for v uniform in (0, 1). E = 0 would make any token win, so v < 1:
    // the largest draw, (2^24 - 0.5) / 2^24, is not a float and would round
    // to 1.0 (once in 2^24 tokens: ~1 % of draws over a 152k vocabulary
    // picked a random token), so it is held at the largest float below 1.
    // The inner log is the accurate one: near 1 the fast log could return 0.
    const float v = fminf(((float)hash24(p.random, (uint64_t)i) + 0.5f) * (1.0f / 16777216.0f),
                          0.99999994f);
    const float g = x * (1.f / LOG2E) - __logf(-logf(v));
    if (g > best) { best = g; idx = i; }
  });
  idx = block_argmax(best, idx);
  // The best token always survives; only a row of NaNs has no winner.
  return idx == 0x7fffffff ? 0 : idx;
}

// Structured output: before sample_rows (or argmax), refuses the tokens a
// row's grammar does not allow by setting their logits to -inf. Grid: the
// constrained rows; block: 256 threads. Mask `b` (`words` 32-bit words,
// bit t % 32 of word t / 32 allows token t, ids past the words refused)
// applies to logits row `rows[b]`. The masks were computed on the host
// while this step's forward pass ran.
extern "C" __global__ void apply_token_masks(float* __restrict__ logits, int vocab,
                                             const unsigned* __restrict__ masks, int words,
                                             const int* __restrict__ rows) {
  pdl_begin();
  const unsigned* mask = masks + (size_t)blockIdx.x * words;
  float* row = logits + (size_t)rows[blockIdx.x] * vocab;
  for (int t = threadIdx.x; t < vocab; t += blockDim.x) {
    const int w = t >> 5;
    const bool allowed = w < words && ((mask[w] >> (t & 31)) & 1u);
    if (!allowed) row[t] = -INFINITY;
  }
}

// OpenAI's `logit_bias`: adds each entry's bias to one token's logit, a
// sparse add before the sampler (and its logprobs). Entry `i` is three
// 32-bit words: the logits row, the token id and the bias's f32 bits; a
// request gives each token once, so no two entries hit one logit. Grid:
// ceil(count / 256); block: 256 threads, one entry each.
extern "C" __global__ void apply_logit_bias(float* __restrict__ logits, int vocab,
                                            const unsigned* __restrict__ entries, int count) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const unsigned row = entries[3 * i], token = entries[3 * i + 1];
  if (token >= (unsigned)vocab) return;
  logits[(size_t)row * vocab + token] += __uint_as_float(entries[3 * i + 2]);
}
