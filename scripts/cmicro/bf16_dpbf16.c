// The tried alternative: bf16 weights and bf16-rounded inputs through vdpbf16ps (AVX512_BF16).
// Usage: ./bf16_dpbf16 [layers=28]
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#define KL 32
#ifndef PF_DIST
#define PF_DIST 512
#endif
#define DB(R,C) static inline void db_##R##_##C(const uint16_t*w,int64_t K,const uint16_t*x,float*y,int64_t ldy){ \
  const int PF=(C)==1?0:PF_DIST; __m512 acc[R][C]; for(int r=0;r<R;r++)for(int c=0;c<C;c++)acc[r][c]=_mm512_setzero_ps(); \
  for(int64_t k=0;k+KL<=K;k+=KL){__m512bh wv[R]; for(int r=0;r<R;r++){ if(PF)_mm_prefetch((const char*)(w+r*K+k+PF),_MM_HINT_T0); wv[r]=(__m512bh)_mm512_loadu_si512(w+r*K+k);} \
   for(int c=0;c<C;c++){__m512bh xv=(__m512bh)_mm512_loadu_si512(x+c*K+k); for(int r=0;r<R;r++)acc[r][c]=_mm512_dpbf16_ps(acc[r][c],wv[r],xv);}} \
  for(int r=0;r<R;r++)for(int c=0;c<C;c++)y[c*ldy+r]=_mm512_reduce_add_ps(acc[r][c]);}
DB(8,1) DB(4,2) DB(4,3) DB(4,5) DB(2,9) DB(8,2) DB(6,3) DB(4,4) DB(3,7) DB(3,8)
typedef struct {int64_t N,K; uint16_t*w;} Mat;
static void run(Mat*m,int nm,int C,uint16_t*x,float*y){
  for(int i=0;i<nm;i++){int64_t N=m[i].N,K=m[i].K;
  #pragma omp parallel num_threads(2)
  { int t=omp_get_thread_num(); int64_t per=(N/2+23)/24*24; int64_t a=t*per,b=a+per; if(b>N)b=N;
      if(C==1) for(int64_t r=a;r<b;r+=8) db_8_1(m[i].w+r*K,K,x,y+r,N);
      if(C==2) for(int64_t r=a;r<b;r+=8) db_8_2(m[i].w+r*K,K,x,y+r,N);
      if(C==3) for(int64_t r=a;r<b;r+=6) db_6_3(m[i].w+r*K,K,x,y+r,N);
      if(C==5) for(int64_t r=a;r<b;r+=4) db_4_5(m[i].w+r*K,K,x,y+r,N);
      if(C==9) for(int64_t r=a;r<b;r+=2) db_2_9(m[i].w+r*K,K,x,y+r,N);
  }}}
int main(int argc,char**argv){
  int L=argc>1?atoi(argv[1]):28;
  int64_t shapes[7][2]={{1536,1536},{256,1536},{256,1536},{1536,1536},{8960,1536},{8960,1536},{1536,8960}};
  int nm=L*7; Mat*m=calloc(nm,sizeof(Mat)); double bytes=0;
  for(int i=0;i<nm;i++){m[i].N=shapes[i%7][0];m[i].K=shapes[i%7][1]; size_t s=m[i].N*m[i].K*2; bytes+=s;
    m[i].w=aligned_alloc(64,s); for(int64_t j=0;j<m[i].N*m[i].K;j++)m[i].w[j]=0x3f80+(j%64);}
  uint16_t*x=aligned_alloc(64,16*8960*2); for(int i=0;i<16*8960;i++)x[i]=0x3f80+(i%7);
  float*y=aligned_alloc(64,16*8960*4);
  int Cs[5]={1,2,3,5,9}; double t[5][7];
  for(int rnd=0;rnd<7;rnd++) for(int ci=0;ci<5;ci++){double t0=omp_get_wtime(); run(m,nm,Cs[ci],x,y); t[ci][rnd]=omp_get_wtime()-t0;}
  printf("dpbf16 GB %.2f:",bytes/1e9);
  for(int ci=0;ci<5;ci++){double*s=t[ci]; for(int i=0;i<7;i++)for(int j=i+1;j<7;j++)if(s[j]<s[i]){double q=s[i];s[i]=s[j];s[j]=q;}
    printf("  C%d %.1fms (%.1fGB/s)",Cs[ci],s[3]*1e3,bytes/s[3]/1e9);} printf("\n"); return 0;}
