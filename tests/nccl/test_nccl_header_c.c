/*
 * test_nccl_header_c.c — flashdecode_nccl.h alone compiles as strict C11
 * (-std=c11 -Wall -Wextra -pedantic -Werror) and links against
 * libflashdecode_nccl, libflashdecode and libnccl; the argument checks that
 * come before any NCCL call answer without a GPU.
 */
#include <stdio.h>
#include <string.h>

#include "flashdecode_nccl.h"

int main(void) {
  fd_nccl_problem p;
  memset(&p, 0, sizeof p);
  p.dtype = FD_DTYPE_F32;
  p.batch = 1;
  p.num_heads = 1;
  p.head_dim = 8;
  fd_nccl_plan plan;
  fd_error err;
  if (fd_nccl_plan_init(&plan, &p, NULL, &err) != FD_STATUS_INVALID_ARGUMENT ||
      strcmp(err.message, "comm: NULL") != 0) {
    printf("fd_nccl_plan_init with no communicator: %s\n", err.message);
    return 1;
  }
  if (fd_nccl_wait(NULL, NULL, 1.0, 0, &err) != FD_STATUS_INVALID_ARGUMENT) return 1;
  return 0;
}
