// Attention over the paged KV cache. Every token's keys and values are in
// the cache before these run (rope_qkv writes them), so prefix-cached blocks,
// chunked prefill and decode all read the same way: token at position p
// attends to positions 0..=p of its sequence through its block table (on
// sliding-window layers, `window > 0`, to the last `window` of them).
//
//   paged_attention_hd{HD}_g{G}: one block per (token, kv head, split); its 4
//     warps walk the split's keys four at a time, each keeping an online
//     softmax for the G query heads that share the kv head (GQA reads K/V
//     once for all of them); the 4G dot products of a step are summed over
//     the warp in one reduce-scatter.
//     With num_splits > 1 it writes partial results for attention_combine
//     (flash-decoding: long contexts at small batch still fill the GPU).
//     paged_attention_fp8_*: the same over an FP8 e4m3 cache (kv_types.cuh),
//     dequantized as each lane reads its pieces from the ring.
//   paged_attention_tc{,_fp8}_hd{HD}_g{G}: the same grid and outputs on
//     tensor cores (below); the runner takes it from cuda.tc_decode_min_rows
//     decode rows.
//   prefill_attention_hd{HD}: one block per (query tile of one chunk, kv
//     head): 128 rows = 128 / G tokens x the G query heads sharing the kv
//     head, 8 warps; tensor cores (mma.sync bf16, FlashAttention-2 style
//     with S, P and O in registers) for QK^T and PV, each K/V tile staged
//     in shared memory once for the whole group, its copy running under
//     the previous step's tensor-core work: the O(n^2) work of prompts.
//     prefill_attention_fp8_hd{HD}: the same, FP8 K/V tiles copied raw
//     and converted to bf16 in shared memory.
#include "common.cuh"
#include "kv_types.cuh"
#include "mma.cuh"

constexpr int DECODE_WARPS = 4;
constexpr int DECODE_UNROLL = 4;

__host__ __device__ constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }
__host__ __device__ constexpr int log2_of(int n) { return n <= 1 ? 0 : 1 + log2_of(n / 2); }

// Sums V values (a power of two, at most 32) over the warp at once: each
// halving step sends half of the values to the partner lane and keeps the
// other half, so V sums cost V - 1 shuffles (+ the plain steps left) rather
// than 5 each. Lane l ends with the total of value l >> (5 - log2 V).
template <int V>
struct Partials {
  float v[V];
};

// One halving step per level: C values left, partner lanes O apart.
template <int C, int V>
__device__ __forceinline__ void reduce_halves(Partials<V>& p, int lane) {
  if constexpr (C > 1) {
    constexpr int H = C / 2, O = 16 * C / V;
    // Bitwise choice (not a select): the compiler would otherwise turn
    // "upper ? v[a] : v[b]" into a dynamically indexed, local-memory array.
    const int upper = (lane & O) ? -1 : 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const int lo = __float_as_int(p.v[i]), hi = __float_as_int(p.v[H + i]);
      const float keep = __int_as_float((lo & ~upper) | (hi & upper));
      const float send = __int_as_float((hi & ~upper) | (lo & upper));
      p.v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    reduce_halves<H, V>(p, lane);
  }
}

template <int V>
__device__ __forceinline__ float warp_reduce_scatter(Partials<V> p, int lane) {
  reduce_halves<V, V>(p, lane);
  float r = p.v[0];
#pragma unroll
  for (int o = 16 / V; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// Ring stages of the decode kernel: the static shared memory (48 KiB) holds
// 4 bf16 stages up to head_dim 128, 2 at 256; FP8 stages are half the
// size, so twice as many keep the same bytes in flight.
__host__ __device__ constexpr int decode_stages(int hd, int kv_bytes) { return (hd <= 128 ? 4 : 2) * (2 / kv_bytes); }

// A lane's piece of a K/V row into the ring: cp.async for 4 to 16 bytes;
// the 2-byte pieces of FP8 at head_dim 64 (below cp.async's smallest size)
// are copied directly.
template <int BYTES>
__device__ __forceinline__ void copy_piece(void* smem_dst, const void* gmem_src) {
  if constexpr (BYTES >= 4) {
    cp_async<BYTES>(smem_dst, gmem_src);
  } else {
    static_assert(BYTES == 2, "K/V pieces are 2 to 16 bytes");
    *static_cast<unsigned short*>(smem_dst) = *static_cast<const unsigned short*>(gmem_src);
  }
}

// Merges the per-warp online softmax states of one (token, kv head, split)
// block (s_acc: [DECODE_WARPS][G][HD]) and writes the output rows, or the
// split's partials for attention_combine.
template <int HD, int G>
__device__ __forceinline__ void store_decode_result(const float* s_acc, const float (&s_m)[DECODE_WARPS][G],
                                                    const float (&s_l)[DECODE_WARPS][G], int b, int tok, int kvh,
                                                    int split, int num_heads, int num_splits, bf16* out,
                                                    float* part_acc, float* part_ml) {
  const int qd = num_heads * HD;
  for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
    const int g = idx / HD, d = idx % HD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < DECODE_WARPS; ++w) mx = fmaxf(mx, s_m[w][g]);
    float sum_l = 0.f, sum_a = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < DECODE_WARPS; ++w) {
        const float f = exp2f(s_m[w][g] - mx);
        sum_l += s_l[w][g] * f;
        sum_a += s_acc[(w * G + g) * HD + d] * f;
      }
    }
    const int h = kvh * G + g;
    if (num_splits == 1) {
      out[(size_t)tok * qd + h * HD + d] = to_bf16(sum_l > 0.f ? sum_a / sum_l : 0.f);
    } else {
      const size_t p = ((size_t)b * num_heads + h) * num_splits + split;
      part_acc[p * HD + d] = sum_a;
      if (d == 0) {
        part_ml[2 * p] = mx;
        part_ml[2 * p + 1] = sum_l;
      }
    }
  }
}

