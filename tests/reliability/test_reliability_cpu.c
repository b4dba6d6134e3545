/* test_reliability_cpu.c — the reliability tests on the CPU backend
 * (and the reference backend where a test names it); see test_reliability.c. */
#include "rel.h"

int main(int argc, char **argv) { return rel_main(FD_BACKEND_CPU, argc, argv); }
