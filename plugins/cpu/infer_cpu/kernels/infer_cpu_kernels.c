/*
 * infer-plugin-cpu native kernels: float32 activations, GGUF-style blocks of 32 weights.
 *
 * Compiled on first use for the machine it runs on (see kernels/__init__.py) and called through
 * ctypes. Every function takes raw pointers and sizes; the Python side checks dtypes, shapes and
 * strides before calling. All of them are checked against the plain-torch references in
 * plugins/cpu/tests/test_native_kernels.py.
 *
 * Linear layers (x [M, K] float32 -> y [M, N] float32, K a multiple of 32):
 *   - q4 weights (GGUF Q4_1 blocks, read in place; Q4_0 converted to them): per 32-weight block
 *     a float16 scale d and minimum m, codes q in 0..15 (w = d * q + m; Q4_0 is m = -8 d);
 *     byte j of the 16 code bytes holds weight j in its low nibble and weight j + 16 in its high.
 *   - q8 weights (GGUF Q8_0 blocks, read in place): a float16 scale d, codes int8 (w = d * q).
 *   infer_fgemm (what the plugin serves with): float32 activations against the blocks dequantized
 *   exactly, batch invariant (each output one FMA chain in a fixed order, whatever the number of
 *   rows); with kind | KIND_I16 or kind | KIND_I8 the activations quantized per row and 32-block
 *   to int16 or int8 codes, exact integer block dots and one float chain per output over the
 *   blocks, as batch invariant (the integer-activation GEMM below; on CPUs with AMX its int16
 *   path runs on AMX tiles from a dozen rows, with the same bits: amx_i16_gemm). infer_qgemm (kept for measurements, unused by serving): the activations quantized per
 *   32-block to int8 with one scale (as llama.cpp's Q8 dot products do), each block an integer
 *   dot product; faster, further from the float32 reference (benchmarks/cpu_notes.md).
 *
 * Greedy steps' LM head (infer_q8_head_greedy, at the end): the Q8_0 head's argmax ids, exactly,
 * from an int8 screen on AMX tiles and the exact logits of the columns it leaves.
 *
 * Threads: the GEMMs, norms and attention that run every step (infer_fgemm_tiles,
 * infer_rms_norm, infer_paged_decode, infer_decode_layers, infer_q8_head_greedy) run on the work pool of
 * infer_cpu_pool.h, whose caller never waits for a helper that has not started; OpenMP is left
 * to the load-time packing and infer_qgemm.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getcpu, CPU_SET: the work pool core swap */
#endif
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#include "infer_cpu_vmath.h"
#include "infer_cpu_amx.h"
#include "infer_cpu_screen.h"
#include "infer_cpu_attn.h"
#define POOL_SWAPS_FN infer_pool_swaps
#include "infer_cpu_pool.h"

#define QK 32

static int g_threads = 1;

void infer_set_threads(int n) { g_threads = n > 0 ? n : 1; }

/* x [K] -> per 32-block codes q = round(x / d) with d = amax / qmax: int8 codes (qmax 127) into
 * q8, or (wide) int16 codes (qmax 32767) into q16; the scales d [K/32], d * sum(q) in s [K/32]
 * and, when isum is not NULL, sum(q) [K/32]. The AVX2 path computes exactly what the scalar loop
 * does (the same max, products and rounding), so every build gets the same codes. */
static inline __attribute__((always_inline)) void quantize_row_blocks(
    const float *x, int K, int wide, int8_t *q8, int16_t *q16, float *d, float *s, int32_t *isum) {
  const float qmax = wide ? 32767.f : 127.f;
  for (int b = 0; b < K / QK; b++) {
    const float *xb = x + (int64_t)b * QK;
#ifdef __AVX2__
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), amax); /* NaN lanes keep amax */
    }
    float dd = vm_hmax8(amax) / qmax;
    __m256 id = _mm256_set1_ps(dd != 0.f ? 1.f / dd : 0.f);
    __m256i iv[4], sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
      iv[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      sum = _mm256_add_epi32(sum, iv[j]);
    }
    if (wide) { /* int32 x 8 pairs -> int16 x 16 in order (packs interleaves the 128-bit lanes) */
      __m256i *o = (__m256i *)(q16 + (int64_t)b * QK);
      _mm256_storeu_si256(o, _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[0], iv[1]), 0xD8));
      _mm256_storeu_si256(o + 1, _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[2], iv[3]), 0xD8));
    } else { /* int32 x 32 -> int8 x 32 in order (the permute undoes the packs' interleaving) */
      __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
      p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256((__m256i *)(q8 + (int64_t)b * QK), p);
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    int total = _mm_cvtsi128_si32(s4);
#else
    float amax = 0.f;
    for (int j = 0; j < QK; j++) {
      float a = fabsf(xb[j]);
      amax = a > amax ? a : amax;
    }
    float dd = amax / qmax;
    float id = dd != 0.f ? 1.f / dd : 0.f;
    int total = 0;
    for (int j = 0; j < QK; j++) {
      int v = (int)nearbyintf(xb[j] * id);
      if (wide)
        q16[b * QK + j] = (int16_t)v;
      else
        q8[b * QK + j] = (int8_t)v;
      total += v;
    }
#endif
    d[b] = dd;
    s[b] = dd * (float)total;
    if (isum) isum[b] = total;
  }
}

/* x [K] -> int8 codes q [K], per block scale d [K/32] and d * sum(q) in s [K/32]. */
static void quantize_row_q8(const float *x, int K, int8_t *q, float *d, float *s) {
  quantize_row_blocks(x, K, 0, q, NULL, d, s, NULL);
}

/* GGUF blocks of 32 weights, read in place: q4 (Q4_1's layout; Q4_0 is converted to it at
 * load with m = -8 d) and q8 (Q8_0's layout). Scales are IEEE float16. */
typedef struct {
  uint16_t d, m;
  uint8_t qs[16];
} block_q4;
typedef struct {
  uint16_t d;
  int8_t qs[32];
} block_q8;

static inline float h2f(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: normalise */
    exp = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      exp--;
    }
    bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

#ifdef __AVX2__
static inline __m256i unpack_q4(const uint8_t *qs) {
  const __m128i low = _mm_set1_epi8(0x0F);
  __m128i raw = _mm_loadu_si128((const __m128i *)qs);
  __m128i lo = _mm_and_si128(raw, low);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}
#endif

/* One output: sum over blocks of (d_w q_w + m_w) . (d_x q_x). */
static inline float dot_q4(const block_q4 *w, const int8_t *xq, const float *xd, const float *xs,
                           int nb) {
  float acc_m = 0.f;
#ifdef __AVX2__
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nb; b++) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)b * QK));
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(unpack_q4(w[b].qs), x), ones);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * xd[b]), _mm256_cvtepi32_ps(p), acc);
    acc_m += h2f(w[b].m) * xs[b];
  }
  return hsum256(acc) + acc_m;
#else
  float acc = 0.f;
  for (int b = 0; b < nb; b++) {
    const int8_t *x = xq + (int64_t)b * QK;
    int sum = 0;
    for (int j = 0; j < 16; j++) sum += (w[b].qs[j] & 0x0F) * x[j] + (w[b].qs[j] >> 4) * x[j + 16];
    acc += h2f(w[b].d) * xd[b] * (float)sum;
    acc_m += h2f(w[b].m) * xs[b];
  }
  return acc + acc_m;
#endif
}

static inline float dot_q8(const block_q8 *w, const int8_t *xq, const float *xd, int nb) {
#ifdef __AVX2__
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nb; b++) {
    __m256i wv = _mm256_loadu_si256((const __m256i *)w[b].qs);
    __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)b * QK));
    /* |w| * (x with w's sign): an unsigned x signed byte product, as maddubs needs. */
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(x, wv));
    p = _mm256_madd_epi16(p, ones);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * xd[b]), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum256(acc);
#else
  float acc = 0.f;
  for (int b = 0; b < nb; b++) {
    int sum = 0;
    for (int j = 0; j < QK; j++) sum += w[b].qs[j] * xq[(int64_t)b * QK + j];
    acc += h2f(w[b].d) * xd[b] * (float)sum;
  }
  return acc;
#endif
}

/* o[i] = silu(gu[i]) * gu[I + i] for one row (the SiLU-gated MLP's gate). */
static void silu_mul_row(const float *gu, float *o, int I) { vm_silu_mul(gu, gu + I, o, I); }

/* Activation rows -> q8 blocks. With silu_mul the input rows are [gate | up] of width 2K and
 * the quantized row is silu(gate) * up (the fused SiLU-gated MLP input of the down projection). */
static void quantize_rows(const float *x, int64_t x_stride, int M, int K, int silu_mul,
                          int8_t *xq, float *xd, float *xs) {
  int nb = K / QK;
  float *tmp = silu_mul ? (float *)malloc(sizeof(float) * (size_t)K) : NULL;
  for (int m = 0; m < M; m++) {
    const float *row = x + (int64_t)m * x_stride;
    if (silu_mul) {
      silu_mul_row(row, tmp, K);
      row = tmp;
    }
    quantize_row_q8(row, K, xq + (int64_t)m * K, xd + (int64_t)m * nb, xs + (int64_t)m * nb);
  }
  free(tmp);
}

#ifdef __AVX2__
/* Four q4 outputs at once (rows w0..w3, one activation row): four independent accumulators
 * share each activation block load. */
static inline void dot_q4_x4(const block_q4 *w, int nb, const int8_t *xq, const float *xd,
                             const float *xs, float *out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  float sm[4] = {0.f, 0.f, 0.f, 0.f};
  for (int b = 0; b < nb; b++) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)b * QK));
    for (int r = 0; r < 4; r++) {
      const block_q4 *wb = w + (int64_t)r * nb + b;
      __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(unpack_q4(wb->qs), x), ones);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb->d) * xd[b]), _mm256_cvtepi32_ps(p), acc[r]);
      sm[r] += h2f(wb->m) * xs[b];
    }
  }
  for (int r = 0; r < 4; r++) out[r] = hsum256(acc[r]) + sm[r];
}

/* Two or more activation rows (batched decode, prefill): NC weight rows at a time are unpacked
 * once (codes to bytes, float16 scales to float) into a buffer that every activation row reuses,
 * then tiles of TN = 4 weight rows x TM activation rows run from it, one accumulator per
 * activation row. The four weight rows' maddubs products are added in int16 first (sum4_rows),
 * so a block costs one int16 -> int32 step, one conversion and one FMA per activation row
 * instead of four each: on AVX2 without VNNI the multiplies, conversions and FMAs share two
 * ports and bound the kernel. The Q4_1 minimum term sum_b m[n, b] xs[m, b] is a separate float
 * product per chunk (q4_chunk_mins). Integer block sums are exact; results differ from dot_q4
 * only in the order of the float sums. NC = 16 is the thread tile of infer_qgemm. */
#define TN 4
#define TM 4
#define NC 16

/* NC unpacked weight rows: codes [NC][nb][32] as bytes 0..15; scales d and minimums m
 * [nb][NC] (the chunk's rows side by side per block). */
typedef struct {
  uint8_t *codes;
  float *d, *m;
} q4_unpacked;

/* Rows [0, rows) of w (rows <= NC); rows [rows, NC) are zero weights. */
static void unpack_q4_rows(const block_q4 *w, int nb, int rows, q4_unpacked u) {
  for (int r = 0; r < NC; r++)
    for (int b = 0; b < nb; b++) {
      int64_t i = (int64_t)r * nb + b, j = (int64_t)b * NC + r;
      if (r < rows) {
        _mm256_store_si256((__m256i *)(u.codes + i * QK), unpack_q4(w[i].qs));
        u.d[j] = h2f(w[i].d);
        u.m[j] = h2f(w[i].m);
      } else {
        _mm256_store_si256((__m256i *)(u.codes + i * QK), _mm256_setzero_si256());
        u.d[j] = u.m[j] = 0.f;
      }
    }
}

/* p_r: maddubs products of weight row r with one activation block (int16, |lane| <= 2 * 15 * 127).
 * Returns int32 lanes r and 4 + r = row r's dot product over weights 0..15 and 16..31. The
 * int16 sums before the last step add 4 lanes (<= 15240), so nothing overflows. */
static inline __m256i sum4_rows(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
  __m256i a01 = _mm256_add_epi16(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
  __m256i a23 = _mm256_add_epi16(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
  __m256i a = _mm256_add_epi16(_mm256_unpacklo_epi64(a01, a23), _mm256_unpackhi_epi64(a01, a23));
  return _mm256_madd_epi16(a, _mm256_set1_epi16(1));
}

/* out[i][r] = sum_b d[b][r] xd[i, b] (codes[r, b] . xq[i, b]) for a tile of TN weight rows
 * (codes rows of nb blocks; d of stride NC per block) and mr <= TM activation rows (xq rows
 * of stride K, xd rows of stride nb). Inlined with a constant mr. */
static inline __attribute__((always_inline)) void q4_tile_dots(
    const uint8_t *codes, const float *d, int nb, const int8_t *xq, int64_t K, const float *xd,
    int mr, __m128 out[TM]) {
  __m256 acc[TM];
  for (int i = 0; i < mr; i++) acc[i] = _mm256_setzero_ps();
  for (int b = 0; b < nb; b++) {
    const uint8_t *cb = codes + (int64_t)b * QK;
    int64_t row = (int64_t)nb * QK;
    __m256i w0 = _mm256_load_si256((const __m256i *)cb);
    __m256i w1 = _mm256_load_si256((const __m256i *)(cb + row));
    __m256i w2 = _mm256_load_si256((const __m256i *)(cb + 2 * row));
    __m256i w3 = _mm256_load_si256((const __m256i *)(cb + 3 * row));
    __m256 db = _mm256_broadcast_ps((const __m128 *)(d + (int64_t)b * NC)); /* both halves */
    for (int i = 0; i < mr; i++) {
      __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i * K + (int64_t)b * QK));
      __m256i s = sum4_rows(_mm256_maddubs_epi16(w0, x), _mm256_maddubs_epi16(w1, x),
                            _mm256_maddubs_epi16(w2, x), _mm256_maddubs_epi16(w3, x));
      __m256 sc = _mm256_mul_ps(db, _mm256_broadcast_ss(xd + (int64_t)i * nb + b));
      acc[i] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(s), acc[i]);
    }
  }
  for (int i = 0; i < mr; i++)
    out[i] = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
}

/* mins[i][r] = sum_b m[b][r] xs[i, b] for the chunk's NC rows and mr activation rows. */
static void q4_chunk_mins(const float *m, int nb, const float *xs, int mr, float *mins) {
  for (int i = 0; i < mr; i++) {
    __m256 a[NC / 8];
    for (int g = 0; g < NC / 8; g++) a[g] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
      __m256 x = _mm256_broadcast_ss(xs + (int64_t)i * nb + b);
      for (int g = 0; g < NC / 8; g++)
        a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(m + (int64_t)b * NC + 8 * g), x, a[g]);
    }
    for (int g = 0; g < NC / 8; g++) _mm256_storeu_ps(mins + i * NC + 8 * g, a[g]);
  }
}

/* qgemm_rows for q4 weights and M >= 2. */
static void qgemm_q4_tiled(const int8_t *xq, const float *xd, const float *xs, int M, int K,
                           const block_q4 *w, const float *bias, int n0, int n1, float *y,
                           int64_t y_stride) {
  int nb = K / QK;
  uint8_t *buf = (uint8_t *)aligned_alloc(32, (size_t)NC * nb * (QK + 2 * sizeof(float)));
  q4_unpacked u = {buf, (float *)(buf + (size_t)NC * nb * QK), NULL};
  u.m = u.d + (size_t)NC * nb;
  float mins[TM * NC];
  for (int c = n0; c < n1; c += NC) {
    int rows = n1 - c < NC ? n1 - c : NC, tiles = (rows + TN - 1) / TN;
    unpack_q4_rows(w + (int64_t)c * nb, nb, rows, u);
    for (int m = 0; m < M; m += TM) {
      int mr = M - m < TM ? M - m : TM;
      const int8_t *xqm = xq + (int64_t)m * K;
      const float *xdm = xd + (int64_t)m * nb;
      q4_chunk_mins(u.m, nb, xs + (int64_t)m * nb, mr, mins);
      for (int t = 0; t < tiles; t++) {
        const uint8_t *codes = u.codes + (int64_t)t * TN * nb * QK;
        const float *d = u.d + t * TN;
        __m128 v[TM];
        switch (mr) {
          case 4: q4_tile_dots(codes, d, nb, xqm, K, xdm, 4, v); break;
          case 3: q4_tile_dots(codes, d, nb, xqm, K, xdm, 3, v); break;
          case 2: q4_tile_dots(codes, d, nb, xqm, K, xdm, 2, v); break;
          default: q4_tile_dots(codes, d, nb, xqm, K, xdm, 1, v); break;
        }
        int n = c + t * TN, nr = rows - t * TN < TN ? rows - t * TN : TN;
        for (int i = 0; i < mr; i++) {
          __m128 o = _mm_add_ps(v[i], _mm_loadu_ps(mins + i * NC + t * TN));
          float *yr = y + (int64_t)(m + i) * y_stride + n;
          if (nr == TN) {
            _mm_storeu_ps(yr, bias ? _mm_add_ps(o, _mm_loadu_ps(bias + n)) : o);
          } else {
            float out[TN];
            _mm_storeu_ps(out, o);
            for (int r = 0; r < nr; r++) yr[r] = bias ? out[r] + bias[n + r] : out[r];
          }
        }
      }
    }
  }
  free(buf);
}
#endif

