// What Fp8GemmAct's cuBLASLt settings cost an fp8 GEMM (A/B scale pointers, the bias / GELU-bias epilogue, a float8 D with a D
// scale) against a plain one (host alpha, fp16 D), at BERT-base's four GEMMs for M tokens, alone (CUDA-graph replays of 20, the best
// of the heuristic's candidates) and in a 12-layer chain of the four GEMMs and a quantize kernel after each (as the model's norms and
// attention stand between them), the variants timed in 8 interleaved rounds. "W shared": every layer reads layer 0's weights (L2
// resident); "prefetch W": the glue kernels issue prefetch.global.L2 of the next GEMM's weights; "L2 persist": each GEMM of the first
// layers whose weights fit the device's persisting L2 set-aside runs under an access-policy window marking its W persisting, so they
// stay in L2 from one pass to the next (the stream attribute is captured into the graph's kernel nodes; the count is printed).
// bench/fp8_epilogue_cost.sh runs it;
// bench/results/h200_quant.md section 13 reads the numbers (fp8_epilogue_cost_h100.log).
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); exit(1);} } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("cuBLASLt %d at %d\n", int(s_), __LINE__); exit(1);} } while (0)

__global__ void fill_fp8(__nv_fp8_e4m3* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __nv_fp8_e4m3((h / 4294967296.f - 0.5f) * 4.f);
  }
}
__global__ void glue(const __half* in, int ld, int rows, int cols, __nv_fp8_e4m3* out, const char* pf, size_t pf_bytes, const char* pf2, size_t pf2_bytes) {
  int per_row = cols / 8, i = blockIdx.x * blockDim.x + threadIdx.x;
  // Stands in for FusedMHA / SkipLayerNormFp8 prefetching the next GEMM's weights into L2 (no registers wait on it).
  for (size_t off = size_t(i) * 128; off < pf_bytes; off += size_t(gridDim.x) * blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + off));
  for (size_t off = size_t(i) * 128; off < pf2_bytes; off += size_t(gridDim.x) * blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(pf2 + off));
  if (i >= rows * per_row) return;
  int r = i / per_row, c = (i % per_row) * 8;
  uint4 v = *reinterpret_cast<const uint4*>(in + size_t(r) * ld + c);
  const __half* h = reinterpret_cast<const __half*>(&v);
  alignas(8) __nv_fp8_e4m3 q[8];
  for (int j = 0; j < 8; ++j) q[j] = __nv_fp8_e4m3(__half2float(h[j]));
  *reinterpret_cast<uint2*>(out + size_t(r) * cols + c) = *reinterpret_cast<uint2*>(q);
}
static void launch_glue(cudaStream_t s, const __half* in, int ld, int rows, int cols, __nv_fp8_e4m3* out,
                        const void* pf = nullptr, size_t pf_bytes = 0, const void* pf2 = nullptr, size_t pf2_bytes = 0) {
  int n = rows * cols / 8;
  glue<<<(n + 255) / 256, 256, 0, s>>>(in, ld, rows, cols, out, static_cast<const char*>(pf), pf_bytes,
                                           static_cast<const char*>(pf2), pf2_bytes);
}

