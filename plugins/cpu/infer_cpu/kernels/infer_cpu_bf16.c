/*
 * infer-plugin-cpu bf16 kernels: dense bf16 weights against float32 or bf16 activations, and a
 * whole bf16 decode step (the graph runner of bf16 models with a bf16 KV cache).
 *
 * Compiled on first use for the machine it runs on (kernels/bf16.py), called through ctypes; the
 * Python side checks dtypes, shapes and strides. Tested against plain torch in
 * plugins/cpu/tests/test_bf16_kernels.py, on every ISA path this compiler can build here.
 *
 * Weight layout ("pair-packed", made by kernels/bf16.py:pack): W [N, K] bf16 becomes
 * P [NB = ceil(N / 16)][K2 = ceil(K / 2)][16][2]: for column block b and k pair j the 16
 * columns' (w[n, 2j], w[n, 2j + 1]) side by side, zeros past N and K. One 64-byte row of P times
 * a broadcast activation pair is one vdpbf16ps giving 16 outputs, with no horizontal sums; the
 * AVX2 and portable paths widen the same bytes to float32.
 *
 * Numerics, every path: activations are rounded to bf16 (nearest even), each product of two
 * bf16 values is exact in float32, sums are float32 (their order differs by path).
 *
 * Threads: every multi-threaded call runs on the work pool of infer_cpu_pool.h (no OpenMP), whose
 * caller never waits for a helper thread that has not started.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getcpu, CPU_SET: the pool's core swap */
#endif
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "infer_cpu_vmath.h"
#include "infer_cpu_attn.h"
#include "infer_cpu_screen.h"
#define POOL_SWAPS_FN infer_bf16_pool_swaps
#include "infer_cpu_pool.h"

/* Into L1 (prefetcht0 on x86): the 64-byte lines of bytes [p, p + n). */
static inline void prefetch_span(const void *p, int n) {
  for (int c = 0; c < n; c += 64) __builtin_prefetch((const char *)p + c, 0, 3);
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define BF16_DP 1 /* vdpbf16ps on bf16 activation pairs */
#include "infer_cpu_amx.h"
#if defined(INFER_AMX_TILES) && defined(__AMX_BF16__)
#define BF16_AMX 1 /* the projections on AMX tiles (tdpbf16ps) where the kernel allows them */
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#define BF16_AVX2 1 /* weights widened to float32, FMA against float32 activations */
#endif

typedef uint16_t bf16;
#ifdef BF16_DP
typedef bf16 act_t; /* the GEMM's activation element: bf16 pairs for vdpbf16ps */
#else
typedef float act_t; /* bf16-rounded values held as float32 */
#endif

#define CB 16 /* columns per packed block */
#ifndef TM
#ifdef BF16_AVX2
#define TM 6 /* activation rows per register tile */
#else
#define TM 4
#endif
#endif
#define TB 4  /* column blocks per register tile (AVX-512); the AVX2 tile is one block */

static int g_threads = 1;

void infer_bf16_set_threads(int n) { g_threads = n > 0 ? n : 1; }

/* ---- the work pool (infer_cpu_pool.h): infer_bf16_pool_swaps() counts its core swaps ---- */

/* 4: AMX (tdpbf16ps) for the projections and the prefill attention, AVX-512 BF16 elsewhere; 3:
 * AVX-512 BF16 (vdpbf16ps);
 * 2: AVX2 + FMA; 0: portable C. */
int infer_bf16_isa(void) {
#if defined(BF16_AMX)
  return amx_on() ? 4 : 3;
#elif defined(BF16_DP)
  return 3;
#elif defined(BF16_AVX2)
  return 2;
#else
  return 0;
#endif
}

#if defined(__AVX512F__)
/* 16 bf16 at p as float32. */
static inline __m512 bf16x16_load(const bf16 *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* f32_to_bf16 of 16 values (nearest even, subnormals kept, NaN quieted), as bf16 bits. */
static inline __m256i bf16x16_pack(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)))),
      16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                          _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

/* v rounded to bf16 and back to float32. */
static inline __m512 bf16x16_round(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16x16_pack(v)), 16));
}
#endif

/* x [K] (float32, or bf16 when x_bf16) -> the GEMM's activation row o [2 * ceil(K / 2)]:
 * rounded to bf16, the odd tail padded with a zero. */
static void act_row(const void *x, int x_bf16, int K, act_t *o) {
  const float *xf = (const float *)x;
  const bf16 *xb = (const bf16 *)x;
  int k = 0;
#ifdef BF16_DP
  if (!x_bf16)
    for (; k + 16 <= K; k += 16) /* vcvtneps2bf16: nearest even, as f32_to_bf16 (subnormals -> 0) */
      _mm256_storeu_si256((__m256i *)(o + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xf + k)));
  for (; k < K; k++) o[k] = x_bf16 ? xb[k] : f32_to_bf16(xf[k]);
  if (K & 1) o[K] = 0;
#else
  for (; k < K; k++) o[k] = bf16_to_f32(x_bf16 ? xb[k] : f32_to_bf16(xf[k]));
  if (K & 1) o[K] = 0.f;
#endif
}

/* o[0, n) = x[0, n) rounded to bf16 as f32_to_bf16 rounds (act_t: the bf16 bits, or without
 * BF16_DP the rounded float32): bf16x16_pack 16 at a time (not act_row's vcvtneps2bf16, which
 * reads subnormal inputs as zero), then the tail. */
static inline void round_row(const float *x, int n, act_t *o) {
  int i = 0;
#ifdef BF16_DP
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(o + i), bf16x16_pack(_mm512_loadu_ps(x + i)));
  for (; i < n; i++) o[i] = f32_to_bf16(x[i]);
#else
  for (; i < n; i++) o[i] = bf16_to_f32(f32_to_bf16(x[i]));
#endif
}

/* A GEMM's output mode (its y_bf16 argument): float32, bf16 (nearest even), or float32 added
 * to what y holds (y += x W^T: a residual stream updated in place, the same sum as a float32
 * output added afterwards). */
#define Y_F32 0
#define Y_BF16 1
#define Y_ADD 2
#define Y_SIZE(mode) ((mode) == Y_BF16 ? 2 : 4)

/* Store 16 float32 outputs v (+ bias) at y[0 .. cols) in mode y_bf16, cols <= 16. */
static inline void store16(float *v, const float *bias, int cols, void *y, int y_bf16) {
  for (int c = 0; c < cols; c++) {
    float s = v[c] + (bias ? bias[c] : 0.f);
    if (y_bf16 == Y_BF16)
      ((bf16 *)y)[c] = f32_to_bf16(s);
    else if (y_bf16 == Y_ADD)
      ((float *)y)[c] += s;
    else
      ((float *)y)[c] = s;
  }
}

/* ---- register tiles: y[m, block b] for tm <= TM activation rows and tb column blocks ---- */
#if defined(BF16_DP)
static inline __attribute__((always_inline)) void tile(const act_t *x, int64_t xs, int tm,
                                                       const bf16 *P, int64_t ps, int tb, int K2,
                                                       int init, float out[][TB][CB]) {
  __m512 acc[TM][TB];
  for (int m = 0; m < tm; m++)
    for (int b = 0; b < tb; b++) acc[m][b] = init ? _mm512_setzero_ps() : _mm512_loadu_ps(out[m][b]);
  for (int j = 0; j < K2; j++) {
    __m512i w[TB];
    for (int b = 0; b < tb; b++) {
      w[b] = _mm512_loadu_si512((const void *)(P + b * ps + (int64_t)j * 32));
      /* held in a register: without this GCC 12 reloads each weight vector once per row (tm
       * loads where one does), and the loads, not the vdpbf16ps, set the pace */
      __asm__("" : "+v"(w[b]));
    }
    for (int m = 0; m < tm; m++) {
      int32_t pair;
      memcpy(&pair, x + m * xs + 2 * j, sizeof pair);
      __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < tb; b++) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], (__m512bh)w[b], xv);
    }
  }
  for (int m = 0; m < tm; m++)
    for (int b = 0; b < tb; b++) _mm512_storeu_ps(out[m][b], acc[m][b]);
}
#define TILE_TB TB
#elif defined(BF16_AVX2)
/* One block (16 columns = two 8-column halves); even k from (w << 16), odd from (w & 0xFFFF0000).
 * The even halves' FMAs of every row go before the odd ones' (each sum still takes k, then
 * k + 1), so only one pair of widened weight vectors is live: TM x 2 sums + 2 weights + the mask
 * + one broadcast fit the 16 ymm registers with TM = 6. */
static inline __attribute__((always_inline)) void tile(const act_t *x, int64_t xs, int tm,
                                                       const bf16 *P, int64_t ps, int tb, int K2,
                                                       int init, float out[][TB][CB]) {
  (void)ps;
  (void)tb;
#if defined(__x86_64__) && defined(__GNUC__)
  if (tm == 6) { /* in assembly: GCC's allocator spills this tile's 12 sums when it is C */
    _Static_assert(TB * CB * sizeof(float) == 256, "out's row stride in the assembly");
    if (init)
      for (int m = 0; m < 6; m++) memset(out[m][0], 0, sizeof(float) * CB);
    const bf16 *pw = P;
    const float *x0 = x, *x3 = x + 3 * xs;
    int64_t rs = xs * (int64_t)sizeof(float), n = K2;
/* row m's sums ymm(2m), ymm(2m + 1) += the widened weights ymm12, ymm13 x its value at OFF */
#define ROW(OFF, X, A, B)                                                   \
  "vbroadcastss " OFF X ", %%ymm14\n\t"                                     \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm" A "\n\t"                            \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm" B "\n\t"
#define ROWS6(OFF)                                                          \
  ROW(OFF, "(%[x0])", "0", "1") ROW(OFF, "(%[x0],%[rs])", "2", "3")         \
  ROW(OFF, "(%[x0],%[rs],2)", "4", "5") ROW(OFF, "(%[x3])", "6", "7")       \
  ROW(OFF, "(%[x3],%[rs])", "8", "9") ROW(OFF, "(%[x3],%[rs],2)", "10", "11")
/* the 12 sums between ymm0-11 and out (rows 256 bytes apart, halves 32) */
#define SUMS(OP)                                                                               \
  OP("0", "0") OP("1", "32") OP("2", "256") OP("3", "288") OP("4", "512") OP("5", "544")      \
  OP("6", "768") OP("7", "800") OP("8", "1024") OP("9", "1056") OP("10", "1280")              \
  OP("11", "1312")
#define LOAD_SUM(R, OFS) "vmovups " OFS "(%[out]), %%ymm" R "\n\t"
#define STORE_SUM(R, OFS) "vmovups %%ymm" R ", " OFS "(%[out])\n\t"
    __asm__ volatile(SUMS(LOAD_SUM)
                     "vpcmpeqd %%ymm15, %%ymm15, %%ymm15\n\t"
                     "vpslld $16, %%ymm15, %%ymm15\n\t" /* 0xFFFF0000: the odd halves */
                     "1:\n\t"
                     "vmovdqu (%[pw]), %%ymm12\n\t"
                     "vmovdqu 32(%[pw]), %%ymm13\n\t"
                     "vpslld $16, %%ymm12, %%ymm12\n\t"
                     "vpslld $16, %%ymm13, %%ymm13\n\t" ROWS6("")
                     "vpand (%[pw]), %%ymm15, %%ymm12\n\t"
                     "vpand 32(%[pw]), %%ymm15, %%ymm13\n\t" ROWS6("4")
                     "addq $64, %[pw]\n\t"
                     "addq $8, %[x0]\n\t"
                     "addq $8, %[x3]\n\t"
                     "decq %[n]\n\t"
                     "jnz 1b\n\t" SUMS(STORE_SUM)
                     : [pw] "+r"(pw), [x0] "+r"(x0), [x3] "+r"(x3), [n] "+r"(n)
                     : [rs] "r"(rs), [out] "r"(out)
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc",
                       "memory");
#undef ROW
#undef ROWS6
#undef SUMS
#undef LOAD_SUM
#undef STORE_SUM
    return;
  }
#endif
  const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
  __m256 acc[TM][2];
  for (int m = 0; m < tm; m++) {
    acc[m][0] = init ? _mm256_setzero_ps() : _mm256_loadu_ps(out[m][0]);
    acc[m][1] = init ? _mm256_setzero_ps() : _mm256_loadu_ps(out[m][0] + 8);
  }
  for (int j = 0; j < K2; j++) {
    const __m256i *wp = (const __m256i *)(P + (int64_t)j * 32);
    if (tm <= 4) { /* both halves' weights live: 8 sums + 4 weights + 2 broadcasts */
      __m256i w0 = _mm256_loadu_si256(wp), w1 = _mm256_loadu_si256(wp + 1);
      __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
      __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, hi));
      __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
      __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, hi));
      for (int m = 0; m < tm; m++) {
        __m256 xe = _mm256_broadcast_ss(x + m * xs + 2 * j);
        __m256 xo = _mm256_broadcast_ss(x + m * xs + 2 * j + 1);
        acc[m][0] = _mm256_fmadd_ps(o0, xo, _mm256_fmadd_ps(e0, xe, acc[m][0]));
        acc[m][1] = _mm256_fmadd_ps(o1, xo, _mm256_fmadd_ps(e1, xe, acc[m][1]));
      }
      continue;
    }
    /* 5 rows (and 6 where the assembly is not built): the even halves' FMAs of every row, then
     * the odd ones' (one pair of weights live) */
    __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(wp), 16));
    __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(wp + 1), 16));
    for (int m = 0; m < tm; m++) {
      __m256 xe = _mm256_broadcast_ss(x + m * xs + 2 * j);
      acc[m][0] = _mm256_fmadd_ps(w0, xe, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(w1, xe, acc[m][1]);
    }
    w0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(wp), hi));
    w1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(wp + 1), hi));
    for (int m = 0; m < tm; m++) {
      __m256 xo = _mm256_broadcast_ss(x + m * xs + 2 * j + 1);
      acc[m][0] = _mm256_fmadd_ps(w0, xo, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(w1, xo, acc[m][1]);
    }
  }
  for (int m = 0; m < tm; m++) {
    _mm256_storeu_ps(out[m][0], acc[m][0]);
    _mm256_storeu_ps(out[m][0] + 8, acc[m][1]);
  }
}
#define TILE_TB 1
#else
static void tile(const act_t *x, int64_t xs, int tm, const bf16 *P, int64_t ps, int tb, int K2,
                 int init, float out[][TB][CB]) {
  for (int m = 0; m < tm; m++)
    for (int b = 0; b < tb; b++)
      for (int c = 0; c < CB; c++) {
        float s = init ? 0.f : out[m][b][c];
        const bf16 *w = P + b * ps + 2 * c;
        for (int j = 0; j < K2; j++)
          s += bf16_to_f32(w[(int64_t)j * 32]) * x[m * xs + 2 * j] +
               bf16_to_f32(w[(int64_t)j * 32 + 1]) * x[m * xs + 2 * j + 1];
        out[m][b][c] = s;
      }
}
#define TILE_TB TB
#endif

/* y[m, n] = act[m] . w[n] (+ bias[n]) for the column blocks [b0, b1), every row m < M.
 * act [M][2 K2] (row stride xs), y row stride ys (elements), float32 or bf16 outputs.
 * K is walked in chunks of KC pairs (a group's weights, TB x KC x 64 bytes, stay in L1 while
 * every row tile uses them); the rows' float32 sums wait in acc [M][TB][CB] between chunks. */
#define KC 64
#ifndef PF_ROWS
#define PF_ROWS 8
#endif
#ifndef GEMM_MB
#define GEMM_MB (TM == 6 ? 36 : 32)
#endif

/* Rows of the next register tile when rem rows are left: TM, except that 7 and 8 left take
 * 4 (then 3 or 4) rather than TM and a tile of 1 or 2, whose few sums run at a fraction of the
 * FMA rate. Only the grouping changes: every sum runs over k in the same order. */
