// The second half of a decoder layer at GEMV batch sizes, in one kernel:
//   attention_combine -> o_proj (+= residual) -> RMSNorm -> gate/up + SwiGLU
//   (or GeGLU) -> down (+= residual)
// for models small enough that these are latency-bound (SmolLM2-135M:
// hidden 576, MLP 1536: each GEMV reads 0.6-3.5 MB and a kernel boundary,
// ~3 us even in a graph with PDL, costs more than its weights take). The
// phases are separated by grid-wide barriers instead of kernel boundaries:
//   1. every block that has o_proj columns merges the split-K attention
//      partials of all heads into shared memory (redundantly: no barrier),
//      then its 8 warps add one o_proj column each into the residual,
//      leaving the sums of squares and the pre-scaled input x ⊙ g of the
//      MLP's norm (the protocol of gemv.cu's accumulating GEMVs);
//   2. (barrier) gate/up rows of one output column per warp, scaled by
//      1/rms, activation, into `act`;
//   3. (barrier) down rows into the residual, leaving the sums of squares
//      and the next layer's pre-scaled input as gemv.cu does;
//   4. (barrier; optional) the next layer's q/k/v projection with its
//      RMSNorm, bias, rotary embedding and paged KV write, as
//      gemv_n*_qkv_rope_norm does (two warps per rotary pair).
// Every reduction runs in the order of the unfused kernels
// (attention_combine, gemv_n*_add_f32, gemv_n*_swiglu_norm,
// gemv_n*_qkv_rope_norm), so both paths
// give the same bits.
//
// The grid must be co-resident (the host caps it by the occupancy API) and
// the barrier state lives in SumSq's spare words (zeroed with it). Dependent
// kernels are let in only after the last barrier: a dependent block that
// took an SM before all of this grid's blocks were resident would wait for
// this grid while this grid waits for a slot.
#include "common.cuh"

constexpr int FB_WARPS = 8;
constexpr int FB_UNROLL = 4;
// Shared-memory bounds: the host only picks this kernel within them.
constexpr int FB_MAX_QDIM = 1024;
constexpr int FB_MAX_PARTS = 512;  // heads x splits of one token row

// The products are common.cuh's dot8, as in gemv.cu (bitwise equal
// results).

// Loads 16 bytes of data written earlier in this kernel by other blocks:
// through L2 (the non-coherent and L1 paths could serve stale lines).
__device__ __forceinline__ uint4 fb_load_fresh(const uint4* p) { return __ldcg(p); }
__device__ __forceinline__ uint4 fb_load_smem(const uint4* p) { return *p; }

// One warp's weight rows and the lane's next batch of 16-byte vectors
// (lane l takes vectors l, l + 32, ... in batches of FB_UNROLL): the first
// batch is loaded by fb_start, before the barrier or PDL wait that the
// inputs need, so its latency hides behind the wait.
template <int ROWS>
struct Rows {
  const uint4* row[ROWS];
  int start, end;  // the vectors [start, end) of each row
  uint4 batch[ROWS][FB_UNROLL];
};

template <int ROWS>
__device__ __forceinline__ void fb_load_batch(Rows<ROWS>& w, int base, uint4 (&dst)[ROWS][FB_UNROLL]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int u = 0; u < FB_UNROLL; ++u) {
      const int i = base + u * 32;
      dst[r][u] = i < w.end ? __ldcs(w.row[r] + i) : make_uint4(0, 0, 0, 0);
    }
}

// Over the vectors [v0, v1) of the rows (v1 < 0: to the end).
template <int ROWS>
__device__ __forceinline__ void fb_start(Rows<ROWS>& w, const bf16* weights, int in, const size_t (&rows)[ROWS],
                                         int v0 = 0, int v1 = -1) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) w.row[r] = reinterpret_cast<const uint4*>(weights + rows[r] * in);
  w.start = v0 + (threadIdx.x & 31);
  w.end = v1 < 0 ? in / 8 : v1;
  fb_load_batch<ROWS>(w, w.start, w.batch);
}

