// Megatron-Core's pipeline layouts (--pipeline-model-parallel-layout, PipelineParallelLayerLayout):
// a string such as "Et*3|(tt|)*29,m|L" placing the embedding (E), the decoder layers (t), the
// multi-token-prediction layers (m) and the output layer + loss (L) on each pipeline stage, stages
// separated by '|' in virtual-pipeline order (stage s on pipeline rank s mod p). "X*N" repeats
// one symbol, "(…)*N" a group; commas are ignored. ptdp keeps the parsed layout in the plan as
// two lists (ParallelPlan::layout_layers, layout_mtp); the embedding always opens the first stage
// and the loss closes the last, as Megatron requires.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptdp {

/// What one stage of a layout holds.
struct LayoutStage {
  bool embedding = false, loss = false;
  int64_t layers = 0;  // decoder layers (t)
  int64_t mtp = 0;     // multi-token-prediction layers (m)
};

/// Parses a layout. Throws ConfigError on `key` naming the 1-based position in `text` of what is
/// wrong: a symbol outside E t m L | ( ) * , and digits; a repeat without its count or symbol; a
/// nested or unclosed group; more than 100 000 symbols once expanded; an empty stage; E anywhere
/// but opening the first stage, L anywhere but closing the last, either of them twice; an m
/// before a t, or m layers in two stages (the MTP layers follow the whole decoder).
std::vector<LayoutStage> parse_pipeline_layout(const std::string& text, const std::string& key);

/// The layout of a plan's stages in Megatron's syntax (the embedding on the first stage, the loss
/// on the last; repeated stages grouped: "Et|(tt|)*30mL").
std::string format_pipeline_layout(const std::vector<int64_t>& layers, const std::vector<int64_t>& mtp);

}  // namespace ptdp
