/*
 * Vectorized exp and SiLU, and the bf16 <-> float32 conversions, shared by the CPU plugin's
 * kernels (infer_cpu_kernels.c and infer_cpu_bf16.c include this file; native_build.py keys the
 * compiled libraries on it too).
 *
 * exp(x): x is clamped to [-87.3, 88.3] (beyond that float32 exp under- or overflows), split as
 * x = k ln2 + r with k = round(x log2 e) and ln2 in two parts (0.693359375 - 2.12194440e-4, so
 * k * 0.693359375 is exact), and exp(r) = 1 + r + r^2 P(r) with Cephes' degree-5 minimax P for
 * |r| <= ln2 / 2 (relative error about 1 ulp), then scaled by 2^k built in the exponent bits.
 * The AVX-512, AVX2 and scalar versions do the same operations in the same order (FMAs where
 * FMAs are written), so an element's result does not depend on which one computes it: a row's
 * vector body and its scalar tail agree with what another width would give.
 *
 * silu(g) = g / (1 + exp(-g)), as the float32 references compute it.
 */
#ifndef INFER_CPU_VMATH_H
#define INFER_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define VM_LO (-87.3f)
#define VM_HI 88.3f
#define VM_LOG2E 1.44269504088896341f
#define VM_C1 0.693359375f
#define VM_C2 (-2.12194440e-4f)
#define VM_P0 1.9875691500e-4f
#define VM_P1 1.3981999507e-3f
#define VM_P2 8.3334519073e-3f
#define VM_P3 4.1665795894e-2f
#define VM_P4 1.6666665459e-1f
#define VM_P5 5.0000001201e-1f

/* exp(x), scalar; the same steps as the vector versions. */
static inline float vm_exp(float x) {
  x = x < VM_LO ? VM_LO : (x > VM_HI ? VM_HI : x);
  float k = nearbyintf(x * VM_LOG2E); /* round to nearest even, as the vector rounding */
  float r = fmaf(k, -VM_C1, x);
  r = fmaf(k, -VM_C2, r);
  float p = fmaf(VM_P0, r, VM_P1);
  p = fmaf(p, r, VM_P2);
  p = fmaf(p, r, VM_P3);
  p = fmaf(p, r, VM_P4);
  p = fmaf(p, r, VM_P5);
  float r2 = r * r;
  p = fmaf(p, r2, r + 1.f);
  uint32_t e = (uint32_t)((int32_t)k + 127) << 23;
  float s;
  memcpy(&s, &e, sizeof s);
  return p * s;
}

static inline float vm_silu(float g) { return g / (1.f + vm_exp(-g)); }

#if defined(__AVX512F__)
static inline __m512 vm_exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(VM_LO)), _mm512_set1_ps(VM_HI));
  __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(VM_LOG2E)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-VM_C1), x);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(-VM_C2), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(VM_P0), r, _mm512_set1_ps(VM_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_P5));
  __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

static inline __m512 vm_silu16(__m512 g) {
  __m512 e = vm_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 vm_exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(VM_LO)), _mm256_set1_ps(VM_HI));
  __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(VM_LOG2E)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-VM_C1), x);
  r = _mm256_fmadd_ps(k, _mm256_set1_ps(-VM_C2), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(VM_P0), r, _mm256_set1_ps(VM_P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_P5));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline __m256 vm_silu8(__m256 g) {
  __m256 e = vm_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
}
#endif

/* o[i] = silu(g[i]) * u[i] for i < n (float32). */
static inline void vm_silu_mul(const float *g, const float *u, float *o, int n) {
  int i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, _mm512_mul_ps(vm_silu16(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_mul_ps(vm_silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
#endif
  for (; i < n; i++) o[i] = vm_silu(g[i]) * u[i];
}

#ifdef __AVX2__
/* The largest of m's 8 lanes (max_ps takes its second operand where either is NaN). */
static inline float vm_hmax8(__m256 m) {
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
#endif

/* max_j s[j] over [0, n) (-inf when n is 0), NaNs skipped as `s > mx ? s : mx` skips them
 * (max_ps returns its second operand when either is NaN): any order gives the same maximum, so
 * the lanes give the scalar loop's result without its chain of dependent max ops. */
static inline float vm_max(const float *s, int n) {
  int j = 0;
  float mx = -INFINITY;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(s + j), m);
  mx = _mm512_reduce_max_ps(m);
#elif defined(__AVX2__)
  __m256 m = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + j), m);
  mx = vm_hmax8(m);
#endif
  for (; j < n; j++) mx = s[j] > mx ? s[j] : mx;
  return mx;
}

/* s[j] <- exp(s[j] * scale - mx) for j < n; returns their float32 sum (vector lanes, then the
 * tail). With scale = 1 the plain softmax numerator. */
static inline float vm_exp_sub(float *s, int n, float scale, float mx) {
  int j = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps(), vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(mx);
  for (; j + 16 <= n; j += 16) {
    __m512 v = vm_exp16(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vs, vm));
    _mm512_storeu_ps(s + j, v);
    acc = _mm512_add_ps(acc, v);
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps(), vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(mx);
  for (; j + 8 <= n; j += 8) {
    __m256 v = vm_exp8(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vs, vm));
    _mm256_storeu_ps(s + j, v);
    acc = _mm256_add_ps(acc, v);
  }
  float t[8];
  _mm256_storeu_ps(t, acc);
  for (int i = 0; i < 8; i++) sum += t[i];
#endif
  for (; j < n; j++) {
    s[j] = vm_exp(fmaf(s[j], scale, -mx));
    sum += s[j];
  }
  return sum;
}

/* bf16 bits (the upper half of a float32) as the float32 they stand for: exact. */
static inline float bf16_to_f32(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even (NaN stays NaN); the same as torch's float -> bfloat16. */
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* fp16 (IEEE binary16) bits as the float32 they stand for: exact (GCC's _Float16). */
static inline float f16_to_f32(uint16_t v) {
  _Float16 h;
  memcpy(&h, &v, sizeof h);
  return (float)h;
}

/* Round to nearest even, overflow to infinity, NaN stays NaN: the same as torch's
 * float -> float16 conversion. */
static inline uint16_t f32_to_f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t v;
  memcpy(&v, &h, sizeof v);
  return v;
}

#if defined(__AVX2__)
/* 8 fp16 at p as float32 (exact). */
static inline __m256 vm_f16x8_load(const uint16_t *p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
  float t[8];
  for (int i = 0; i < 8; i++) t[i] = f16_to_f32(p[i]);
  return _mm256_loadu_ps(t);
#endif
}

/* 8 bf16 at p as float32 (exact). */
static inline __m256 vm_bf16x8_load(const uint16_t *p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#endif

#endif /* INFER_CPU_VMATH_H */