static inline int row_tile(int rem) {
  if (rem <= TM) return rem;
  return TM == 6 && rem <= 8 ? 4 : TM;
}
static void gemm_blocks_ps(const act_t *act, int64_t xs, int M, int K2, const bf16 *P, int64_t ps,
                           const float *bias, int N, int b0, int b1, void *y, int64_t ys,
                           int y_bf16) { /* ps: elements from one packed block to the next */
  float(*acc)[TB][CB] = (float(*)[TB][CB])malloc(sizeof(float) * (size_t)M * TB * CB);
  /* rows in groups of GEMM_MB: a group's activation chunk (GEMM_MB x KC pairs) stays in L1 while
   * every column block passes over it (all M rows at once spilled to L2 from a few hundred rows:
   * 38 against 46 G multiply-adds a second on one Zen 3 core). Same sums in the same order. */
  for (int mb = 0; mb < M; mb += GEMM_MB) {
    int me = M - mb < GEMM_MB ? M : mb + GEMM_MB;
    for (int b = b0; b < b1; b += TILE_TB) {
      int tb = b1 - b < TILE_TB ? b1 - b : TILE_TB;
      for (int kc = 0; kc < K2; kc += KC) {
        int kn = K2 - kc < KC ? K2 - kc : KC, init = kc == 0;
        const bf16 *w = P + b * ps + (int64_t)kc * 32;
        /* From PF_ROWS rows, the next chunk's weights (the next K chunk, else the next blocks'
         * first) are prefetched, a share before each row tile. A decode step reads each weight
         * from memory once, and a chunk of a block is one 4 KB page, where the hardware
         * prefetcher stops. Zen 3, 32-row decode steps: 1.03-1.05x; at 4 rows it cost 0.86x. */
        const char *nx = (const char *)(kc + KC < K2 ? w + KC * 32 : P + (b + tb) * ps);
        int more = b + tb < b1 || kc + KC < K2;
        int64_t nx_end = more && me - mb >= PF_ROWS ? (int64_t)tb * KC * 64 : 0, nx_at = 0;
        int tiles = (me - mb + TM - 1) / TM;
        int64_t nx_step = 64 * ((tb * KC + tiles - 1) / tiles);
        for (int m = mb, tm; m < me; m += tm) {
          tm = row_tile(me - m);
          for (int64_t e = nx_at + nx_step; nx_at < nx_end && nx_at < e; nx_at += 64)
            __builtin_prefetch(nx + (nx_at / (KC * 64)) * ps * 2 + nx_at % (KC * 64), 0, 3);
          const act_t *x = act + m * xs + 2 * kc;
          /* constant tile sizes let the compiler keep the accumulators in registers */
          if (tm == TM && tb == TILE_TB)
            tile(x, xs, TM, w, ps, TILE_TB, kn, init, acc + m);
          else if (tb == TILE_TB)
            switch (tm) {
              case 1: tile(x, xs, 1, w, ps, TILE_TB, kn, init, acc + m); break;
              case 2: tile(x, xs, 2, w, ps, TILE_TB, kn, init, acc + m); break;
#if TM > 4
              case 3: tile(x, xs, 3, w, ps, TILE_TB, kn, init, acc + m); break;
              case 4: tile(x, xs, 4, w, ps, TILE_TB, kn, init, acc + m); break;
              default: tile(x, xs, 5, w, ps, TILE_TB, kn, init, acc + m); break;
#else
              default: tile(x, xs, 3, w, ps, TILE_TB, kn, init, acc + m); break;
#endif
            }
          else
            for (int bb = 0; bb < tb; bb++) { /* the last < TILE_TB blocks, one at a time: their
                                                 sums go to column block bb of acc's rows */
              float(*dst)[TB][CB] = (float(*)[TB][CB])acc[m][bb];
              switch (tm) {
                case 1: tile(x, xs, 1, w + bb * ps, ps, 1, kn, init, dst); break;
                case 2: tile(x, xs, 2, w + bb * ps, ps, 1, kn, init, dst); break;
                case 3: tile(x, xs, 3, w + bb * ps, ps, 1, kn, init, dst); break;
                default: tile(x, xs, 4, w + bb * ps, ps, 1, kn, init, dst); break;
              }
            }
        }
      }
      for (int i = mb; i < me; i++)
        for (int bb = 0; bb < tb; bb++) {
          int n = (b + bb) * CB, cols = N - n < CB ? N - n : CB;
          char *dst = (char *)y + (i * ys + n) * Y_SIZE(y_bf16);
          store16(acc[i][bb], bias ? bias + n : NULL, cols, dst, y_bf16);
        }
    }
  }
  free(acc);
}

static void gemm_blocks(const act_t *act, int64_t xs, int M, int K2, const bf16 *P,
                        const float *bias, int N, int b0, int b1, void *y, int64_t ys, int y_bf16) {
  gemm_blocks_ps(act, xs, M, K2, P, (int64_t)K2 * 32, bias, N, b0, b1, y, ys, y_bf16);
}

#ifdef BF16_AMX
/* ---- AMX: the projections' GEMM on tiles ----
 * Tiles 0-3 hold float32 sums C (16 rows x 16 columns), 4-5 activation rows A (16 rows x 32
 * bf16: 16 k pairs), 6-7 weights B (16 k pairs x 16 columns x 2: 16 consecutive 64-byte rows of
 * a packed block, so the pair-packed layout is already the tile's). tdpbf16ps C += A B: per the
 * SDM, each C[m][n] adds A[m][2k] B[k][2n] + A[m][2k + 1] B[k][2n + 1] for k = 0..15 in order,
 * bf16 products exact in float32, input denormals read as zero, float32 sums rounded to nearest
 * even. A row's sums depend on its own activations only, never on the other rows of its tile,
 * so every M takes this path and a row's result is the same at any batch size (the tiles'
 * configured rows change with M, never the sums of a row).
 * Taken where K2 is a multiple of 16 (a k chunk is one tile); other shapes stay on vdpbf16ps. */
/* Tiles 0, 1 and 4 hold rows lo (1..16) of C and A, tiles 2, 3 and 5 rows hi (0: unused). */
static void amx_load_config(int lo, int hi) {
  uint8_t rows[8];
  uint16_t colsb[8];
  for (int t = 0; t < 8; t++) {
    rows[t] = (uint8_t)(t == 2 || t == 3 || t == 5 ? hi : t < 6 ? lo : 16);
    colsb[t] = 64;
  }
  amx_configure(rows, colsb);
}

static int amx_takes(int K2) { return K2 % 16 == 0 && K2 > 0 && amx_on(); }

/* 16 float32 sums v + bias to y[0 .. cols) as float32 or bf16 (nearest even, as f32_to_bf16). */
static inline void amx_store16(const float *v, const float *bias, int cols, void *y, int y_bf16) {
  if (cols < CB) {
    store16((float *)v, bias, cols, y, y_bf16);
    return;
  }
  __m512 s = _mm512_load_ps(v);
  if (bias) s = _mm512_add_ps(s, _mm512_loadu_ps(bias));
  if (y_bf16 == Y_BF16)
    _mm256_storeu_si256((__m256i *)y, bf16x16_pack(s));
  else if (y_bf16 == Y_ADD)
    _mm512_storeu_ps((float *)y, _mm512_add_ps(_mm512_loadu_ps((const float *)y), s));
  else
    _mm512_storeu_ps((float *)y, s);
}

/* Weight k chunks (1 KB a block) that a GEMM of at most 32 rows prefetches ahead: a decode
 * step's, which reads each weight once, from memory. On an Intel Xeon with AMX, 2 threads,
 * cpu_bf16_decode_micro.py --rev: 1.04x a step at 1 row, 1.14x at 8, 1.05x at 32; 8 ahead was
 * no better. Larger GEMMs read the weights again for each group of 32 rows, from cache, where
 * the prefetches cost (0.87x at 128 rows), so they take none. */
#ifndef AMX_PF
#define AMX_PF 4
#endif

/* Rows [m0, m0 + lo + hi) of y for column blocks [b0, b1), with the tile rows configured as
 * lo (<= 16) and hi (<= 16): two blocks at a time, the weights' k chunks streamed once; pf: k
 * chunks to prefetch ahead (0: none). Without prefetches (more than 32 rows: the GEMM reads the
 * weights again for each group of 32 rows) the weight tiles load with the T1 hint (tileloaddt1:
 * not to be reused soon), so that a column pair's weights stream past the activation rows
 * instead of evicting them from L1, where the next pair reads them again. On an Intel Xeon with
 * AMX, 2 threads, cpu_bf16_decode_micro.py --rev: a 128-token prefill 1.03-1.04x, 4 x 128
 * 1.05-1.07x, 1,024 tokens 1.07x, 32 decode rows with a 128-token prompt 1.06x; the same sums.
 * Decode steps (prefetched weights, read once) gained nothing from it in the micro-benchmark
 * (1.00-1.02x) and lost in served inter-token latency, so they keep plain loads. */
static void amx_group(const bf16 *act, int64_t xs, int m0, int lo, int hi, int K2, const bf16 *P,
                      int64_t ps, const float *bias, int N, int b0, int b1, void *y, int64_t ys,
                      int y_bf16, int pf) {
  float c[32][32] __attribute__((aligned(64)));
  const bf16 *x = act + m0 * xs, *x1 = x + 16 * xs;
  int64_t xsb = xs * (int64_t)sizeof(bf16);
  for (int b = b0; b < b1; b += 2) {
    int two = b + 1 < b1;
    const bf16 *w0 = P + b * ps, *w1 = w0 + ps;
    _tile_zero(0);
    _tile_zero(1);
    if (hi) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int kc = 0; kc < K2; kc += 16) {
      if (pf) { /* the weights pf k chunks ahead (w0's run on into w1's block, w1's into the next pair's) */
        prefetch_span(w0 + (kc + 16 * pf) * 32, 1024);
        if (two) prefetch_span(w1 + (kc + 16 * pf) * 32, 1024);
      }
      _tile_loadd(4, x + 2 * kc, xsb);
      if (pf)
        _tile_loadd(6, w0 + kc * 32, 64);
      else
        _tile_stream_loadd(6, w0 + kc * 32, 64);
      _tile_dpbf16ps(0, 4, 6);
      if (two) {
        if (pf)
          _tile_loadd(7, w1 + kc * 32, 64);
        else
          _tile_stream_loadd(7, w1 + kc * 32, 64);
        _tile_dpbf16ps(1, 4, 7);
      }
      if (hi) {
        _tile_loadd(5, x1 + 2 * kc, xsb);
        _tile_dpbf16ps(2, 5, 6);
        if (two) _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, &c[0][0], 128);
    if (two) _tile_stored(1, &c[0][16], 128);
    if (hi) {
      _tile_stored(2, &c[16][0], 128);
      if (two) _tile_stored(3, &c[16][16], 128);
    }
    for (int i = 0; i < lo + hi; i++) {
      int r = i < lo ? i : 16 + i - lo;
      for (int bb = 0; bb <= two; bb++) {
        int n = (b + bb) * CB, cols = N - n < CB ? N - n : CB;
        char *dst = (char *)y + ((m0 + i) * ys + n) * Y_SIZE(y_bf16);
        amx_store16(&c[r][bb * 16], bias ? bias + n : NULL, cols, dst, y_bf16);
      }
    }
  }
}

/* As gemm_blocks_ps (bf16 activations act [M][2 K2], row stride xs), column blocks [b0, b1):
 * groups of 32 rows, then the last M % 32 rows with the tile rows configured to fit them (a
 * tile load reads exactly its configured rows, never past row M). */
static void gemm_blocks_amx(const bf16 *act, int64_t xs, int M, int K2, const bf16 *P, int64_t ps,
                            const float *bias, int N, int b0, int b1, void *y, int64_t ys,
                            int y_bf16) {
  int full = M & ~31, rest = M - full, pf = M <= 32 ? AMX_PF : 0;
  if (full) {
    amx_load_config(16, 16);
    for (int m = 0; m < full; m += 32)
      amx_group(act, xs, m, 16, 16, K2, P, ps, bias, N, b0, b1, y, ys, y_bf16, pf);
  }
  if (rest) {
    int lo = rest > 16 ? 16 : rest;
    amx_load_config(lo, rest - lo);
    amx_group(act, xs, full, lo, rest - lo, K2, P, ps, bias, N, b0, b1, y, ys, y_bf16, pf);
  }
  _tile_release();
}
#endif

/* The projections' GEMM (act as gemm_blocks'): on AMX tiles where amx_takes(K2), else the
 * register tiles. The prefill attention's score GEMM (packed keys as the weight) takes it too;
 * its value GEMM calls gemm_blocks_amx itself (pf_pairs pads its k pairs to whole tiles). */
static void gemm_proj(const act_t *act, int64_t xs, int M, int K2, const bf16 *P,
                      const float *bias, int N, int b0, int b1, void *y, int64_t ys, int y_bf16) {
#ifdef BF16_AMX
  if (amx_takes(K2)) {
    gemm_blocks_amx(act, xs, M, K2, P, (int64_t)K2 * 32, bias, N, b0, b1, y, ys, y_bf16);
    return;
  }
#endif
  gemm_blocks(act, xs, M, K2, P, bias, N, b0, b1, y, ys, y_bf16);
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* When the last of nt equally fast threads finishes units of per column blocks (of NB, the last
 * unit the rest) by rows rows (of B, the last chunk the rest), taken column group by column group,
 * each thread taking the next unit as it frees up, in block-rows' time (B = rows = 1: units of
 * whole columns, in blocks' time). */
static int64_t units_makespan(int NB, int per, int B, int rows, int nt) {
  int64_t free_at[POOL_MAX] = {0}, end = 0;
  nt = nt < POOL_MAX ? nt : POOL_MAX;
  for (int b = 0; b < NB; b += per)
    for (int r = 0; r < B; r += rows) {
      int t = 0;
      for (int i = 1; i < nt; i++) t = free_at[i] < free_at[t] ? i : t;
      free_at[t] += (int64_t)(NB - b < per ? NB - b : per) * (B - r < rows ? B - r : rows);
      end = free_at[t] > end ? free_at[t] : end;
    }
  return end;
}

/* Column blocks per unit for NB blocks on nt threads, whole tiles: of the unit sizes that give
 * each thread 2 to 8 units, the one whose units end soonest, split evenly (36 blocks on 2
 * threads as 6 units of 6, not 8 of 5 where one thread does 20 and the other 16); on ties the
 * one nearest 4 units a thread (a helper kept off its core then costs the caller less). */
static int unit_blocks(int NB, int nt) {
  nt = nt < POOL_MAX ? nt : POOL_MAX; /* as pool_run runs it */
  int best = ceil_div(ceil_div(NB, 4 * nt), TILE_TB) * TILE_TB;
  int64_t best_t = units_makespan(NB, best, 1, 1, nt);
  double best_d = fabs(log((double)ceil_div(NB, best) / (4.0 * nt)));
  for (int per = TILE_TB; per <= NB; per += TILE_TB) {
    int units = ceil_div(NB, per);
    if (units > 8 * nt || units < 2 * nt) continue;
    int64_t t = units_makespan(NB, per, 1, 1, nt);
    double d = fabs(log((double)units / (4.0 * nt)));
    if (t < best_t || (t == best_t && d < best_d)) {
      best = per;
      best_t = t;
      best_d = d;
    }
  }
  return best;
}

/* The o and down projections' units over B rows of an extend step: column groups of *per
 * blocks (of NB) by *rows rows, where splitting the rows too evens out the threads' shares (the
 * 36 blocks of a 576-wide output make 5 units of 4 and 4 on 2 threads, 20 block-times against
 * 18; as 9 column groups by 2 row halves, 9 and 9). Row chunks of 32 rows or more, a multiple of
 * the register tile. Prefill of 4 x 128 and 2 x 128 tokens: 1.02-1.03x a step; a decode step
 * (32 rows) keeps its whole rows (its weights stream from memory once per column group). */
static void residual_units(int *per, int *rows, int NB, int B, int nt) {
  int64_t best = units_makespan(NB, *per, B, B, nt);
  for (int nr = 2; nr <= 4; nr++) {
    int r = ceil_div(ceil_div(B, nr), TM) * TM;
    if (r < 32 || r >= B) continue;
    for (int p = TILE_TB; p <= NB; p += TILE_TB) {
      int64_t t = units_makespan(NB, p, B, r, nt);
      if (ceil_div(NB, p) * ceil_div(B, r) <= 8 * nt && t < best) {
        best = t;
        *per = p;
        *rows = r;
      }
    }
  }
}

typedef struct {
  const void *x;
  int x_bf16;
  int64_t x_stride;
  int M, K, K2, N, NB, per; /* per: column blocks per unit */
  act_t *act;
  const bf16 *P;
  const float *bias;
  void *y;
  int y_bf16;
  int64_t y_stride;
} gemm_job;

static void gemm_act_unit(void *p, int u, int w) { /* 64 activation rows */
  const gemm_job *g = (const gemm_job *)p;
  (void)w;
  for (int m = u * 64; m < g->M && m < (u + 1) * 64; m++)
    act_row((const char *)g->x + (int64_t)m * g->x_stride * (g->x_bf16 ? 2 : 4), g->x_bf16, g->K,
            g->act + (int64_t)m * 2 * g->K2);
}

static void gemm_unit(void *p, int u, int w) {
  const gemm_job *g = (const gemm_job *)p;
  int b0 = u * g->per, b1 = b0 + g->per < g->NB ? b0 + g->per : g->NB;
  (void)w;
  gemm_proj(g->act, 2 * g->K2, g->M, g->K2, g->P, g->bias, g->N, b0, b1, g->y, g->y_stride,
            g->y_bf16);
}

/* y [M, N] = x [M, K] . W^T (+ bias), W pair-packed. x float32 or bf16 (x_bf16), row stride
 * x_stride; y float32 or bf16 (y_bf16), row stride y_stride; bias float32 [N] or NULL. Units of
 * the pool: groups of column blocks (unit_blocks: split evenly, about four per thread). */
void infer_bf16_gemm(const void *x, int x_bf16, int64_t x_stride, int M, int K, const bf16 *P,
                     const float *bias, int N, void *y, int y_bf16, int64_t y_stride) {
  int K2 = (K + 1) / 2, NB = (N + CB - 1) / CB, nt = g_threads, per = unit_blocks(NB, nt);
  gemm_job g = {x, x_bf16, x_stride, M, K, K2, N, NB, per,
                (act_t *)malloc(sizeof(act_t) * (size_t)M * 2 * K2), P, bias, y, y_bf16, y_stride};
  pool_run(gemm_act_unit, &g, (M + 63) / 64, (int64_t)M * K >= 65536 ? nt : 1);
  pool_run(gemm_unit, &g, (NB + per - 1) / per, nt);
  free(g.act);
}

/* ---- row ops of bf16 models' per-op path, rounded where the torch references round ---- */

/* out = w * rms_normed(x) per row, as infer.core.ops.layer_ops.rms_norm_ref computes it: with a
 * residual, x + residual first (rounded to bf16 when x is bf16; the sum is res_out); the normed
 * row in float32, rounded to x's dtype, times w in the result dtype (bf16 only when x and w both
 * are). x, residual, res_out: x's dtype; w: bf16 when w_bf16; out: bf16 when x_bf16 && w_bf16. */
typedef struct {
  const void *x, *residual, *w;
  int64_t x_stride, r_stride;
  int x_bf16, w_bf16, rows, dim;
  void *res_out, *out;
  float eps;
} norm_job;

static void rms_norm_unit(void *p, int u, int worker) { /* 16 rows */
  const norm_job *j = (const norm_job *)p;
  const void *x = j->x, *residual = j->residual, *w = j->w;
  void *res_out = j->res_out, *out = j->out;
  int64_t x_stride = j->x_stride, r_stride = j->r_stride;
  int x_bf16 = j->x_bf16, w_bf16 = j->w_bf16, dim = j->dim, out_bf16 = x_bf16 && w_bf16;
  float *s = (float *)malloc(sizeof(float) * (size_t)dim);
  (void)worker;
  for (int m = u * 16; m < j->rows && m < (u + 1) * 16; m++) {
#if defined(__AVX512F__)
    if (out_bf16 && dim % 16 == 0) { /* bf16 rows and weight: the same roundings, 16 lanes */
      const bf16 *xr = (const bf16 *)x + (int64_t)m * x_stride;
      const bf16 *rr = residual ? (const bf16 *)residual + (int64_t)m * r_stride : NULL;
      bf16 *ro = residual ? (bf16 *)res_out + (int64_t)m * dim : NULL, *o = (bf16 *)out + (int64_t)m * dim;
      __m512 acc = _mm512_setzero_ps();
      for (int i = 0; i < dim; i += 16) {
        __m512 v = bf16x16_load(xr + i);
        if (rr) {
          __m256i r16 = bf16x16_pack(_mm512_add_ps(v, bf16x16_load(rr + i)));
          _mm256_storeu_si256((__m256i *)(ro + i), r16);
          v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r16), 16));
        }
        _mm512_storeu_ps(s + i, v);
        acc = _mm512_fmadd_ps(v, v, acc);
      }
      __m512 r = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + j->eps));
      for (int i = 0; i < dim; i += 16) {
        __m512 n = bf16x16_round(_mm512_mul_ps(_mm512_loadu_ps(s + i), r));
        _mm256_storeu_si256((__m256i *)(o + i), bf16x16_pack(_mm512_mul_ps(bf16x16_load((const bf16 *)w + i), n)));
      }
      continue;
    }