/* Output rows [n0, n1) of y = xq . w^T (+ bias): the work of one thread's tile. */
static void qgemm_rows(int kind, const int8_t *xq, const float *xd, const float *xs, int M, int K,
                       const void *w, const float *bias, int n0, int n1, float *y,
                       int64_t y_stride) {
  int nb = K / QK;
  const block_q4 *w4 = (const block_q4 *)w;
  const block_q8 *w8 = (const block_q8 *)w;
  int n = n0;
#ifdef __AVX2__
  if (kind == 4 && M >= 2) {
    qgemm_q4_tiled(xq, xd, xs, M, K, w4, bias, n0, n1, y, y_stride);
    return;
  }
  if (kind == 4) /* one activation row (batch-1 decode): memory bound, blocks read in place */
    for (; n + 4 <= n1; n += 4) {
      float v[4];
      dot_q4_x4(w4 + (int64_t)n * nb, nb, xq, xd, xs, v);
      for (int r = 0; r < 4; r++) y[n + r] = bias ? v[r] + bias[n + r] : v[r];
    }
#endif
  for (; n < n1; n++) {
    for (int m = 0; m < M; m++) {
      float v = kind == 4 ? dot_q4(w4 + (int64_t)n * nb, xq + (int64_t)m * K,
                                   xd + (int64_t)m * nb, xs + (int64_t)m * nb, nb)
                          : dot_q8(w8 + (int64_t)n * nb, xq + (int64_t)m * K,
                                   xd + (int64_t)m * nb, nb);
      y[(int64_t)m * y_stride + n] = bias ? v + bias[n] : v;
    }
  }
}

/* y[m, n] = x[m] . w[n] (+ bias[n]) for x [M, K] float32 (row stride x_stride).
 * kind 4: w = [N, K/32] block_q4; kind 8: w = [N, K/32] block_q8. y rows have stride y_stride. */
void infer_qgemm(int kind, const float *x, int64_t x_stride, int M, int K, int silu_mul,
                 const void *w, const float *bias, int N, float *y, int64_t y_stride) {
  int nb = K / QK;
  int8_t *xq = (int8_t *)malloc((size_t)M * K);
  float *xd = (float *)malloc(sizeof(float) * (size_t)M * nb);
  float *xs = (float *)malloc(sizeof(float) * (size_t)M * nb);
  quantize_rows(x, x_stride, M, K, silu_mul, xq, xd, xs);
  /* Split the output rows across threads in tiles of 16 (a weight row is reused by every
   * activation row while it is in cache). */
#pragma omp parallel for num_threads(g_threads) schedule(static)
  for (int n0 = 0; n0 < N; n0 += 16)
    qgemm_rows(kind, xq, xd, xs, M, K, w, bias, n0, n0 + 16 < N ? n0 + 16 : N, y, y_stride);
  free(xq);
  free(xd);
  free(xs);
}

/* ---- Float-activation GEMM on GGUF blocks (batch invariant) --------------------------------
 * y [M, N] = x [M, K] . W^T (+ bias) with float32 activations and W's blocks dequantized exactly
 * to float32 (q4: fma(q, d, m), q8: d q; d q is exact in float32, so the values are the ones
 * gguf's dequantisation gives). Every output is ONE chain over k in order in 16 lanes,
 *     acc[l] = fma(w[n, 16 i + l], x[m, 16 i + l], acc[l])   for i = 0 .. K/16 - 1, l = 0..15,
 *     y[m, n] = sum16(acc) (+ bias[n]),   sum16: lanes l + (l + 8), then hsum256's tree,
 * whatever M, the tile it falls in, the thread that computes it or the chunk of weight rows it is
 * dequantized with: a row's result never depends on the rest of the batch (batch invariance;
 * the decode graph calls the same functions). AVX-512 holds the 16 lanes in one register, AVX2
 * in two (the same sums, so both builds give the same bits); the portable C path keeps the same
 * lanes and tree. Weight rows are dequantized FR at a time into a per-thread buffer and reused
 * by every activation row of an FMB-row block, in register tiles of FNR weight rows x FMR
 * activation rows; one activation row dequantizes in registers instead (row_dots). */
#define FR 4
#define KIND_I8 0x100  /* kind flag: int8 activations (see the integer-activation GEMM below) */
#define KIND_I16 0x200 /* kind flag: int16 activations (the same GEMM, int16 codes) */
#define KIND_INT (KIND_I8 | KIND_I16)
#define FMB 64

#if defined(__AVX512F__)
#define FNR 4 /* register tile: 4 x 6 accumulators of 16 lanes (24 of the 32 zmm registers) */
#define FMR 6
#define RD 8 /* weight rows of a one-row tile: independent chains to hide the FMA latency */
typedef __m512 v16;
static inline v16 v16_zero(void) { return _mm512_setzero_ps(); }
static inline v16 v16_set1(float f) { return _mm512_set1_ps(f); }
static inline v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v16_store(float *p, v16 v) { _mm512_storeu_ps(p, v); }
static inline v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
static inline v16 v16_u8(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
static inline v16 v16_i8(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
static inline float v16_sum(v16 a) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  return hsum256(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
}
#elif defined(__AVX2__)
#define FNR 2 /* 2 x 2 tiles of two-register accumulators: 8 of the 16 ymm registers */
#define FMR 2
#define RD 4
typedef struct {
  __m256 lo, hi;
} v16;
static inline v16 v16_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16 v16_set1(float f) { return (v16){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
static inline v16 v16_load(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void v16_store(float *p, v16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
static inline v16 v16_fma(v16 a, v16 b, v16 c) {
  return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline v16 v16_mul(v16 a, v16 b) { return (v16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline v16 v16_u8(__m128i b) {
  return (v16){_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)),
               _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
}
static inline v16 v16_i8(__m128i b) {
  return (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
               _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
}
static inline float v16_sum(v16 a) { return hsum256(_mm256_add_ps(a.lo, a.hi)); }
#endif

#ifdef __AVX2__
/* One block's 32 weights as two 16-lane vectors (weights 0..15, 16..31). */
static inline void deq_block(int kind, const void *blk, v16 *w0, v16 *w1) {
  if (kind == 4) {
    const block_q4 *b = (const block_q4 *)blk;
    const __m128i low = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)b->qs);
    v16 vd = v16_set1(h2f(b->d)), vm = v16_set1(h2f(b->m));
    *w0 = v16_fma(v16_u8(_mm_and_si128(raw, low)), vd, vm);
    *w1 = v16_fma(v16_u8(_mm_and_si128(_mm_srli_epi16(raw, 4), low)), vd, vm);
  } else {
    const block_q8 *b = (const block_q8 *)blk;
    v16 vd = v16_set1(h2f(b->d));
    *w0 = v16_mul(vd, v16_i8(_mm_loadu_si128((const __m128i *)b->qs)));
    *w1 = v16_mul(vd, v16_i8(_mm_loadu_si128((const __m128i *)(b->qs + 16))));
  }
}
#endif

static inline const void *block_at(int kind, const void *w, int64_t i) {
  return kind == 4 ? (const void *)((const block_q4 *)w + i) : (const void *)((const block_q8 *)w + i);
}

/* Weight rows [n0, n0 + nr) of w (kind 4: block_q4, kind 8: block_q8; [N, K/32] blocks) ->
 * float32 wf [nr, K]. */
static void dequant_rows(int kind, const void *w, int K, int n0, int nr, float *wf) {
  int nb = K / QK;
  for (int r = 0; r < nr; r++) {
    float *o = wf + (int64_t)r * K;
    for (int j = 0; j < nb; j++, o += QK) {
      const void *blk = block_at(kind, w, (int64_t)(n0 + r) * nb + j);
#ifdef __AVX2__
      v16 w0, w1;
      deq_block(kind, blk, &w0, &w1);
      v16_store(o, w0);
      v16_store(o + 16, w1);
#else
      if (kind == 4) {
        const block_q4 *b = (const block_q4 *)blk;
        float d = h2f(b->d), m = h2f(b->m);
        for (int i = 0; i < 16; i++) {
          o[i] = fmaf((float)(b->qs[i] & 0x0F), d, m);
          o[i + 16] = fmaf((float)(b->qs[i] >> 4), d, m);
        }
      } else {
        const block_q8 *b = (const block_q8 *)blk;
        float d = h2f(b->d);
        for (int i = 0; i < QK; i++) o[i] = d * (float)b->qs[i];
      }
#endif
    }
  }
}

#ifdef __AVX2__
/* y[m * y_stride + r] = wf_r . x_m for NR weight rows wf [NR, K] and MR activation rows (each
 * pair one chain, see above). Inlined with constant NR, MR: the accumulators stay in registers. */
static inline __attribute__((always_inline)) void f16_tile(const float *wf, int NR, int K,
                                                           const float *x, int64_t x_stride, int MR,
                                                           float *y, int64_t y_stride) {
  v16 a[FNR][FMR];
  _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++)
    _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++) a[r][m] = v16_zero();
  for (int i = 0; i < K; i += 16) {
    v16 wv[FNR];
    _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++) wv[r] = v16_load(wf + (int64_t)r * K + i);
    _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++) {
      v16 xv = v16_load(x + (int64_t)m * x_stride + i);
      _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++) a[r][m] = v16_fma(wv[r], xv, a[r][m]);
    }
  }
  _Pragma("GCC unroll 8") for (int m = 0; m < MR; m++)
    _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++) y[(int64_t)m * y_stride + r] = v16_sum(a[r][m]);
}

#define F16T(nr, mr) \
  case (nr) * 8 + (mr): f16_tile(wf, nr, K, x, x_stride, mr, y, y_stride); break;
/* f16_tile for any nr <= FNR, mr <= FMR, each an instance with constant sizes. */
static void f16_tile_any(const float *wf, int nr, int K, const float *x, int64_t x_stride, int mr,
                         float *y, int64_t y_stride) {
  switch (nr * 8 + mr) {
#if FNR == 4 && FMR == 6
    F16T(4, 6) F16T(4, 5) F16T(4, 4) F16T(4, 3) F16T(4, 2) F16T(4, 1)
    F16T(3, 6) F16T(3, 5) F16T(3, 4) F16T(3, 3) F16T(3, 2) F16T(3, 1)
#endif
    F16T(2, 2) F16T(2, 1) F16T(1, 2) F16T(1, 1)
#if FNR == 4 && FMR == 6
    F16T(2, 6) F16T(2, 5) F16T(2, 4) F16T(2, 3) F16T(1, 6) F16T(1, 5) F16T(1, 4) F16T(1, 3)
#endif
  }
}
#undef F16T

/* One activation row x against weight rows [n0, n0 + NR) of w, dequantized in registers instead
 * of through the buffer: the same weight values and the same chain per output as f16_tile, so the
 * same bits; one row reads each weight once, so skipping the buffer's store and load is what it
 * saves. Inlined with a constant NR. */
static inline __attribute__((always_inline)) void row_dots(int kind, const void *w, int nb,
                                                           int n0, int NR, const float *x,
                                                           float *y) {
  v16 a[RD];
  for (int r = 0; r < NR; r++) a[r] = v16_zero();
  /* the next tile's rows, a slice per block: the rows are read side by side, which the hardware
   * prefetchers do not follow as they do one stream */
  int64_t bsz = kind == 4 ? (int64_t)sizeof(block_q4) : (int64_t)sizeof(block_q8);
  int64_t bytes = (int64_t)NR * nb * bsz;
  const char *next = (const char *)w + (int64_t)(n0 + NR) * nb * bsz;
  for (int b = 0; b < nb; b++) {
    for (int64_t off = bytes * b / nb; off < bytes * (b + 1) / nb; off += 64)
      _mm_prefetch(next + off, _MM_HINT_T0);
    v16 x0 = v16_load(x + (int64_t)b * QK), x1 = v16_load(x + (int64_t)b * QK + 16);
    for (int r = 0; r < NR; r++) {
      v16 w0, w1;
      deq_block(kind, block_at(kind, w, (int64_t)(n0 + r) * nb + b), &w0, &w1);
      a[r] = v16_fma(w0, x0, a[r]);
      a[r] = v16_fma(w1, x1, a[r]);
    }
  }
  for (int r = 0; r < NR; r++) y[r] = v16_sum(a[r]);
}
#endif

/* The nr <= FR dequantized rows wf against M activation rows; y points at the chunk's first
 * output column. */
static void f32_chunk(const float *wf, int nr, int K, const float *x, int64_t x_stride, int M,
                      float *y, int64_t y_stride) {
#ifdef __AVX2__
  for (int m0 = 0; m0 < M; m0 += FMR) {
    int mr = M - m0 < FMR ? M - m0 : FMR;
    for (int r0 = 0; r0 < nr; r0 += FNR)
      f16_tile_any(wf + (int64_t)r0 * K, nr - r0 < FNR ? nr - r0 : FNR, K,
                   x + (int64_t)m0 * x_stride, x_stride, mr, y + (int64_t)m0 * y_stride + r0,
                   y_stride);
  }
#else
  for (int m = 0; m < M; m++)
    for (int r = 0; r < nr; r++) {
      float acc[16] = {0.f};
      const float *xr = x + (int64_t)m * x_stride, *wr = wf + (int64_t)r * K;
      for (int i = 0; i < K; i += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(wr[i + l], xr[i + l], acc[l]);
      float t[8];
      for (int l = 0; l < 8; l++) t[l] = acc[l] + acc[l + 8];
      y[(int64_t)m * y_stride + r] = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
    }
#endif
}

static void i8_rows(int kind, int wide, const float *x, int64_t x_stride, int M, int K,
                    const void *w, const uint8_t *tiles, const float *bias, int n0, int n1,
                    float *y, int64_t y_stride);

/* Output columns [n0, n1) of y = x . W^T (+ bias) for all M rows: one thread's share. wf: FR * K
 * floats of scratch, 32-byte aligned. kind | KIND_I8 / KIND_I16: the integer-activation path
 * (i8_rows), which reads w's packed tiles where given (infer_pack_tiles; NULL: none). */
static void fgemm_rows(int kind, const float *x, int64_t x_stride, int M, int K, const void *w,
                       const uint8_t *tiles, const float *bias, int n0, int n1, float *y,
                       int64_t y_stride, float *wf) {
  if (kind & KIND_INT) {
    i8_rows(kind & ~KIND_INT, (kind & KIND_I16) != 0, x, x_stride, M, K, w, tiles, bias, n0, n1, y,
            y_stride);
    return;
  }
#ifdef __AVX2__
  if (M == 1) { /* no buffer: see row_dots */
    int nb = K / QK, c = n0;
    for (; c + RD <= n1; c += RD) row_dots(kind, w, nb, c, RD, x, y + c);
    for (; c < n1; c++) row_dots(kind, w, nb, c, 1, x, y + c);
    if (bias)
      for (c = n0; c < n1; c++) y[c] += bias[c];
    return;
  }
#endif
  for (int mb = 0; mb < M; mb += FMB) {
    int mm = M - mb < FMB ? M - mb : FMB;
    for (int c = n0; c < n1; c += FR) {
      int nr = n1 - c < FR ? n1 - c : FR;
      dequant_rows(kind, w, K, c, nr, wf);
      float *yc = y + (int64_t)mb * y_stride + c;
      f32_chunk(wf, nr, K, x + (int64_t)mb * x_stride, x_stride, mm, yc, y_stride);
      if (bias)
        for (int m = 0; m < mm; m++)
          for (int r = 0; r < nr; r++) yc[(int64_t)m * y_stride + r] += bias[c + r];
    }
  }
}

/* ---- Integer-activation GEMM on GGUF blocks (batch invariant; int8 or int16 codes) ----------
 * kind | KIND_I8 or kind | KIND_I16 in fgemm_rows / infer_fgemm. Each activation row is quantized
 * on its own per 32-block as quantize_row_blocks does (dx = amax / qmax, codes qx = round(x / dx),
 * sx = dx sum(qx); qmax = 127 for int8 codes, llama.cpp's Q8, or 32767 for int16 codes), each
 * block's dot product with the weight codes is an exact int32 (dot_b: |dot_b| <= 32 * 128 * 32767
 * < 2^31, so no partial sum overflows in any order), and each output is ONE float chain over the
 * blocks in order:
 *     acc = fma((float)dot_b, dw_b * dx_b, acc);  q4 only: acc = fma(mw_b, sx_b, acc)
 *     y[m, n] = acc (+ bias[n])
 * The integer dot does not depend on how it is computed, and the float steps are the same scalar
 * operations in every path (AVX-512 VNNI tiles, AVX2 tiles, the in-place path, portable C, any
 * thread or tile position), so a row's result is the same bits whatever the batch, and the same
 * in every build.
 * Tiles (five or more rows): TW weight rows are repacked once per call into a buffer whose vectors
 * hold one group of codes of the TW rows side by side, run against up to IMR activation rows
 * broadcast a group at a time. A group is 4 bytes for int8 on VNNI ("quads": vpdpbusd, u8 x s8;
 * q8 codes are stored as q + 128 and 128 sum(qx) is subtracted from the integer dot, exact) and
 * 2 int16 otherwise ("pairs": vpdpwssd for int16 on VNNI, vpmaddwd on AVX2 for either precision,
 * int8 codes widened to int16 first; signed q8 codes as they are).
 * Up to four activation rows read the blocks in place instead, two rows per pass (int_rows8):
 * per block, 8 weight rows' codes widened to int16 once, their dots against each row's int16
 * codes (int8 codes widened) into one accumulator per weight row, the 8 reduced together, then
 * the 8 rows' float steps side by side in one vector (lane r is weight row r's chain). */
#define IMB 256 /* activation rows per block: their codes stay in L2 across the weight tiles */
/* Calls of TILES_MIN_M rows or more read a matrix's tiles packed at load, when it has them
 * (infer_pack_tiles). Measured on Zen 3 (AVX2), the default model's decode steps in the engine
 * (benchmarks/cpu_q4_graph_ab.py): 1.26x at 3 rows, 1.41x at 4, 1.25x at 8, 1.09x at 32; but
 * 0.59x at 1 row and 0.89x at 2, where the step streams the weights from memory once either way
 * and the packed bytes are 2.2x the blocks. Past 128 rows (prefill) the per-call repack is
 * amortized: 0.98-1.00x there on Zen 3, so calls of more than 128 rows repacked until session 28;
 * on Zen 5 (AVX-512 VNNI) the packed tiles make prefill and mixed steps 1.05x, and with i8_tile2_any
 * (which reads only packed tiles) 1.10-1.13x. */
#ifndef TILES_MIN_M
#define TILES_MIN_M 3
#endif

typedef struct {
  const int8_t *q;    /* [M, K] int8 codes, or NULL */
  const int16_t *q16; /* [M, K] int16 codes (int16 activations), or NULL */
  const float *d, *s; /* [M, nb] scales dx and dx * sum(qx) */
  const int32_t *sum; /* [M, nb] sum(qx) */
  int K, nb;
} i8_act;

/* Per-thread scratch that grows and is kept (the decode graph calls the GEMMs every step). */
typedef struct {
  void *p;
  size_t cap;
} scratch;
static __thread scratch tl_act;
#ifdef __AVX2__
static __thread scratch tl_x16; /* int8 codes widened to int16 (the pair tiles, one-row path) */
static __thread scratch tl_w;   /* a repacked weight tile */
#endif

static void *scratch_get(scratch *s, size_t n) {
  if (n > s->cap) {
    free(s->p);
    s->cap = (n + 4095) & ~(size_t)4095;
    s->p = aligned_alloc(64, s->cap);
  }
  return s->p;
}

static size_t codes_bytes(int M, int K, int wide) {
  return ((size_t)M * K * (wide ? 2 : 1) + 63) & ~(size_t)63;
}

/* The layout of M rows' quantized activations in buf: M * K codes (int16 if wide, else int8),
 * then d, s and sum (M * nb each). */
static i8_act i8_layout(int M, int K, int wide, char *buf) {
  int nb = K / QK;
  float *d = (float *)(buf + codes_bytes(M, K, wide)), *s = d + (size_t)M * nb;
  i8_act a = {wide ? NULL : (const int8_t *)buf, wide ? (const int16_t *)buf : NULL, d, s,
              (const int32_t *)(s + (size_t)M * nb), K, nb};
  return a;
}

static size_t i8_act_bytes(int M, int K, int wide) {
  return codes_bytes(M, K, wide) + (size_t)M * (K / QK) * 3 * 4;
}

/* Row m of a <- the quantized row x (each row on its own: batch invariant). */
static void i8_quantize_row(const float *x, const i8_act *a, int m) {
  int64_t o = (int64_t)m * a->K, ob = (int64_t)m * a->nb;
  float *d = (float *)a->d + ob, *s = (float *)a->s + ob;
  int32_t *sum = (int32_t *)a->sum + ob;
  if (a->q16)
    quantize_row_blocks(x, a->K, 1, NULL, (int16_t *)a->q16 + o, d, s, sum);
  else
    quantize_row_blocks(x, a->K, 0, (int8_t *)a->q + o, NULL, d, s, sum);
}

static inline int32_t load4(const void *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* Block i's scale d and (q4) minimum m, as their float16 bits and as floats. */
static inline uint16_t block_dh(int kind, const void *w, int64_t i) {
  return kind == 4 ? ((const block_q4 *)w)[i].d : ((const block_q8 *)w)[i].d;
}
static inline uint16_t block_mh(int kind, const void *w, int64_t i) {
  return kind == 4 ? ((const block_q4 *)w)[i].m : 0;
}
static inline float block_dw(int kind, const void *w, int64_t i) { return h2f(block_dh(kind, w, i)); }
static inline float block_mw(int kind, const void *w, int64_t i) {
  return kind == 4 ? h2f(block_mh(kind, w, i)) : 0.f;
}

/* The integer dot of weight block i with an activation block (int8 codes x8, or int16 x16). */
static inline int32_t dot_block_ref(int kind, const void *w, int64_t i, const int8_t *x8,
                                    const int16_t *x16) {
  int32_t t = 0;
  if (kind == 4) {
    const block_q4 *b = (const block_q4 *)w + i;
    for (int j = 0; j < 16; j++)
      t += (b->qs[j] & 0x0F) * (x16 ? x16[j] : x8[j]) + (b->qs[j] >> 4) * (x16 ? x16[j + 16] : x8[j + 16]);
  } else {
    const block_q8 *b = (const block_q8 *)w + i;
    for (int j = 0; j < QK; j++) t += b->qs[j] * (x16 ? x16[j] : x8[j]);
  }
  return t;
}

/* The float steps of one output, block by block (every path does exactly these). */
static inline float i8_step(float acc, int32_t dot, float dw, float dx, int q4, float mw, float sx) {
  acc = fmaf((float)dot, dw * dx, acc);
  return q4 ? fmaf(mw, sx, acc) : acc;
}

/* Output (m, n) by the scalar steps: the portable path, and the vector paths' tails. */
static float int_dot_ref(int kind, const void *w, int n, const i8_act *a, int m) {
  int nb = a->nb;
  const float *xd = a->d + (int64_t)m * nb, *xs = a->s + (int64_t)m * nb;
  float acc = 0.f;
  for (int b = 0; b < nb; b++) {
    int64_t i = (int64_t)n * nb + b, o = (int64_t)m * a->K + (int64_t)b * QK;
    int32_t dot = dot_block_ref(kind, w, i, a->q ? a->q + o : NULL, a->q16 ? a->q16 + o : NULL);
    acc = i8_step(acc, dot, block_dw(kind, w, i), xd[b], kind == 4, block_mw(kind, w, i), xs[b]);
  }
  return acc;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define I8_VNNI 1
#define TW 16 /* weight rows per tile: one zmm of int32 lanes */
#define IMR 8 /* activation rows per register tile */
#elif defined(__AVX2__)
#define TW 16 /* two ymm of int32 lanes: a broadcast activation pair feeds two multiplies, which
                 keeps the multiply-adds within Zen 3's dispatch width (one ymm: 3 ops for each) */
#define IMR 6 /* 6 rows x 16 outputs: 12 int32 sums in registers (the float chains spill) */
#endif

#ifdef __AVX2__
#ifdef I8_VNNI
#define DPW256(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#else
#define DPW256(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif

/* Lane r = the sum of p[r]'s 8 int32 lanes, r = 0..7 (integers: exact in any order). */
static inline __m256i hsum8_epi32(const __m256i p[8]) {
  __m256i t[4];
  for (int r = 0; r < 4; r++)
    t[r] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * r], p[2 * r + 1]),
                            _mm256_unpackhi_epi32(p[2 * r], p[2 * r + 1]));
  __m256i u0 = _mm256_add_epi32(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));
  __m256i u1 = _mm256_add_epi32(_mm256_unpacklo_epi64(t[2], t[3]), _mm256_unpackhi_epi64(t[2], t[3]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* The float16 scale (and q4 minimum) at the start of 8 blocks (base + r * stride bytes) as
 * floats (eight scalar loads: faster here than a gather). */
static inline void scales8(const char *base, int64_t stride, __m256 *dw, __m256 *mw) {
  __m256i dm = _mm256_setr_epi32(load4(base), load4(base + stride), load4(base + 2 * stride),
                                 load4(base + 3 * stride), load4(base + 4 * stride),
                                 load4(base + 5 * stride), load4(base + 6 * stride),
                                 load4(base + 7 * stride)); /* d | m << 16 */
#ifdef __F16C__
  __m256i h = _mm256_packus_epi32(_mm256_and_si256(dm, _mm256_set1_epi32(0xFFFF)),
                                  _mm256_srli_epi32(dm, 16)); /* d0-3 m0-3 | d4-7 m4-7 */
  h = _mm256_permute4x64_epi64(h, 0xD8);
  *dw = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *mw = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
#else
  uint32_t v[8];
  float d[8], m[8];
  _mm256_storeu_si256((__m256i *)v, dm);
  for (int r = 0; r < 8; r++) {
    d[r] = h2f((uint16_t)v[r]);
    m[r] = h2f((uint16_t)(v[r] >> 16));
  }
  *dw = _mm256_loadu_ps(d);
  *mw = _mm256_loadu_ps(m);
#endif
}

/* One weight block's 32 codes as int16: *lo = codes 0..15, *hi = codes 16..31 (k order). */
static inline __attribute__((always_inline)) void block_int16(int kind, const char *blk, __m256i *lo,
                                                              __m256i *hi) {
  if (kind == 4) { /* byte j: code j (low nibble), code j + 16 (high) */
    __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)((const block_q4 *)blk)->qs));
    *lo = _mm256_and_si256(c, _mm256_set1_epi16(0x0F));
    *hi = _mm256_srli_epi16(c, 4);
  } else {
    const int8_t *qs = ((const block_q8 *)blk)->qs;
    *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs));
    *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
  }
}