template <int HD, int G, typename KV>
__device__ __forceinline__ void decode_attention(
    const bf16* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ table_stride, const int* __restrict__ token_seq,
    const int* __restrict__ positions, const int* __restrict__ token_ids, bf16* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int num_heads, int num_kv_heads,
    int block_size, float scale_log2, int num_splits, const void* prefetch, unsigned long long prefetch_bytes,
    int prefetch_mode, int window) {
  // At small batch this kernel is latency-bound: DRAM is free to bring in
  // the output projection's weights (bit 0: before the wait, i.e. while
  // the q/k/v GEMV still runs).
  if (prefetch_mode & 1) l2_prefetch(prefetch, prefetch_bytes, prefetch_mode);
  pdl_begin();
  if (!(prefetch_mode & 1)) l2_prefetch(prefetch, prefetch_bytes, prefetch_mode);
  constexpr int D = HD / 32;
  constexpr int S = decode_stages(HD, sizeof(KV));
  // Per warp, S stages of its lanes' K/V pieces (cp.async ring); after the
  // loop the same memory holds the warps' accumulators.
  using Ring = KV[DECODE_WARPS][S][DECODE_UNROLL][2][32][D];
  using Acc = float[DECODE_WARPS][G][HD];
  __shared__ __align__(16) unsigned char smem[sizeof(Ring) > sizeof(Acc) ? sizeof(Ring) : sizeof(Acc)];
  Ring& ring = *reinterpret_cast<Ring*>(smem);
  Acc& s_acc = *reinterpret_cast<Acc*>(smem);
  __shared__ float s_m[DECODE_WARPS][G], s_l[DECODE_WARPS][G];
  const int b = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int tok = token_ids ? token_ids[b] : b;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int qd = num_heads * HD;
  const int ctx = positions[tok] + 1;
  // Sliding-window layers see only the last `window` positions (0: all);
  // the splits divide that range, so keys outside it are never read.
  const int lo = window > 0 ? max(0, ctx - window) : 0;
  const int per_split = (ctx - lo + num_splits - 1) / num_splits;
  const int start = lo + split * per_split, end = min(ctx, start + per_split);
  const int* table = block_tables + (size_t)token_seq[tok] * *table_stride;

  float qv[G][D], acc[G][D], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    load_bf16<D>(q + (size_t)tok * qd + (kvh * G + g) * HD + lane * D, qv[g]);
#pragma unroll
    for (int d = 0; d < D; ++d) {
      qv[g][d] *= scale_log2;
      acc[g][d] = 0.f;
    }
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  constexpr int V = pow2_at_least(G * DECODE_UNROLL);
  constexpr int SHIFT = 5 - log2_of(V);  // lane >> SHIFT: the score a lane ends with
  // Each lane streams its own D-element pieces of every key row through a
  // ring of S stages (cp.async): S - 1 batches stay in flight while one is
  // used, without holding them in registers. A lane only reads what it
  // copied itself, so no barrier is needed.
  constexpr int STEP = DECODE_WARPS * DECODE_UNROLL;
  auto issue = [=, &ring](int st, int j0) {
    if (j0 < end) {
#pragma unroll
      for (int u = 0; u < DECODE_UNROLL; ++u) {
        const int j = min(j0 + u, end - 1);
        const size_t off = kv_index(table[j / block_size], kvh, j % block_size, num_kv_heads, block_size, HD) + lane * D;
        copy_piece<D * sizeof(KV)>(ring[warp][st][u][0][lane], k_cache + off);
        copy_piece<D * sizeof(KV)>(ring[warp][st][u][1][lane], v_cache + off);
      }
    }
    cp_async_commit();  // empty past the end: keeps the group count uniform
  };
  int next = start + warp * DECODE_UNROLL;
#pragma unroll
  for (int st = 0; st < S - 1; ++st, next += STEP) issue(st, next);
  int stage = 0;
  for (int j0 = start + warp * DECODE_UNROLL; j0 < end; j0 += STEP) {
    issue((stage + S - 1) % S, next);
    next += STEP;
    cp_async_wait<S - 1>();
    float kv[DECODE_UNROLL][D], vv[DECODE_UNROLL][D];
#pragma unroll
    for (int u = 0; u < DECODE_UNROLL; ++u) {
      load_kv<D>(ring[warp][stage][u][0][lane], kv[u]);
      load_kv<D>(ring[warp][stage][u][1][lane], vv[u]);
    }
    stage = (stage + 1) % S;
    // Partial q·k of every (head, key) pair, then one reduce-scatter over
    // the warp for all of them (V - 1 + SHIFT shuffles instead of 5 each).
    Partials<V> part;
#pragma unroll
    for (int i = 0; i < V; ++i) part.v[i] = 0.f;
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int u = 0; u < DECODE_UNROLL; ++u)
#pragma unroll
        for (int d = 0; d < D; ++d) part.v[g * DECODE_UNROLL + u] += qv[g][d] * kv[u][d];
    const float mine = warp_reduce_scatter<V>(part, lane);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float sc[DECODE_UNROLL];
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < DECODE_UNROLL; ++u) {
        sc[u] = __shfl_sync(0xffffffffu, mine, (g * DECODE_UNROLL + u) << SHIFT);
        if (j0 + u >= end) sc[u] = -INFINITY;
        m_new = fmaxf(m_new, sc[u]);
      }
      // One rescale per group of keys; the first key is always valid.
      const float corr = exp2f(m[g] - m_new);
      l[g] *= corr;
#pragma unroll
      for (int d = 0; d < D; ++d) acc[g][d] *= corr;
