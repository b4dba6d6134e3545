/*
 * amx_pattern.c — the 32/8 d128 bf16 cache's access pattern alone (no
 * attention): per key block of 32 positions, head by head, the keys then
 * the values, read by AMX tile loads (16 rows x 64 bytes) into dummy
 * products, with an optional register-only delay per head call (SPIN) and
 * tile stores (STORE), over 16 rotated 16 MB sets (from memory). Shows what
 * one core's tile loads reach on this pattern (dev/cpu-memory-bound.md).
 * Not part of the build:
 *   gcc -O2 -mamx-tile -mamx-bf16 -mavx512f -mavx512bw dev/cpu/amx_pattern.c -o /tmp/pat
 *   /tmp/pat [spin] [store]
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define H 8
#define D 128
#define POS 4096   /* 8 MB per K at 8 heads x 128 x 2B x 4096 = 8 MB */
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
__attribute__((target("avx512f,avx512bw"))) float seq(const char *k, const char *v, size_t n) {
  __m512 s = _mm512_setzero_ps(), s2 = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 128) { s = _mm512_add_ps(s, _mm512_loadu_ps(k + i)); s2 = _mm512_add_ps(s2, _mm512_loadu_ps(k + i + 64)); }
  for (size_t i = 0; i < n; i += 128) { s = _mm512_add_ps(s, _mm512_loadu_ps(v + i)); s2 = _mm512_add_ps(s2, _mm512_loadu_ps(v + i + 64)); }
  return _mm512_reduce_add_ps(_mm512_add_ps(s, s2));
}
__attribute__((target("avx512f,avx512bw"))) float blocked(const char *k, const char *v) {
  __m512 s = _mm512_setzero_ps(), s2 = _mm512_setzero_ps();
  for (int j0 = 0; j0 < POS; j0 += 32)
    for (int which = 0; which < 2; which++)
      for (int h = 0; h < H; h++)
        for (int j = 0; j < 32; j++) {
          const char *r = (which ? v : k) + ((size_t)(j0 + j) * H + h) * D * 2;
          s = _mm512_add_ps(s, _mm512_loadu_ps(r)); s2 = _mm512_add_ps(s2, _mm512_loadu_ps(r + 64));
          s = _mm512_add_ps(s, _mm512_loadu_ps(r + 128)); s2 = _mm512_add_ps(s2, _mm512_loadu_ps(r + 192));
        }
  return _mm512_reduce_add_ps(_mm512_add_ps(s, s2));
}
static int SPIN, STORE;
static inline float spin(float x) { for (int i = 0; i < SPIN; i++) x = x * 0.999f + 0.001f; return x; }
__attribute__((target("amx-tile,amx-bf16,avx512f"))) float tiles(const char *k, const char *v, int mode) {
  float acc = 0;
  for (int j0 = 0; j0 < POS; j0 += 32)
    for (int which = 0; which < 2; which++)
      for (int h = 0; h < H; h++) {
        const char *r = (which ? v : k) + ((size_t)j0 * H + h) * D * 2;
        const long st = H * D * 2;
        if (mode == 0) {
          for (int s = 0; s < 4; s++) { _tile_loadd(2, r + 64 * s, st); _tile_loadd(3, r + 16 * st + 64 * s, st); _tile_dpbf16ps(0, 2, 4); _tile_dpbf16ps(1, 3, 4); }
        } else {
          _tile_loadd(2, r, st); _tile_loadd(3, r + 16 * st, st); _tile_loadd(5, r + 64, st); _tile_loadd(6, r + 16 * st + 64, st);
          _tile_dpbf16ps(0, 2, 4); _tile_dpbf16ps(1, 3, 4); _tile_dpbf16ps(0, 5, 4); _tile_dpbf16ps(1, 6, 4);
          _tile_loadd(2, r + 128, st); _tile_loadd(3, r + 16 * st + 128, st); _tile_loadd(5, r + 192, st); _tile_loadd(6, r + 16 * st + 192, st);
          _tile_dpbf16ps(0, 2, 4); _tile_dpbf16ps(1, 3, 4); _tile_dpbf16ps(0, 5, 4); _tile_dpbf16ps(1, 6, 4);
        }
        acc = spin(acc);
        if (STORE) { static float sb[2][256] __attribute__((aligned(64))); _tile_stored(0, sb[0], 64); if (STORE > 1) _tile_stored(1, sb[1], 64); acc += sb[0][h] + (STORE > 2 ? sb[1][h] : 0); }
      }
  float out[256]; _tile_stored(0, out, 64); return out[3] + acc;
}
int main(int argc, char **argv) {
  SPIN = argc > 1 ? atoi(argv[1]) : 0; STORE = argc > 2 ? atoi(argv[2]) : 0;
  syscall(SYS_arch_prctl, 0x1023, 18);
  const size_t bytes = (size_t)POS * H * D * 2;
  const int sets = 16;
  char *k[16], *v[16];
  for (int i = 0; i < sets; i++) { k[i] = aligned_alloc(1 << 21, bytes); v[i] = aligned_alloc(1 << 21, bytes); memset(k[i], 0x3f, bytes); memset(v[i], 0x3e, bytes); }
  cfg_t c; memset(&c, 0, sizeof c); c.palette = 1; for (int i = 0; i < 8; i++) c.rows[i] = 16, c.colsb[i] = 64;
  _tile_loadconfig(&c);
  float sink = 0;
  for (int m = 2; m < 3; m++) {
    double best = 1e9, tot = 0; int n = 0;
    for (int it = 0; it < 48; it++) {
      const int i = it % sets; double t0 = now();
      if (m == 0) sink += seq(k[i], v[i], bytes); else if (m == 1) sink += blocked(k[i], v[i]); else sink += tiles(k[i], v[i], m - 2);
      double t = now() - t0; if (it >= sets) { tot += t; n++; if (t < best) best = t; }
    }
    printf("%s: %.1f GB/s (avg %.1f)\n", m == 0 ? "sequential" : m == 1 ? "blocked head-major vec" : m == 2 ? "tiles 2 at a time" : "tiles 4 at a time", 2.0 * bytes / best * 1e-9, 2.0 * bytes / (tot / n) * 1e-9);
  }
  _tile_release();
  return sink == 1234.5f;
}