/* v[r] <- column r of the 8 x 8 dword matrix whose rows are v[0..7]. */
static inline __attribute__((always_inline)) void transpose8_epi32(__m256i v[8]) {
  __m256i t[8], u[8];
  for (int j = 0; j < 4; j++) {
    t[2 * j] = _mm256_unpacklo_epi32(v[2 * j], v[2 * j + 1]);
    t[2 * j + 1] = _mm256_unpackhi_epi32(v[2 * j], v[2 * j + 1]);
  }
  for (int j = 0; j < 2; j++) {
    u[4 * j] = _mm256_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
    u[4 * j + 1] = _mm256_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
    u[4 * j + 2] = _mm256_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
    u[4 * j + 3] = _mm256_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
  }
  for (int e = 0; e < 4; e++) {
    v[e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x20);
    v[4 + e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x31);
  }
}

/* MR <= 2 activation rows (int16 codes x16 [MR][K], scales xd, xs [MR][nb]; row strides K, nb)
 * against weight rows [n0, n0 + 8), the blocks read in place and widened once for both rows;
 * y[m * y_stride + 0..7]. Inlined with a constant MR. */
static inline __attribute__((always_inline)) void int_rows8(int kind, const void *w, int nb, int n0,
                                                            const int16_t *x16, int K,
                                                            const float *xd, const float *xs,
                                                            int MR, float *y, int64_t y_stride) {
  int q4 = kind == 4;
  int64_t bsz = q4 ? (int64_t)sizeof(block_q4) : (int64_t)sizeof(block_q8), row = (int64_t)nb * bsz;
  const char *w0 = (const char *)w + n0 * row;
  /* the next tile's rows, a slice per block (see row_dots) */
  const char *next = w0 + 8 * row;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int b = 0; b < nb; b++) {
    for (int64_t off = 8 * row * b / nb; off < 8 * row * (b + 1) / nb; off += 64)
      _mm_prefetch(next + off, _MM_HINT_T0);
    __m256i xlo[2], xhi[2], p[2][8];
    for (int m = 0; m < MR; m++) {
      xlo[m] = _mm256_loadu_si256((const __m256i *)(x16 + (int64_t)m * K + (int64_t)b * QK));
      xhi[m] = _mm256_loadu_si256((const __m256i *)(x16 + (int64_t)m * K + (int64_t)b * QK + 16));
    }
    const char *wb = w0 + (int64_t)b * bsz;
    for (int r = 0; r < 8; r++) {
      __m256i lo, hi;
      block_int16(kind, wb + r * row, &lo, &hi);
      for (int m = 0; m < MR; m++) p[m][r] = DPW256(_mm256_madd_epi16(lo, xlo[m]), hi, xhi[m]);
    }
    __m256 dw, mw;
    scales8(wb, row, &dw, &mw);
    for (int m = 0; m < MR; m++) {
      int64_t mb = (int64_t)m * nb + b;
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8_epi32(p[m])), _mm256_mul_ps(dw, _mm256_set1_ps(xd[mb])), acc[m]);
      if (q4) acc[m] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[mb]), acc[m]);
    }
  }
  for (int m = 0; m < MR; m++) _mm256_storeu_ps(y + m * y_stride, acc[m]);
}

/* Rows [m0, m0 + mr) (mr <= 2) of the product against weight rows [n0, n1) by int_rows8, the tail
 * of fewer than 8 weight rows by the scalar steps. */
static void int_rows(int kind, const void *w, const i8_act *a, const int16_t *x16, int m0, int mr,
                     int n0, int n1, float *y, int64_t y_stride) {
  int nb = a->nb, K = a->K, n = n0;
  const int16_t *xm = x16 + (int64_t)m0 * K;
  const float *xd = a->d + (int64_t)m0 * nb, *xs = a->s + (int64_t)m0 * nb;
  float *ym = y + (int64_t)m0 * y_stride;
  for (; n + 8 <= n1; n += 8) {
    if (mr == 2)
      int_rows8(kind, w, nb, n, xm, K, xd, xs, 2, ym + n, y_stride);
    else
      int_rows8(kind, w, nb, n, xm, K, xd, xs, 1, ym + n, y_stride);
  }
  for (; n < n1; n++)
    for (int m = 0; m < mr; m++) ym[(int64_t)m * y_stride + n] = int_dot_ref(kind, w, n, a, m0 + m);
}

/* One row's block as 32 code bytes in k order (q4: 0..15; q8: q, or q + 128 with u8). */
static inline __m256i block_codes(int kind, const void *w, int64_t i, int u8) {
  if (kind == 4) return unpack_q4(((const block_q4 *)w + i)->qs);
  __m256i q = _mm256_loadu_si256((const __m256i *)((const block_q8 *)w + i)->qs);
  return u8 ? _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)) : q;
}

/* A tile of tw <= TW weight rows [n0, n0 + tw) repacked: per block, the codes of the groups
 * (quads: 8 groups of 4 bytes; pairs: 16 groups of 2 int16) of the TW rows side by side (rows past
 * tw zero), then dw [nb][TW] and mw [nb][TW]. */
static size_t tile_block(int quads) { return (size_t)(quads ? 8 : 16) * TW * 4; }

