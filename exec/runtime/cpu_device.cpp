// The CPU device: Eigen, fp32, single-threaded (one MPI rank per core). This is the only
// translation unit of ptdp that includes Eigen, so it alone may be built with -march=native.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <unordered_map>
#include <vector>

#include <Eigen/Core>

#include "core/error.hpp"
#include "exec/runtime/device.hpp"
#include "exec/runtime/elementwise_math.hpp"

namespace ptdp::exec {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using MatMap = Eigen::Map<RowMat, Eigen::Unaligned, Stride>;
using ConstMatMap = Eigen::Map<const RowMat, Eigen::Unaligned, Stride>;
using ArrMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrMap = Eigen::Map<const Eigen::ArrayXf>;


template <class A, class B>
void product_into(float alpha, const A& a, const B& b, float beta, MatMap& c) {
  if (beta == 0.0f) {
    c.noalias() = alpha * a * b;
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * a * b;
  }
}

// Causal softmax of each row of a seq×seq score matrix, in place; entries above the diagonal → 0.
void causal_softmax_rows(MatMap& p, int seq) {
  for (int i = 0; i < seq; ++i) {
    auto row = p.row(i);
    auto seg = row.head(i + 1).array();
    const float mx = seg.maxCoeff();
    seg = (seg - mx).exp();
    seg *= 1.0f / seg.sum();
    if (i + 1 < seq) row.tail(seq - i - 1).setZero();
  }
}

// 64-byte aligned scratch, like every pooled buffer: Eigen peels unaligned heads of vectorised
// loops into scalar code (a different exp()), so results must not depend on where scratch lives.
class AlignedScratch {
 public:
  float* get(size_t count) {
    if (count > capacity_) {
      data_.reset(static_cast<float*>(std::aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64)));
      if (!data_) throw EnvironmentError("cpu device: out of memory for attention scratch");
      capacity_ = count;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t capacity_ = 0;
};

// An operand rounded to the GEMM's input precision: bf16 (round to nearest even on the upper 16
// bits; NaN kept) or fp16 (Eigen::half: round to nearest even, overflow to ±inf, subnormals).
// Products of two bf16 or fp16 values are exact in fp32, so an fp32 GEMM of rounded operands is
// the tensor cores' bf16/fp16 multiply with fp32 accumulation.
float round_operand(float x, GemmOperands p) {
  if (p == GemmOperands::FP16) return static_cast<float>(Eigen::half(x));
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(GemmOperands operands) : operands_(operands) {}
  ~CpuDevice() override {
    for (auto& [count, blocks] : free_)
      for (float* p : blocks) std::free(p);
  }

  std::string_view name() const override { return "cpu"; }

  // A caching allocator: released blocks are kept by size class and handed out again (no page
  // faults, no zeroing by the kernel). Most shapes repeat every microbatch; the experts' do not
  // (the rows a rank receives follow the routing), so a block's size is the count rounded up to
  // an eighth of its power of two, as PyTorch's caching allocator rounds its blocks: rows that
  // change by a few percent reuse the same blocks. (Kept by exact size, the validate suite's MoE
  // row, ep 2, grew by 13 MB and 3100 page faults per rank and step, new blocks for each new row
  // count; its forward took 17-18 % more CPU time than with these classes, 0.7 MB and 200 faults
  // per step: docs/ACCURACY.md, 2026-11-29.)
  static size_t block_floats(size_t count) {
    if (count <= 1024) return (count + 15) / 16 * 16;
    const size_t step = std::bit_floor(count) / 8;
    return (count + step - 1) / step * step;
  }
  float* allocate(size_t count) override {
    if (count == 0) count = 1;
    in_use_ += count * sizeof(float);
    peak_ = std::max(peak_, in_use_);
    const size_t block = block_floats(count);
    auto it = free_.find(block);
    if (it != free_.end() && !it->second.empty()) {
      float* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    const size_t bytes = block * sizeof(float);
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      in_use_ -= count * sizeof(float);
      throw EnvironmentError("cpu device: out of memory allocating " + std::to_string(bytes) + " bytes");
    }
    return static_cast<float*>(p);
  }
  void release(float* ptr, size_t count) noexcept override {
    if (ptr == nullptr) return;
    if (count == 0) count = 1;
    in_use_ -= count * sizeof(float);
    try {
      free_[block_floats(count)].push_back(ptr);
    } catch (...) {
      std::free(ptr);
    }
  }
  size_t bytes_in_use() const override { return in_use_; }
  size_t peak_bytes() const override { return peak_; }
  void upload(const float* host, float* dst, size_t count) override { std::memcpy(dst, host, count * sizeof(float)); }
  void download(const float* src, float* host, size_t count) override { std::memcpy(host, src, count * sizeof(float)); }
  void copy(const float* src, float* dst, size_t count) override {
    if (src != dst) std::memmove(dst, src, count * sizeof(float));
  }
  void fill(float* dst, size_t count, float value) override { std::fill(dst, dst + count, value); }
  void synchronize() override {}

  void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
            float beta, float* c, int ldc) override {
    if (m <= 0 || n <= 0) return;
    MatMap C(c, m, n, Stride(ldc));
    if (k <= 0) {
      if (beta == 0.0f) C.setZero();
      else C *= beta;
      return;
    }
    const bool at = ta == Trans::Yes, bt = tb == Trans::Yes;
    if (operands_ != GemmOperands::FP32) {
      // bf16 / fp16 operands: rounded copies (contiguous), then the fp32 product.
      const int ar = at ? k : m, ac = at ? m : k, br = bt ? n : k, bc = bt ? k : n;
      float* ra = rounded_a_.get(static_cast<size_t>(ar) * ac);
      float* rb = rounded_b_.get(static_cast<size_t>(br) * bc);
      for (int r = 0; r < ar; ++r)
        for (int c = 0; c < ac; ++c) ra[static_cast<size_t>(r) * ac + c] = round_operand(a[static_cast<size_t>(r) * lda + c], operands_);
      for (int r = 0; r < br; ++r)
        for (int c = 0; c < bc; ++c) rb[static_cast<size_t>(r) * bc + c] = round_operand(b[static_cast<size_t>(r) * ldb + c], operands_);
      a = ra;
      b = rb;
      lda = ac;
      ldb = bc;
    }
    ConstMatMap A(a, at ? k : m, at ? m : k, Stride(lda));
    ConstMatMap B(b, bt ? n : k, bt ? k : n, Stride(ldb));
    if (!at && !bt) product_into(alpha, A, B, beta, C);
    else if (at && !bt) product_into(alpha, A.transpose(), B, beta, C);
    else if (!at && bt) product_into(alpha, A, B.transpose(), beta, C);
    else product_into(alpha, A.transpose(), B.transpose(), beta, C);
  }
  GemmOperands gemm_operands() const override { return operands_; }
  void set_gemm_operands(GemmOperands operands) override { operands_ = operands; }
  void dropout(int rows, int cols, const uint64_t* row_keys_host, float rate, float* x) override {
    const float keep_scale = 1.0f / (1.0f - rate);
    for (int r = 0; r < rows; ++r) {
      float* row = x + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) row[c] = math::dropout_keep(row_keys_host[r], c, rate) ? row[c] * keep_scale : 0.0f;
    }
  }
  // Host memory: the cast runs in place of the copies.
  float fp8_cast(const Fp8Cast& cast, const float* src, float* dst) override { return fp8_cast_host(cast, src, dst); }
  void axpy(size_t n, float alpha, const float* x, float* y) override {
    ArrMap(y, static_cast<Eigen::Index>(n)) += alpha * ConstArrMap(x, static_cast<Eigen::Index>(n));
  }
  void scale(size_t n, float alpha, float* x) override { ArrMap(x, static_cast<Eigen::Index>(n)) *= alpha; }
  double sum_squares(size_t n, const float* x) override {
    // Blocks of float sums, accumulated in double: accurate and vectorised.
    double total = 0;
    constexpr size_t kBlock = 4096;
    for (size_t i = 0; i < n; i += kBlock) {
      const size_t len = std::min(kBlock, n - i);
      total += static_cast<double>(ConstArrMap(x + i, static_cast<Eigen::Index>(len)).square().sum());
    }
    return total;
  }