#endif
    float ss = 0.f;
    for (int i = 0; i < dim; i++) {
      int64_t xi = (int64_t)m * x_stride + i, ri = (int64_t)m * r_stride + i;
      float v = x_bf16 ? bf16_to_f32(((const bf16 *)x)[xi]) : ((const float *)x)[xi];
      if (residual) {
        v += x_bf16 ? bf16_to_f32(((const bf16 *)residual)[ri]) : ((const float *)residual)[ri];
        if (x_bf16) {
          bf16 r = f32_to_bf16(v);
          ((bf16 *)res_out)[(int64_t)m * dim + i] = r;
          v = bf16_to_f32(r);
        } else {
          ((float *)res_out)[(int64_t)m * dim + i] = v;
        }
      }
      s[i] = v;
      ss += v * v;
    }
    float r = 1.f / sqrtf(ss / (float)dim + j->eps);
    for (int i = 0; i < dim; i++) {
      float n = s[i] * r, wi = w_bf16 ? bf16_to_f32(((const bf16 *)w)[i]) : ((const float *)w)[i];
      if (x_bf16) n = bf16_to_f32(f32_to_bf16(n));
      if (out_bf16)
        ((bf16 *)out)[(int64_t)m * dim + i] = f32_to_bf16(wi * n);
      else
        ((float *)out)[(int64_t)m * dim + i] = wi * n;
    }
  }
  free(s);
}

void infer_bf16_rms_norm(const void *x, int64_t x_stride, int x_bf16, const void *residual,
                         int64_t r_stride, void *res_out, const void *w, int w_bf16, void *out,
                         int rows, int dim, float eps) {
  norm_job j = {x, residual, w, x_stride, r_stride, x_bf16, w_bf16, rows, dim, res_out, out, eps};
  pool_run(rms_norm_unit, &j, (rows + 15) / 16, (int64_t)rows * dim >= 65536 ? g_threads : 1);
}

/* In-place rotate-half rotary of bf16 q [T, H, D] and k [T, Hkv, D] (row strides q_stride,
 * k_stride; heads contiguous) over the first rot dims, as rotary_ref does in bf16: cos and sin
 * rounded to bf16, x * cos and rotate_half(x) * sin each rounded, then their sum. */
typedef struct {
  const int64_t *pos;
  bf16 *q, *k;
  int64_t q_stride, k_stride;
  int H, Hkv, T, D, rot;
  const float *cos_sin;
} rope_job;

static void rope_unit(void *p, int u, int worker) { /* 16 tokens */
  const rope_job *j = (const rope_job *)p;
  int half = j->rot / 2, H = j->H, D = j->D;
  (void)worker;
  for (int t = u * 16; t < j->T && t < (u + 1) * 16; t++) {
    const float *cs = j->cos_sin + j->pos[t] * j->rot;
    for (int h = 0; h < H + j->Hkv; h++) {
      bf16 *v = h < H ? j->q + (int64_t)t * j->q_stride + (int64_t)h * D
                      : j->k + (int64_t)t * j->k_stride + (int64_t)(h - H) * D;
      for (int i = 0; i < half; i++) {
        float c = bf16_to_f32(f32_to_bf16(cs[i])), sn = bf16_to_f32(f32_to_bf16(cs[half + i]));
        float x1 = bf16_to_f32(v[i]), x2 = bf16_to_f32(v[i + half]);
        float a1 = bf16_to_f32(f32_to_bf16(x1 * c)), b1 = bf16_to_f32(f32_to_bf16(-x2 * sn));
        float a2 = bf16_to_f32(f32_to_bf16(x2 * c)), b2 = bf16_to_f32(f32_to_bf16(x1 * sn));
        v[i] = f32_to_bf16(a1 + b1);
        v[i + half] = f32_to_bf16(a2 + b2);
      }
    }
  }
}

void infer_bf16_rope(const int64_t *pos, bf16 *q, int64_t q_stride, int H, bf16 *k,
                     int64_t k_stride, int Hkv, int T, int D, int rot, const float *cos_sin) {
  rope_job j = {pos, q, k, q_stride, k_stride, H, Hkv, T, D, rot, cos_sin};
  pool_run(rope_unit, &j, (T + 15) / 16, (int64_t)T * (H + Hkv) * rot >= 65536 ? g_threads : 1);
}

typedef struct {
  const bf16 *x;
  int64_t x_stride;
  bf16 *out;
  int T, I;
} silu_job;

static void silu_unit(void *p, int u, int w) { /* 16 rows */
  const silu_job *j = (const silu_job *)p;
  (void)w;
  for (int t = u * 16; t < j->T && t < (u + 1) * 16; t++) {
    const bf16 *g = j->x + (int64_t)t * j->x_stride;
    bf16 *o = j->out + (int64_t)t * j->I;
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= j->I; i += 16) {
      __m512 sl = bf16x16_round(vm_silu16(bf16x16_load(g + i)));
      _mm256_storeu_si256((__m256i *)(o + i), bf16x16_pack(_mm512_mul_ps(sl, bf16x16_load(g + j->I + i))));
    }
#endif
    for (; i < j->I; i++) {
      float sl = bf16_to_f32(f32_to_bf16(vm_silu(bf16_to_f32(g[i]))));
      o[i] = f32_to_bf16(sl * bf16_to_f32(g[j->I + i]));
    }
  }
}

/* out [T, I] = silu(x[:, :I]) * x[:, I:] for bf16 x (row stride x_stride): silu rounded to bf16,
 * then the product rounded (F.silu and the multiply of the reference). */
void infer_bf16_silu_mul(const bf16 *x, int64_t x_stride, bf16 *out, int T, int I) {
  silu_job j = {x, x_stride, out, T, I};
  pool_run(silu_unit, &j, (T + 15) / 16, (int64_t)T * I >= 65536 ? g_threads : 1);
}

/* ---- the residual add of the per-op path: out = a + b, bf16 or float32 ---- */
typedef struct {
  const void *a, *b;
  void *out;
  int64_t n;
  int is_bf16;
} add_job;

#define ADD_UNIT 16384 /* elements per unit */

static void add_unit(void *p, int u, int w) {
  const add_job *j = (const add_job *)p;
  int64_t i = (int64_t)u * ADD_UNIT, e = i + ADD_UNIT < j->n ? i + ADD_UNIT : j->n;
  (void)w;
  if (j->is_bf16) { /* float32 sum rounded to bf16 (nearest even), as torch's bf16 add */
    const bf16 *a = (const bf16 *)j->a, *b = (const bf16 *)j->b;
    bf16 *o = (bf16 *)j->out;
#if defined(__AVX512F__)
    for (; i + 16 <= e; i += 16)
      _mm256_storeu_si256((__m256i *)(o + i), bf16x16_pack(_mm512_add_ps(bf16x16_load(a + i), bf16x16_load(b + i))));
#endif
    for (; i < e; i++) o[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
  } else {
    const float *a = (const float *)j->a, *b = (const float *)j->b;
    float *o = (float *)j->out;
    for (; i < e; i++) o[i] = a[i] + b[i];
  }
}

/* out [n] = a [n] + b [n], all bf16 (is_bf16) or all float32, contiguous; on the work pool. */
void infer_bf16_add(const void *a, const void *b, void *out, int64_t n, int is_bf16) {
  add_job j = {a, b, out, n, is_bf16};
  int units = (int)((n + ADD_UNIT - 1) / ADD_UNIT);
  pool_run(add_unit, &j, units, units > 1 ? g_threads : 1);
}

/* ---- decode attention over a paged bf16 cache ---- */

/* q . k for q float32 [D], k bf16 [D]. */
static inline float dot_qk(const float *q, const bf16 *k, int D) {
  int d = 0;
  float s = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), bf16x16_load(k + d), acc);
  s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), vm_bf16x8_load(k + d), acc);
  float t[8];
  _mm256_storeu_ps(t, acc);
  for (int i = 0; i < 8; i++) s += t[i];
#endif
  for (; d < D; d++) s += q[d] * bf16_to_f32(k[d]);
  return s;
}

/* o += p * v for o float32 [D], v bf16 [D]. */
static inline void axpy_v(float *o, float p, const bf16 *v, int D) {
  int d = 0;
#if defined(__AVX512F__)
  __m512 pv = _mm512_set1_ps(p);
  for (; d + 16 <= D; d += 16)
    _mm512_storeu_ps(o + d, _mm512_fmadd_ps(pv, bf16x16_load(v + d), _mm512_loadu_ps(o + d)));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 pv = _mm256_set1_ps(p);
  for (; d + 8 <= D; d += 8)
    _mm256_storeu_ps(o + d, _mm256_fmadd_ps(pv, vm_bf16x8_load(v + d), _mm256_loadu_ps(o + d)));
#endif
  for (; d < D; d++) o[d] += p * bf16_to_f32(v[d]);
}

/* Position j's head g (D values) in a paged cache [pages, page, Hkv, D] (row = Hkv D) through
 * a sequence's block table bt. */
static inline const bf16 *kv_at(const bf16 *cache, const int32_t *bt, int page, int64_t row, int j,
                                int g, int D) {
  return cache + ((int64_t)bt[j / page] * page + j % page) * row + (int64_t)g * D;
}

typedef struct {
  const float *q; /* [B, q_stride], query heads h at q + h D */
  int64_t q_stride;
  const bf16 *k_cache, *v_cache; /* [pages, page, Hkv, D] */
  const int32_t *block_tables;   /* [B, bt_stride] page ids */
  int64_t bt_stride;
  const int32_t *seq_lens; /* [B], including the new token */
  bf16 *out;               /* [B, H * D]: the o projection's input, rounded to bf16 */
  int H, Hkv, D, page;
  float scale;
} bf16_attn;

/* Unit u = (sequence b, KV head g): its H / Hkv query heads over the sequence's keys and values.
 * s: scratch of (H / Hkv) * seq_len floats; o: scratch of (H / Hkv) * D floats. */
#if defined(__AVX512F__)
/* r[i] = the sum of v[i]'s 16 lanes, i < 16: a transposing tree of 15 adds (each level halves
 * the vectors and doubles the lanes that hold one vector's partial sums), then one permute puts
 * vector i's sum in lane i. */
static inline __m512 reduce16x16(const __m512 v[16]) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; i++) /* chunks: v_i, v_i, v_i+8, v_i+8 (8 partials each) */
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
  for (int i = 0; i < 4; i++) /* chunks: v_i, v_i+8, v_i+4, v_i+12 (4 partials each) */
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[i], w[i + 4], 0x88), _mm512_shuffle_f32x4(w[i], w[i + 4], 0xDD));
  for (int i = 0; i < 2; i++) /* per chunk: x_i's vector (2 partials), x_i+2's (2 partials) */
    y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[i], x[i + 2], 0x88), _mm512_shuffle_ps(x[i], x[i + 2], 0xDD));
  /* per chunk c, position p: the total of x_{0,2,1,3}[p]'s vector in chunk c */
  __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  const __m512i at = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  return _mm512_permutexvar_ps(at, z);
}

#ifndef ATTN_PF
#define ATTN_PF 16 /* keys ahead that attend_regs prefetches (batch 32, 192 keys: 1.04-1.18x a step over 8; 32 was no better) */
#endif

/* attend_unit for D = 16 NC and G heads with the queries (G NC vectors) and the outputs (G NC
 * accumulators) in registers: scores 16 keys at a time (each key's G lane-wise products kept,
 * then reduced together), the softmax numerators in place, then o_h = sum_j e_hj v_j / sum_j e_hj.
 * Inlined with constant NC and G. */
static inline __attribute__((always_inline)) void attend_regs(const bf16_attn *a, int r, int b,
                                                               int g, float *s, int NC, int G) {
  int D = a->D, L = a->seq_lens[b];
  const float *q = a->q + r * a->q_stride + (int64_t)g * G * D;
  const int32_t *bt = a->block_tables + b * a->bt_stride;
  int64_t row = (int64_t)a->Hkv * D;
  __m512 qv[4][8], part[4][16], acc[4][8];
  for (int h = 0; h < G; h++)
    for (int c = 0; c < NC; c++) qv[h][c] = _mm512_loadu_ps(q + h * D + 16 * c);
  for (int j0 = 0; j0 < L; j0 += 16) {
    int n = L - j0 < 16 ? L - j0 : 16;
    for (int jj = 0; jj < 16; jj++) {
      if (jj >= n) {
        for (int h = 0; h < G; h++) part[h][jj] = _mm512_setzero_ps();
        continue;
      }
      int j = j0 + jj;
      const bf16 *k = kv_at(a->k_cache, bt, a->page, row, j, g, D);
      if (j + ATTN_PF < L) /* the key ATTN_PF ahead (D bf16: 32 NC bytes), a page table walk away */
        prefetch_span(kv_at(a->k_cache, bt, a->page, row, j + ATTN_PF, g, D), 32 * NC);
      __m512 kv[8];
      for (int c = 0; c < NC; c++) kv[c] = bf16x16_load(k + 16 * c);
      for (int h = 0; h < G; h++) {
        __m512 t = _mm512_mul_ps(qv[h][0], kv[0]);
        for (int c = 1; c < NC; c++) t = _mm512_fmadd_ps(qv[h][c], kv[c], t);
        part[h][jj] = t;
      }
    }
    for (int h = 0; h < G; h++) _mm512_mask_storeu_ps(s + h * L + j0, (__mmask16)((1u << n) - 1), reduce16x16(part[h]));
  }
  float inv[4];
  for (int h = 0; h < G; h++) {
    float *sh = s + h * L, mx = vm_max(sh, L);
    inv[h] = 1.f / vm_exp_sub(sh, L, a->scale, mx * a->scale);
    for (int c = 0; c < NC; c++) acc[h][c] = _mm512_setzero_ps();
  }
  for (int j = 0; j < L; j++) {
    const bf16 *v = kv_at(a->v_cache, bt, a->page, row, j, g, D);
    if (j + ATTN_PF < L) prefetch_span(kv_at(a->v_cache, bt, a->page, row, j + ATTN_PF, g, D), 32 * NC);
    __m512 vv[8];
    for (int c = 0; c < NC; c++) vv[c] = bf16x16_load(v + 16 * c);
    for (int h = 0; h < G; h++) {
      __m512 p = _mm512_set1_ps(s[h * L + j]);
      for (int c = 0; c < NC; c++) acc[h][c] = _mm512_fmadd_ps(p, vv[c], acc[h][c]);
    }
  }
  bf16 *dst = a->out + (int64_t)r * a->H * D + (int64_t)g * G * D;
  for (int h = 0; h < G; h++)
    for (int c = 0; c < NC; c++)
      _mm256_storeu_si256((__m256i *)(dst + h * D + 16 * c),
                          bf16x16_pack(_mm512_mul_ps(acc[h][c], _mm512_set1_ps(inv[h]))));
}
#endif