static void i8_repack(int kind, const void *w, int nb, int n0, int tw, int quads, uint8_t *buf) {
  size_t tb = tile_block(quads);
  float *dw = (float *)(buf + (size_t)nb * tb), *mw = dw + (size_t)nb * TW;
  /* the next tile's rows, a slice per block: TW rows read side by side are more streams than the
   * hardware prefetchers follow (a weight matrix larger than the caches: the LM head) */
  int64_t bs = kind == 4 ? (int64_t)sizeof(block_q4) : (int64_t)sizeof(block_q8);
  int64_t slice = TW * bs; /* the next tile's TW rows of bytes over nb blocks: no division per block */
  const char *next = (const char *)block_at(kind, w, (int64_t)(n0 + TW) * nb);
  for (int b = 0; b < nb; b++) {
    for (int64_t off = slice * b; off < slice * (b + 1); off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
    uint8_t *cb = buf + (size_t)b * tb;
#ifdef I8_VNNI
    if (quads) {
      /* rows' code bytes 0..15 (groups 0..3) and 16..31 (groups 4..7), 4 rows per zmm */
      __m512i lo[4], hi[4];
      for (int q = 0; q < 4; q++) {
        lo[q] = hi[q] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
          int r = 4 * q + j;
          if (r >= tw) break;
          __m256i c = block_codes(kind, w, (int64_t)(n0 + r) * nb + b, 1);
          lo[q] = _mm512_inserti32x4(lo[q], _mm256_castsi256_si128(c), j);
          hi[q] = _mm512_inserti32x4(hi[q], _mm256_extracti128_si256(c, 1), j);
        }
      }
      /* a 16 x 4 transpose of dwords per half: group g of rows 0..15 into one zmm */
      const __m512i ia = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
      const __m512i ib = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
      for (int h = 0; h < 2; h++) {
        __m512i *z = h ? hi : lo;
        __m512i p0 = _mm512_permutex2var_epi32(z[0], ia, z[1]), q0 = _mm512_permutex2var_epi32(z[2], ia, z[3]);
        __m512i p1 = _mm512_permutex2var_epi32(z[0], ib, z[1]), q1 = _mm512_permutex2var_epi32(z[2], ib, z[3]);
        __m512i *o = (__m512i *)(cb + (size_t)h * 4 * 64);
        _mm512_store_si512(o + 0, _mm512_shuffle_i64x2(p0, q0, 0x44));
        _mm512_store_si512(o + 1, _mm512_shuffle_i64x2(p0, q0, 0xEE));
        _mm512_store_si512(o + 2, _mm512_shuffle_i64x2(p1, q1, 0x44));
        _mm512_store_si512(o + 3, _mm512_shuffle_i64x2(p1, q1, 0xEE));
      }
    } else {
      /* pairs: each row's 32 codes as int16 (16 dwords), then a 16 x 16 dword transpose */
      __m512i r[16], t[16];
      for (int j = 0; j < 16; j++) {
        int64_t i = (int64_t)(n0 + j) * nb + b;
        r[j] = j >= tw ? _mm512_setzero_si512()
               : kind == 4 ? _mm512_cvtepu8_epi16(block_codes(kind, w, i, 0))
                           : _mm512_cvtepi8_epi16(block_codes(kind, w, i, 0));
      }
      for (int j = 0; j < 8; j++) { /* lane l: rows 2j, 2j + 1, dwords 4l..4l + 3 interleaved */
        t[2 * j] = _mm512_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
        t[2 * j + 1] = _mm512_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
      }
      for (int j = 0; j < 4; j++) { /* r[4j + e]: rows 4j..4j + 3 of dword 4l + e in lane l */
        r[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        r[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        r[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        r[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
      }
      __m512i *o = (__m512i *)cb; /* o[p]: pair p of rows 0..15 (a 4 x 4 transpose of lanes) */
      for (int e = 0; e < 4; e++) {
        __m512i u0 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44), u1 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
        __m512i u2 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44), u3 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
        _mm512_store_si512(o + e, _mm512_shuffle_i32x4(u0, u2, 0x88));
        _mm512_store_si512(o + 4 + e, _mm512_shuffle_i32x4(u0, u2, 0xDD));
        _mm512_store_si512(o + 8 + e, _mm512_shuffle_i32x4(u1, u3, 0x88));
        _mm512_store_si512(o + 12 + e, _mm512_shuffle_i32x4(u1, u3, 0xDD));
      }
    }
#else
    { /* pairs: per 8 rows, each row's codes as int16 (pairs 0..7, 8..15: a dword each), two
       * 8 x 8 transposes: pair g of rows 8h..8h + 7 at cb + g * TW * 4 + 32 h; then the rows'
       * scales converted 8 at a time */
      for (int h = 0; h < TW / 8; h++) {
        __m256i lo[8], hi[8];
        for (int r = 0; r < 8; r++) {
          if (8 * h + r < tw)
            block_int16(kind, (const char *)block_at(kind, w, (int64_t)(n0 + 8 * h + r) * nb + b), lo + r, hi + r);
          else
            lo[r] = hi[r] = _mm256_setzero_si256();
        }
        transpose8_epi32(lo);
        transpose8_epi32(hi);
        for (int p = 0; p < 8; p++) {
          _mm256_store_si256((__m256i *)(cb + (size_t)p * TW * 4 + 32 * h), lo[p]);
          _mm256_store_si256((__m256i *)(cb + (size_t)(8 + p) * TW * 4 + 32 * h), hi[p]);
        }
      }
      if (tw == TW) {
        for (int h = 0; h < TW / 8; h++) {
          __m256 vd, vm; /* the scales of rows 8h.. (a row is nb blocks of bs bytes) */
          scales8((const char *)block_at(kind, w, (int64_t)(n0 + 8 * h) * nb + b), nb * bs, &vd, &vm);
          _mm256_storeu_ps(dw + (size_t)b * TW + 8 * h, vd);
          _mm256_storeu_ps(mw + (size_t)b * TW + 8 * h, kind == 4 ? vm : _mm256_setzero_ps());
        }
        continue;
      }
    }
#endif
    for (int r = 0; r < TW; r++) {
      int64_t i = (int64_t)(n0 + r) * nb + b;
      dw[b * TW + r] = r < tw ? block_dw(kind, w, i) : 0.f;
      mw[b * TW + r] = r < tw ? block_mw(kind, w, i) : 0.f;
    }
  }
}

/* Tiles packed once, at load (infer_pack_tiles): the per-call repack above widens and transposes
 * a tile's codes on every call, and a decode step of 5-32 rows uses each repacked tile for only 1-6
 * register tiles (measured: the repack was 20 % of a batch-8 decode step). A packed matrix holds
 * the pair layout of every tile, with the codes kept small (the tiles widen them to int16 as
 * they load them): q8's int8 codes a byte each, q4's 0..15 codes two a byte (a pair's first in
 * the low nibble). Per tile of TW rows (the last one padded with zero rows), per block, 16 pairs
 * x TW rows (x 2 bytes for q8), then dw [nb][TW] and (q4) mw [nb][TW] as the blocks' own
 * float16 scales (widened exactly, as h2f does). A 4-bit block of a tile row is then 16 bytes of
 * codes and 4 of scales, the GGUF block's 20 (it was 40: byte codes, float32 scales): the decode
 * steps stream every weight once, and read half (cpu_q4_graph_ab.py on Zen 5, the same bits: the
 * 4-bit codes 1.11x an 8-row decode step, 1.03x a 32-row one, prefill 0.98-1.01x). */
static size_t packed_block(int q4) { return (size_t)16 * TW * (q4 ? 1 : 2); }
/* a packed tile's bytes per block: the codes, and the block's share of dw and mw */
static size_t packed_slice(int q4) { return packed_block(q4) + (q4 ? 2 : 1) * TW * sizeof(uint16_t); }
static size_t packed_tile_bytes(int nb, int q4) { return (size_t)nb * packed_slice(q4); }

#ifdef I8_VNNI
typedef __m512 vtw_f;
typedef __m512i vtw_i;
#define VTW_ZERO_I() _mm512_setzero_si512()
#define VTW_ZERO_F() _mm512_setzero_ps()
#define VTW_LOAD_I(p) _mm512_load_si512((const void *)(p))
#define VTW_LOAD_F(p) _mm512_loadu_ps(p)
#define VTW_LOAD_H(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VTW_LOAD_B(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p)))
/* TW bytes of 4-bit code pairs (low nibble k, high nibble k + 1) -> lanes (k in the low word,
 * k + 1 in the high one): (v | v << 12) & 0x000F000F in one ternary-logic step */
static inline __m512i vtw_load_nib(const uint8_t *p) {
  __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(v, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
}
#define VTW_LOAD_N(p) vtw_load_nib(p)
#define VTW_SET1_I(v) _mm512_set1_epi32(v)
#define VTW_SET1_F(v) _mm512_set1_ps(v)
#define VTW_DOT4(acc, w, x) _mm512_dpbusd_epi32(acc, w, x)
#define VTW_DOT2(acc, w, x) _mm512_dpwssd_epi32(acc, w, x)
#define VTW_SUB_I(a, b) _mm512_sub_epi32(a, b)
#define VTW_CVT(a) _mm512_cvtepi32_ps(a)
#define VTW_MUL(a, b) _mm512_mul_ps(a, b)
#define VTW_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VTW_STORE_F(p, v) _mm512_storeu_ps(p, v)
#define VTW_PIN(v) (void)0 /* vpdpwssd accumulates: nothing to reassociate */
#else
/* 8 code bytes as dwords -> the two 4-bit codes of each in its low and high word */
static inline __m256i vtw_nib8(__m256i v) {
  return _mm256_and_si256(_mm256_or_si256(v, _mm256_slli_epi32(v, 12)), _mm256_set1_epi32(0x000F000F));
}
/* TW = 16 lanes as two ymm; a broadcast is the same value in both halves (one register) */
typedef struct {
  __m256 v[2];
} vtw_f;
typedef struct {
  __m256i v[2];
} vtw_i;
#define VTW2(T, e0, e1) ((T){{(e0), (e1)}})
#define VTW_ZERO_I() VTW2(vtw_i, _mm256_setzero_si256(), _mm256_setzero_si256())
#define VTW_ZERO_F() VTW2(vtw_f, _mm256_setzero_ps(), _mm256_setzero_ps())
#define VTW_LOAD_I(p) VTW2(vtw_i, _mm256_load_si256((const __m256i *)(p)), _mm256_load_si256((const __m256i *)(p) + 1))
#define VTW_LOAD_F(p) VTW2(vtw_f, _mm256_loadu_ps(p), _mm256_loadu_ps((p) + 8))
#define VTW_LOAD_H(p) \
  VTW2(vtw_f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p) + 1)))
#define VTW_LOAD_B(p)                                                                    \
  VTW2(vtw_i, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p))),               \
       _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p) + 1)))
#define VTW_NIB8(p) vtw_nib8(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VTW_LOAD_N(p) VTW2(vtw_i, VTW_NIB8(p), VTW_NIB8((const uint8_t *)(p) + 8))
#define VTW_SET1_I(x) VTW2(vtw_i, _mm256_set1_epi32(x), _mm256_set1_epi32(x))
#define VTW_SET1_F(x) VTW2(vtw_f, _mm256_set1_ps(x), _mm256_set1_ps(x))
#define VTW_DOT4(acc, w, x) VTW_DOT2(acc, w, x) /* no quads without VNNI */
#define VTW_DOT2(acc, w, x)                                                              \
  VTW2(vtw_i, _mm256_add_epi32((acc).v[0], _mm256_madd_epi16((w).v[0], (x).v[0])),      \
       _mm256_add_epi32((acc).v[1], _mm256_madd_epi16((w).v[1], (x).v[1])))
#define VTW_SUB_I(a, b) VTW2(vtw_i, _mm256_sub_epi32((a).v[0], (b).v[0]), _mm256_sub_epi32((a).v[1], (b).v[1]))
#define VTW_CVT(a) VTW2(vtw_f, _mm256_cvtepi32_ps((a).v[0]), _mm256_cvtepi32_ps((a).v[1]))
#define VTW_MUL(a, b) VTW2(vtw_f, _mm256_mul_ps((a).v[0], (b).v[0]), _mm256_mul_ps((a).v[1], (b).v[1]))
#define VTW_FMA(a, b, c)                                                                 \
  VTW2(vtw_f, _mm256_fmadd_ps((a).v[0], (b).v[0], (c).v[0]), _mm256_fmadd_ps((a).v[1], (b).v[1], (c).v[1]))
#define VTW_STORE_F(p, a) (_mm256_storeu_ps(p, (a).v[0]), _mm256_storeu_ps((p) + 8, (a).v[1]))
/* Keeps an integer accumulator in registers at this point. Integer adds associate, and without
 * this GCC rewrites a tile's 16-group chains as trees over all the products, spilled to the stack
 * (measured: a third of the multiply rate on Zen 3). */
#define VTW_PIN(a) __asm__("" : "+x"((a).v[0]), "+x"((a).v[1]))
#endif

/* A repacked tile (buf) against MR activation rows m0.. of a: out[m] = the TW outputs of row m
 * before the bias. Quads read a's int8 codes; pairs read x16 (int16 codes [M, K]: a's own, or its
 * int8 codes widened). pk: buf is a tile packed at load (pairs of byte codes, widened to int16 as
 * they are loaded; see infer_pack_tiles). NT = 2 (packed int16 pairs only, AVX-512 VNNI): buf1
 * is the next packed tile, run side by side with buf against the same broadcasts into out1; per
 * column the same integer dots and float steps in the same order (the same bits). Inlined with
 * constant q4, quads, pk, NT and MR. */
static inline __attribute__((always_inline)) void i8_tile(int q4, int quads, int pk, int NT,
                                                          const uint8_t *buf, const uint8_t *buf1,
                                                          const char *next, const i8_act *a,
                                                          const int16_t *x16, int m0, int MR,
                                                          float *out, float *out1) {
  int nb = a->nb, K = a->K, groups = quads ? 8 : 16;
  size_t tb = pk ? packed_block(q4) : tile_block(quads);
  const uint8_t *bufs[2] = {buf, buf1};
  float *outs[2] = {out, out1};
  vtw_f acc[2][IMR];
  _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++)
    _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) acc[t][m] = VTW_ZERO_F();
  for (int b = 0; b < nb; b++) {
    if (next) /* a slice per block of the NT packed tiles after these (streamed from memory) */
      for (size_t off = NT * packed_slice(q4) * b; off < NT * packed_slice(q4) * (b + 1); off += 64)
        _mm_prefetch(next + off, _MM_HINT_T0);
    vtw_i s[2][IMR];
    _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++)
      _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) s[t][m] = VTW_ZERO_I();
    _Pragma("GCC unroll 16") for (int g = 0; g < groups; g++) {
      vtw_i wv[2];
      _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
        const uint8_t *cb = bufs[t] + (size_t)b * tb;
        wv[t] = pk ? (q4 ? VTW_LOAD_N(cb + (size_t)g * TW) : VTW_LOAD_B(cb + (size_t)g * TW * 2))
                   : VTW_LOAD_I(cb + (size_t)g * TW * 4);
      }
#ifdef I8_VNNI
      if (NT == 2) __asm__("" : "+v"(wv[0]), "+v"(wv[1])); /* in registers: a load each, not one a row */
#endif
      _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) {
        int64_t o = (int64_t)(m0 + m) * K + (int64_t)b * QK;
        vtw_i x = quads ? VTW_SET1_I(load4(a->q + o + 4 * g)) : VTW_SET1_I(load4(x16 + o + 2 * g));
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
          s[t][m] = quads ? VTW_DOT4(s[t][m], wv[t], x) : VTW_DOT2(s[t][m], wv[t], x);
          VTW_PIN(s[t][m]);
        }
      }
    }
    vtw_f vdw[2], vmw[2];
    _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
      if (pk) { /* float16 scales, widened exactly */
        const uint16_t *dh = (const uint16_t *)(bufs[t] + (size_t)nb * tb), *mh = dh + (size_t)nb * TW;
        vdw[t] = VTW_LOAD_H(dh + (size_t)b * TW);
        vmw[t] = q4 ? VTW_LOAD_H(mh + (size_t)b * TW) : VTW_ZERO_F();
        continue;
      }
      const float *dw = (const float *)(bufs[t] + (size_t)nb * tb), *mw = dw + (size_t)nb * TW;
      vdw[t] = VTW_LOAD_F(dw + (size_t)b * TW);
      vmw[t] = VTW_LOAD_F(mw + (size_t)b * TW);
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) {
      int64_t mb = (int64_t)(m0 + m) * nb + b;
      vtw_f dx = VTW_SET1_F(a->d[mb]), sx = VTW_SET1_F(a->s[mb]);
      _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
        vtw_i d = s[t][m];
        if (quads && !q4) d = VTW_SUB_I(d, VTW_SET1_I(128 * a->sum[mb]));
        acc[t][m] = VTW_FMA(VTW_CVT(d), VTW_MUL(vdw[t], dx), acc[t][m]);
        if (q4) acc[t][m] = VTW_FMA(vmw[t], sx, acc[t][m]);
      }
    }
  }
  _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++)
    _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) VTW_STORE_F(outs[t] + (size_t)m * TW, acc[t][m]);
}

#ifdef I8_VNNI
/* Two adjacent packed tiles of int16 pairs (columns c .. c + 2 TW) side by side: each activation
 * pair and each row's scales broadcast once for both tiles' products (one tile loads a broadcast
 * for every product). At most IMR2 rows (the two tiles' sums and their weights fit the registers). */
#ifndef IMR2
#define IMR2 6
#endif
#define I8T2(q, mr) \
  case (mr) * 2 + (q): i8_tile(q, 0, 1, 2, buf0, buf1, next, a, x16, m0, mr, out0, out1); break;
static void i8_tile2_any(int q4, const uint8_t *buf0, const uint8_t *buf1, const char *next,
                         const i8_act *a, const int16_t *x16, int m0, int mr, float *out0,
                         float *out1) {
  switch (mr * 2 + q4) {
    I8T2(1, 1) I8T2(0, 1) I8T2(1, 2) I8T2(0, 2) I8T2(1, 3) I8T2(0, 3)
    I8T2(1, 4) I8T2(0, 4) I8T2(1, 5) I8T2(0, 5) I8T2(1, 6) I8T2(0, 6)
  }
}
#undef I8T2
#endif

#define I8T(q, mr) \
  case (mr) * 2 + (q): i8_tile(q, QUADS, PK, 1, buf, NULL, PK ? next : NULL, a, x16, m0, mr, out, NULL); break;
#define I8_TILES                                                                         \
  switch (mr * 2 + q4) {                                                                 \
    I8T(1, 1) I8T(0, 1) I8T(1, 2) I8T(0, 2) I8T(1, 3) I8T(0, 3) I8T(1, 4) I8T(0, 4)      \
    I8T_WIDE                                                                             \
  }
