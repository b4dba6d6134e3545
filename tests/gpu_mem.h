/*
 * gpu_mem.h — the few CUDA runtime calls the GPU tests need (device memory
 * and copies), behind plain C functions so the harness compiles without CUDA
 * headers. Implemented in gpu_mem.c, built only with CUDA. Every function
 * returns 0 on success, else prints the CUDA error to stderr and returns -1.
 */
#ifndef FD_TEST_GPU_MEM_H
#define FD_TEST_GPU_MEM_H

#include <stddef.h>

int fd_gpu_malloc(void **ptr, size_t bytes);
int fd_gpu_free(void *ptr);
int fd_gpu_upload(void *dst_device, const void *src_host, size_t bytes);
int fd_gpu_download(void *dst_host, const void *src_device, size_t bytes);
/* Waits for the device and reports any asynchronous (kernel) error. */
int fd_gpu_synchronize(void);

#endif /* FD_TEST_GPU_MEM_H */
