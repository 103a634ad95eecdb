// The LARA forward, included three times by lara_cpu.cpp: LARA_NS names the variant (generic / avx2 /
// avx512), LARA_AVX2 or LARA_AVX512 selects the vector type. Same math as kernels/reference.py (spec 5.3-5.4) and the algebra of
// kernels/_cpu.py, restructured so that no [C, N] tensor exists:
//   phase 0, per (batch, head): samples w = mu (+ noise), the GEMM operand P = scale * [w | q~]^T,
//            the balance heuristic BH_c and log g_c(w_c).
//   phase 1, per (batch, head, key chunk): stream key tiles; an online (running max / sum) softmax per
//            proposal gives partial F_c and lse_c; the same sweep over query tiles gives a partial
//            log-normalizer of rho (softmax over queries).
//   phase 2, per (batch, head): combine the chunks in chunk order (fixed, so the result does not depend
//            on the thread count or schedule).
//   phase 3, per (batch, head, query block): logits, rho, alpha, SNIS weights and the weighted sum of F
//            on cache-resident tiles.
// Padding: each document's valid positions are compacted (in order), so a document's arithmetic is the
// same alone, in any batch, with any padding: bitwise batch invariance. Padded query rows are zero.

namespace lara {
namespace LARA_NS {

// Keys per tile: S tile [128, Cp] plus the K, V, Q tiles (32 KiB each at D = 64) stay in L2.
constexpr int64_t KEY_TILE = 128;
// Keys per parallel task. Fixed (never derived from the thread count) so the order of the partial
// sums depends only on the document's length.
constexpr int64_t KEY_CHUNK = 2048;
// Queries per tile: logits [64, 2Cp] and weights [64, Cp] (48 KiB at C = 64) stay in L1/L2.
constexpr int64_t QUERY_TILE = 64;
constexpr int64_t QUERY_TASK = 256;  // queries per parallel task
// Working set of one head group (see forward): half of a common 32 MiB last-level cache, so a group's
// q, k, v and output stay there between phase 1 and phase 3 next to whatever else runs.
constexpr int64_t HEAD_GROUP_BYTES = int64_t{16} << 20;
constexpr float ALPHA_FLOOR = 1e-8f;  // kernels.reference.ALPHA_FLOOR (spec 5.3)
constexpr float INF = std::numeric_limits<float>::infinity();

#if LARA_AVX2 || LARA_AVX512
// Sum and max of 8 lanes in a fixed halving order (128, 64, 32 bits): deterministic like every other
// reduction here. The AVX-512 variant folds its 16 lanes to 8 first.
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
#endif

#if LARA_AVX512
struct Vec {
  __m512 x;
  static constexpr int64_t W = 16;
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static Vec bcast(const float* p) { return {_mm512_set1_ps(*p)}; }
  static Vec set1(float f) { return {_mm512_set1_ps(f)}; }
  void store(float* p) const { _mm512_storeu_ps(p, x); }
};
inline Vec operator+(Vec a, Vec b) { return {_mm512_add_ps(a.x, b.x)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm512_sub_ps(a.x, b.x)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm512_mul_ps(a.x, b.x)}; }
inline Vec operator/(Vec a, Vec b) { return {_mm512_div_ps(a.x, b.x)}; }
inline Vec fmadd(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.x, b.x, c.x)}; }
inline Vec vmax(Vec a, Vec b) { return {_mm512_max_ps(a.x, b.x)}; }
inline float hsum(Vec a) {
  return hsum8(_mm256_add_ps(_mm512_extractf32x8_ps(a.x, 0), _mm512_extractf32x8_ps(a.x, 1)));
}
inline float hmax(Vec a) {
  return hmax8(_mm256_max_ps(_mm512_extractf32x8_ps(a.x, 0), _mm512_extractf32x8_ps(a.x, 1)));
}
// exp on 16 lanes: the AVX2 variant's method and coefficients.
inline Vec vexp(Vec v) {
  const __m512 lo = _mm512_set1_ps(-87.33f), hi = _mm512_set1_ps(88.0f);
  const __mmask16 under = _mm512_cmp_ps_mask(v.x, lo, _CMP_LT_OQ);
  __m512 x = _mm512_min_ps(hi, _mm512_max_ps(lo, v.x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // p * 2^n in one instruction (vscalefps; exact, like the AVX2 variant's multiply by a built 2^n, since
  // 2^n stays normal for n >= -126 after the clamp), zero below the range.
  return {_mm512_maskz_scalef_ps(static_cast<__mmask16>(~under), p, n)};
}
#elif LARA_AVX2
struct Vec {
  __m256 x;
  static constexpr int64_t W = 8;
  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static Vec bcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
  static Vec set1(float f) { return {_mm256_set1_ps(f)}; }
  void store(float* p) const { _mm256_storeu_ps(p, x); }
};
inline Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.x, b.x)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.x, b.x)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.x, b.x)}; }
inline Vec operator/(Vec a, Vec b) { return {_mm256_div_ps(a.x, b.x)}; }
inline Vec fmadd(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.x, b.x, c.x)}; }
inline Vec vmax(Vec a, Vec b) { return {_mm256_max_ps(a.x, b.x)}; }
inline float hsum(Vec a) { return hsum8(a.x); }
inline float hmax(Vec a) { return hmax8(a.x); }
// exp on 8 lanes: 2^n * e^r with n = round(x / ln 2), |r| <= ln2 / 2, degree-6 polynomial for e^r
// (Cephes expf coefficients), ~2 ulp. Below -87.33 (where 2^n leaves the normal range) the result is
// exactly 0, so -inf gives 0; NaN propagates (the operand order of max/min keeps it).
inline Vec vexp(Vec v) {
  const __m256 lo = _mm256_set1_ps(-87.33f), hi = _mm256_set1_ps(88.0f);
  const __m256 under = _mm256_cmp_ps(v.x, lo, _CMP_LT_OQ);
  __m256 x = _mm256_min_ps(hi, _mm256_max_ps(lo, v.x));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return {_mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)))};
}
#else
struct Vec {
  float x;
  static constexpr int64_t W = 1;
  static Vec load(const float* p) { return {*p}; }
  static Vec bcast(const float* p) { return {*p}; }
  static Vec set1(float f) { return {f}; }
  void store(float* p) const { *p = x; }
};
inline Vec operator+(Vec a, Vec b) { return {a.x + b.x}; }
inline Vec operator-(Vec a, Vec b) { return {a.x - b.x}; }
inline Vec operator*(Vec a, Vec b) { return {a.x * b.x}; }
inline Vec operator/(Vec a, Vec b) { return {a.x / b.x}; }
inline Vec fmadd(Vec a, Vec b, Vec c) { return {a.x * b.x + c.x}; }
inline Vec vmax(Vec a, Vec b) { return {std::max(a.x, b.x)}; }
inline float hsum(Vec a) { return a.x; }
inline float hmax(Vec a) { return a.x; }
inline Vec vexp(Vec v) { return {std::exp(v.x)}; }
#endif

