// GGUF 4- to 6-bit block types kept as they are on the device
// (`model.cuda_weights = "native"`): Q4_0, Q4_1, Q4_K, Q5_K and Q6_K.
//
// Layout. A matrix is a 256-byte header (KqMatrix: up to three row
// segments, each with its own type and base, so a q/k/v group whose v is
// Q6_K and q/k Q4_K stays one matrix), then the segments. A segment of
// `rows` x `in` stores each field of its blocks as a plane: the field's
// bytes of every block, row-major, each plane at a 256-byte boundary
// (weights/blocks.rs writes them; the file's bytes plus padding). The first
// plane is always the low 4 bits of the quants, 16 bytes = 32 weights, so
// a lane's unit of work is one 16-byte "vector" of it: 16 weights in its
// low nibbles and 16 in its high nibbles, each run with its own scale and
// min, and for Q5_K/Q6_K the high bits from a 16-byte vector of the qh
// plane. Every type reduces to: w = s * q + m over a run of 16, q the
// unsigned quant, m = 0 where the type's offset is constant (Q4_0's 8,
// Q6_K's 32: subtracted in the int-to-float conversion instead).
#pragma once
#include <cuda_fp16.h>

#include "common.cuh"

// GGML's type ids.
constexpr int KQ_Q4_0 = 2;
constexpr int KQ_Q4_1 = 3;
constexpr int KQ_Q4_K = 12;
constexpr int KQ_Q5_K = 13;
constexpr int KQ_Q6_K = 14;

constexpr int KQ_MAX_SEGMENTS = 3;
constexpr int KQ_MAX_PLANES = 4;  // the most planes a type has (Q6_K)
struct KqSegment {
  unsigned long long base;  // the segment's first plane
  int row_start;            // its first row in the matrix
  int rows;
  int type;  // KQ_*
  int reserved;
};
struct KqMatrix {
  KqSegment seg[KQ_MAX_SEGMENTS];
  int count;
  int reserved;
};

// A vector's raw loads: the quants' low bits, the scale fields and the
// high bits (Q5_K, Q6_K).
struct KqRaw {
  uint4 q;
  unsigned s[4];
  uint4 h;
};

// A vector decoded: its two runs of 16 quants as bytes, and their scales.
struct KqRuns {
  unsigned lo[4], hi[4];
  float s_lo, m_lo, s_hi, m_hi;
};

// The 6-bit scales and mins of sub-blocks 2p and 2p + 1 (p = 0..3) of a
// Q4_K/Q5_K block (llama.cpp's get_scale_min_k4) from its 12 packed bytes
// as three words, all four sub-blocks of a half at once: scales 0..3 are
// the low 6 bits of bytes 0..3 (mins: 4..7); scales 4..7 the low nibbles
// of bytes 8..11 under the top two bits of bytes 0..3 (mins: the high
// nibbles, under the top bits of 4..7). Each byte becomes a float by the
// permute of quant_float.
__device__ __forceinline__ void k4_scale_min_pair(unsigned w0, unsigned w1, unsigned w2, int p, float (&s)[2],
                                                  float (&m)[2]) {
  const unsigned sc = p < 2 ? w0 & 0x3f3f3f3fu : (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
  const unsigned mn = p < 2 ? w1 & 0x3f3f3f3fu : ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
  const int b = 2 * (p & 1);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    s[i] = __uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7540u | (b + i))) - 8388608.f;
    m[i] = __uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7540u | (b + i))) - 8388608.f;
  }
}

__device__ __forceinline__ float half_bits(unsigned bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }

__device__ __forceinline__ void low_high_nibbles(const uint4& q, unsigned (&lo)[4], unsigned (&hi)[4]) {
  const unsigned* w = reinterpret_cast<const unsigned*>(&q);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    lo[k] = w[k] & 0x0f0f0f0fu;
    hi[k] = (w[k] >> 4) & 0x0f0f0f0fu;
  }
}

