/*
 * mla_kernel.cu — the CUDA kernel of multi-head latent attention (MLA:
 * rope_dim > 0; flashdecode.h, MULTI-HEAD LATENT ATTENTION): one kv head
 * whose key is [c_kv (D = 512 or 448) | k_pe (64)] and whose value is c_kv,
 * the same bytes. Tensor cores (mma.sync.m16n8k16, ldmatrix, cp.async:
 * sm_80 instructions), query rows on the mma's M side (the FlashAttention-2
 * orientation, FlashMLA's structure on mma.sync).
 *
 * GRID  (num_splits, row_tiles, batch): one block of 8 warps per (split s,
 *   row tile rt, sequence b), over keys [begin, end) of fd_seq_split (split.h,
 *   as every split kernel), for rows r = 16 RG rt .. + 16 RG - 1 of the
 *   sequence's num_heads_q * q_len rows (row r: head r / q_len, token
 *   r % q_len; rows past the last are zeros and write nothing). RG, the row
 *   groups of 16 rows a block, is 1 or 2 (64-key tiles) or 4 (32-key
 *   tiles): gpu_select.h fd_mla_row_groups, which the plan counts the row
 *   tiles with. Causal rows see keys [begin, min(end, kv_len - q_len + t + 1))
 *   (fd_row_keys, row_keys.h).
 *
 * WARPS  Warp w is (rg, cw) = (w / CPW, w % CPW), CPW = 8 / RG warps a row
 *   group. A tile's scores S = Q K^T for row group rg are cut by keys: warp
 *   cw computes S for keys cw KPW .. + KPW - 1 (KPW = KT / CPW: 8 or 16) over
 *   all 576 (512) columns (two mma chains: even and odd k-steps); RG 1
 *   keeps Q's A fragments in registers for the whole split, RG 2 and 4
 *   read them from shared memory every tile. The row maxima are exchanged
 *   through shared
 *   memory (every warp of the group then holds the same running max m), and
 *   the 16-bit P of the group's rows goes to shared memory, from which each
 *   warp computes O += P V for ITS columns (16-column chunks cw NCW .. + NCW
 *   - 1 of D, NCW = ceil(D / 16 / CPW)) over all the tile's keys. V is the
 *   K tile's first D columns: no second copy. fp32 O a lane: 32 registers
 *   (RG 1), 64 (RG 2) or 128 (RG 4, D 512).
 *
 * TILE STEPS  (per tile i; one block barrier and two row-group barriers;
 *   each a named step of the kernel's tile loop)
 *   fd_mla_wait_tile: wait for the tile's copies, block barrier;
 *   fd_mla_refill: issue the copies of tile i + ST - 1 into the stage tile
 *   i - 1 used (ST stages: 3 at RG 1, 5 at RG 1 over fp8 (4 at D 448),
 *   else 2; ST - 1 tiles in flight while one is computed);
 *   fd_mla_page_ahead: load the block_table entries of tile i + 2 ST - 1;
 *   fd_mla_scores: S (latent and rope k-steps);
 *   fd_mla_mask: scale, mask (causal bound of the lane's rows, key flags);
 *   fd_mla_group_max: row maxima -> shared memory, group barrier;
 *   fd_mla_softmax: online softmax in base 2 (a row whose max is still
 *   -inf subtracts 0), P -> shared memory; group barrier;
 *   fd_mma_rescale_rows, fd_mla_pv: O rescaled, O += P V;
 *   fd_mla_offsets_ahead: the byte offsets of tile i + ST's keys -> shared
 *   memory (their block_table entries were loaded ST - 1 tiles earlier).
 *   Before the loop: fd_mla_prologue (the offsets of tiles 0 .. ST - 1,
 *   the copies of tiles 0 .. ST - 2), fd_mla_load_q (RG 1 then
 *   fd_mla_q_frags); after it: fd_mla_finish_o, fd_mla_group_sums,
 *   fd_mla_write_rows (OUTPUT).
 *
 * LOADS  Thread t < KT turns key t of a tile into byte offsets of its c_kv
 *   and k_pe rows (and its token scale's index), through the block_table
 *   for paged caches (any page_size, one id a key), or -1 for a key past the
 *   split's end or on a page id outside [0, num_pages): such keys are
 *   zero-filled without a read and flagged, and their scores are -inf. All
 *   threads then copy the tile's 16-byte chunks by cp.async.cg, 256 / KT
 *   threads a key (its offsets read once, one cp.async a chunk): the latent
 *   row (2D bytes, or D fp8 bytes in a 512-byte row) and the rope row (128
 *   bytes, or 64 fp8) of each key, chunk c of row k at (c & ~7) | ((c ^ k) &
 *   7) so every ldmatrix phase hits 8 bank groups. TOKEN scales travel with
 *   the tile (cp.async, 4 bytes a key).
 *
 * TILE MATH  16-bit cache (fp16 or bf16, the q dtype): S: Q's A fragments
 *   and K's B fragments by ldmatrix.x4; P one 16-bit part (the q dtype), or
 *   for an fp32 output a hi and a lo part (two mma, P keeps ~16 bits, as
 *   the split kernel); V's B fragments by
 *   ldmatrix.x4.trans. fp8 cache (e4m3 / e5m2: a template constant): every
 *   mma in fp16, K and V widened in registers (fd_fp8x4_widen, exact):
 *   S takes a k-step's logical columns 2 qd, 2 qd + 1, 2 qd + 8, 2 qd + 9 as
 *   head_dim columns 4 qd .. + 3 (the bytes a non-trans ldmatrix of the fp8
 *   rows gives a lane), Q's A fragments read in that order (8 bytes a row);
 *   P one fp16 part; V by ldmatrix.trans of the fp8 rows and a byte permute
 *   into an n-tile of a 16-column chunk's even columns and one of its odd
 *   columns, which the output store undoes. bf16 q over an fp8 cache enters
 *   as fp16 times 2^qe, a power of two a row (its largest |q| in (2^14,
 *   2^15]), and the row's score scale takes 2^-qe. The rope part: fp8 with
 *   the latent (same widening, same 2^qe), or 16-bit beside an fp8 latent,
 *   then its own accumulator in the q dtype, unscaled by k_scale.
 *   k_scale (TENSOR / HEAD: one value; TOKEN: a key's) multiplies the
 *   latent's scaled score; V is c_kv * k_scale: TENSOR / HEAD at the end;
 *   TOKEN: P = 2^((s + e) - u) f for v-scale f 2^e (f in [1, 2)), u the
 *   row's running max of s + e, so the fp16 P is in [0, 2) for any finite
 *   scale; O runs relative to 2^u and is brought to 2^m at the end.
 *
 * OUTPUT  num_splits > 1: unnormalised O, (m ln 2, l) into the partials for
 *   the combine (combine_kernel.cu); empty splits exit at once. num_splits
 *   == 1: out = O / l, lse. A row whose O holds a NaN or Inf gets l = NaN
 *   (lse NaN). Each warp writes its own columns; l is summed over the
 *   group's warps in warp order (deterministic).
 *
 * SHARED MEMORY  gpu_select.h FD_MLA_SMEM (D 512: 231,936 B at RG 1, Q in
 *   the last stage; 197,376 B at RG 2; 158,784 B at RG 4): one block an
 *   SM; RG 1 and 2 need ~227 KB a block (sm_90, sm_100), RG 4 fits sm_80.
 *   GPUs with 99 KB a block have no MLA kernel (the plan refuses them).
 *
 * PDL  As the split kernels: wait for the previous kernel, then let the
 *   combine be scheduled.
 */
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "device_util.cuh"
#include "flashdecode.h"
#include "gpu_select.h"
#include "kernel_params.cuh"
#include "mma_format.cuh"
#include "mma_primitives.cuh"
#include "pass_output.cuh"
#include "split.h"

/* Compile-time shape of one instance: q dtype T, latent width D, RG row
 * groups, KV8 the cache (0 16-bit, 1 e4m3, 2 e5m2). */