enum Flags { kScales = 1, kBias = 2, kGelu = 4, kD8 = 8, kGeluOnly = 16 };
struct LtGemm {
  cublasLtHandle_t lt; cublasLtMatmulDesc_t desc; cublasLtMatrixLayout_t la, lb, lc, ld;
  std::vector<cublasLtMatmulHeuristicResult_t> cands; int chosen = 0;
  const void *a, *b; void* d; float alpha; int flags;
  LtGemm(cublasLtHandle_t h, const void* x, const void* w, void* out, int m, int n, int k, float al, int f, const float* sa,
         const float* sb, const float* sd, const __half* bias)
      : lt(h), a(w), b(x), d(out), alpha(al), flags(f) {
    LK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T; int8_t fast = 1;
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    if (f & kScales) {
      LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
      LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
      alpha = 1.f;
    }
    if (f & kD8) LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &sd, sizeof(sd)));
    if (f & kGeluOnly) {
      cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU;
      LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    }
    if (f & (kBias | kGelu)) {
      cublasLtEpilogue_t epi = (f & kGelu) ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
      cudaDataType_t bt = CUDA_R_16F;
      LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
      LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k));
    LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k));
    LK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, n, m, n));
    LK(cublasLtMatrixLayoutCreate(&ld, (f & kD8) ? CUDA_R_8F_E4M3 : CUDA_R_16F, n, m, n));
    cublasLtMatmulPreference_t pref; LK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = 0;
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cands.resize(16); int got = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 16, cands.data(), &got);
    if (hs != CUBLAS_STATUS_SUCCESS) { printf("  heuristic status %d for flags %d\n", int(hs), f); got = 0; }
    cands.resize(got);
  }
  void run(cudaStream_t s) {
    float beta = 0.f;
    LK(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, (flags & kD8) ? nullptr : d, lc, d, ld, &cands[chosen].algo, nullptr, 0, s));
  }
};

template <class F>
static float time_graph(cudaStream_t s, F&& body, int reps, int launches) {
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) body();
  CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < launches; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms / launches / reps);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
  return t[3];
}

