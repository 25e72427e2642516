/*
 * infer-plugin-cpu: the work pool of the native CPU libraries (included by each; one pool per
 * library). Define _GNU_SOURCE before any include to get the core-swap below on Linux.
 *
 * A work pool whose caller never waits for a helper that has not started. A call is split into
 * units. The caller publishes a job, wakes the helper threads and takes units itself, one at a
 * time, as the helpers do; it then waits only for units a helper has taken and not finished. A
 * helper that another process keeps off its core finds the job done when it runs and goes back
 * to sleep, where an OpenMP region would make the caller wait for it at the closing barrier (on
 * a shared 2-core machine, often a whole scheduler time slice per region). A unit is claimed by a
 * compare-and-swap on the job's ticket (job number, unit count, next unit); the job's fields are
 * read only after a claim succeeds, and the caller replaces them only when every unit is done,
 * so a late helper never reads a later job's fields for an earlier job's unit.
 *
 * A unit already taken still has to finish. When another process (the HTTP server, the
 * benchmark client) preempts a thread in the middle of a unit, the thread that waits for that
 * unit used to spin on its own core until the preempted one got its core back: both cores lost
 * for the other process's whole time slice. Now a waiter watches the CPU time of the threads
 * that hold units (their CPU-time clocks); one that gets less than a quarter of the wall time
 * over POOL_WATCH_NS is off its core, and the two swap cores: the holder is pinned to the
 * waiter's CPU, which the waiter leaves for the holder's, so the unit finishes at once while the
 * waiter (which has nothing to do) queues behind the other process, and the two threads stay on
 * two cores. Each restores its own affinity (as the pool first saw it) once the unit is done. A
 * waiter whose holder is queued on its own CPU yields at once rather than spinning. Results do not depend on which
 * thread runs a unit or where, so outputs are unchanged.
 */
#ifndef INFER_CPU_POOL_H
#define INFER_CPU_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#if defined(__linux__) && defined(_GNU_SOURCE) && defined(CPU_SET)
#include <sys/syscall.h>
#include <unistd.h>
#define POOL_SWAP 1
#endif

typedef void (*pool_fn)(void *arg, int unit, int worker);

#define POOL_MAX 64
#ifndef POOL_WATCH_NS
#define POOL_WATCH_NS 50000 /* a holder's CPU time is compared over this much wall time */
#endif

typedef struct {
  atomic_int busy;  /* 1 while the worker runs a unit */
  atomic_int moved; /* pinned by a swap: its own affinity comes back after the unit */
  int cpu;          /* where it took its current unit */
#ifdef POOL_SWAP
  pid_t tid;
  clockid_t clock; /* its CPU-time clock */
  cpu_set_t mask;  /* its own affinity, outside any swap */
#endif
} pool_slot;