template <typename T, int D, int RG, int KV8>
struct fd_mla_cfg {
  static constexpr int NW = FD_MLA_WARPS;
  static constexpr int THREADS = 32 * NW;
  static constexpr int ROWS = 16 * RG;            /* rows a block */
  static constexpr int CPW = NW / RG;             /* warps a row group */
  static constexpr int KT = FD_MLA_KT(RG);        /* keys a tile */
  /* cp.async stages: an fp8 tile is half as large, RG 1 takes 5 of them
   * (4 at D 448, within the 16-bit instance's shared memory) */
  static constexpr int ST = (KV8 != 0 && RG == 1) ? (D == 512 ? 5 : 4) : FD_MLA_ST(RG);
  static constexpr int KPW = KT / CPW;            /* keys of a warp's S */
  static constexpr int NG = KPW / 8;              /* S n-tiles a warp */
  static constexpr bool FP8 = KV8 != 0;
  static constexpr bool E5M2 = KV8 == 2;          /* the fp8 format */
  using QT = T;                                   /* the q dtype */
  using PT = typename std::conditional<FP8, __half, T>::type; /* P's and V's mma type */
  static constexpr int LB = FP8 ? 512 : 2 * D;    /* latent bytes a tile row */
  static constexpr int RB = 128;                  /* rope bytes a tile row */
  static constexpr int QLB = 2 * D;               /* latent bytes a Q row */
  static constexpr int CL = FP8 ? D / 16 : D / 8; /* latent 16-byte chunks a key */
  static constexpr int CPK = CL + 8;              /* chunks a key at most (rope 16-bit) */
  static constexpr int KSL = D / 16;              /* latent k-steps */
  static constexpr int DCH = D / 16;              /* 16-column chunks of V */
  static constexpr int NCW = ((DCH + CPW - 1) / CPW + 1) & ~1; /* V chunks a warp (even) */
  static constexpr int NT = 2 * NCW;              /* O n-tiles a warp */
  static constexpr int PRB = KT * 2;              /* bytes a P row */
  /* shared memory, bytes */
  static constexpr size_t STAGE = (size_t)KT * (LB + RB);
  /* RG 1: Q in the last stage (read into registers before its first copy) */
  static constexpr bool QIN = RG == 1;
  static constexpr size_t OFF_Q = QIN ? (ST - 1) * STAGE : ST * STAGE;
  static constexpr size_t OFF_QR = OFF_Q + (size_t)ROWS * QLB;
  static constexpr size_t OFF_P = QIN ? ST * STAGE : OFF_QR + (size_t)ROWS * RB;
  static constexpr size_t P_BYTES = (size_t)ROWS * PRB;
  static constexpr size_t OFF_X = OFF_P + 2 * P_BYTES;
  static constexpr size_t OFF_OFFS = OFF_X + (size_t)NW * 16 * 8;
  static constexpr size_t OFF_TOK = OFF_OFFS + (size_t)ST * KT * 24;
  static constexpr size_t OFF_QS = OFF_TOK + (size_t)ST * KT * 4;
  static constexpr size_t OFF_FLAGS = OFF_QS + (size_t)ROWS * 4;
  static constexpr size_t SMEM = OFF_FLAGS + (size_t)ST * KT;
  static_assert(D == 512 || D == 448, "latent width");
  static_assert(RG == 1 || RG == 2 || RG == 4, "row groups");
  static_assert(NG == 1 || NG == 2, "a warp's keys: 8 or 16");
  static_assert(NCW % 2 == 0, "fp8 P V takes chunks in pairs");
  static_assert(CPW * NCW >= DCH, "every V chunk has a warp");
  static_assert(FP8 || SMEM == FD_MLA_SMEM(D, RG), "gpu_select.h sizes the kernel the same way");
  static_assert(SMEM <= FD_MLA_SMEM(D, RG), "fp8 instances take no more than the 16-bit one");
  static_assert(LB % 128 == 0 && QLB % 128 == 0, "swizzled rows of whole 128-byte lines");
  static_assert(64 % KT == 0, "tiles start at multiples of 64 keys");
  static_assert(!QIN || (size_t)ROWS * (QLB + RB) <= STAGE, "Q fits a stage");
  static_assert(!QIN || ST >= 3, "Q's stage is first copied to after the first block barrier");
};

/* Byte offset of 16-byte chunk c of row r in rows of RB bytes (a multiple
 * of 128): the chunk's low 3 bits xor the row's. */
template <int RB>
static __device__ __forceinline__ uint32_t fd_mla_swz(int r, int c) {
  return (uint32_t)(r * RB + (((c & ~7) | ((c ^ r) & 7)) << 4));
}

/* The same for the P rows (128 bytes: 64 keys; 64 bytes: 32 keys, two rows
 * a bank line, chunk ^ ((r >> 1) & 3)). */
template <int PRB>
static __device__ __forceinline__ uint32_t fd_mla_pswz(int r, int c) {
  if constexpr (PRB == 128) return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
  else return (uint32_t)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}

/* bar.sync on named barrier `bar` (1 + rg for row group rg; barrier 0 is
 * __syncthreads') for the group's CPW warps. */
template <int CPW>
static __device__ __forceinline__ void fd_mla_group_sync(int bar) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(bar), "r"(32 * CPW) : "memory");
}

/* ---- Loads ---- */

/* Key j's page id (paged caches), loaded a tile ahead of fd_mla_key_store. */
static __device__ __forceinline__ int fd_mla_key_page(const fd_kernel_params &p, int b, int j,
                                                      bool in) {
  if (!in || p.page_size <= 0) return 0;
  return __ldg(p.block_table + (int64_t)b * p.block_table_stride + j / p.page_size);
}

/* Key j's byte offsets in c_kv (dst[0], -1: not read) and k_pe (dst[1]), and
 * its token scale's index (dst[2]). */
static __device__ __forceinline__ void fd_mla_key_store(const fd_kernel_params &p, int b, int j,
                                                        bool in, int page, int kesz, int resz,
                                                        int64_t *dst) {
  int64_t oc = -1, orp = 0, os = 0;
  if (in) {
    int64_t base, pos;
    bool ok = true;
    if (p.page_size > 0) {
      base = page;
      pos = j % p.page_size;
      ok = p.num_pages <= 0 || (page >= 0 && page < p.num_pages);
    } else {
      base = b;
      pos = j;
    }
    if (ok) {
      oc = (base * p.k_strides[0] + pos * p.k_strides[1]) * kesz;
      orp = (base * p.k_pe_strides[0] + pos * p.k_pe_strides[1]) * resz;
      os = base * p.scale_strides[0] + pos * p.scale_strides[1];
    }
  }
  dst[0] = oc;
  dst[1] = orp;
  dst[2] = os;
}

/* One tile's copies into a stage: every key's latent and rope chunks (keys
 * with offset -1 zero-filled), its flag, and (TOKEN) its scale. `offs`: the
 * tile's [KT][3] offsets. */
template <typename C>
static __device__ __forceinline__ void fd_mla_issue(const fd_kernel_params &p,
                                                    const int64_t *offs, int rope_chunks,
                                                    bool tok, unsigned char *stage,
                                                    unsigned char *flags, float *tok_dst) {
  /* TPK threads a key: thread t takes key t / TPK, its chunks t % TPK +
   * TPK j; the key's offsets are read once, each chunk is one cp.async with
   * a compile-time source step. */
  constexpr int TPK = C::THREADS / C::KT;
  constexpr int NL = (C::CL + TPK - 1) / TPK; /* latent chunks a thread at most */
  constexpr int NR = (8 + TPK - 1) / TPK;     /* rope chunks a thread at most */
  static_assert(C::THREADS % C::KT == 0 && TPK <= 8, "whole keys a warp, chunk groups of 8");
  const int tid = threadIdx.x;
  const int key = tid / TPK, q = tid % TPK;
  const int64_t oc = offs[3 * key];
  const bool ok = oc >= 0;
  const unsigned char *src = static_cast<const unsigned char *>(p.k_cache) + (ok ? oc : 0);
  const unsigned char *rsrc =
      static_cast<const unsigned char *>(p.k_pe_cache) + (ok ? offs[3 * key + 1] : 0);
  const uint32_t k7 = (uint32_t)(key & 7);
  unsigned char *const lrow = stage + (size_t)key * C::LB;
  unsigned char *const rrow = stage + (size_t)C::KT * C::LB + (size_t)key * C::RB;
#pragma unroll
  for (int j = 0; j < NL; j++) {
    const int c = q + TPK * j;
    if (C::CL % TPK == 0 || c < C::CL)
      fd_cp_async16(lrow + ((((uint32_t)c & ~7u) | (((uint32_t)c ^ k7) & 7u)) << 4),
                    ok ? src + 16 * c : src, ok);
  }
#pragma unroll
  for (int j = 0; j < NR; j++) {
    const int c = q + TPK * j;
    if (c < rope_chunks)
      fd_cp_async16(rrow + ((((uint32_t)c & ~7u) | (((uint32_t)c ^ k7) & 7u)) << 4),
                    ok ? rsrc + 16 * c : rsrc, ok);
  }
  if (tid < C::KT) {
    const bool in = offs[3 * tid] >= 0;
    flags[tid] = in ? 1 : 0;
    if (tok) fd_cp_async4(tok_dst + tid, in ? p.k_scale + offs[3 * tid + 2] : p.k_scale, in);
  }
}

/* Q rows row_base .. + ROWS - 1 (zeros past rows_total) into shared memory:
 * latent [ROWS][2D] and rope [ROWS][64] 16-bit, swizzled; warp w takes rows
 * w, w + 8, ... fp8 caches with bf16 q: the latent (and an fp8 rope part)
 * as fp16 times 2^qe (qe a row), sQs[r] = 2^-qe; else sQs[r] = 1. */
