/*
 * read_overlap.c — one core's read side on the AMX Xeon: does a stream from
 * memory overlap compute, and how (dev/mla.md, twelfth session). Not part of
 * the build:
 *   cc -O2 -march=native dev/cpu/read_overlap.c -o /tmp/read_overlap
 *   /tmp/read_overlap MODE WORK [PF [D]]   (L2W=1: the work also reads 256 KB from L2)
 * 1 GB buffer walked in 32 KB blocks (32 rows of 1 KB, as MLA's c_kv), 1 thread:
 *   2: the scores' tile loads only (two tileloadd a step, 16 steps);
 *   3: WORK x 8 register FMAs a block only;  0: loads then the work;
 *   1: the work cut into the 16 steps;  4: vector loads in the steps' order + work;
 *   5/6/7: loads, then the work with PF prefetcht0/t1/t2 of block + D's lines spread
 *          through it (PF 512: every line).
 * Prints GB/s and ns a block.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N (1024L<<20)
static __m512 f[8];
static inline void work(int n){ /* n x 8 independent fmas */
  __m512 a0=f[0],a1=f[1],a2=f[2],a3=f[3],a4=f[4],a5=f[5],a6=f[6],a7=f[7]; const __m512 m=_mm512_set1_ps(0.999f);
  for(int i=0;i<n;i++){ a0=_mm512_fmadd_ps(a0,m,m);a1=_mm512_fmadd_ps(a1,m,m);a2=_mm512_fmadd_ps(a2,m,m);a3=_mm512_fmadd_ps(a3,m,m);
    a4=_mm512_fmadd_ps(a4,m,m);a5=_mm512_fmadd_ps(a5,m,m);a6=_mm512_fmadd_ps(a6,m,m);a7=_mm512_fmadd_ps(a7,m,m);}
  f[0]=a0;f[1]=a1;f[2]=a2;f[3]=a3;f[4]=a4;f[5]=a5;f[6]=a6;f[7]=a7; }
static char *l2buf; static long l2pos;
static inline void work2(int n){ __m512i x=_mm512_setzero_si512(); for(int i=0;i<n;i++){ for(int j=0;j<2;j++){ x=_mm512_add_epi64(x,_mm512_load_si512(l2buf+l2pos)); l2pos=(l2pos+64)&(131072*2-1);} } f[1]=_mm512_add_ps(f[1],_mm512_castsi512_ps(x)); work(n);}
int main(int argc,char**argv){ syscall(SYS_arch_prctl,0x1023,18);
  char *b = aligned_alloc(4096, N); l2buf=aligned_alloc(4096,262144); memset(l2buf,2,262144); memset(b,1,N);
  int mode = atoi(argv[1]); int W = atoi(argv[2]); int PF=argc>3?atoi(argv[3]):512; long D=argc>4?atol(argv[4]):1; int L2W=getenv("L2W")!=0; /* fma-iterations per block */
  static char cfg[64] __attribute__((aligned(64))); memset(cfg,0,64); cfg[0]=1; for(int i=0;i<8;i++){((unsigned short*)(cfg+16))[i]=64; cfg[48+i]=16;}
  _tile_loadconfig(cfg);
  for(int rep=0;rep<3;rep++){
  double t0=now();
  for(long blk=0;blk<N;blk+=32768){
    if(mode==0){ for(int s=0;s<16;s++){ _tile_loadd(2,b+blk+s*64,1024); _tile_loadd(3,b+blk+16*1024+s*64,1024); _tile_dpbf16ps(0,2,3);} if(L2W) work2(W); else work(W);} 
    else if(mode==1){ for(int s=0;s<16;s++){ _tile_loadd(2,b+blk+s*64,1024); _tile_loadd(3,b+blk+16*1024+s*64,1024); _tile_dpbf16ps(0,2,3); work(W/16);} }
    else if(mode==2){ for(int s=0;s<16;s++){ _tile_loadd(2,b+blk+s*64,1024); _tile_loadd(3,b+blk+16*1024+s*64,1024); _tile_dpbf16ps(0,2,3); } }
    else if(mode==3){ if(L2W) work2(W); else work(W);} 
    else if(mode==5||mode==6||mode==7){ /* demand loads of this block (prefetched before), work with prefetches of block+D spread */
      __m512i acc=_mm512_setzero_si512();
      for(int s=0;s<16;s++){ _tile_loadd(2,b+blk+s*64,1024); _tile_loadd(3,b+blk+16*1024+s*64,1024); _tile_dpbf16ps(0,2,3);} 
      const char *nx=b+blk+32768L*D; int per=W/PF; if(per<1)per=1;
      for(int i=0;i<PF;i++){ if(L2W) work2(per); else work(per); if(mode==5)_mm_prefetch(nx+i*(32768/PF),_MM_HINT_T0); else if(mode==6) _mm_prefetch(nx+i*(32768/PF),_MM_HINT_T1); else _mm_prefetch(nx+i*(32768/PF),_MM_HINT_T2);} }
    else if(mode==4){ /* vector loads instead of tiles, work interleaved */ __m512i acc=_mm512_setzero_si512();
      for(int s=0;s<16;s++){ for(int r=0;r<32;r++) acc=_mm512_add_epi64(acc,_mm512_load_si512(b+blk+r*1024+s*64)); work(W/16);} f[0]=_mm512_add_ps(f[0],_mm512_castsi512_ps(acc)); }
  }
  double dt=now()-t0;
  printf("mode %d W %d: %.2f GB/s  %.1f ns/32KB\n",mode,W,N/dt*1e-9, dt*1e9/(N/32768));
  }
  _tile_release();
}