// acc[r][n] = x[n] · w.row[r] over the warp, in gemv.cu's gemv_rows order
// (the same software pipeline, then a butterfly sum). `load_x(n, i)` gives
// vector i of input row n.
template <int N, int ROWS, typename LoadX>
__device__ __forceinline__ void fb_finish(Rows<ROWS>& w, float (&acc)[ROWS][N], LoadX load_x) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[r][n] = 0.f;
  for (int base = w.start; base < w.end; base += 32 * FB_UNROLL) {
    uint4 next[ROWS][FB_UNROLL];
    fb_load_batch<ROWS>(w, base + 32 * FB_UNROLL, next);
#pragma unroll
    for (int u = 0; u < FB_UNROLL; ++u) {
      const int i = base + u * 32;
      if (i >= w.end) break;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const uint4 xv = load_x(n, i);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dot8(w.batch[r][u], xv, acc[r][n]);
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int u = 0; u < FB_UNROLL; ++u) w.batch[r][u] = next[r][u];
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[r][n] = warp_sum(acc[r][n]);
}

// The weight row of a warp's output column in `task` (out-of-range warps
// read a duplicate and skip the write, as gemv.cu's do).
__device__ __forceinline__ int fb_column(int task) { return task * FB_WARPS + (threadIdx.x >> 5); }

// Grid-wide barrier over a co-resident grid. `state[0]` counts arrivals,
// `state[1]` is the generation; the last block to arrive resets the count
// and advances the generation, so the state is ready for the next barrier
// and the next launch. Release on arrival and acquire on the generation
// (after the block barrier) carry every thread's writes across.
__device__ __forceinline__ void fb_grid_barrier(unsigned* state) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned seen, old;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(state + 1) : "memory");
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(state) : "memory");
    if (old == gridDim.x - 1) {
      asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(state) : "memory");
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(state + 1) : "memory");
    } else {
      unsigned now;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(state + 1) : "memory");
      } while (now == seen);
    }
  }
  __syncthreads();
}

// Merges the split-K partials of every decode row and head into s_x
// (bf16, row-major [token][q_dim]) exactly as attention_combine does, or
// copies the attention output when there is one split.
struct Combine {
  const float* part_acc;
  const float* part_ml;
  const int* token_ids;  // decode row -> token row (null: the same)
  const bf16* attn;      // the attention's own output when num_splits == 1
  int num_heads, hd, num_splits;
};

// Per (row, head), one warp: each split's weight exp2(m_s - max) into s_f
// and the total weight, summed in split order as attention_combine does
// (lane 0 takes the terms by shuffle), into s_l.
__device__ __forceinline__ void fb_split_weights(const Combine& c, int pairs, float (*s_f)[FB_MAX_PARTS],
                                                 float (*s_l)[FB_MAX_PARTS / 8]) {
  const int lane = threadIdx.x & 31, S = c.num_splits;
  for (int p = threadIdx.x >> 5; p < pairs; p += FB_WARPS) {
    const int b = p / c.num_heads, h = p % c.num_heads;
    const float* ml = c.part_ml + 2 * ((size_t)b * c.num_heads + h) * S;
    float mx = -INFINITY;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, ml[2 * s]);
    mx = warp_max(mx);
    float sum_l = 0.f;
    for (int s0 = 0; s0 < S; s0 += 32) {
      const int s = s0 + lane;
      const float f = s < S && mx != -INFINITY ? exp2f(ml[2 * s] - mx) : 0.f;
      const float l = s < S ? ml[2 * s + 1] : 0.f;
      if (s < S) s_f[b][h * S + s] = f;
      for (int j = 0; j < 32 && s0 + j < S; ++j) {
        const float lj = __shfl_sync(0xffffffffu, l, j), fj = __shfl_sync(0xffffffffu, f, j);
        sum_l += lj * fj;
      }
    }
    if (lane == 0) s_l[b][h] = mx == -INFINITY ? 0.f : sum_l;
  }
}