#if IMR == 8
#define I8T_WIDE I8T(1, 5) I8T(0, 5) I8T(1, 6) I8T(0, 6) I8T(1, 7) I8T(0, 7) I8T(1, 8) I8T(0, 8)
#elif IMR == 6
#define I8T_WIDE I8T(1, 5) I8T(0, 5) I8T(1, 6) I8T(0, 6)
#else
#define I8T_WIDE
#endif
static void i8_tile_any(int q4, int quads, int pk, const uint8_t *buf, const char *next,
                        const i8_act *a, const int16_t *x16, int m0, int mr, float *out) {
#define PK 0
#ifdef I8_VNNI
  if (quads) {
#define QUADS 1
    I8_TILES
#undef QUADS
    return;
  }
#endif
  (void)quads;
#define QUADS 0
  if (pk) {
#undef PK
#define PK 1
    I8_TILES
    return;
  }
#undef PK
#define PK 0
  I8_TILES
#undef QUADS
#undef PK
}
#undef I8T
#undef I8_TILES
#undef I8T_WIDE
#endif /* __AVX2__ */

/* dst[0, tw) = src[0, tw): a tile's output row (a full tile in vector moves; a memcpy of a
 * variable size compiles to rep movs, whose start-up cost measured 8 % of i8_gemm at 8 rows). */
static inline void tile_row_out(float *dst, const float *src, int tw) {
#ifdef __AVX2__
  if (tw == TW) {
    for (int j = 0; j < TW; j += 8) _mm256_storeu_ps(dst + j, _mm256_loadu_ps(src + j));
    return;
  }
#endif
  memcpy(dst, src, sizeof(float) * (size_t)tw);
}

#if defined(I8_VNNI) && defined(INFER_AMX_TILES) && defined(__AMX_INT8__)
#define I8_AMX 1
/* ---- AMX: the int16-activation GEMM on packed tiles (tdpbssd, tdpbusd) ----
 * An int16 code splits exactly into x = 256 hi + lo, hi = x >> 8 (int8) and lo = x & 255 (uint8).
 * Per 32-block, two int8 tile products of up to 16 activation rows (A: 16 rows x 32 bytes, the
 * hi or the lo codes) with the block's codes of 16 weight rows (B: 8 rows x 16 quads, the tile
 * layout of codes k = 4j .. 4j + 3 of each weight row) give exact int32 sums H = sum(hi q)
 * (tdpbssd, s8 x s8) and L = sum(lo q) (tdpbusd, u8 x s8): |H| <= 32 * 128 * 128, |L| <= 32 *
 * 255 * 128, and 256 H + L is the block's integer dot, whose bound the tiles' comment gives. The
 * float steps after it are i8_tile's, in the same order, so every output is the same bits as
 * the register tiles' (and every other path's): which rows share an AMX tile, and whether a row
 * takes one at all, changes nothing. One weight tile (16 columns) at a time: tile 0 holds the hi
 * codes, 1 the lo codes, 2 the block's B, 4-5 and 6-7 two (H, L) pairs that alternate by block.
 * Rows past M in a tile read zero codes and are never stored. */
#ifndef AMX_MIN_M
#define AMX_MIN_M 12 /* q4 weights: from 12 rows (below it the register tiles are faster) */
#endif
#ifndef AMX_MIN_M8
#define AMX_MIN_M8 32 /* q8 weights (the LM head) */
#endif
static __thread scratch tl_planes; /* the hi and lo codes (16-row padded), B tiles and scales */

/* hi, lo [Mp, K] (Mp = M rounded up to 16) <- x16 [M, K] split as above, zero rows past M. */
static void amx_split(const int16_t *x16, int M, int Mp, int K, int8_t *hi, uint8_t *lo) {
  int64_t n = (int64_t)M * K, np = (int64_t)Mp * K, i = 0;
  for (; i < n; i += 32) { /* K is a multiple of 32 */
    __m512i x = _mm512_loadu_si512((const void *)(x16 + i));
    _mm256_storeu_si256((__m256i *)(hi + i), _mm512_cvtepi16_epi8(_mm512_srai_epi16(x, 8)));
    _mm256_storeu_si256((__m256i *)(lo + i), _mm512_cvtepi16_epi8(_mm512_and_si512(x, _mm512_set1_epi16(0xFF))));
  }
  memset(hi + n, 0, (size_t)(np - n));
  memset(lo + n, 0, (size_t)(np - n));
}

/* bt (8 rows x 64 bytes) <- one block of a packed tile (cb) in the B layout: dword r of row j
 * holds codes 4j .. 4j + 3 of weight row r, one byte each (q4: 0..15; q8: the int8 codes). */
static inline void amx_btile(int q4, const uint8_t *cb, uint8_t *bt) {
  for (int j = 0; j < 8; j++) {
    __m512i v;
    if (q4) { /* pair bytes (low nibble k, high k + 1) of groups 2j and 2j + 1 -> 4 bytes */
      __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(cb + (size_t)(2 * j) * TW)));
      __m512i o = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(cb + (size_t)(2 * j + 1) * TW)));
      v = _mm512_or_si512(e, _mm512_slli_epi32(o, 16)); /* nibbles n0 n1 . . n2 n3 . . */
      v = _mm512_and_si512(_mm512_or_si512(v, _mm512_slli_epi32(v, 4)), _mm512_set1_epi32(0x0F0F0F0F));
    } else { /* byte pairs of groups 2j and 2j + 1 */
      __m512i e = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(cb + (size_t)(2 * j) * TW * 2)));
      __m512i o = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(cb + (size_t)(2 * j + 1) * TW * 2)));
      v = _mm512_or_si512(e, _mm512_slli_epi32(o, 16));
    }
    _mm512_store_si512((void *)(bt + 64 * j), v);
  }
}

/* The float steps of block b for the NR rows of one AMX row tile (H and L: their tile sums as
 * stored, 16 int32 a row; dx, sx: the rows' scales for this block), acc[i] the chain of row i. */
static inline __attribute__((always_inline)) void amx_steps(int q4, int NR, const int32_t (*H)[16],
                                                            const int32_t (*L)[16], __m512 vdw,
                                                            __m512 vmw, const float *dx,
                                                            const float *sx, __m512 *acc) {
  _Pragma("GCC unroll 16") for (int i = 0; i < NR; i++) {
    __m512i d = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const void *)H[i]), 8),
                                 _mm512_load_si512((const void *)L[i]));
    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(vdw, _mm512_set1_ps(dx[i])), acc[i]);
    if (q4) acc[i] = _mm512_fmadd_ps(vmw, _mm512_set1_ps(sx[i]), acc[i]);
  }
}

/* Rows [r0, r0 + NR) (NR <= 16, a multiple of 4; rows past the call's own are zero codes with
 * zero scales) against one weight tile, whose blocks' B tiles are bt [nb][512] and scales dh,
 * mh [nb][TW] (float16): out[i] = the TW outputs of row r0 + i. Two C tile pairs (4-5, 6-7)
 * alternate, so that block b's tile products run while block b - 1's float steps do. */
static inline __attribute__((always_inline)) void amx_rows(int q4, int NR, const int8_t *hi,
                                                           const uint8_t *lo, int K, int nb,
                                                           const uint8_t *bt, const uint16_t *dh,
                                                           const uint16_t *mh, const float *ds,
                                                           float (*out)[TW]) {
  int32_t cs[2][2][16][16] __attribute__((aligned(64)));
  __m512 acc[16];
  _Pragma("GCC unroll 16") for (int i = 0; i < NR; i++) acc[i] = _mm512_setzero_ps();
  __m512 vdw = _mm512_setzero_ps(), vmw = _mm512_setzero_ps();
  for (int b = 0; b <= nb; b++) {
    if (b < nb) {
      _tile_loadd(0, hi + (int64_t)b * QK, K);
      _tile_loadd(1, lo + (int64_t)b * QK, K);
      _tile_loadd(2, bt + (size_t)b * 512, 64);
/* H into tile h, L into tile l (the tile numbers are immediates), stored to cs[p] */
#define AMX_HL(h, l, p)                                                                   \
  do {                                                                                    \
    _tile_zero(h);                                                                        \
    _tile_zero(l);                                                                        \
    _tile_dpbssd(h, 0, 2);                                                                \
    _tile_dpbusd(l, 1, 2);                                                                \
    _tile_stored(h, cs[p][0], 64);                                                        \
    _tile_stored(l, cs[p][1], 64);                                                        \
  } while (0)
      if (b & 1)
        AMX_HL(6, 7, 1);
      else
        AMX_HL(4, 5, 0);
#undef AMX_HL
    }
    if (b > 0) { /* block b - 1's float steps */
      int p = (b - 1) & 1;
      amx_steps(q4, NR, (const int32_t(*)[16])cs[p][0], (const int32_t(*)[16])cs[p][1], vdw, vmw,
                ds + (size_t)(b - 1) * 32, ds + (size_t)(b - 1) * 32 + 16, acc);
    }
    if (b < nb) {
      vdw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dh + (size_t)b * TW)));
      if (q4) vmw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mh + (size_t)b * TW)));
    }
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < NR; i++) _mm512_store_ps(out[i], acc[i]);
}

#define AMXR(q, nr) \
  case (nr) / 4 * 2 + (q): amx_rows(q, nr, hi, lo, K, nb, bt, dh, mh, ds, out); break;
static void amx_rows_any(int q4, int nr, const int8_t *hi, const uint8_t *lo, int K, int nb,
                         const uint8_t *bt, const uint16_t *dh, const uint16_t *mh,
                         const float *ds, float (*out)[TW]) {
  switch ((nr + 3) / 4 * 2 + q4) {
    AMXR(1, 4) AMXR(0, 4) AMXR(1, 8) AMXR(0, 8) AMXR(1, 12) AMXR(0, 12) AMXR(1, 16) AMXR(0, 16)
  }
}
#undef AMXR

/* Columns [n0, n1) (n0 on a tile) of the product of a's M int16-coded rows (x16) with packed
 * tiles, into y (before the bias): per weight tile, its blocks' B tiles made once (nb x 512
 * bytes, in L1), then each row tile's chains in registers over the blocks. */
static void amx_i16_gemm(int q4, const i8_act *a, const int16_t *x16, int M, const uint8_t *tiles,
                         int n0, int n1, float *y, int64_t y_stride) {
  int nb = a->nb, K = a->K, Mp = (M + 15) & ~15;
  size_t ptb = packed_tile_bytes(nb, q4), pb = packed_block(q4);
  size_t planes = 2 * (size_t)Mp * K, bts = (size_t)nb * 512, dss = (size_t)nb * 32 * sizeof(float);
  int8_t *hi = (int8_t *)scratch_get(&tl_planes, planes + bts + dss * (Mp / 16));
  uint8_t *lo = (uint8_t *)hi + (size_t)Mp * K, *bt = (uint8_t *)hi + planes;
  float *ds = (float *)(bt + bts); /* per row tile, per block: 16 dx then 16 sx (zeros past M) */
  amx_split(x16, M, Mp, K, hi, lo);
  for (int r0 = 0; r0 < Mp; r0 += 16)
    for (int b = 0; b < nb; b++) {
      float *d = ds + (size_t)(r0 / 16) * nb * 32 + (size_t)b * 32;
      for (int i = 0; i < 16; i++) {
        int m = r0 + i;
        d[i] = m < M ? a->d[(int64_t)m * nb + b] : 0.f;
        d[16 + i] = m < M ? a->s[(int64_t)m * nb + b] : 0.f;
      }
    }
  static const uint8_t rows[8] = {16, 16, 8, 0, 16, 16, 16, 16};
  static const uint16_t colsb[8] = {32, 32, 64, 0, 64, 64, 64, 64};
  amx_configure(rows, colsb);
  float out[16][TW] __attribute__((aligned(64)));
  for (int c = n0; c < n1; c += TW) {
    int tw = n1 - c < TW ? n1 - c : TW;
    const uint8_t *t = tiles + (size_t)(c / TW) * ptb;
    const uint16_t *dh = (const uint16_t *)(t + (size_t)nb * pb), *mh = dh + (size_t)nb * TW;
    for (int b = 0; b < nb; b++) {
      /* the next tile, a slice per block, from memory while this one computes (the default model's
       * 32-row decode steps, cpu_q4_graph_ab.py: 1.03x the whole next tile at once, 1.04x none) */
      if (c + TW < n1)
        for (size_t off = ptb * b / nb; off < ptb * (b + 1) / nb; off += 64)
          _mm_prefetch((const char *)t + ptb + off, _MM_HINT_T0);
      amx_btile(q4, t + (size_t)b * pb, bt + (size_t)b * 512);
    }
    for (int r0 = 0; r0 < M; r0 += 16) {
      int nr = M - r0 < 16 ? M - r0 : 16;
      amx_rows_any(q4, nr, hi + (int64_t)r0 * K, lo + (int64_t)r0 * K, K, nb, bt, dh, mh,
                   ds + (size_t)(r0 / 16) * nb * 32, out);
      for (int i = 0; i < nr; i++) tile_row_out(y + (int64_t)(r0 + i) * y_stride + c, out[i], tw);
    }
  }
  _tile_release();
}
#endif

/* 4: the int16-activation GEMM on AMX tiles (from AMX_MIN_M rows), AVX-512 VNNI below; 3: AVX-512
 * VNNI; 2: AVX2; 0: portable C. */
int infer_kernels_isa(void) {
#if defined(I8_AMX)
  return amx_on() ? 4 : 3;
#elif defined(I8_VNNI)
  return 3;
#elif defined(__AVX2__)
  return 2;
#else
  return 0;
#endif
}

/* Output columns [n0, n1) of the integer-activation product for all rows of a (see above). */
static void i8_gemm(int kind, const i8_act *a, int M, const void *w, const uint8_t *tiles,
                    const float *bias, int n0, int n1, float *y, int64_t y_stride) {
  int nb = a->nb, K = a->K;
#ifdef __AVX2__
  /* up to in_place activation rows without packed tiles: int_rows instead of the per-call
   * repack (measured: faster at 2-4 rows, about even at 5-6 with int16 codes, slower at 5-6 than
   * int8's quad tiles); with packed tiles, those from TILES_MIN_M rows on */
  int q4 = kind == 4, quads = 0, in_place = 4;
#ifdef I8_VNNI
  quads = a->q16 == NULL && M > in_place; /* int8 tiles: vpdpbusd on the codes as they are */
#endif
  const int16_t *x16 = a->q16;
  if (!x16 && !quads) { /* int8 codes widened to int16 (exact) */
    int16_t *t = (int16_t *)scratch_get(&tl_x16, sizeof(int16_t) * (size_t)M * K);
    for (int64_t i = 0; i < (int64_t)M * K; i++) t[i] = a->q[i];
    x16 = t;
  }
  if (tiles && (M < TILES_MIN_M || quads || n0 % TW)) tiles = NULL;
  int amx = 0; /* int16 codes on tiles packed at load, enough rows, the kernel's leave */
#ifdef I8_AMX
  amx = tiles && a->q16 && M >= (q4 ? AMX_MIN_M : AMX_MIN_M8) && amx_on();
#endif
  if (amx) {
#ifdef I8_AMX
    amx_i16_gemm(q4, a, x16, M, tiles, n0, n1, y, y_stride);
#endif
  } else if (M <= in_place && !tiles) { /* the blocks read in place, two activation rows at a time */
    for (int m = 0; m < M; m += 2) int_rows(kind, w, a, x16, m, M - m < 2 ? M - m : 2, n0, n1, y, y_stride);
  } else { /* weight tiles packed at load (tiles), or repacked here per call into buf */
    uint8_t *buf = tiles ? NULL : (uint8_t *)scratch_get(&tl_w, (size_t)nb * (tile_block(quads) + 2 * TW * sizeof(float)));
    float out[IMR * TW];
    for (int mb = 0; mb < M; mb += IMB) {
      int me = M - mb < IMB ? M : mb + IMB;
      for (int c = n0; c < n1; c += TW) {
        int tw = n1 - c < TW ? n1 - c : TW;
#if defined(I8_VNNI) && IMR2 <= 6
        /* two whole packed tiles side by side, for 16 rows or more (cpu_q4_graph_ab.py on Zen 5,
         * int16 activations, against one tile of up to 8 rows: 1.03x a 32-row decode step,
         * 1.10-1.13x the prefill and mixed steps with the packed tiles above; at 8 rows 0.90x,
         * so those keep the 8-row tiles; 4-row tiles of two: 0.96x at 32 rows) */
        if (tiles && c + 2 * TW <= n1 && me - mb >= 16) {
          const uint8_t *t0 = tiles + (size_t)(c / TW) * packed_tile_bytes(nb, q4), *t1 = t0 + packed_tile_bytes(nb, q4);
          const char *next = c + 2 * TW < n1 ? (const char *)(t1 + packed_tile_bytes(nb, q4)) : NULL;
          float out1[IMR2 * TW];
          int rows = me - mb, nt = (rows + IMR2 - 1) / IMR2;
          for (int t = 0, m0 = mb; t < nt; t++) {
            int mr = rows / nt + (t < rows % nt);
            i8_tile2_any(q4, t0, t1, t == 0 ? next : NULL, a, x16, m0, mr, out, out1);
            for (int m = 0; m < mr; m++) {
              tile_row_out(y + (int64_t)(m0 + m) * y_stride + c, out + m * TW, TW);
              tile_row_out(y + (int64_t)(m0 + m) * y_stride + c + TW, out1 + m * TW, TW);
            }
            m0 += mr;
          }
          c += TW; /* and the loop's TW */
          continue;
        }
#endif
        const uint8_t *tb = buf, *next = NULL;
        if (tiles) { /* the packed tile, and the next one to prefetch */
          tb = tiles + (size_t)(c / TW) * packed_tile_bytes(nb, q4);
          if (c + TW < n1) next = tb + packed_tile_bytes(nb, q4);
        } else {
          i8_repack(kind, w, nb, c, tw, quads, buf);
        }
        /* the block's rows in nt register tiles of sizes differing by at most one (8 rows: 4 + 4,
         * not 6 + 2): which rows share a tile does not change any row's arithmetic */
        int rows = me - mb, nt = (rows + IMR - 1) / IMR;
        for (int t = 0, m0 = mb; t < nt; t++) {
          int mr = rows / nt + (t < rows % nt);
          /* the first register tile prefetches the next packed tile */
          i8_tile_any(q4, quads, tiles != NULL, tb, t == 0 ? (const char *)next : NULL, a, x16, m0, mr, out);
          for (int m = 0; m < mr; m++) tile_row_out(y + (int64_t)(m0 + m) * y_stride + c, out + m * TW, tw);
          m0 += mr;
        }
      }
    }
  }
#else
  (void)nb;
  (void)K;
  (void)tiles;
  for (int m = 0; m < M; m++)
    for (int n = n0; n < n1; n++) y[(int64_t)m * y_stride + n] = int_dot_ref(kind, w, n, a, m);
#endif
  if (bias)
    for (int m = 0; m < M; m++)
      for (int n = n0; n < n1; n++) y[(int64_t)m * y_stride + n] += bias[n];
}

