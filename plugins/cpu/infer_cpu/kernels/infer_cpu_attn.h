/*
 * Decode attention tiles over a paged float32, bf16 or fp16 KV cache (AVX2 + FMA; AVX-512 where the
 * build has it, with the same bits), shared by the CPU
 * plugin's two kernel libraries (infer_cpu_kernels.c: GGUF / float32 models, every query row;
 * infer_cpu_bf16.c: bf16 models' decode rows where its AVX-512 tiles do not apply).
 *
 * Cache layout [pages, page, Hkv, D]: a position's row holds all its KV heads side by side.
 * A query row's heads of KV head g are done in register tiles of up to 3 heads: scores 4 keys x
 * heads at a time (each key loaded once for the heads), then softmax numerators in place
 * (infer_cpu_vmath.h's exp), then the value sums 32 columns x heads at a time, divided by the
 * exp sum at the end. The keys, then the values, are read in blocks of KV_BLOCK (bf16:
 * KV_BLOCK16, also for fp16) positions, each block's rows for every KV head of the call before the next block, so
 * a call covering all of a row's KV heads reads each page as one contiguous run. The block size
 * does not change any bits. A query head's arithmetic does not
 * depend on which KV heads share its call: score tiles start at multiples of 4 either way, and
 * each output lane is one FMA chain over the positions in order (carried in acc between blocks).
 *
 * The cache type is kv16: 0 float32, 1 bf16, 2 fp16 (IEEE half). 16-bit values are widened to
 * float32 exactly as they are loaded, so a 16-bit cache's arithmetic is the float32 arithmetic on
 * the rounded keys and values.
 */
#ifndef INFER_CPU_ATTN_H
#define INFER_CPU_ATTN_H

#include "infer_cpu_vmath.h"

/* positions per block: multiples of group_scores' 4-key tile. Measured (cpu_attn_micro.py, batch
 * 32, 192 keys, 30 layers, Zen 3): bf16 caches 12.9 ms in blocks of 16, 11.4 in 8, 11.0 in 4;
 * float32 ones 16.2 in 16, 16.8 in 8, 17.8 in 4, 16.5 in 32. Calls of one KV head (the bf16
 * library's rows) keep KV_BLOCK: there 4 was 1-2 % slower (cpu_bf16_decode_micro.py). */
#ifndef KV_BLOCK
#define KV_BLOCK 16
#endif
#ifndef KV_BLOCK16
#define KV_BLOCK16 4
#endif

/* off[j] = the element offset of position j's cache row (row elements per position), j < L,
 * from the sequence's page table. */
static inline void attn_row_offsets(const int32_t *bt, int page, int64_t row, int L, int64_t *off) {
  for (int j = 0, p = 0; j < L; p++) {
    int64_t r = (int64_t)bt[p] * page * row;
    for (int i = 0; i < page && j < L; i++, r += row) off[j++] = r;
  }
}

#if defined(__AVX2__)
/* The sum of v's 8 lanes. */
static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define INFER_ATTN_TILES 1

/* 8 cache values at element i of base as floats (bf16, fp16: widened exactly). */
static inline __m256 kv_load8(const void *base, int64_t i, int kv16) {
  return kv16 == 1 ? vm_bf16x8_load((const uint16_t *)base + i)
       : kv16 == 2 ? vm_f16x8_load((const uint16_t *)base + i)
                   : _mm256_loadu_ps((const float *)base + i);
}

/* The keys j0 .. L - 1 after the last 4-key tile, one at a time (a plain 8-lane sum). */
static inline __attribute__((always_inline)) void scores_singles(
    const float *q, int nh, const void *kb, int kv16, const int64_t *off, int j0, int L, int D,
    float scale, float *s, int ls) {
  for (int j = j0; j < L; j++) {
    int64_t kj = off[j];
    for (int h = 0; h < nh; h++) {
      __m256 a = _mm256_setzero_ps();
      for (int i = 0; i < D; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + (int64_t)h * D + i), kv_load8(kb, kj + i, kv16), a);
      s[(int64_t)h * ls + j] = hsum256(a) * scale;
    }
  }
}