#pragma unroll
      for (int u = 0; u < DECODE_UNROLL; ++u) {
        const float pr = exp2f(sc[u] - m_new);
        l[g] += pr;
#pragma unroll
        for (int d = 0; d < D; ++d) acc[g][d] += pr * vv[u][d];
      }
      m[g] = m_new;
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring before it holds accumulators
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int d = 0; d < D; ++d) s_acc[warp][g][lane * D + d] = acc[g][d];
  }
  __syncthreads();
  store_decode_result<HD, G>(&s_acc[0][0][0], s_m, s_l, b, tok, kvh, split, num_heads, num_splits, out, part_acc,
                             part_ml);
}

#define DECODE_KERNEL(HD, G) DECODE_KERNEL_OF(paged_attention_hd##HD##_g##G, HD, G, bf16) \
  DECODE_KERNEL_OF(paged_attention_fp8_hd##HD##_g##G, HD, G, fp8)
#define DECODE_KERNEL_OF(NAME, HD, G, KV)                                                                  \
  extern "C" __global__ void __launch_bounds__(DECODE_WARPS * 32) NAME(                                   \
      const bf16* q, const KV* k_cache, const KV* v_cache, const int* block_tables, const int* table_stride,      \
      const int* token_seq, const int* positions, const int* token_ids, bf16* out, float* part_acc,        \
      float* part_ml, int num_heads, int num_kv_heads, int block_size, float scale_log2, int num_splits,    \
      const void* prefetch, unsigned long long prefetch_bytes, int prefetch_mode, int window) {             \
    decode_attention<HD, G, KV>(q, k_cache, v_cache, block_tables, table_stride, token_seq, positions,         \
                            token_ids, out, part_acc, part_ml, num_heads, num_kv_heads, block_size,        \
                            scale_log2, num_splits, prefetch, prefetch_bytes, prefetch_mode, window);      \
  }
#define DECODE_KERNEL_G(G, HD) DECODE_KERNEL(HD, G)
#define DECODE_KERNELS(HD) EACH_N_1_TO_8(DECODE_KERNEL_G, HD)
DECODE_KERNELS(64)
DECODE_KERNELS(128)
DECODE_KERNELS(256)

// Merges the splits of paged_attention. Grid: (tokens, heads); block: 128
// (at most 32 splits, the host's MAX_SPLITS). Warp 0 weighs the splits, a
// lane each (w_s = exp2(m_s - max)), into shared memory; every thread then
// sums its dimension's partials and the l_s with those weights, both in
// split order: the bits of the serial per-thread loop this replaced, which
// the fused small-model block (fused_block.cu) also reproduces, without
// its serial L2 loads (SmolLM2 batch 1 +4.6 % on an H100,
// docs/perf/small-models.md).
constexpr int COMBINE_MAX_SPLITS = 32;

extern "C" __global__ void attention_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                             const int* __restrict__ token_ids, bf16* __restrict__ out,
                                             int num_heads, int hd, int num_splits) {
  __shared__ float s_w[COMBINE_MAX_SPLITS], s_l[COMBINE_MAX_SPLITS];
  pdl_begin();
  const int b = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31;
  const int tok = token_ids ? token_ids[b] : b;
  const size_t base = ((size_t)b * num_heads + h) * num_splits;
  if (threadIdx.x < 32) {
    const float m = lane < num_splits ? part_ml[2 * (base + lane)] : -INFINITY;
    float mx = m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    s_w[lane] = mx == -INFINITY ? 0.f : exp2f(m - mx);
    s_l[lane] = lane < num_splits ? part_ml[2 * (base + lane) + 1] : 0.f;
  }
  __syncthreads();
  float sum_l = 0.f;
  for (int s = 0; s < num_splits; ++s) sum_l += s_l[s] * s_w[s];
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const float* acc = part_acc + base * hd + d;
    float sum_a = 0.f;
#pragma unroll 8
    for (int s = 0; s < num_splits; ++s) sum_a += acc[(size_t)s * hd] * s_w[s];
    out[((size_t)tok * num_heads + h) * hd + d] = to_bf16(sum_l > 0.f ? sum_a / sum_l : 0.f);
  }
}

// ---------------------------------------------------------------------------
// Prefill: 128 query rows x 64 keys per tile, 8 warps of 16 rows each, in
// the FlashAttention-2 arrangement: S = QK^T, the online softmax and O stay
// in registers (mma.sync m16n8k16 fragments; P is reused as the A operand
// of PV without leaving them). Q (128 rows), K and V (64 rows each) take
// 68 KiB of shared memory at head_dim 128 and at most 128 registers per
// thread, so 2 blocks (16 warps) share an SM. Each staged K/V tile serves
// 128 rows (half the L2 traffic and copy work per FLOP of 64-row tiles),
// and the copies run under the tensor-core work: a key tile's V is copied
// while S = QK^T is computed, the next tile's K while O += PV is.

constexpr int KEY_TILE = 64;
constexpr int PREFILL_WARPS = 8;
constexpr int PREFILL_MIN_BLOCKS = 2;  // blocks per SM: 128 registers per thread
constexpr int PREFILL_ROWS = 16 * PREFILL_WARPS;
constexpr int PREFILL_THREADS = 32 * PREFILL_WARPS;

template <int HD>
struct PrefillSmem {
  static constexpr int LD = HD + 8;  // bf16 row stride: conflict-free ldmatrix
  static constexpr int Q_ELEMS = PREFILL_ROWS * LD;
  static constexpr int KV_ELEMS = KEY_TILE * LD;
  static constexpr int BF16_BYTES = (Q_ELEMS + 2 * KV_ELEMS) * 2;  // Q, K, V
  // FP8 caches also stage each K or V tile raw before converting it.
  static constexpr int bytes(int kv_bytes) { return BF16_BYTES + (kv_bytes == 1 ? KEY_TILE * HD : 0); }
};

