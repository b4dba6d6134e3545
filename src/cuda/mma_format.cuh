/*
 * mma_format.cuh — the element formats of the tensor-core split kernel's
 * K/V cache (split_mma_kernel.cuh), one policy type each: fd_kv16 (fp16 /
 * bf16 K/V, the q dtype) and fd_kv8 (fp8 e4m3 / e5m2 K/V with fp16 / bf16 q,
 * fp8 scales NONE / TENSOR / HEAD / TOKEN). The pass is written once against
 * a policy F; F says
 *   stage geometry  ST stages of SB bytes in the K and V areas, where the key
 *                   flags and (fp8 TOKEN) the scales live;
 *   scales          the score scale and O's factor (fp8 TENSOR / HEAD), the
 *                   per-key scales' copies (TOKEN);
 *   q_frags         Q's B fragments from shared memory, once a pass;
 *   qk              K's A fragments of a 16-key slice and S^T = K Q^T;
 *   pv              V^T's A fragments and O^T += V^T P^T;
 *   store_o         the O^T accumulators into the merge buffer (the column
 *                   order of the format's m-tiles).
 * The fragment layouts: split_mma_kernel.cuh TILE MATH and FP8. Internal to
 * src/cuda.
 */
#ifndef FD_CUDA_MMA_FORMAT_CUH
#define FD_CUDA_MMA_FORMAT_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashdecode.h"
#include "device_util.cuh"
#include "kernel_params.cuh"
#include "mma_config.cuh"
#include "mma_primitives.cuh"

/* Four fp8 values (bytes 0..3 of x, element 0 in the low byte) -> four
 * 16-bit T values, two a register (element 0 in the low half of lo). Exact:
 * e5m2 is the top byte of an fp16; e4m3 (bias 7) moved into fp16's field
 * layout and multiplied by 2^8 (fp16 multiplication by a power of two,
 * exact; e4m3 subnormals become normal fp16), its NaN code (S.1111.111)
 * replaced by fp16 NaN; bf16 through float32 (both exact). sm_89+ code uses
 * the hardware conversion (cvt.rn.f16x2.e4m3x2 / e5m2x2). */
template <typename T>
static __device__ __forceinline__ void fd_fp8x4_widen(uint32_t x, bool e5m2, uint32_t &lo,
                                                      uint32_t &hi) {
  uint32_t h0, h1; /* fp16 pairs */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  /* the halves split in PTX (mov.b32 {l, h}) rather than by a shift in C,
   * so that ptxas can read the upper half in place */
  if (e5m2)
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n"
        " cvt.rn.f16x2.e5m2x2 %1, h;\n}" : "=r"(h0), "=r"(h1) : "r"(x));
  else
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}" : "=r"(h0), "=r"(h1) : "r"(x));
#else
  h0 = __byte_perm(x, 0u, 0x1404u); /* (b0 << 8) | (b1 << 24) */
  h1 = __byte_perm(x, 0u, 0x3424u); /* (b2 << 8) | (b3 << 24) */
  if (!e5m2) {
    const uint32_t n0 = __vcmpeq2(h0 & 0x7F007F00u, 0x7F007F00u); /* NaN codes */
    const uint32_t n1 = __vcmpeq2(h1 & 0x7F007F00u, 0x7F007F00u);
    h0 = (h0 & 0x80008000u) | ((h0 >> 1) & 0x3F803F80u);
    h1 = (h1 & 0x80008000u) | ((h1 >> 1) & 0x3F803F80u);
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(h0) : "r"(h0), "r"(0x5C005C00u)); /* x 2^8 */
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(h1) : "r"(h1), "r"(0x5C005C00u));
    h0 = (h0 & ~n0) | (0x7FFF7FFFu & n0);
    h1 = (h1 & ~n1) | (0x7FFF7FFFu & n1);
  }
