/*
 * Instruction-mix ceilings of this CPU's AVX2 ports, for judging how close the CPU plugin's
 * tiles are to what the hardware allows (issue 14's notes, session 20). One thread, no memory
 * traffic (every operand in registers or L1), the clock assumed fixed at GHZ (this VM does not
 * report it: set it from the first line, where 8 independent FMA chains run 2 FMAs a cycle).
 *
 *   gcc -O2 -o /tmp/cpu_isa_peak benchmarks/cpu_isa_peak.c && /tmp/cpu_isa_peak [GHZ]
 *
 * Lines: FMA alone; vpmaddwd alone; vpmaddwd + vpaddd pairs (the int16 tile's multiply and
 * accumulate, AVX2 having no vpdpwssd); the int16 tile's inner loop (a 6-row x 16-column
 * register tile: per pair of K, 2 weight loads, 6 broadcast loads, 12 vpmaddwd + vpaddd);
 * and the same with the per-block float steps of `i8_tile` (per 32 K and row pair: a
 * conversion, a scale product, two FMAs into accumulators kept in memory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int ibuf[64] __attribute__((aligned(64)));
static float fbuf[1024] __attribute__((aligned(64)));

#define X8(op)                                                                                   \
  op "%%ymm0, %%ymm1, %%ymm2\n" op "%%ymm0, %%ymm1, %%ymm3\n" op "%%ymm0, %%ymm1, %%ymm4\n" op \
     "%%ymm0, %%ymm1, %%ymm5\n" op "%%ymm0, %%ymm1, %%ymm6\n" op "%%ymm0, %%ymm1, %%ymm7\n" op \
     "%%ymm0, %%ymm1, %%ymm8\n" op "%%ymm0, %%ymm1, %%ymm9\n"
#define CLOB8 "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9"
#define PAIR(t, a) "vpmaddwd %%ymm0, %%ymm1, %%ymm" #t "\n vpaddd %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n"
/* one K pair of the 6 x 16 tile: accumulators ymm4..ymm15, weights ymm0 / ymm1 */
#define ROW(off, a, b)                                                                      \
  "vpbroadcastd " #off "(%0), %%ymm2\n vpmaddwd %%ymm2, %%ymm0, %%ymm3\n vpaddd %%ymm3, %%ymm" #a \
  ", %%ymm" #a "\n vpmaddwd %%ymm2, %%ymm1, %%ymm3\n vpaddd %%ymm3, %%ymm" #b ", %%ymm" #b "\n"
#define GROUP                                                                               \
  "vmovdqa (%1), %%ymm0\n vmovdqa 32(%1), %%ymm1\n" ROW(0, 4, 5) ROW(4, 6, 7) ROW(8, 8, 9)  \
      ROW(12, 10, 11) ROW(16, 12, 13) ROW(20, 14, 15)
#define BLOCK GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP
/* the float steps of one accumulator at the end of a block (its float sum in memory) */
#define SCALE(r)                                                                               \
  "vcvtdq2ps %%ymm" #r ", %%ymm3\n vbroadcastss " #r "*4(%2), %%ymm2\n vmulps 2048(%2), %%ymm2, " \
  "%%ymm2\n vfmadd213ps " #r "*32+128(%2), %%ymm3, %%ymm2\n vbroadcastss " #r "*4+64(%2), "      \
  "%%ymm3\n vfmadd231ps 2080(%2), %%ymm3, %%ymm2\n vmovaps %%ymm2, " #r "*32+128(%2)\n"
#define ZERO(r) "vpxor %%ymm" #r ", %%ymm" #r ", %%ymm" #r "\n"
#define TILE_CLOB                                                                               \
  "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",     \
      "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

int main(int argc, char **argv) {
  double ghz = argc > 1 ? atof(argv[1]) : 0, t;
  long n, N = 100000000;
  t = now();
  for (n = 0; n < N; n++) __asm__ volatile(X8("vfmadd231ps ")::: CLOB8);
  t = now() - t;
  double fma = N * 8 / t / 1e9;
  if (ghz <= 0) ghz = fma / 2; /* 8 chains of latency 4 at 2 a cycle */
  printf("clock taken as %.2f GHz (FMA at 2 a cycle: %.2f G/s)\n", ghz, fma);
  t = now();
  for (n = 0; n < N; n++) __asm__ volatile(X8("vpmaddwd ")::: CLOB8);
  t = now() - t;
  printf("vpmaddwd alone            %.2f a cycle\n", N * 8 / t / 1e9 / ghz);
  t = now();
  for (n = 0; n < N; n++)
    __asm__ volatile(PAIR(10, 2) PAIR(11, 3) PAIR(12, 4) PAIR(13, 5) PAIR(10, 6) PAIR(11, 7)
                         PAIR(12, 8) PAIR(13, 9)::: CLOB8, "xmm10", "xmm11", "xmm12", "xmm13");
  t = now() - t;
  printf("vpmaddwd + vpaddd         %.2f pairs a cycle\n", N * 8 / t / 1e9 / ghz);
  N /= 20;
  t = now();
  for (n = 0; n < N; n++) __asm__ volatile(BLOCK ::"r"(ibuf), "r"(ibuf), "r"(fbuf) : TILE_CLOB);
  t = now() - t;
  printf("int16 tile, inner loop    %.2f vpmaddwd a cycle\n", N * 192 / t / 1e9 / ghz);
  t = now();
  for (n = 0; n < N; n++)
    __asm__ volatile(BLOCK SCALE(4) SCALE(5) SCALE(6) SCALE(7) SCALE(8) SCALE(9) SCALE(10)
                         SCALE(11) SCALE(12) SCALE(13) SCALE(14) SCALE(15) ZERO(4) ZERO(5) ZERO(6)
                             ZERO(7) ZERO(8) ZERO(9) ZERO(10) ZERO(11) ZERO(12) ZERO(13) ZERO(14)
                                 ZERO(15)::"r"(ibuf),
                     "r"(ibuf), "r"(fbuf)
                     : TILE_CLOB);
  t = now() - t;
  printf("int16 tile, with scaling  %.2f vpmaddwd a cycle (x 16 x GHz x cores = G multiply-adds a second)\n",
         N * 192 / t / 1e9 / ghz);
  return 0;
}