// Starts copying the tile's query rows (token r / G, head r % G of the kv
// head's group; zeros past the tile's n tokens) into shared memory.
template <int HD>
__device__ __forceinline__ void stage_q(bf16* sQ, const bf16* q, int t0, int n, int group, int kvh, int qd) {
  constexpr int VEC = HD / 8;  // 16-byte pieces per row
  for (int idx = threadIdx.x; idx < PREFILL_ROWS * VEC; idx += PREFILL_THREADS) {
    const int r = idx / VEC, c = idx % VEC, tok = r / group;
    bf16* d = sQ + r * PrefillSmem<HD>::LD + c * 8;
    if (tok < n) {
      cp_async_cg16(d, q + (size_t)(t0 + tok) * qd + (kvh * group + r % group) * HD + c * 8);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// One thread's share of staging a K or V tile: PIECES pieces of rows
// row0 + i * STEP at one column, each 16 bytes of the cache (8 bf16 or 16
// FP8 elements). K and V rows share their cache rows, found once per key
// tile (when its K is issued). Pieces go by cp.async: bf16 ones straight
// into the tile, FP8 ones into the raw area, which finish() converts into
// the tile (each thread converts only the pieces it copied, so the raw area
// needs no barrier and serves K and V in turn).
template <int HD, typename KV>
struct KvStage {
  static constexpr bool FP8 = sizeof(KV) == 1;
  static constexpr int ELEMS = 16 / sizeof(KV);  // elements per piece
  static constexpr int VEC = HD / ELEMS;         // pieces per row
  static constexpr int STEP = PREFILL_THREADS / VEC;
  static constexpr int PIECES = KEY_TILE / STEP;
  static_assert(PREFILL_THREADS % VEC == 0 && KEY_TILE % STEP == 0, "whole rows per pass");

  const int* table;
  int kvh, num_kv_heads, block_size, first_key, last;
  int row0 = threadIdx.x / VEC, col = threadIdx.x % VEC;
  // Cache row (of HD elements; a cache of 2^31 rows would hold at least
  // 128 GiB) of each piece; -1: a key outside [first_key, last], zeros.
  int row[PIECES];

  __device__ __forceinline__ int tile_offset(int i) const {
    return (row0 + i * STEP) * PrefillSmem<HD>::LD + col * ELEMS;
  }
  // FP8: KEY_TILE x HD bytes after the bf16 tiles (addressed from the
  // shared-memory symbol: no pointer held in registers).
  __device__ __forceinline__ uint4* raw_piece(int i) const {
    extern __shared__ __align__(128) unsigned char smem[];
    return reinterpret_cast<uint4*>(smem + PrefillSmem<HD>::BF16_BYTES + (row0 + i * STEP) * HD + col * 16);
  }

  __device__ __forceinline__ void locate(int kt) {
#pragma unroll
    for (int i = 0; i < PIECES; ++i) {
      const int j = kt * KEY_TILE + row0 + i * STEP;
      row[i] = j < first_key || j > last ? -1
                                         : (table[j / block_size] * num_kv_heads + kvh) * block_size + j % block_size;
    }
  }

  __device__ __forceinline__ void issue(const KV* cache, bf16* tile) {
#pragma unroll
    for (int i = 0; i < PIECES; ++i) {
      const KV* src = cache + (size_t)row[i] * HD + col * ELEMS;
      if (row[i] < 0) {
        if constexpr (!FP8) *reinterpret_cast<uint4*>(tile + tile_offset(i)) = make_uint4(0, 0, 0, 0);
      } else if constexpr (FP8) {
        cp_async_cg16(raw_piece(i), src);
      } else {
        cp_async_cg16(tile + tile_offset(i), src);
      }
    }
    cp_async_commit();
  }

  // Completes this thread's pieces of the tile last issued (the block still
  // synchronizes before reading them).
  __device__ __forceinline__ void finish(bf16* tile) {
    cp_async_wait<0>();
    if constexpr (FP8) {
#pragma unroll
      for (int i = 0; i < PIECES; ++i) {
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if (row[i] >= 0) {
          const uint4 r = *raw_piece(i);
          lo = fp8x8_to_bf16x8(make_uint2(r.x, r.y));
          hi = fp8x8_to_bf16x8(make_uint2(r.z, r.w));
        }
        uint4* d = reinterpret_cast<uint4*>(tile + tile_offset(i));
        d[0] = lo;
        d[1] = hi;
      }
    }
  }
};

template <int HD, typename KV>
__device__ __forceinline__ void prefill_attention(
    const bf16* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ table_stride, const int* __restrict__ tiles,
    const int* __restrict__ positions, bf16* __restrict__ out, int num_heads, int num_kv_heads,
    int block_size, float scale_log2, int window) {
  pdl_begin();
  using L = PrefillSmem<HD>;
  constexpr int LD = L::LD, DT = HD / 8;  // DT: 8-wide column tiles of O
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + L::Q_ELEMS;
  bf16* sV = sK + L::KV_ELEMS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;  // fragment row group and column pair

  // Rows are (token, query head) pairs of one kv head's group: the G heads
  // that share K/V read each staged K/V tile together (GQA).
  // Tiles are listed in prompt order; the last ones see the most keys, so
  // they are started first and the short ones fill the tail.
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int t0 = tiles[3 * tile], n = tiles[3 * tile + 1], seq = tiles[3 * tile + 2];
  const int kvh = blockIdx.y, group = num_heads / num_kv_heads;
  const int qd = num_heads * HD;
  const int p0 = positions[t0], last = p0 + n - 1;
  // Sliding window (0: none): row at position p sees p - window + 1 ..= p;
  // keys before the first row's window are neither read nor staged.
  const int first_key = window > 0 ? max(0, p0 - window + 1) : 0;
  KvStage<HD, KV> kv{block_tables + (size_t)seq * *table_stride, kvh, num_kv_heads, block_size, first_key, last};

  int kt = first_key / KEY_TILE;
  const int key_tiles = last / KEY_TILE + 1;
  stage_q<HD>(sQ, q, t0, n, group, kvh, qd);
  kv.locate(kt);
  kv.issue(k_cache, sK);
  kv.finish(sK);
  __syncthreads();

  // This thread's two rows of the warp's 16: g and g + 8.
  int qpos[2], qlo[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    qpos[i] = p0 + min((warp * 16 + g + 8 * i) / group, n - 1);
    qlo[i] = window > 0 ? qpos[i] - window + 1 : 0;
  }
  float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d][e] = 0.f;
  const bf16* q_frag = sQ + (warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8;

  for (; kt < key_tiles; ++kt) {
    kv.issue(v_cache, sV);  // the rows located with this tile's K

    // S = Q K^T: 8 column tiles of 8 keys.
    float s[KEY_TILE / 8][4];
#pragma unroll
    for (int t = 0; t < KEY_TILE / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      unsigned qf[4];  // reloaded per tile: registers go to O and S
      ldmatrix_x4(qf, q_frag + kk * 16);
#pragma unroll
      for (int np = 0; np < KEY_TILE / 16; ++np) {
        unsigned b[4];
        ldmatrix_x4(b, sK + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16(s[2 * np], qf, b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf, b[2], b[3]);
      }
    }

    // Causal / window mask and the online softmax (log2 domain, the scale
    // applied in the exponent) of both rows; each row's 64 scores are spread
    // over the 4 lanes of a quad. (Skipping the mask on tiles inside every
    // row's range costs registers: a second copy of this code.)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int t = 0; t < KEY_TILE / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * KEY_TILE + t * 8 + 2 * c + (e & 1);
        if (key > qpos[e >> 1] || key < qlo[e >> 1]) s[t][e] = -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[t][e]);
      }
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i] * scale_log2);
      // A row with no key yet (only possible before its first tile) keeps 0.
      const float corr = m[i] == -INFINITY ? 0.f : exp2f(m[i] - m_new);
      m[i] = m_new;
      base[i] = m_new == -INFINITY ? 0.f : m_new;
      l[i] *= corr;
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        o[d][2 * i] *= corr;
        o[d][2 * i + 1] *= corr;
      }
    }
