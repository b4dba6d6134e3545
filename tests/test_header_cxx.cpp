/*
 * test_header_cxx.cpp — flashdecode.h compiles as C++ (-Wall -Wextra
 * -pedantic -Werror), its functions link with C linkage and its structs
 * have the library's sizes.
 */
#include <cstdio>
#include <cstring>

#include "flashdecode.h"

int main() {
  fd_problem problem = {};
  problem.dtype = FD_DTYPE_BF16;
  fd_error err = {};
  fd_plan plan;
  // An invalid problem (batch 0): exercises the call path without a device.
  fd_status st = fd_plan_init(&plan, &problem, &err);
  if (st != FD_STATUS_INVALID_ARGUMENT || std::strlen(err.message) == 0) {
    std::printf("fd_plan_init: %s (%s)\n", fd_status_name(st), err.message);
    return 1;
  }
  if (std::strcmp(fd_version(), FD_VERSION_STRING) != 0) return 1;
  // The structs have the same layout in C++ as in the C library.
  if (fd_struct_size("fd_problem") != sizeof(fd_problem) || fd_struct_size("fd_plan") != sizeof(fd_plan) ||
      fd_struct_size("fd_tensors") != sizeof(fd_tensors) || fd_struct_size("fd_error") != sizeof(fd_error)) {
    std::printf("struct sizes differ between C++ and the library\n");
    return 1;
  }
  return fd_dtype_size(problem.dtype) == 2 ? 0 : 1;
}
