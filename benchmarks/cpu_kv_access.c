/*
 * The decode attention's memory reads alone, as a bound for the bf16 decode attention's kernel:
 * a 32-row decode step of SmolLM2-135M (30 layers, 3 KV heads of 64 bf16, so a position's row is
 * 384 bytes in each of the key and value caches) over 192 positions a sequence, with no compute
 * but the loads (each 64-byte line is loaded once, through an asm the compiler cannot drop).
 *
 *   cc -O2 -march=native -pthread benchmarks/cpu_kv_access.c -o /tmp/kv_access && /tmp/kv_access
 *
 * Each layer first streams 7 MB (the size of a layer's weights, which pass through the caches
 * between two attentions in a real step), then reads its keys and values; only the second phase
 * is timed. Prints the milliseconds a step (and the GB/s of key and value bytes) for each access
 * order x cache layout, the mean of 8 steps, rounds alternating, best round, on 2 threads (each
 * its half of the rows), then the same with the keys and values prefetched during the stream
 * (as a GEMM that overlapped its reads with the next attention's would). Orders:
 *   per-head   each KV head's keys, then its values, over the whole sequence (the library's
 *              attend_regs: 128 of each row's 384 bytes a pass), 16 positions' prefetch ahead;
 *   row-block  keys in blocks of 16 positions, each block taken by every head in turn;
 *   whole-row  a position's whole row at once (all heads), keys then values.
 * Layouts: page 1 = the engine's default (each prompt's 128 positions in one run of slots, the
 * 64 decoded positions interleaved across the 32 sequences, as decode steps allocate them);
 * pages of 16 / 64 positions (prompt pages in order, decode pages as they fill); contiguous =
 * each sequence's positions in one run.
 *
 * Session 34 (AMD EPYC Zen 5, 2 vCPUs): address order 42-46 GB/s; per-head 4.9-5.9 ms at page 1
 * (about the library's own attention in a 32-row step), whole-row 4.4-4.6 at page 1 and 3.4-3.9
 * contiguous; prefetched during the stream 2.0-3.2 (from the L3). Kernels that read in the
 * whole-row and row-block orders were no faster in the library (benchmarks/cpu_vllm_notes.md,
 * session 34), nor was prefetching during the GEMMs, whose weight stream the reads compete with.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS 30
#define ROWS 32
#define PROMPT 128
#define DECODED 64
#define LEN (PROMPT + DECODED)
#define ROW_BYTES 384 /* 3 KV heads x 64 bf16 */
#define HEAD_BYTES 128
#define STREAM_BYTES (7L << 20)
#define THREADS 2
#define STEPS 8 /* steps a measurement */

static char *kc[LAYERS], *vc[LAYERS], *wt[LAYERS];
static long slot[ROWS][LEN];
static int order, prefetch_in_stream;
static pthread_barrier_t bar;
static double attn_s[THREADS];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline __m512 load_line(const char *p) {
  __m512 x;
  __asm__ volatile("vmovaps %1, %0" : "=v"(x) : "m"(*(const __m512 *)p));
  return x;
}

/* page = 0: contiguous; 1: the engine's page-1 order; else pages of `page` positions */
static void layout(int page) {
  if (page <= 1) {
    for (int b = 0; b < ROWS; b++)
      for (int j = 0; j < LEN; j++)
        slot[b][j] = page == 0 ? (long)b * LEN + j
                               : (j < PROMPT ? (long)b * PROMPT + j : (long)ROWS * PROMPT + (long)(j - PROMPT) * ROWS + b);
    return;
  }
  long next = 0, cur[ROWS];
  for (int b = 0; b < ROWS; b++) {
    long pages = (PROMPT + page - 1) / page;
    for (int j = 0; j < PROMPT; j++) slot[b][j] = (next + j / page) * page + j % page;
    cur[b] = next + pages - 1;
    next += pages;
  }
  for (int j = PROMPT; j < LEN; j++)
    for (int b = 0; b < ROWS; b++) {
      if (j % page == 0) cur[b] = next++;
      slot[b][j] = cur[b] * page + j % page;
    }
}

static __m512 read_row(int l, int b, __m512 acc) {
  for (int kv = 0; kv < 2; kv++) {
    const char *base = kv ? vc[l] : kc[l];
    if (order == 0) { /* per-head */
      for (int g = 0; g < 3; g++)
        for (int j = 0; j < LEN; j++) {
          if (j + 16 < LEN)
            for (int c = 0; c < 2; c++)
              _mm_prefetch(base + slot[b][j + 16] * ROW_BYTES + g * HEAD_BYTES + 64 * c, _MM_HINT_T0);
          const char *p = base + slot[b][j] * ROW_BYTES + g * HEAD_BYTES;
          acc = _mm512_add_ps(acc, _mm512_add_ps(load_line(p), load_line(p + 64)));
        }
    } else if (order == 1) { /* row-block */
      for (int j0 = 0; j0 < LEN; j0 += 16)
        for (int g = 0; g < 3; g++)
          for (int j = j0; j < j0 + 16 && j < LEN; j++) {
            if (g == 0 && j + 16 < LEN)
              for (int c = 0; c < 6; c++) _mm_prefetch(base + slot[b][j + 16] * ROW_BYTES + 64 * c, _MM_HINT_T0);
            const char *p = base + slot[b][j] * ROW_BYTES + g * HEAD_BYTES;
            acc = _mm512_add_ps(acc, _mm512_add_ps(load_line(p), load_line(p + 64)));
          }
    } else { /* whole-row */
      for (int j = 0; j < LEN; j++) {
        if (j + 16 < LEN)
          for (int c = 0; c < 6; c++) _mm_prefetch(base + slot[b][j + 16] * ROW_BYTES + 64 * c, _MM_HINT_T0);
        const char *p = base + slot[b][j] * ROW_BYTES;
        for (int c = 0; c < 6; c++) acc = _mm512_add_ps(acc, load_line(p + 64 * c));
      }
    }
  }
  return acc;
}