#pragma unroll
    for (int t = 0; t < KEY_TILE / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(fmaf(s[t][e], scale_log2, -base[e >> 1]));
        l[e >> 1] += p;
        s[t][e] = p;
      }
    // P as bf16 A fragments (two S column tiles make one of 16 keys), packed
    // now so that half the registers stay live while the next K is issued.
    unsigned pa[KEY_TILE / 16][4];
#pragma unroll
    for (int kc = 0; kc < KEY_TILE / 16; ++kc) {
      pa[kc][0] = pack_bf16(s[2 * kc][0], s[2 * kc][1]);
      pa[kc][1] = pack_bf16(s[2 * kc][2], s[2 * kc][3]);
      pa[kc][2] = pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      pa[kc][3] = pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3]);
    }

    kv.finish(sV);
    __syncthreads();  // V is staged; every warp is done with K
    const bool more = kt + 1 < key_tiles;
    if (more) {
      kv.locate(kt + 1);
      kv.issue(k_cache, sK);
    }

    // O += P V.
#pragma unroll
    for (int kc = 0; kc < KEY_TILE / 16; ++kc) {
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        unsigned b[4];
        ldmatrix_x4_trans(b, sV + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * dp], pa[kc], b[0], b[1]);
        mma_bf16(o[2 * dp + 1], pa[kc], b[2], b[3]);
      }
    }
    if (more) kv.finish(sK);
    __syncthreads();  // the next K is staged; every warp is done with V
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float total = l[i];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const int r = warp * 16 + g + 8 * i;
    if (r / group >= n) continue;
    const float inv = 1.f / total;
    bf16* dst = out + (size_t)(t0 + r / group) * qd + (kvh * group + r % group) * HD;
#pragma unroll
    for (int d = 0; d < DT; ++d)
      *reinterpret_cast<__nv_bfloat162*>(dst + d * 8 + 2 * c) =
          __floats2bfloat162_rn(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
  }
}