/* s[h * ls + j] = scale * (q_h . k_j) for nh <= 3 query heads (q_h = q + h D) and the L keys at
 * kb + off[j]. Tiles of 4 keys x nh heads: each key is loaded once for all the heads, and one
 * hadd tree turns the 4 x nh accumulators into 4 scores per head. */
static inline __attribute__((always_inline)) void group_scores(
    const float *q, int nh, const void *kb, int kv16, const int64_t *off, int L, int D, float scale,
    float *s, int ls) {
  const __m128 sc = _mm_set1_ps(scale);
  int j = 0;
  for (; j + 4 <= L; j += 4) {
    int64_t k0 = off[j], k1 = off[j + 1], k2 = off[j + 2], k3 = off[j + 3];
    __m256 a[3][4];
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < 4; t++) a[h][t] = _mm256_setzero_ps();
    for (int i = 0; i < D; i += 8) {
      __m256 x0 = kv_load8(kb, k0 + i, kv16), x1 = kv_load8(kb, k1 + i, kv16),
             x2 = kv_load8(kb, k2 + i, kv16), x3 = kv_load8(kb, k3 + i, kv16);
      for (int h = 0; h < nh; h++) {
        __m256 qv = _mm256_loadu_ps(q + (int64_t)h * D + i);
        a[h][0] = _mm256_fmadd_ps(qv, x0, a[h][0]);
        a[h][1] = _mm256_fmadd_ps(qv, x1, a[h][1]);
        a[h][2] = _mm256_fmadd_ps(qv, x2, a[h][2]);
        a[h][3] = _mm256_fmadd_ps(qv, x3, a[h][3]);
      }
    }
    for (int h = 0; h < nh; h++) {
      __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[h][0], a[h][1]), _mm256_hadd_ps(a[h][2], a[h][3]));
      __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
      _mm_storeu_ps(s + (int64_t)h * ls + j, _mm_mul_ps(r, sc));
    }
  }
  scores_singles(q, nh, kb, kv16, off, j, L, D, scale, s, ls);
}

/* acc_h (+)= sum_{j0 <= j < j1} p[h * ls + j] v_j for nh <= 3 heads (acc_h = acc + h D), the
 * values at vb + off[j]; D a multiple of 32, done 32 columns at a time (4 x nh accumulators).
 * first: start from zero, else from acc. Each lane is one FMA chain over j in order, so blocks
 * j0 < j1 <= j2 ... give the bits of one pass over all the keys (acc holds it between them). */
static inline __attribute__((always_inline)) void group_values(
    const float *p, int ls, int nh, const void *vb, int kv16, const int64_t *off, int j0, int j1,
    int D, int first, float *acc) {
  for (int i0 = 0; i0 < D; i0 += 32) {
    __m256 a[3][4];
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < 4; t++)
        a[h][t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (int64_t)h * D + i0 + 8 * t);
    for (int j = j0; j < j1; j++) {
      int64_t vj = off[j] + i0;
      /* the heads' weights, then one value vector at a time: 12 sums + 3 weights + 1 vector
       * fit the 16 ymm registers (four vectors at once spilled a sum, whose chain then ran
       * through memory) */
      __m256 ph[3];
      for (int h = 0; h < nh; h++) ph[h] = _mm256_broadcast_ss(p + (int64_t)h * ls + j);
      for (int t = 0; t < 4; t++) {
        __m256 x = kv_load8(vb, vj + 8 * t, kv16);
        for (int h = 0; h < nh; h++) a[h][t] = _mm256_fmadd_ps(ph[h], x, a[h][t]);
      }
    }
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < 4; t++) _mm256_storeu_ps(acc + (int64_t)h * D + i0 + 8 * t, a[h][t]);
  }
}

