/*
 * tma.cuh — Hopper tensor-memory-accelerator copies (cp.async.bulk.tensor,
 * sm_90) and the shared-memory barriers (mbarrier) they complete on, as PTX
 * wrappers; the host side encodes the tensor maps (fd_tma_encode_3d).
 *
 * A copy moves one box of a tensor map (a 3-D view of global memory: dims
 * and byte strides, innermost first) to shared memory, laid out with the
 * map's swizzle; here the 128-byte swizzle of wgmma.cuh (16-byte chunk c of
 * row r at c ^ (r % 8), boxes of 64 16-bit columns, 1024-byte aligned
 * destinations). Coordinates outside the dims read as zeros. One thread
 * issues the copies; the barrier counts their bytes (expect_tx) and
 * completes its phase when they have landed; every reader waits on the
 * phase's parity (each use of a barrier flips it). Shared memory that the
 * generic proxy (ordinary stores, cp.async) wrote before needs
 * fence.proxy.async in the writers before the barrier that precedes the
 * copy; wgmma reads what a copy wrote with no fence (both async proxy).
 *
 * The device wrappers compile to nothing outside sm_90 passes (callers run
 * them only on compute capability 9.0, like wgmma.cuh's).
 */
#ifndef FD_TMA_CUH
#define FD_TMA_CUH

#include <cuda.h> /* CUtensorMap and its enums (types only: no libcuda link) */
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FD_TMA_ON 1
#else
#define FD_TMA_ON 0
#endif

/* Barrier at shared-window address `bar` expecting `count` arrivals a phase. */
static __device__ __forceinline__ void fd_mbar_init(uint32_t bar, uint32_t count) {
#if FD_TMA_ON
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

/* Makes barrier initialisation visible to the async proxy (before the block barrier). */
static __device__ __forceinline__ void fd_mbar_init_fence(void) {
#if FD_TMA_ON
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* One arrival that also announces `bytes` of copies completing on the phase. */
static __device__ __forceinline__ void fd_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if FD_TMA_ON
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

/* Waits until the barrier's phase of parity `parity` has completed. The
 * retry loop is inside the asm: no divergent branch for the compiler to see
 * between wgmma instructions (which it would serialize). */
static __device__ __forceinline__ void fd_mbar_wait(uint32_t bar, uint32_t parity) {
#if FD_TMA_ON
  asm volatile(
      "{\n.reg .pred p;\nFD_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra FD_MBAR_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

/* Box at coordinates (c0, c1, c2) of map `map` (a __grid_constant__ kernel
 * parameter) -> shared-window address `dst`, completing on barrier `bar`. */
static __device__ __forceinline__ void fd_tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0,
                                                      int c1, int c2, uint32_t bar) {
#if FD_TMA_ON
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#else
  (void)dst, (void)map, (void)c0, (void)c1, (void)c2, (void)bar;
#endif
}

/* Host: a 3-D map of 16-bit elements at `base` (16-byte aligned): dims
 * {dim0, dim1, dim2} innermost first, byte strides {stride1, stride2} of
 * dims 1 and 2 (multiples of 16), box {64, box1, 1}, 128-byte swizzle,
 * zeros outside. `encode` is the driver's cuTensorMapEncodeTiled (NULL:
 * none). 0 when the map was made; -1 when the driver refuses the layout. */
static inline int fd_tma_encode_3d(void *encode, CUtensorMap *map, const void *base, uint64_t dim0,
                                   uint64_t dim1, uint64_t dim2, uint64_t stride1, uint64_t stride2,
                                   uint32_t box1) {
  typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  if (!encode || ((uintptr_t)base & 15) || (stride1 & 15) || (stride2 & 15) ||
      stride1 >= ((uint64_t)1 << 40) || stride2 >= ((uint64_t)1 << 40) || dim1 == 0 || dim2 == 0 ||
      dim1 > ((uint64_t)1 << 32) || dim2 > ((uint64_t)1 << 32))
    return -1;
  const cuuint64_t dims[3] = {dim0, dim1, dim2};
  const cuuint64_t strides[2] = {stride1, stride2};
  const cuuint32_t box[3] = {64, box1, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = ((encode_fn)encode)(
      map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void *>(base), dims, strides, box, elem,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : -1;
}

#endif /* FD_TMA_CUH */