#ifdef INFER_ATTN_TILES
/* The AVX2 register tiles (infer_cpu_attn.h) for query row r of sequence b over KV heads
 * [g0, g1): out's bf16 values of their query heads. s: scratch of (g1 - g0) (H / Hkv) seq_len
 * floats; o: of (g1 - g0) (H / Hkv) D; inv: of (g1 - g0) (H / Hkv). 0 where the tiles do not
 * apply (D not a multiple of 32, more than 64 query heads a KV head, no memory for the offsets). */
static int attend_tiles(const bf16_attn *a, int r, int b, int g0, int g1, float *s, float *o,
                        float *inv) {
  int G = a->H / a->Hkv, D = a->D, L = a->seq_lens[b];
  if (D % 32 != 0 || G > 64) return 0;
  int64_t obuf[1024], *off = L <= 1024 ? obuf : malloc(sizeof(int64_t) * (size_t)L);
  if (!off) return 0;
  attn_row_offsets(a->block_tables + b * a->bt_stride, a->page, (int64_t)a->Hkv * D, L, off);
  attn_kv_groups(a->q + r * a->q_stride + (int64_t)g0 * G * D, g0, g1, G, a->k_cache, a->v_cache,
                 1, off, L, D, a->scale, s, o, inv, o);
  if (off != obuf) free(off);
  bf16 *dst = a->out + (int64_t)r * a->H * D + (int64_t)g0 * G * D;
  for (int64_t i = 0; i < (int64_t)(g1 - g0) * G * D; i++) dst[i] = f32_to_bf16(o[i]);
  return 1;
}
#endif

/* Query row r (q and out) of sequence b (its length and pages), KV head g's query heads over
 * the sequence's keys: the decode attention. s: scratch of (H / Hkv) * seq_len floats; o: of
 * (H / Hkv) * D floats. */
static void attend_row(const bf16_attn *a, int r, int b, int g, float *s, float *o) {
  int G = a->H / a->Hkv, D = a->D, L = a->seq_lens[b];
#if defined(__AVX512F__)
  /* register budget: G NC queries + G NC accumulators + NC loads (+ 16 G partials, spilled) */
  switch (D == 64 && G <= 4 ? G : D == 128 && G <= 2 ? 4 + G : D == 32 && G <= 4 ? 6 + G : 0) {
    case 1: attend_regs(a, r, b, g, s, 4, 1); return;
    case 2: attend_regs(a, r, b, g, s, 4, 2); return;
    case 3: attend_regs(a, r, b, g, s, 4, 3); return;
    case 4: attend_regs(a, r, b, g, s, 4, 4); return;
    case 5: attend_regs(a, r, b, g, s, 8, 1); return;
    case 6: attend_regs(a, r, b, g, s, 8, 2); return;
    case 7: attend_regs(a, r, b, g, s, 2, 1); return;
    case 8: attend_regs(a, r, b, g, s, 2, 2); return;
    case 9: attend_regs(a, r, b, g, s, 2, 3); return;
    case 10: attend_regs(a, r, b, g, s, 2, 4); return;
    default: break;
  }
#endif
  const float *q = a->q + r * a->q_stride + (int64_t)g * G * D;
  const int32_t *bt = a->block_tables + b * a->bt_stride;
  int64_t row = (int64_t)a->Hkv * D;
#ifdef INFER_ATTN_TILES
  float inv[64];
  if (attend_tiles(a, r, b, g, g + 1, s, o, inv)) return;
#endif
  for (int j = 0; j < L; j++) {
    const bf16 *k = kv_at(a->k_cache, bt, a->page, row, j, g, D);
    for (int h = 0; h < G; h++) s[h * L + j] = a->scale * dot_qk(q + h * D, k, D);
  }
  for (int h = 0; h < G; h++) {
    float *sh = s + h * L, mx = vm_max(sh, L), sum = 0.f;
    sum = vm_exp_sub(sh, L, 1.f, mx);
    float inv = 1.f / sum;
    for (int j = 0; j < L; j++) sh[j] *= inv;
  }
  memset(o, 0, sizeof(float) * (size_t)G * D);
  for (int j = 0; j < L; j++) {
    const bf16 *v = kv_at(a->v_cache, bt, a->page, row, j, g, D);
    for (int h = 0; h < G; h++) axpy_v(o + h * D, s[h * L + j], v, D);
  }
  bf16 *dst = a->out + (int64_t)r * a->H * D + (int64_t)g * G * D;
  for (int i = 0; i < G * D; i++) dst[i] = f32_to_bf16(o[i]);
}

/* Unit u = (sequence b, KV head g) of a decode batch (row b is sequence b). */
static void attend_unit(const bf16_attn *a, int u, float *s, float *o) {
  attend_row(a, u / a->Hkv, u / a->Hkv, u % a->Hkv, s, o);
}

/* decode batches of at least this many rows attend in a phase of their own, each row over all
 * its KV heads (measured on Zen 3, 2 threads, 192 keys, cpu_bf16_decode_micro.py: 1.02-1.04x a
 * step at 1 row, 1.08x at 2, 1.12x at 4, 1.19x at 8, 1.13x at 32); the tests build a library
 * with a larger value for the per-head path */
#ifndef ATTN_APART_ROWS
#define ATTN_APART_ROWS 1
#endif

/* Query row r of sequence b over every KV head: attend_row for each g, except that the AVX2
 * tiles take all the heads in one call, which reads each position's row (all its heads) at once
 * in short blocks (infer_cpu_attn.h): the same bits as one call per head. s: scratch of H *
 * seq_len floats; o: of H * D + H. */
static void attend_row_heads(const bf16_attn *a, int r, int b, float *s, float *o) {
#if !defined(__AVX512F__) && defined(INFER_ATTN_TILES)
  if (attend_tiles(a, r, b, 0, a->Hkv, s, o, o + (int64_t)a->H * a->D)) return;
#endif
  for (int g = 0; g < a->Hkv; g++) attend_row(a, r, b, g, s, o);
}

/* ---- prefill / extend attention over a paged bf16 cache (the per-op path's backend) ----
 * Sequence s has ext_lens[s] query rows (packed after the previous sequences' rows) at positions
 * prefix .. seq_len - 1, prefix = seq_lens[s] - ext_lens[s]; row t sees keys 0 .. prefix + t.
 * A work unit is (sequence, KV head g, block of up to QB query rows): the keys it needs
 * (0 .. prefix + t1 - 1) are packed once into the GEMM's pair layout (K as a weight of N = keys
 * columns over D, V^T as a weight of D columns over keys), then the group's G heads x rows go
 * through the bf16 GEMM twice: scores = q K^T (float32), masked per row, exp(s - max) in float32
 * rounded to bf16 (values in (0, 1], as torch's CPU flash attention rounds them), out = e V
 * (float32 sums) divided by the float32 sum of the unrounded exps, then rounded to bf16. */
#define QB 32

typedef struct {
  const bf16 *q; /* [T, q_stride]: head h of row t at q + t q_stride + h D */
  int64_t q_stride;
  const bf16 *k_cache, *v_cache; /* [pages, page, Hkv, D] */
  const int32_t *block_tables;
  int64_t bt_stride;
  const int32_t *seq_lens, *ext_lens, *row0; /* per sequence; row0: its first packed row */
  bf16 *out;                                 /* [T, H * D] */
  int H, Hkv, D, page;
  float scale;
} bf16_prefill;

/* Scratch of one thread, grown as units need it. */
typedef struct {
  act_t *qa, *pa;
  float *s, *o;
  size_t qa_n, pa_n, s_n, o_n;
} pf_scratch;

static void *grow(void *p, size_t *have, size_t need, size_t elem) {
  if (need <= *have) return p;
  free(p);
  *have = need;
  return malloc(need * elem);
}

/* The prefill attention's score and value GEMMs on AMX tiles where the CPU has them (0: on
 * vdpbf16ps, for A/Bs). Intel Xeon with AMX, 2 threads, cpu_bf16_decode_micro.py's prefill:
 * 1.08-1.11x a 128-token prefill, 1.32x a 512-token one. Sums in the tiles' order: the bits
 * differ from vdpbf16ps's (within the kernel tests' bounds), a row's do not depend on the batch. */
#ifndef PF_AMX
#define PF_AMX 1
#endif
/* The k pairs the prefill attention's value GEMM reads for L keys: ceil(L / 2), rounded up to
 * a whole AMX tile's 16 where the AMX tiles take it (the pairs past the keys are zeros in the
 * packed values and in the probability rows). */
static int pf_pairs(int L) {
  int p = (L + 1) / 2;
#ifdef BF16_AMX
  if (PF_AMX && amx_on()) p = (p + 15) & ~15;
#endif
  return p;
}

/* The keys 0 .. seq_lens[seq] - 1 of KV head g packed for the two GEMMs: K as a weight of one
 * column per key over D (kp: [ceil(L / 16)][D2][16][2]), V^T as a weight of D columns over the
 * keys (vp: [NBd][L2][16][2], L2 = ceil(L / 2)); zeros past L and D. Once per (sequence, KV
 * group), shared by its query blocks. */
static void pack_kv(const bf16_prefill *a, int seq, int g, bf16 *kp, bf16 *vp) {
  int D = a->D, D2 = (D + 1) / 2, L = a->seq_lens[seq], L2 = pf_pairs(L);
  int NBk = (L + CB - 1) / CB, NBd = (D + CB - 1) / CB;
  int64_t row = (int64_t)a->Hkv * D;
  const int32_t *bt = a->block_tables + (int64_t)seq * a->bt_stride;
  memset(kp, 0, sizeof(bf16) * (size_t)NBk * D2 * 32);
  memset(vp, 0, sizeof(bf16) * (size_t)NBd * L2 * 32);
  for (int j = 0; j < L; j++) { /* key j: K column j, its (d, d + 1) pairs as 32-bit words */
    const bf16 *kr = kv_at(a->k_cache, bt, a->page, row, j, g, D);
    bf16 *kd = kp + ((int64_t)(j / CB) * D2 * CB + j % CB) * 2;
    int d = 0;
    for (; d + 2 <= D; d += 2) memcpy(kd + (int64_t)(d / 2) * 32, kr + d, 4);
    if (d < D) kd[(int64_t)(d / 2) * 32] = kr[d];
  }
  for (int j = 0; j < L; j += 2) { /* keys j, j + 1: V^T's k pair j / 2, 16 columns at a time */
    const bf16 *v0 = kv_at(a->v_cache, bt, a->page, row, j, g, D);
    const bf16 *v1 = j + 1 < L ? kv_at(a->v_cache, bt, a->page, row, j + 1, g, D) : NULL;
    for (int db = 0; db < NBd; db++) {
      bf16 *dst = vp + ((int64_t)db * L2 + j / 2) * 32;
      int d0 = db * CB;
#if defined(__AVX512BW__)
      if (d0 + CB <= D && v1) { /* interleave v0[d0 ..] and v1[d0 ..] 16-bit-wise */
        static const int16_t order[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                          8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
        const __m512i mix = _mm512_loadu_si512((const void *)order);
        __m512i x0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(v0 + d0)));
        __m512i x1 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(v1 + d0)));
        _mm512_storeu_si512((void *)dst, _mm512_permutex2var_epi16(x0, mix, x1));
        continue;
      }
#endif
      for (int dd = 0; dd < CB && d0 + dd < D; dd++) {
        dst[2 * dd] = v0[d0 + dd];
        dst[2 * dd + 1] = v1 ? v1[d0 + dd] : 0;
      }
    }
  }
}

/* s[j] *= scale for j < n; returns the largest (NaNs skipped, as `s > mx ? s : mx` skips them:
 * max_ps returns its second operand when either is NaN). Any order gives the same maximum, so the
 * 16-lane form has the scalar loop's result (a single chain of dependent max ops, 4 cycles each,
 * was 40 % of a 128-token prefill's attention). */
static inline float scale_max(float *s, int n, float scale) {
  int j = 0;
  float mx = -INFINITY;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
  for (; j + 16 <= n; j += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + j), sc);
    _mm512_storeu_ps(s + j, v);
    m = _mm512_max_ps(v, m);
  }
  mx = _mm512_reduce_max_ps(m);
#endif
  for (; j < n; j++) {
    s[j] *= scale;
    mx = s[j] > mx ? s[j] : mx;
  }
  return mx;
}

/* Query rows [t0, t1) of sequence seq, KV head g, against its packed keys (pack_kv). */
static void prefill_unit(const bf16_prefill *a, int seq, int g, int t0, int t1, pf_scratch *w,
                         const bf16 *kp, const bf16 *vp) {
  int D = a->D, G = a->H / a->Hkv, D2 = (D + 1) / 2, ext = a->ext_lens[seq];
  int prefix = a->seq_lens[seq] - ext, L = prefix + t1, L2 = pf_pairs(L), qn = t1 - t0;
  int NBk = (L + CB - 1) / CB, NBd = (D + CB - 1) / CB, M = qn * G;
  int64_t vps = (int64_t)pf_pairs(a->seq_lens[seq]) * 32; /* vp's block stride: all its keys */
  w->qa = (act_t *)grow(w->qa, &w->qa_n, (size_t)M * 2 * D2, sizeof(act_t));
  w->pa = (act_t *)grow(w->pa, &w->pa_n, (size_t)M * 2 * L2, sizeof(act_t));
  w->s = (float *)grow(w->s, &w->s_n, (size_t)M * L, sizeof(float));
  w->o = (float *)grow(w->o, &w->o_n, (size_t)M * D, sizeof(float));
  /* rows r = tt * G + hh: query head g G + hh of row t0 + tt */
  for (int tt = 0; tt < qn; tt++)
    for (int hh = 0; hh < G; hh++)
      act_row(a->q + (int64_t)(a->row0[seq] + t0 + tt) * a->q_stride + (int64_t)(g * G + hh) * D, 1,
              D, w->qa + (int64_t)(tt * G + hh) * 2 * D2);
  if (PF_AMX) /* the packed keys are a weight of L columns: AMX tiles where they take D2 */
    gemm_proj(w->qa, 2 * D2, M, D2, kp, NULL, L, 0, NBk, w->s, L, 0);
  else
    gemm_blocks(w->qa, 2 * D2, M, D2, kp, NULL, L, 0, NBk, w->s, L, 0);
  for (int r = 0; r < M; r++) {
    int seen = prefix + t0 + r / G + 1; /* causal: keys 0 .. own position */
    float *sr = w->s + (int64_t)r * L;
    float sum = vm_exp_sub(sr, seen, 1.f, scale_max(sr, seen, a->scale));
    act_t *pr = w->pa + (int64_t)r * 2 * L2;
    round_row(sr, seen, pr);
    for (int j = seen; j < 2 * L2; j++) pr[j] = 0;
    sr[0] = 1.f / sum; /* the row's scores are spent: keep its normaliser there */
  }
#ifdef BF16_AMX
  if (PF_AMX && amx_takes(L2))
    gemm_blocks_amx(w->pa, 2 * L2, M, L2, vp, vps, NULL, D, 0, NBd, w->o, D, 0);
  else
#endif
    gemm_blocks_ps(w->pa, 2 * L2, M, L2, vp, vps, NULL, D, 0, NBd, w->o, D, 0);
  for (int tt = 0; tt < qn; tt++)
    for (int hh = 0; hh < G; hh++) {
      bf16 *dst = a->out + (int64_t)(a->row0[seq] + t0 + tt) * a->H * D + (int64_t)(g * G + hh) * D;
      const float *src = w->o + (int64_t)(tt * G + hh) * D;
      float inv = w->s[(int64_t)(tt * G + hh) * L];
      int d = 0;
#ifdef BF16_DP
      for (; d + 16 <= D; d += 16)
        _mm256_storeu_si256((__m256i *)(dst + d), bf16x16_pack(_mm512_mul_ps(_mm512_loadu_ps(src + d), _mm512_set1_ps(inv))));
#endif
      for (; d < D; d++) dst[d] = f32_to_bf16(src[d] * inv);
    }
}

typedef struct {
  const bf16_prefill *a;
  const int32_t *unit0; /* per sequence: its first unit */
  int n_seqs;
  pf_scratch *w; /* per worker */
  bf16 *kpack, *vpack;  /* every (sequence, KV group)'s packed keys (pack_kv) */
  int64_t *kofs, *vofs; /* [n_seqs Hkv + 1]: where (s, g)'s are, elements */
  size_t kcap, vcap;    /* what kpack, vpack hold, elements */
  /* optional: sequences of one row (decode rows in an extend batch) take the decode attention
   * instead (attend_row: no packing), with float32 queries dec->q [rows, q_stride] and scratch
   * dec_s / dec_o per worker */
  const bf16_attn *dec;
  float *const *dec_s, *const *dec_o;
} pf_job;

static int pf_decode_row(const pf_job *j, int s) { return j->dec != NULL && j->a->ext_lens[s] == 1; }

static void pack_job_unit(void *p, int u, int worker) { /* u = s Hkv + g */
  const pf_job *j = (const pf_job *)p;
  (void)worker;
  if (pf_decode_row(j, u / j->a->Hkv)) return;
  pack_kv(j->a, u / j->a->Hkv, u % j->a->Hkv, j->kpack + j->kofs[u], j->vpack + j->vofs[u]);
}

