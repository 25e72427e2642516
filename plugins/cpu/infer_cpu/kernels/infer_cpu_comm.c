/* The shared-memory all-reduce of infer_cpu.ops.shm_comm in C, so the native decode step
 * (infer_decode_layers) can sum its row-parallel outputs across tensor-parallel ranks without
 * returning to Python. It works on the segment the Python communicator set up, with the same
 * layout and the same collective counter (``seq`` below is the Python side's counter), so C and
 * Python collectives interleave in one sequence:
 *
 *   header: arrived int64 [W] (the last collective each rank has written), pid int64 [W]
 *   data:   2 buffers x W slots x slot_bytes
 *
 * Collective s uses buffer s % 2: copy this rank's chunk into its slot, publish arrived[rank] = s
 * (release), wait until every rank has arrived at s (acquire), then sum the W slots in rank order
 * 0..W-1: slot 0 + slot 1, then + slot r, the order of the Python path (torch.add then add_), so
 * both give the same bits on every rank. A float32 tensor larger than a slot goes through in
 * slot-sized chunks, one collective each.
 *
 * The wait spins briefly (256 pauses), then yields the core (2,000 times), then sleeps 20 us
 * between polls (the Python path yields from the start: on 2 shared cores, a rank spinning
 * longer measured slower at the median, taking the core its peer needs); about once a
 * second it checks that the ranks it waits for are alive (a pid that has exited, or is a zombie,
 * is dead) and it gives up after timeout_s. Either failure returns non-zero with ``error`` and
 * ``failed_rank`` set, never a hang. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <time.h>

typedef struct {
  int64_t *arrived;   /* [W], in the segment */
  int64_t *pids;      /* [W], in the segment */
  uint8_t *data;      /* [2][W][slot_bytes], in the segment */
  int64_t slot_bytes;
  int64_t seq;        /* the last collective this rank has taken part in */
  int world, rank;
  double timeout_s;
  int error;          /* of the last call: 0, INFER_COMM_PEER_EXITED or INFER_COMM_TIMEOUT */
  int failed_rank;    /* the rank that exited, or the first late one */
  double busy_s;      /* seconds spent in infer_shm_all_reduce so far (waits included) */
} infer_shm;

enum { INFER_COMM_PEER_EXITED = 1, INFER_COMM_TIMEOUT = 2 };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* 0 for a process that has exited or is a zombie (killed, not yet reaped by its parent). */
static int alive(int64_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return !(kill((pid_t)pid, 0) != 0 && errno == ESRCH);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the state letter follows the command name */
  if (p == NULL || p[1] == 0 || p[2] == 0) return 1;
  return p[2] != 'Z' && p[2] != 'X';
}

static int late_rank(const infer_shm *s, int64_t seq) {
  for (int r = 0; r < s->world; r++)
    if (__atomic_load_n(&s->arrived[r], __ATOMIC_ACQUIRE) < seq) return r;
  return -1;
}

static int wait_all(infer_shm *s, int64_t seq) {
  double start = 0, checked = 0;
  for (long spins = 0; late_rank(s, seq) >= 0; spins++) {
    if (spins < 256) { /* a few microseconds: the peer is usually just behind */
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (spins < 256 + 2000) { /* then give the core away: on a busy host the peer may need it */
      sched_yield();
      continue;
    }
    struct timespec nap = {0, 20000};
    nanosleep(&nap, NULL);
    double t = now_s();
    if (start == 0) start = checked = t;
    if (t - checked < 1.0) continue;
    checked = t;
    for (int r = 0; r < s->world; r++) {
      if (__atomic_load_n(&s->arrived[r], __ATOMIC_ACQUIRE) < seq && !alive(s->pids[r])) {
        s->error = INFER_COMM_PEER_EXITED;
        s->failed_rank = r;
        return s->error;
      }
    }
    if (t - start > s->timeout_s) {
      s->error = INFER_COMM_TIMEOUT;
      s->failed_rank = late_rank(s, seq);
      return s->error;
    }
  }
  return 0;
}

static int all_reduce(infer_shm *s, float *x, int64_t n);

/* x [n] float32 <- the sum over ranks of every rank's x [n]; 0, or the error (see above). */
int infer_shm_all_reduce(infer_shm *s, float *x, int64_t n) {
  double t0 = now_s();
  int rc = all_reduce(s, x, n);
  s->busy_s += now_s() - t0;
  return rc;
}

static int all_reduce(infer_shm *s, float *x, int64_t n) {
  s->error = 0;
  if (s->world <= 1) return 0;
  int64_t per = s->slot_bytes / (int64_t)sizeof(float);
  for (int64_t a = 0; a < n; a += per) {
    int64_t m = n - a < per ? n - a : per;
    int64_t seq = ++s->seq;
    uint8_t *buf = s->data + (seq % 2) * s->world * s->slot_bytes;
    memcpy(buf + s->rank * s->slot_bytes, x + a, sizeof(float) * (size_t)m);
    __atomic_store_n(&s->arrived[s->rank], seq, __ATOMIC_RELEASE);
    int rc = wait_all(s, seq);
    if (rc) return rc;
    const float *s0 = (const float *)buf, *s1 = (const float *)(buf + s->slot_bytes);
    float *y = x + a;
    for (int64_t i = 0; i < m; i++) y[i] = s0[i] + s1[i];
    for (int r = 2; r < s->world; r++) {
      const float *sr = (const float *)(buf + r * s->slot_bytes);
      for (int64_t i = 0; i < m; i++) y[i] += sr[i];
    }
  }
  return 0;
}