// Merges the split-K partials into s_x (bf16, [token][q_dim]) exactly as
// attention_combine does, or copies the attention's output when there is
// one split. Each thread takes FB_COMBINE outputs at once and loads
// FB_COMBINE_SPLITS splits of each before adding them in split order, so
// a row costs a few L2 round trips rather than one per split.
constexpr int FB_COMBINE = 3;
constexpr int FB_COMBINE_SPLITS = 8;

template <int N>
__device__ __forceinline__ void fb_combine(const Combine& c, bf16 (*s_x)[FB_MAX_QDIM],
                                           float (*s_f)[FB_MAX_PARTS], float (*s_l)[FB_MAX_PARTS / 8]) {
  const int qd = c.num_heads * c.hd, S = c.num_splits, total = N * qd;
  if (S == 1) {
    for (int idx = threadIdx.x; idx < total; idx += blockDim.x) s_x[idx / qd][idx % qd] = c.attn[idx];
    __syncthreads();
    return;
  }
  fb_split_weights(c, N * c.num_heads, s_f, s_l);
  __syncthreads();
  for (int first = threadIdx.x; first < total; first += FB_COMBINE * blockDim.x) {
    int b[FB_COMBINE], e[FB_COMBINE], h[FB_COMBINE];
    float sum_a[FB_COMBINE], sum_l[FB_COMBINE];
    const float* acc[FB_COMBINE];
#pragma unroll
    for (int k = 0; k < FB_COMBINE; ++k) {
      const int idx = min(first + k * (int)blockDim.x, total - 1);
      b[k] = idx / qd;
      e[k] = idx % qd;
      h[k] = e[k] / c.hd;
      sum_l[k] = s_l[b[k]][h[k]];
      sum_a[k] = 0.f;
      acc[k] = c.part_acc + ((size_t)b[k] * c.num_heads + h[k]) * S * c.hd + e[k] % c.hd;
    }
    for (int s0 = 0; s0 < S; s0 += FB_COMBINE_SPLITS) {
      float v[FB_COMBINE][FB_COMBINE_SPLITS];
#pragma unroll
      for (int k = 0; k < FB_COMBINE; ++k)
#pragma unroll
        for (int j = 0; j < FB_COMBINE_SPLITS; ++j)
          v[k][j] = s0 + j < S && sum_l[k] > 0.f ? __ldg(acc[k] + (size_t)(s0 + j) * c.hd) : 0.f;
#pragma unroll
      for (int k = 0; k < FB_COMBINE; ++k)
#pragma unroll
        for (int j = 0; j < FB_COMBINE_SPLITS; ++j)
          if (s0 + j < S) sum_a[k] += v[k][j] * s_f[b[k]][h[k] * S + s0 + j];
    }
#pragma unroll
    for (int k = 0; k < FB_COMBINE; ++k) {
      if (first + k * (int)blockDim.x >= total) break;
      const int tok = c.token_ids ? c.token_ids[b[k]] : b[k];
      s_x[tok][e[k]] = to_bf16(sum_l[k] > 0.f ? sum_a[k] / sum_l[k] : 0.f);
    }
  }
  __syncthreads();
}

// One block's 8 accumulating columns of `task`: x[n][col] += acc, the
// partial sums of squares of the task into sumsq, and xg = bf16(x ⊙ g)
// with g = norm (null: none). Every thread of the block calls it.
template <int N>
__device__ __forceinline__ void fb_accumulate(const float (&acc)[1][N], int task, int col, int d, float* x,
                                              const float* norm, bf16* xg, SumSq* sumsq) {
  __shared__ float s_sq[FB_WARPS][N];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0)
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float sq = 0.f;
      if (col < d) {
        const size_t o = (size_t)n * d + col;
        const float v = x[o] + acc[0][n];
        x[o] = v;
        sq = v * v;
        if (norm) xg[o] = to_bf16(v * norm[col]);
      }
      s_sq[warp][n] = sq;
    }
  __syncthreads();
  if (threadIdx.x < N) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < FB_WARPS; ++w) t += s_sq[w][threadIdx.x];
    sumsq->partial[threadIdx.x][task] = t;
  }
  __syncthreads();  // s_sq is reused by the block's next task
}

