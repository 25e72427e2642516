/*
 * AMX tiles for both native libraries (infer_cpu_bf16.c: tdpbf16ps; infer_cpu_kernels.c:
 * tdpbssd / tdpbusd): the kernel's leave to use the tile state, and the tile configuration.
 *
 * AMX needs the kernel's leave to use its state (Linux 5.16+: arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, Documentation/arch/x86/xstate.rst); it is asked once, for the whole
 * process. Refused (an older kernel, a hypervisor that hides the state), every GEMM stays on its
 * AVX-512 path: the choice is made once, so a row's result never depends on which call computed
 * it.
 */
#ifndef INFER_CPU_AMX_H
#define INFER_CPU_AMX_H
#if defined(__AMX_TILE__) && defined(__linux__)
#define INFER_AMX_TILES 1
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <immintrin.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static int g_amx;
static void amx_ask(void) { g_amx = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }
static inline int amx_on(void) {
  pthread_once(&g_amx_once, amx_ask);
  return g_amx;
}

/* The 64-byte operand of ldtilecfg (palette 1): per tile register its rows and bytes a row. */
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

/* Loads a configuration of tiles 0..7, tile t with rows[t] rows of colsb[t] bytes (0: unused). */
static inline void amx_configure(const uint8_t rows[8], const uint16_t colsb[8]) {
  amx_cfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) {
    c.rows[t] = rows[t];
    c.colsb[t] = rows[t] ? colsb[t] : 0;
  }
  /* GCC (12) does not count the stores above as read by ldtilecfg once this is inlined with
   * constant rows (it kept only the palette byte, measured): the barrier makes them happen */
  __asm__ volatile("" : : "m"(c) : "memory");
  _tile_loadconfig(&c);
}
#endif
#endif