/* fgemm_rows' integer-activation path: this thread quantizes all M rows itself (no barrier; the
 * decode graph's batches are small) into its own scratch. */
static void i8_rows(int kind, int wide, const float *x, int64_t x_stride, int M, int K,
                    const void *w, const uint8_t *tiles, const float *bias, int n0, int n1,
                    float *y, int64_t y_stride) {
  if (n0 >= n1) return;
  i8_act a = i8_layout(M, K, wide, (char *)scratch_get(&tl_act, i8_act_bytes(M, K, wide)));
  for (int m = 0; m < M; m++) i8_quantize_row(x + (int64_t)m * x_stride, &a, m);
  i8_gemm(kind, &a, M, w, tiles, bias, n0, n1, y, y_stride);
}

/* Bytes of w [N, K] (kind 4 / 8 blocks, | KIND_I8 / KIND_I16) packed into tiles for the
 * integer-activation GEMM (see packed_block), or 0 when this build's GEMM does not read packed
 * tiles for that kind (no AVX2 or no F16C; int8 activations on AVX-512 VNNI, whose quad tiles
 * read other layouts; float32 activations). */
size_t infer_tiles_bytes(int kind, int N, int K) {
#if defined(__AVX2__) && defined(__F16C__) /* F16C: the tiles' float16 scales */
  if (!(kind & KIND_INT) || K % QK) return 0;
#ifdef I8_VNNI
  if (!(kind & KIND_I16)) return 0;
#endif
  return (size_t)((N + TW - 1) / TW) * packed_tile_bytes(K / QK, (kind & ~KIND_INT) == 4);
#else
  (void)kind;
  (void)N;
  (void)K;
  return 0;
#endif
}

/* out (infer_tiles_bytes(kind, N, K) bytes) <- w [N, K] packed into tiles (see packed_block). */
void infer_pack_tiles(int kind, const void *w, int N, int K, uint8_t *out) {
#if defined(__AVX2__) && defined(__F16C__)
  int nb = K / QK, tiles = (N + TW - 1) / TW;
  kind &= ~KIND_INT;
  int q4 = kind == 4;
#pragma omp parallel for num_threads(g_threads) schedule(static)
  for (int t = 0; t < tiles; t++) {
    uint8_t *tile = out + (size_t)t * packed_tile_bytes(nb, q4);
    uint16_t *dh = (uint16_t *)(tile + (size_t)nb * packed_block(q4)), *mh = dh + (size_t)nb * TW;
    for (int b = 0; b < nb; b++) {
      uint8_t *cb = tile + (size_t)b * packed_block(q4);
      for (int r = 0; r < TW; r++) {
        int n = t * TW + r;
        uint8_t c[QK] = {0}; /* the block's codes in k order (rows past N: zero) */
        int64_t i = (int64_t)n * nb + b;
        if (n < N) _mm256_storeu_si256((__m256i *)c, block_codes(kind, w, i, 0));
        for (int g = 0; g < 16; g++) {
          if (q4) { /* 4-bit codes: two a byte */
            cb[(size_t)g * TW + r] = (uint8_t)(c[2 * g] | c[2 * g + 1] << 4);
            continue;
          }
          cb[(size_t)g * TW * 2 + 2 * r] = c[2 * g];
          cb[(size_t)g * TW * 2 + 2 * r + 1] = c[2 * g + 1];
        }
        dh[(size_t)b * TW + r] = n < N ? block_dh(kind, w, i) : 0;
        if (q4) mh[(size_t)b * TW + r] = n < N ? block_mh(kind, w, i) : 0;
      }
    }
  }
#else
  (void)kind;
  (void)w;
  (void)N;
  (void)K;
  (void)out;
#endif
}

/* ---- GEMMs on the work pool (infer_cpu_pool.h) ----
 * y [M, N] = in [M, K] . W^T (+ bias): the integer-activation kinds quantize the rows once (a
 * rows job from POOL_ROWS_JOB rows, else the caller), then the units take columns in pairs of
 * 16-column tiles, POOL_UNITS units a thread. Any thread computes a unit with the same
 * functions, so the result does not depend on who took which. One unit a thread (the pool's
 * core swap moves a preempted holder rather than a second unit to steal): against two, the
 * default model's decode steps 1.06x at 1 row, 1.09x at 8, 1.05x at 32, prefill 1.02-1.04x
 * (cpu_q4_graph_ab.py, Zen 5); serving it at 8 and 32 clients 1.02-1.11x in every pair. */
#ifndef POOL_UNITS
#define POOL_UNITS 1
#endif
#ifndef POOL_ROWS_JOB
#define POOL_ROWS_JOB 64
#endif
typedef struct {
  int kind, M, K, N, per;
  const float *in, *bias;
  int64_t in_s, ys;
  const void *w;
  const uint8_t *tiles;
  float *y;
  i8_act a; /* in's rows as integer codes (the integer-activation kinds) */
  /* the decode graph's down projection on one rank: also h = res + y in the unit's columns */
  float *h;
  const float *res;
  int hidden;
} gemm_job;
static __thread scratch tl_wf; /* fgemm_rows' dequantized weight rows */

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

static void gemm_quant_unit(void *p, int u, int w) { /* rows [8 u, 8 u + 8) */
  gemm_job *g = (gemm_job *)p;
  (void)w;
  for (int m = 8 * u; m < g->M && m < 8 * u + 8; m++) i8_quantize_row(g->in + m * g->in_s, &g->a, m);
}

static void gemm_col_unit(void *p, int u, int w) { /* columns [u per, (u + 1) per) */
  gemm_job *g = (gemm_job *)p;
  int n0 = u * g->per, n1 = n0 + g->per < g->N ? n0 + g->per : g->N;
  (void)w;
  if (n0 >= n1) return;
  if (g->kind & KIND_INT)
    i8_gemm(g->kind & ~KIND_INT, &g->a, g->M, g->w, g->tiles, g->bias, n0, n1, g->y, g->ys);
  else
    fgemm_rows(g->kind, g->in, g->in_s, g->M, g->K, g->w, NULL, g->bias, n0, n1, g->y, g->ys,
               (float *)scratch_get(&tl_wf, sizeof(float) * FR * (size_t)g->K));
  if (g->h != NULL)
    for (int m = 0; m < g->M; m++)
      for (int c = n0; c < n1; c++)
        g->h[(int64_t)m * g->hidden + c] = g->res[(int64_t)m * g->hidden + c] + g->y[(int64_t)m * g->ys + c];
}

/* Run g on nt threads; codes: i8_act_bytes(M, K, 1) bytes, 64-byte aligned (integer kinds). */
static void gemm_run(gemm_job *g, char *codes, int nt) {
  if (g->kind & KIND_INT) {
    g->a = i8_layout(g->M, g->K, (g->kind & KIND_I16) != 0, codes);
    if (g->M >= POOL_ROWS_JOB)
      pool_run(gemm_quant_unit, g, ceil_div(g->M, 8), nt);
    else
      for (int m = 0; m < g->M; m++) i8_quantize_row(g->in + m * g->in_s, &g->a, m);
  }
  int per = ceil_div(ceil_div(g->N, 16), POOL_UNITS * nt);
  per += per & 1; /* whole pairs: the two-tile kernel */
  g->per = 16 * per;
  pool_run(gemm_col_unit, g, ceil_div(g->N, g->per), nt);
}

/* y [M, N] (row stride y_stride) = x [M, K] (row stride x_stride) . W^T (+ bias): kind 4 =
 * block_q4 weights, kind 8 = block_q8, both [N, K/32] blocks; | KIND_I8: int8 activations,
 * | KIND_I16: int16 activations. Batch invariant in every case (see above). On the work pool. */
void infer_fgemm_tiles(int kind, const float *x, int64_t x_stride, int M, int K, const void *w,
                       const uint8_t *tiles, const float *bias, int N, float *y, int64_t y_stride) {
  char *codes = NULL;
  if (kind & KIND_INT)
    codes = (char *)aligned_alloc(64, (i8_act_bytes(M, K, (kind & KIND_I16) != 0) + 63) & ~(size_t)63);
  gemm_job g = {.kind = kind, .M = M, .K = K, .N = N, .in = x, .bias = bias, .in_s = x_stride,
                .ys = y_stride, .w = w, .tiles = (kind & KIND_INT) ? tiles : NULL, .y = y};
  gemm_run(&g, codes, g_threads);
  free(codes);
}

/* infer_fgemm_tiles without packed tiles. */
void infer_fgemm(int kind, const float *x, int64_t x_stride, int M, int K, const void *w,
                 const float *bias, int N, float *y, int64_t y_stride) {
  infer_fgemm_tiles(kind, x, x_stride, M, K, w, NULL, bias, N, y, y_stride);
}

/* o = w * src / sqrt(mean(src^2) + eps) for one row. */
static void rms_row(const float *src, const float *w, float *o, int dim, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int j = 0; j < dim; j++) ss += src[j] * src[j];
  float inv = 1.f / sqrtf(ss / (float)dim + eps);
  for (int j = 0; j < dim; j++) o[j] = w[j] * (src[j] * inv);
}

/* sum = x + residual, o = rms_row(sum): the fused residual add of a pre-norm block. */
static void add_rms_row(const float *x, const float *residual, const float *w, float *sum,
                        float *o, int dim, float eps) {
  for (int j = 0; j < dim; j++) sum[j] = x[j] + residual[j];
  rms_row(sum, w, o, dim, eps);
}

/* out = w * x / sqrt(mean(x^2) + eps) per row; with residual != NULL first x += residual and the
 * sum is written to res_out (the fused residual add of a pre-norm block). */
typedef struct {
  const float *x, *residual, *w;
  int64_t x_stride, r_stride;
  float *res_out, *out;
  int rows, dim;
  float eps;
} norm_job;

static void norm_unit(void *p, int u, int worker) { /* rows [8 u, 8 u + 8) */
  const norm_job *j = (const norm_job *)p;
  (void)worker;
  for (int r = 8 * u; r < j->rows && r < 8 * u + 8; r++) {
    const float *xr = j->x + (int64_t)r * j->x_stride;
    if (j->residual)
      add_rms_row(xr, j->residual + (int64_t)r * j->r_stride, j->w, j->res_out + (int64_t)r * j->dim,
                  j->out + (int64_t)r * j->dim, j->dim, j->eps);
    else
      rms_row(xr, j->w, j->out + (int64_t)r * j->dim, j->dim, j->eps);
  }
}

void infer_rms_norm(const float *x, int64_t x_stride, const float *residual, int64_t r_stride,
                    float *res_out, const float *w, float *out, int rows, int dim, float eps) {
  norm_job j = {x, residual, w, x_stride, r_stride, res_out, out, rows, dim, eps};
  pool_run(norm_unit, &j, ceil_div(rows, 8), rows >= 16 ? g_threads : 1);
}

/* In-place rotate-half rotary embedding of q [T, H, D] and k [T, Hkv, D] (row strides q_stride,
 * k_stride; heads contiguous) over the first R dims, cos/sin table rows [R/2 cos | R/2 sin]. */
void infer_rope(const int64_t *pos, float *q, int64_t q_stride, int H, float *k, int64_t k_stride,
                int Hkv, int T, int D, int R, const float *cos_sin) {
  int half = R / 2;
  for (int t = 0; t < T; t++) {
    const float *c = cos_sin + pos[t] * R, *s = c + half;
    for (int h = 0; h < H + Hkv; h++) {
      float *x = h < H ? q + t * q_stride + (int64_t)h * D : k + t * k_stride + (int64_t)(h - H) * D;
      for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

/* The index of row s[0 .. n)'s greatest value as torch.argmax gives it: the first NaN when the
 * row has one (torch orders NaN above every number), else the first element equal to the
 * maximum (-0 and +0 are equal). Two passes: the maximum with a NaN flag (vector lanes, then the
 * tail), then the first lane equal to it. */
static int argmax_row(const float *s, int n) {
  int j = 0, nan = 0;
  float mx = -INFINITY;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(-INFINITY);
  __mmask16 un = 0;
  for (; j + 16 <= n; j += 16) {
    __m512 v = _mm512_loadu_ps(s + j);
    un |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(v, m); /* a NaN lane keeps m */
  }
  mx = _mm512_reduce_max_ps(m);
  nan = un != 0;
#elif defined(__AVX2__)
  __m256 m = _mm256_set1_ps(-INFINITY), un = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(s + j);
    un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(v, m);
  }
  mx = vm_hmax8(m);
  nan = _mm256_movemask_ps(un) != 0;
#endif
  for (; j < n; j++) {
    if (s[j] != s[j])
      nan = 1;
    else if (s[j] > mx)
      mx = s[j];
  }
  if (nan) {
    for (j = 0; j < n; j++)
      if (s[j] != s[j]) return j;
  }
  j = 0;
#if defined(__AVX512F__)
  __m512 vm = _mm512_set1_ps(mx);
  for (; j + 16 <= n; j += 16) {
    __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(s + j), vm, _CMP_EQ_OQ);
    if (k) return j + __builtin_ctz(k);
  }
#elif defined(__AVX2__)
  __m256 vm = _mm256_set1_ps(mx);
  for (; j + 8 <= n; j += 8) {
    int k = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + j), vm, _CMP_EQ_OQ));
    if (k) return j + __builtin_ctz(k);
  }
#endif
  for (; j < n; j++)
    if (s[j] == mx) return j;
  return 0; /* not reached: some element equals the maximum */
}

/* out[r] = argmax of row r of x [rows, n] (row stride x_stride), n >= 1: greedy sampling's ids.
 * One thread: 32 rows of a 49,152-word vocabulary are a fraction of a millisecond, read from the
 * cache the LM head just wrote them to, where torch's argmax took 3.8 ms. */
void infer_argmax_rows(const float *x, int64_t x_stride, int rows, int n, int64_t *out) {
  for (int r = 0; r < rows; r++) out[r] = argmax_row(x + (int64_t)r * x_stride, n);
}

/* The embedding lookup of the native graphs: out [T, dim] float32 = rows ids[t] of table (row
 * stride `stride`, `rows` rows) of float32 (kind 0), bf16 (1) or fp16 (2) values, widened
 * exactly. One thread: 512 tokens are a fraction of a millisecond, where torch's lookup and
 * float() open OpenMP regions that wait for a thread another process holds (16 ms for 128 tokens
 * on a busy 2-core machine). Returns -1, or the first t whose id is outside [0, rows) (nothing is
 * written then). */
int64_t infer_embed_rows(const void *table, int kind, int64_t stride, int64_t rows,
                         const int64_t *ids, int T, int dim, float *out) {
  for (int t = 0; t < T; t++)
    if (ids[t] < 0 || ids[t] >= rows) return t;
  for (int t = 0; t < T; t++) {
    float *o = out + (int64_t)t * dim;
    if (kind == 0) {
      memcpy(o, (const float *)table + ids[t] * stride, sizeof(float) * (size_t)dim);
      continue;
    }
    const uint16_t *r = (const uint16_t *)table + ids[t] * stride;
    if (kind == 1)
      for (int i = 0; i < dim; i++) o[i] = bf16_to_f32(r[i]);
    else
      for (int i = 0; i < dim; i++) o[i] = f16_to_f32(r[i]);
  }
  return -1;
}

/* out [T, I] = silu(x[:, :I]) * x[:, I:], x rows of stride x_stride. */
void infer_silu_mul(const float *x, int64_t x_stride, float *out, int T, int I) {
  for (int t = 0; t < T; t++) silu_mul_row(x + t * x_stride, out + (int64_t)t * I, I);
}

/* s[j] <- exp(s[j] - mx) for j < n; returns the sum (infer_cpu_vmath.h's exp). */
static float exp_minus_max(float *s, int n, float mx) { return vm_exp_sub(s, n, 1.f, mx); }

