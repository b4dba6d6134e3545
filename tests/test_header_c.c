/*
 * test_header_c.c — flashdecode.h alone compiles as strict C11 (-std=c11
 * -Wall -Wextra -pedantic -Werror), and the header matches the library.
 */
#include <stdio.h>
#include <string.h>

#include "flashdecode.h"

int main(void) {
  fd_problem problem;
  memset(&problem, 0, sizeof problem);
  problem.dtype = FD_DTYPE_F32;
  if (strcmp(fd_version(), FD_VERSION_STRING) != 0 || fd_version_number() != FD_VERSION_NUMBER) {
    printf("header %s (%d) does not match library %s (%d)\n", FD_VERSION_STRING, FD_VERSION_NUMBER,
           fd_version(), fd_version_number());
    return 1;
  }
  return fd_dtype_size(problem.dtype) == 4 ? 0 : 1;
}