/* Unit u, counted from the end: the last query blocks see the most keys and go first. */
static void prefill_job_unit(void *p, int u, int worker) {
  const pf_job *j = (const pf_job *)p;
  u = j->unit0[j->n_seqs] - 1 - u;
  int s = 0;
  while (j->unit0[s + 1] <= u) s++;
  int i = u - j->unit0[s], ext = j->a->ext_lens[s], qb = i / j->a->Hkv, g = i % j->a->Hkv;
  int t0 = qb * QB, t1 = t0 + QB < ext ? t0 + QB : ext, sg = s * j->a->Hkv + g;
  if (pf_decode_row(j, s)) {
    attend_row(j->dec, j->a->row0[s], s, g, j->dec_s[worker], j->dec_o[worker]);
    return;
  }
  prefill_unit(j->a, s, g, t0, t1, j->w + worker, j->kpack + j->kofs[sg], j->vpack + j->vofs[sg]);
}

/* The prefill attention of job j's rows over the current caches (j->a): the keys packed per
 * (sequence, KV group), then the query blocks, each a pool job on up to nt threads. The pack
 * buffers grow as needed and are kept in j (pf_free releases them). */
static void pf_attend(pf_job *j, int nt) {
  const bf16_prefill *a = j->a;
  int D2 = (a->D + 1) / 2, NBd = (a->D + CB - 1) / CB, n = j->n_seqs * a->Hkv;
  j->kofs = (int64_t *)realloc(j->kofs, sizeof(int64_t) * (size_t)(n + 1));
  j->vofs = (int64_t *)realloc(j->vofs, sizeof(int64_t) * (size_t)(n + 1));
  j->kofs[0] = j->vofs[0] = 0;
  for (int u = 0; u < n; u++) {
    int L = pf_decode_row(j, u / a->Hkv) ? 0 : a->seq_lens[u / a->Hkv]; /* 0: not packed */
    j->kofs[u + 1] = j->kofs[u] + (int64_t)((L + CB - 1) / CB) * D2 * 32;
    j->vofs[u + 1] = j->vofs[u] + (int64_t)NBd * pf_pairs(L) * 32;
  }
  if ((size_t)j->kofs[n] > j->kcap) {
    free(j->kpack);
    j->kcap = (size_t)j->kofs[n];
    j->kpack = (bf16 *)malloc(sizeof(bf16) * (j->kcap > 0 ? j->kcap : 1));
  }
  if ((size_t)j->vofs[n] > j->vcap) {
    free(j->vpack);
    j->vcap = (size_t)j->vofs[n];
    j->vpack = (bf16 *)malloc(sizeof(bf16) * (j->vcap > 0 ? j->vcap : 1));
  }
  pool_run(pack_job_unit, j, n, nt < n ? nt : n);
  int units = j->unit0[j->n_seqs];
  pool_run(prefill_job_unit, j, units, nt < units ? nt : units);
}

static void pf_free(pf_job *j, int nt) {
  for (int i = 0; i < nt; i++) {
    free(j->w[i].qa);
    free(j->w[i].pa);
    free(j->w[i].s);
    free(j->w[i].o);
  }
  free(j->w);
  free(j->kpack);
  free(j->vpack);
  free(j->kofs);
  free(j->vofs);
}

/* row0[s]: sequence s's first packed row; unit0[s]: its first prefill unit (Hkv per 32-row
 * query block); both [n_seqs + 1], malloc'ed here. */
static void pf_offsets(const int32_t *ext_lens, int n_seqs, int Hkv, int32_t **row0,
                       int32_t **unit0) {
  *row0 = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n_seqs + 1));
  *unit0 = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n_seqs + 1));
  (*row0)[0] = (*unit0)[0] = 0;
  for (int s = 0; s < n_seqs; s++) {
    (*row0)[s + 1] = (*row0)[s] + ext_lens[s];
    (*unit0)[s + 1] = (*unit0)[s] + Hkv * ((ext_lens[s] + QB - 1) / QB);
  }
}

/* Write k, v [T, Hkv, D] (row strides k_stride, v_stride) at slots [T] of the bf16 caches, then
 * attend every query row of every sequence (above). out [T, H, D] bf16, contiguous. */
void infer_bf16_prefill_attention(const bf16 *q, int64_t q_stride, const bf16 *k, int64_t k_stride,
                                  const bf16 *v, int64_t v_stride, bf16 *k_cache, bf16 *v_cache,
                                  const int64_t *slots, int T, const int32_t *block_tables,
                                  int64_t bt_stride, const int32_t *seq_lens,
                                  const int32_t *ext_lens, int n_seqs, int H, int Hkv, int D,
                                  int page, float scale, bf16 *out) {
  int64_t row = (int64_t)Hkv * D;
  for (int t = 0; t < T; t++) {
    memcpy(k_cache + slots[t] * row, k + (int64_t)t * k_stride, sizeof(bf16) * (size_t)row);
    memcpy(v_cache + slots[t] * row, v + (int64_t)t * v_stride, sizeof(bf16) * (size_t)row);
  }
  int32_t *row0, *unit0;
  pf_offsets(ext_lens, n_seqs, Hkv, &row0, &unit0);
  bf16_prefill a = {q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, ext_lens,
                    row0, out, H, Hkv, D, page, scale};
  int nt = g_threads < POOL_MAX ? g_threads : POOL_MAX;
  pf_job job;
  memset(&job, 0, sizeof job);
  job.a = &a;
  job.unit0 = unit0;
  job.n_seqs = n_seqs;
  job.w = (pf_scratch *)calloc((size_t)nt, sizeof(pf_scratch));
  pf_attend(&job, nt);
  pf_free(&job, nt);
  free(row0);
  free(unit0);
}

/* ---- row ops of the decode step (float32 residual stream) ---- */

/* sum x[i]^2 over [0, n): in 16 (AVX-512) or 8 (AVX2) lane-wise float32 sums, added together
 * at the end, then the tail in order. A fixed order for a given n (so a row's bits do not depend
 * on the batch); one chain of n adds (4 cycles each: 2,300 cycles a 576-wide row, 3-4 % of a
 * 128-token bf16 prefill) becomes n / 16 fused multiply-adds. */
static inline float sum_sq(const float *x, int n) {
  int i = 0;
  float ss = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i), acc);
  ss = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), acc);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  ss = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#endif
  for (; i < n; i++) ss += x[i] * x[i];
  return ss;
}

/* o = w * x / sqrt(mean(x^2) + eps) -> the next GEMM's activation row. */
static void rms_act_row(const float *x, const float *w, int dim, float eps, float *tmp, act_t *o) {
  float ss = sum_sq(x, dim);
  float r = 1.f / sqrtf(ss / (float)dim + eps);
  for (int i = 0; i < dim; i++) tmp[i] = w[i] * (x[i] * r);
  act_row(tmp, 0, dim, o);
}

/* Rotate-half rotary of one token's n heads at x (head stride D) by the table row cs [rot]. */
static void rope_heads(float *x, int n, int D, int rot, const float *cs) {
  int half = rot / 2;
  for (int h = 0; h < n; h++) {
    float *v = x + (int64_t)h * D;
    for (int i = 0; i < half; i++) {
      float x1 = v[i], x2 = v[i + half], c = cs[i], s = cs[half + i];
      v[i] = x1 * c - x2 * s;
      v[i + half] = x2 * c + x1 * s;
    }
  }
}

/* ---- a whole decode step of a Llama-family stack (bf16 weights, bf16 KV cache) ----
 * Per layer, on the float32 residual stream h [B, hidden] in place:
 *   x = rms_norm(h) ; qkv = x Wqkv^T (+ b) ; rotary(q, k) ; write k, v (bf16) ; a = attn(q) ;
 *   h = h + a Wo^T ; x = rms_norm(h) ; gu = x Wgu^T ; h = h + (silu(g) * u) Wdown^T
 * Every GEMM input is rounded to bf16 (x, a, silu(g) * u); everything else stays float32. */
typedef struct {
  const float *in_norm, *post_norm;    /* [hidden] float32 */
  const bf16 *wqkv, *wo, *wgu, *wdown; /* pair-packed */
  const float *bqkv;                   /* [(H + 2 Hkv) D] float32 or NULL */
  bf16 *k_cache, *v_cache;             /* [pages, page, Hkv, D] */
} infer_bf16_layer;

typedef struct {
  const infer_bf16_layer *layers;
  int n_layers, B, hidden, H, Hkv, D, inter, rot_dim, page;
  float eps, scale;
  float *h; /* [B, hidden] */
  const int64_t *pos, *slots;
  const float *cos_sin; /* [positions, rot_dim] */
  const int32_t *block_tables, *seq_lens;
  int64_t bt_stride;
} bf16_step;

/* The step's shared buffers and the current layer; scratch per pool worker. */
typedef struct {
  float *tmp, *s, *o; /* [kmax], [H * lmax], [H * D + H] */
} dec_scratch;

typedef struct {
  const bf16_step *st;
  const infer_bf16_layer *L;
  act_t *xn;   /* [B, as]: normed rows (the qkv / gate-up input), then the o projection's input */
  act_t *down; /* [B, as]: silu(g) * u, the down projection's input */
  float *qkv;  /* [B, qkv_w]: q, k, v */
  float *gu;   /* [B, 2 inter] */
  bf16 *att;   /* [B, H D]: attention outputs */
  bf16 *qb;    /* [B, H D]: bf16 queries (forward over extend rows only) */
  const float *norm_w; /* norm_rows_unit's weight */
  const act_t *a_in; /* the o projection's input rows (att itself, or xn), row stride a_s */
  int64_t as, a_s;
  int split_heads, split_inter, rows_a; /* phase A: KV groups x chunks of rows_a rows */
  /* decode attention as a phase of its own, a row over every KV head per unit (AVX2 tiles,
   * split heads, ATTN_APART_ROWS rows or more); else in phase A, one KV head per unit */
  int attn_apart;
  int per_h, per_i, per_v;              /* column blocks per unit: hidden, inter, vocab */
  /* the o and down projections: their last split_h column groups in units of rows_h rows */
  int split_h, rows_h;
  const float *final_norm;
  const bf16 *lm_head;
  int vocab;
  float *logits;
  dec_scratch *w;
} dec_job;

/* y[:, [c0, c1)] of one projection for this thread's column range (multiples of CB, or c1 = N). */
static void gemm_cols(const act_t *act, int64_t as, int B, int K, const bf16 *P, const float *bias,
                      int N, int c0, int c1, float *y) {
  if (c0 < c1)
    gemm_proj(act, as, B, (K + 1) / 2, P, bias, N, c0 / CB, (c1 + CB - 1) / CB, y, N, 0);
}

/* [c0, c1) of unit u's column blocks (per blocks each) of an N-column output. */
static void unit_cols(int u, int per, int N, int *c0, int *c1) {
  *c0 = u * per * CB;
  *c1 = (u + 1) * per * CB < N ? (u + 1) * per * CB : N;
}

/* Phase A's projections, unit = (KV groups, rows): q of the groups' query heads, their k and v
 * (+ bias), rotary, and k, v written to the cache. A unit owns whole KV groups (head_dim a
 * multiple of the GEMM's column block), or all of them when head_dim is not. Sets the unit's
 * groups [g0, g1) and rows [r0, r1). */
static void qkv_rows(const dec_job *j, int u, int *pg0, int *pg1, int *pr0, int *pr1) {
  const bf16_step *st = j->st;
  const infer_bf16_layer *L = j->L;
  int B = st->B, hid = st->hidden, D = st->D, H = st->H, Hkv = st->Hkv, G = H / Hkv;
  int qkv_w = (H + 2 * Hkv) * D, att_w = H * D, ng = j->split_heads ? Hkv : 1;
  int g0 = j->split_heads ? u % ng : 0, g1 = j->split_heads ? g0 + 1 : Hkv;
  int r0 = (u / ng) * j->rows_a, r1 = r0 + j->rows_a < B ? r0 + j->rows_a : B, n = r1 - r0;
  int64_t row = (int64_t)Hkv * D;
  const act_t *x = j->xn + r0 * j->as;
  float *y = j->qkv + (int64_t)r0 * qkv_w;
  gemm_cols(x, j->as, n, hid, L->wqkv, L->bqkv, qkv_w, g0 * G * D, g1 * G * D, y);
  gemm_cols(x, j->as, n, hid, L->wqkv, L->bqkv, qkv_w, att_w + g0 * D, att_w + g1 * D, y);
  gemm_cols(x, j->as, n, hid, L->wqkv, L->bqkv, qkv_w, att_w + Hkv * D + g0 * D,
            att_w + Hkv * D + g1 * D, y);
  for (int m = r0; m < r1; m++) {
    float *q = j->qkv + (int64_t)m * qkv_w, *k = q + att_w, *v = k + row;
    const float *cs = st->cos_sin + st->pos[m] * st->rot_dim;
    rope_heads(q + (int64_t)g0 * G * D, (g1 - g0) * G, D, st->rot_dim, cs);
    rope_heads(k + (int64_t)g0 * D, g1 - g0, D, st->rot_dim, cs);
    for (int64_t i = (int64_t)g0 * D; i < (int64_t)g1 * D; i++) {
      L->k_cache[st->slots[m] * row + i] = f32_to_bf16(k[i]);
      L->v_cache[st->slots[m] * row + i] = f32_to_bf16(v[i]);
    }
  }
  *pg0 = g0, *pg1 = g1, *pr0 = r0, *pr1 = r1;
}

/* The decode attention's view of the step's current layer (queries in qkv, outputs in att). */
static bf16_attn dec_attn_view(const dec_job *j) {
  const bf16_step *st = j->st;
  bf16_attn at = {j->qkv, (st->H + 2 * st->Hkv) * st->D, j->L->k_cache, j->L->v_cache,
                  st->block_tables, st->bt_stride, st->seq_lens, j->att, st->H, st->Hkv, st->D,
                  st->page, st->scale};
  return at;
}

/* Phase A of a decode step: the unit's projections, then its rows' attention over their
 * sequences' keys (one new token each: every key it needs is written already). */
static void dec_attn_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  const bf16_step *st = j->st;
  int g0, g1, r0, r1;
  qkv_rows(j, u, &g0, &g1, &r0, &r1);
  if (j->attn_apart) return; /* dec_heads_unit attends, once every head's keys are written */
  bf16_attn at = dec_attn_view(j);
  for (int b = r0; b < r1; b++)
    for (int g = g0; g < g1; g++) attend_unit(&at, b * st->Hkv + g, j->w[worker].s, j->w[worker].o);
}

/* Phase A2 of a decode step with attn_apart: unit u = decode row u over every KV head. */
static void dec_heads_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  bf16_attn at = dec_attn_view(j);
  attend_row_heads(&at, u, u, j->w[worker].s, j->w[worker].o);
}

/* Phase A1 of a forward over extend rows: the unit's projections, and its rows' queries rounded
 * to bf16 into qb [B, H D] (the prefill attention's input, as the per-op path's bf16 q). */
static void fwd_qkv_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  const bf16_step *st = j->st;
  int g0, g1, r0, r1, D = st->D, G = st->H / st->Hkv, qkv_w = (st->H + 2 * st->Hkv) * D;
  (void)worker;
  qkv_rows(j, u, &g0, &g1, &r0, &r1);
  for (int m = r0; m < r1; m++)
    for (int64_t i = (int64_t)g0 * G * D; i < (int64_t)g1 * G * D; i++)
      j->qb[(int64_t)m * st->H * D + i] = f32_to_bf16(j->qkv[(int64_t)m * qkv_w + i]);
}

/* Phases B and D, unit = hidden columns: h[:, cols] += (o or down projection)[:, cols]. */
static void dec_residual_unit(const dec_job *j, int u, const act_t *in, int64_t in_s, int K,
                              const bf16 *W) {
  const bf16_step *st = j->st;
  int hid = st->hidden, c0, c1, g = u, r0 = 0, n = st->B;
  int whole = ceil_div(ceil_div(hid, CB), j->per_h) - j->split_h; /* column groups of all rows */
  if (u >= whole) { /* the last split_h groups, each in row chunks of rows_h */
    int nr = ceil_div(st->B, j->rows_h);
    g = whole + (u - whole) / nr;
    r0 = ((u - whole) % nr) * j->rows_h;
    n = st->B - r0 < j->rows_h ? st->B - r0 : j->rows_h;
  }
  unit_cols(g, j->per_h, hid, &c0, &c1);
  if (c0 < c1) /* added to the residual stream as the GEMM stores them */
    gemm_proj(in + r0 * in_s, in_s, n, (K + 1) / 2, W, NULL, hid, c0 / CB, (c1 + CB - 1) / CB,
              st->h + (int64_t)r0 * hid, hid, Y_ADD);
}

static void dec_o_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  (void)worker;
  dec_residual_unit(j, u, j->a_in, j->a_s, j->st->H * j->st->D, j->L->wo);
}

static void dec_down_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  (void)worker;
  dec_residual_unit(j, u, j->down, j->as, j->st->inter, j->L->wdown);
}

/* Phase C, unit = inter columns (all of them when inter is not a multiple of the column block):
 * the matching gate and up columns, then silu(g) * u of those columns, rounded to bf16, row by
 * row with the next row's columns prefetched. A row's are two short runs (the unit's columns of
 * gate and of up, inter floats apart; rows twice that) that the hardware prefetchers did not
 * fetch ahead: the SiLU loop stalled on them (perf: a third of its samples on the gate's load).
 * On an Intel Xeon with AMX, 2 threads (cpu_bf16_decode_micro.py --rev): a 128-token prefill
 * 1.03-1.04x, 4 x 128 1.05-1.08x, decode steps 1.00-1.01x. */
