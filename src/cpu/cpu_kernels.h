/*
 * cpu_kernels.h — internal to src/cpu: the two inner loops of the CPU
 * backend (scores of a block of keys; weighted sum of a block of values), one
 * set per instruction set and dtype, chosen at run time; and the small row
 * helpers the CPU files share.
 *
 * Kernels read K and V in the plan's dtype and widen fp16/bf16 to float32
 * exactly; all arithmetic is float32.
 */
#ifndef FD_CPU_KERNELS_H
#define FD_CPU_KERNELS_H

#include <stdint.h>

#include "dtype.h"
#include "internal.h"

/* Instruction sets with kernels, in increasing order. */
typedef enum fd_cpu_isa {
  FD_CPU_ISA_SCALAR = 0, /* plain C: what non-x86 machines run */
  FD_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
  FD_CPU_ISA_AVX512 = 2  /* AVX-512 F, BW, VL (+ FMA, F16C) */
} fd_cpu_isa;

/* Keys per kernel call (the key block). */
#define FD_CPU_KEY_BLOCK 32

/*
 * scores[r * ld_scores + j] = scale * dot(q[r], key j), r < rows, j < num_keys.
 *   q       float [rows][ld_q] (the first head_dim of each row are used)
 *   keys    [num_keys] pointers, each to head_dim elements of the dtype
 *   scores  float [rows][ld_scores]
 */
typedef void (*fd_cpu_scores_fn)(const float *q, int64_t ld_q, int rows, const void *const *keys,
                                 int num_keys, int head_dim, float scale, float *scores,
                                 int ld_scores);

/*
 * For every r < rows with count[r] > 0:
 *   acc[r] = alpha[r] * acc[r] + sum_{j < count[r]} p[r * ld_p + j] * value j
 * (rows with count[r] <= 0 are left as they are).
 *   acc     float [rows][ld_acc] (the first head_dim of each row)
 *   alpha   float [rows]
 *   p       float [rows][ld_p]
 *   count   int   [rows]
 *   values  [max count] pointers, each to head_dim elements of the dtype
 */
typedef void (*fd_cpu_accumulate_fn)(float *acc, int64_t ld_acc, int rows, const float *alpha,
                                     const float *p, int ld_p, const int *count,
                                     const void *const *values, int head_dim);

typedef struct fd_cpu_kernels {
  fd_cpu_scores_fn scores;
  fd_cpu_accumulate_fn accumulate;
} fd_cpu_kernels;

/* The best instruction set this machine (and build) has. */
fd_cpu_isa fd_cpu_isa_detect(void);

/* Kernels of `isa` for `dtype` into *k. Returns 0 when this build has no
 * kernels for isa (non-x86), 1 otherwise. Does not check the machine. */
int fd_cpu_kernels_get(fd_cpu_isa isa, fd_dtype dtype, fd_cpu_kernels *k);

/* One getter per instruction set (cpu_kernels_*.c); same contract. */
int fd_cpu_kernels_scalar(fd_dtype dtype, fd_cpu_kernels *k);
int fd_cpu_kernels_avx2(fd_dtype dtype, fd_cpu_kernels *k);
int fd_cpu_kernels_avx512(fd_dtype dtype, fd_cpu_kernels *k);

/* fd_cpu_run with the instruction set forced (tests run every one).
 * FD_STATUS_UNSUPPORTED when the machine or the build lacks it. */
fd_status fd_cpu_run_isa(const fd_plan *plan, const fd_tensors *t, void *workspace,
                         fd_cpu_isa isa, fd_error *err);

/* dst[i] = src[i] widened to float32, i < n. src: [n] elements of dtype. */
static inline void fd_cpu_load_row(float *dst, const void *src, fd_dtype dtype, int n) {
  if (dtype == FD_DTYPE_F32) {
    const float *s = (const float *)src;
    for (int i = 0; i < n; i++) dst[i] = s[i];
  } else if (dtype == FD_DTYPE_F16) {
    const uint16_t *s = (const uint16_t *)src;
    for (int i = 0; i < n; i++) dst[i] = fd_f16_to_f32(s[i]);
  } else {
    const uint16_t *s = (const uint16_t *)src;
    for (int i = 0; i < n; i++) dst[i] = fd_bf16_to_f32(s[i]);
  }
}

/* dst[i] = src[i] narrowed to dtype (round to nearest even), i < n. */
static inline void fd_cpu_store_row(void *dst, fd_dtype dtype, const float *src, int n) {
  if (dtype == FD_DTYPE_F32) {
    float *o = (float *)dst;
    for (int i = 0; i < n; i++) o[i] = src[i];
  } else if (dtype == FD_DTYPE_F16) {
    uint16_t *o = (uint16_t *)dst;
    for (int i = 0; i < n; i++) o[i] = fd_f32_to_f16(src[i]);
  } else {
    uint16_t *o = (uint16_t *)dst;
    for (int i = 0; i < n; i++) o[i] = fd_f32_to_bf16(src[i]);
  }
}

#endif /* FD_CPU_KERNELS_H */