// Per type: UNIT weights a block; plane(k) bytes a block of plane k;
// OFFSET subtracted from every quant; MIN whether runs have a min;
// lo_in(v)/hi_in(v) the first inputs of vector v's runs; load/decode.
struct KqQ4_0 {
  static constexpr int UNIT = 32, PLANES = 2, OFFSET = 8;
  static constexpr bool MIN = false;
  __device__ static constexpr int plane(int k) { return k == 0 ? 16 : 2; }
  __device__ static int lo_in(int v) { return 32 * v; }
  __device__ static int hi_in(int v) { return 32 * v + 16; }
  __device__ static void load(const unsigned char* const (&p)[PLANES], int v, KqRaw& r) {
    r.q = __ldcs(reinterpret_cast<const uint4*>(p[0]) + v);
    r.s[0] = __ldg(reinterpret_cast<const unsigned short*>(p[1]) + v);
  }
  __device__ static void decode(const KqRaw& r, int, KqRuns& o) {
    low_high_nibbles(r.q, o.lo, o.hi);
    o.s_lo = o.s_hi = half_bits(r.s[0]);
    o.m_lo = o.m_hi = 0.f;
  }
};

struct KqQ4_1 {
  static constexpr int UNIT = 32, PLANES = 2, OFFSET = 0;
  static constexpr bool MIN = true;
  __device__ static constexpr int plane(int k) { return k == 0 ? 16 : 4; }
  __device__ static int lo_in(int v) { return 32 * v; }
  __device__ static int hi_in(int v) { return 32 * v + 16; }
  __device__ static void load(const unsigned char* const (&p)[PLANES], int v, KqRaw& r) {
    r.q = __ldcs(reinterpret_cast<const uint4*>(p[0]) + v);
    r.s[0] = __ldg(reinterpret_cast<const unsigned*>(p[1]) + v);
  }
  __device__ static void decode(const KqRaw& r, int, KqRuns& o) {
    low_high_nibbles(r.q, o.lo, o.hi);
    o.s_lo = o.s_hi = half_bits(r.s[0] & 0xffffu);
    o.m_lo = o.m_hi = half_bits(r.s[0] >> 16);
  }
};

// Q4_K: 256 a block, 8 sub-blocks of 32; qs[32j..32j+32] holds sub-block
// 2j in its low nibbles and 2j + 1 in its high ones. Planes: qs (128), and
// the block's first 16 bytes as they are in the file: d and dmin (f16), then
// the 12 bytes of packed 6-bit scales and mins (one 16-byte load a vector).
struct KqQ4_K {
  static constexpr int UNIT = 256, PLANES = 2, OFFSET = 0;
  static constexpr bool MIN = true;
  __device__ static constexpr int plane(int k) { return k == 0 ? 128 : 16; }
  __device__ static int lo_in(int v) { return 256 * (v >> 3) + 64 * ((v >> 1) & 3) + 16 * (v & 1); }
  __device__ static int hi_in(int v) { return lo_in(v) + 32; }
  // Block b's 16 bytes of d, dmin and scales (Q5_K's too).
  __device__ static void load_scales(const unsigned char* head, int b, KqRaw& r) {
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(head) + b);
    r.s[0] = h.x;
    r.s[1] = h.y;
    r.s[2] = h.z;
    r.s[3] = h.w;
  }
  __device__ static void load(const unsigned char* const (&p)[PLANES], int v, KqRaw& r) {
    r.q = __ldcs(reinterpret_cast<const uint4*>(p[0]) + v);
    load_scales(p[1], v >> 3, r);
  }
  __device__ static void decode_scales(const KqRaw& r, int v, KqRuns& o) {
    const float d = half_bits(r.s[0] & 0xffffu), dmin = half_bits(r.s[0] >> 16);
    float s[2], m[2];
    k4_scale_min_pair(r.s[1], r.s[2], r.s[3], (v >> 1) & 3, s, m);
    o.s_lo = d * s[0];
    o.m_lo = -dmin * m[0];
    o.s_hi = d * s[1];
    o.m_hi = -dmin * m[1];
  }
  __device__ static void decode(const KqRaw& r, int v, KqRuns& o) {
    low_high_nibbles(r.q, o.lo, o.hi);
    decode_scales(r, v, o);
  }
};