#if defined(__AVX512F__) && !defined(INFER_ATTN_TILES_256)
/* The same tiles on 512-bit registers, with the same bits: every lane does the FMA chain the
 * 256-bit tile's lane does, only two of those lanes' vectors share a register.
 * Scores: a register holds two keys' 8-lane accumulators (keys t and t + 1 of a 4-key tile)
 * against the head's 8 query values broadcast to both halves; the halves then go through the
 * 256-bit tile's hadd tree in its order. Values: lanes are output columns, each one FMA chain
 * over the positions, so 16 columns a register is the 8-column tile twice.
 * -DINFER_ATTN_TILES_256 keeps the 256-bit tiles (the tests compare the two). */

/* 8 cache values at element a in the low half and at b in the high half, as floats. */
static inline __m512 kv_load8x2(const void *base, int64_t a, int64_t b, int kv16) {
  if (kv16 == 0)
    return _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps((const float *)base + a))),
        _mm256_castps_pd(_mm256_loadu_ps((const float *)base + b)), 1));
  const uint16_t *p = (const uint16_t *)base;
  __m256i h = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + a))),
      _mm_loadu_si128((const __m128i *)(p + b)), 1);
  return kv16 == 2 ? _mm512_cvtph_ps(h)
                   : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 cache values at element i of base as floats (bf16, fp16: widened exactly). */
static inline __m512 kv_load16(const void *base, int64_t i, int kv16) {
  if (kv16 == 0) return _mm512_loadu_ps((const float *)base + i);
  __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
  return kv16 == 2 ? _mm512_cvtph_ps(h)
                   : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* q[i .. i + 8) in both halves. */
static inline __m512 q_dup8(const float *q) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q))));
}

/* group_scores' 4-key tiles: s[h * ls + j .. + 4) for keys j .. j + 3, the same bits. */
static inline __attribute__((always_inline)) void group_scores4_512(
    const float *q, int nh, const void *kb, int kv16, const int64_t *off, int j, int D,
    __m128 sc, float *s, int ls) {
  int64_t k0 = off[j], k1 = off[j + 1], k2 = off[j + 2], k3 = off[j + 3];
  __m512 a[3][2];
  for (int h = 0; h < nh; h++) a[h][0] = a[h][1] = _mm512_setzero_ps();
  for (int i = 0; i < D; i += 8) {
    __m512 x01 = kv_load8x2(kb, k0 + i, k1 + i, kv16), x23 = kv_load8x2(kb, k2 + i, k3 + i, kv16);
    for (int h = 0; h < nh; h++) {
      __m512 qv = q_dup8(q + (int64_t)h * D + i);
      a[h][0] = _mm512_fmadd_ps(qv, x01, a[h][0]);
      a[h][1] = _mm512_fmadd_ps(qv, x23, a[h][1]);
    }
  }
  for (int h = 0; h < nh; h++) {
    __m256 y0 = _mm512_castps512_ps256(a[h][0]),
           y1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[h][0]), 1)),
           y2 = _mm512_castps512_ps256(a[h][1]),
           y3 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[h][1]), 1));
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(y0, y1), _mm256_hadd_ps(y2, y3));
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    _mm_storeu_ps(s + (int64_t)h * ls + j, _mm_mul_ps(r, sc));
  }
}

/* group_scores with the same bits: 4-key tiles where it has them, its single keys after. */
static inline __attribute__((always_inline)) void group_scores_512(
    const float *q, int nh, const void *kb, int kv16, const int64_t *off, int L, int D, float scale,
    float *s, int ls) {
  const __m128 sc = _mm_set1_ps(scale);
  int j = 0;
  for (; j + 4 <= L; j += 4) group_scores4_512(q, nh, kb, kv16, off, j, D, sc, s, ls);
  scores_singles(q, nh, kb, kv16, off, j, L, D, scale, s, ls);
}