#if LARA_AVX512
#define LARA_VREG __m512
#define LARA_VLOAD _mm512_loadu_ps
#define LARA_VZERO _mm512_setzero_ps
#define LARA_VBCAST(p) _mm512_set1_ps(*(p))
#define LARA_VFMA _mm512_fmadd_ps
#define LARA_VSTORE _mm512_storeu_ps
#elif LARA_AVX2
#define LARA_VREG __m256
#define LARA_VLOAD _mm256_loadu_ps
#define LARA_VZERO _mm256_setzero_ps
#define LARA_VBCAST _mm256_broadcast_ss
#define LARA_VFMA _mm256_fmadd_ps
#define LARA_VSTORE _mm256_storeu_ps
#endif

constexpr int64_t W = Vec::W;
// Vectors per micro-tile row: 16 columns (AVX2: 12 accumulators of 16 registers), 64 (AVX-512: 24 of 32,
// so each broadcast of A feeds 4 FMAs and the loop is not bound by instruction issue).
constexpr int NV_WIDE = W == 1 ? 16 : (W == 16 ? 4 : 2);

// -- GEMM: C[M, Nc] (+)= A[M, K] B[K, Nc]; A(i, k) = A[i*sa + k*sk] (broadcast), B(k, j) = B[k*ldb + j] --
// Every C element is one FMA chain over k in order, whatever the tile shape it falls in: the bits of a
// row do not depend on how many rows the call has (needed for batch invariance).
template <int MR, int NV>
inline void micro(int64_t K, const float* A, int64_t sa, int64_t sk, const float* B, int64_t ldb, float* Cm,
                  int64_t ldc, bool acc) {
#if LARA_AVX2 || LARA_AVX512
  // Raw registers, fully unrolled: with the Vec wrapper GCC spilled the accumulators every iteration.
  LARA_VREG c[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) c[i][j] = acc ? LARA_VLOAD(Cm + i * ldc + j * W) : LARA_VZERO();
  for (int64_t kk = 0; kk < K; ++kk) {
    LARA_VREG b[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) b[j] = LARA_VLOAD(B + kk * ldb + j * W);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const LARA_VREG a = LARA_VBCAST(A + i * sa + kk * sk);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) c[i][j] = LARA_VFMA(a, b[j], c[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) LARA_VSTORE(Cm + i * ldc + j * W, c[i][j]);
#else
  float c[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) c[i][j] = acc ? Cm[i * ldc + j] : 0.f;
  for (int64_t kk = 0; kk < K; ++kk)
    for (int i = 0; i < MR; ++i) {
      const float a = A[i * sa + kk * sk];
      for (int j = 0; j < NV; ++j) c[i][j] += a * B[kk * ldb + j];
    }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) Cm[i * ldc + j] = c[i][j];
#endif
}