#define PREFILL_KERNEL(HD) PREFILL_KERNEL_OF(prefill_attention_hd##HD, HD, bf16) \
  PREFILL_KERNEL_OF(prefill_attention_fp8_hd##HD, HD, fp8)
#define PREFILL_KERNEL_OF(NAME, HD, KV)                                                                     \
  extern "C" __global__ void __launch_bounds__(PREFILL_THREADS, PREFILL_MIN_BLOCKS) NAME(                  \
      const bf16* q, const KV* k_cache, const KV* v_cache, const int* block_tables, const int* table_stride,       \
      const int* tiles, const int* positions, bf16* out, int num_heads, int num_kv_heads, int block_size,  \
      float scale_log2, int window) {                                                                       \
    prefill_attention<HD, KV>(q, k_cache, v_cache, block_tables, table_stride, tiles, positions, out,          \
                          num_heads, num_kv_heads, block_size, scale_log2, window);                         \
  }
PREFILL_KERNEL(64)
PREFILL_KERNEL(128)

// ---------------------------------------------------------------------------
// Decode on tensor cores: paged_attention_tc{,_fp8}_hd{HD}_g{G}, the same
// grid, arguments, splits and outputs as paged_attention_* (so the runner's
// split choice and attention_combine serve both). The SIMT kernel spends
// per key FMAs, shuffle reductions and 32-fold redundant exp2 (with a bf16
// cache it still streams K/V as fast as this one, so bf16 caches keep it
// off by default; with an FP8 cache its per-key work binds and this kernel
// wins from ~192 rows: docs/perf/large-batch.md has both A/Bs); here the G
// query heads of the kv head are the rows of an m16n8k16 A tile (rows G..15
// are zero padding), so a warp computes S = Q K^T for 16 keys with HD/8 mmas
// and O += P V with HD/8 more, the online softmax of a row lives in one quad
// of lanes, and each probability is computed once. Each warp streams its own
// tiles of 16 keys through a cp.async ring (DecodeTcSmem) and the warps
// merge at the end. With an FP8 cache the tiles stay raw e4m3 in shared
// memory: ldmatrix reads the bytes, a lane converts its fragments with one
// cvt per pair (e4m3 is exact in f16) and the mmas take f16, so no tile
// goes through shared memory twice (the conversion through shared memory
// held this kernel to ~2 TB/s at 256 x 1k; docs/perf/large-batch.md).

constexpr int TC_KEYS = 16;  // keys per warp tile: one k-step of P V

// A warp's ring of (K, V) tiles, read by ldmatrix where they land. bf16: 3
// stages of padded bf16 tiles (104 KiB a block at head_dim 128, 2 blocks =
// 8 warps an SM, ~136 KiB per SM in flight). FP8: 4 stages of raw e4m3 rows
// (padded to a 16-byte multiple that ldmatrix reads without bank
// conflicts), converted in registers after ldmatrix: 72 KiB a block at
// head_dim 128, so 3 blocks = 12 warps share an SM, 3 tiles in flight each.
template <int HD, typename KV>
struct DecodeTcSmem {
  static constexpr bool RAW = sizeof(KV) == 1;
  static constexpr int STAGES = RAW ? 4 : 3;
  static constexpr int ROW = RAW ? HD + 16 : (HD + 8) * 2;  // bytes per staged key row
  static constexpr int TILE = TC_KEYS * ROW;                // bytes of one K or V tile
  static constexpr int WARP_BYTES = STAGES * 2 * TILE;
  static constexpr int BYTES = DECODE_WARPS * WARP_BYTES;
};

// 16-byte global -> shared copy that skips L1 (streamed K/V: L1 shares its
// capacity with the rings).
__device__ __forceinline__ void cp_async_cg(void* smem_dst, const void* gmem_src) {
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src) : "memory");
}

// Starts copying keys j0 .. j0 + 15 (clamped to end - 1: masked later,
// finite data) of one kv head into a ring stage, 16 bytes a piece. The
// tile's block-table entries are looked up once: with blocks of at least 16
// slots (the engine's are 16) it spans at most two.
template <int HD, typename KV>
__device__ __forceinline__ void stage_decode_tile(unsigned char* stage, const KV* __restrict__ k_cache,
                                                  const KV* __restrict__ v_cache, const int* table, int j0, int end,
                                                  int kvh, int num_kv_heads, int block_size, int lane) {
  using L = DecodeTcSmem<HD, KV>;
  constexpr int EL = 16 / sizeof(KV);  // elements per piece
  constexpr int VEC = HD / EL;         // pieces per row
  const int first = j0 / block_size, off0 = j0 - first * block_size, last = (end - 1) / block_size;
  const long long page0 = table[first], page1 = table[min(first + 1, last)];
  const bool two_pages_at_most = block_size >= TC_KEYS;
#pragma unroll
  for (int idx = lane; idx < TC_KEYS * VEC; idx += 32) {
    const int r = idx / VEC, c = idx % VEC;
    const int o = off0 + min(r, end - 1 - j0);  // slot offset from the tile's first block
    long long page;
    int slot;
    if (two_pages_at_most) {
      const bool next = o >= block_size;
      page = next ? page1 : page0;
      slot = next ? o - block_size : o;
    } else {
      page = table[first + o / block_size];
      slot = o % block_size;
    }
    const size_t off = kv_index(page, kvh, slot, num_kv_heads, block_size, HD) + c * EL;
    cp_async_cg(stage + r * L::ROW + c * 16, k_cache + off);
    cp_async_cg(stage + L::TILE + r * L::ROW + c * 16, v_cache + off);
  }
  cp_async_commit();
}

// Two e4m3 values (low byte first) as f16x2: exact, one instruction.
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned bits) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(bits & 0xffffu), __NV_E4M3);
  return (unsigned)h.x | ((unsigned)h.y << 16);
}

// Two floats as f16x2, clamped to f16's finite range (Q beyond +-65504
// would be inf; K/V are at most 448).
__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(fminf(fmaxf(lo, -65504.f), 65504.f), fminf(fmaxf(hi, -65504.f), 65504.f));
  return *reinterpret_cast<const unsigned*>(&v);
}

// The output dimension that accumulator element e of mma column tile d
// holds for lane quad position c. bf16: tile d is dims 8d..8d+7 in order.
// FP8: V's B fragments come from ldmatrix.trans of raw bytes, so a lane's
// column g is dims 2g and 2g + 1 of a 16-dim chunk j: tile 2j + p holds the
// chunk's dims of parity p, and a lane ends with dims 16j + 4c .. 16j + 4c + 3.
template <bool RAW>
__device__ __forceinline__ int tc_out_dim(int d, int e, int c) {
  return RAW ? 16 * (d >> 1) + 4 * c + (d & 1) + 2 * e : 8 * d + 2 * c + e;
}

