/*
 * read_probe.cu — the read-bandwidth ceiling of bench/bench_gpu.py.
 *
 * A plain CUDA C read kernel: every thread streams 16-byte loads (int4,
 * ld.global.nc.v4 -> LDG.E.128) over a device buffer with a grid-stride loop,
 * U independent loads in flight before their first use, coalesced across the
 * warp (consecutive threads read consecutive 16-byte words). The bench hands
 * it a >= 4 GiB buffer of random data (never zeros) and reads the best
 * configuration's median: that is the ceiling every "% of ceiling" divides by.
 * A benchmark row above 100 % means this probe is wrong (or too weak), not
 * that the row beat the memory.
 *
 * Built by CMake as build/libfd_read_probe.so (FD_CUDA on, not for pip) or by
 * the bench itself with nvcc at run time; loaded with ctypes. C ABI only.
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FDP_VERSION 1

namespace {

template <int U>
__global__ void __launch_bounds__(1024) read_kernel(const int4 *__restrict__ p, size_t n16,
                                                    unsigned *__restrict__ sink) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (size_t)(U - 1) * stride < n16; i += (size_t)U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = __ldg(p + i + (size_t)u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= (unsigned)(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
  }
  for (; i < n16; i += stride) {
    int4 v = __ldg(p + i);
    acc ^= (unsigned)(v.x ^ v.y ^ v.z ^ v.w);
  }
  // Keeps every load alive; true for about one thread in 2^32 on random data,
  // and harmless then (one 4-byte store).
  if (acc == 0x9E3779B9u) *sink = acc;
}

struct Config {
  int threads, blocks_per_sm, unroll;
};

// Block size x blocks per SM (at most 2048 resident threads per SM on sm_90)
// x loads in flight per thread.
const Config kConfigs[] = {
    {256, 2, 4},  {256, 4, 4},  {256, 8, 4},  {512, 1, 4},  {512, 2, 4},  {512, 4, 4},
    {1024, 1, 4}, {1024, 2, 4}, {256, 2, 8},  {256, 4, 8},  {256, 8, 8},  {512, 2, 8},
    {512, 4, 8},  {1024, 1, 8}, {1024, 2, 8}, {256, 8, 2},  {512, 4, 2},  {1024, 2, 2},
};
const int kNumConfigs = (int)(sizeof(kConfigs) / sizeof(kConfigs[0]));

cudaError_t launch(const Config &c, int sm_count, const int4 *p, size_t n16, unsigned *sink,
                   cudaStream_t s) {
  dim3 grid((unsigned)(sm_count * c.blocks_per_sm)), block((unsigned)c.threads);
  switch (c.unroll) {
    case 2: read_kernel<2><<<grid, block, 0, s>>>(p, n16, sink); break;
    case 4: read_kernel<4><<<grid, block, 0, s>>>(p, n16, sink); break;
    default: read_kernel<8><<<grid, block, 0, s>>>(p, n16, sink); break;
  }
  return cudaGetLastError();
}

int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int fdp_version(void) { return FDP_VERSION; }

__attribute__((visibility("default"))) int fdp_num_configs(void) { return kNumConfigs; }

/*
 * Reads `bytes` bytes at device pointer `buf` (16-byte aligned; bytes rounded
 * down to 16) with every configuration: 2 untimed launches, then `reps` timed
 * ones (CUDA events on a stream of its own, synchronised). For configuration
 * i writes the median TB/s (1e12 bytes/s) to tbps[i] (0 when it failed) and
 * a short description to desc (one line per configuration, ';'-separated).
 * sm_count <= 0: the device's. Returns 0, or the first CUDA error code (its
 * text in err). Synchronises the device on entry and exit.
 */
__attribute__((visibility("default"))) int fdp_read_probe(const void *buf, size_t bytes, int reps,
                                                          int sm_count, double *tbps, int max_out,
                                                          char *desc, int desc_len, char *err,
                                                          int err_len) {
  if (err && err_len > 0) err[0] = 0;
  if (desc && desc_len > 0) desc[0] = 0;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  unsigned *sink = nullptr;
  float *ms = nullptr;
  int rc = 0;
  size_t n16 = bytes / 16;
  size_t used = 0;
#define FDP_CHECK(call)                                                           \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      if (err && err_len > 0)                                                     \
        snprintf(err, (size_t)err_len, "%s: %s", #call, cudaGetErrorString(e_));  \
      rc = (int)e_;                                                               \
      goto done;                                                                  \
    }                                                                             \
  } while (0)
  if (buf == nullptr || ((uintptr_t)buf & 15) || n16 == 0 || reps < 1 || tbps == nullptr) {
    if (err && err_len > 0) snprintf(err, (size_t)err_len, "bad arguments");
    return -1;
  }
  ms = (float *)malloc(sizeof(float) * (size_t)reps);
  if (!ms) {
    if (err && err_len > 0) snprintf(err, (size_t)err_len, "out of host memory");
    return -1;
  }
  if (sm_count <= 0) {
    int dev = 0;
    FDP_CHECK(cudaGetDevice(&dev));
    FDP_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev));
  }
  FDP_CHECK(cudaDeviceSynchronize());
  FDP_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  FDP_CHECK(cudaEventCreate(&e0));
  FDP_CHECK(cudaEventCreate(&e1));
  FDP_CHECK(cudaMalloc((void **)&sink, sizeof(unsigned)));
  for (int c = 0; c < kNumConfigs && c < max_out; ++c) {
    const Config &cf = kConfigs[c];
    const int4 *p = (const int4 *)buf;
    tbps[c] = 0.0;
    for (int w = 0; w < 2; ++w) FDP_CHECK(launch(cf, sm_count, p, n16, sink, s));
    for (int r = 0; r < reps; ++r) {
      FDP_CHECK(cudaEventRecord(e0, s));
      FDP_CHECK(launch(cf, sm_count, p, n16, sink, s));
      FDP_CHECK(cudaEventRecord(e1, s));
      FDP_CHECK(cudaEventSynchronize(e1));
      FDP_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, (size_t)reps, sizeof(float), cmp_float);
    {
      double med = reps % 2 ? ms[reps / 2] : 0.5 * ((double)ms[reps / 2 - 1] + ms[reps / 2]);
      tbps[c] = med > 0 ? (double)(n16 * 16) / (med * 1e-3) / 1e12 : 0.0;
      if (desc && desc_len > 0 && used + 64 < (size_t)desc_len) {
        int n = snprintf(desc + used, (size_t)desc_len - used, "%s%dx%d@%d/SM %.3f",
                         used ? "; " : "", cf.threads, cf.unroll, cf.blocks_per_sm, tbps[c]);
        if (n > 0) used += (size_t)n;
      }
    }
  }
  FDP_CHECK(cudaStreamSynchronize(s));
done:
#undef FDP_CHECK
  if (sink) cudaFree(sink);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (s) cudaStreamDestroy(s);
  free(ms);
  if (rc == 0) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      if (err && err_len > 0) snprintf(err, (size_t)err_len, "sync: %s", cudaGetErrorString(e));
      rc = (int)e;
    }
  }
  return rc;
}

}  // extern "C"