template <int NV>
inline void panel(int64_t M, int64_t K, const float* A, int64_t sa, int64_t sk, const float* B, int64_t ldb,
                  float* Cm, int64_t ldc, bool acc) {
  int64_t i = 0;
  for (; i + 6 <= M; i += 6) micro<6, NV>(K, A + i * sa, sa, sk, B, ldb, Cm + i * ldc, ldc, acc);
  const float* a = A + i * sa;
  float* c = Cm + i * ldc;
  switch (M - i) {
    case 5: micro<5, NV>(K, a, sa, sk, B, ldb, c, ldc, acc); break;
    case 4: micro<4, NV>(K, a, sa, sk, B, ldb, c, ldc, acc); break;
    case 3: micro<3, NV>(K, a, sa, sk, B, ldb, c, ldc, acc); break;
    case 2: micro<2, NV>(K, a, sa, sk, B, ldb, c, ldc, acc); break;
    case 1: micro<1, NV>(K, a, sa, sk, B, ldb, c, ldc, acc); break;
    default: break;
  }
}

inline void gemm(int64_t M, int64_t Nc, int64_t K, const float* A, int64_t sa, int64_t sk, const float* B,
                 int64_t ldb, float* Cm, int64_t ldc, bool acc) {
  int64_t j = 0;
  for (; j + NV_WIDE * W <= Nc; j += NV_WIDE * W) panel<NV_WIDE>(M, K, A, sa, sk, B + j, ldb, Cm + j, ldc, acc);
  if constexpr (NV_WIDE > 2)
    for (; j + 2 * W <= Nc; j += 2 * W) panel<2>(M, K, A, sa, sk, B + j, ldb, Cm + j, ldc, acc);
  for (; j + W <= Nc; j += W) panel<1>(M, K, A, sa, sk, B + j, ldb, Cm + j, ldc, acc);
  for (; j < Nc; ++j)  // columns left when Nc is not a multiple of the vector width
    for (int64_t i = 0; i < M; ++i) {
      float s = acc ? Cm[i * ldc + j] : 0.f;
      for (int64_t kk = 0; kk < K; ++kk) s += A[i * sa + kk * sk] * B[kk * ldb + j];
      Cm[i * ldc + j] = s;
    }
}

// -- sizes and buffers shared by the phases --
struct Plan {
  const Args& a;
  int64_t Cp;                              // C rounded up to the vector width; extra columns are inert
  float scale;                             // 1 / sqrt(D)
  std::vector<std::vector<int64_t>> idx;   // per batch: valid positions in order (empty when no mask)
  std::vector<int64_t> len;                // per batch: number of valid positions
  std::vector<float> head;                 // per (b, h): HEAD_FLOATS floats, layout in head_*()
  std::vector<float> part;                 // per key chunk: F [Cp, D], m, s, rm, rs [Cp]
  int64_t head_floats, part_floats;