#endif
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __half2 a, b;
    memcpy(&a, &h0, sizeof a);
    memcpy(&b, &h1, sizeof b);
    const float2 fa = __half22float2(a), fb = __half22float2(b);
    const __nv_bfloat162 ba = __floats2bfloat162_rn(fa.x, fa.y);
    const __nv_bfloat162 bb = __floats2bfloat162_rn(fb.x, fb.y);
    memcpy(&lo, &ba, sizeof lo);
    memcpy(&hi, &bb, sizeof hi);
  } else {
    lo = h0;
    hi = h1;
  }
}


/* fp8: the byte offset fd_swz8<D>(row, c + sub) for an even chunk c, from
 * base = row * D and y = sub ^ (the row's swizzle bits): the swizzle
 * touches the low 3 bits of c (c >= 8 at head_dim 256), so one xor with a
 * per-lane constant a load. */
static __device__ __forceinline__ uint32_t fd_swz8_even(uint32_t base, int y, int c) {
  return base + (uint32_t)(((c & ~7) | ((c & 7) ^ y)) << 4);
}

/* The scales of a pass: scale (base-2 units: softmax_scale log2(e)), k_mul
 * (each scaled score's factor: fp8 TENSOR / HEAD k_scale, else 1), v_mul
 * (O's factor at the merge: fp8 TENSOR / HEAD v_scale, else 1), tok (fp8
 * TOKEN: a k and v scale a key). */
typedef struct fd_mma_scales {
  float scale;
  float k_mul;
  float v_mul;
  bool tok;
} fd_mma_scales;

/* This lane's ldmatrix rows (TILE MATH): K (and fp8's V): key kw * 16 +
 * (lane & 7) + 8 ((lane >> 3) & 1), chunk + (lane >> 4); 16-bit V^T
 * (.trans): key kw * 16 + (lane & 7) + 8 (lane >> 4), chunk +
 * ((lane >> 3) & 1); fp8: fd_swz8<D>(kr_row, c + kr_sub) =
 * fd_swz8_even(k8_base, k8_y, c). */
typedef struct fd_mma_lanes {
  int kr_row, kr_sub, vt_row, vt_sub;
  uint32_t k8_base;
  int k8_y;
} fd_mma_lanes;

template <int D>
static __device__ __forceinline__ fd_mma_lanes fd_mma_lanes_of(int lane, int kw) {
  fd_mma_lanes a;
  a.kr_row = kw * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
  a.kr_sub = lane >> 4;
  a.vt_row = kw * 16 + (lane & 7) + ((lane >> 4) << 3);
  a.vt_sub = (lane >> 3) & 1;
  a.k8_base = (uint32_t)(a.kr_row * D);
  a.k8_y = a.kr_sub ^ (D == 64 ? (a.kr_row >> 1) & 3 : a.kr_row & 7);
  return a;
}

/* ---- 16-bit K/V (fp16, bf16: the q dtype T) ---- */
template <typename T, typename S>
struct fd_kv16 {
  using Q = T;  /* q's element */
  using KV = T; /* the cache's element */
  static constexpr int ST = S::STAGES;          /* pipeline stages */
  static constexpr int SB = S::KT * S::D * 2;   /* bytes a stage */
  static constexpr bool TOKEN = false;          /* never per-key scales */

  /* Key-valid flags [ST][KT] after the (m, l) buffers (fd_mma_cfg::SMEM). */
  static __device__ __forceinline__ unsigned char *valid_flags(unsigned char *after_fin,
                                                               unsigned char *smem) {
    return after_fin;
  }
  static __device__ __forceinline__ float *token_scales(unsigned char *smem) { return nullptr; }

  static __device__ __forceinline__ fd_mma_scales scales(const fd_kernel_params &p, int hk) {
    fd_mma_scales s;
    s.scale = p.scale_log2;
    s.k_mul = 1.0f;
    s.v_mul = 1.0f;
    s.tok = false;
    return s;
  }
  /* a scaled score's factor: none (the multiply by 1 folds away) */
  static __device__ __forceinline__ float key_scale(float k_mul, bool tok, const float *tTok,
                                                    int kl) {
    return 1.0f;
  }
  /* P is the softmax's p */
  static __device__ __forceinline__ void token_p(float (&sc)[4], const float (&s0)[4], bool tok,
                                                 const float *tTok, int kl0, float m_old0,
                                                 float m_old1, float m0, float m1, float &ev0,
                                                 float &ev1, float &a0, float &a1) {}