// 1/rms of each row from the `blocks` partial sums of squares, added in
// gemv.cu's norm_scales order; every lane of the calling warp gets them.
template <int N>
__device__ __forceinline__ void fb_norm_scales(const SumSq* sumsq, int blocks, int in, float eps, float (&inv)[N]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    float t = 0.f;
    for (int b = lane; b < blocks; b += 32) t += __ldcg(&sumsq->partial[n][b]);
    inv[n] = rsqrtf(warp_sum(t) / in + eps);
  }
}

struct Mlp {
  const bf16* o_proj;     // [hidden, q_dim]
  float* x;               // residual [N, hidden] f32
  const float* mlp_norm;  // the MLP's RMSNorm weights
  bf16* xn;               // pre-scaled norm inputs [N, hidden]
  SumSq* sumsq;
  float eps;
  const bf16* gate_up;    // [2 ff, hidden]
  bf16* act;              // [N, ff]
  const bf16* down;       // [hidden, ff]
  const float* next_norm; // the next layer's attention norm (null: none)
  int hidden, ff;
};

// The next layer's q/k/v projection and where its rope and KV write go.
struct Qkv {
  const bf16* w;       // fused q/k/v rows (null: no phase 4)
  const float* bias;   // null: none
  const int* positions;
  const long long* slots;
  const float* cos_t;
  const float* sin_t;
  bf16* q_out;
  bf16* k_cache;
  bf16* v_cache;
  int num_kv_heads, block_size;
};

// A q/k/v task's rotary pair: rows i and i + hd/2 of one head, and which
// half of the input this warp takes (gemv_qkv_rope's split).
struct QkvPair {
  int head, i, part, col;
  size_t rows[2];
};

__device__ __forceinline__ QkvPair fb_qkv_pair(int task, int hd, int pairs) {
  QkvPair p;
  const int w = fb_column(task);
  p.col = w >> 1;
  p.part = w & 1;
  const int c = min(p.col, pairs - 1), half = hd / 2;
  p.head = c / half;
  p.i = c % half;
  p.rows[0] = (size_t)p.head * hd + p.i;
  p.rows[1] = p.rows[0] + half;
  return p;
}

// Adds the upper half's sums to the lower's (through shared memory), then
// bias, rotary embedding and the writes of q or the paged K/V, as
// gemv_qkv_rope does. Every thread of the block calls it.
template <int N>
__device__ __forceinline__ void fb_qkv_write(float (&acc)[2][N], const QkvPair& p, const Qkv& q, int num_heads,
                                             int hd, int pairs) {
  __shared__ float s_upper[FB_WARPS / 2][2][N];
  const int lane = threadIdx.x & 31, pair_slot = (threadIdx.x >> 5) >> 1, half = hd / 2;
  if (p.part && lane == 0)
#pragma unroll
    for (int n = 0; n < N; ++n) {
      s_upper[pair_slot][0][n] = acc[0][n];
      s_upper[pair_slot][1][n] = acc[1][n];
    }
  __syncthreads();
  if (!p.part && lane == 0 && p.col < pairs) {
    const float b0 = q.bias ? q.bias[p.rows[0]] : 0.f, b1 = q.bias ? q.bias[p.rows[1]] : 0.f;
    const int kvh = q.num_kv_heads, i = p.i;
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const float a = acc[0][n] + s_upper[pair_slot][0][n] + b0, b = acc[1][n] + s_upper[pair_slot][1][n] + b1;
      const long long slot = q.slots[n];
      const long long block = slot / q.block_size;
      const int offset = (int)(slot % q.block_size);
      if (p.head >= num_heads + kvh) {
        bf16* v = q.v_cache + kv_index(block, p.head - num_heads - kvh, offset, kvh, q.block_size, hd);
        v[i] = to_bf16(a);
        v[i + half] = to_bf16(b);
        continue;
      }
      const size_t at = (size_t)q.positions[n] * half + i;
      const float cs = q.cos_t[at], sn = q.sin_t[at];
      bf16* dst = p.head < num_heads
                      ? q.q_out + (size_t)n * num_heads * hd + (size_t)p.head * hd
                      : q.k_cache + kv_index(block, p.head - num_heads, offset, kvh, q.block_size, hd);
      dst[i] = to_bf16(a * cs - b * sn);
      dst[i + half] = to_bf16(b * cs + a * sn);
    }
  }
  __syncthreads();  // s_upper is reused by the block's next task
}