  explicit Plan(const Args& args) : a(args) {
    Cp = (a.C + W - 1) / W * W;
    scale = 1.0f / std::sqrt(static_cast<float>(a.D));
    head_floats = 2 * Cp * a.D + Cp * a.D + 4 * Cp;
    part_floats = Cp * a.D + 4 * Cp;
    idx.resize(a.B);
    len.assign(a.B, a.N);
    if (a.mask)
      for (int64_t b = 0; b < a.B; ++b) {
        for (int64_t n = 0; n < a.N; ++n)
          if (!a.mask[b * a.N + n]) idx[b].push_back(n);
        len[b] = static_cast<int64_t>(idx[b].size());
      }
    head.assign(a.B * a.H * head_floats, 0.f);
  }
  // Head buffer: P [D, 2Cp] (scale * w^T | scale * q~^T), F [Cp, D], bh, own/bias, rlse, spare [Cp].
  float* P(int64_t bh) { return head.data() + bh * head_floats; }
  float* F(int64_t bh) { return P(bh) + 2 * Cp * a.D; }
  float* bhv(int64_t bh) { return F(bh) + Cp * a.D; }
  float* bias(int64_t bh) { return bhv(bh) + Cp; }  // holds log g_c(w_c) until phase 2
  float* rlse(int64_t bh) { return bias(bh) + Cp; }
  int64_t chunks(int64_t b) const { return (len[b] + KEY_CHUNK - 1) / KEY_CHUNK; }

  // Rows [t0, t0 + nb) of the compacted document (x: row 0 of one (b, h), rows ld apart): a pointer
  // into x when the rows are consecutive positions, else gathered into buf (rows D apart).
  struct Rows {
    const float* p;
    int64_t ld;
  };
  Rows rows(const float* x, int64_t ld, int64_t b, int64_t t0, int64_t nb, float* buf) const {
    if (!a.mask) return {x + t0 * ld, ld};
    const int64_t* id = idx[b].data() + t0;
    if (id[nb - 1] - id[0] == nb - 1) return {x + id[0] * ld, ld};
    for (int64_t r = 0; r < nb; ++r) std::memcpy(buf + r * a.D, x + id[r] * ld, a.D * sizeof(float));
    return {buf, a.D};
  }
  int64_t pos(int64_t b, int64_t t) const { return a.mask ? idx[b][t] : t; }
};

// -- phase 0: samples, GEMM operand, balance heuristic --
inline void prepare_head(Plan& pl, int64_t b, int64_t h) {
  const Args& a = pl.a;
  const int64_t D = a.D, C = a.C, Cp = pl.Cp, bh = b * a.H + h;
  const float* ql = a.ql + bh * C * D;
  const float* kl = a.kl + bh * C * D;
  const float* nz = a.noise ? a.noise + b * a.noise_bstride + h * C * D : nullptr;
  // w [C, D] row-major, mu^T [D, Cp], lmu [C, Cp]: float32, as the reference computes them in fp32
  std::vector<float> w(C * D), mut(D * Cp, 0.f), mu_sq(Cp, 0.f), lmu(C * Cp);
  float* P = pl.P(bh);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t d = 0; d < D; ++d) {
      const float mu = ql[c * D + d] + kl[c * D + d];
      w[c * D + d] = nz ? mu + nz[c * D + d] : mu;
      mut[d * Cp + c] = mu;
      mu_sq[c] += mu * mu;
      P[d * 2 * Cp + c] = pl.scale * w[c * D + d];
      P[d * 2 * Cp + Cp + c] = pl.scale * ql[c * D + d];
    }
  // log g_c'(w_c) up to a constant shared by all c': scale * w_c . mu_c' - scale/2 * |mu_c'|^2
  gemm(C, Cp, D, w.data(), D, 1, mut.data(), Cp, lmu.data(), Cp, false);
  for (int64_t c = 0; c < C; ++c) {
    float* row = lmu.data() + c * Cp;
    double mx = -INFINITY;
    for (int64_t c2 = 0; c2 < C; ++c2) {
      row[c2] = pl.scale * row[c2] - 0.5f * pl.scale * mu_sq[c2];
      mx = std::max(mx, static_cast<double>(row[c2]));
    }
    double s = 0.0;  // C exps per sample: double costs nothing here and keeps BH accurate
    for (int64_t c2 = 0; c2 < C; ++c2) s += std::exp(row[c2] - mx);
    pl.bhv(bh)[c] = static_cast<float>(std::exp(row[c] - mx - std::log(s)));
    pl.bias(bh)[c] = row[c];
  }
}

