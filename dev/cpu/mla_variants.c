/* mla_variants.c — interleaved cold timing of one build under several settings of an
 * experiment-only environment variable (FD_AH, read by the twelfth session's experiment
 * builds only; the committed library reads none): cc -O2 -fopenmp -Iinclude
 * dev/cpu/mla_variants.c build-cpu/libflashdecode.a -lm; ./a.out THREADS SETS ROUNDS VAR...
 * ("-": unset). 16 heads B=1 bf16 separate caches, NK keys (default 16384). */
/* interleaved variants (env FD_AH per variant) over one set of cold caches */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "flashdecode.h"
static double now(void){struct timespec ts;clock_gettime(CLOCK_MONOTONIC,&ts);return ts.tv_sec+ts.tv_nsec*1e-9;}
static void fill(uint16_t *x,size_t n,uint32_t seed){for(size_t i=0;i<n;i++){seed=seed*1664525u+1013904223u;x[i]=(uint16_t)(0x3f80|(seed>>25))^(uint16_t)((seed>>16&1)<<15);}}
static int cmp(const void*a,const void*b){double x=*(const double*)a,y=*(const double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  int threads=atoi(argv[1]), sets=atoi(argv[2]), rounds=atoi(argv[3]); int nv=argc-4; char**var=argv+4;
  const int h=16,D=512,R=64; const int n=getenv("NK")?atoi(getenv("NK")):16384;
  fd_problem p; memset(&p,0,sizeof p); p.backend=FD_BACKEND_CPU; p.dtype=FD_DTYPE_BF16; p.batch=1; p.num_heads_q=h; p.num_heads_kv=1; p.head_dim=D; p.rope_dim=R; p.softmax_scale=0.0721f; p.kv_capacity=n; p.num_threads=threads;
  fd_plan plan; fd_error err; if(fd_plan_init(&plan,&p,&err)){fprintf(stderr,"%s\n",err.message);return 1;}
  uint16_t *q=malloc((size_t)h*D*2),*qp=malloc((size_t)h*R*2),*o=malloc((size_t)h*D*2); fill(q,(size_t)h*D,1); fill(qp,(size_t)h*R,4);
  fd_tensors *t=calloc(sets,sizeof *t); int32_t len=n;
  for(int s=0;s<sets;s++){ t[s].q=q;t[s].q_pe=qp;t[s].kv_len=&len;t[s].out=o; uint16_t*ckv=malloc((size_t)n*(D+R)*2); fill(ckv,(size_t)n*(D+R),2+s); t[s].k_cache=ckv; t[s].k_pe_cache=ckv+(size_t)n*D; }
  void*ws=malloc(plan.workspace_size+1);
  double *med=calloc((size_t)nv*rounds,sizeof(double)); double *ts=malloc(sets*sizeof(double)); int it=0;
  for(int i=0;i<sets;i++) fd_run(&plan,&t[i],ws,plan.workspace_size,NULL,&err);
  for(int r=0;r<rounds;r++) for(int v=0;v<nv;v++){ if(strcmp(var[v],"-")) setenv("FD_AH",var[v],1); else unsetenv("FD_AH");
    for(int i=0;i<sets;i++){ double t0=now(); fd_run(&plan,&t[it++%sets],ws,plan.workspace_size,NULL,&err); ts[i]=now()-t0; }
    qsort(ts,sets,sizeof(double),cmp); med[v*rounds+r]=ts[sets/2]*1e6; }
  for(int v=0;v<nv;v++){ printf("%-16s",var[v]); double *m=med+v*rounds; for(int r=0;r<rounds;r++) printf(" %6.0f",m[r]); qsort(m,rounds,sizeof(double),cmp); printf("  | median %6.0f us  %.1f ns/key/thr %.2f GB/s\n",m[rounds/2],m[rounds/2]*1e3*threads/n,(double)n*(D+R)*2/m[rounds/2]*1e-3); }
}
