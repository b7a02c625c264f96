// What a framework's kernels and an FP8 recipe's cost (model/cost.hpp: FrameworkCosts,
// Fp8RecipeCosts), from kernel-and-framework-facts.md and modern-training-facts.md.
#include <algorithm>

#include "model/cost.hpp"

namespace ptdp {

namespace {
// The eager PyTorch loss, cross_entropy(logits.float(), labels) on bf16 logits (torchtitan's, a
// plain FSDP training loop's), per logit element: in its forward the bf16 logits (2 B), their
// fp32 copy (4) and log-softmax's fp32 output (4) are alive at once, 10 B; torchtitan then frees
// the logits (del pred) and only the log-softmax output (4) waits for the backward, where it, the
// incoming fp32 gradient (4) and the gradient log-softmax produces (4) are alive at once, 12 B.
// The loss runs just before the microbatch's backward and all of it is freed before the layers'
// backward, so it is a moment of its own: nothing is kept beside the layers' recomputation.
void eager_loss(FrameworkCosts& c) {
  c.loss_kept_bytes = 0;
  c.loss_peak_bytes = std::max(2.0 + 4 + 4, 4.0 + 4 + 4);
}
}  // namespace

FrameworkCosts framework_costs(Framework f) {
  // Bandwidths relative to fused kernels (Liger's Triton ones; Transformer Engine's are of the
  // same class), H100, bf16, from kernel-and-framework-facts.md §5:
  //   RMSNorm fwd, 4096 rows, H 1024/4096/16384: torch nn.RMSNorm 1311/2065/1799 vs fused
  //     1375/2298/2826 GB/s → 0.95/0.90/0.64, mean 0.83; HF-style eager RMSNorm (A100, H
  //     1024/4096/32768) 107/120/140 vs 617/1079/1473 → 0.17/0.11/0.10, mean 0.13, five kernels
  //     (cast, pow, mean, rsqrt·x, ·weight).
  //   SwiGLU fwd, 8192 tokens, ffn 1024/4096/32768: eager silu(g)·u 871/1019/1077 vs fused
  //     2160/2777/3053 → 0.40/0.37/0.35, mean 0.37, two kernels (bwd 587 vs 1404: 0.42).
  // Host dispatch of an eager kernel: 5 µs (the low end of "5–20 µs" per launch in traces; an
  // eager x + y loop dispatches in 1.1–1.3 µs without the module and autograd layers).
  // Optimizer on the host per parameter tensor: fused AdamW over DTensor parameters ≈43 ms CPU
  // for ≈150 tensors = 0.29 ms each; fused multi-tensor kernels over flat buffers: none.
  FrameworkCosts c;
  switch (f) {
    case Framework::Megatron:
      c.elementwise_kernel = "fused (Transformer Engine / Megatron fusions)";
      break;
    case Framework::TorchtitanCompiled:
      // torch.compile wraps each transformer block (torchtitan 0.1's training.compile); the loss
      // is assumed to run eagerly as under torchtitan. (0.2's compile.components also lists
      // "loss" by default, which this does not model.)
      eager_loss(c);
      c.elementwise_kernel = "fused (torch.compile Inductor)";
      c.optimizer_host_per_tensor_s = 43e-3 / 150;
      break;
    case Framework::Torchtitan:
    case Framework::PytorchFsdp:
      eager_loss(c);
      // Rotary embeddings as torchtitan's Llama applies them, by complex multiplication: per
      // rotated tensor (queries, keys) a cast to fp32 (read 2, write 4 B per element), the complex
      // product (read 4, write 4) and the cast back (read 4, write 2): 20 B against a fused
      // kernel's 4, three kernels each (derived from the implementation; torch.compile fuses it).
      c.rotary_bandwidth = 4.0 / 20.0;
      c.rotary_kernels = 6;
      c.rotary_kernel = "eager PyTorch (complex multiply with fp32 casts: 3 kernels per tensor)";
      c.norm_bandwidth = 0.83;
      c.activation_bandwidth = 0.37;
      c.activation_kernels = 2;
      c.host_per_kernel_s = 5e-6;
      c.elementwise_kernel = "eager PyTorch (nn.RMSNorm; silu, mul)";
      if (f == Framework::Torchtitan) c.optimizer_host_per_tensor_s = 43e-3 / 150;
      break;
    case Framework::DeepSpeed:
      // Rotary embeddings HF-style (x·cos + rotate_half(x)·sin: neg, cat, two muls, an add per
      // tensor): measured 0.276 ms fused against 1.133 ms eager forward + backward (A100, seq
      // 2048, 32 query / 8 key-value heads): 0.24 of the fused bandwidth.
      c.rotary_bandwidth = 0.276 / 1.133;
      c.rotary_kernels = 10;
      c.rotary_kernel = "eager PyTorch (HF rotate_half: 5 kernels per tensor)";
      c.norm_bandwidth = 0.13;
      c.norm_kernels = 5;
      c.activation_bandwidth = 0.37;
      c.activation_kernels = 2;
      c.host_per_kernel_s = 5e-6;
      c.elementwise_kernel = "eager PyTorch (HF-style norm: 5 kernels; silu, mul)";
      break;
  }
  return c;
}

Fp8RecipeCosts fp8_recipe_costs(Fp8Recipe r) {
  // GEMM throughput relative to tensorwise cuBLAS and quantisation bytes per element
  // (kernel-and-framework-facts.md §1, modern-training-facts.md §2):
  //   tensorwise: TE's cast_transpose reads bf16 once and writes the row- and column-wise FP8
  //     copies (2 + 1 + 1 B; the scale from the amax history).
  //   rowwise: CUTLASS rowwise at 90–100 % of tensorwise on most shapes → 0.95; each copy its
  //     own pass with its own scales: 2 × (2 + 1) B.
  //   blockwise: FBGEMM 128-blockwise GEMM 870/828/828 TF vs rowwise 1126/1083/1141 (0.75 of
  //     rowwise = 0.72 of tensorwise), DeepGEMM 1.0 of tensorwise at M = 4096 and TE's H200
  //     benchmark ≈0.86 (autocast 1.40× vs current scaling's 1.58×) → 0.85; quantisation
  //     2 × (2 + 1) B (1×128 row and 128×1 column blocks).
  //   mxfp8: TE's pre-quantised MXFP8 1.83× bf16 (B300) against the 1.97× of the fp8/bf16 MAMF
  //     ceilings (B200) → 0.93; both copies with E8M0 scales per 32: 2 × (2 + 1 + 1/32) B.
  // Grouped weight gradients (K-grouped) against the input gradient, same kernels, same FLOPs
  // (kernel-and-framework-facts.md §2): blockwise, DeepGEMM through torchao on H100, wgrad 2105
  // vs dgrad 779 µs → 2.70; mxfp8, B200 at 1000 W, 2103 vs 1683 µs → 1.25; the others unmeasured
  // (the geometric mean, 1.84).
  Fp8RecipeCosts c;
  switch (r) {
    case Fp8Recipe::Tensorwise: c = {1.0, 4.0, "fp8 tensorwise (cuBLAS)"}; break;
    case Fp8Recipe::Rowwise: c = {0.95, 6.0, "fp8 rowwise (CUTLASS)"}; break;
    case Fp8Recipe::Blockwise: c = {0.85, 6.0, "fp8 blockwise 1x128/128x128", 2105.0 / 779.0}; break;
    case Fp8Recipe::MXFP8: c = {0.93, 2 * (2 + 1 + 1.0 / 32), "mxfp8 (block 32, E8M0 scales)", 2103.0 / 1683.0}; break;
  }
  return c;
}

}  // namespace ptdp