// Online softmax update over one tile S [nb, Cp] per column (plus a per-row offset off[j] when off is
// given): running max m, running sum s; the rescale factor of earlier tiles goes to corr. With keep_p,
// exp(S + off - m_new) replaces S (needed for F). One column block at a time, so its running sum stays in
// a register; each column still sums its rows in order j = 0, 1, ... (the bits do not depend on nb).
inline void online_update(float* S, const float* off, int64_t nb, int64_t Cp, float* m, float* s, float* corr,
                          bool keep_p) {
  for (int64_t c = 0; c < Cp; c += W) {
    Vec bm = Vec::set1(-INF);
    if (off)
      for (int64_t j = 0; j < nb; ++j) bm = vmax(bm, Vec::load(S + j * Cp + c) + Vec::set1(off[j]));
    else
      for (int64_t j = 0; j < nb; ++j) bm = vmax(bm, Vec::load(S + j * Cp + c));
    const Vec m_old = Vec::load(m + c), m_new = vmax(m_old, bm);
    m_new.store(m + c);
    const Vec cr = vexp(m_old - m_new);  // m_old = -inf on the first tile: factor 0
    cr.store(corr + c);
    Vec t = Vec::set1(0.f);
    for (int64_t j = 0; j < nb; ++j) {
      Vec x = Vec::load(S + j * Cp + c);
      if (off) x = x + Vec::set1(off[j]);
      const Vec p = vexp(x - m_new);
      if (keep_p) p.store(S + j * Cp + c);
      t = t + p;
    }
    fmadd(Vec::load(s + c), cr, t).store(s + c);
  }
}

// -- phase 1: one key chunk of one (batch, head) --
inline void key_chunk(Plan& pl, int64_t b, int64_t h, int64_t chunk, float* part, float* scratch) {
  const Args& a = pl.a;
  const int64_t D = a.D, Cp = pl.Cp, bh = b * a.H + h, T = KEY_TILE;
  const float* kx = a.k + b * a.ks[0] + h * a.ks[1];
  const float* vx = a.v + b * a.vs[0] + h * a.vs[1];
  const float* qx = a.q + b * a.qs[0] + h * a.qs[1];
  const float* P = pl.P(bh);
  float *F = part, *m = F + Cp * D, *s = m + Cp, *rm = s + Cp, *rs = rm + Cp;
  float *S = scratch, *R = S + T * Cp, *kb = R + T * Cp, *vb = kb + T * D, *qb = vb + T * D;
  float *koff = qb + T * D, *corr = koff + T;
  std::fill(F, F + Cp * D, 0.f);
  std::fill(m, m + Cp, -INF);
  std::fill(s, s + Cp, 0.f);
  std::fill(rm, rm + Cp, -INF);
  std::fill(rs, rs + Cp, 0.f);
  const int64_t t_end = std::min(pl.len[b], (chunk + 1) * KEY_CHUNK);
  for (int64_t t0 = chunk * KEY_CHUNK; t0 < t_end; t0 += T) {
    const int64_t nb = std::min(T, t_end - t0);
    const Plan::Rows kt = pl.rows(kx, a.ks[2], b, t0, nb, kb);
    const Plan::Rows vt = pl.rows(vx, a.vs[2], b, t0, nb, vb);
    const Plan::Rows qt = pl.rows(qx, a.qs[2], b, t0, nb, qb);
    // -- key logits log xi(k_j, w_c) = scale w_c . k_j - scale/2 |k_j|^2, S [nb, Cp] --
    gemm(nb, Cp, D, kt.p, kt.ld, 1, P, 2 * Cp, S, Cp, false);
    for (int64_t j = 0; j < nb; ++j) {  // the -scale/2 |k_j|^2 term, added inside online_update
      const float* kj = kt.p + j * kt.ld;
      Vec acc2 = Vec::set1(0.f);
      int64_t d = 0;
      for (; d + W <= D; d += W) acc2 = fmadd(Vec::load(kj + d), Vec::load(kj + d), acc2);
      float sq = hsum(acc2);
      for (; d < D; ++d) sq += kj[d] * kj[d];
      koff[j] = -0.5f * pl.scale * sq;
    }
    online_update(S, koff, nb, Cp, m, s, corr, true);
    // -- F_c <- F_c * corr_c + sum_j p_jc v_j --
    for (int64_t c = 0; c < a.C; ++c) {
      const Vec f = Vec::set1(corr[c]);
      int64_t d = 0;
      for (; d + W <= D; d += W) (Vec::load(F + c * D + d) * f).store(F + c * D + d);
      for (; d < D; ++d) F[c * D + d] *= corr[c];
    }
    gemm(a.C, D, nb, S, 1, Cp, vt.p, vt.ld, F, D, true);
    // -- rho's normalizer: running logsumexp over queries of scale q~_c . q_n --
    gemm(nb, Cp, D, qt.p, qt.ld, 1, P + Cp, 2 * Cp, R, Cp, false);
    online_update(R, nullptr, nb, Cp, rm, rs, corr, false);  // only the sums are needed
  }
}

