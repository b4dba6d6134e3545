#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define CH 8192
static char *src; static size_t N;
static _Alignas(64) char stage[2][CH];
static float sink;
/* compute: W passes of FMA over 8 KB (2048 floats -> 128 vectors) */
static inline __m512 work(const char *p, int W, __m512 a){
  for(int w=0;w<W;w++) for(int i=0;i<CH;i+=64){ a=_mm512_fmadd_ps(_mm512_load_ps((const float*)(p+i)),a,a);} return a;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]), W=atoi(argv[2]); int G=argc>3?atoi(argv[3]):8;
  N=(size_t)512<<20; src=aligned_alloc(1<<21,N); for(size_t i=0;i<N;i+=4096) memset(src+i,1,4096);
  __m512 acc=_mm512_set1_ps(1e-9f);
  for(int rep=0;rep<3;rep++){
  double t0=now();
  for(size_t off=0;off<N;off+=CH){
    char *dst=stage[(off/CH)&1]; const char *cur=stage[((off/CH)&1)^1];
    if(mode==0){ /* compute only, on stage */ acc=work(cur,W,acc);}
    else if(mode==1){ /* copy only */ for(int i=0;i<CH;i+=64) _mm512_store_si512(dst+i,_mm512_load_si512(src+off+i)); }
    else if(mode==2){ /* copy burst then compute */ for(int i=0;i<CH;i+=64) _mm512_store_si512(dst+i,_mm512_load_si512(src+off+i)); acc=work(cur,W,acc);}
    else if(mode==3){ /* interleave: G parts */
      int part=CH/G; for(int g=0;g<G;g++){ for(int i=g*part;i<(g+1)*part;i+=64) _mm512_store_si512(dst+i,_mm512_load_si512(src+off+i));
        for(int w=0;w<W;w++) for(int i=g*part;i<(g+1)*part;i+=64) acc=_mm512_fmadd_ps(_mm512_load_ps((const float*)(cur+i)),acc,acc);} }
    else if(mode==5){ for(int i=0;i<CH;i+=64) acc=_mm512_add_ps(acc,_mm512_load_ps((const float*)(src+off+i))); }
    else if(mode==6){ int part=CH/G; for(int g=0;g<G;g++){ __m512 t=_mm512_setzero_ps(); for(int i=g*part;i<(g+1)*part;i+=64) t=_mm512_add_ps(t,_mm512_load_ps((const float*)(src+off+i))); acc=_mm512_add_ps(acc,t);
        for(int w=0;w<W;w++) for(int i=g*part;i<(g+1)*part;i+=64) acc=_mm512_fmadd_ps(_mm512_load_ps((const float*)(cur+i)),acc,acc);} }
    else if(mode==7){ int part=CH/G; for(int g=0;g<G;g++){ for(int i=g*part;i<(g+1)*part;i+=64) _mm_prefetch(src+off+CH*4+i,_MM_HINT_T2);
        for(int i=g*part;i<(g+1)*part;i+=64) _mm512_store_si512(dst+i,_mm512_load_si512(src+off+i));
        for(int w=0;w<W;w++) for(int i=g*part;i<(g+1)*part;i+=64) acc=_mm512_fmadd_ps(_mm512_load_ps((const float*)(cur+i)),acc,acc);} }
    else if(mode==8){ /* S streams, read only */ size_t q=N/G; if(off>=q) break; for(int i=0;i<CH;i+=64) for(int s2=0;s2<G;s2++) acc=_mm512_add_ps(acc,_mm512_load_ps((const float*)(src+off+s2*q+i))); }
    else if(mode==9){ /* S streams copy interleaved with compute in 8 parts */ size_t q=N/G; if(off>=q) break; int part=CH/8; for(int g=0;g<8;g++){ for(int s2=0;s2<G;s2++) for(int i=g*part;i<(g+1)*part;i+=64) _mm512_store_si512(dst+i,_mm512_load_si512(src+off+s2*q+i));
        for(int w=0;w<W*G;w++) for(int i=g*part;i<(g+1)*part;i+=64) acc=_mm512_fmadd_ps(_mm512_load_ps((const float*)(cur+i)),acc,acc);} }
    else if(mode==4){ /* strided demand: like head rows: read 256B every 2KB, 8 passes */
      for(int h=0;h<8;h++) for(int j=0;j<4;j++){ const char*p=src+off+ (size_t)j*2048+h*256; for(int i=0;i<256;i+=64) acc=_mm512_add_ps(acc,_mm512_load_ps((const float*)(p+i)));} acc=work(cur,W,acc);}
  }
  double t=now()-t0; printf("mode=%d W=%d G=%d %.2f GB/s\n",mode,W,G,N/t/1e9);}
  float o[16]; _mm512_storeu_ps(o,acc); sink=o[0]; return sink==12345;
}