// Q5_K: Q4_K's layout plus qh[32] a block: bit 2j of qh[l] is the fifth
// bit of sub-block 2j's weight l, bit 2j + 1 of sub-block 2j + 1's. Planes:
// qs (128), qh (32), d, dmin and the scales (16, Q4_K's).
struct KqQ5_K {
  static constexpr int UNIT = 256, PLANES = 3, OFFSET = 0;
  static constexpr bool MIN = true;
  __device__ static constexpr int plane(int k) { return k == 0 ? 128 : k == 1 ? 32 : 16; }
  __device__ static int lo_in(int v) { return KqQ4_K::lo_in(v); }
  __device__ static int hi_in(int v) { return KqQ4_K::hi_in(v); }
  __device__ static void load(const unsigned char* const (&p)[PLANES], int v, KqRaw& r) {
    r.q = __ldcs(reinterpret_cast<const uint4*>(p[0]) + v);
    r.h = __ldg(reinterpret_cast<const uint4*>(p[1]) + 2 * (v >> 3) + (v & 1));
    KqQ4_K::load_scales(p[2], v >> 3, r);
  }
  __device__ static void decode(const KqRaw& r, int v, KqRuns& o) {
    low_high_nibbles(r.q, o.lo, o.hi);
    const unsigned* h = reinterpret_cast<const unsigned*>(&r.h);
    const int j = 2 * ((v >> 1) & 3);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o.lo[k] |= ((h[k] >> j) & 0x01010101u) << 4;
      o.hi[k] |= ((h[k] >> (j + 1)) & 0x01010101u) << 4;
    }
    KqQ4_K::decode_scales(r, v, o);
  }
};

// Q6_K: 256 a block in two halves of 128; in half n, ql[64n + 32a + l]
// holds weight 128n + 32a + l in its low nibble and weight + 64 in its
// high one, their top two bits at shifts 2a and 2a + 4 of qh[32n + l], and
// each run of 16 has an int8 scale (index 8n + l / 16 + 2a, + 4 for the
// high run). Planes: ql (128), qh (64), scales (16), d (2).
struct KqQ6_K {
  static constexpr int UNIT = 256, PLANES = 4, OFFSET = 32;
  static constexpr bool MIN = false;
  __device__ static constexpr int plane(int k) { return k == 0 ? 128 : k == 1 ? 64 : k == 2 ? 16 : 2; }
  // v = 8 * block + 4n + 2a + b: ql bytes 64n + 32a + 16b.
  __device__ static int lo_in(int v) {
    return 256 * (v >> 3) + 128 * ((v >> 2) & 1) + 32 * ((v >> 1) & 1) + 16 * (v & 1);
  }
  __device__ static int hi_in(int v) { return lo_in(v) + 64; }
  // Scales 8n + l + 2a and that + 4 are bytes l + 2a and l + 2a + 4 of
  // one 8-byte load.
  __device__ static void load(const unsigned char* const (&p)[PLANES], int v, KqRaw& r) {
    const int b = v >> 3, n = (v >> 2) & 1, l = v & 1;
    r.q = __ldcs(reinterpret_cast<const uint4*>(p[0]) + v);
    r.h = __ldg(reinterpret_cast<const uint4*>(p[1]) + 4 * b + 2 * n + l);
    const uint2 sc = __ldg(reinterpret_cast<const uint2*>(p[2]) + 2 * b + n);
    r.s[0] = sc.x;
    r.s[1] = sc.y;
    r.s[2] = __ldg(reinterpret_cast<const unsigned short*>(p[3]) + b);
  }
  __device__ static void decode(const KqRaw& r, int v, KqRuns& o) {
    low_high_nibbles(r.q, o.lo, o.hi);
    const unsigned* h = reinterpret_cast<const unsigned*>(&r.h);
    const int shift = 2 * ((v >> 1) & 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o.lo[k] |= ((h[k] >> shift) & 0x03030303u) << 4;
      o.hi[k] |= ((h[k] >> (shift + 4)) & 0x03030303u) << 4;
    }
    const float d = half_bits(r.s[2]);
    const int k = ((v >> 1) & 1) * 2 + (v & 1);
    o.s_lo = d * (float)(signed char)(r.s[0] >> (8 * k));
    o.s_hi = d * (float)(signed char)(r.s[1] >> (8 * k));
    o.m_lo = o.m_hi = 0.f;
  }
};

// The planes of a segment of `rows` x `in` at `base`, each at a 256-byte
// boundary after the previous one.
template <typename T>
__device__ __forceinline__ void kq_planes(unsigned long long base, size_t rows, int in,
                                          const unsigned char* (&p)[T::PLANES]) {
  const size_t blocks = rows * (size_t)(in / T::UNIT);
  size_t at = 0;
#pragma unroll
  for (int k = 0; k < T::PLANES; ++k) {
    p[k] = reinterpret_cast<const unsigned char*>(base) + at;
    at = (at + blocks * T::plane(k) + 255) & ~(size_t)255;
  }
}