  /* B fragments of row g: columns 16 ks + 2 qd, + 1 (b0) and + 8 (b1) */
  static __device__ __forceinline__ void q_frags(const T *sQ, int g, int qd,
                                                 uint32_t (&qa)[S::KSV][2], float &scale) {
#pragma unroll
    for (int ks = 0; ks < S::KSV; ks++) {
      qa[ks][0] = *reinterpret_cast<const uint32_t *>(sQ + g * S::D + (((2 * ks) ^ (g & 7)) << 3) + 2 * qd);
      qa[ks][1] =
          *reinterpret_cast<const uint32_t *>(sQ + g * S::D + (((2 * ks + 1) ^ (g & 7)) << 3) + 2 * qd);
    }
  }

  /* S^T = K Q^T for the warp's 16 keys: K's A fragment by ldmatrix.x4,
   * matrix (key half, chunk half) = (m & 1, m >> 1) */
  static __device__ __forceinline__ void qk(uint32_t kt_u, const fd_mma_lanes &a,
                                            const uint32_t (&qa)[S::KSV][2], float (&sc)[4]) {
#pragma unroll
    for (int ks = 0; ks < S::KSV; ks++) {
      uint32_t ka[4];
      fd_ldmatrix_x4(ka, kt_u + fd_swz<S::D>(a.kr_row, 2 * ks + a.kr_sub));
      fd_mma16816<T>(sc, ka, qa[ks][0], qa[ks][1]);
    }
  }

  /* O^T += V^T P^T: P in a hi and a lo part (fd_pack2_split), each
   * transposed by movmatrix into B fragments; V^T's A fragment by
   * ldmatrix.x4.trans, matrix (column half, key half) = (m & 1, m >> 1):
   * m-tile j holds columns 16 j + g (c0, c1) and 16 j + 8 + g (c2, c3) of
   * the warp's columns */
  static __device__ __forceinline__ void pv(uint32_t vt_u, const fd_mma_lanes &a, int dw,
                                            const float (&sc)[4], float (&o)[S::NO][4]) {
    uint32_t ph0, pl0, ph1, pl1;
    fd_pack2_split<T>(sc[0], sc[1], ph0, pl0);
    fd_pack2_split<T>(sc[2], sc[3], ph1, pl1);
    ph0 = fd_movmatrix_trans(ph0);
    pl0 = fd_movmatrix_trans(pl0);
    ph1 = fd_movmatrix_trans(ph1);
    pl1 = fd_movmatrix_trans(pl1);
#pragma unroll
    for (int j = 0; j < S::NO; j++) {
      uint32_t va[4];
      fd_ldmatrix_x4_trans(va, vt_u + fd_swz<S::D>(a.vt_row, dw * S::NT + 2 * j + a.vt_sub));
      fd_mma16816<T>(o[j], va, ph0, ph1);
      fd_mma16816<T>(o[j], va, pl0, pl1);
    }
  }

  /* m-tile j holds columns 16 j + g (c0, c1) and 16 j + 8 + g (c2, c3), rows
   * r0 (c0, c2) and r1 (c1, c3); dst0: row r0 of the warp's slot, its first
   * column */
  static __device__ __forceinline__ void store_o(float *dst0, int g, const float (&o)[S::NO][4],
                                                 float f0, float f1) {
    dst0 += g;
    float *dst1 = dst0 + S::OSTRIDE;
#pragma unroll
    for (int j = 0; j < S::NO; j++) {
      dst0[j * 16] = o[j][0] * f0;
      dst0[j * 16 + 8] = o[j][2] * f0;
      dst1[j * 16] = o[j][1] * f1;
      dst1[j * 16 + 8] = o[j][3] * f1;
    }
  }
};

/* ---- fp8 K/V (FMT 1: e4m3, 2: e5m2; a constant, so the widening issues
 * one conversion), fp16 or bf16 q (T), every mma in fp16 ---- */