// S = Q K^T of one 16-key tile into s (two 8-key column tiles).
// bf16: Q fragments qf[kk] hold dims 16kk + 2c, +1 and +8, +9, as K's do.
// FP8: ldmatrix of raw bytes gives lane (g, c) dims 4c .. 4c + 3 of a 16-dim
// chunk of key g; converted, they serve as k = 2c, 2c + 1, 2c + 8, 2c + 9,
// and Q's fragments were loaded in that order (the dot product is the same
// sum in another order).
template <int HD, typename KV>
__device__ __forceinline__ void tc_scores(float (&s)[2][4], const unsigned (&qf)[HD / 16][2], const unsigned char* K,
                                          int lane) {
  using L = DecodeTcSmem<HD, KV>;
  const int row = (lane & 7) + ((lane >> 3) & 1) * 8;  // key of this lane's ldmatrix address
  if constexpr (L::RAW) {
#pragma unroll
    for (int kp = 0; kp < HD / 32; ++kp) {
      unsigned bk[4];  // keys 0-7 / 8-15 of chunk 2kp, then of chunk 2kp + 1
      ldmatrix_x4(bk, K + row * L::ROW + (2 * kp + (lane >> 4)) * 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned a[4] = {qf[2 * kp + h][0], 0u, qf[2 * kp + h][1], 0u};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const unsigned b = bk[2 * h + n];
          mma_f16(s[n], a, e4m3x2_to_f16x2(b), e4m3x2_to_f16x2(b >> 16));
        }
      }
    }
  } else {
    const bf16* Kb = reinterpret_cast<const bf16*>(K);
    constexpr int LD = L::ROW / 2;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      unsigned bk[4];
      ldmatrix_x4(bk, Kb + ((lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
      const unsigned a[4] = {qf[kk][0], 0u, qf[kk][1], 0u};
      mma_bf16(s[0], a, bk[0], bk[1]);
      mma_bf16(s[1], a, bk[2], bk[3]);
    }
  }
}

// O += P V of one 16-key tile; p is the A fragment (row g: keys 2c, 2c + 1,
// 8 + 2c, 9 + 2c). FP8: ldmatrix.trans of raw bytes gives lane (g, c) keys
// 2c, 2c + 1 of dims 2g, 2g + 1 (of a 16-dim chunk) in one register; a byte
// permute makes (key 2c, key 2c + 1) pairs of each dim, the B fragments of
// the chunk's even and odd dims.
template <int HD, typename KV>
__device__ __forceinline__ void tc_accumulate(float (&o)[HD / 8][4], const unsigned (&a)[4], const unsigned char* V,
                                              int lane) {
  using L = DecodeTcSmem<HD, KV>;
  const int row = (lane & 7) + ((lane >> 3) & 1) * 8;
  if constexpr (L::RAW) {
#pragma unroll
    for (int jp = 0; jp < HD / 32; ++jp) {
      unsigned bv[4];  // keys 0-7 / 8-15 of chunk 2jp, then of chunk 2jp + 1
      ldmatrix_x4_trans(bv, V + row * L::ROW + (2 * jp + (lane >> 4)) * 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * jp + h;
        const unsigned lo = __byte_perm(bv[2 * h], 0, 0x3120), hi = __byte_perm(bv[2 * h + 1], 0, 0x3120);
        mma_f16(o[2 * j], a, e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(hi));
        mma_f16(o[2 * j + 1], a, e4m3x2_to_f16x2(lo >> 16), e4m3x2_to_f16x2(hi >> 16));
      }
    }
  } else {
    const bf16* Vb = reinterpret_cast<const bf16*>(V);
    constexpr int LD = L::ROW / 2;
#pragma unroll
    for (int dp = 0; dp < HD / 16; ++dp) {
      unsigned bv[4];
      ldmatrix_x4_trans(bv, Vb + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
      mma_bf16(o[2 * dp], a, bv[0], bv[1]);
      mma_bf16(o[2 * dp + 1], a, bv[2], bv[3]);
    }
  }
}

template <int HD, int G, typename KV>
__device__ __forceinline__ void decode_attention_tc(
    const bf16* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_tables, const int* __restrict__ table_stride, const int* __restrict__ token_seq,
    const int* __restrict__ positions, const int* __restrict__ token_ids, bf16* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int num_heads, int num_kv_heads,
    int block_size, float scale_log2, int num_splits, const void* prefetch, unsigned long long prefetch_bytes,
    int prefetch_mode, int window) {
  static_assert(G <= 8, "the group's heads are rows 0..7 of the A tile");
  if (prefetch_mode & 1) l2_prefetch(prefetch, prefetch_bytes, prefetch_mode);
  pdl_begin();
  if (!(prefetch_mode & 1)) l2_prefetch(prefetch, prefetch_bytes, prefetch_mode);
  using L = DecodeTcSmem<HD, KV>;
  constexpr int DT = HD / 8, KT = HD / 16, S = L::STAGES, STAGE_BYTES = 2 * L::TILE;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float s_m[DECODE_WARPS][G], s_l[DECODE_WARPS][G];
  const int b = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int tok = token_ids ? token_ids[b] : b;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;  // fragment row (query head) and column pair
  const int ctx = positions[tok] + 1;
  const int lo = window > 0 ? max(0, ctx - window) : 0;
  const int per_split = (ctx - lo + num_splits - 1) / num_splits;
  const int start = lo + split * per_split, end = min(ctx, start + per_split);
  const int* table = block_tables + (size_t)token_seq[tok] * *table_stride;
  unsigned char* ring = smem + warp * L::WARP_BYTES;

  // Q as A fragments (row g: head kvh * G + g; rows >= G and g + 8 zero),
  // in the dimension order of tc_scores.
  unsigned qf[KT][2];
  const bf16* qrow = q + (size_t)tok * num_heads * HD + (kvh * G + min(g, G - 1)) * HD;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    if constexpr (L::RAW) {
      const uint2 v = *reinterpret_cast<const uint2*>(qrow + kk * 16 + 4 * c);
      const float2 q01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
      const float2 q23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
      qf[kk][0] = g < G ? pack_f16(q01.x, q01.y) : 0u;
      qf[kk][1] = g < G ? pack_f16(q23.x, q23.y) : 0u;
    } else {
      qf[kk][0] = g < G ? *reinterpret_cast<const unsigned*>(qrow + kk * 16 + 2 * c) : 0u;
      qf[kk][1] = g < G ? *reinterpret_cast<const unsigned*>(qrow + kk * 16 + 8 + 2 * c) : 0u;
    }
  }
  float o[DT][4], m = -INFINITY, l = 0.f;
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d][e] = 0.f;

  // Warp w takes tiles w, w + 4, ... of the split's keys.
  const int n_tiles = end > start ? (end - start + TC_KEYS - 1) / TC_KEYS : 0;
  auto issue = [&](int stage, int t) {
    if (t < n_tiles) {
      stage_decode_tile<HD, KV>(ring + stage * STAGE_BYTES, k_cache, v_cache, table, start + t * TC_KEYS, end,
                                kvh, num_kv_heads, block_size, lane);
    } else {
      cp_async_commit();  // keeps the group count uniform
    }
  };
#pragma unroll
  for (int st = 0; st < S - 1; ++st) issue(st, warp + st * DECODE_WARPS);
  int stage = 0;
  for (int t = warp; t < n_tiles; t += DECODE_WARPS) {
    issue((stage + S - 1) % S, t + (S - 1) * DECODE_WARPS);
    cp_async_wait<S - 1>();
    __syncwarp();  // the other lanes' pieces of this tile have landed
    const unsigned char* K = ring + stage * STAGE_BYTES;

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    tc_scores<HD, KV>(s, qf, K, lane);

    // Online softmax of row g (log2 domain); its 16 scores are spread over
    // the quad. The tile's first key is always valid, so m_new is finite.
    const int key0 = start + t * TC_KEYS + 2 * c;
    float p[4], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = key0 + (i >> 1) * 8 + (i & 1);
      p[i] = key < end ? s[i >> 1][i & 1] * scale_log2 : -INFINITY;
      mx = fmaxf(mx, p[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);
    const float corr = exp2f(m - m_new);
    m = m_new;
    l *= corr;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      o[d][0] *= corr;
      o[d][1] *= corr;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[i] = exp2f(p[i] - m_new);
      l += p[i];
    }

    // O += P V: P (row g, keys 2c, 2c + 1, 8 + 2c, 9 + 2c) is the A fragment.
    unsigned a[4];
    if constexpr (L::RAW) {
      a[0] = pack_f16(p[0], p[1]);
      a[2] = pack_f16(p[2], p[3]);
    } else {
      a[0] = pack_bf16(p[0], p[1]);
      a[2] = pack_bf16(p[2], p[3]);
    }
    a[1] = a[3] = 0u;
    tc_accumulate<HD, KV>(o, a, K + L::TILE, lane);
    __syncwarp();  // every lane is done with this stage before it is refilled
    stage = (stage + 1) % S;
  }
  cp_async_wait<0>();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  __syncthreads();  // every warp is done with its ring before it holds accumulators
  float* s_acc = reinterpret_cast<float*>(smem);  // [DECODE_WARPS][G][HD]
  if (g < G) {
    if (c == 0) {
      s_m[warp][g] = m;
      s_l[warp][g] = l;
    }
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) s_acc[(warp * G + g) * HD + tc_out_dim<L::RAW>(d, e, c)] = o[d][e];
  }
  __syncthreads();
  store_decode_result<HD, G>(s_acc, s_m, s_l, b, tok, kvh, split, num_heads, num_splits, out, part_acc, part_ml);
}

