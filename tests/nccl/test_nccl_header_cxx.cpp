// test_nccl_header_cxx.cpp — flashdecode_nccl.h compiles as C++
// (-Wall -Wextra -pedantic -Werror) and links.
#include "flashdecode_nccl.h"

int main() {
  fd_nccl_problem p = {};
  p.dtype = FD_DTYPE_BF16;
  fd_nccl_plan plan;
  fd_error err;
  // batch 0: refused before the communicator is touched.
  return fd_nccl_plan_init(&plan, &p, nullptr, &err) == FD_STATUS_INVALID_ARGUMENT ? 0 : 1;
}