template <typename T, typename S, int FMT>
struct fd_kv8 {
  using Q = T;
  using KV = unsigned char;
  /* fp8 tiles are half the bytes: ST8 stages (twice the tiles in flight,
   * less one) in the 16-bit instance's K / V areas */
  static constexpr int ST = S::ST8;
  static constexpr int SB = S::KT * S::D;
  static constexpr bool TOKEN = true;
  static constexpr bool E5M2 = FMT == 2;
  static_assert(FMT == 1 || FMT == 2, "fp8 format");
  static_assert(8 * ST * S::KT + ST * S::KT <= S::KT * S::D, "fp8 scales and flags fit");

  /* The last KT * D bytes of the K area (past the ST stages) hold the TOKEN
   * scales ([ST][2][KT] floats: stage, k / v), then the key-valid flags
   * [ST][KT]. */
  static __device__ __forceinline__ float *token_scales(unsigned char *smem) {
    return reinterpret_cast<float *>(smem + (size_t)ST * SB);
  }
  static __device__ __forceinline__ unsigned char *valid_flags(unsigned char *after_fin,
                                                               unsigned char *smem) {
    return reinterpret_cast<unsigned char *>(token_scales(smem) + 2 * ST * S::KT);
  }

  /* TENSOR / HEAD: k_scale multiplies each scaled score (not the score
   * scale: softmax_scale * k_scale may overflow where no score does) and
   * v_scale O at the merge (l sums the unscaled p); TOKEN reads one of each
   * per key and tile. */
  static __device__ __forceinline__ fd_mma_scales scales(const fd_kernel_params &p, int hk) {
    fd_mma_scales s;
    s.scale = p.scale_log2;
    s.k_mul = 1.0f;
    s.v_mul = 1.0f;
    s.tok = false;
    if (p.kv_scale == FD_KV_SCALE_TENSOR || p.kv_scale == FD_KV_SCALE_HEAD) {
      const int i = p.kv_scale == FD_KV_SCALE_HEAD ? hk : 0;
      s.k_mul = __ldg(p.k_scale + i);
      s.v_mul = __ldg(p.v_scale + i);
    }
    s.tok = p.kv_scale == FD_KV_SCALE_TOKEN;
    return s;
  }
  /* a scaled score's factor: k_mul, or (TOKEN) its key's k_scale */
  static __device__ __forceinline__ float key_scale(float k_mul, bool tok, const float *tTok,
                                                    int kl) {
    return tok ? tTok[kl] : k_mul;
  }
  /* TOKEN: P = p v_scale, kept in fp16's range for any finite scales. O's
   * rows run relative to 2^(m + ev), where m is the softmax's running max
   * and ev the running max of (s - m) + e over the keys seen (s the scaled
   * score, base 2, in s0; v_scale = f 2^e, f in [1, 2): fd_frac_exp):
   * P = 2^((s - m) + e - ev) f lies in [0, 2), so the fp16 B operand
   * neither overflows nor flushes the row's largest terms. Everything is
   * kept relative to m, so a score far above e (scores of 1e26 lose a sum
   * s + e entirely) still carries its scale. l keeps the unscaled p; *a0,
   * *a1 become O's factors 2^((m_old + ev_old) - (m + ev)); the merge applies
   * 2^((m - bm) + ev). Masked keys (s = -inf) stay 0 whatever their
   * zero-filled scale. */
  static __device__ __forceinline__ void token_p(float (&sc)[4], const float (&s0)[4], bool tok,
                                                 const float *tTok, int kl0, float m_old0,
                                                 float m_old1, float m0, float m1, float &ev0,
                                                 float &ev1, float &a0, float &a1) {
    if (!tok) return;
    float f0, f1;
    const int e0 = fd_frac_exp(tTok[S::KT + kl0], &f0);
    const int e1 = fd_frac_exp(tTok[S::KT + kl0 + 8], &f1);
    const float mu0 = m0 == -INFINITY ? 0.0f : m0, mu1 = m1 == -INFINITY ? 0.0f : m1;
    const float t0 = (s0[0] - mu0) + (float)e0, t1 = (s0[1] - mu1) + (float)e0;
    const float t2 = (s0[2] - mu0) + (float)e1, t3 = (s0[3] - mu1) + (float)e1;
    float tx0 = fmaxf(t0, t2), tx1 = fmaxf(t1, t3);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      tx0 = fmaxf(tx0, __shfl_xor_sync(0xffffffffu, tx0, off));
      tx1 = fmaxf(tx1, __shfl_xor_sync(0xffffffffu, tx1, off));
    }
    /* the old ev relative to the new m (-inf while no key was seen: O is 0) */
    float eo0 = m_old0 == -INFINITY ? -INFINITY : ev0 + (m_old0 - m0);
    float eo1 = m_old1 == -INFINITY ? -INFINITY : ev1 + (m_old1 - m1);
    float nu0, nu1;
    a0 = fd_softmax_step(eo0, tx0, &nu0);
    a1 = fd_softmax_step(eo1, tx1, &nu1);
    ev0 = eo0;
    ev1 = eo1;
    sc[0] = fd_exp2_ftz(t0 - nu0) * f0;
    sc[1] = fd_exp2_ftz(t1 - nu1) * f0;
    sc[2] = fd_exp2_ftz(t2 - nu0) * f1;
    sc[3] = fd_exp2_ftz(t3 - nu1) * f1;
  }

  /* k-step ks's logical columns 2 qd, 2 qd + 1, 2 qd + 8, 2 qd + 9 are
   * head_dim columns 16 ks + 4 qd + 0..3, the order in which a K fragment
   * arrives (FP8): 8 bytes a row from the swizzled sQ. bf16 q becomes fp16
   * times 2^qe, its largest |q| in (2^14, 2^15] (a power of two: exact for
   * every q whose fp16 is normal, i.e. within 2^-28 of that largest), and
   * the score scale takes 2^-qe. Every warp holds all of Q: a warp max
   * suffices. */
  static __device__ __forceinline__ void q_frags(const T *sQ, int g, int qd,
                                                 uint32_t (&qa)[S::KSV][2], float &scale) {
#pragma unroll
    for (int ks = 0; ks < S::KSV; ks++) {
      const int c = 2 * ks + (qd >> 1), e = 4 * (qd & 1);
      const uint2 x0 = *reinterpret_cast<const uint2 *>(sQ + g * S::D + ((c ^ (g & 7)) << 3) + e);
      qa[ks][0] = x0.x; /* b0: logical k 2 qd, 2 qd + 1 */
      qa[ks][1] = x0.y; /* b1: 2 qd + 8, 2 qd + 9 */
    }
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      float mq = 0.0f;
#pragma unroll
      for (int ks = 0; ks < S::KSV; ks++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
          const float2 f = fd_unpack2<__nv_bfloat16>(qa[ks][i]);
          mq = fmaxf(mq, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mq = fmaxf(mq, __shfl_xor_sync(0xffffffffu, mq, off));
      int qe = 0;
      if (mq > 0.0f && mq <= 3.40282346638528859812e+38f) { /* else (0, inf, NaN): as is */
        int ex;
        (void)frexpf(mq, &ex); /* mq = f 2^ex, f in [0.5, 1) */
        qe = 15 - ex;
      }
      const float up = ldexpf(1.0f, qe);
      scale = ldexpf(scale, -qe);
#pragma unroll
      for (int ks = 0; ks < S::KSV; ks++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
          const float2 f = fd_unpack2<__nv_bfloat16>(qa[ks][i]);
          qa[ks][i] = fd_pack2<__half>(f.x * up, f.y * up);
        }
    }
  }

  /* S^T = K Q^T: ldmatrix (not .trans) on the fp8 rows as 16-bit pairs, one
   * ldmatrix.x4 for two k-steps (matrix (key half, chunk) = (m & 1, m >> 1)),
   * widened to the A fragments */
  static __device__ __forceinline__ void qk(uint32_t kt_u, const fd_mma_lanes &a,
                                            const uint32_t (&qa)[S::KSV][2], float (&sc)[4]) {
#pragma unroll
    for (int kp = 0; kp < (S::KSV + 1) / 2; kp++) {
      uint32_t kr[4]; /* chunks 2 kp, 2 kp + 1 */
      fd_ldmatrix_x4(kr, kt_u + fd_swz8_even(a.k8_base, a.k8_y, 2 * kp));
#pragma unroll
      for (int h = 0; h < 2; h++) {
        if (2 * kp + h < S::KSV) { /* odd KSV (head_dim 80): the last chunk is padding */
          uint32_t ka[4];
          fd_fp8x4_widen<__half>(kr[2 * h], E5M2, ka[0], ka[2]);     /* key g */
          fd_fp8x4_widen<__half>(kr[2 * h + 1], E5M2, ka[1], ka[3]); /* key g + 8 */
          fd_mma16816<__half>(sc, ka, qa[2 * kp + h][0], qa[2 * kp + h][1]);
        }
      }
    }
  }

  /* O^T += V^T P^T: P^T's B fragments are the fp16 accumulators (one part:
   * 11 bits, far below the cache's rounding) transposed by movmatrix; one
   * ldmatrix.x4.trans takes 16 keys x 2 chunks of 16 head_dim columns,
   * matrix (key half, chunk) = (m & 1, m >> 1), a register holding keys
   * 2 qd, 2 qd + 1 x columns 2 g, 2 g + 1: bytes (0, 2) and (1, 3) are the
   * even and odd column's keys, so chunk j's m-tile rows are its even
   * columns (g) and odd ones (g + 8) */
  static __device__ __forceinline__ void pv(uint32_t vt_u, const fd_mma_lanes &a, int dw,
                                            const float (&sc)[4], float (&o)[S::NO][4]) {
    const uint32_t pb0 = fd_movmatrix_trans(fd_pack2<__half>(sc[0], sc[1]));
    const uint32_t pb1 = fd_movmatrix_trans(fd_pack2<__half>(sc[2], sc[3]));
#pragma unroll
    for (int cp = 0; cp < (S::NO + 1) / 2; cp++) {
      uint32_t vr[4];
      /* chunks dw * (DPW / 16) + 2 cp, + 1 */
      fd_ldmatrix_x4_trans(vr, vt_u + fd_swz8_even(a.k8_base, a.k8_y, dw * (S::DPW / 16) + 2 * cp));
#pragma unroll
      for (int h = 0; h < 2; h++) {
        if (2 * cp + h < S::NO) { /* odd NO (head_dim 80): the last chunk is padding */
          uint32_t va[4];
          fd_fp8x4_widen<__half>(__byte_perm(vr[2 * h], vr[2 * h + 1], 0x6420), E5M2, va[0], va[2]);
          fd_fp8x4_widen<__half>(__byte_perm(vr[2 * h], vr[2 * h + 1], 0x7531), E5M2, va[1], va[3]);
          fd_mma16816<__half>(o[2 * cp + h], va, pb0, pb1);
        }
      }
    }
  }

  /* O^T's m-tile j holds columns 16 j + 2 g (c0: row 2 qd, c1: row 2 qd + 1)
   * and 16 j + 2 g + 1 (c2, c3) */
  static __device__ __forceinline__ void store_o(float *dst0, int g, const float (&o)[S::NO][4],
                                                 float f0, float f1) {
    dst0 += 2 * g;
    float *dst1 = dst0 + S::OSTRIDE;
#pragma unroll
    for (int j = 0; j < S::NO; j++) {
      *reinterpret_cast<float2 *>(dst0 + j * 16) = make_float2(o[j][0] * f0, o[j][2] * f0);
      *reinterpret_cast<float2 *>(dst1 + j * 16) = make_float2(o[j][1] * f1, o[j][3] * f1);
    }
  }
};

/* The policy of an instance's kv code (the kernel's KV8: 0 16-bit, 1 e4m3,
 * 2 e5m2). */
template <typename T, typename S, int KV8>
struct fd_kv_format {
  using type = fd_kv8<T, S, KV8>;
};
template <typename T, typename S>
struct fd_kv_format<T, S, 0> {
  using type = fd_kv16<T, S>;
};

#endif /* FD_CUDA_MMA_FORMAT_CUH */
