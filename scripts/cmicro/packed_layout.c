// fp32: row-major weights (as skinny_gemm.c) against a panel-packed layout [N/P][K/16][P][16], P = 4 or 8.
// Usage: ./packed_layout [layers=12] [prefetch distance in floats] [small]
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <time.h>
int PFP=0;
#define VL 16
typedef __m512 vec;
#ifndef PF_DIST
#define PF_DIST 256
#endif
static inline float vsum(vec v){return _mm512_reduce_add_ps(v);}

// row-major block (current kernel)
#define RM(R,C) static inline void rm_##R##_##C(const float*w,int64_t K,const float*x,float*y,int64_t ldy){ \
  const int PF=(C)==1?0:PF_DIST; vec acc[R][C]; for(int r=0;r<R;r++)for(int c=0;c<C;c++)acc[r][c]=_mm512_setzero_ps(); \
  for(int64_t k=0;k+VL<=K;k+=VL){vec wv[R]; for(int r=0;r<R;r++){ if(PF)_mm_prefetch((const char*)(w+r*K+k+PF),_MM_HINT_T0); wv[r]=_mm512_loadu_ps(w+r*K+k);} \
   for(int c=0;c<C;c++){vec xv=_mm512_loadu_ps(x+c*K+k); for(int r=0;r<R;r++)acc[r][c]=_mm512_fmadd_ps(wv[r],xv,acc[r][c]);}} \
  for(int r=0;r<R;r++)for(int c=0;c<C;c++)y[c*ldy+r]=vsum(acc[r][c]);}
// packed block: panel of P rows, reads rows [r0, r0+R) of the panel; w points at panel start
#define PK(R,C,P) static inline void pk_##R##_##C##_##P(const float*w,int r0,int64_t K,const float*x,float*y,int64_t ldy){ \
  vec acc[R][C]; for(int r=0;r<R;r++)for(int c=0;c<C;c++)acc[r][c]=_mm512_setzero_ps(); \
  for(int64_t k=0;k+VL<=K;k+=VL){const float*wk=w+k*P+r0*VL; vec wv[R]; if(PFP)for(int r=0;r<R;r++)_mm_prefetch((const char*)(wk+PFP+r*VL),_MM_HINT_T0); for(int r=0;r<R;r++){ wv[r]=_mm512_load_ps(wk+r*VL);} \
   for(int c=0;c<C;c++){vec xv=_mm512_loadu_ps(x+c*K+k); for(int r=0;r<R;r++)acc[r][c]=_mm512_fmadd_ps(wv[r],xv,acc[r][c]);}} \
  for(int r=0;r<R;r++)for(int c=0;c<C;c++)y[c*ldy+r]=vsum(acc[r][c]);}

RM(8,1) RM(4,2) RM(4,3) RM(4,5) RM(2,9)
PK(8,1,8) PK(4,2,4) PK(4,3,4) PK(4,5,4) PK(2,9,4) PK(4,1,4) PK(8,2,8) PK(8,3,8)

typedef struct {int64_t N,K; float*w; float*p4; float*p8;} Mat;
static void pack(const float*w,float*p,int64_t N,int64_t K,int P){
  for(int64_t n0=0;n0<N;n0+=P) for(int64_t k=0;k<K;k+=VL) for(int r=0;r<P;r++) memcpy(p+n0*K+k*P+r*VL, w+(n0+r)*K+k, VL*4);}

static double now(){return omp_get_wtime();}