// -- phase 2: combine the chunks of one (batch, head) in chunk order --
inline void combine(Plan& pl, int64_t b, int64_t h, const float* parts, int64_t nck) {
  const int64_t D = pl.a.D, C = pl.a.C, Cp = pl.Cp, bh = b * pl.a.H + h;
  float *F = pl.F(bh), *bias = pl.bias(bh), *rlse = pl.rlse(bh);
  for (int64_t c = 0; c < C; ++c) {
    double mk = -INFINITY, mr = -INFINITY, sk = 0.0, sr = 0.0;
    for (int64_t i = 0; i < nck; ++i) {
      const float* p = parts + i * pl.part_floats + Cp * D;
      mk = std::max(mk, static_cast<double>(p[c]));
      mr = std::max(mr, static_cast<double>(p[2 * Cp + c]));
    }
    std::vector<double> f(D, 0.0);
    for (int64_t i = 0; i < nck; ++i) {
      const float* part = parts + i * pl.part_floats;
      const float* p = part + Cp * D;
      const double wk = std::exp(p[c] - mk);
      sk += p[Cp + c] * wk;
      sr += p[3 * Cp + c] * std::exp(p[2 * Cp + c] - mr);
      for (int64_t d = 0; d < D; ++d) f[d] += part[c * D + d] * wk;
    }
    for (int64_t d = 0; d < D; ++d) F[c * D + d] = static_cast<float>(f[d] / sk);
    bias[c] = static_cast<float>(mk + std::log(sk) - bias[c]);  // lse_c - log g_c(w_c)
    rlse[c] = static_cast<float>(mr + std::log(sr));
  }
  // Inert padded columns: rho = exp(-inf) = 0 and logit = -inf, so they carry no weight.
  for (int64_t c = C; c < Cp; ++c) {
    bias[c] = -INF;
    rlse[c] = INF;
  }
}