/* group_values with the same bits, NC (64 or 32) columns at a time from i0. */
static inline __attribute__((always_inline)) void group_values_cols512(
    const float *p, int ls, int nh, const void *vb, int kv16, const int64_t *off, int j0, int j1,
    int D, int first, float *acc, int i0, int nc) {
  __m512 a[3][4];
  int nt = nc / 16;
  for (int h = 0; h < nh; h++)
    for (int t = 0; t < nt; t++)
      a[h][t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (int64_t)h * D + i0 + 16 * t);
  for (int j = j0; j < j1; j++) {
    int64_t vj = off[j] + i0;
    __m512 ph[3];
    for (int h = 0; h < nh; h++) ph[h] = _mm512_set1_ps(p[(int64_t)h * ls + j]);
    for (int t = 0; t < nt; t++) {
      __m512 x = kv_load16(vb, vj + 16 * t, kv16);
      for (int h = 0; h < nh; h++) a[h][t] = _mm512_fmadd_ps(ph[h], x, a[h][t]);
    }
  }
  for (int h = 0; h < nh; h++)
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(acc + (int64_t)h * D + i0 + 16 * t, a[h][t]);
}

static inline __attribute__((always_inline)) void group_values_512(
    const float *p, int ls, int nh, const void *vb, int kv16, const int64_t *off, int j0, int j1,
    int D, int first, float *acc) {
  int i0 = 0;
  for (; i0 + 64 <= D; i0 += 64)
    group_values_cols512(p, ls, nh, vb, kv16, off, j0, j1, D, first, acc, i0, 64);
  if (i0 < D) /* D is a multiple of 32 */
    group_values_cols512(p, ls, nh, vb, kv16, off, j0, j1, D, first, acc, i0, 32);
}
#define GROUP_SCORES group_scores_512
#define GROUP_VALUES group_values_512
#else
#define GROUP_SCORES group_scores
#define GROUP_VALUES group_values
#endif

/* Positions KV_PF ahead of a block are prefetched as the block starts (their rows sit a page
 * table walk apart, where the hardware prefetchers lose the stream): the lines of span bytes at
 * base + off[j] * esz for j in [j0, j0 + n), j < L. No value changes. */
#ifndef KV_PF
#define KV_PF 8
#endif
static inline void attn_prefetch_rows(const char *base, int esz, const int64_t *off, int j0, int n,
                                      int L, int64_t span) {
  for (int j = j0; j < j0 + n && j < L; j++)
    for (int64_t b = 0; b < span; b += 64) _mm_prefetch(base + off[j] * esz + b, _MM_HINT_T0);
}

/* group_scores / group_values with constant head counts and cache types (the tiles stay in
 * registers). Not inlined: inside their callers GCC kept the tiles' pointers and a value sum on the
 * stack (measured: bf16 caches 15.1 -> 12.6 ms for the step above, float32 16.5 -> 15.6). */
#define ATTN_SCORES_CASE(NH, KV)                                                               \
  case (NH) * 3 + (KV): GROUP_SCORES(q, NH, kb, KV, off, L, D, scale, s, ls); break;
static __attribute__((noinline)) void scores_tile(const float *q, int nh, const void *kb, int kv16,
                                                  const int64_t *off, int L, int D, float scale,
                                                  float *s, int ls) {
  switch (nh * 3 + kv16) {
    ATTN_SCORES_CASE(3, 2) ATTN_SCORES_CASE(3, 1) ATTN_SCORES_CASE(3, 0)
    ATTN_SCORES_CASE(2, 2) ATTN_SCORES_CASE(2, 1) ATTN_SCORES_CASE(2, 0)
    ATTN_SCORES_CASE(1, 2) ATTN_SCORES_CASE(1, 1)
  default: GROUP_SCORES(q, 1, kb, 0, off, L, D, scale, s, ls); break;
  }
}

#define ATTN_VALUES_CASE(NH, KV)                                                               \
  case (NH) * 3 + (KV): GROUP_VALUES(p, ls, NH, vb, KV, off, j0, j1, D, first, acc); break;
