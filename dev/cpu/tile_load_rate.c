/* tile_load_rate.c — ns per MLA scores step (q tile + two key tiles of 16 rows, 1 KB stride, two
 * products) with the rows in L1 / L2 / L3 (BYTES 32 KB / 1 MB / 4+ MB). cc -O2 -march=native;
 * ./a.out BYTES STRIDE(1024|64) MODE(0: with products, 1: loads only). dev/mla.md, twelfth session. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){ syscall(SYS_arch_prctl,0x1023,18);
  long bytes=atol(argv[1]); int stride=atoi(argv[2]); int mode=atoi(argv[3]);
  char *b=aligned_alloc(4096,bytes+65536); memset(b,0,bytes+65536); char *q=aligned_alloc(64,32768); memset(q,0,32768);
  static char cfg[64] __attribute__((aligned(64))); memset(cfg,0,64); cfg[0]=1; for(int i=0;i<8;i++){((unsigned short*)(cfg+16))[i]=64; cfg[48+i]=16;}
  _tile_loadconfig(cfg);
  long blocks=bytes/32768; long iters=200000000L/bytes*16; double t0=now(); long steps=0;
  for(long it=0;it<iters;it++) for(long bl=0;bl<blocks;bl++){ char*base=b+bl*32768;
    for(int s=0;s<16;s++){ const char*k0, *k1; 
      if(stride==1024){k0=base+s*64;k1=base+16384+s*64;} else {k0=base+s*2048;k1=k0+1024;}
      _tile_loadd(4,q+s*1024,64);
      _tile_loadd(2,k0,stride); _tile_loadd(3,k1,stride);
      if(mode==0){_tile_dpbf16ps(0,2,4); _tile_dpbf16ps(1,3,4);} steps++; } }
  double dt=now()-t0; _tile_release();
  printf("bytes %ld stride %d mode %d: %.2f ns/step  %.1f ns/key(18 steps/32keys)\n",bytes,stride,mode,dt*1e9/steps, dt*1e9/steps*18/32);
}
