/* test_reliability_gpu.c — the reliability tests on the CUDA
 * backend; exits 77 without a usable GPU. See test_reliability.c. */
#include "rel.h"

int main(int argc, char **argv) { return rel_main(FD_BACKEND_CUDA, argc, argv); }
