// bf16 weights widened in registers (as skinny_gemm_bf16), fp32 inputs and accumulation.
// Usage: ./bf16_widen [layers=28] [small: one L3-resident matrix repeated]
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#define VL 16
#ifndef PF_DIST
#define PF_DIST 256
#endif
static inline __m512 ld16(const uint16_t*p){ return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)),16)); }
#define BB(R,C) static inline void bb_##R##_##C(const uint16_t*w,int64_t K,const float*x,float*y,int64_t ldy){ \
  const int PF=(C)==1?0:PF_DIST; __m512 acc[R][C]; for(int r=0;r<R;r++)for(int c=0;c<C;c++)acc[r][c]=_mm512_setzero_ps(); \
  for(int64_t k=0;k+VL<=K;k+=VL){__m512 wv[R]; for(int r=0;r<R;r++){ if(PF&&(k%32==0))_mm_prefetch((const char*)(w+r*K+k+PF),_MM_HINT_T0); wv[r]=ld16(w+r*K+k);} \
   for(int c=0;c<C;c++){__m512 xv=_mm512_loadu_ps(x+c*K+k); for(int r=0;r<R;r++)acc[r][c]=_mm512_fmadd_ps(wv[r],xv,acc[r][c]);}} \
  for(int r=0;r<R;r++)for(int c=0;c<C;c++)y[c*ldy+r]=_mm512_reduce_add_ps(acc[r][c]);}
BB(8,1) BB(4,2) BB(4,3) BB(4,5) BB(2,9) BB(4,4) BB(3,7)
typedef struct {int64_t N,K; uint16_t*w;} Mat;
static void run(Mat*m,int nm,int C,float*x,float*y){
  for(int i=0;i<nm;i++){int64_t N=m[i].N,K=m[i].K;
  #pragma omp parallel num_threads(2)
  { int t=omp_get_thread_num(); int64_t per=(N/2+7)/8*8; int64_t a=t*per,b=a+per; if(b>N)b=N;
      if(C==1) for(int64_t r=a;r<b;r+=8) bb_8_1(m[i].w+r*K,K,x,y+r,N);
      if(C==2) for(int64_t r=a;r<b;r+=4) bb_4_2(m[i].w+r*K,K,x,y+r,N);
      if(C==3) for(int64_t r=a;r<b;r+=4) bb_4_3(m[i].w+r*K,K,x,y+r,N);
      if(C==5) for(int64_t r=a;r<b;r+=4) bb_4_5(m[i].w+r*K,K,x,y+r,N);
      if(C==9) for(int64_t r=a;r<b;r+=2) bb_2_9(m[i].w+r*K,K,x,y+r,N);
  }}}
int main(int argc,char**argv){
  int L=argc>1?atoi(argv[1]):28;
  int64_t shapes[7][2]={{1536,1536},{256,1536},{256,1536},{1536,1536},{8960,1536},{8960,1536},{1536,8960}};
  int small=argc>2; int nm=L*7; Mat*m=calloc(nm,sizeof(Mat)); double bytes=0;
  for(int i=0;i<nm;i++){if(small&&i>0){m[i]=m[0];bytes+=m[0].N*m[0].K*2;continue;} m[i].N=shapes[i%7][0];m[i].K=shapes[i%7][1]; size_t s=m[i].N*m[i].K*2; bytes+=s;
    m[i].w=aligned_alloc(64,s); for(int64_t j=0;j<m[i].N*m[i].K;j++)m[i].w[j]=0x3f80+(j%64);}
  float*x=aligned_alloc(64,16*8960*4); for(int i=0;i<16*8960;i++)x[i]=(i%7)*0.1f;
  float*y=aligned_alloc(64,16*8960*4);
  int Cs[5]={1,2,3,5,9}; double t[5][7];
  for(int rnd=0;rnd<7;rnd++) for(int ci=0;ci<5;ci++){double t0=omp_get_wtime(); run(m,nm,Cs[ci],x,y); t[ci][rnd]=omp_get_wtime()-t0;}
  printf("bf16 weights GB %.2f:",bytes/1e9);
  for(int ci=0;ci<5;ci++){double*s=t[ci]; for(int i=0;i<7;i++)for(int j=i+1;j<7;j++)if(s[j]<s[i]){double q=s[i];s[i]=s[j];s[j]=q;}
    printf("  C%d %.1fms (%.1fGB/s)",Cs[ci],s[3]*1e3,bytes/s[3]/1e9);} printf("\n"); return 0;}
