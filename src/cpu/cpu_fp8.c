/*
 * cpu_fp8.c — fp8 caches on the CPU: the 256 values of a format's codes,
 * and the widening of one head's key block to float32 times the scales,
 * which cpu_decode.c runs before each kernel call (the kernels then read
 * float32 keys and values).
 */
#include "cpu_kernels.h"
#include "fp8.h"

void fd_cpu_fp8_table(fd_dtype dtype, float lut[256]) {
  for (int i = 0; i < 256; i++)
    lut[i] = dtype == FD_DTYPE_E4M3 ? fd_e4m3_to_f32((uint8_t)i) : fd_e5m2_to_f32((uint8_t)i);
}

void fd_cpu_widen_fp8(float *dst, const void *const *rows, ptrdiff_t off, int n, int head_dim,
                      const float *lut, const float *scales, float scale) {
  for (int j = 0; j < n; j++) {
    const uint8_t *src = (const uint8_t *)rows[j] + off;
    const float s = scales ? scales[j] : scale;
    float *o = dst + (ptrdiff_t)j * head_dim;
    for (int d = 0; d < head_dim; d++) o[d] = lut[src[d]] * s;
  }
}