static void run(Mat*m,int nm,int C,int mode,float*x,float*y){
  for(int i=0;i<nm;i++){int64_t N=m[i].N,K=m[i].K;
  #pragma omp parallel num_threads(2)
  { int t=omp_get_thread_num(); int64_t per=(N/2+7)/8*8; int64_t a=t*per,b=a+per; if(b>N)b=N;
    if(mode==0){ // row-major
      if(C==1) for(int64_t r=a;r<b;r+=8) rm_8_1(m[i].w+r*K,K,x,y+r,N);
      if(C==2) for(int64_t r=a;r<b;r+=4) rm_4_2(m[i].w+r*K,K,x,y+r,N);
      if(C==3) for(int64_t r=a;r<b;r+=4) rm_4_3(m[i].w+r*K,K,x,y+r,N);
      if(C==5) for(int64_t r=a;r<b;r+=4) rm_4_5(m[i].w+r*K,K,x,y+r,N);
      if(C==9) for(int64_t r=a;r<b;r+=2) rm_2_9(m[i].w+r*K,K,x,y+r,N);
    } else if(mode==1){ // packed P=4
      const float*p=m[i].p4;
      if(C==1) for(int64_t r=a;r<b;r+=4) pk_4_1_4(p+r*K,0,K,x,y+r,N);
      if(C==2) for(int64_t r=a;r<b;r+=4) pk_4_2_4(p+r*K,0,K,x,y+r,N);
      if(C==3) for(int64_t r=a;r<b;r+=4) pk_4_3_4(p+r*K,0,K,x,y+r,N);
      if(C==5) for(int64_t r=a;r<b;r+=4) pk_4_5_4(p+r*K,0,K,x,y+r,N);
      if(C==9) for(int64_t r=a;r<b;r+=4){ pk_2_9_4(p+r*K,0,K,x,y+r,N); pk_2_9_4(p+r*K,2,K,x,y+r+2,N);}
    } else { // packed P=8
      const float*p=m[i].p8;
      if(C==1) for(int64_t r=a;r<b;r+=8) pk_8_1_8(p+r*K,0,K,x,y+r,N);
      if(C==2) for(int64_t r=a;r<b;r+=8) pk_8_2_8(p+r*K,0,K,x,y+r,N);
      if(C==3) for(int64_t r=a;r<b;r+=8) pk_8_3_8(p+r*K,0,K,x,y+r,N);
    }
  }}
}
int main(int argc,char**argv){
  int L=argc>1?atoi(argv[1]):12; PFP=argc>2?atoi(argv[2]):0;
  int64_t shapes[7][2]={{1536,1536},{256,1536},{256,1536},{1536,1536},{8960,1536},{8960,1536},{1536,8960}};
  int small=argc>3; int nm=L*7; Mat*m=calloc(nm,sizeof(Mat)); double bytes=0;
  for(int i=0;i<nm;i++){if(small&&i>0){m[i]=m[0];bytes+=m[0].N*m[0].K*4;continue;} m[i].N=shapes[small?0:i%7][0];m[i].K=shapes[small?0:i%7][1]; size_t s=m[i].N*m[i].K*4; bytes+=s;
    m[i].w=aligned_alloc(64,s); m[i].p4=aligned_alloc(64,s); m[i].p8=aligned_alloc(64,s);
    for(int64_t j=0;j<m[i].N*m[i].K;j++)m[i].w[j]=(float)((j*2654435761u)%1000)/1000.f-0.5f;
    pack(m[i].w,m[i].p4,m[i].N,m[i].K,4); pack(m[i].w,m[i].p8,m[i].N,m[i].K,8);}
  float*x=aligned_alloc(64,16*8960*4); for(int i=0;i<16*8960;i++)x[i]=(i%7)*0.1f;
  float*y=aligned_alloc(64,16*8960*4);
  int Cs[5]={1,2,3,5,9}; const char*names[3]={"rowmajor","packed4","packed8"};
  double best[3][5]; for(int a=0;a<3;a++)for(int b=0;b<5;b++)best[a][b]=1e9;
  double med[3][5][7];
  for(int rnd=0;rnd<7;rnd++) for(int ci=0;ci<5;ci++) for(int mode=0;mode<3;mode++){
    if(mode==2&&Cs[ci]>3){med[mode][ci][rnd]=0;continue;}
    double t0=now(); run(m,nm,Cs[ci],mode,x,y); double dt=now()-t0; med[mode][ci][rnd]=dt; }
  // verify equality rowmajor vs packed on C=5
  printf("GB %.2f PFP %d\n",bytes/1e9,PFP);
  for(int mode=0;mode<3;mode++){printf("%-9s",names[mode]); for(int ci=0;ci<5;ci++){double*v=med[mode][ci]; // median of 7
     double s[7]; memcpy(s,v,sizeof s); for(int i=0;i<7;i++)for(int j=i+1;j<7;j++)if(s[j]<s[i]){double q=s[i];s[i]=s[j];s[j]=q;}
     if(s[3]>0) printf("  C%d %.1fGB/s", Cs[ci], bytes/s[3]/1e9);} printf("\n");}
  return 0;}