  void add_bias(int rows, int cols, const float* bias, float* y) override {
    if (bias == nullptr) return;  // no biases (model.bias false)
    MatMap Y(y, rows, cols, Stride(cols));
    Eigen::Map<const Eigen::RowVectorXf> b(bias, cols);
    Y.rowwise() += b;
  }
  void add_bias_grad(int rows, int cols, const float* dy, float* dbias) override {
    if (dbias == nullptr) return;
    ConstMatMap D(dy, rows, cols, Stride(cols));
    Eigen::Map<Eigen::RowVectorXf> db(dbias, cols);
    db += D.colwise().sum();
  }
  void layer_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, const float* beta, float* y,
                          float* mean, float* rstd) override {
    ConstArrMap g(gamma, cols), b(beta, cols);
    for (int r = 0; r < rows; ++r) {
      ConstArrMap xr(x + static_cast<size_t>(r) * cols, cols);
      ArrMap yr(y + static_cast<size_t>(r) * cols, cols);
      const float mu = xr.mean();
      const float var = (xr - mu).square().mean();
      const float rs = math::layer_norm_rstd(var, eps);
      yr = (xr - mu) * rs * g + b;
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
  void layer_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma, const float* mean,
                           const float* rstd, float* dx, float* dgamma, float* dbeta) override {
    norm_backward(rows, cols, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  }
  void rms_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, float* y,
                        float* rstd) override {
    ConstArrMap g(gamma, cols);
    for (int r = 0; r < rows; ++r) {
      ConstArrMap xr(x + static_cast<size_t>(r) * cols, cols);
      ArrMap yr(y + static_cast<size_t>(r) * cols, cols);
      const float rs = math::layer_norm_rstd(xr.square().mean(), eps);
      yr = xr * rs * g;
      rstd[r] = rs;
    }
  }
  void rms_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma, const float* rstd,
                         float* dx, float* dgamma) override {
    norm_backward(rows, cols, dy, x, gamma, nullptr, rstd, dx, dgamma, nullptr);
  }
  void swiglu_forward(size_t n, const float* gate, const float* up, float* y) override {
    for (size_t i = 0; i < n; ++i) y[i] = math::swiglu(gate[i], up[i]);
  }
  void swiglu_backward(size_t n, const float* gate, const float* up, const float* dy, float* dgate, float* dup) override {
    for (size_t i = 0; i < n; ++i) {
      const float g = gate[i], u = up[i], d = dy[i];
      dgate[i] = math::swiglu_dgate(g, u, d);
      dup[i] = math::swiglu_dup(g, d);
    }
  }
  // Element-wise formulas come from exec/runtime/elementwise_math.hpp, shared with the CUDA kernels.
  void gelu_forward(size_t n, const float* x, float* y) override {
    for (size_t i = 0; i < n; ++i) y[i] = math::gelu(x[i]);
  }
  void gelu_backward(size_t n, const float* x, const float* dy, float* dx) override {
    for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * math::gelu_grad(x[i]);
  }

  void attention_forward(const AttentionShape& sh, const float* qkv, float* probs, float* ctx) override {
    const int s = sh.seq, hd = sh.head_dim;
    const int vd = sh.v_dim(), ld_qkv = sh.qkv_cols(), ld_ctx = sh.ctx_cols();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* scratch = scratch_.get(static_cast<size_t>(s) * s);
    for (int bi = 0; bi < sh.batch; ++bi) {
      for (int j = 0; j < sh.heads; ++j) {
        const float* base = qkv + static_cast<size_t>(bi) * s * ld_qkv;
        ConstMatMap Q(base + sh.q_col(j), s, hd, Stride(ld_qkv)), K(base + sh.k_col(j), s, hd, Stride(ld_qkv)),
            V(base + sh.v_col(j), s, vd, Stride(ld_qkv));
        float* pp = probs != nullptr ? probs + (static_cast<size_t>(bi) * sh.heads + j) * s * s : scratch;
        MatMap P(pp, s, s, Stride(s));
        P.noalias() = scale * Q * K.transpose();
        causal_softmax_rows(P, s);
        MatMap C(ctx + static_cast<size_t>(bi) * s * ld_ctx + static_cast<size_t>(j) * vd, s, vd, Stride(ld_ctx));
        C.noalias() = P.triangularView<Eigen::Lower>() * V;
      }
    }
  }
  // Flash attention, tiles of kFlashBlock queries × kFlashBlock keys; the only buffers are one
  // tile of scores and the running row statistics (no s×s tensor).
  static constexpr int kFlashBlock = 64;
  void flash_attention_forward(const AttentionShape& sh, const float* qkv, float* ctx, float* lse) override {
    const int s = sh.seq, hd = sh.head_dim, B = kFlashBlock;
    const int vd = sh.v_dim(), ld_qkv = sh.qkv_cols(), ld_ctx = sh.ctx_cols();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* tile = scratch_.get(static_cast<size_t>(B) * B);
    Eigen::VectorXf m(B), l(B);
    for (int bi = 0; bi < sh.batch; ++bi)
      for (int j = 0; j < sh.heads; ++j) {
        const float* base = qkv + static_cast<size_t>(bi) * s * ld_qkv;
        float* lse_row = lse + (static_cast<size_t>(bi) * sh.heads + j) * s;
        for (int q0 = 0; q0 < s; q0 += B) {
          const int nq = std::min(B, s - q0);
          ConstMatMap Q(base + static_cast<size_t>(q0) * ld_qkv + sh.q_col(j), nq, hd, Stride(ld_qkv));
          MatMap O(ctx + (static_cast<size_t>(bi) * s + q0) * ld_ctx + static_cast<size_t>(j) * vd, nq, vd, Stride(ld_ctx));
          O.setZero();
          m.head(nq).setConstant(-std::numeric_limits<float>::infinity());
          l.head(nq).setZero();
          for (int k0 = 0; k0 <= q0 + nq - 1; k0 += B) {  // causal: key blocks up to the diagonal
            const int nk = std::min(B, s - k0);
            ConstMatMap K(base + static_cast<size_t>(k0) * ld_qkv + sh.k_col(j), nk, hd, Stride(ld_qkv)),
                V(base + static_cast<size_t>(k0) * ld_qkv + sh.v_col(j), nk, vd, Stride(ld_qkv));
            MatMap S(tile, nq, nk, Stride(B));
            S.noalias() = scale * Q * K.transpose();
            for (int a = 0; a < nq; ++a) {
              const int visible = std::min(nk, q0 + a - k0 + 1);  // keys k ≤ query q
              if (visible <= 0) {
                S.row(a).setZero();
                continue;
              }
              const float row_max = S.row(a).head(visible).maxCoeff();
              const float m_new = std::max(m[a], row_max);
              const float rescale = std::exp(m[a] - m_new);  // 0 on the first block (m = −inf)
              S.row(a).head(visible) = (S.row(a).head(visible).array() - m_new).exp().matrix();
              if (visible < nk) S.row(a).tail(nk - visible).setZero();
              l[a] = l[a] * rescale + S.row(a).head(visible).sum();
              O.row(a) *= rescale;
              m[a] = m_new;
            }
            O.noalias() += S * V;
          }
          for (int a = 0; a < nq; ++a) {
            O.row(a) /= l[a];
            lse_row[q0 + a] = m[a] + std::log(l[a]);
          }
        }
      }
  }
  void flash_attention_backward(const AttentionShape& sh, const float* qkv, const float* ctx, const float* lse,
                                const float* dctx, float* dqkv) override {
    const int s = sh.seq, hd = sh.head_dim, r = sh.heads_per_group(), B = kFlashBlock;
    const int vd = sh.v_dim(), ld_qkv = sh.qkv_cols(), ld_ctx = sh.ctx_cols();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* tile = scratch_.get(static_cast<size_t>(B) * B);
    float* dtile = scratch2_.get(static_cast<size_t>(B) * B);
    Eigen::VectorXf D(s);
    for (int bi = 0; bi < sh.batch; ++bi)
      for (int j = 0; j < sh.heads; ++j) {
        const size_t off = static_cast<size_t>(bi) * s * ld_qkv;
        const float* lse_row = lse + (static_cast<size_t>(bi) * sh.heads + j) * s;
        ConstMatMap C(ctx + static_cast<size_t>(bi) * s * ld_ctx + static_cast<size_t>(j) * vd, s, vd, Stride(ld_ctx)),
            dC(dctx + static_cast<size_t>(bi) * s * ld_ctx + static_cast<size_t>(j) * vd, s, vd, Stride(ld_ctx));
        D = (C.array() * dC.array()).rowwise().sum().matrix();
        MatMap dQall(dqkv + off + sh.q_col(j), s, hd, Stride(ld_qkv));
        dQall.setZero();
        // The group's key and value gradients sum over its query heads (the first one zeroes them).
        if (j % r == 0) {
          MatMap(dqkv + off + sh.k_col(j), s, hd, Stride(ld_qkv)).setZero();
          MatMap(dqkv + off + sh.v_col(j), s, vd, Stride(ld_qkv)).setZero();
        }
        for (int k0 = 0; k0 < s; k0 += B) {
          const int nk = std::min(B, s - k0);
          ConstMatMap K(qkv + off + static_cast<size_t>(k0) * ld_qkv + sh.k_col(j), nk, hd, Stride(ld_qkv)),
              V(qkv + off + static_cast<size_t>(k0) * ld_qkv + sh.v_col(j), nk, vd, Stride(ld_qkv));
          MatMap dK(dqkv + off + static_cast<size_t>(k0) * ld_qkv + sh.k_col(j), nk, hd, Stride(ld_qkv)),
              dV(dqkv + off + static_cast<size_t>(k0) * ld_qkv + sh.v_col(j), nk, vd, Stride(ld_qkv));
          for (int q0 = (k0 / B) * B; q0 < s; q0 += B) {  // causal: query blocks from the diagonal on
            const int nq = std::min(B, s - q0);
            ConstMatMap Q(qkv + off + static_cast<size_t>(q0) * ld_qkv + sh.q_col(j), nq, hd, Stride(ld_qkv));
            MatMap P(tile, nq, nk, Stride(B)), dS(dtile, nq, nk, Stride(B));
            P.noalias() = scale * Q * K.transpose();
            for (int a = 0; a < nq; ++a) {
              const int visible = std::min(nk, q0 + a - k0 + 1);
              if (visible > 0) P.row(a).head(visible) = (P.row(a).head(visible).array() - lse_row[q0 + a]).exp().matrix();
              if (visible < nk) P.row(a).tail(nk - std::max(visible, 0)).setZero();
            }
            ConstMatMap dCq(dctx + (static_cast<size_t>(bi) * s + q0) * ld_ctx + static_cast<size_t>(j) * vd, nq, vd, Stride(ld_ctx));
            dV.noalias() += P.transpose() * dCq;
            dS.noalias() = dCq * V.transpose();  // dP
            for (int a = 0; a < nq; ++a) dS.row(a) = (P.row(a).array() * (dS.row(a).array() - D[q0 + a])).matrix() * scale;
            MatMap(dqkv + off + static_cast<size_t>(q0) * ld_qkv + sh.q_col(j), nq, hd, Stride(ld_qkv)).noalias() += dS * K;
            dK.noalias() += dS.transpose() * Q;
          }
        }
      }
  }
  // Ring attention blocks (context parallelism): the whole s×s score block at once (s is the
  // rank's share of the sequence), masked by the tokens' positions in the sequence.
  void attention_block_forward(const AttentionShape& sh, const float* qkv, const int32_t* q_pos, const float* kv,
                               const int32_t* k_pos, float* ctx, float* lse) override {
    const int s = sh.seq, hd = sh.head_dim;
    const int vd = sh.v_dim(), ld_qkv = sh.qkv_cols(), ld_ctx = sh.ctx_cols();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    MatMap S(scratch_.get(static_cast<size_t>(s) * s), s, s, Stride(s));
    Eigen::RowVectorXf o(vd);
    for (int bi = 0; bi < sh.batch; ++bi)
      for (int j = 0; j < sh.heads; ++j) {
        const size_t off = static_cast<size_t>(bi) * s * ld_qkv;
        ConstMatMap Q(qkv + off + sh.q_col(j), s, hd, Stride(ld_qkv)), K(kv + off + sh.k_col(j), s, hd, Stride(ld_qkv)),
            V(kv + off + sh.v_col(j), s, vd, Stride(ld_qkv));
        MatMap C(ctx + static_cast<size_t>(bi) * s * ld_ctx + static_cast<size_t>(j) * vd, s, vd, Stride(ld_ctx));
        float* lse_row = lse + (static_cast<size_t>(bi) * sh.heads + j) * s;
        S.noalias() = scale * Q * K.transpose();
        for (int a = 0; a < s; ++a) {
          float m = neg_inf;
          for (int k = 0; k < s; ++k)
            if (k_pos[k] <= q_pos[a]) m = std::max(m, S(a, k));
          if (m == neg_inf) continue;  // no visible key in this block
          float l = 0;
          o.setZero();
          for (int k = 0; k < s; ++k)
            if (k_pos[k] <= q_pos[a]) {
              const float e = std::exp(S(a, k) - m);
              l += e;
              o.noalias() += e * V.row(k);
            }
          const float block_lse = m + std::log(l);
          const float merged = lse_row[a] == neg_inf ? block_lse
                                                     : std::max(lse_row[a], block_lse) +
                                                           std::log1p(std::exp(-std::abs(lse_row[a] - block_lse)));
          const float keep = lse_row[a] == neg_inf ? 0.0f : std::exp(lse_row[a] - merged);
          C.row(a) = C.row(a) * keep + (o / l) * std::exp(block_lse - merged);
          lse_row[a] = merged;
        }
      }
  }
  void attention_block_backward(const AttentionShape& sh, const float* qkv, const int32_t* q_pos, const float* kv,
                                const int32_t* k_pos, const float* ctx, const float* lse, const float* dctx, float* dqkv,
                                float* dkv) override {
    const int s = sh.seq, hd = sh.head_dim;
    const int vd = sh.v_dim(), ld_qkv = sh.qkv_cols(), ld_ctx = sh.ctx_cols();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    MatMap P(scratch_.get(static_cast<size_t>(s) * s), s, s, Stride(s));
    MatMap dS(scratch2_.get(static_cast<size_t>(s) * s), s, s, Stride(s));
    Eigen::VectorXf D(s);
    for (int bi = 0; bi < sh.batch; ++bi)
      for (int j = 0; j < sh.heads; ++j) {
        const size_t off = static_cast<size_t>(bi) * s * ld_qkv;
        ConstMatMap Q(qkv + off + sh.q_col(j), s, hd, Stride(ld_qkv)), K(kv + off + sh.k_col(j), s, hd, Stride(ld_qkv)),
            V(kv + off + sh.v_col(j), s, vd, Stride(ld_qkv));
        ConstMatMap C(ctx + static_cast<size_t>(bi) * s * ld_ctx + static_cast<size_t>(j) * vd, s, vd, Stride(ld_ctx)),
            dC(dctx + static_cast<size_t>(bi) * s * ld_ctx + static_cast<size_t>(j) * vd, s, vd, Stride(ld_ctx));
        MatMap dQ(dqkv + off + sh.q_col(j), s, hd, Stride(ld_qkv)), dK(dkv + off + sh.k_col(j), s, hd, Stride(ld_qkv)),
            dV(dkv + off + sh.v_col(j), s, vd, Stride(ld_qkv));
        const float* lse_row = lse + (static_cast<size_t>(bi) * sh.heads + j) * s;
        D = (C.array() * dC.array()).rowwise().sum().matrix();
        P.noalias() = scale * Q * K.transpose();
        for (int a = 0; a < s; ++a)
          for (int k = 0; k < s; ++k) P(a, k) = k_pos[k] <= q_pos[a] ? std::exp(P(a, k) - lse_row[a]) : 0.0f;
        dV.noalias() += P.transpose() * dC;
        dS.noalias() = dC * V.transpose();  // dP
        for (int a = 0; a < s; ++a) dS.row(a) = (P.row(a).array() * (dS.row(a).array() - D[a])).matrix() * scale;
        dQ.noalias() += dS * K;
        dK.noalias() += dS.transpose() * Q;
      }
  }
  void attention_backward(const AttentionShape& sh, const float* qkv, const float* probs, const float* dctx,
                          float* dqkv) override {
    const int s = sh.seq, hd = sh.head_dim, r = sh.heads_per_group();
    const int vd = sh.v_dim(), ld_qkv = sh.qkv_cols(), ld_ctx = sh.ctx_cols();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* scratch = scratch_.get(static_cast<size_t>(s) * s);
    float* scratch2 = scratch2_.get(static_cast<size_t>(s) * s);
    for (int bi = 0; bi < sh.batch; ++bi) {
      for (int j = 0; j < sh.heads; ++j) {
        const size_t off = static_cast<size_t>(bi) * s * ld_qkv;
        ConstMatMap Q(qkv + off + sh.q_col(j), s, hd, Stride(ld_qkv)), K(qkv + off + sh.k_col(j), s, hd, Stride(ld_qkv)),
            V(qkv + off + sh.v_col(j), s, vd, Stride(ld_qkv));
        MatMap dQ(dqkv + off + sh.q_col(j), s, hd, Stride(ld_qkv)), dK(dqkv + off + sh.k_col(j), s, hd, Stride(ld_qkv)),
            dV(dqkv + off + sh.v_col(j), s, vd, Stride(ld_qkv));
        ConstMatMap dC(dctx + static_cast<size_t>(bi) * s * ld_ctx + static_cast<size_t>(j) * vd, s, vd, Stride(ld_ctx));
        const float* pp;
        if (probs != nullptr) {
          pp = probs + (static_cast<size_t>(bi) * sh.heads + j) * s * s;
        } else {  // selective recompute: the probabilities were not kept
          MatMap P(scratch, s, s, Stride(s));
          P.noalias() = scale * Q * K.transpose();
          causal_softmax_rows(P, s);
          pp = scratch;
        }
        // The group's key and value gradients sum over its query heads (the first one sets them).
        const bool first_in_group = j % r == 0;
        ConstMatMap P(pp, s, s, Stride(s));
        MatMap dS(scratch2, s, s, Stride(s));
        dS.noalias() = dC * V.transpose();  // dP
        if (first_in_group) dV.noalias() = P.transpose().triangularView<Eigen::Upper>() * dC;
        else dV.noalias() += P.transpose().triangularView<Eigen::Upper>() * dC;
        for (int i = 0; i < s; ++i) {
          auto d = dS.row(i).head(i + 1).array();
          auto p = P.row(i).head(i + 1).array();
          const float dot = (d * p).sum();
          d = p * (d - dot) * scale;
          if (i + 1 < s) dS.row(i).tail(s - i - 1).setZero();
        }
        dQ.noalias() = dS.triangularView<Eigen::Lower>() * K;
        if (first_in_group) dK.noalias() = dS.transpose().triangularView<Eigen::Upper>() * Q;
        else dK.noalias() += dS.transpose().triangularView<Eigen::Upper>() * Q;
      }
    }
  }
  void embedding_forward(int count, const int32_t* tokens, int64_t first_row, int rows, int cols, const float* table,
                         float* out) override {
    for (int i = 0; i < count; ++i) {
      const int64_t r = static_cast<int64_t>(tokens[i]) - first_row;
      float* dst = out + static_cast<size_t>(i) * cols;
      if (r >= 0 && r < rows) std::memcpy(dst, table + static_cast<size_t>(r) * cols, cols * sizeof(float));
      else std::fill(dst, dst + cols, 0.0f);
    }
  }
  void embedding_backward(int count, const int32_t* tokens, int64_t first_row, int rows, int cols, const float* dout,
                          float* dtable) override {
    for (int i = 0; i < count; ++i) {
      const int64_t r = static_cast<int64_t>(tokens[i]) - first_row;
      if (r >= 0 && r < rows)
        ArrMap(dtable + static_cast<size_t>(r) * cols, cols) += ConstArrMap(dout + static_cast<size_t>(i) * cols, cols);
    }
  }
  void logits_row_max(int rows, int cols, int valid_cols, const float* logits, float* row_max) override {
    for (int r = 0; r < rows; ++r)
      row_max[r] = valid_cols > 0 ? ConstArrMap(logits + static_cast<size_t>(r) * cols, valid_cols).maxCoeff()
                                  : -std::numeric_limits<float>::infinity();
  }
  void softmax_numerators(int rows, int cols, int valid_cols, const float* row_max, const int32_t* targets,
                          int64_t first_col, float* logits, float* stats) override {
    for (int r = 0; r < rows; ++r) {
      float* row = logits + static_cast<size_t>(r) * cols;
      const int64_t t = static_cast<int64_t>(targets[r]) - first_col;
      stats[rows + r] = (t >= 0 && t < valid_cols) ? row[t] - row_max[r] : 0.0f;
      float sum = 0;
      if (valid_cols > 0) {
        ArrMap seg(row, valid_cols);
        seg = (seg - row_max[r]).exp();
        sum = seg.sum();
      }
      if (valid_cols < cols) std::fill(row + std::max(valid_cols, 0), row + cols, 0.0f);
      stats[r] = sum;
    }
  }
  void cross_entropy_finish(int rows, int cols, const float* stats, float* probs, float* loss) override {
    for (int r = 0; r < rows; ++r) {
      ArrMap(probs + static_cast<size_t>(r) * cols, cols) *= 1.0f / stats[r];
      loss[r] = std::log(stats[r]) - stats[rows + r];
    }
  }
  void cross_entropy_backward(int rows, int cols, const int32_t* targets, int64_t first_col, float scale,
                              const float* probs, float* dlogits) override {
    for (int r = 0; r < rows; ++r) {
      ArrMap(dlogits + static_cast<size_t>(r) * cols, cols) = ConstArrMap(probs + static_cast<size_t>(r) * cols, cols) * scale;
      const int64_t t = static_cast<int64_t>(targets[r]) - first_col;
      if (t >= 0 && t < cols) dlogits[static_cast<size_t>(r) * cols + t] -= scale;
    }
  }
  void adam_update(size_t n, const AdamStep& st, float* param, const float* grad, float* m, float* v) override {
    const math::AdamConstants c = math::adam_constants(st);
    for (size_t i = 0; i < n; ++i) math::adam_element(c, param[i], m[i], v[i], grad[i]);
  }

 private:
  // LayerNorm (mean given) or RMSNorm (mean null: x̂ = x·rstd and no mean terms) input
  // gradient per row, and the scale (and shift) gradients accumulated when not null.
  static void norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma, const float* mean,
                            const float* rstd, float* dx, float* dgamma, float* dbeta) {
    ConstArrMap g(gamma, cols);
    Eigen::ArrayXf xhat(cols), gy(cols);
    for (int r = 0; r < rows; ++r) {
      ConstArrMap xr(x + static_cast<size_t>(r) * cols, cols);
      ConstArrMap dyr(dy + static_cast<size_t>(r) * cols, cols);
      ArrMap dxr(dx + static_cast<size_t>(r) * cols, cols);
      const float rs = rstd[r];
      xhat = (xr - (mean != nullptr ? mean[r] : 0.0f)) * rs;
      gy = dyr * g;
      const float mean_g = mean != nullptr ? gy.mean() : 0.0f;
      const float mean_gx = (gy * xhat).mean();
      for (int i = 0; i < cols; ++i) dxr[i] = math::layer_norm_dx(gy[i], xhat[i], mean_g, mean_gx, rs);
      if (dgamma != nullptr) ArrMap(dgamma, cols) += dyr * xhat;
      if (dbeta != nullptr) ArrMap(dbeta, cols) += dyr;
    }
  }

  std::unordered_map<size_t, std::vector<float*>> free_;
  size_t in_use_ = 0, peak_ = 0;
  AlignedScratch scratch_, scratch2_;
  GemmOperands operands_;
  AlignedScratch rounded_a_, rounded_b_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(GemmOperands operands) { return std::make_unique<CpuDevice>(operands); }

}  // namespace ptdp::exec