/* KV caches hold float32 (kv16 0), bf16 (1) or fp16 (2): 16-bit values are rounded to nearest
 * even on write, as torch's float -> bfloat16 / float16 conversions, and read back exactly as
 * that float. */
static inline float kv_at(const void *base, int64_t i, int kv16) {
  return kv16 == 1 ? bf16_to_f32(((const uint16_t *)base)[i])
       : kv16 == 2 ? f16_to_f32(((const uint16_t *)base)[i])
                   : ((const float *)base)[i];
}

/* One (sequence, query head) of decode attention: out[bh] = softmax(q k^T * scale) v over the
 * sequence's pages. The portable path (no AVX2, or D not a multiple of 32). */
static void attend_one(int bh, const float *q, int64_t q_stride, const void *k_cache,
                       const void *v_cache, int kv16, const int32_t *block_tables, int64_t bt_stride,
                       const int32_t *seq_lens, float *out, int H, int Hkv, int D, int page,
                       float scale) {
  int64_t row = (int64_t)Hkv * D;
  int group = H / Hkv;
  int b = bh / H, h = bh % H, g = h / group, L = seq_lens[b];
  const float *qv = q + b * q_stride + (int64_t)h * D;
  const int32_t *bt = block_tables + b * bt_stride;
  float sbuf[2048];
  float *scores = L <= 2048 ? sbuf : (float *)malloc(sizeof(float) * (size_t)L);
  float mx = -INFINITY;
  for (int j = 0; j < L; j++) {
    int64_t kj = ((int64_t)bt[j / page] * page + j % page) * row + (int64_t)g * D;
    float sdot = 0.f;
#pragma omp simd reduction(+ : sdot)
    for (int i = 0; i < D; i++) sdot += qv[i] * kv_at(k_cache, kj + i, kv16);
    scores[j] = sdot * scale;
    mx = scores[j] > mx ? scores[j] : mx;
  }
  float inv = 1.f / exp_minus_max(scores, L, mx);
  float *o = out + (int64_t)bh * D;
  for (int i = 0; i < D; i++) o[i] = 0.f;
  for (int j = 0; j < L; j++) {
    int64_t vj = ((int64_t)bt[j / page] * page + j % page) * row + (int64_t)g * D;
    float p = scores[j] * inv;
#pragma omp simd
    for (int i = 0; i < D; i++) o[i] += p * kv_at(v_cache, vj + i, kv16);
  }
  if (scores != sbuf) free(scores);
}

typedef struct {
  const float *q;
  int64_t q_stride;
  const void *k_cache, *v_cache; /* float32, bf16 (kv16 1) or fp16 (kv16 2) */
  int kv16;
  const int32_t *block_tables;
  int64_t bt_stride;
  const int32_t *seq_lens;
  float *out;
  int B, H, Hkv, D, page;
  float scale;
} decode_attn;

#ifdef INFER_ATTN_TILES
/* KV heads [g0, g1) of sequence b: attn_kv_groups over its pages. off: L row offsets; s, acc,
 * inv: scratch of nq * L, nq * D and nq floats (nq = (g1 - g0) * H / Hkv). */
static void attend_seq(const decode_attn *a, int b, int g0, int g1, int64_t *off, float *s,
                       float *acc, float *inv) {
  int group = a->H / a->Hkv, L = a->seq_lens[b];
  attn_row_offsets(a->block_tables + b * a->bt_stride, a->page, (int64_t)a->Hkv * a->D, L, off);
  attn_kv_groups(a->q + b * a->q_stride + (int64_t)g0 * group * a->D, g0, g1, group, a->k_cache,
                 a->v_cache, a->kv16, off, L, a->D, a->scale, s, acc, inv,
                 a->out + ((int64_t)b * a->H + (int64_t)g0 * group) * a->D);
}
#endif

/* The (sequence, KV head) units [u0, u1) of B * Hkv: the query heads of one KV head share its
 * keys and values, which are read once for all of them (in register tiles of up to 3 heads);
 * consecutive units of one sequence are done together (attend_seq). */
static void attend_units(const decode_attn *a, int u0, int u1) {
  int group = a->H / a->Hkv;
#ifdef INFER_ATTN_TILES
  if (a->D % 32 == 0 && u0 < u1) {
    /* one scratch per call: the row offsets, then the scores, sums and inverse exp sums */
    _Alignas(32) char sbuf[56 * 1024];
    char *buf = sbuf;
    size_t cap = sizeof sbuf;
    for (int b = u0 / a->Hkv; b <= (u1 - 1) / a->Hkv; b++) {
      int g0 = u0 > b * a->Hkv ? u0 - b * a->Hkv : 0;
      int g1 = u1 < (b + 1) * a->Hkv ? u1 - b * a->Hkv : a->Hkv;
      int64_t L = a->seq_lens[b], nq = (int64_t)(g1 - g0) * group;
      size_t need = sizeof(int64_t) * (size_t)L + sizeof(float) * (size_t)(nq * (L + a->D + 1));
      if (need > cap) {
        if (buf != sbuf) free(buf);
        buf = (char *)malloc(need);
        cap = need;
      }
      int64_t *off = (int64_t *)buf;
      float *s = (float *)(off + L), *acc = s + nq * L, *inv = acc + nq * a->D;
      attend_seq(a, b, g0, g1, off, s, acc, inv);
    }
    if (buf != sbuf) free(buf);
    return;
  }
#endif
  for (int u = u0; u < u1; u++)
    for (int h = 0; h < group; h++)
      attend_one((u / a->Hkv) * a->H + (u % a->Hkv) * group + h, a->q, a->q_stride, a->k_cache,
                 a->v_cache, a->kv16, a->block_tables, a->bt_stride, a->seq_lens, a->out, a->H,
                 a->Hkv, a->D, a->page, a->scale);
}

/* The first unit of thread tid's share of the B * Hkv (sequence, KV head) units: units in order,
 * split where the keys read so far pass tid / nt of all of them (a unit reads its sequence's
 * length; the rows of a prefill see 1, 2, ... keys, so a split by count would leave the last
 * thread most of the work). */
static int attend_split(const decode_attn *a, int tid, int nt) {
  int U = a->B * a->Hkv;
  if (tid == 0) return 0;
  if (tid == nt) return U;
  int64_t total = 0, seen = 0;
  for (int b = 0; b < a->B; b++) total += (int64_t)a->Hkv * (a->seq_lens[b] + 1);
  int64_t goal = total * tid / nt;
  int u = 0;
  for (; u < U; u++) {
    int64_t cost = a->seq_lens[u / a->Hkv] + 1; /* the keys unit u reads (+1: no unit is free) */
    if (seen + cost > goal) break;
    seen += cost;
  }
  return u;
}

/* Chunk u of the attention units split in `units` chunks: contiguous (a chunk reads whole cache
 * rows of its sequences), balanced by keys read. */
typedef struct {
  const decode_attn *a;
  int units;
} attn_job;

static void attn_chunk_unit(void *p, int u, int worker) {
  const attn_job *j = (const attn_job *)p;
  (void)worker;
  attend_units(j->a, attend_split(j->a, u, j->units), attend_split(j->a, u + 1, j->units));
}

/* Every attention unit of a, in POOL_UNITS chunks a thread (at most one a unit), on the pool. */
static void attend_pool(const decode_attn *a, int nt) {
  int all = a->B * a->Hkv;
  attn_job j = {a, all < POOL_UNITS * nt ? all : POOL_UNITS * nt};
  pool_run(attn_chunk_unit, &j, j.units, nt);
}

/* The new tokens' k/v rows (row stride k_stride / v_stride, row floats each) into the caches at
 * slots[b]: copied, or rounded to bf16 (kv16 1) or fp16 (kv16 2). */
static void write_kv(const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                     void *k_cache, void *v_cache, int kv16, const int64_t *slots, int B, int64_t row) {
  for (int b = 0; b < B; b++) {
    if (kv16) {
      uint16_t *kc = (uint16_t *)k_cache + slots[b] * row, *vc = (uint16_t *)v_cache + slots[b] * row;
      const float *kr = k + b * k_stride, *vr = v + b * v_stride;
      if (kv16 == 2)
        for (int64_t i = 0; i < row; i++) {
          kc[i] = f32_to_f16(kr[i]);
          vc[i] = f32_to_f16(vr[i]);
        }
      else
        for (int64_t i = 0; i < row; i++) {
          kc[i] = f32_to_bf16(kr[i]);
          vc[i] = f32_to_bf16(vr[i]);
        }
    } else {
      memcpy((float *)k_cache + slots[b] * row, k + b * k_stride, sizeof(float) * (size_t)row);
      memcpy((float *)v_cache + slots[b] * row, v + b * v_stride, sizeof(float) * (size_t)row);
    }
  }
}

/* Decode attention over a paged float32 (or, kv16 1 / 2, bf16 / fp16) cache, one query per sequence, after
 * writing the new k/v.
 *   q [B, H, D] (row stride q_stride), k/v new [B, Hkv, D] (row strides k_stride, v_stride),
 *   caches [pages, page, Hkv, D], slots [B] (where the new k/v go), block_tables [B, bt_stride]
 *   int32, seq_lens [B] int32 (including the new token), out [B, H, D] contiguous. */
void infer_paged_decode(const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                        const float *v, int64_t v_stride, void *k_cache, void *v_cache,
                        const int64_t *slots, const int32_t *block_tables, int64_t bt_stride,
                        const int32_t *seq_lens, float *out, int B, int H, int Hkv, int D, int page,
                        float scale, int kv16) {
  write_kv(k, k_stride, v, v_stride, k_cache, v_cache, kv16, slots, B, (int64_t)Hkv * D);
  decode_attn a = {q, q_stride, k_cache, v_cache, kv16, block_tables, bt_stride, seq_lens, out,
                   B, H, Hkv, D, page, scale};
  attend_pool(&a, g_threads);
}

/* ---- A whole decode step of a Llama-family decoder stack in one call (the CPU graph runner) ----
 * Per layer, on h [B, hidden] in place:
 *   x = rms_norm(h) ; qkv = x Wqkv^T (+ b) ; rotary(q, k) ; write k, v ; a = attn(q) ;
 *   h = h + a Wo^T ; x = rms_norm(h) ; gu = x Wgu^T ; h = h + (silu(g) * u) Wdown^T
 * with the same kernels the per-op path calls, so both paths give the same numbers. */
typedef struct {
  const float *in_norm, *post_norm; /* [hidden] */
  const void *wqkv, *wo, *wgu, *wdown; /* blocks of the four projections */
  const float *bqkv;                  /* [(H + 2 Hkv) D] or NULL */
  int kind_qkv, kind_o, kind_gu, kind_down;
  void *k_cache, *v_cache; /* [pages, page, Hkv, D], float32 or (kv16 1 / 2) bf16 / fp16 */
  const uint8_t *tqkv, *to, *tgu, *tdown; /* the projections' packed tiles, or NULL */
} infer_layer;

/* Sums x [n] across the tensor-parallel ranks in place; non-zero when it cannot (a peer died). */
typedef int (*infer_all_reduce_fn)(void *state, float *x, int64_t n);

/* One call of infer_decode_layers on the work pool (infer_cpu_pool.h): the calling thread runs
 * each layer as pool jobs (the projections' columns, the attention's units, and from
 * POOL_ROWS_JOB rows the row-wise steps), and the small serial steps between them (rotary, the
 * KV write, the all-reduce, and the row-wise steps of smaller batches). A unit is computed by the
 * same functions as the per-op path, whichever thread takes it, so both paths agree exactly. */
typedef struct {
  int B, hidden, inter;
  float eps;
  float *h, *x, *res, *gu, *act;
  const float *y; /* the last GEMM's output (graph_resid_unit reads the down projection's) */
} graph_job;

/* fn over the B rows in units of 8: on the pool from `from` rows, else by the caller. */
static void graph_rows(graph_job *j, pool_fn fn, int from, int nt) {
  pool_run(fn, j, ceil_div(j->B, 8), j->B >= from ? nt : 1);
}

/* x = rms_norm(h) (in_norm) or res = o + h, x = rms_norm(res) (post_norm: o given) of the B rows:
 * infer_rms_norm's units, on the pool from POOL_ROWS_JOB rows. */
static void graph_norm(graph_job *j, const float *w, const float *o, int nt) {
  norm_job n = {o ? o : j->h, o ? j->h : NULL, w, j->hidden, j->hidden, j->res, j->x, j->B,
                j->hidden, j->eps};
  pool_run(norm_unit, &n, ceil_div(j->B, 8), j->B >= POOL_ROWS_JOB ? nt : 1);
}

/* y = in . W^T (+ bias) of the layer's B rows (gemm_run); resid: also h = res + y. */
static void graph_gemm(graph_job *j, int kind, const float *in, int64_t in_s, int K, const void *w,
                       const uint8_t *tiles, const float *bias, float *y, int64_t ys, int N,
                       int resid, char *codes, int nt) {
  gemm_job g = {.kind = kind, .M = j->B, .K = K, .N = N, .in = in, .bias = bias, .in_s = in_s,
                .ys = ys, .w = w, .tiles = tiles, .y = y, .h = resid ? j->h : NULL, .res = j->res,
                .hidden = j->hidden};
  gemm_run(&g, codes, nt);
  j->y = y;
}

static void graph_silu_unit(void *p, int u, int w) { /* act = silu(g) * u of gu */
  graph_job *j = (graph_job *)p;
  (void)w;
  for (int m = 8 * u; m < j->B && m < 8 * u + 8; m++)
    silu_mul_row(j->gu + (int64_t)m * 2 * j->inter, j->act + (int64_t)m * j->inter, j->inter);
}

static void graph_resid_unit(void *p, int u, int w) { /* h = res + y (after the all-reduce) */
  graph_job *j = (graph_job *)p;
  (void)w;
  for (int m = 8 * u; m < j->B && m < 8 * u + 8; m++)
    for (int c = 0; c < j->hidden; c++)
      j->h[(int64_t)m * j->hidden + c] = j->res[(int64_t)m * j->hidden + c] + j->y[(int64_t)m * j->hidden + c];
}

/* Tensor parallelism: the weights are this rank's shard (H, Hkv, inter local) and all_reduce
 * (NULL on one rank) sums the o and down projections' partial outputs across ranks, called by
 * the calling thread where the per-op path calls the communicator. Returns 0, or the
 * all-reduce's error (the step stops there; h is then undefined). */
int infer_decode_layers(const infer_layer *layers, int n_layers, float *h, int B, int hidden,
                        int H, int Hkv, int D, int inter, float eps, const int64_t *pos,
                        const float *cos_sin, int rot_dim, const int64_t *slots,
                        const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                        int page, float scale, infer_all_reduce_fn all_reduce, void *ar_state,
                        int kv16) {
  int qkv_w = (H + 2 * Hkv) * D, att_w = H * D, nt = g_threads < POOL_MAX ? g_threads : POOL_MAX;
  int kmax = hidden > att_w ? hidden : att_w, failed = 0;
  kmax = kmax > inter ? kmax : inter;
  size_t codes_bytes = (i8_act_bytes(B, kmax, 1) + 63) & ~(size_t)63;
  float *qkv = (float *)malloc(sizeof(float) * (size_t)B * qkv_w);
  float *att = (float *)malloc(sizeof(float) * (size_t)B * att_w);
  float *o = (float *)malloc(sizeof(float) * (size_t)B * hidden);
  float *gu = (float *)malloc(sizeof(float) * (size_t)B * 2 * inter);
  float *act = (float *)malloc(sizeof(float) * (size_t)B * inter);
  float *dn = (float *)malloc(sizeof(float) * (size_t)B * hidden);
  float *x = (float *)malloc(sizeof(float) * (size_t)B * hidden);
  float *res = (float *)malloc(sizeof(float) * (size_t)B * hidden);
  char *codes = (char *)aligned_alloc(64, codes_bytes);
  graph_job j = {.B = B, .hidden = hidden, .inter = inter, .eps = eps, .h = h, .x = x, .res = res,
                 .gu = gu, .act = act};
  int64_t row = (int64_t)Hkv * D;
  for (int l = 0; l < n_layers; l++) {
    const infer_layer *L = layers + l;
    graph_norm(&j, L->in_norm, NULL, nt);
    graph_gemm(&j, L->kind_qkv, x, hidden, hidden, L->wqkv, L->tqkv, L->bqkv, qkv, qkv_w, qkv_w, 0,
               codes, nt);
    infer_rope(pos, qkv, qkv_w, H, qkv + (int64_t)H * D, qkv_w, Hkv, B, D, rot_dim, cos_sin);
    write_kv(qkv + (int64_t)H * D, qkv_w, qkv + (int64_t)(H + Hkv) * D, qkv_w, L->k_cache,
             L->v_cache, kv16, slots, B, row);
    decode_attn at = {qkv, qkv_w, L->k_cache, L->v_cache, kv16, block_tables, bt_stride, seq_lens,
                      att, B, H, Hkv, D, page, scale};
    attend_pool(&at, nt);
    graph_gemm(&j, L->kind_o, att, att_w, att_w, L->wo, L->to, NULL, o, hidden, hidden, 0, codes, nt);
    if (all_reduce != NULL && all_reduce(ar_state, o, (int64_t)B * hidden)) {
      failed = 1;
      break;
    }
    graph_norm(&j, L->post_norm, o, nt);
    graph_gemm(&j, L->kind_gu, x, hidden, hidden, L->wgu, L->tgu, NULL, gu, 2 * inter, 2 * inter, 0,
               codes, nt);
    graph_rows(&j, graph_silu_unit, 16, nt);
    graph_gemm(&j, L->kind_down, act, inter, inter, L->wdown, L->tdown, NULL, dn, hidden, hidden,
               all_reduce == NULL, codes, nt);
    if (all_reduce != NULL) {
      if (all_reduce(ar_state, dn, (int64_t)B * hidden)) {
        failed = 1;
        break;
      }
      graph_rows(&j, graph_resid_unit, POOL_ROWS_JOB, nt);
    }
  }
  free(codes);
  free(qkv);
  free(att);
  free(o);
  free(gu);
  free(act);
  free(dn);
  free(x);
  free(res);
  return failed ? -1 : 0;
}