template <int N, bool GELU>
__device__ __forceinline__ void fused_block(const Combine& c, const Mlp& m, const Qkv& q) {
  __shared__ __align__(16) bf16 s_x[N][FB_MAX_QDIM];
  __shared__ float s_f[N][FB_MAX_PARTS];
  __shared__ float s_l[N][FB_MAX_PARTS / 8];
  unsigned* barrier = m.sumsq->pad;
  const int lane = threadIdx.x & 31, first = blockIdx.x;
  const int qd = c.num_heads * c.hd, d_tasks = (m.hidden + FB_WARPS - 1) / FB_WARPS;
  const int ff_tasks = (m.ff + FB_WARPS - 1) / FB_WARPS;
  auto out_row = [&](int task) { return (size_t)min(fb_column(task), m.hidden - 1); };
  auto mlp_rows = [&](int task, size_t (&rows)[2]) {
    rows[0] = min(fb_column(task), m.ff - 1);
    rows[1] = rows[0] + m.ff;
  };
  // Weights do not depend on earlier kernels: the first o_proj batch goes
  // out before the wait, and the MLP's and next q/k/v's weights to L2 (the
  // attention already prefetches o_proj's).
  Rows<1> wo;
  if (first < d_tasks) fb_start<1>(wo, m.o_proj, qd, {out_row(first)});
  l2_prefetch(m.gate_up, (unsigned long long)2 * m.ff * m.hidden * 2, 0);
  l2_prefetch(m.down, (unsigned long long)m.hidden * m.ff * 2, 0);
  const unsigned long long qkv_rows = (unsigned long long)(c.num_heads + 2 * q.num_kv_heads) * c.hd;
  if (q.w) l2_prefetch(q.w, qkv_rows * m.hidden * 2, 0);
  pdl_wait();
  // 1. combine, o_proj into the residual, the MLP norm's input.
  if (first < d_tasks) fb_combine<N>(c, s_x, s_f, s_l);
  auto from_smem = [&](int n, int i) { return fb_load_smem(reinterpret_cast<const uint4*>(s_x[n]) + i); };
  for (int task = first; task < d_tasks; task += gridDim.x) {
    if (task != first) fb_start<1>(wo, m.o_proj, qd, {out_row(task)});
    float acc[1][N];
    fb_finish<N, 1>(wo, acc, from_smem);
    fb_accumulate<N>(acc, task, fb_column(task), m.hidden, m.x, m.mlp_norm, m.xn, m.sumsq);
  }
  if (first == 0 && threadIdx.x == 0) m.sumsq->blocks = d_tasks;
  Rows<2> wgu;
  size_t rows2[2];
  mlp_rows(first, rows2);
  if (first < ff_tasks) fb_start<2>(wgu, m.gate_up, m.hidden, rows2);
  fb_grid_barrier(barrier);
  // 2. gate/up with the fused RMSNorm, activation into act.
  const uint4* xg = reinterpret_cast<const uint4*>(m.xn);
  const int dvecs = m.hidden / 8;
  auto from_xg = [&](int n, int i) { return fb_load_fresh(xg + (size_t)n * dvecs + i); };
  for (int task = first; task < ff_tasks; task += gridDim.x) {
    if (task != first) {
      mlp_rows(task, rows2);
      fb_start<2>(wgu, m.gate_up, m.hidden, rows2);
    }
    float acc[2][N], inv[N];
    fb_norm_scales<N>(m.sumsq, d_tasks, m.hidden, m.eps, inv);
    fb_finish<N, 2>(wgu, acc, from_xg);
    const int col = fb_column(task);
    if (lane == 0 && col < m.ff)
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float g = acc[0][n] * inv[n], u = acc[1][n] * inv[n];
        m.act[(size_t)n * m.ff + col] = to_bf16((GELU ? gelu_tanh(g) : g / (1.f + __expf(-g))) * u);
      }
  }
  Rows<1> wd;
  if (first < d_tasks) fb_start<1>(wd, m.down, m.ff, {out_row(first)});
  fb_grid_barrier(barrier);
  // Every block is resident now: the next kernel may take free slots
  // (after the last barrier).
  if (q.w == nullptr) pdl_launch_dependents();
  // 3. down into the residual, the next layer's norm input.
  const uint4* act = reinterpret_cast<const uint4*>(m.act);
  const int fvecs = m.ff / 8;
  auto from_act = [&](int n, int i) { return fb_load_fresh(act + (size_t)n * fvecs + i); };
  for (int task = first; task < d_tasks; task += gridDim.x) {
    if (task != first) fb_start<1>(wd, m.down, m.ff, {out_row(task)});
    float acc[1][N];
    fb_finish<N, 1>(wd, acc, from_act);
    fb_accumulate<N>(acc, task, fb_column(task), m.hidden, m.x, m.next_norm, m.xn, m.sumsq);
  }
  if (q.w == nullptr) return;
  // 4. the next layer's q/k/v with its RMSNorm, rope and KV write.
  const int pairs = (c.num_heads + 2 * q.num_kv_heads) * (c.hd / 2);
  const int q_tasks = (2 * pairs + FB_WARPS - 1) / FB_WARPS, mid = m.hidden / 16;
  Rows<2> wq;
  QkvPair p = fb_qkv_pair(first, c.hd, pairs);
  if (first < q_tasks) fb_start<2>(wq, q.w, m.hidden, p.rows, p.part ? mid : 0, p.part ? -1 : mid);
  fb_grid_barrier(barrier);
  pdl_launch_dependents();
  for (int task = first; task < q_tasks; task += gridDim.x) {
    if (task != first) {
      p = fb_qkv_pair(task, c.hd, pairs);
      fb_start<2>(wq, q.w, m.hidden, p.rows, p.part ? mid : 0, p.part ? -1 : mid);
    }
    float acc[2][N], inv[N];
    fb_norm_scales<N>(m.sumsq, d_tasks, m.hidden, m.eps, inv);
    fb_finish<N, 2>(wq, acc, from_xg);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < N; ++n) acc[r][n] *= inv[n];
    fb_qkv_write<N>(acc, p, q, c.num_heads, c.hd, pairs);
  }
}