// -- phase 3: one block of queries of one (batch, head) --
inline void query_block(Plan& pl, int64_t b, int64_t h, int64_t t_begin, float* scratch) {
  const Args& a = pl.a;
  const int64_t D = a.D, C = a.C, Cp = pl.Cp, bh = b * a.H + h, T = QUERY_TILE;
  const float* qx = a.q + b * a.qs[0] + h * a.qs[1];
  float* ox = a.out + bh * a.N * D;
  const float *P = pl.P(bh), *F = pl.F(bh), *bhv = pl.bhv(bh), *bias = pl.bias(bh), *rlse = pl.rlse(bh);
  float *L = scratch, *E = L + T * 2 * Cp, *qb = E + T * Cp, *ob = qb + T * D, *tot = ob + T * D;
  const Vec lam = Vec::set1(a.alpha_coeff), floor_ = Vec::set1(ALPHA_FLOOR);
  const Vec inv_c = Vec::set1(1.0f / static_cast<float>(C));
  const int64_t t_end = std::min(pl.len[b], t_begin + QUERY_TASK);
  for (int64_t t0 = t_begin; t0 < t_end; t0 += T) {
    const int64_t nb = std::min(T, t_end - t0);
    const Plan::Rows qt = pl.rows(qx, a.qs[2], b, t0, nb, qb);
    // -- [log xi(q_n, w_c) (without the -|q|^2/2 term, constant over c) | q~_c . q_n] * scale --
    gemm(nb, 2 * Cp, D, qt.p, qt.ld, 1, P, 2 * Cp, L, 2 * Cp, false);
    for (int64_t n = 0; n < nb; ++n) {
      float *lq = L + n * 2 * Cp, *lr = lq + Cp, *e = E + n * Cp;
      Vec rsum = Vec::set1(0.f), lmax = Vec::set1(-INF);
      for (int64_t c = 0; c < Cp; c += W) {
        const Vec rho = vexp(Vec::load(lr + c) - Vec::load(rlse + c));  // softmax over queries
        rho.store(lr + c);
        rsum = rsum + rho;
        const Vec logit = Vec::load(lq + c) + Vec::load(bias + c);  // log r_nc up to a constant
        logit.store(lq + c);
        lmax = vmax(lmax, logit);
      }
      const Vec mean = Vec::set1(hsum(rsum)) * inv_c, mx = Vec::set1(hmax(lmax));
      Vec esum = Vec::set1(0.f);
      for (int64_t c = 0; c < Cp; c += W) {
        // mis-opt alpha = BH_c + lambda (rho_nc - mean_c' rho_nc'), clamped; SNIS weight alpha * r
        const Vec alpha = vmax(floor_, fmadd(lam, Vec::load(lr + c) - mean, Vec::load(bhv + c)));
        const Vec ev = vexp(Vec::load(lq + c) - mx) * alpha;
        ev.store(e + c);
        esum = esum + ev;
      }
      tot[n] = hsum(esum);
    }
    // -- out_n = sum_c e_nc F_c / sum_c e_nc --
    const bool direct = !a.mask || (pl.pos(b, t0 + nb - 1) - pl.pos(b, t0) == nb - 1);
    float* o = direct ? ox + pl.pos(b, t0) * D : ob;
    gemm(nb, D, C, E, Cp, 1, F, D, o, D, false);
    for (int64_t n = 0; n < nb; ++n) {
      const Vec t = Vec::set1(tot[n]);
      int64_t d = 0;
      for (; d + W <= D; d += W) (Vec::load(o + n * D + d) / t).store(o + n * D + d);
      for (; d < D; ++d) o[n * D + d] /= tot[n];
    }
    if (!direct)
      for (int64_t n = 0; n < nb; ++n) std::memcpy(ox + pl.pos(b, t0 + n) * D, ob + n * D, D * sizeof(float));
  }
}

// Padded query rows (and every row of an all-padding document) are zero.
inline void zero_padded(const Plan& pl, int64_t b, int64_t h) {
  const Args& a = pl.a;
  float* ox = a.out + (b * a.H + h) * a.N * a.D;
  for (int64_t n = 0; n < a.N; ++n)
    if (a.mask[b * a.N + n]) std::fill(ox + n * a.D, ox + (n + 1) * a.D, 0.f);
}

// Runs fn(data, i) for i in [0, total), in any order and on any threads (a runner from the caller, e.g.
// onnxruntime's intra-op pool); every task writes its own slots, so the order changes no result.
using ParallelFor = void (*)(void* runner, void (*fn)(void*, size_t), size_t total, void* data);

// Per-thread scratch for the runner path (OpenMP's path gives each thread its own vector instead).
inline float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(floats);
  return scratch.data();
}

template <class F>
void run_tasks(ParallelFor par, void* runner, int64_t total, F& f) {
  if (total <= 0) return;
  par(runner, [](void* d, size_t i) { (*static_cast<F*>(d))(static_cast<int64_t>(i)); }, static_cast<size_t>(total), &f);
}

