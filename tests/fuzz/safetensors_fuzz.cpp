// Fuzz target: the safetensors reader behind `ptdp train --init FILE` and checkpoint shards, and
// the Megatron state dict's mapping onto ptdp's parameters and its Hugging Face GPT-2 and Llama forms (issue 23). Any input must either load
// or be refused with an EnvironmentError (a malformed file) or a ConfigError naming the tensor; a
// JSON library exception leaking out, a crash, a hang or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "exec/io/checkpoint.hpp"
#include "exec/io/megatron_state.hpp"

namespace {

// The seed corpus's model: 1 layer, h 8, 2 heads, s 4, vocabulary 16 padded to 128 rows; the
// input's length picks GPT (even) or Llama-style (odd: GQA 1 group, SwiGLU, RMSNorm, untied).
ptdp::TransformerSpec spec_for(size_t size) {
  ptdp::TransformerSpec s;
  s.num_layers = 1;
  s.hidden_size = 8;
  s.num_attention_heads = 2;
  s.seq_length = 4;
  s.vocab_size = 16;
  if (size % 2 == 1) {
    s.num_query_groups = 1;
    s.mlp = ptdp::MlpKind::SwiGLU;
    s.normalization = ptdp::NormKind::RMSNorm;
    s.tie_embeddings = false;
  }
  s.position_embedding = ptdp::PositionKind::Learned;  // the seeds hold a position table (Llama-style with learned positions)
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    std::string meta;
    (void)ptdp::exec::decode_shard(bytes, "fuzz.safetensors", &meta);
  } catch (const ptdp::EnvironmentError&) {
  }
  try {
    const auto tensors = ptdp::exec::decode_safetensors(bytes, "fuzz.safetensors");
    try {  // `ptdp checkpoint --hf`: the GPT-2 form of whatever the file holds, or a ConfigError
      (void)ptdp::exec::to_hf_gpt2(tensors, 16, 2, "--hf");
    } catch (const ptdp::ConfigError&) {
    }
    try {  // its LlamaForCausalLM form (2 heads, 1 key/value head)
      ptdp::exec::HfLlamaConfig c;
      c.vocab_size = 16, c.num_heads = 2, c.num_query_groups = 1, c.seq_length = 4, c.normalization = "rmsnorm", c.position_embedding = "rope";
      (void)ptdp::exec::to_hf_llama(tensors, c, "--hf");
    } catch (const ptdp::ConfigError&) {
    }
    try {  // `train --init` from Hugging Face names: GPT-2's, or Llama's for a Llama-style model with rope
      ptdp::TransformerSpec hf_spec = spec_for(size);
      hf_spec.position_embedding.reset();
      if (ptdp::exec::is_hf_state(tensors)) (void)ptdp::exec::from_hf(hf_spec, tensors, "fuzz.safetensors", "--init");
    } catch (const ptdp::ConfigError&) {
    }
    const ptdp::TransformerSpec spec = spec_for(size);
    const auto params = ptdp::exec::from_megatron_state(spec, 128, tensors, "fuzz.safetensors", "--init");
    // What loads maps back to the same tensors.
    const auto again = ptdp::exec::to_megatron_state(spec, 128, params);
    PTDP_ASSERT(again.size() == tensors.size(), "a loaded state dict round-trips");
  } catch (const ptdp::EnvironmentError&) {
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