#define FUSED_BLOCK(N, NAME, GELU)                                                                              \
  extern "C" __global__ void __launch_bounds__(FB_WARPS * 32, 2) fused_block_n##N##_##NAME(                    \
      const float* part_acc, const float* part_ml, const int* token_ids, const bf16* attn, int num_heads,      \
      int hd, int num_splits, const bf16* o_proj, float* x, const float* mlp_norm, bf16* xn, SumSq* sumsq,      \
      float eps, const bf16* gate_up, bf16* act, const bf16* down, const float* next_norm, int hidden, int ff,  \
      const bf16* qkv, const float* qkv_bias, const int* positions, const long long* slots, const float* cos_t, \
      const float* sin_t, bf16* q_out, bf16* k_cache, bf16* v_cache, int num_kv_heads, int block_size) {         \
    const Combine c{part_acc, part_ml, token_ids, attn, num_heads, hd, num_splits};                            \
    const Mlp m{o_proj, x, mlp_norm, xn, sumsq, eps, gate_up, act, down, next_norm, hidden, ff};                \
    const Qkv q{qkv, qkv_bias, positions, slots, cos_t, sin_t, q_out, k_cache, v_cache, num_kv_heads,          \
                block_size};                                                                                    \
    fused_block<N, GELU>(c, m, q);                                                                             \
  }
#define FUSED_BLOCKS(N)           \
  FUSED_BLOCK(N, swiglu, false)   \
  FUSED_BLOCK(N, geglu, true)
#define FUSED_BLOCKS_N(N, ...) FUSED_BLOCKS(N)
EACH_N_1_TO_8(FUSED_BLOCKS_N, )