static void dec_mlp_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  const bf16_step *st = j->st;
  int I = st->inter, c0 = 0, c1 = I;
  float *tmp = j->w[worker].tmp;
  if (j->split_inter) unit_cols(u, j->per_i, I, &c0, &c1);
  gemm_cols(j->xn, j->as, st->B, st->hidden, j->L->wgu, NULL, 2 * I, c0, c1, j->gu);
  gemm_cols(j->xn, j->as, st->B, st->hidden, j->L->wgu, NULL, 2 * I, I + c0, I + c1, j->gu);
  for (int m = 0; m < st->B; m++) {
    const float *g = j->gu + (int64_t)m * 2 * I;
    if (m + 1 < st->B) { /* the next row's gate and up columns (see above) */
      prefetch_span(g + 2 * I + c0, (c1 - c0) * 4);
      prefetch_span(g + 3 * I + c0, (c1 - c0) * 4);
    }
    vm_silu_mul(g + c0, g + I + c0, tmp + c0, c1 - c0);
    act_t *dst = j->down + m * j->as;
    round_row(tmp + c0, c1 - c0, dst + c0);
    if ((I & 1) && c1 == I) dst[I] = 0; /* the odd tail's pad */
  }
}

/* The LM head, unit = vocabulary columns, on the final-normed rows in xn. */
static void dec_head_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  int c0, c1;
  (void)worker;
  unit_cols(u, j->per_v, j->vocab, &c0, &c1);
  gemm_cols(j->xn, j->as, j->st->B, j->st->hidden, j->lm_head, NULL, j->vocab, c0, c1, j->logits);
}

/* xn[m] = the GEMM's activation row of w * rms_normed(h[m]), every row (the caller, serially). */
static void dec_norm_rows(const dec_job *j, const float *w, float eps) {
  const bf16_step *st = j->st;
  for (int m = 0; m < st->B; m++)
    rms_act_row(st->h + (int64_t)m * st->hidden, w, st->hidden, eps, j->w[0].tmp, j->xn + m * j->as);
}

/* Rows [8 u, 8 u + 8) of dec_norm_rows with the weight j->norm_w (many rows: a pool job). */
static void norm_rows_unit(void *p, int u, int worker) {
  const dec_job *j = (const dec_job *)p;
  const bf16_step *st = j->st;
  for (int m = 8 * u; m < st->B && m < 8 * u + 8; m++)
    rms_act_row(st->h + (int64_t)m * st->hidden, j->norm_w, st->hidden, st->eps, j->w[worker].tmp,
                j->xn + m * j->as);
}

/* xn[m] = the normed rows of h with the layer norm weight w (eps st->eps): by the caller for a
 * few rows, a pool job from 16 (a 32-row decode step spent 2 % of its time here, the helper
 * waiting). */
static void norm_rows(dec_job *j, const float *w, int nt) {
  j->norm_w = w;
  if (j->st->B >= 16)
    pool_run(norm_rows_unit, j, ceil_div(j->st->B, 8), nt);
  else
    dec_norm_rows(j, w, j->st->eps);
}

/* ---- greedy LM head: int8 screen, exact logits only for the candidates ----
 * Greedy rows need argmax(logits), not the logits. The screen computes every logit of a row
 * approximately, with an int8 copy of the head (per-column scale s_n, codes q_n) on u8
 * activations (vpdpbusd: 64 products an instruction, twice vdpbf16ps's rate on Zen 5), plus a
 * rigorous bound B_n of the approximation's distance from the exact GEMM's logit; only the
 * columns whose upper bound approx_n + B_n reaches T = max_n (approx_n - B_n) can hold the
 * maximum, and those are computed exactly, with the head GEMM's own instruction sequence (the
 * same bits as the full head). Any other column's exact logit is below approx + B < T <= the
 * exact logit of the column that sets T, so it is neither the maximum nor tied with it, and the
 * largest candidate (the lowest column on a tie) is the first maximum of the row: the ids are
 * argmax's, exactly.
 *
 * The bound, for activations x (the bf16 rows the GEMM reads) and weights W_n:
 *   the SCR_P k pairs with the batch's largest |x| (SCR_P_WIDE in a batch of SCR_P_ROWS rows
 *   or more) are taken exactly (vdpbf16ps on the bf16 head; the residual stream's few large
 *   channels would otherwise set the int8 scale), the
 *   rest xr is quantised per row: x^ = rint(xr / s_x), s_x = max|xr| / 127, and
 *   approx = s_x s_n sum(x^ q_n) + sum_pairs(x W_n). Then
 *   |sum(xr W_n) - s_x s_n sum(x^ q_n)| <= ||xr|| ||W_n - s_n q_n|| + s_n ||q_n|| ||xr - s_x x^||
 *   (Cauchy-Schwarz on both parts), and each float32 dot over K terms (the exact GEMM, the
 *   exact pairs) is within gamma_K ||x|| ||W_n|| of its real value (gamma_K = K u / (1 - K u),
 *   u = 2^-24; any summation order). The integer dot is exact; its conversion and two products
 *   add at most 3u of its magnitude. The norms come from the packer (float64, rounded up) and
 *   from the row (double); B adds 2^-10 of itself and 2^-20 of the magnitudes for the float
 *   rounding of its own evaluation.
 * A unit that finds more than SCR_CAP candidates for a row (before a high lower bound is known,
 * or all logits close: a zero row) has all its columns of that row computed exactly; a row with
 * a non-finite activation or logit gets every logit and torch's argmax rule (first maximum, NaN
 * as the maximum). */
typedef struct {
  const int8_t *q;      /* [NB][K / 4][16][4]: column n's codes, 4 k at a time */
  const float *scale;   /* [NB * 16] s_n (0 on the padding columns) */
  const int32_t *qsum;  /* [NB * 16] 128 sum_k q_n[k] (the u8 activations' offset) */
  const float *err;     /* [NB * 16] ||W_n - s_n q_n|| */
  const float *qnorm;   /* [NB * 16] s_n ||q_n|| */
  const float *wnorm;   /* [NB * 16] ||W_n|| */
  const bf16 *rows;     /* [V, K] the head's weights, row-major: the candidates' exact dots */
  int K;                /* hidden: a multiple of 4 */
} infer_bf16_screen;

/* argmax of row [V] by torch's rule: the first maximum, or the first NaN if any. */
static int64_t argmax_rule(const float *row, int V) {
  int64_t best = 0;
  for (int n = 0; n < V; n++) {
    if (isnan(row[best])) break;
    if (isnan(row[n]) || row[n] > row[best]) best = n;
  }
  return best;
}

#if defined(BF16_DP) && defined(__AVX512VNNI__)
#define SCR 1
#ifndef SCR_P
#define SCR_P 8    /* k pairs taken exactly */
#endif
/* k pairs taken exactly in a batch of SCR_P_ROWS rows or more, and wherever the AMX tiles
 * take the screen (one tile holds 16 pairs): the more rows, the more of them have a large
 * channel outside the batch's top 8 pairs, which then sets the row's int8 scale and widens its
 * bound. SmolLM2's bf16 head on 32 rows of its final hidden states (random-id prompts): 287
 * exact candidates a row with 8 pairs, 41 with 16 (25 with 32 on the register tiles, whose
 * pairs cost more than they save); 24 rows 209 against 39, 16 rows 118 against 27, 8 rows 89
 * against 16. */
#ifndef SCR_P_WIDE
#define SCR_P_WIDE 16
#endif
#ifndef SCR_P_ROWS
#define SCR_P_ROWS 24
#endif
#define SCR_CAP 256 /* candidates a unit keeps per row */
#define SCR_TM 4   /* rows per register tile */
#ifndef SCR_PF
#define SCR_PF 1 /* the next column group's codes and pair lines prefetched (into L2) */
#endif

/* The exact logits of column blocks [b0, b1) of the activation row x into row[b0 * CB ...], by
 * the head's own GEMM (gemm_proj, as gemm_cols computes the full head: on AMX tiles where they
 * take the head, whose sums differ from vdpbf16ps's, so the bits are the full head's on every
 * CPU). */
static void head_blocks(const act_t *x, int64_t as, int K, const bf16 *head, int V, int b0, int b1,
                        float *row) {
  gemm_proj(x, as, 1, (K + 1) / 2, head, NULL, V, b0, b1, row, V, 0);
}

/* argmax (argmax_rule) of every exact logit of the activation row x; row: scratch of
 * ceil(V / CB) * CB floats. */
static int64_t head_argmax_full(const act_t *x, int64_t as, int K, const bf16 *head, int V, float *row) {
  head_blocks(x, as, K, head, V, 0, ceil_div(V, CB), row);
  return argmax_rule(row, V);
}

/* Counts since the last call (rows screened, candidates computed exactly, rows that fell back
 * to every logit, units whose columns a row computed exactly), for tests and benchmarks; reset
 * by the read. */
static _Atomic int64_t g_scr_rows, g_scr_cands, g_scr_full, g_scr_units;
void infer_bf16_screen_stats(int64_t *out) {
  out[0] = atomic_exchange(&g_scr_rows, 0);
  out[1] = atomic_exchange(&g_scr_cands, 0);
  out[2] = atomic_exchange(&g_scr_full, 0);
  out[3] = atomic_exchange(&g_scr_units, 0);
}

/* With AMX too: the candidates' exact logits come from AMX tiles where the full head does
 * (scr_exact_unit, head_blocks), so they are the full head's bits (which differ from
 * vdpbf16ps's in most outputs: test_candidates_sum_as_the_full_head_does holds two columns that
 * the two order apart). Intel Xeon with AMX, 2 cores, `infer bench one-batch` (bf16 SmolLM2,
 * 128 / 64, INFER_CPU_GREEDY_SCREEN=1 against 0 alternating, five to seven rounds, a busy
 * machine): at batch 1 decode 203-230 tok/s against 180-210 and the 128-token prefill with its
 * first token 26.6-31.4 ms against 28.7-33.3 (medians about 1.08x and 3 ms); at 8 and 32 rows
 * the same within the noise. */
int infer_bf16_screen_ok(void) { return 1; }

typedef struct {
  const infer_bf16_screen *sc;
  const act_t *xn; /* [B, as] the normed rows (bf16 pairs) */
  int64_t as;
  const bf16 *head; /* the pair-packed bf16 head */
  int B, K, K4, V, NB, per, np;
  int32_t pairs[SCR_P_WIDE > SCR_P ? SCR_P_WIDE : SCR_P];
  const uint8_t *xu;  /* [B][K] u8 codes: rint(xr / s_x) + 128 */
  int amx;            /* the integer dots and the exact pairs on AMX tiles (scr_amx_dots) */
  int32_t *idots;     /* with amx: [workers][B][TB][CB] a column group's dots */
  float *epairs;      /* with amx: [workers][B][TB][CB] its exact pairs' sums */
  uint32_t *xp;       /* with amx: [B][16] each row's exact pairs (bf16 pairs; zero past np) */
  const float *rowf;  /* [B][4]: s_x, ||xr||, ||xr - s_x x^||, 2 gamma ||x|| (rounded up) */
  float *lo;          /* [units][B] the unit's largest lower bound */
  _Atomic uint32_t *top; /* [B] the largest lower bound any unit has found so far (float bits) */
  int32_t *cn;        /* [units][B][SCR_CAP] candidate columns */
  float *cu;          /* [units][B][SCR_CAP] their upper bounds */
  int32_t *cc;        /* [units][B] candidates kept; -1: more than SCR_CAP */
  int units;
  int32_t *cand;      /* [workers][units * SCR_CAP] a row's candidates */
  float *wrow;        /* [workers][NB * CB] an overflowed unit's exact logits */
  char *bad;          /* [B] rows that take every logit */
  int64_t *ids;
} scr_job;

/* The int8 register tile: acc[m][bb] (int32 x 16 columns) = sum over k of the u8 activations
 * of row m (xu, row stride xs bytes) and the codes of block bb (q0, K4 quads a block). */
static inline __attribute__((always_inline)) void scr_tile(const int8_t *q0, int K4,
                                                           const uint8_t *xu, int64_t xs, int tm,
                                                           int tb, int32_t out[][TB][CB]) {
  __m512i acc[SCR_TM][TB];
  for (int m = 0; m < tm; m++)
    for (int bb = 0; bb < tb; bb++) acc[m][bb] = _mm512_setzero_si512();
  for (int k = 0; k < K4; k++) {
    __m512i w[TB];
    for (int bb = 0; bb < tb; bb++) {
      w[bb] = _mm512_loadu_si512((const void *)(q0 + ((int64_t)bb * K4 + k) * 64));
      __asm__("" : "+v"(w[bb])); /* held in a register, as in tile() */
    }
    for (int m = 0; m < tm; m++) {
      int32_t quad;
      memcpy(&quad, xu + m * xs + 4 * k, sizeof quad);
      __m512i xv = _mm512_set1_epi32(quad);
      for (int bb = 0; bb < tb; bb++) acc[m][bb] = _mm512_dpbusd_epi32(acc[m][bb], xv, w[bb]);
    }
  }
  for (int m = 0; m < tm; m++)
    for (int bb = 0; bb < tb; bb++) _mm512_storeu_si512((void *)out[m][bb], acc[m][bb]);
}

/* The exact pairs' register tile: out[m][bb] = sum over the np pairs of the bf16 head's block
 * bb (P0, ps elements a block) against row m's activation pairs (xn, row stride as). */
static inline __attribute__((always_inline)) void scr_pairs(const bf16 *P0, int64_t ps,
                                                            const act_t *xn, int64_t as,
                                                            const int32_t *pairs, int np, int tm,
                                                            int tb, float out[][TB][CB]) {
  __m512 e[SCR_TM][TB];
  for (int m = 0; m < tm; m++)
    for (int bb = 0; bb < tb; bb++) e[m][bb] = _mm512_setzero_ps();
  for (int i = 0; i < np; i++) {
    __m512i w[TB];
    for (int bb = 0; bb < tb; bb++)
      w[bb] = _mm512_loadu_si512((const void *)(P0 + bb * ps + (int64_t)pairs[i] * 32));
    for (int m = 0; m < tm; m++) {
      int32_t pair;
      memcpy(&pair, xn + m * as + 2 * pairs[i], sizeof pair);
      __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int bb = 0; bb < tb; bb++) e[m][bb] = _mm512_dpbf16_ps(e[m][bb], (__m512bh)w[bb], xv);
    }
  }
  for (int m = 0; m < tm; m++)
    for (int bb = 0; bb < tb; bb++) _mm512_storeu_ps(out[m][bb], e[m][bb]);
}

#ifdef BF16_AMX
_Static_assert(SCR_P <= 16 && SCR_P_WIDE <= 16, "the AMX screen's exact pairs fill one tile");
/* Rows of the screen that take the AMX tiles for their integer dots and exact pairs (below it
 * the register tiles are as fast: the codes stream from memory either way). The head's greedy
 * ids alone (SmolLM2's bf16 head, 49,152 x 576, on its own final hidden states, 2 threads,
 * Intel Xeon with AMX, libraries alternating in one process), the register tiles with 8 pairs
 * against the tiles with 16: 32 rows 2.57 -> 1.42 ms (the full head on tiles: 2.8); 24 rows
 * 2.02 -> 1.38; 16 rows 1.36 -> 1.07; 8 rows 0.95 -> 0.92; 1 row (register tiles) 0.68. The
 * dots alone on tiles, pairs on registers: 32 rows 2.47 against 3.02 in another run. */
#ifndef SCR_AMX_MIN
#define SCR_AMX_MIN 8
#endif
/* out[m][bb] (int32 x 16 columns, m < B, bb < tb) = the integer dots of scr_tile for every row
 * of the batch and the tb blocks at q0, on tiles (tdpbusd: u8 activations, s8 codes; the codes'
 * [K / 4][16][4] layout is the B tile's, 16 quads a tile): the same exact int32 sums. Rows in
 * groups of 32 (tiles 0-1 and 4: rows [0, 16); 2-3 and 5: the rest), blocks two at a time;
 * K a multiple of 64. Then ex[m][bb] = the exact pairs' sums (scr_pairs' values, summed on the
 * tiles in their own order, which the bound allows: any order), with the same tile shapes: A the
 * rows' 16 pairs (xp: zero past np, which adds nothing), B each block's 16 pair lines of the
 * packed bf16 head (P0, ps elements a block) gathered into bt. */