template <typename T, typename C>
static __device__ __forceinline__ void fd_mla_load_q(const fd_kernel_params &p, int b,
                                                     int row_base, int rows_total, bool rope8,
                                                     unsigned char *sQ, unsigned char *sQR,
                                                     float *sQs) {
  constexpr int CLQ = C::QLB / 16; /* latent chunks a row */
  constexpr int NCQ = CLQ + 8;     /* with the rope's */
  constexpr int NI = (NCQ + 31) / 32;
  constexpr bool CONVERT = C::FP8 && std::is_same<T, __nv_bfloat16>::value;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int r = warp; r < C::ROWS; r += C::NW) {
    const int row = row_base + r;
    const bool live = row < rows_total;
    const int h = live ? row / p.q_len : 0;
    const int t = live ? row - h * p.q_len : 0;
    const T *ql = static_cast<const T *>(p.q) + (int64_t)b * p.q_strides[0] +
                  (int64_t)t * p.q_strides[1] + (int64_t)h * p.q_strides[2];
    const T *qr = static_cast<const T *>(p.q_pe) + (int64_t)b * p.q_pe_strides[0] +
                  (int64_t)t * p.q_pe_strides[1] + (int64_t)h * p.q_pe_strides[2];
    uint4 x[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = lane + 32 * i;
      x[i] = make_uint4(0u, 0u, 0u, 0u);
      if (live && c < NCQ)
        x[i] = c < CLQ ? *reinterpret_cast<const uint4 *>(ql + 8 * c)
                       : *reinterpret_cast<const uint4 *>(qr + 8 * (c - CLQ));
    }
    float qs = 1.0f;
    if constexpr (CONVERT) {
      float mq = 0.0f;
#pragma unroll
      for (int i = 0; i < NI; i++) {
        const int c = lane + 32 * i;
        if (c < CLQ || (rope8 && c < NCQ)) {
          const uint32_t w[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
          for (int k = 0; k < 4; k++) {
            const float2 f = fd_unpack2<__nv_bfloat16>(w[k]);
            mq = fmaxf(mq, fmaxf(fabsf(f.x), fabsf(f.y)));
          }
        }
      }
      mq = fd_warp_max(mq);
      int qe = 0;
      if (mq > 0.0f && mq <= 3.40282346638528859812e+38f) { /* else (0, inf): as is */
        int ex;
        (void)frexpf(mq, &ex); /* mq = f 2^ex, f in [0.5, 1) */
        qe = 15 - ex;
      }
      const float up = ldexpf(1.0f, qe);
      qs = ldexpf(1.0f, -qe);
#pragma unroll
      for (int i = 0; i < NI; i++) {
        const int c = lane + 32 * i;
        if (c < CLQ || (rope8 && c < NCQ)) {
          uint32_t w[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
          for (int k = 0; k < 4; k++) {
            const float2 f = fd_unpack2<__nv_bfloat16>(w[k]);
            w[k] = fd_pack2<__half>(f.x * up, f.y * up);
          }
          x[i] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = lane + 32 * i;
      if (c < CLQ)
        *reinterpret_cast<uint4 *>(sQ + fd_mla_swz<C::QLB>(r, c)) = x[i];
      else if (c < NCQ)
        *reinterpret_cast<uint4 *>(sQR + fd_mla_swz<C::RB>(r, c - CLQ)) = x[i];
    }
    if (lane == 0) sQs[r] = qs;
  }
}

/* ---- Tile math ---- */

/* S += Q K^T over NKS k-steps of 16-bit rows (MT: the mma type): K rows
 * kw0 .. (KRB bytes a row) at k_u, Q rows qr0 .. qr0 + 15 (QRB bytes) at
 * q_u, or (QREG) Q's A fragments already in registers, qf[ks]; acc[n] is
 * keys kw0 + 8 n .. + 7. Odd k-steps accumulate apart (two mma chains). */
template <typename MT, int NG, int NKS, int KRB, int QRB, bool QREG>
static __device__ __forceinline__ void fd_mla_qk16(uint32_t k_u, uint32_t q_u,
                                                   const uint32_t (*qf)[4], int kw0, int qr0,
                                                   int lane, float (&acc)[NG][4]) {
  constexpr int PER = 4 / NG; /* 8-column chunks an ldmatrix.x4 takes of a key group */
  const int mi = lane >> 3;
  const int krow = kw0 + (mi / PER) * 8 + (lane & 7);
  const int kci = mi % PER;
  const int qrow = qr0 + (mi & 1) * 8 + (lane & 7);
  const int qci = mi >> 1;
  float a2[NG][4];
#pragma unroll
  for (int n = 0; n < NG; n++) a2[n][0] = a2[n][1] = a2[n][2] = a2[n][3] = 0.0f;
#pragma unroll
  for (int c = 0; c < 2 * NKS; c += PER) {
    uint32_t kb[4];
    fd_ldmatrix_x4(kb, k_u + fd_mla_swz<KRB>(krow, c + kci));
#pragma unroll
    for (int h = 0; h < PER / 2; h++) {
      const int ks = c / 2 + h;
      uint32_t qa[4];
      if constexpr (QREG) {
        qa[0] = qf[ks][0];
        qa[1] = qf[ks][1];
        qa[2] = qf[ks][2];
        qa[3] = qf[ks][3];
      } else {
        fd_ldmatrix_x4(qa, q_u + fd_mla_swz<QRB>(qrow, 2 * ks + qci));
      }
#pragma unroll
      for (int n = 0; n < NG; n++) {
        if (ks & 1)
          fd_mma16816<MT>(a2[n], qa, kb[n * PER + 2 * h], kb[n * PER + 2 * h + 1]);
        else
          fd_mma16816<MT>(acc[n], qa, kb[n * PER + 2 * h], kb[n * PER + 2 * h + 1]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NG; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[n][e] += a2[n][e];
}

/* Q's A fragments of rows qr0 .. qr0 + 15, k-steps 0 .. NKS - 1 (QRB bytes a
 * row at q_u), as fd_mla_qk16 reads them. */
template <int NKS, int QRB>
static __device__ __forceinline__ void fd_mla_qfrag16(uint32_t q_u, int qr0, int lane,
                                                      uint32_t (*qf)[4]) {
  const int mi = lane >> 3;
  const int qrow = qr0 + (mi & 1) * 8 + (lane & 7);
  const int qci = mi >> 1;
#pragma unroll
  for (int ks = 0; ks < NKS; ks++) fd_ldmatrix_x4(qf[ks], q_u + fd_mla_swz<QRB>(qrow, 2 * ks + qci));
}

/* The same as fd_mla_qk8 reads them (8 bytes a row, permuted columns). */
template <int NKS, int QRB>
static __device__ __forceinline__ void fd_mla_qfrag8(const unsigned char *sQ, int qr0, int lane,
                                                     uint32_t (*qf)[4]) {
  const int g = lane >> 2, qd = lane & 3;
#pragma unroll
  for (int ks = 0; ks < NKS; ks++) {
    const uint2 x0 = *reinterpret_cast<const uint2 *>(
        sQ + fd_mla_swz<QRB>(qr0 + g, 2 * ks + (qd >> 1)) + 8 * (qd & 1));
    const uint2 x1 = *reinterpret_cast<const uint2 *>(
        sQ + fd_mla_swz<QRB>(qr0 + g + 8, 2 * ks + (qd >> 1)) + 8 * (qd & 1));
    qf[ks][0] = x0.x;
    qf[ks][1] = x1.x;
    qf[ks][2] = x0.y;
    qf[ks][3] = x1.y;
  }
}

/* The same for fp8 K rows (16 columns a 16-byte chunk), fp16 Q: a k-step's
 * logical columns 2 qd, 2 qd + 1, 2 qd + 8, 2 qd + 9 are columns 4 qd .. + 3;
 * Q's A fragments read in that order, 8 bytes a row (QREG: fd_mla_qfrag8's,
 * in registers). Odd k-steps accumulate apart. */
template <int NG, int NKS, int KRB, int QRB, bool E5M2, bool QREG>
static __device__ __forceinline__ void fd_mla_qk8(uint32_t k_u, const unsigned char *sQ,
                                                  const uint32_t (*qf)[4], int kw0, int qr0,
                                                  int lane, float (&acc)[NG][4]) {
  constexpr int PER = 4 / NG; /* chunks (k-steps) an ldmatrix.x4 takes of a key group */
  const int mi = lane >> 3, g = lane >> 2, qd = lane & 3;
  const int krow = kw0 + (mi / PER) * 8 + (lane & 7);
  const int kci = mi % PER;
  float a2[NG][4];
#pragma unroll
  for (int n = 0; n < NG; n++) a2[n][0] = a2[n][1] = a2[n][2] = a2[n][3] = 0.0f;
#pragma unroll
  for (int c = 0; c < NKS; c += PER) {
    uint32_t kr[4];
    fd_ldmatrix_x4(kr, k_u + fd_mla_swz<KRB>(krow, c + kci));
#pragma unroll
    for (int h = 0; h < PER; h++) {
      const int ks = c + h;
      uint32_t qa[4];
      if constexpr (QREG) {
        qa[0] = qf[ks][0];
        qa[1] = qf[ks][1];
        qa[2] = qf[ks][2];
        qa[3] = qf[ks][3];
      } else {
        const uint2 x0 = *reinterpret_cast<const uint2 *>(
            sQ + fd_mla_swz<QRB>(qr0 + g, 2 * ks + (qd >> 1)) + 8 * (qd & 1));
        const uint2 x1 = *reinterpret_cast<const uint2 *>(
            sQ + fd_mla_swz<QRB>(qr0 + g + 8, 2 * ks + (qd >> 1)) + 8 * (qd & 1));
        qa[0] = x0.x;
        qa[1] = x1.x;
        qa[2] = x0.y;
        qa[3] = x1.y;
      }
#pragma unroll
      for (int n = 0; n < NG; n++) {
        uint32_t b0, b1;
        fd_fp8x4_widen<__half>(kr[n * PER + h], E5M2, b0, b1);
        if (ks & 1)
          fd_mma16816<__half>(a2[n], qa, b0, b1);
        else
          fd_mma16816<__half>(acc[n], qa, b0, b1);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NG; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[n][e] += a2[n][e];
}

/* O += P V, 16-bit V (the q dtype T): P (rows qr0 .. qr0 + 15 of the P
 * buffers; LO: a hi and a lo part) by ldmatrix.x4, V's B fragments by
 * ldmatrix.x4.trans; o[2 j + hh] is columns 16 (c0w + j) + 8 hh .. + 7. */
template <typename T, typename C, bool LO>
static __device__ __forceinline__ void fd_mla_pv16(uint32_t v_u, uint32_t ph_u, uint32_t pl_u,
                                                   int qr0, int c0w, int lane,
                                                   float (&o)[C::NT][4]) {
  const int mi = lane >> 3;
  const int prow = qr0 + (mi & 1) * 8 + (lane & 7);
  const int vrow = (mi & 1) * 8 + (lane & 7);
#pragma unroll
  for (int kk = 0; kk < C::KT / 16; kk++) {
    uint32_t ph[4], pl[4];
    fd_ldmatrix_x4(ph, ph_u + fd_mla_pswz<C::PRB>(prow, 2 * kk + (mi >> 1)));
    if constexpr (LO) fd_ldmatrix_x4(pl, pl_u + fd_mla_pswz<C::PRB>(prow, 2 * kk + (mi >> 1)));
#pragma unroll
    for (int j = 0; j < C::NCW; j++) {
      if (c0w + j < C::DCH) { /* warp-uniform */
        uint32_t vb[4];
        fd_ldmatrix_x4_trans(vb, v_u + fd_mla_swz<C::LB>(kk * 16 + vrow, 2 * (c0w + j) + (mi >> 1)));
        fd_mma16816<T>(o[2 * j], ph, vb[0], vb[1]);
        fd_mma16816<T>(o[2 * j + 1], ph, vb[2], vb[3]);
        if constexpr (LO) {
          fd_mma16816<T>(o[2 * j], pl, vb[0], vb[1]);
          fd_mma16816<T>(o[2 * j + 1], pl, vb[2], vb[3]);
        }
      }
    }
  }
}

/* O += P V, fp8 V widened to fp16, fp16 P: one ldmatrix.x4.trans takes 16
 * keys x two 16-column chunks; a lane's register holds keys 2 qd, 2 qd + 1 x
 * columns 2 g, 2 g + 1 of a chunk, permuted into the B fragments of the
 * chunk's even columns (o[2 j]) and odd ones (o[2 j + 1]). */
template <typename C, bool E5M2>
static __device__ __forceinline__ void fd_mla_pv8(uint32_t v_u, uint32_t p_u, int qr0, int c0w,
                                                  int lane, float (&o)[C::NT][4]) {
  const int mi = lane >> 3;
  const int prow = qr0 + (mi & 1) * 8 + (lane & 7);
  const int vrow = (mi & 1) * 8 + (lane & 7);
#pragma unroll
  for (int kk = 0; kk < C::KT / 16; kk++) {
    uint32_t pa[4];
    fd_ldmatrix_x4(pa, p_u + fd_mla_pswz<C::PRB>(prow, 2 * kk + (mi >> 1)));
#pragma unroll
    for (int jj = 0; jj < C::NCW / 2; jj++) {
      const int c = c0w + 2 * jj;
      if (c < C::DCH) { /* warp-uniform; DCH is even */
        uint32_t vr[4];
        fd_ldmatrix_x4_trans(vr, v_u + fd_mla_swz<C::LB>(kk * 16 + vrow, c + (mi >> 1)));
#pragma unroll
        for (int h = 0; h < 2; h++) {
          uint32_t b0, b1;
          fd_fp8x4_widen<__half>(__byte_perm(vr[2 * h], vr[2 * h + 1], 0x6420), E5M2, b0, b1);
          fd_mma16816<__half>(o[2 * (2 * jj + h)], pa, b0, b1);
          fd_fp8x4_widen<__half>(__byte_perm(vr[2 * h], vr[2 * h + 1], 0x7531), E5M2, b0, b1);
          fd_mma16816<__half>(o[2 * (2 * jj + h) + 1], pa, b0, b1);
        }
      }
    }
  }
}

/* Where row `row` of sequence b writes (element 0 of its head_dim
 * columns): its partial of `split` (float, num_splits > 1), or its out row
 * (float32 or T); nullptr for a row past the last. */
template <typename T>
static __device__ __forceinline__ unsigned char *fd_mla_row_dst(const fd_kernel_params &p, int b,
                                                                int split, int row, bool live) {
  if (!live) return nullptr;
  const int h = row / p.q_len;
  const int t = row - h * p.q_len;
  if (p.num_splits > 1) {
    const int64_t prow = ((int64_t)b * p.num_heads_q + h) * p.q_len + t;
    return reinterpret_cast<unsigned char *>(p.partial_o + (prow * p.num_splits + split) * p.head_dim);
  }
  const int64_t off = (int64_t)b * p.out_strides[0] + (int64_t)t * p.out_strides[1] +
                      (int64_t)h * p.out_strides[2];
  return p.out_f32 ? reinterpret_cast<unsigned char *>(static_cast<float *>(p.out) + off)
                   : reinterpret_cast<unsigned char *>(static_cast<T *>(p.out) + off);
}

/* Columns d, d + 1 of a row at dst: x, y times mul, as T (packed) or float. */
template <typename T>
static __device__ __forceinline__ void fd_mla_put2(unsigned char *dst, bool as_t, int d, float x,
                                                   float y, float mul) {
  if (!dst) return;
  if (as_t)
    *reinterpret_cast<uint32_t *>(dst + 2 * d) = fd_pack2<T>(x * mul, y * mul);
  else
    *reinterpret_cast<float2 *>(dst + 4 * d) = make_float2(x * mul, y * mul);
}

/* ---- The kernel, step by step ---- */

/* The block's work: sequence b (kv its clamped kv_len), split `split` over
 * keys [begin, end) in num_tiles tiles, block rows row_base .. + ROWS - 1
 * of the sequence's rows_total. */
typedef struct fd_mla_work {
  int b, split, kv, begin, end, num_tiles, row_base, rows_total;
} fd_mla_work;

/* The block's work into *w; false for an empty split past the last key
 * (num_splits > 1: the combine skips it), which has nothing to do. */
template <typename C>
static __device__ __forceinline__ bool fd_mla_work_of(const fd_kernel_params &p, fd_mla_work *w) {
  const int rows_total = p.num_heads_q * p.q_len;
  const int split = blockIdx.x;
  const int row_base = blockIdx.y * C::ROWS;
  const int b = blockIdx.z;
  int kv = fd_kv_len(p, b);
  int begin, end;
  fd_seq_split(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed, split,
               &begin, &end);
  if (p.num_splits > 1 && begin >= end) return false;
  w->b = b;
  w->split = split;
  w->kv = kv;
  w->begin = begin;
  w->end = end;
  w->num_tiles = (end - begin + C::KT - 1) / C::KT;
  w->row_base = row_base;
  w->rows_total = rows_total;
  return true;
}

/* Shared memory of a block (SHARED MEMORY; fd_mla_cfg's OFF_*), and as
 * shared-space addresses (the ldmatrix operands). */
typedef struct fd_mla_bufs {
  unsigned char *k;       /* [ST] stages: [KT][LB] latent rows, then [KT][RB] rope rows */
  unsigned char *q, *qr;  /* Q: latent [ROWS][QLB], rope [ROWS][RB] */
  unsigned char *ph, *pl; /* P: [ROWS][PRB] each, the 16-bit part and the lo part */
  float2 *x;              /* [NW][16]: the row-group exchanges (maxima, sums) */
  int64_t *offs;          /* [ST][KT][3]: the keys' offsets (fd_mla_key_store) */
  float *tok;             /* [ST][KT]: TOKEN scales */
  float *qs;              /* [ROWS]: Q's row scales (fd_mla_load_q) */
  unsigned char *flags;   /* [ST][KT]: key flags */
  uint32_t k_u, q_u, qr_u, ph_u, pl_u;
} fd_mla_bufs;

template <typename C>
static __device__ __forceinline__ void fd_mla_carve(unsigned char *smem, fd_mla_bufs *s) {
  s->k = smem;
  s->q = smem + C::OFF_Q;
  s->qr = smem + C::OFF_QR;
  s->ph = smem + C::OFF_P;
  s->pl = s->ph + C::P_BYTES;
  s->x = reinterpret_cast<float2 *>(smem + C::OFF_X);
  s->offs = reinterpret_cast<int64_t *>(smem + C::OFF_OFFS);
  s->tok = reinterpret_cast<float *>(smem + C::OFF_TOK);
  s->qs = reinterpret_cast<float *>(smem + C::OFF_QS);
  s->flags = smem + C::OFF_FLAGS;
  s->k_u = (uint32_t)__cvta_generic_to_shared(s->k);
  s->q_u = (uint32_t)__cvta_generic_to_shared(s->q);
  s->qr_u = (uint32_t)__cvta_generic_to_shared(s->qr);
  s->ph_u = (uint32_t)__cvta_generic_to_shared(s->ph);
  s->pl_u = (uint32_t)__cvta_generic_to_shared(s->pl);
}

/* A thread's place (WARPS): warp (rg, cw); lane (g, qd): accumulator rows
 * qr0 + g, qr0 + g + 8, columns 2 qd, 2 qd + 1 of each n-tile. */
typedef struct fd_mla_thread {
  int tid, lane, warp, g, qd, rg, cw;
  int qr0; /* the group's first row in the block */
  int kw0; /* the warp's first key of a tile (S) */
  int c0w; /* the warp's first 16-column chunk (O) */
  int bar; /* the row group's named barrier (fd_mla_group_sync): 1 + rg */
} fd_mla_thread;

template <typename C>
static __device__ __forceinline__ void fd_mla_thread_of(fd_mla_thread *t) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp / C::CPW, cw = warp % C::CPW;
  t->tid = tid;
  t->lane = lane;
  t->warp = warp;
  t->g = lane >> 2;
  t->qd = lane & 3;
  t->rg = rg;
  t->cw = cw;
  t->qr0 = rg * 16;
  t->kw0 = cw * C::KPW;
  t->c0w = cw * C::NCW;
  t->bar = 1 + rg;
}

/* What the call sets for every block: the cache's formats and scales. */
typedef struct fd_mla_call {
  bool rope8;      /* an fp8 rope part (beside an fp8 latent) */
  int kesz, resz;  /* bytes an element of c_kv, of k_pe */
  int rope_chunks; /* 16-byte chunks of a key's rope row */
  bool tok;        /* fp8 with TOKEN scales */
  float kmul;      /* fp8 TENSOR / HEAD: k_scale (one kv head); else 1 */
  float scale;     /* softmax_scale log2(e) */
  bool p_lo;       /* P as a hi and a lo part (16-bit cache, fp32 out) */
} fd_mla_call;

template <typename C>
static __device__ __forceinline__ void fd_mla_call_of(const fd_kernel_params &p, fd_mla_call *c) {
  const bool rope8 = C::FP8 && (p.rope_dtype == FD_DTYPE_E4M3 || p.rope_dtype == FD_DTYPE_E5M2);
  float kmul = 1.0f;
  if (C::FP8 && (p.kv_scale == FD_KV_SCALE_TENSOR || p.kv_scale == FD_KV_SCALE_HEAD))
    kmul = __ldg(p.k_scale);
  c->rope8 = rope8;
  c->kesz = C::FP8 ? 1 : 2;
  c->resz = rope8 ? 1 : 2;
  c->rope_chunks = rope8 ? 4 : 8;
  c->tok = C::FP8 && p.kv_scale == FD_KV_SCALE_TOKEN;
  c->kmul = kmul;
  c->scale = p.scale_log2;
  c->p_lo = !C::FP8 && p.out_f32;
}

/* The online softmax's state of a lane's rows g (0) and g + 8 (1). */
typedef struct fd_mla_run {
  float m0, m1; /* running max (base 2) */
  float u0, u1; /* TOKEN: running max of s + e */
  float l0, l1; /* this lane's part of the sums */
} fd_mla_run;

/* A tile's row maxima, rows g (0) and g + 8 (1): of the scores (mx) and,
 * TOKEN, of s + e (se). */
typedef struct fd_mla_max {
  float mx0, mx1, se0, se1;
} fd_mla_max;

/* Pipeline prologue: the offsets of tiles 0 .. ST-1, the block barrier,
 * tiles 0 .. ST-2 copied (a commit group each, empty or not), and the page
 * ids of tiles ST .. ST + PL - 1 loaded into ring. Page ids (block_table
 * entries, key tid of a tile) are loaded PL = ST - 1 tiles before the
 * offsets are stored: the load waits behind the copies this multiprocessor
 * has in flight, so it gets ST - 1 tiles of time. ring[k] holds tile
 * i + ST + k's at the top of tile i. */
template <typename C>
static __device__ __forceinline__ void fd_mla_prologue(const fd_kernel_params &p,
                                                       const fd_mla_work &w,
                                                       const fd_mla_call &cl,
                                                       const fd_mla_bufs &sm,
                                                       int (&ring)[C::ST - 1]) {
  constexpr int KT = C::KT, ST = C::ST, PL = ST - 1;
  const int tid = threadIdx.x;
  const int b = w.b, begin = w.begin, end = w.end, num_tiles = w.num_tiles;
  if (tid < KT) {
#pragma unroll
    for (int s = 0; s < ST; s++) {
      if (s < num_tiles) {
        const int key0 = begin + s * KT;
        const bool in = tid < end - key0;
        const int j = key0 + tid;
        fd_mla_key_store(p, b, j, in, fd_mla_key_page(p, b, j, in), cl.kesz, cl.resz,
                         sm.offs + (s * KT + tid) * 3);
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < num_tiles)
      fd_mla_issue<C>(p, sm.offs + s * KT * 3, cl.rope_chunks, cl.tok, sm.k + s * C::STAGE,
                      sm.flags + s * KT, sm.tok + s * KT);
    fd_cp_async_commit();
  }
#pragma unroll
  for (int k = 0; k < PL; k++) {
    const int t = ST + k;
    const bool has = t < num_tiles;
    const int key0 = has ? begin + t * KT : begin; /* no overflow past the last tile */
    ring[k] = fd_mla_key_page(p, b, key0 + tid, tid < KT && has && tid < end - key0);
  }
}

/* RG 1: Q's A fragments (latent k-steps, then the rope's 4) into registers
 * for the whole split, after a block barrier (every warp's Q rows stored).
 * Q's shared memory is the last stage, first copied to after the tile
 * loop's first block barrier, which every warp reaches after its reads
 * here. */
template <typename C>
static __device__ __forceinline__ void fd_mla_q_frags(const fd_mla_bufs &sm, bool rope8, int qr0,
                                                      int lane, uint32_t (*qf)[4]) {
  __syncthreads();
  if constexpr (C::FP8) {
    fd_mla_qfrag8<C::KSL, C::QLB>(sm.q, qr0, lane, qf);
    if (rope8) fd_mla_qfrag8<4, C::RB>(sm.qr, qr0, lane, qf + C::KSL);
    else fd_mla_qfrag16<4, C::RB>(sm.qr_u, qr0, lane, qf + C::KSL);
  } else {
    fd_mla_qfrag16<C::KSL, C::QLB>(sm.q_u, qr0, lane, qf);
    fd_mla_qfrag16<4, C::RB>(sm.qr_u, qr0, lane, qf + C::KSL);
  }
}

/* The upper bounds of the keys of the lane's rows qr0 + g, qr0 + g + 8
 * (*hi0, *hi1; begin for a row past the last). */
static __device__ __forceinline__ void fd_mla_row_bounds(const fd_kernel_params &p,
                                                         const fd_mla_work &w,
                                                         const fd_mla_thread &th, int *hi0,
                                                         int *hi1) {
  int lo;
  const int r0 = w.row_base + th.qr0 + th.g, r1 = r0 + 8;
  *hi0 = w.begin;
  *hi1 = w.begin;
  if (r0 < w.rows_total)
    fd_row_keys(r0 % p.q_len, p.q_len, w.kv, p.window_left, p.non_causal, w.begin, w.end, &lo, hi0);
  if (r1 < w.rows_total)
    fd_row_keys(r1 % p.q_len, p.q_len, w.kv, p.window_left, p.non_causal, w.begin, w.end, &lo, hi1);
}

/* The top of a tile: this thread's copies of it landed, then the block
 * barrier (everyone's; the stage the previous tile used is free). */
template <int ST>
static __device__ __forceinline__ void fd_mla_wait_tile(void) {
  fd_cp_async_wait<ST - 2>();
  __syncthreads();
}

/* The copies of tile nt (i + ST - 1 at tile i: into the stage tile i - 1
 * used), if it exists; a commit group either way. */
template <typename C>
static __device__ __forceinline__ void fd_mla_refill(const fd_kernel_params &p,
                                                     const fd_mla_call &cl, const fd_mla_bufs &sm,
                                                     int nt, int num_tiles) {
  constexpr int KT = C::KT;
  const int st = nt % C::ST;
  if (nt < num_tiles)
    fd_mla_issue<C>(p, sm.offs + st * KT * 3, cl.rope_chunks, cl.tok, sm.k + st * C::STAGE,
                    sm.flags + st * KT, sm.tok + st * KT);
  fd_cp_async_commit();
}

/* The page-id ring a tile on (fd_mla_prologue): returns tile i + ST's page
 * id of key tid (loaded PL tiles ago), loads tile i + ST + PL's. */
template <typename C>
static __device__ __forceinline__ int fd_mla_page_ahead(const fd_kernel_params &p,
                                                        const fd_mla_work &w, int i,
                                                        int (&ring)[C::ST - 1]) {
  constexpr int KT = C::KT, ST = C::ST, PL = ST - 1;
  const int tid = threadIdx.x;
  const int begin = w.begin, end = w.end, num_tiles = w.num_tiles;
  const int page = ring[0];
#pragma unroll
  for (int k = 0; k + 1 < PL; k++) ring[k] = ring[k + 1];
  const bool has = i + ST + PL < num_tiles;
  const int key0 = has ? begin + (i + ST + PL) * KT : begin; /* no overflow past the last tile */
  ring[PL - 1] = fd_mla_key_page(p, w.b, key0 + tid, tid < KT && has && tid < end - key0);
  return page;
}

/* The offsets of key tid of tile i + ST (its page id `page`, from
 * fd_mla_page_ahead) into the slot tile i's used. */
template <typename C>
static __device__ __forceinline__ void fd_mla_offsets_ahead(const fd_kernel_params &p,
                                                            const fd_mla_work &w,
                                                            const fd_mla_call &cl, int i, int page,
                                                            int64_t *offs) {
  constexpr int KT = C::KT, ST = C::ST;
  const int tid = threadIdx.x;
  const int begin = w.begin, end = w.end, num_tiles = w.num_tiles;
  const bool next = i + ST < num_tiles;
  const int key0 = next ? begin + (i + ST) * KT : begin; /* no overflow past the last tile */
  const bool in = tid < KT && next && tid < end - key0;
  if (tid < KT && next)
    fd_mla_key_store(p, w.b, key0 + tid, in, page, cl.kesz, cl.resz,
                     offs + ((i + ST) % ST * KT + tid) * 3);
}

/* S = Q K^T of the tile at st_u for the warp's KPW keys (acc[n]: keys
 * kw0 + 8 n .. + 7): the latent k-steps, then the rope's 4 into acc as
 * well, or (a 16-bit rope beside an fp8 latent) into accr, in the q
 * dtype. */
template <typename C>
static __device__ __forceinline__ void fd_mla_scores(uint32_t st_u, const fd_mla_bufs &sm,
                                                     const uint32_t (*qf)[4], bool rope8,
                                                     int kw0, int qr0, int lane,
                                                     float (&acc)[C::NG][4],
                                                     float (&accr)[C::NG][4]) {
  using T = typename C::QT;
  constexpr bool QREG = C::QIN;
  const uint32_t rope_u = st_u + (uint32_t)(C::KT * C::LB);
  const uint32_t(*qfr)[4] = qf + (QREG ? C::KSL : 0);
#pragma unroll
  for (int n = 0; n < C::NG; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[n][e] = accr[n][e] = 0.0f;
  if constexpr (!C::FP8) {
    fd_mla_qk16<T, C::NG, C::KSL, C::LB, C::QLB, QREG>(st_u, sm.q_u, qf, kw0, qr0, lane, acc);
    fd_mla_qk16<T, C::NG, 4, C::RB, C::RB, QREG>(rope_u, sm.qr_u, qfr, kw0, qr0, lane, acc);
  } else {
    fd_mla_qk8<C::NG, C::KSL, C::LB, C::QLB, C::E5M2, QREG>(st_u, sm.q, qf, kw0, qr0, lane, acc);
    if (rope8)
      fd_mla_qk8<C::NG, 4, C::RB, C::RB, C::E5M2, QREG>(rope_u, sm.qr, qfr, kw0, qr0, lane, acc);
    else
      fd_mla_qk16<T, C::NG, 4, C::RB, C::RB, QREG>(rope_u, sm.qr_u, qfr, kw0, qr0, lane, accr);
  }
}

/* Scale and mask (TILE MATH): x, the scores in base 2, -inf for a key the
 * row does not see (at or past its bound hl0 / hl1, tile-local; a flagged
 * key); sr0, sr1: the rows' score scales. TOKEN: a key's v-scale f 2^e as
 * ee = e, ff = f. Returns the row maxima over this lane's keys. */
template <typename C>
static __device__ __forceinline__ fd_mla_max fd_mla_mask(
    const fd_mla_call &cl, const unsigned char *tFlags, const float *tTok, int hl0, int hl1,
    int kw0, int qd, float sr0, float sr1, const float (&acc)[C::NG][4],
    const float (&accr)[C::NG][4], float (&x)[C::NG][4], float (&ee)[C::NG][2],
    float (&ff)[C::NG][2]) {
  constexpr bool FP8 = C::FP8;
  fd_mla_max mx = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < C::NG; n++) {
#pragma unroll
    for (int c = 0; c < 2; c++) {
      const int kl = kw0 + 8 * n + 2 * qd + c;
      const bool fl = tFlags[kl] != 0;
      float km = cl.kmul;
      ee[n][c] = 0.0f;
      ff[n][c] = 1.0f;
      if (FP8 && cl.tok) {
        const float ks = tTok[kl];
        km = ks;
        float f;
        ee[n][c] = (float)fd_frac_exp(ks, &f);
        ff[n][c] = f;
      }
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int e = c + 2 * hh;
        float v;
        if constexpr (FP8)
          v = (acc[n][e] * (hh ? sr1 : sr0)) * km + accr[n][e] * cl.scale;
        else
          v = acc[n][e] * cl.scale;
        const bool vis = fl && kl < (hh ? hl1 : hl0);
        v = vis ? v : -INFINITY;
        x[n][e] = v;
        if (hh) {
          mx.mx1 = fmaxf(mx.mx1, v);
          mx.se1 = fmaxf(mx.se1, v + ee[n][c]);
        } else {
          mx.mx0 = fmaxf(mx.mx0, v);
          mx.se0 = fmaxf(mx.se0, v + ee[n][c]);
        }
      }
    }
  }
  return mx;
}

/* The row maxima over the row group: over the lane quad by shuffles, then
 * over the group's warps through sX, one group barrier between (every warp
 * of the group then holds the same values). */
template <typename C>
static __device__ __forceinline__ void fd_mla_group_max(float2 *sX, const fd_mla_thread &th,
                                                        bool tok, fd_mla_max &mx) {
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    mx.mx0 = fmaxf(mx.mx0, __shfl_xor_sync(0xffffffffu, mx.mx0, off));
    mx.mx1 = fmaxf(mx.mx1, __shfl_xor_sync(0xffffffffu, mx.mx1, off));
    if (C::FP8 && tok) {
      mx.se0 = fmaxf(mx.se0, __shfl_xor_sync(0xffffffffu, mx.se0, off));
      mx.se1 = fmaxf(mx.se1, __shfl_xor_sync(0xffffffffu, mx.se1, off));
    }
  }
  if (th.qd == 0) {
    sX[th.warp * 16 + th.g] = make_float2(mx.mx0, mx.se0);
    sX[th.warp * 16 + th.g + 8] = make_float2(mx.mx1, mx.se1);
  }
  fd_mla_group_sync<C::CPW>(th.bar);
#pragma unroll
  for (int k = 0; k < C::CPW; k++) {
    const float2 a = sX[(th.rg * C::CPW + k) * 16 + th.g];
    const float2 c = sX[(th.rg * C::CPW + k) * 16 + th.g + 8];
    mx.mx0 = fmaxf(mx.mx0, a.x);
    mx.se0 = fmaxf(mx.se0, a.y);
    mx.mx1 = fmaxf(mx.mx1, c.x);
    mx.se1 = fmaxf(mx.se1, c.y);
  }
}

/* One n-tile of P into the P buffers at byte o0 (row g: pv 0, 1) and o1
 * (row g + 8: pv 2, 3): fp16 (fp8 cache), or the q dtype, or (p_lo) a hi
 * and a lo part. */
template <typename C>
static __device__ __forceinline__ void fd_mla_put_p(const fd_mla_bufs &sm, bool p_lo, uint32_t o0,
                                                    uint32_t o1, const float (&pv)[4]) {
  using T = typename C::QT;
  if constexpr (C::FP8) {
    *reinterpret_cast<uint32_t *>(sm.ph + o0) = fd_pack2<__half>(pv[0], pv[1]);
    *reinterpret_cast<uint32_t *>(sm.ph + o1) = fd_pack2<__half>(pv[2], pv[3]);
  } else if (p_lo) {
    uint32_t h, l;
    fd_pack2_split<T>(pv[0], pv[1], h, l);
    *reinterpret_cast<uint32_t *>(sm.ph + o0) = h;
    *reinterpret_cast<uint32_t *>(sm.pl + o0) = l;
    fd_pack2_split<T>(pv[2], pv[3], h, l);
    *reinterpret_cast<uint32_t *>(sm.ph + o1) = h;
    *reinterpret_cast<uint32_t *>(sm.pl + o1) = l;
  } else {
    *reinterpret_cast<uint32_t *>(sm.ph + o0) = fd_pack2<T>(pv[0], pv[1]);
    *reinterpret_cast<uint32_t *>(sm.ph + o1) = fd_pack2<T>(pv[2], pv[3]);
  }
}

/* Online softmax in base 2 (a row whose max is still -inf subtracts 0;
 * every warp of the group computes the same m): P = 2^(x - m), TOKEN
 * 2^((x + e) - u) f, into the P buffers, the rows' sums l updated. Returns
 * O's factors in *fo0, *fo1. */
template <typename C>
static __device__ __forceinline__ void fd_mla_softmax(const fd_mla_max &mx,
                                                      const float (&x)[C::NG][4],
                                                      const float (&ee)[C::NG][2],
                                                      const float (&ff)[C::NG][2], bool tok,
                                                      bool p_lo, const fd_mla_bufs &sm,
                                                      const fd_mla_thread &th, fd_mla_run &run,
                                                      float *fo0, float *fo1) {
  constexpr bool FP8 = C::FP8;
  float mu0, mu1;
  const float a0 = fd_softmax_step(run.m0, mx.mx0, &mu0);
  const float a1 = fd_softmax_step(run.m1, mx.mx1, &mu1);
  *fo0 = a0;
  *fo1 = a1;
  float uu0 = 0.0f, uu1 = 0.0f;
  if (FP8 && tok) {
    *fo0 = fd_softmax_step(run.u0, mx.se0, &uu0);
    *fo1 = fd_softmax_step(run.u1, mx.se1, &uu1);
  }
  float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
  for (int n = 0; n < C::NG; n++) {
    float pp[4], pv[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
      pp[e] = fd_exp2_ftz(x[n][e] - ((e >> 1) ? mu1 : mu0));
      pv[e] = pp[e];
      if (FP8 && tok)
        pv[e] = fd_exp2_ftz((x[n][e] + ee[n][e & 1]) - ((e >> 1) ? uu1 : uu0)) * ff[n][e & 1];
    }
    ps0 += pp[0] + pp[1];
    ps1 += pp[2] + pp[3];
    /* P: rows qr0 + g, + 8, keys kw0 + 8 n + 2 qd, + 1 */
    const int kc = (th.kw0 + 8 * n) >> 3;
    fd_mla_put_p<C>(sm, p_lo, fd_mla_pswz<C::PRB>(th.qr0 + th.g, kc) + 4 * th.qd,
                    fd_mla_pswz<C::PRB>(th.qr0 + th.g + 8, kc) + 4 * th.qd, pv);
  }
  run.l0 = run.l0 * a0 + ps0;
  run.l1 = run.l1 * a1 + ps1;
}

/* O += P V for the warp's columns, V the tile at v_u (fd_mla_pv8,
 * fd_mla_pv16). */
template <typename C>
static __device__ __forceinline__ void fd_mla_pv(uint32_t v_u, const fd_mla_bufs &sm, bool p_lo,
                                                 const fd_mla_thread &th,
                                                 float (&o)[C::NT][4]) {
  using PT = typename C::PT;
  if constexpr (C::FP8)
    fd_mla_pv8<C, C::E5M2>(v_u, sm.ph_u, th.qr0, th.c0w, th.lane, o);
  else if (p_lo)
    fd_mla_pv16<PT, C, true>(v_u, sm.ph_u, sm.pl_u, th.qr0, th.c0w, th.lane, o);
  else
    fd_mla_pv16<PT, C, false>(v_u, sm.ph_u, sm.pl_u, th.qr0, th.c0w, th.lane, o);
}

/* After the last tile: O to the rows' max m (TOKEN: from 2^u, as two equal
 * factors, each a normal float; TENSOR / HEAD: times k_scale). *bad0,
 * *bad1: whether row g, g + 8 holds a NaN or Inf in the lane's columns. */
template <typename C>
static __device__ __forceinline__ void fd_mla_finish_o(float (&o)[C::NT][4], const fd_mla_run &run,
                                                       const fd_mla_call &cl, bool *bad0,
                                                       bool *bad1) {
  constexpr bool FP8 = C::FP8;
  float f0 = cl.kmul, f1 = cl.kmul;
  if (FP8 && cl.tok) {
    f0 = run.m0 == -INFINITY ? 0.0f : exp2f(0.5f * (run.u0 - run.m0));
    f1 = run.m1 == -INFINITY ? 0.0f : exp2f(0.5f * (run.u1 - run.m1));
  }
  bool b0 = false, b1 = false;
#pragma unroll
  for (int n = 0; n < C::NT; n++) {
    o[n][0] *= f0;
    o[n][1] *= f0;
    o[n][2] *= f1;
    o[n][3] *= f1;
    if (FP8 && cl.tok) {
      o[n][0] *= f0;
      o[n][1] *= f0;
      o[n][2] *= f1;
      o[n][3] *= f1;
    }
    b0 = b0 || !(isfinite(o[n][0]) && isfinite(o[n][1]));
    b1 = b1 || !(isfinite(o[n][2]) && isfinite(o[n][3]));
  }
  *bad0 = b0;
  *bad1 = b1;
}

/* The rows' sums and NaN / Inf flags over the row group. */
typedef struct fd_mla_sums {
  float l0, l1;
  bool blown0, blown1;
} fd_mla_sums;

/* l and the flags over the lane quad by shuffles, then over the group's
 * warps through sX, in warp order (deterministic). sX is free: the group's
 * last reads of it came before the last P barrier. */
template <typename C>
static __device__ __forceinline__ fd_mla_sums fd_mla_group_sums(float2 *sX,
                                                                const fd_mla_thread &th, float l0,
                                                                float l1, bool bad0, bool bad1) {
  fd_quad_sum_rows(l0, l1, bad0, bad1);
  if (th.qd == 0) {
    sX[th.warp * 16 + th.g] = make_float2(l0, bad0 ? 1.0f : 0.0f);
    sX[th.warp * 16 + th.g + 8] = make_float2(l1, bad1 ? 1.0f : 0.0f);
  }
  fd_mla_group_sync<C::CPW>(th.bar);
  fd_mla_sums s = {0.0f, 0.0f, false, false};
#pragma unroll
  for (int k = 0; k < C::CPW; k++) {
    const float2 a = sX[(th.rg * C::CPW + k) * 16 + th.g];
    const float2 c = sX[(th.rg * C::CPW + k) * 16 + th.g + 8];
    s.l0 += a.x;
    s.l1 += c.x;
    s.blown0 = s.blown0 || a.y != 0.0f;
    s.blown1 = s.blown1 || c.y != 0.0f;
  }
  return s;
}

/* The lane's rows out (OUTPUT): O in the warp's columns (partials: as is;
 * out: O / l, 0 for a row without keys), and from warp 0 of the group each
 * live row's (m, l), l NaN for a row whose O holds a NaN or Inf. */
template <typename C>
static __device__ __forceinline__ void fd_mla_write_rows(const fd_kernel_params &p,
                                                         const fd_mla_work &w,
                                                         const fd_mla_thread &th,
                                                         const float (&o)[C::NT][4], float m0,
                                                         float m1, const fd_mla_sums &s) {
  using T = typename C::QT;
  const int row0 = w.row_base + th.qr0 + th.g, row1 = row0 + 8;
  const bool live0 = row0 < w.rows_total, live1 = row1 < w.rows_total;
  const bool partial = p.num_splits > 1, as_t = !partial && !p.out_f32;
  const float mul0 = partial ? 1.0f : (s.l0 > 0.0f ? 1.0f / s.l0 : 0.0f);
  const float mul1 = partial ? 1.0f : (s.l1 > 0.0f ? 1.0f / s.l1 : 0.0f);
  unsigned char *const dst0 = fd_mla_row_dst<T>(p, w.b, w.split, row0, live0);
  unsigned char *const dst1 = fd_mla_row_dst<T>(p, w.b, w.split, row1, live1);
  const int qd = th.qd;
#pragma unroll
  for (int j = 0; j < C::NCW; j++) {
    const int c = th.c0w + j;
    if (c >= C::DCH) continue; /* warp-uniform */
    if constexpr (C::FP8) { /* o[2 j] even columns, o[2 j + 1] odd ones: 16 c + 4 qd .. + 3 */
      const int d = 16 * c + 4 * qd;
      fd_mla_put2<T>(dst0, as_t, d, o[2 * j][0], o[2 * j + 1][0], mul0);
      fd_mla_put2<T>(dst0, as_t, d + 2, o[2 * j][1], o[2 * j + 1][1], mul0);
      fd_mla_put2<T>(dst1, as_t, d, o[2 * j][2], o[2 * j + 1][2], mul1);
      fd_mla_put2<T>(dst1, as_t, d + 2, o[2 * j][3], o[2 * j + 1][3], mul1);
    } else { /* o[2 j + hh]: columns 16 c + 8 hh + 2 qd, + 1 */
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int d = 16 * c + 8 * hh + 2 * qd;
        fd_mla_put2<T>(dst0, as_t, d, o[2 * j + hh][0], o[2 * j + hh][1], mul0);
        fd_mla_put2<T>(dst1, as_t, d, o[2 * j + hh][2], o[2 * j + hh][3], mul1);
      }
    }
  }
  if (th.cw == 0 && qd == 0) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = hh ? row1 : row0;
      if (!(hh ? live1 : live0)) continue;
      const float l = (hh ? s.blown1 : s.blown0) ? __int_as_float(0x7fc00000) : (hh ? s.l1 : s.l0);
      const int h = row / p.q_len;
      fd_store_row_ml(p, w.b, h, row - h * p.q_len, w.split, hh ? m1 : m0, l, nullptr);
    }
  }
}

template <typename T, int D, int RG, int KV8>
__global__ void __launch_bounds__(32 * FD_MLA_WARPS, 1)
    fd_mla_kernel(const __grid_constant__ fd_kernel_params p) {
  using C = fd_mla_cfg<T, D, RG, KV8>;
  constexpr int KT = C::KT, ST = C::ST;
  extern __shared__ __align__(128) unsigned char fd_mla_smem[];
  fd_pdl_wait();
  fd_pdl_launch_dependents();

  fd_mla_work w;
  if (!fd_mla_work_of<C>(p, &w)) return;
  fd_mla_bufs sm;
  fd_mla_carve<C>(fd_mla_smem, &sm);
  fd_mla_thread th;
  fd_mla_thread_of<C>(&th);
  fd_mla_call cl;
  fd_mla_call_of<C>(p, &cl);

  /* Prologue: the first tiles' offsets and copies, the page ids ahead, Q
   * (RG 1: its A fragments in registers for the whole split; qf[0] unused
   * otherwise) */
  int ring[ST - 1];
  fd_mla_prologue<C>(p, w, cl, sm, ring);
  fd_mla_load_q<T, C>(p, w.b, w.row_base, w.rows_total, cl.rope8, sm.q, sm.qr, sm.qs);
  uint32_t qf[C::QIN ? C::KSL + 4 : 1][4];
  if constexpr (C::QIN) fd_mla_q_frags<C>(sm, cl.rope8, th.qr0, th.lane, qf);
  int hi0, hi1; /* the lane's rows' upper key bounds */
  fd_mla_row_bounds(p, w, th, &hi0, &hi1);

  float o[C::NT][4];
#pragma unroll
  for (int n = 0; n < C::NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  fd_mla_run run = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.0f, 0.0f};
  float sr0 = 1.0f, sr1 = 1.0f; /* the rows' score scales (read at tile 0) */

  for (int i = 0; i < w.num_tiles; i++) {
    const int stage = i % ST;
    const int key0 = w.begin + i * KT;
    fd_mla_wait_tile<ST>();
    if (i == 0) { /* Q's row scales: stored before the first block barrier */
      sr0 = cl.scale * sm.qs[th.qr0 + th.g];
      sr1 = cl.scale * sm.qs[th.qr0 + th.g + 8];
    }
    fd_mla_refill<C>(p, cl, sm, i + ST - 1, w.num_tiles);
    const int page = fd_mla_page_ahead<C>(p, w, i, ring);

    /* S, scaled and masked; the row maxima over the group */
    const uint32_t st_u = sm.k_u + (uint32_t)(stage * C::STAGE);
    float acc[C::NG][4], accr[C::NG][4];
    fd_mla_scores<C>(st_u, sm, qf, cl.rope8, th.kw0, th.qr0, th.lane, acc, accr);
    float x[C::NG][4], ee[C::NG][2], ff[C::NG][2];
    fd_mla_max mx = fd_mla_mask<C>(cl, sm.flags + stage * KT, sm.tok + stage * KT, hi0 - key0,
                                   hi1 - key0, th.kw0, th.qd, sr0, sr1, acc, accr, x, ee, ff);
    fd_mla_group_max<C>(sm.x, th, cl.tok, mx);

    /* online softmax, P -> shared memory; O rescaled, O += P V */
    float fo0, fo1;
    fd_mla_softmax<C>(mx, x, ee, ff, cl.tok, cl.p_lo, sm, th, run, &fo0, &fo1);
    fd_mla_group_sync<C::CPW>(th.bar);
    fd_mma_rescale_rows<C::NT>(o, fo0, fo1);
    fd_mla_pv<C>(st_u, sm, cl.p_lo, th, o);

    fd_mla_offsets_ahead<C>(p, w, cl, i, page, sm.offs);
  }
  fd_cp_async_wait<0>(); /* only empty groups can remain */

  /* Epilogue: O to the rows' max, l and the NaN / Inf flags over the
   * group, the rows out */
  bool bad0, bad1;
  fd_mla_finish_o<C>(o, run, cl, &bad0, &bad1);
  const fd_mla_sums s = fd_mla_group_sums<C>(sm.x, th, run.l0, run.l1, bad0, bad1);
  fd_mla_write_rows<C>(p, w, th, o, run.m0, run.m1, s);
}

template <typename T, int D, int RG, int KV8>
static cudaError_t fd_mla_launch_instance(const fd_kernel_params *p, cudaStream_t stream) {
  using C = fd_mla_cfg<T, D, RG, KV8>;
  cudaError_t e = cudaFuncSetAttribute(fd_mla_kernel<T, D, RG, KV8>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(fd_mla_kernel<T, D, RG, KV8>,
                           cudaFuncAttributePreferredSharedMemoryCarveout,
                           (int)cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  const int64_t tiles = fd_mla_row_tiles(RG, (int64_t)p->num_heads_q * p->q_len);
  if (tiles > 65535 || p->batch > 65535) return cudaErrorInvalidValue;
  return fd_launch(fd_mla_kernel<T, D, RG, KV8>, *p,
                   dim3((unsigned)p->num_splits, (unsigned)tiles, (unsigned)p->batch),
                   dim3(C::THREADS), C::SMEM, stream, p->pdl == FD_PDL_ALL);
}

template <typename T, int D, int KV8>
static cudaError_t fd_mla_launch_rg(const fd_kernel_params *p, int rg, cudaStream_t stream) {
  if (rg == 1) return fd_mla_launch_instance<T, D, 1, KV8>(p, stream);
  if (rg == 2) return fd_mla_launch_instance<T, D, 2, KV8>(p, stream);
  if (rg == 4) return fd_mla_launch_instance<T, D, 4, KV8>(p, stream);
  return cudaErrorInvalidValue;
}

template <typename T, int KV8>
static cudaError_t fd_mla_launch_dim(const fd_kernel_params *p, int rg, cudaStream_t stream) {
  if (p->head_dim == 512) return fd_mla_launch_rg<T, 512, KV8>(p, rg, stream);
  if (p->head_dim == 448) return fd_mla_launch_rg<T, 448, KV8>(p, rg, stream);
  return cudaErrorInvalidValue;
}

template <typename T>
static cudaError_t fd_mla_launch_kv(const fd_kernel_params *p, int rg, cudaStream_t stream) {
  const int kv = p->kv_dtype == 0 ? p->dtype : p->kv_dtype;
  const int rope = p->rope_dtype == 0 ? kv : p->rope_dtype;
  if (kv == p->dtype) {
    if (rope != p->dtype) return cudaErrorInvalidValue;
    return fd_mla_launch_dim<T, 0>(p, rg, stream);
  }
  if (rope != kv && rope != p->dtype) return cudaErrorInvalidValue;
  if (kv == FD_DTYPE_E4M3) return fd_mla_launch_dim<T, 1>(p, rg, stream);
  if (kv == FD_DTYPE_E5M2) return fd_mla_launch_dim<T, 2>(p, rg, stream);
  return cudaErrorInvalidValue;
}

cudaError_t fd_mla_launch(const fd_kernel_params *p, int row_groups, cudaStream_t stream) {
  if (p->rope_dim != 64) return cudaErrorInvalidValue;
  switch (p->dtype) {
    case FD_DTYPE_F16: return fd_mla_launch_kv<__half>(p, row_groups, stream);
    case FD_DTYPE_BF16: return fd_mla_launch_kv<__nv_bfloat16>(p, row_groups, stream);
  }
  return cudaErrorInvalidValue;
}