static __attribute__((noinline)) void values_tile(const float *p, int ls, int nh, const void *vb,
                                                  int kv16, const int64_t *off, int j0, int j1,
                                                  int D, int first, float *acc) {
  switch (nh * 3 + kv16) {
    ATTN_VALUES_CASE(3, 2) ATTN_VALUES_CASE(3, 1) ATTN_VALUES_CASE(3, 0)
    ATTN_VALUES_CASE(2, 2) ATTN_VALUES_CASE(2, 1) ATTN_VALUES_CASE(2, 0)
    ATTN_VALUES_CASE(1, 2) ATTN_VALUES_CASE(1, 1)
  default: GROUP_VALUES(p, ls, 1, vb, 0, off, j0, j1, D, first, acc); break;
  }
}

/* Query heads of KV heads [g0, g1) of one query row over its L positions: q [nq, D] (the row's
 * head g0 * group onwards, nq = (g1 - g0) * group), caches kc / vc (float32, or bf16 / fp16 as
 * kv16 says) with position j's row at element off[j]; o [nq, D] = softmax(q k^T * scale) v, float32
 * (o may be acc). Scratch: s [nq, L], acc [nq, D], inv [nq]. D a multiple of 32. */
static void attn_kv_groups(const float *q, int g0, int g1, int group, const void *kc,
                           const void *vc, int kv16, const int64_t *off, int L, int D,
                           float scale, float *s, float *acc, float *inv, float *o) {
  int nq = (g1 - g0) * group, esz = kv16 ? 2 : 4;
  /* small blocks pay off only when the call reads several KV heads of each row */
  int blk = kv16 && g1 - g0 > 1 ? KV_BLOCK16 : KV_BLOCK;
  const char *kb = (const char *)kc, *vb = (const char *)vc;
  int64_t span = (int64_t)(g1 - g0) * D * esz, at = (int64_t)g0 * D * esz; /* the call's bytes of a row */
  for (int j0 = 0; j0 < L; j0 += blk) {
    int jn = L - j0 < blk ? L - j0 : blk;
    attn_prefetch_rows(kb + at, esz, off, j0 + KV_PF, blk, L, span);
    for (int g = g0; g < g1; g++)
      for (int h0 = 0; h0 < group; h0 += 3) {
        int nh = group - h0 < 3 ? group - h0 : 3, hl = (g - g0) * group + h0;
        scores_tile(q + (int64_t)hl * D, nh, kb + (int64_t)g * D * esz, kv16, off + j0, jn, D,
                    scale, s + (int64_t)hl * L + j0, L);
      }
  }
  for (int hl = 0; hl < nq; hl++) {
    float *sh = s + (int64_t)hl * L;
    inv[hl] = 1.f / vm_exp_sub(sh, L, 1.f, vm_max(sh, L));
  }
  for (int j0 = 0; j0 < L; j0 += blk) {
    int j1 = L - j0 < blk ? L : j0 + blk;
    attn_prefetch_rows(vb + at, esz, off, j0 + KV_PF, blk, L, span);
    for (int g = g0; g < g1; g++)
      for (int h0 = 0; h0 < group; h0 += 3) {
        int nh = group - h0 < 3 ? group - h0 : 3, hl = (g - g0) * group + h0;
        values_tile(s + (int64_t)hl * L, L, nh, vb + (int64_t)g * D * esz, kv16, off, j0, j1, D,
                    j0 == 0, acc + (int64_t)hl * D);
      }
  }
  for (int hl = 0; hl < nq; hl++) {
    __m256 sc = _mm256_set1_ps(inv[hl]);
    for (int i = 0; i < D; i += 8)
      _mm256_storeu_ps(o + (int64_t)hl * D + i,
                       _mm256_mul_ps(_mm256_loadu_ps(acc + (int64_t)hl * D + i), sc));
  }
}
#endif

#endif /* INFER_CPU_ATTN_H */