static void scr_amx_dots(const int8_t *q0, int K4, const uint8_t *xu, int K, int B, int tb,
                         const bf16 *P0, int64_t ps, const int32_t *pairs, int np,
                         const uint32_t *xp, int32_t out[][TB][CB], float ex[][TB][CB]) {
  int64_t os = (int64_t)TB * CB * 4; /* bytes a row of out and of ex */
  uint8_t bt[TB][16][64] __attribute__((aligned(64)));
  for (int bb = 0; bb < tb; bb++)
    for (int i = 0; i < 16; i++) {
      __m512i v = _mm512_setzero_si512();
      if (i < np) v = _mm512_loadu_si512((const void *)(P0 + bb * ps + (int64_t)pairs[i] * 32));
      _mm512_store_si512((void *)bt[bb][i], v);
    }
  for (int r0 = 0; r0 < B; r0 += 32) {
    int rows = B - r0 < 32 ? B - r0 : 32, lo = rows < 16 ? rows : 16, hi = rows - lo;
    amx_load_config(lo, hi);
    const uint8_t *x0 = xu + (int64_t)r0 * K, *x1 = x0 + (int64_t)16 * K;
    for (int bb = 0; bb < tb; bb += 2) {
      int two = bb + 1 < tb;
      const int8_t *w0 = q0 + (int64_t)bb * K4 * 64, *w1 = w0 + (int64_t)K4 * 64;
      _tile_zero(0);
      _tile_zero(1);
      if (hi) {
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int k = 0; k < K; k += 64) {
        _tile_loadd(4, x0 + k, K);
        _tile_loadd(6, w0 + k * 16, 64);
        _tile_dpbusd(0, 4, 6);
        if (two) {
          _tile_loadd(7, w1 + k * 16, 64);
          _tile_dpbusd(1, 4, 7);
        }
        if (hi) {
          _tile_loadd(5, x1 + k, K);
          _tile_dpbusd(2, 5, 6);
          if (two) _tile_dpbusd(3, 5, 7);
        }
      }
      _tile_stored(0, out[r0][bb], os);
      if (two) _tile_stored(1, out[r0][bb + 1], os);
      if (hi) {
        _tile_stored(2, out[r0 + 16][bb], os);
        if (two) _tile_stored(3, out[r0 + 16][bb + 1], os);
      }
      /* the exact pairs of the same rows and blocks */
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(4, xp + (int64_t)r0 * 16, 64);
      _tile_loadd(6, bt[bb], 64);
      _tile_dpbf16ps(0, 4, 6);
      if (two) {
        _tile_loadd(7, bt[bb + 1], 64);
        _tile_dpbf16ps(1, 4, 7);
      }
      _tile_stored(0, ex[r0][bb], os);
      if (two) _tile_stored(1, ex[r0][bb + 1], os);
      if (hi) {
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(5, xp + (int64_t)(r0 + 16) * 16, 64);
        _tile_dpbf16ps(2, 5, 6);
        if (two) _tile_dpbf16ps(3, 5, 7);
        _tile_stored(2, ex[r0 + 16][bb], os);
        if (two) _tile_stored(3, ex[r0 + 16][bb + 1], os);
      }
    }
  }
  _tile_release();
}
#endif

static void scr_unit(void *p, int u, int worker) {
  const scr_job *j = (const scr_job *)p;
  const infer_bf16_screen *sc = j->sc;
  (void)worker;
  int b0 = u * j->per, b1 = b0 + j->per < j->NB ? b0 + j->per : j->NB, K4 = j->K4;
  int64_t ps = (int64_t)((j->K + 1) / 2) * 32;
  float *lo = j->lo + (int64_t)u * j->B;
  int32_t *cc = j->cc + (int64_t)u * j->B;
  for (int m = 0; m < j->B; m++) {
    lo[m] = -INFINITY;
    cc[m] = 0;
  }
  float ex[SCR_TM][TB][CB];   /* the exact pairs' sums of a tile */
  int32_t iacc[SCR_TM][TB][CB]; /* its integer dots */
  for (int b = b0; b < b1; b += TB) {
    int tb = b1 - b < TB ? b1 - b : TB;
    const int8_t *q0 = sc->q + (int64_t)b * K4 * 64;
    const bf16 *P0 = j->head + b * ps;
    /* the next group's codes (TB blocks, contiguous) prefetched, a share before each row
     * tile: each column is read from memory once, in 4 KB-page streams the hardware
     * prefetcher does not carry over */
    const char *nx = SCR_PF && b + TB < b1 ? (const char *)(q0 + (int64_t)TB * K4 * 64) : NULL;
    int64_t nx_len = nx ? (int64_t)(b1 - b - TB < TB ? b1 - b - TB : TB) * K4 * 64 : 0;
    int tiles = ceil_div(j->B, SCR_TM);
    int64_t nx_step = 64 * ceil_div((int)(nx_len / 64), tiles), nx_at = 0;
    int32_t(*dots)[TB][CB] = NULL; /* the AMX tiles' dots and pairs of every row */
    float(*pairs)[TB][CB] = NULL;
#ifdef BF16_AMX
    if (j->amx) {
      dots = (int32_t(*)[TB][CB])(j->idots + (int64_t)worker * j->B * TB * CB);
      pairs = (float(*)[TB][CB])(j->epairs + (int64_t)worker * j->B * TB * CB);
      scr_amx_dots(q0, K4, j->xu, j->K, j->B, tb, P0, ps, j->pairs, j->np, j->xp, dots, pairs);
    }
#endif
    for (int m0 = 0; m0 < j->B; m0 += SCR_TM) {
      int tm = j->B - m0 < SCR_TM ? j->B - m0 : SCR_TM;
      for (int64_t e = nx_at + nx_step; nx_at < nx_len && nx_at < e; nx_at += 64)
        __builtin_prefetch(nx + nx_at, 0, 2);
      if (SCR_PF && m0 == 0 && nx) /* and its blocks' exact-pair lines of the bf16 head */
        for (int bb = 0; bb < TB && b + TB + bb < b1; bb++)
          for (int i = 0; i < j->np; i++)
            __builtin_prefetch(P0 + (TB + bb) * ps + (int64_t)j->pairs[i] * 32, 0, 2);
      const uint8_t *xu = j->xu + (int64_t)m0 * j->K;
      const act_t *xn = j->xn + (int64_t)m0 * j->as;
      if (!dots && tm == SCR_TM && tb == TB) { /* constant sizes: the sums stay in registers */
        scr_pairs(P0, ps, xn, j->as, j->pairs, j->np, SCR_TM, TB, ex);
        scr_tile(q0, K4, xu, j->K, SCR_TM, TB, iacc);
      } else if (!dots) {
        scr_pairs(P0, ps, xn, j->as, j->pairs, j->np, tm, tb, ex);
        scr_tile(q0, K4, xu, j->K, tm, tb, iacc);
      }
      int32_t(*id)[TB][CB] = dots ? dots + m0 : iacc;
      float(*ep)[TB][CB] = dots ? pairs + m0 : ex;
      for (int m = 0; m < tm; m++) {
        const float *rf = j->rowf + (int64_t)(m0 + m) * 4;
        __m512 sx = _mm512_set1_ps(rf[0]), ra = _mm512_set1_ps(rf[1]), rr = _mm512_set1_ps(rf[2]),
               rg = _mm512_set1_ps(rf[3]);
        __m512 ap[TB], bd[TB], lmax = _mm512_set1_ps(-INFINITY);
        __mmask16 real[TB]; /* the block's columns below V */
        for (int bb = 0; bb < tb; bb++) {
          int n0 = (b + bb) * CB;
          real[bb] = n0 + CB <= j->V ? 0xFFFF : (__mmask16)((1u << (j->V - n0)) - 1);
          __m512 ip = _mm512_mul_ps(
              _mm512_mul_ps(sx, _mm512_loadu_ps(sc->scale + n0)),
              _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(id[m][bb]),
                                                  _mm512_loadu_si512(sc->qsum + n0))));
          __m512 e = _mm512_loadu_ps(ep[m][bb]);
          ap[bb] = _mm512_add_ps(ip, e);
          __m512 d = _mm512_fmadd_ps(ra, _mm512_loadu_ps(sc->err + n0),
                                     _mm512_fmadd_ps(rr, _mm512_loadu_ps(sc->qnorm + n0),
                                                     _mm512_mul_ps(rg, _mm512_loadu_ps(sc->wnorm + n0))));
          __m512 mag = _mm512_add_ps(_mm512_abs_ps(ip), _mm512_abs_ps(e));
          bd[bb] = _mm512_fmadd_ps(d, _mm512_set1_ps(1.f + 0x1p-10f),
                                   _mm512_fmadd_ps(mag, _mm512_set1_ps(0x1p-20f), _mm512_set1_ps(1e-30f)));
          lmax = _mm512_mask_max_ps(lmax, real[bb], lmax, _mm512_sub_ps(ap[bb], bd[bb]));
        }
        /* prune by the best lower bound any unit has found: the candidates that can still
         * hold the row's maximum, whichever unit holds it */
        float t = _mm512_reduce_max_ps(lmax);
        if (t > lo[m0 + m]) lo[m0 + m] = t;
        t = lo[m0 + m];
        float g = screen_top(j->top + m0 + m);
        if (t > g) g = screen_raise(j->top + m0 + m, t);
        t = g > t ? g : t;
        int32_t *cn = j->cn + ((int64_t)u * j->B + m0 + m) * SCR_CAP;
        float *cu = j->cu + ((int64_t)u * j->B + m0 + m) * SCR_CAP;
        for (int bb = 0; bb < tb; bb++) {
          int n0 = (b + bb) * CB;
          __m512 up = _mm512_add_ps(ap[bb], bd[bb]);
          __mmask16 keep = _mm512_mask_cmp_ps_mask(real[bb], up, _mm512_set1_ps(t), _CMP_GE_OQ);
          if (keep) {
            float upv[CB];
            _mm512_storeu_ps(upv, up);
            for (int c = 0; c < CB; c++)
              if (keep >> c & 1) screen_keep(cn, cu, cc + m0 + m, SCR_CAP, t, n0 + c, upv[c]);
          }
        }
      }
    }
  }
}

/* k pair k (two bf16, a dword) of the 16 head rows at byte offsets vo of rows */
static inline __m512i cand_pairs(const bf16 *rows, __m512i vo, int k) {
  return _mm512_i32gather_epi32(vo, (const void *)((const char *)rows + (int64_t)k * 4), 1);
}

/* Row u's candidates: those of every unit whose upper bound reaches the row's best lower
 * bound, computed exactly 16 at a time, the first maximum kept. Each column's sums run as the
 * full head's do (on AMX tiles where it takes them, else vdpbf16ps over the k pairs in order,
 * from zero): the same bits. Its weights are gathered from the row-major head, where a column
 * is 18 lines at K = 576 (in the packed head, 288). Sets bad[u] where the row must take every
 * logit. */
static void scr_exact_unit(void *p, int u, int worker) {
  const scr_job *j = (const scr_job *)p;
  int m = u, K2 = (j->K + 1) / 2;
  if (j->bad[m]) return;
  float t = screen_top(j->top + m);
  int32_t *cand = j->cand + (int64_t)worker * j->units * SCR_CAP;
  float *wrow = j->wrow + (int64_t)worker * j->NB * CB;
  const act_t *x = j->xn + (int64_t)m * j->as;
  int64_t best = -1;
  float bv = 0.f;
  int nc = 0, bad = 0;
/* column n's exact logit e: the maximum so far, the lower column on a tie (units and
 * candidates may come in any order); a non-finite logit sends the row to every logit */
#define SCR_CONSIDER(n, e)                                                  \
  do {                                                                      \
    if (!isfinite(e)) bad = 1;                                              \
    else if (best < 0 || (e) > bv || ((e) == bv && (n) < best)) {           \
      best = (n);                                                           \
      bv = (e);                                                             \
    }                                                                       \
  } while (0)
  for (int v = 0; v < j->units && !bad; v++) {
    int32_t n_v = j->cc[(int64_t)v * j->B + m];
    if (n_v < 0) { /* more candidates than the unit kept: its columns exactly, all of them */
      int vb1 = (v + 1) * j->per < j->NB ? (v + 1) * j->per : j->NB;
      head_blocks(x, j->as, j->K, j->head, j->V, v * j->per, vb1, wrow);
      for (int n = v * j->per * CB; n < vb1 * CB && n < j->V; n++) SCR_CONSIDER(n, wrow[n]);
      atomic_fetch_add(&g_scr_units, 1);
      continue;
    }
    const int32_t *cn = j->cn + ((int64_t)v * j->B + m) * SCR_CAP;
    const float *cu = j->cu + ((int64_t)v * j->B + m) * SCR_CAP;
    for (int i = 0; i < n_v; i++)
      if (cu[i] >= t) cand[nc++] = cn[i];
  }
  atomic_fetch_add(&g_scr_cands, nc);
  int amx = 0;
#ifdef BF16_AMX
  /* where the full head sums on AMX tiles, the candidates do too: their gathered pairs as a B
   * tile per k chunk, the row as a one-row A, the chunks in order from zero (amx_group's sums
   * for each column: the same bits) */
  static const uint8_t cand_rows[8] = {1, 1, 16, 0, 0, 0, 0, 0};
  static const uint16_t cand_colsb[8] = {64, 64, 64, 0, 0, 0, 0, 0};
  amx = nc > 0 && amx_takes(K2);
  if (amx) amx_configure(cand_rows, cand_colsb);
#endif
  for (int c0 = 0; c0 < nc && !bad; c0 += CB) {
    int cnt = nc - c0 < CB ? nc - c0 : CB;
    int32_t off[CB];
    for (int i = 0; i < CB; i++) /* lane i: its column's row of the row-major head */
      off[i] = cand[c0 + (i < cnt ? i : 0)] * j->K * 2;
    __m512i vo = _mm512_loadu_si512((const void *)off);
    float val[CB] __attribute__((aligned(64)));
#ifdef BF16_AMX
    if (amx) {
      uint32_t bt[16][16] __attribute__((aligned(64)));
      _tile_zero(0);
      for (int k0 = 0; k0 < K2; k0 += 16) {
        for (int k = 0; k < 16; k++)
          _mm512_store_si512((void *)bt[k], cand_pairs(j->sc->rows, vo, k0 + k));
        _tile_loadd(1, x + 2 * k0, 64);
        _tile_loadd(2, bt, 64);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, val, 64);
    } else
#endif
    {
      __m512 acc = _mm512_setzero_ps();
      for (int k = 0; k < K2; k++) {
        __m512i w = cand_pairs(j->sc->rows, vo, k);
        int32_t pair;
        memcpy(&pair, x + 2 * k, sizeof pair);
        acc = _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32(pair));
      }
      _mm512_store_ps(val, acc);
    }
    for (int i = 0; i < cnt; i++) {
      float e = val[i] + 0.f; /* as store16 */
      SCR_CONSIDER(cand[c0 + i], e);
    }
  }
#undef SCR_CONSIDER
#ifdef BF16_AMX
  if (amx) _tile_release();
#endif
  if (bad || best < 0) j->bad[m] = 1;
  else j->ids[m] = best;
}