/* ---- greedy Q8_0 LM head: an int8 screen on AMX tiles, exact logits only for the candidates ----
 * Greedy rows need argmax(logits), not the logits (as the bf16 library's greedy head: its
 * comment has the argument). The exact logit E_n of a row x is the int16-activation GEMM's
 * (i8_gemm with kind 8 | KIND_I16, whichever tiles: the same bits). The screen approximates
 * sum_k x_k w_nk with the row quantized to 14-bit codes with one scale, X = rint(x / s_x),
 * |X| <= 8191, s_x = max|x| / 8191 (no channel needs taking apart: the few large channels of a
 * residual stream keep the others 1/8191 of the largest, where 8-bit codes had 1/127), against
 * an int8 copy of the head with one scale a column (w_n ~ s_n c_n, |c| <= 127). On AMX tiles,
 * U = X + 8192 in [1, 16383] splits into u8 hi = U >> 8 and lo = U & 255, so that
 * sum(X c) = 256 sum(hi c) + sum(lo c) - 8192 sum(c), exact in int32 (|sum(X c)| <= 8191 * 127 K
 * < 2^31 for K <= 2048; the intermediate sums wrap), and approx_n = s_x s_n sum(X c). The bound:
 *   |E_n - sum(xh w_n)| <= gamma ||xh|| ||w_n||   (xh: the GEMM's own int16 codes times their
 *     block scales; the float chain over the blocks, any order: gamma for K / 32 + 3 roundings)
 *   |sum(xh w_n) - sum(x w_n)| <= ||x - xh|| ||w_n||   (each code within 0.51 of x / d_b)
 *   |sum(x w_n) - approx_n| <= ||x|| ||w_n - s_n c_n|| + s_n ||c_n|| ||x - s_x X||
 * (Cauchy-Schwarz), with the column terms from the packer (float64, rounded up) and the row
 * terms in double, rounded up; B adds 2^-10 of itself and 2^-20 of |approx| for its own float
 * evaluation and approx's. Candidates: upper bound approx + B at least the row's best lower
 * bound; a row with a non-finite value, or a unit with more candidates than it keeps, takes
 * every logit. */
typedef struct {
  const int8_t *q;     /* [NB][K / 4][16][4]: column n's codes, 4 k at a time (the B tile layout) */
  const float *scale;  /* [NB * 16] s_n (0 on padding columns) */
  const int32_t *csum; /* [NB * 16] 8192 sum_k c_n[k] */
  const float *err;    /* [NB * 16] ||w_n - s_n c_n|| */
  const float *qnorm;  /* [NB * 16] s_n ||c_n|| */
  const float *wnorm;  /* [NB * 16] ||w_n|| */
  int K;               /* a multiple of 64 */
} infer_q8_screen;

#ifdef I8_AMX
#define QS_CAP 256 /* candidates a unit keeps per row */
#define QS_BLOCKS 64 /* column blocks of 16 per unit */

typedef struct {
  const infer_q8_screen *sc;
  const float *x;
  int64_t xs;
  int B, K, V, NB, units;
  const uint8_t *hi, *lo; /* [B][K] */
  const float *rowf;      /* [B][4]: s_x, ||x||, ||x - s_x X||, gamma ||xh|| + ||x - xh|| */
  const void *head;       /* the Q8_0 blocks [V][K / 32] */
  _Atomic uint32_t *top;  /* [B] the best lower bound so far (float bits, compared as floats) */
  int32_t *cn;            /* [units][B][QS_CAP] */
  float *cu;              /* [units][B][QS_CAP] */
  int32_t *cc;            /* [units][B]; -1: more than QS_CAP */
  char *bad;              /* [B] */
  int64_t *ids;
} qs_job;

/* Unit u: column blocks [u QS_BLOCKS, ...), two at a time, for every 16 rows (hi and lo padded
 * to whole tiles with zero rows, never read back): H = sum(hi c) and L = sum(lo c) on tiles
 * (tdpbusd), then each row's approximations, bounds and candidates. */
static void qs_unit(void *p, int u, int worker) {
  const qs_job *j = (const qs_job *)p;
  const infer_q8_screen *sc = j->sc;
  (void)worker;
  int K = j->K, K4 = K / 4, b0 = u * QS_BLOCKS, b1 = b0 + QS_BLOCKS < j->NB ? b0 + QS_BLOCKS : j->NB;
  int32_t *cc = j->cc + (int64_t)u * j->B;
  for (int m = 0; m < j->B; m++) cc[m] = 0;
  int32_t hl[4][16][16] __attribute__((aligned(64))); /* H, L of block b; H, L of block b + 1 */
  static const uint8_t cfg_rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
  static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
  amx_configure(cfg_rows, colsb);
  for (int b = b0; b < b1; b += 2) {
    int two = b + 1 < b1;
    const int8_t *w0 = sc->q + (int64_t)b * K4 * 64, *w1 = w0 + (int64_t)K4 * 64;
    for (int r0 = 0; r0 < j->B; r0 += 16) {
      int rows = j->B - r0 < 16 ? j->B - r0 : 16;
      const uint8_t *xh = j->hi + (int64_t)r0 * K, *xl = j->lo + (int64_t)r0 * K;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int k = 0; k < K; k += 64) {
        _tile_loadd(4, xh + k, K);
        _tile_loadd(5, xl + k, K);
        _tile_loadd(6, w0 + k * 16, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 5, 6);
        if (two) {
          _tile_loadd(7, w1 + k * 16, 64);
          _tile_dpbusd(2, 4, 7);
          _tile_dpbusd(3, 5, 7);
        }
      }
      _tile_stored(0, hl[0], 64);
      _tile_stored(1, hl[1], 64);
      if (two) {
        _tile_stored(2, hl[2], 64);
        _tile_stored(3, hl[3], 64);
      }
      for (int i = 0; i < rows; i++) {
        int m = r0 + i;
        if (j->bad[m]) continue;
        const float *rf = j->rowf + (int64_t)m * 4;
        __m512 sx = _mm512_set1_ps(rf[0]), ra = _mm512_set1_ps(rf[1]), rr = _mm512_set1_ps(rf[2]),
               rg = _mm512_set1_ps(rf[3]);
        __m512 ap[2], bd[2], lmax = _mm512_set1_ps(-INFINITY);
        __mmask16 real[2] = {0, 0};
        for (int bb = 0; bb <= two; bb++) {
          int n0 = (b + bb) * 16;
          real[bb] = n0 + 16 <= j->V ? 0xFFFF : (__mmask16)((1u << (j->V - n0)) - 1);
          /* sum(X c) = 256 H + L - 8192 sum(c), exact in int32 (the intermediate wraps) */
          __m512i dot = _mm512_sub_epi32(
              _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const void *)hl[2 * bb][i]), 8),
                               _mm512_load_si512((const void *)hl[2 * bb + 1][i])),
              _mm512_loadu_si512((const void *)(sc->csum + n0)));
          ap[bb] = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sx, _mm512_loadu_ps(sc->scale + n0)));
          __m512 d = _mm512_fmadd_ps(ra, _mm512_loadu_ps(sc->err + n0),
                                     _mm512_fmadd_ps(rr, _mm512_loadu_ps(sc->qnorm + n0),
                                                     _mm512_mul_ps(rg, _mm512_loadu_ps(sc->wnorm + n0))));
          bd[bb] = _mm512_fmadd_ps(d, _mm512_set1_ps(1.f + 0x1p-10f),
                                   _mm512_fmadd_ps(_mm512_abs_ps(ap[bb]), _mm512_set1_ps(0x1p-20f),
                                                   _mm512_set1_ps(1e-30f)));
          lmax = _mm512_mask_max_ps(lmax, real[bb], lmax, _mm512_sub_ps(ap[bb], bd[bb]));
        }
        float t = _mm512_reduce_max_ps(lmax), g = screen_top(j->top + m);
        if (t > g) g = screen_raise(j->top + m, t);
        t = g > t ? g : t;
        int32_t *cn = j->cn + ((int64_t)u * j->B + m) * QS_CAP;
        float *cu = j->cu + ((int64_t)u * j->B + m) * QS_CAP;
        for (int bb = 0; bb <= two; bb++) {
          __m512 up = _mm512_add_ps(ap[bb], bd[bb]);
          __mmask16 keep = _mm512_mask_cmp_ps_mask(real[bb], up, _mm512_set1_ps(t), _CMP_GE_OQ);
          if (keep) {
            float upv[16];
            _mm512_storeu_ps(upv, up);
            for (int c = 0; c < 16; c++)
              if (keep >> c & 1) screen_keep(cn, cu, cc + m, QS_CAP, t, (b + bb) * 16 + c, upv[c]);
          }
        }
      }
    }
  }
  _tile_release();
}

/* Row m's candidates (every unit's above the row's best lower bound), their exact logits (the
 * row's int16 codes against their gathered Q8_0 rows: the head GEMM's sums), the first maximum.
 * Sets bad[m] where the row must take every logit. */
static void qs_exact_unit(void *p, int m, int worker) {
  const qs_job *j = (const qs_job *)p;
  (void)worker;
  if (j->bad[m]) return;
  float t = screen_top(j->top + m);
  int nb = j->K / QK, nc = 0;
  int32_t *cand = (int32_t *)malloc(sizeof(int32_t) * (size_t)j->units * QS_CAP);
  for (int v = 0; v < j->units && cand; v++) {
    int32_t n_v = j->cc[(int64_t)v * j->B + m];
    if (n_v < 0) { /* a unit with more candidates than it kept */
      free(cand);
      cand = NULL;
      break;
    }
    const int32_t *cn = j->cn + ((int64_t)v * j->B + m) * QS_CAP;
    const float *cu = j->cu + ((int64_t)v * j->B + m) * QS_CAP;
    for (int i = 0; i < n_v; i++)
      if (cu[i] >= t) cand[nc++] = cn[i];
  }
  if (!cand || nc == 0) {
    free(cand);
    j->bad[m] = 1;
    return;
  }
  block_q8 *w = (block_q8 *)malloc(sizeof(block_q8) * (size_t)nc * nb);
  char *codes = (char *)aligned_alloc(64, (i8_act_bytes(1, j->K, 1) + 63) & ~(size_t)63);
  float *y = (float *)malloc(sizeof(float) * (size_t)nc);
  for (int i = 0; i < nc; i++)
    memcpy(w + (int64_t)i * nb, (const block_q8 *)j->head + (int64_t)cand[i] * nb, sizeof(block_q8) * nb);
  i8_act a = i8_layout(1, j->K, 1, codes);
  i8_quantize_row(j->x + (int64_t)m * j->xs, &a, 0);
  i8_gemm(8, &a, 1, w, NULL, NULL, 0, nc, y, nc);
  int64_t best = -1;
  float bv = 0.f;
  int bad = 0;
  for (int i = 0; i < nc; i++) {
    float e = y[i];
    if (!isfinite(e)) bad = 1;
    else if (best < 0 || e > bv || (e == bv && cand[i] < best)) {
      best = cand[i];
      bv = e;
    }
  }
  if (bad || best < 0) j->bad[m] = 1;
  else j->ids[m] = best;
  free(y);
  free(codes);
  free(w);
  free(cand);
}

int infer_q8_screen_ok(void) { return amx_on(); }

/* ids[m] = argmax (the first maximum) of the exact logits of row m of x [B, K] (row stride xs)
 * against the Q8_0 head (head: [V][K / 32] blocks) with int16 activations: the logits
 * infer_fgemm(8 | KIND_I16, ...) computes, exactly. sc: the head's screen (K a multiple of 64).
 * Returns the number of rows that took every logit (non-finite values, or too many candidates). */
int infer_q8_head_greedy(const float *x, int64_t xs, int B, int K, const infer_q8_screen *sc,
                         const void *head, int V, int64_t *ids) {
  int nt = g_threads, NB = (V + 15) / 16, units = ceil_div(NB, QS_BLOCKS);
  qs_job j = {.sc = sc, .x = x, .xs = xs, .B = B, .K = K, .V = V, .NB = NB, .units = units,
              .head = head, .ids = ids};
  int Bp = (B + 15) & ~15; /* whole tiles of rows: the rows past B zero */
  uint8_t *hi = (uint8_t *)calloc((size_t)Bp * K, 1), *lo = (uint8_t *)calloc((size_t)Bp * K, 1);
  float *rowf = (float *)malloc(sizeof(float) * (size_t)B * 4);
  char *bad = (char *)calloc((size_t)B, 1);
  const double u = 0x1p-24, nu = (K / QK + 3) * u, gam = 2.0 * nu / (1.0 - nu);
  for (int m = 0; m < B; m++) {
    const float *xm = x + (int64_t)m * xs;
    float amax = 0.f;
    double xx = 0, eh = 0;
    for (int b = 0; b < K / QK; b++) { /* the GEMM's codes: within 0.51 d_b of x (d_b rounded up) */
      float ab = 0.f;
      for (int k = b * QK; k < (b + 1) * QK; k++) {
        if (!isfinite(xm[k])) bad[m] = 1;
        ab = fabsf(xm[k]) > ab ? fabsf(xm[k]) : ab;
        xx += (double)xm[k] * xm[k];
      }
      amax = ab > amax ? ab : amax;
      double d = (double)ab / 32767.0 * (1 + 0x1p-20);
      eh += QK * (0.51 * d) * (0.51 * d);
    }
    float sx = amax > 0.f ? amax / 8191.f : 1.f;
    double ex = 0;
    uint8_t *hm = hi + (int64_t)m * K, *lm = lo + (int64_t)m * K;
    for (int k = 0; k < K; k++) {
      float v = bad[m] ? 0.f : nearbyintf(xm[k] / sx);
      v = v > 8191.f ? 8191.f : (v < -8191.f ? -8191.f : v);
      int U = (int)v + 8192;
      hm[k] = (uint8_t)(U >> 8);
      lm[k] = (uint8_t)(U & 255);
      double e = (double)xm[k] - (double)sx * v;
      ex += e * e;
    }
    double nx = sqrt(xx), nh = sqrt(eh);
    float *rf = rowf + (int64_t)m * 4;
    rf[0] = sx;
    rf[1] = (float)(nx * (1 + 0x1p-20));
    rf[2] = (float)(sqrt(ex) * (1 + 0x1p-20));
    rf[3] = (float)((gam * (nx + nh) + nh) * (1 + 0x1p-20));
  }
  j.hi = hi;
  j.lo = lo;
  j.rowf = rowf;
  j.bad = bad;
  j.top = (_Atomic uint32_t *)malloc(sizeof(_Atomic uint32_t) * (size_t)B);
  for (int m = 0; m < B; m++) screen_init_top(j.top + m);
  /* the candidate lists: kept between calls (a fresh mapping's page faults cost more than
   * the lists' use, as in the bf16 library) */
  static __thread scratch cn_keep, cu_keep;
  j.cn = (int32_t *)scratch_get(&cn_keep, sizeof(int32_t) * (size_t)units * B * QS_CAP);
  j.cu = (float *)scratch_get(&cu_keep, sizeof(float) * (size_t)units * B * QS_CAP);
  j.cc = (int32_t *)malloc(sizeof(int32_t) * (size_t)units * B);
  pool_run(qs_unit, &j, units, nt);
  pool_run(qs_exact_unit, &j, B, nt);
  int full = 0;
  float *row = NULL;
  for (int m = 0; m < B; m++) {
    if (!bad[m]) continue;
    full++;
    if (!row) row = (float *)malloc(sizeof(float) * (size_t)V);
    infer_fgemm(8 | KIND_I16, x + (int64_t)m * xs, xs, 1, K, head, NULL, V, row, V);
    ids[m] = argmax_row(row, V); /* torch's argmax rule */
  }
  free(row);
  free(j.cc);
  free((void *)j.top);
  free(bad);
  free(rowf);
  free(lo);
  free(hi);
  return full;
}
#else
int infer_q8_screen_ok(void) { return 0; }
int infer_q8_head_greedy(const float *x, int64_t xs, int B, int K, const infer_q8_screen *sc,
                         const void *head, int V, int64_t *ids) {
  (void)x, (void)xs, (void)B, (void)K, (void)sc, (void)head, (void)V, (void)ids;
  return -1;
}
#endif