// Row `row` (of the segment) of those planes.
template <typename T>
__device__ __forceinline__ void kq_row(const unsigned char* const (&p)[T::PLANES], size_t row, int in,
                                       const unsigned char* (&r)[T::PLANES]) {
  const size_t blocks = row * (size_t)(in / T::UNIT);
#pragma unroll
  for (int k = 0; k < T::PLANES; ++k) r[k] = p[k] + blocks * T::plane(k);
}

// The segment holding matrix row `row`.
__device__ __forceinline__ const KqSegment& kq_segment(const KqMatrix* m, size_t row) {
  int s = 0;
  for (int i = 1; i < m->count; ++i)
    if ((size_t)m->seg[i].row_start <= row) s = i;
  return m->seg[s];
}

// Quant byte `j` (0..3) of `word` as a float minus `bias`: the byte becomes
// the low mantissa byte of 2^23, so 2^23 + OFFSET as the bias leaves
// q - OFFSET exactly (no int-to-float instruction).
__device__ __forceinline__ float quant_float(unsigned word, int j, float bias) {
  return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540u | j)) - bias;
}

// 16 bf16 activations (two 16-byte loads) as floats.
__device__ __forceinline__ void bf16x16_to_float(const uint4& x0, const uint4& x1, float (&f)[16]) {
  const __nv_bfloat162* xa = reinterpret_cast<const __nv_bfloat162*>(&x0);
  const __nv_bfloat162* xb = reinterpret_cast<const __nv_bfloat162*>(&x1);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float2 v = __bfloat1622float2(k < 4 ? xa[k] : xb[k - 4]);
    f[2 * k] = v.x;
    f[2 * k + 1] = v.y;
  }
}

template <typename T>
__host__ __device__ constexpr float kq_bias() {
  return 8388608.f + (float)T::OFFSET;
}

// Vector v's 32 weights as floats: runs lo (inputs lo_in(v)..+16) and hi.
template <typename T>
__device__ __forceinline__ void kq_weights(const KqRaw& raw, int v, float (&lo)[16], float (&hi)[16]) {
  KqRuns o;
  T::decode(raw, v, o);
  constexpr float bias = kq_bias<T>();
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    lo[i] = fmaf(o.s_lo, quant_float(o.lo[i >> 2], i & 3, bias), o.m_lo);
    hi[i] = fmaf(o.s_hi, quant_float(o.hi[i >> 2], i & 3, bias), o.m_hi);
  }
}

// Vector v of row `row` of segment `s` (a `in`-wide matrix) as floats.
template <typename T>
__device__ __forceinline__ void kq_vector_weights(const KqSegment& s, size_t row, int in, int v, float (&lo)[16],
                                                  float (&hi)[16]) {
  const unsigned char* planes[T::PLANES];
  const unsigned char* rp[T::PLANES];
  kq_planes<T>(s.base, (size_t)s.rows, in, planes);
  kq_row<T>(planes, row - (size_t)s.row_start, in, rp);
  KqRaw raw;
  T::load(rp, v, raw);
  kq_weights<T>(raw, v, lo, hi);
}

// Calls f(T{}) for the segment's type (warp-uniform); false for a type it
// does not know (the host writes only these). An if-chain, not a switch:
// ptxas gave the five inlined loops behind a switch 20-30 more registers
// than the largest of them alone (fewer resident warps).
// TYPES: a mask of the types compiled in (bit KQ_*), for kernels built
// for one type.
constexpr unsigned KQ_ALL_TYPES = (1u << KQ_Q4_0) | (1u << KQ_Q4_1) | (1u << KQ_Q4_K) | (1u << KQ_Q5_K) | (1u << KQ_Q6_K);
template <unsigned TYPES = KQ_ALL_TYPES, typename F>
__device__ __forceinline__ bool kq_dispatch(int type, F&& f) {
  constexpr auto has = [](int t) { return (TYPES >> t) & 1u; };
  if (has(KQ_Q4_K) && type == KQ_Q4_K) {
    f(KqQ4_K{});
  } else if (has(KQ_Q6_K) && type == KQ_Q6_K) {
    f(KqQ6_K{});
  } else if (has(KQ_Q5_K) && type == KQ_Q5_K) {
    f(KqQ5_K{});
  } else if (has(KQ_Q4_0) && type == KQ_Q4_0) {
    f(KqQ4_0{});
  } else if (has(KQ_Q4_1) && type == KQ_Q4_1) {
    f(KqQ4_1{});
  } else {
    return false;
  }
  return true;
}