static struct {
  _Atomic uint64_t ticket; /* job << 48 | units << 24 | next */
  atomic_int done, job_nt, sleeping, swaps;
  int no_swap; /* set by POOL_SWAPS_FN(0) */
  pool_fn fn;
  void *arg;
  int workers; /* helper threads started */
  pthread_mutex_t call, mu;
  pthread_cond_t cv;
  pool_slot slot[POOL_MAX]; /* slot 0: the calling thread of the current job */
} g_pool = {.call = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
            .cv = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static inline int64_t pool_ns(clockid_t c) {
  struct timespec ts;
  if (clock_gettime(c, &ts)) return -1;
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#ifdef POOL_SWAP
static __thread pid_t t_tid;         /* this thread's id, 0 until pool_identify */
static __thread clockid_t t_clock;   /* its CPU-time clock */
static __thread cpu_set_t t_mask;    /* its affinity when the pool first saw it: what a swap's
                                        pin is undone to */
#endif

/* This thread's identity in slot w (its thread id, CPU-time clock and affinity, looked up once). */
static void pool_identify(int w) {
#ifdef POOL_SWAP
  if (t_tid == 0) {
    if (pthread_getcpuclockid(pthread_self(), &t_clock)) t_clock = (clockid_t)-1;
    if (sched_getaffinity(0, sizeof t_mask, &t_mask)) CPU_ZERO(&t_mask);
    t_tid = (pid_t)syscall(SYS_gettid);
  }
  g_pool.slot[w].tid = t_tid;
  g_pool.slot[w].clock = t_clock;
  g_pool.slot[w].mask = t_mask;
#else
  (void)w;
#endif
}

/* Undo a swap's pin of worker w (w is the calling thread). */
static inline void pool_restore(int w) {
#ifdef POOL_SWAP
  pool_slot *s = &g_pool.slot[w];
  if (atomic_load_explicit(&s->moved, memory_order_acquire) && atomic_exchange(&s->moved, 0))
    sched_setaffinity(0, sizeof t_mask, &t_mask);
#else
  (void)w;
#endif
}

/* Worker w (the calling thread) swaps cores with worker v, which holds a unit and is off its
 * core: v is pinned to w's CPU and w to v's. Returns 1 when v's pin took (w's own may not). */
static int pool_swap(int w, int v) {
#ifdef POOL_SWAP
  if (g_pool.no_swap) return 0;
  pool_slot *me = &g_pool.slot[w], *it = &g_pool.slot[v];
  int mine = sched_getcpu(), theirs = it->cpu;
  if (mine < 0 || theirs < 0 || mine == theirs || it->tid <= 0 || !CPU_ISSET(mine, &it->mask) ||
      !CPU_ISSET(theirs, &me->mask))
    return 0;
  cpu_set_t to_mine, to_theirs;
  CPU_ZERO(&to_mine);
  CPU_ZERO(&to_theirs);
  CPU_SET(mine, &to_mine);
  CPU_SET(theirs, &to_theirs);
  if (sched_setaffinity(it->tid, sizeof to_mine, &to_mine)) return 0;
  atomic_store_explicit(&it->moved, 1, memory_order_release);
  if (sched_setaffinity(0, sizeof to_theirs, &to_theirs) == 0)
    atomic_store_explicit(&me->moved, 1, memory_order_release);
  atomic_fetch_add(&g_pool.swaps, 1);
  return 1;
#else
  (void)w;
  (void)v;
  return 0;
#endif
}

/* Is the job of ticket t (units units) over? Its units are all done, or a later job began. */
static inline int pool_over(uint64_t t, int units) {
  return atomic_load(&g_pool.done) >= units || (atomic_load(&g_pool.ticket) >> 48) != (t >> 48);
}

/* Worker w waits for the other workers' units of the job of ticket t, swapping cores (once) with
 * a holder that another process keeps off its core. */
static void pool_wait(int w, uint64_t t, int units) {
  int64_t since = -1, cpu0[POOL_MAX];
  int sampled = 0, swapped = 0;
  for (int spins = 0; !pool_over(t, units); spins++) {
    if (spins < 20000)
      cpu_relax();
    else
      sched_yield();
#ifdef POOL_SWAP
    if (swapped || (spins & 63) != 63) continue;
    int here = sched_getcpu(), shared = 0, nt = atomic_load(&g_pool.job_nt);
    nt = nt < POOL_MAX ? nt : POOL_MAX;
    for (int v = 0; v < nt; v++) /* a holder queued behind this thread */
      shared |= v != w && atomic_load(&g_pool.slot[v].busy) && g_pool.slot[v].cpu == here;
    if (shared) {
      sched_yield();
      continue;
    }
    int64_t now = pool_ns(CLOCK_MONOTONIC);
    if (since < 0) since = now; /* the first POOL_WATCH_NS: a unit usually ends within it */
    if (now - since < POOL_WATCH_NS) continue;
    for (int v = 0; v < nt && !swapped; v++) {
      if (v == w) continue;
      int64_t c = atomic_load(&g_pool.slot[v].busy) ? pool_ns(g_pool.slot[v].clock) : -1;
      if (sampled && c >= 0 && cpu0[v] >= 0 && (c - cpu0[v]) * 4 < now - since)
        swapped = pool_swap(w, v);
      cpu0[v] = c;
    }
    sampled = 1;
    since = now;
#endif
  }
  if (swapped) pool_restore(w);
}

/* Take and run units of the current job until none is left; worker w (0: the caller). */
static void pool_take(int w) {
  pool_slot *s = &g_pool.slot[w];
  pool_restore(w);
  for (;;) {
    uint64_t t = atomic_load(&g_pool.ticket);
    uint64_t units = (t >> 24) & 0xFFFFFF, next = t & 0xFFFFFF;
    if (next >= units || (w > 0 && w >= atomic_load(&g_pool.job_nt))) return;
    if (!atomic_compare_exchange_weak(&g_pool.ticket, &t, t + 1)) continue;
#ifdef POOL_SWAP
    s->cpu = sched_getcpu();
#endif
    atomic_store_explicit(&s->busy, 1, memory_order_release);
    g_pool.fn(g_pool.arg, (int)next, w);
    atomic_store_explicit(&s->busy, 0, memory_order_release);
    atomic_fetch_add(&g_pool.done, 1);
    pool_restore(w);
  }
}

static void *pool_worker(void *p) {
  int w = (int)(intptr_t)p;
  pool_identify(w);
  for (;;) {
    pool_take(w);
    uint64_t t = atomic_load(&g_pool.ticket);
    int units = (int)((t >> 24) & 0xFFFFFF);
    if (w < atomic_load(&g_pool.job_nt) && !pool_over(t, units))
      pool_wait(w, t, units); /* a unit of this job still runs elsewhere */
    for (int spins = 0; spins < 4000 && atomic_load(&g_pool.ticket) == t; spins++) cpu_relax();
    if (atomic_load(&g_pool.ticket) != t) continue;
    pthread_mutex_lock(&g_pool.mu);
    atomic_fetch_add(&g_pool.sleeping, 1);
    while (atomic_load(&g_pool.ticket) == t) pthread_cond_wait(&g_pool.cv, &g_pool.mu);
    atomic_fetch_sub(&g_pool.sleeping, 1);
    pthread_mutex_unlock(&g_pool.mu);
  }
  return NULL;
}

/* fn(arg, u, worker) for u in [0, units) on up to nt threads (worker < nt indexes per-thread
 * scratch); returns when every unit is done. Calls from several threads take turns. */
static void pool_run(pool_fn fn, void *arg, int units, int nt) {
  if (units <= 0) return;
  nt = nt < POOL_MAX ? nt : POOL_MAX;
  if (nt <= 1 || units == 1) {
    for (int u = 0; u < units; u++) fn(arg, u, 0);
    return;
  }
  pthread_mutex_lock(&g_pool.call);
  while (g_pool.workers < nt - 1) { /* helpers 1 .. nt - 1, started once, detached */
    pthread_t th;
    if (pthread_create(&th, NULL, pool_worker, (void *)(intptr_t)(g_pool.workers + 1))) break;
    pthread_detach(th);
    g_pool.workers++;
  }
  pool_identify(0);
  g_pool.fn = fn;
  g_pool.arg = arg;
  atomic_store(&g_pool.done, 0);
  atomic_store(&g_pool.job_nt, nt);
  uint64_t job = ((atomic_load(&g_pool.ticket) >> 48) + 1) & 0xFFFF;
  uint64_t t = job << 48 | (uint64_t)units << 24;
  atomic_store(&g_pool.ticket, t);
  if (atomic_load(&g_pool.sleeping) > 0) {
    pthread_mutex_lock(&g_pool.mu);
    pthread_cond_broadcast(&g_pool.cv);
    pthread_mutex_unlock(&g_pool.mu);
  }
  pool_take(0);
  pool_wait(0, t, units);
  pthread_mutex_unlock(&g_pool.call);
}

#ifdef POOL_SWAPS_FN
/* The core swaps made since the library was loaded; on < 0 leaves the setting, 0 turns the swap
 * off and 1 on (benchmarks compare the two in one process). */
int POOL_SWAPS_FN(int on) {
  if (on >= 0) g_pool.no_swap = !on;
  return atomic_load(&g_pool.swaps);
}
#endif

#endif