static void *worker(void *arg) {
  int id = (int)(long)arg;
  __m512 acc = _mm512_setzero_ps();
  double t_attn = 0;
  for (int step = 0; step < STEPS; step++)
  for (int l = 0; l < LAYERS; l++) {
    { /* stream this thread's half of the layer's 7 MB (the weights that pass through the caches
         between two attentions), with prefetch_in_stream the keys and values of its rows
         prefetched a few at a time along the way */
      long lines = STREAM_BYTES / THREADS / 64, pos = 0, total = 0;
      for (int b = id; b < ROWS; b += THREADS) total += 2L * LEN;
      const char *w = wt[l] + id * (STREAM_BYTES / THREADS);
      int b = id, j = 0, kv = 0;
      for (long i = 0; i < lines; i++) {
        acc = _mm512_add_ps(acc, load_line(w + i * 64));
        for (long want = prefetch_in_stream ? (i + 1) * total / lines : 0; pos < want; pos++) {
          const char *p = (kv ? vc[l] : kc[l]) + slot[b][j] * ROW_BYTES;
          for (int c = 0; c < 6; c++) _mm_prefetch(p + 64 * c, _MM_HINT_T0);
          if (++j == LEN) {
            j = 0;
            if ((b += THREADS) >= ROWS) b = id, kv++;
          }
        }
      }
    }
    pthread_barrier_wait(&bar);
    double t0 = now();
    if (order == 3) { /* plain: this thread's half of the layer's keys, then of its values,
                         in address order */
      long half = (long)ROWS * LEN * ROW_BYTES / THREADS;
      for (int kv = 0; kv < 2; kv++)
        for (long i = 0; i < half; i += 64) acc = _mm512_add_ps(acc, load_line((kv ? vc[l] : kc[l]) + id * half + i));
    } else
      for (int b = id; b < ROWS; b += THREADS) acc = read_row(l, b, acc);
    pthread_barrier_wait(&bar);
    t_attn += now() - t0;
  }
  attn_s[id] = t_attn;
  float s = _mm512_reduce_add_ps(acc);
  if (s == 1.5f) printf(" ");
  return NULL;
}

static double run(int ord, int page, int stream) {
  order = ord, prefetch_in_stream = stream;
  layout(page);
  pthread_t t[THREADS];
  for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  return attn_s[0] * 1e3 / STEPS;
}

int main(void) {
  long cap = (long)ROWS * (PROMPT + 64) + (long)ROWS * 64 * 2; /* room for any layout's pages */
  for (int l = 0; l < LAYERS; l++) {
    kc[l] = aligned_alloc(4096, cap * ROW_BYTES);
    vc[l] = aligned_alloc(4096, cap * ROW_BYTES);
    wt[l] = aligned_alloc(4096, STREAM_BYTES);
    memset(kc[l], 1, cap * ROW_BYTES);
    memset(vc[l], 1, cap * ROW_BYTES);
    memset(wt[l], 1, STREAM_BYTES);
  }
  pthread_barrier_init(&bar, NULL, THREADS);
  const char *orders[] = {"per-head", "row-block", "whole-row"};
  const int pages[] = {1, 16, 64, 0};
  const char *page_names[] = {"page 1", "pages of 16", "pages of 64", "contiguous"};
  double best[3][4][2], plain = 1e9;
  for (int o = 0; o < 3; o++)
    for (int p = 0; p < 4; p++) best[o][p][0] = best[o][p][1] = 1e9;
  for (int round = 0; round < 3; round++) {
    double ms = run(3, 1, 0);
    plain = ms < plain ? ms : plain;
    for (int o = 0; o < 3; o++)
      for (int p = 0; p < 4; p++)
        for (int s = 0; s < 2; s++) {
          if (s && p != 0) continue; /* the stream case at the engine's layout only */
          double ms = run(o, pages[p], s);
          if (ms < best[o][p][s]) best[o][p][s] = ms;
        }
  }
  double bytes = 2.0 * LAYERS * ROWS * LEN * ROW_BYTES;
  printf("the same bytes read in address order (after the same stream): %.2f ms a step (%.1f GB/s)\n\n", plain,
         bytes / plain / 1e6);
  printf("| order | layout | keys and values from memory: ms a step (GB/s) | prefetched during a 7 MB/layer stream |\n");
  printf("| --- | --- | --- | --- |\n");
  for (int o = 0; o < 3; o++)
    for (int p = 0; p < 4; p++) {
      printf("| %s | %s | %.2f (%.1f) |", orders[o], page_names[p], best[o][p][0], bytes / best[o][p][0] / 1e6);
      if (p == 0)
        printf(" %.2f (%.1f) |\n", best[o][p][1], bytes / best[o][p][1] / 1e6);
      else
        printf(" |\n");
    }
  return 0;
}