int main(int argc, char** argv) {
  const int M = argc > 1 ? atoi(argv[1]) : 1024, L = 12;
  const char* sname[4] = {"qkv", "out", "fc1", "fc2"};
  const int SN[4] = {2304, 768, 3072, 768}, SK[4] = {768, 768, 768, 3072};
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasLtHandle_t lt; LK(cublasLtCreate(&lt));
  auto alloc8 = [](size_t n, unsigned seed) { __nv_fp8_e4m3* p; CK(cudaMalloc(&p, n)); fill_fp8<<<1024, 256>>>(p, n, seed); return p; };
  auto alloc16 = [](size_t n) { __half* p; CK(cudaMalloc(&p, n * 2)); CK(cudaMemset(p, 0, n * 2)); return p; };
  __nv_fp8_e4m3 *x8 = alloc8(size_t(M) * 768, 1), *xb = alloc8(size_t(M) * 768, 2), *xc = alloc8(size_t(M) * 768, 3),
                *f8 = alloc8(size_t(M) * 3072, 4);
  __half *h16 = alloc16(size_t(M) * 2304), *o16 = alloc16(size_t(M) * 768), *f16 = alloc16(size_t(M) * 3072), *o2 = alloc16(size_t(M) * 768);
  __half* bias = alloc16(3072);
  float* scales; CK(cudaMalloc(&scales, 1024));  // three scales 256 bytes apart, as ORT's allocations
  float hs[256] = {};
  hs[0] = 0.03f; hs[64] = 0.04f; hs[128] = 1.f;
  CK(cudaMemcpy(scales, hs, 1024, cudaMemcpyHostToDevice));
  std::vector<__nv_fp8_e4m3*> W[4];
  for (int si = 0; si < 4; ++si) for (int l = 0; l < L; ++l) W[si].push_back(alloc8(size_t(SN[si]) * SK[si], 100 + 10 * l + si));
  CK(cudaDeviceSynchronize());
  // Variants: flags for (qkv, out, fc1, fc2); model = the artefact's settings (FC1 writes float8 with GELU, no glue after it).
  // mode 1: every layer uses layer 0's W; 2: glue prefetches the next W; 3: the first layers' W persist in L2
  struct Variant { const char* name; int f[4]; int mode = 0; };
  const int S = kScales, SB = kScales | kBias, F1 = kScales | kBias | kGelu | kD8;
  const Variant V[] = {{"plain", {0, 0, 0, 0}},
                       {"scales", {S, S, S, S}},
                       {"model", {SB, SB, F1, SB}},
                       {"no zero bias", {SB, S, F1, S}},
                       {"qkv bias out too", {S, S, F1, S}},
                       {"no bias, fc1 gelu", {S, S, kScales | kGeluOnly | kD8, S}},
                       {"model, W shared", {SB, SB, F1, SB}, 1},
                       {"model, prefetch W", {SB, SB, F1, SB}, 2},
                       {"no zero b, prefetch", {SB, S, F1, S}, 2},
                       {"model, L2 persist", {SB, SB, F1, SB}, 3},
                       {"no bias, L2 persist", {S, S, kScales | kGeluOnly | kD8, S}, 3}};
  const int NV = sizeof(V) / sizeof(V[0]);
  const void* A[4] = {x8, xb, xc, f8};
  void* Dfp16[4] = {h16, o16, f16, o2};
  std::vector<std::vector<LtGemm*>> chains(NV);
  std::vector<bool> ok(NV, true);
  for (int v = 0; v < NV; ++v) {
    int best[4];
    for (int si = 0; si < 4; ++si) {
      float alpha = 1.f / std::sqrt(SK[si] * 4.f / 3.f);
      void* d = (V[v].f[si] & kD8) ? static_cast<void*>(f8) : Dfp16[si];
      LtGemm g(lt, A[si], W[si][0], d, M, SN[si], SK[si], alpha, V[v].f[si], scales, scales + 64, scales + 128, bias);
      float bt = 1e9; best[si] = 0;
      if (g.cands.empty()) { ok[v] = false; continue; }
      for (int c = 0; c < int(g.cands.size()); ++c) {
        g.chosen = c;
        float ms = time_graph(s, [&] { g.run(s); }, 20, 20);
        if (ms < bt) { bt = ms; best[si] = c; }
      }
      printf("%-18s %s M=%d: best of %zu heuristic candidates %.4f us (cand %d)\n", V[v].name, sname[si], M, g.cands.size(), bt * 1e3, best[si]);
    }
    for (int l = 0; l < L; ++l)
      for (int si = 0; si < 4; ++si) {
        float alpha = 1.f / std::sqrt(SK[si] * 4.f / 3.f);
        void* d = (V[v].f[si] & kD8) ? static_cast<void*>(f8) : Dfp16[si];
        LtGemm* g = new LtGemm(lt, A[si], W[si][V[v].mode == 1 ? 0 : l], d, M, SN[si], SK[si], alpha, V[v].f[si], scales, scales + 64, scales + 128, bias);
        g->chosen = best[si]; chains[v].push_back(g);
      }
  }
  auto wb = [&](int si) { return size_t(SN[si]) * SK[si]; };
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  const size_t set_aside = size_t(prop.persistingL2CacheMaxSize);
  // Set for every variant (not only mode 3), so that all of this run's chains share one L2 configuration; the others hold no
  // persisting lines (reset after each mode-3 timing), and the set-aside serves their normal accesses then.
  CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, set_aside));
  int persist_layers = 0;
  for (size_t used = 0; persist_layers < L && used + wb(0) + wb(1) + wb(2) + wb(3) <= set_aside; ++persist_layers) used += wb(0) + wb(1) + wb(2) + wb(3);
  printf("L2 %d bytes, persisting set-aside %zu bytes, max window %d bytes: the first %d layers' W persist\n", prop.l2CacheSize, set_aside,
         prop.accessPolicyMaxWindowSize, persist_layers);
  auto window = [&](const void* base, size_t bytes) {
    cudaStreamAttrValue a = {};
    a.accessPolicyWindow.base_ptr = const_cast<void*>(base);
    a.accessPolicyWindow.num_bytes = bytes;
    a.accessPolicyWindow.hitRatio = 1.f;
    a.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    a.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &a));
  };
  auto chain = [&](int v) {
    for (int l = 0; l < L; ++l) {
      LtGemm** g = &chains[v][l * 4];
      bool pf = V[v].mode == 2;
      // Mode 3: each GEMM of a persisting layer runs under its own W's window, reset after it.
      auto run = [&](int si) {
        bool persist = V[v].mode == 3 && l < persist_layers;
        if (persist) window(W[si][l], wb(si));
        g[si]->run(s);
        if (persist) window(nullptr, 0);
      };
      const void* next_qkv = l + 1 < L ? W[0][l + 1] : nullptr;
      // As the model could: attention prefetches out-proj's W, the first norm FC1's and FC2's, the second the next QKV's.
      run(0); launch_glue(s, h16, 2304, M, 768, xb, pf ? W[1][l] : nullptr, pf ? wb(1) : 0);
      run(1); launch_glue(s, o16, 768, M, 768, xc, pf ? W[2][l] : nullptr, pf ? wb(2) : 0, pf ? W[3][l] : nullptr, pf ? wb(3) : 0);
      run(2); if (!(V[v].f[2] & kD8)) launch_glue(s, f16, 3072, M, 3072, f8);
      run(3); launch_glue(s, o2, 768, M, 768, x8, pf && next_qkv ? next_qkv : nullptr, pf && next_qkv ? wb(0) : 0);
    }
  };
  for (int v = 0; v < NV; ++v) if (ok[v]) { chain(v); CK(cudaStreamSynchronize(s)); }
  CK(cudaCtxResetPersistingL2Cache());
  for (int v = 0; v < NV; ++v) {  // did capture keep the windows? (count the kernel nodes holding one)
    if (V[v].mode != 3 || !ok[v]) continue;
    cudaGraph_t gr; size_t n = 0;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)); chain(v); CK(cudaStreamEndCapture(s, &gr));
    CK(cudaGraphGetNodes(gr, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n); CK(cudaGraphGetNodes(gr, nodes.data(), &n));
    int kernels = 0, windowed = 0;
    for (cudaGraphNode_t nd : nodes) {
      cudaGraphNodeType ty; CK(cudaGraphNodeGetType(nd, &ty));
      if (ty != cudaGraphNodeTypeKernel) continue;
      ++kernels;
      cudaKernelNodeAttrValue a; CK(cudaGraphKernelNodeGetAttribute(nd, cudaKernelNodeAttributeAccessPolicyWindow, &a));
      windowed += a.accessPolicyWindow.num_bytes > 0;
    }
    printf("%s: %d of %d captured kernel nodes hold an access-policy window\n", V[v].name, windowed, kernels);
    CK(cudaGraphDestroy(gr));
  }
  std::vector<float> t[16];
  for (int round = 0; round < 8; ++round)
    for (int k = 0; k < NV; ++k) {
      int v = (round + k) % NV;
      if (!ok[v]) continue;
      t[v].push_back(time_graph(s, [&] { chain(v); }, 1, 50));
      if (V[v].mode == 3) CK(cudaCtxResetPersistingL2Cache());  // the next variant starts without persisting lines
    }
  for (int v = 0; v < NV; ++v) {
    if (!ok[v]) { printf("chain %-18s: not supported\n", V[v].name); continue; }
    std::sort(t[v].begin(), t[v].end());
    printf("chain %-18s M=%d: %.4f ms a pass (median of 8 interleaved rounds; min %.4f max %.4f)\n", V[v].name, M, t[v][4], t[v][0], t[v][7]);
  }
  // The glue alone, for subtraction.
  float g0 = time_graph(s, [&] { launch_glue(s, h16, 2304, M, 768, xb); }, 20, 20);
  float g1 = time_graph(s, [&] { launch_glue(s, f16, 3072, M, 3072, f8); }, 20, 20);
  printf("glue alone: %d x 768 %.4f us, %d x 3072 %.4f us\n", M, g0 * 1e3, M, g1 * 1e3);
  return 0;
}