// The four phases of the header comment. With `par` null they run under OpenMP with num_threads
// threads; otherwise each phase is handed to `par`. Same tasks, same per-task arithmetic, fixed combine
// order: both paths give the same bits.
inline int forward(const Args& a, int num_threads, ParallelFor par = nullptr, void* runner = nullptr) {
  Plan pl(a);
  const int64_t BH = a.B * a.H, Cp = pl.Cp, D = a.D;
  struct Task { int64_t b, h, i, slot; };
  std::vector<Task> keys, queries;
  // first_slot[bh]: the first key chunk (task and partial-result slot) of (b, h); first_query likewise.
  std::vector<int64_t> first_slot(BH + 1, 0), first_query(BH + 1, 0);
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t bh = b * a.H + h;
      first_slot[bh + 1] = first_slot[bh] + pl.chunks(b);
      for (int64_t i = 0; i < pl.chunks(b); ++i) keys.push_back({b, h, i, first_slot[bh] + i});
      for (int64_t t = 0; t < pl.len[b]; t += QUERY_TASK) queries.push_back({b, h, t, 0});
      first_query[bh + 1] = static_cast<int64_t>(queries.size());
    }
  pl.part.assign(first_slot[BH] * pl.part_floats, 0.f);
  const int64_t key_scratch = 2 * KEY_TILE * Cp + 3 * KEY_TILE * D + KEY_TILE + Cp;
  const int64_t query_scratch = QUERY_TILE * 3 * Cp + 2 * QUERY_TILE * D + QUERY_TILE;
  const int64_t scratch_floats = std::max(key_scratch, query_scratch);
  // Heads run in groups whose q, k, v and out fit HEAD_GROUP_BYTES, all four phases per group: phase 3
  // re-reads q, and with every head's phase 1 first (the whole input, 96 MiB at N = 32K, H = 4, D = 64)
  // that re-read came from DRAM once the input outgrew the last-level cache. Short inputs still put all
  // heads in one group (full parallelism). The grouping changes no task's arithmetic: same bits.
  const int64_t head_bytes = 4 * a.N * D * static_cast<int64_t>(sizeof(float));
  const int64_t group = std::max<int64_t>(1, HEAD_GROUP_BYTES / std::max<int64_t>(head_bytes, 1));

  int64_t g0 = 0, g1 = 0;  // the current group's heads [g0, g1)
  auto prepare = [&](int64_t j) {
    const int64_t bh = g0 + j;
    prepare_head(pl, bh / a.H, bh % a.H);
    if (a.mask) zero_padded(pl, bh / a.H, bh % a.H);
  };
  auto key = [&](int64_t j, float* scratch) {
    const Task& t = keys[first_slot[g0] + j];
    key_chunk(pl, t.b, t.h, t.i, pl.part.data() + t.slot * pl.part_floats, scratch);
  };
  auto merge = [&](int64_t j) {
    const int64_t bh = g0 + j;
    if (pl.len[bh / a.H] > 0)
      combine(pl, bh / a.H, bh % a.H, pl.part.data() + first_slot[bh] * pl.part_floats,
              first_slot[bh + 1] - first_slot[bh]);
  };
  // Last key chunks first: their query rows were the last streamed by phase 1 and are the likeliest
  // still in cache. The order does not change any result.
  auto query = [&](int64_t j, float* scratch) {
    const Task& t = queries[first_query[g1] - 1 - j];
    query_block(pl, t.b, t.h, t.i, scratch);
  };

  if (par != nullptr) {
    auto key_task = [&](int64_t j) { key(j, thread_scratch(scratch_floats)); };
    auto query_task = [&](int64_t j) { query(j, thread_scratch(scratch_floats)); };
    for (g0 = 0; g0 < BH; g0 = g1) {
      g1 = std::min(BH, g0 + group);
      run_tasks(par, runner, g1 - g0, prepare);
      run_tasks(par, runner, first_slot[g1] - first_slot[g0], key_task);
      run_tasks(par, runner, g1 - g0, merge);
      run_tasks(par, runner, first_query[g1] - first_query[g0], query_task);
    }
    return 0;
  }

  for (g0 = 0; g0 < BH; g0 = g1) {
    g1 = std::min(BH, g0 + group);
    const int64_t nh = g1 - g0, nk = first_slot[g1] - first_slot[g0], nq = first_query[g1] - first_query[g0];
#pragma omp parallel num_threads(num_threads)
    {
      std::vector<float> scratch(scratch_floats);
#pragma omp for schedule(dynamic, 1)
      for (int64_t j = 0; j < nh; ++j) prepare(j);
#pragma omp for schedule(dynamic, 1)
      for (int64_t j = 0; j < nk; ++j) key(j, scratch.data());
#pragma omp for schedule(dynamic, 1)
      for (int64_t j = 0; j < nh; ++j) merge(j);
#pragma omp for schedule(dynamic, 1)
      for (int64_t j = 0; j < nq; ++j) query(j, scratch.data());
    }
  }
  return 0;
}

}  // namespace LARA_NS
}  // namespace lara

#undef LARA_VREG
#undef LARA_VLOAD
#undef LARA_VZERO
#undef LARA_VBCAST
#undef LARA_VFMA
#undef LARA_VSTORE