/* ids[m] = argmax of the exact logits of row m (xn rows), every row. */
static void head_greedy(const act_t *xn, int64_t as, int B, int K, const bf16 *head, int V,
                        const infer_bf16_screen *sc, int per, int nt, int64_t *ids) {
  scr_job j;
  memset(&j, 0, sizeof j);
  j.sc = sc;
  j.xn = xn;
  j.as = as;
  j.head = head;
  j.B = B;
  j.K = K;
  j.K4 = K / 4;
  j.V = V;
  j.NB = ceil_div(V, CB);
  j.per = ceil_div(per, TB) * TB;
  int units = ceil_div(j.NB, j.per), K2 = K / 2;
  float *x = (float *)malloc(sizeof(float) * (size_t)B * K);
  uint8_t *xu = (uint8_t *)malloc((size_t)B * K);
  float *rowf = (float *)malloc(sizeof(float) * (size_t)B * 4);
  char *bad = (char *)calloc((size_t)B, 1);
  for (int m = 0; m < B; m++)
    for (int k = 0; k < K; k++) {
      x[(int64_t)m * K + k] = bf16_to_f32(xn[(int64_t)m * as + k]);
      if (!isfinite(x[(int64_t)m * K + k])) bad[m] = 1;
    }
  /* the batch's SCR_P pairs of largest |x| (finite rows), ascending */
  float *pm = (float *)calloc((size_t)K2, sizeof(float));
  for (int m = 0; m < B; m++)
    if (!bad[m])
      for (int k = 0; k < K; k++) {
        float a = fabsf(x[(int64_t)m * K + k]);
        if (a > pm[k / 2]) pm[k / 2] = a;
      }
#ifdef BF16_AMX
  j.amx = B >= SCR_AMX_MIN && K % 64 == 0 && amx_on();
#endif
  j.np = j.amx || B >= SCR_P_ROWS ? SCR_P_WIDE : SCR_P; /* on tiles 16 pairs cost as 8 do */
  j.np = K2 < j.np ? K2 : j.np;
  for (int i = 0; i < j.np; i++) {
    int best = -1;
    for (int k = 0; k < K2; k++)
      if (pm[k] >= 0 && (best < 0 || pm[k] > pm[best])) best = k;
    j.pairs[i] = best;
    pm[best] = -1.f;
  }
  for (int i = 1; i < j.np; i++) /* ascending (insertion sort of <= 8) */
    for (int a = i; a > 0 && j.pairs[a - 1] > j.pairs[a]; a--) {
      int32_t t = j.pairs[a];
      j.pairs[a] = j.pairs[a - 1];
      j.pairs[a - 1] = t;
    }
  char *exact = (char *)calloc((size_t)K, 1);
  for (int i = 0; i < j.np; i++) exact[2 * j.pairs[i]] = exact[2 * j.pairs[i] + 1] = 1;
  const double g = 2.0 * (K + 2) * 0x1p-24 / (1.0 - (K + 2) * 0x1p-24);
  for (int m = 0; m < B; m++) {
    const float *xm = x + (int64_t)m * K;
    uint8_t *um = xu + (int64_t)m * K;
    float amax = 0.f;
    for (int k = 0; k < K; k++)
      if (!exact[k] && fabsf(xm[k]) > amax) amax = fabsf(xm[k]);
    float sx = amax > 0.f ? amax / 127.f : 1.f;
    double ra = 0, rr = 0, c = 0;
    for (int k = 0; k < K; k++) {
      c += (double)xm[k] * xm[k];
      if (exact[k] || bad[m]) {
        um[k] = 128;
        continue;
      }
      float v = nearbyintf(xm[k] / sx);
      v = v > 127.f ? 127.f : (v < -127.f ? -127.f : v);
      um[k] = (uint8_t)(int)(v + 128.f);
      double d = (double)xm[k] - (double)sx * v;
      ra += (double)xm[k] * xm[k];
      rr += d * d;
    }
    float *rf = rowf + (int64_t)m * 4;
    rf[0] = sx;
    rf[1] = (float)(sqrt(ra) * (1 + 0x1p-20));
    rf[2] = (float)(sqrt(rr) * (1 + 0x1p-20));
    rf[3] = (float)(g * sqrt(c) * (1 + 0x1p-20));
  }
  j.xu = xu;
  j.rowf = rowf;
  j.lo = (float *)malloc(sizeof(float) * (size_t)units * B);
  j.cc = (int32_t *)malloc(sizeof(int32_t) * (size_t)units * B);
  /* the candidate lists (2 MB at 32 rows): kept between calls, a fresh mapping's page faults
   * each call cost more than the lists' use */
  static __thread int32_t *cn_keep;
  static __thread float *cu_keep;
  static __thread size_t cn_n, cu_n;
  j.cn = cn_keep = (int32_t *)grow(cn_keep, &cn_n, (size_t)units * B * SCR_CAP, sizeof(int32_t));
  j.cu = cu_keep = (float *)grow(cu_keep, &cu_n, (size_t)units * B * SCR_CAP, sizeof(float));
  j.top = (_Atomic uint32_t *)malloc(sizeof(_Atomic uint32_t) * (size_t)B);
  for (int m = 0; m < B; m++) screen_init_top(j.top + m);
#ifdef BF16_AMX
  if (j.amx) {
    j.idots = (int32_t *)aligned_alloc(64, sizeof(int32_t) * (size_t)nt * B * TB * CB);
    j.epairs = (float *)aligned_alloc(64, sizeof(float) * (size_t)nt * B * TB * CB);
    j.xp = (uint32_t *)calloc((size_t)B * 16, sizeof(uint32_t));
    for (int m = 0; m < B; m++)
      for (int i = 0; i < j.np; i++)
        memcpy(j.xp + (int64_t)m * 16 + i, xn + (int64_t)m * as + 2 * j.pairs[i], sizeof(uint32_t));
  }
#endif
  pool_run(scr_unit, &j, units, nt);
  free(j.idots);
  free(j.epairs);
  free(j.xp);
  j.bad = bad;
  j.ids = ids;
  j.cand = (int32_t *)malloc(sizeof(int32_t) * (size_t)nt * units * SCR_CAP);
  j.wrow = (float *)malloc(sizeof(float) * (size_t)nt * j.NB * CB);
  j.units = units;
  pool_run(scr_exact_unit, &j, B, nt);
  float *row = (float *)malloc(sizeof(float) * (size_t)j.NB * CB);
  for (int m = 0; m < B; m++) {
    if (bad[m]) {
      ids[m] = head_argmax_full(xn + (int64_t)m * as, as, K, head, V, row);
      atomic_fetch_add(&g_scr_full, 1);
    }
    atomic_fetch_add(&g_scr_rows, 1);
  }
  free(row);
  free(j.cand);
  free(j.wrow);
  free(j.lo);
  free(j.cc);
  free((void *)j.top);
  free(exact);
  free(pm);
  free(bad);
  free(rowf);
  free(xu);
  free(x);
}
#else
int infer_bf16_screen_ok(void) { return 0; }
void infer_bf16_screen_stats(int64_t *out) { out[0] = out[1] = out[2] = out[3] = 0; }
#endif

/* One layer as four pool jobs (five over extend rows: the projections, then the attention);
 * between them the caller normalises rows or converts the attention output. A job's units
 * write disjoint columns (or rows), so the only waits are for units already taken: a helper
 * kept off its core takes none. pf: the prefill attention's job (extend rows), or NULL (decode:
 * one new row per sequence, attention fused with the projections). */
static void run_layer(dec_job *j, int nt, pf_job *pf) {
  const bf16_step *st = j->st;
  int B = st->B, att_w = st->H * st->D;
  norm_rows(j, j->L->in_norm, nt);
  int ng = j->split_heads ? st->Hkv : 1;
  if (pf != NULL) {
    pool_run(fwd_qkv_unit, j, ng * ceil_div(B, j->rows_a), nt);
    bf16_prefill *a = (bf16_prefill *)pf->a;
    a->k_cache = j->L->k_cache;
    a->v_cache = j->L->v_cache;
    if (pf->dec != NULL) {
      bf16_attn *d = (bf16_attn *)pf->dec;
      d->k_cache = j->L->k_cache;
      d->v_cache = j->L->v_cache;
    }
    pf_attend(pf, nt);
  } else {
    pool_run(dec_attn_unit, j, ng * ceil_div(B, j->rows_a), nt);
    if (j->attn_apart) pool_run(dec_heads_unit, j, B, nt);
  }
  j->a_in = j->xn;
  j->a_s = j->as;
#ifdef BF16_DP
  if (att_w % 2 == 0) { /* att rows are already the GEMM's bf16 pairs */
    j->a_in = j->att;
    j->a_s = att_w;
  } else
#endif
    for (int m = 0; m < B; m++) act_row(j->att + (int64_t)m * att_w, 1, att_w, j->xn + m * j->as);
  int hb = ceil_div(st->hidden, CB), ib = ceil_div(st->inter, CB);
  int ou = ceil_div(hb, j->per_h) + j->split_h * (ceil_div(B, j->rows_h) - 1);
  pool_run(dec_o_unit, j, ou, nt);
  norm_rows(j, j->L->post_norm, nt);
  pool_run(dec_mlp_unit, j, j->split_inter ? ceil_div(ib, j->per_i) : 1, nt);
  pool_run(dec_down_unit, j, ou, nt);
}

/* Every layer of a Llama-family stack over T rows: h [T, hidden] float32 (the embeddings in,
 * the last layer's output out); row m at position pos[m], its k/v written at slots[m].
 * Decode (ext_lens NULL): T sequences of one new row each, seq_lens [T]. Extend (ext_lens
 * given): n_seqs sequences, sequence s's ext_lens[s] rows packed in order at the last
 * positions of its seq_lens[s] keys (prefill, extend over a cached prefix, decode rows, mixed),
 * each row attending to the keys up to its own position (the prefill attention above).
 * On `threads` threads (0: the library's count). With a final norm (float32 [hidden], eps
 * final_eps) and a pair-packed LM head [vocab, hidden], also logits [n_logits, vocab] float32
 * = lm_head(norm(h[logit_rows[i]])) (logit_rows NULL: every row, n_logits = T); with ids
 * (int64 [n_logits]) instead, each of those rows' argmax, exactly (the int8 screen above where
 * screen is given and the library has it, else every logit). */
static void run_stack(const infer_bf16_layer *layers, int n_layers, float *h, int T, int hidden,
                      int H, int Hkv, int D, int inter, float eps, const int64_t *pos,
                      const float *cos_sin, int rot_dim, const int64_t *slots,
                      const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                      const int32_t *ext_lens, int n_seqs, int page, float scale, int threads,
                      const float *final_norm, float final_eps, const bf16 *lm_head, int vocab,
                      const int64_t *logit_rows, int n_logits, float *logits,
                      const infer_bf16_screen *screen, int64_t *ids) {
  int B = T, seqs = ext_lens ? n_seqs : T;
  bf16_step st = {layers, n_layers, B, hidden, H, Hkv, D, inter, rot_dim, page, eps, scale,
                  h, pos, slots, cos_sin, block_tables, seq_lens, bt_stride};
  int qkv_w = (H + 2 * Hkv) * D, kmax = hidden > H * D ? hidden : H * D, lmax = 1;
  kmax = kmax > inter ? kmax : inter;
  for (int m = 0; m < seqs; m++) lmax = seq_lens[m] > lmax ? seq_lens[m] : lmax;
  int nt = threads > 0 ? threads : g_threads;
  nt = nt < POOL_MAX ? nt : POOL_MAX;
  int64_t as = 2 * ((kmax + 1) / 2);
  dec_scratch *w = (dec_scratch *)calloc((size_t)nt, sizeof(dec_scratch));
  for (int i = 0; i < nt; i++) {
    w[i].tmp = (float *)malloc(sizeof(float) * (size_t)kmax);
    w[i].s = (float *)malloc(sizeof(float) * (size_t)H * lmax);
    w[i].o = (float *)malloc(sizeof(float) * (size_t)(H * D + H));
  }
  dec_job j;
  memset(&j, 0, sizeof j);
  j.st = &st;
  j.xn = (act_t *)malloc(sizeof(act_t) * (size_t)B * as);
  j.down = (act_t *)malloc(sizeof(act_t) * (size_t)B * as);
  j.qkv = (float *)malloc(sizeof(float) * (size_t)B * qkv_w);
  j.gu = (float *)malloc(sizeof(float) * (size_t)B * 2 * inter);
  j.att = (bf16 *)malloc(sizeof(bf16) * (size_t)B * H * D);
  j.as = as;
  j.split_heads = D % CB == 0;
#if !defined(__AVX512F__) && defined(INFER_ATTN_TILES)
  j.attn_apart = ext_lens == NULL && j.split_heads && B >= ATTN_APART_ROWS && D % 32 == 0 &&
                 H / Hkv <= 64;
#endif
  j.split_inter = inter % CB == 0;
  /* Phase A's rows per unit. Decode over more than 8 rows: the rows in c chunks, c the fewest
   * that make the units (KV groups x chunks) a multiple of the threads, two a thread or more:
   * 32 rows, 3 KV heads, 2 threads as 6 units of 16 rows (8-row units took 4-row tiles, about
   * 2 % slower a step). Up to 8 rows, one chunk: each chunk reads the weights again. */
  j.rows_a = ext_lens ? 32 : 8;
  if (!ext_lens && B > 8) {
    int ng = j.split_heads ? Hkv : 1, c = 1;
    while ((ng * c) % nt != 0 || ng * c < 2 * nt) c++;
    j.rows_a = B > c ? ceil_div(B, c) : 1;
  }
  j.per_h = unit_blocks(ceil_div(hidden, CB), nt);
  j.rows_h = B;
  if (ext_lens) {
    residual_units(&j.per_h, &j.rows_h, ceil_div(hidden, CB), B, nt);
    j.split_h = ceil_div(ceil_div(hidden, CB), j.per_h);
  } else { /* decode: column groups of all rows (each group's weights stream from memory once),
          * but the groups a whole round of the threads cannot take split by rows (36 blocks on 2
          * threads: 8 groups of 4 whole, the ninth as two halves of 16 rows; 32-row step
          * 1.01-1.02x, the same bits) */
    int groups = ceil_div(ceil_div(hidden, CB), j.per_h), rows = ceil_div(ceil_div(B, nt), TM) * TM;
    if (groups % nt && rows >= 8 && rows < B) {
      j.split_h = groups % nt;
      j.rows_h = rows;
    }
  }
  j.per_i = unit_blocks(ceil_div(inter, CB), nt);
  j.w = w;
  /* extend rows: the prefill attention's job, its units and per-worker scratch */
  pf_job pf;
  bf16_prefill pa;
  bf16_attn dat;
  float *dec_s[POOL_MAX], *dec_o[POOL_MAX];
  int32_t *row0 = NULL, *unit0 = NULL;
  if (ext_lens) {
    j.qb = (bf16 *)malloc(sizeof(bf16) * (size_t)B * H * D);
    pf_offsets(ext_lens, seqs, Hkv, &row0, &unit0);
    bf16_prefill a0 = {j.qb, (int64_t)H * D, NULL, NULL, block_tables, bt_stride, seq_lens,
                       ext_lens, row0, j.att, H, Hkv, D, page, scale};
    pa = a0;
    memset(&pf, 0, sizeof pf);
    pf.a = &pa;
    pf.unit0 = unit0;
    pf.n_seqs = seqs;
    pf.w = (pf_scratch *)calloc((size_t)nt, sizeof(pf_scratch));
    bf16_attn d0 = {j.qkv, qkv_w, NULL, NULL, block_tables, bt_stride, seq_lens, j.att, H, Hkv, D,
                    page, scale};
    dat = d0;
    for (int i = 0; i < nt; i++) {
      dec_s[i] = w[i].s;
      dec_o[i] = w[i].o;
    }
    pf.dec = &dat;
    pf.dec_s = dec_s;
    pf.dec_o = dec_o;
  }
  for (int l = 0; l < n_layers; l++) {
    j.L = layers + l;
    run_layer(&j, nt, ext_lens ? &pf : NULL);
  }
  if (final_norm) {
    bf16_step st2 = st; /* the logit rows only */
    float *hl = NULL;
    if (logit_rows) {
      hl = (float *)malloc(sizeof(float) * (size_t)(n_logits > 0 ? n_logits : 1) * hidden);
      for (int i = 0; i < n_logits; i++)
        memcpy(hl + (int64_t)i * hidden, h + logit_rows[i] * hidden, sizeof(float) * (size_t)hidden);
      st2.h = hl;
      st2.B = n_logits;
      j.st = &st2;
    }
    j.final_norm = final_norm;
    j.lm_head = lm_head;
    j.vocab = vocab;
    j.logits = logits;
    j.per_v = ceil_div(ceil_div(vocab, CB), 16 * nt); /* 16 units a thread: the largest GEMM */
    j.per_v = ceil_div(j.per_v, TILE_TB) * TILE_TB;
    if (st2.B > 0) {
      dec_norm_rows(&j, final_norm, final_eps);
      if (ids != NULL) {
#ifndef SCR
        (void)screen;
#else
        if (screen != NULL && screen->K == hidden && hidden % 4 == 0) {
          head_greedy(j.xn, j.as, st2.B, hidden, lm_head, vocab, screen, j.per_v, nt, ids);
        } else
#endif
        { /* every logit, on the pool as for a logits step, then each row's argmax */
          j.logits = (float *)malloc(sizeof(float) * (size_t)st2.B * vocab);
          pool_run(dec_head_unit, &j, ceil_div(ceil_div(vocab, CB), j.per_v), nt);
          for (int m = 0; m < st2.B; m++) ids[m] = argmax_rule(j.logits + (int64_t)m * vocab, vocab);
          free(j.logits);
        }
      } else
        pool_run(dec_head_unit, &j, ceil_div(ceil_div(vocab, CB), j.per_v), nt);
    }
    free(hl);
  }
  if (ext_lens) {
    pf_free(&pf, nt);
    free(row0);
    free(unit0);
    free(j.qb);
  }
  for (int i = 0; i < nt; i++) {
    free(w[i].tmp);
    free(w[i].s);
    free(w[i].o);
  }
  free(w);
  free(j.xn);
  free(j.down);
  free(j.qkv);
  free(j.gu);
  free(j.att);
}

/* One decode step of every layer (run_stack's decode mode): B sequences, one new token each at
 * pos[m]; logits [B, vocab] (or, with ids, their argmax [B]) for every row when final_norm is
 * given. */
void infer_bf16_decode_layers(const infer_bf16_layer *layers, int n_layers, float *h, int B,
                              int hidden, int H, int Hkv, int D, int inter, float eps,
                              const int64_t *pos, const float *cos_sin, int rot_dim,
                              const int64_t *slots, const int32_t *block_tables, int64_t bt_stride,
                              const int32_t *seq_lens, int page, float scale, int threads,
                              const float *final_norm, float final_eps, const bf16 *lm_head,
                              int vocab, float *logits, const infer_bf16_screen *screen,
                              int64_t *ids) {
  run_stack(layers, n_layers, h, B, hidden, H, Hkv, D, inter, eps, pos, cos_sin, rot_dim, slots,
            block_tables, bt_stride, seq_lens, NULL, B, page, scale, threads, final_norm,
            final_eps, lm_head, vocab, NULL, B, logits, screen, ids);
}

/* A forward over extend rows (run_stack's extend mode): T rows of n_seqs sequences; logits
 * [n_logits, vocab] (or, with ids, their argmax [n_logits]) of the rows logit_rows (int64) when
 * final_norm is given. */
void infer_bf16_forward_layers(const infer_bf16_layer *layers, int n_layers, float *h, int T,
                               int hidden, int H, int Hkv, int D, int inter, float eps,
                               const int64_t *pos, const float *cos_sin, int rot_dim,
                               const int64_t *slots, const int32_t *block_tables,
                               int64_t bt_stride, const int32_t *seq_lens,
                               const int32_t *ext_lens, int n_seqs, int page, float scale,
                               int threads, const float *final_norm, float final_eps,
                               const bf16 *lm_head, int vocab, const int64_t *logit_rows,
                               int n_logits, float *logits, const infer_bf16_screen *screen,
                               int64_t *ids) {
  run_stack(layers, n_layers, h, T, hidden, H, Hkv, D, inter, eps, pos, cos_sin, rot_dim, slots,
            block_tables, bt_stride, seq_lens, ext_lens, n_seqs, page, scale, threads, final_norm,
            final_eps, lm_head, vocab, logit_rows, n_logits, logits, screen, ids);
}