// The accumulators ([DECODE_WARPS][G][HD] f32) reuse the ring.
static_assert(DecodeTcSmem<64, fp8>::BYTES >= DECODE_WARPS * 8 * 64 * 4, "ring holds the accumulators");
static_assert(DecodeTcSmem<128, fp8>::BYTES >= DECODE_WARPS * 8 * 128 * 4, "ring holds the accumulators");

#define DECODE_TC_KERNEL(HD, G) DECODE_TC_KERNEL_OF(paged_attention_tc_hd##HD##_g##G, HD, G, bf16) \
  DECODE_TC_KERNEL_OF(paged_attention_tc_fp8_hd##HD##_g##G, HD, G, fp8)
#define DECODE_TC_KERNEL_OF(NAME, HD, G, KV)                                                               \
  extern "C" __global__ void __launch_bounds__(DECODE_WARPS * 32) NAME(                                   \
      const bf16* q, const KV* k_cache, const KV* v_cache, const int* block_tables, const int* table_stride, \
      const int* token_seq, const int* positions, const int* token_ids, bf16* out, float* part_acc,        \
      float* part_ml, int num_heads, int num_kv_heads, int block_size, float scale_log2, int num_splits,    \
      const void* prefetch, unsigned long long prefetch_bytes, int prefetch_mode, int window) {             \
    decode_attention_tc<HD, G, KV>(q, k_cache, v_cache, block_tables, table_stride, token_seq, positions,    \
                                   token_ids, out, part_acc, part_ml, num_heads, num_kv_heads, block_size, \
                                   scale_log2, num_splits, prefetch, prefetch_bytes, prefetch_mode, window); \
  }
#define DECODE_TC_KERNEL_G(G, HD) DECODE_TC_KERNEL(HD, G)
#define DECODE_TC_KERNELS(HD) EACH_N_1_TO_8(DECODE_TC_KERNEL_G, HD)
DECODE_TC_KERNELS(64)
DECODE_TC_KERNELS(128)
