// ModelShard's model states under sharded data parallelism (ZeRO stages 1–3, hybrid sharding,
// offload): storage of the flat buffers and shards, the per-unit gathers and gradient
// reduce-scatters, REDUCE_GRAD, the gradient norm and the optimizer step. Layout: gpt.hpp.
#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "exec/runtime/elementwise_math.hpp"
#include "exec/model/gpt.hpp"

namespace ptdp::exec {
namespace {

AdamStep adam_step_of(const AdamOptions& opt, int64_t step, float grad_scale) {
  AdamStep a;
  a.lr = static_cast<float>(opt.lr);
  a.beta1 = static_cast<float>(opt.beta1);
  a.beta2 = static_cast<float>(opt.beta2);
  a.eps = static_cast<float>(opt.eps);
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(opt.beta1, static_cast<double>(step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(opt.beta2, static_cast<double>(step)));
  a.grad_scale = grad_scale;
  return a;
}

}  // namespace

void ModelShard::shard_transfer(const std::function<void()>& f) {
  if (!on_shard_wait || in_transfer_action_) return f();
  const double start = now_s();
  f();
  dev_.synchronize();
  on_shard_wait(start, now_s());
}

Communicator* ModelShard::piece_group(bool experts) const {
  if (sharding_.zero_stage == 0) return nullptr;
  return experts && sharding_.expert_group != nullptr ? sharding_.expert_group : sharding_.group;
}

void ModelShard::allocate_states(Stage& st) {
  const int z = sharding_.zero_stage;
  const auto n = static_cast<int64_t>(st.flat_size_), k = static_cast<int64_t>(st.shard_size_);
  if (z < 3) st.values_ = Tensor::zeros(dev_, n, 1);  // padding stays zero
  if (z < 2) st.grads_ = Tensor::zeros(dev_, n, 1);
  if (z == 0) {
    st.adam_m_ = Tensor::zeros(dev_, n, 1);
    st.adam_v_ = Tensor::zeros(dev_, n, 1);
    return;
  }
  st.grad_shard_ = Tensor::zeros(dev_, k, 1);
  if (z == 3 && !sharding_.offload_params) st.value_shard_ = Tensor::zeros(dev_, k, 1);
  if (sharding_.offload_optimizer) {  // host memory: outside the device allocator
    st.host_m_.assign(static_cast<size_t>(k), 0.0f);
    st.host_v_.assign(static_cast<size_t>(k), 0.0f);
    st.host_values_.assign(static_cast<size_t>(k), 0.0f);  // the master copy of the shard
    st.host_grads_.assign(static_cast<size_t>(k), 0.0f);
  } else {
    st.adam_m_ = Tensor::zeros(dev_, k, 1);
    st.adam_v_ = Tensor::zeros(dev_, k, 1);
  }
}

size_t ModelShard::host_bytes() const {
  size_t b = 0;
  for (const auto& st : stages_)
    b += (st->host_m_.size() + st->host_v_.size() + st->host_values_.size() + st->host_grads_.size()) * sizeof(float);
  return b;
}

float* ModelShard::param_ptr(Stage& st, int param, bool values) {
  const ParamInfo& p = st.params_[static_cast<size_t>(param)];
  const bool whole = values ? sharding_.zero_stage < 3 : sharding_.zero_stage < 2;
  if (whole) return (values ? st.values_.data() : st.grads_.data()) + p.offset;
  Piece& pc = st.pieces_[static_cast<size_t>(st.piece_of_param_[static_cast<size_t>(param)])];
  Tensor& full = values ? pc.values : pc.grads;
  return full.empty() ? nullptr : full.data() + (p.offset - pc.begin);
}

std::map<const float*, std::string> ModelShard::value_names() {
  std::map<const float*, std::string> out;
  for (auto& st : stages_)
    for (size_t i = 0; i < st->params_.size(); ++i)
      if (const float* at = param_ptr(*st, static_cast<int>(i), true)) out.emplace(at, st->params_[i].name);
  return out;
}

void ModelShard::relink(Stage& st, int piece) {
  for (int i : st.pieces_[static_cast<size_t>(piece)].params) {
    for (float** slot : st.value_slots_[static_cast<size_t>(i)]) *slot = param_ptr(st, i, true);
    for (float** slot : st.grad_slots_[static_cast<size_t>(i)]) *slot = param_ptr(st, i, false);
  }
}

void ModelShard::build_units(Stage& st) {
  auto piece = [&](Stage& s, const std::string& name) {
    const int i = param_index(s.params_, name);
    PTDP_ASSERT(i >= 0, "no parameter " + name + " for a sharding unit");
    return std::make_pair(&s, s.piece_of_param_[static_cast<size_t>(i)]);
  };
  const auto& pl = st.slice_;
  const std::string word = "embedding.word_embeddings.weight";
  if (pl.first()) {
    Unit u;
    u.pieces = {piece(st, word)};
    if (spec_.learned_positions()) u.pieces.push_back(piece(st, "embedding.position_embeddings.weight"));
    u.flush = u.pieces;
    st.units_.push_back(std::move(u));
  }
  // The stage's routed experts are one piece at the end of its layout (no expert parallelism
  // when sharded): every MoE layer's unit uses it, and it is complete after the backward of the
  // stage's first MoE layer (the last one the backward reaches).
  int first_moe = -1;
  for (int k = 0; k < pl.num_layers && first_moe < 0; ++k)
    if (spec_.is_moe_layer(pl.first_layer + k)) first_moe = k;
  for (int k = 0; k < pl.num_layers; ++k) {
    Unit u;
    u.pieces = {piece(st, "layers." + std::to_string(pl.first_layer + k) + ".ln1.weight")};
    u.flush = u.pieces;
    if (spec_.is_moe_layer(pl.first_layer + k) && shape_.moe_local_experts > 0) {
      const auto experts = piece(st, "layers." + std::to_string(pl.first_layer + k) + ".mlp.experts." +
                                         std::to_string(shape_.moe_first_expert) + ".fc1.weight");
      u.pieces.push_back(experts);
      if (k == first_moe) u.flush.push_back(experts);
    }
    st.units_.push_back(std::move(u));
  }
  if (pl.last()) {
    Unit u;
    u.pieces = {piece(st, "final_layernorm.weight")};
    u.flush = u.pieces;
    // The multi-token-prediction modules (in the head's piece) of MoE kind use the experts' piece
    // too; it is complete after them when no layer of the stage uses it.
    if (spec_.mtp_layers > 0 && spec_.mtp_moe() && shape_.moe_local_experts > 0) {
      u.pieces.push_back(piece(st, "mtp.layers.0.transformer_layer.mlp.experts." + std::to_string(shape_.moe_first_expert) +
                                       ".fc1.weight"));
      if (first_moe < 0) u.flush.push_back(u.pieces.back());
    }
    if (reads_embedding_at_head()) {
      // The head reads the word embedding: its own copy (a piece of its own, complete after the
      // head), or the first stage's, complete only after that stage's embedding backward.
      if (pl.first()) {
        // Stage 3: the embedding's unit holds it from the embedding to the head and back
        // (word_shared_by_end_units), as FSDP holds a parameter two modules share in their
        // common ancestor's unit; the head's unit is the final norm alone.
        if (sharding_.zero_stage < 3) u.pieces.push_back(piece(st, word));
      } else if (param_index(st.params_, word) >= 0) {
        u.pieces.push_back(piece(st, word));
        u.flush.push_back(u.pieces.back());
      } else {
        u.pieces.push_back(piece(*first_stage_held(), word));
      }
    }
    st.units_.push_back(std::move(u));
  }
  // reshard_after_forward false keeps every unit whole from its forward to its backward;
  // torchtitan's default keeps the head's.
  for (Unit& u : st.units_) u.kept_whole = sharding_.keep_whole_after_forward;
  if (pl.last() && sharding_.keep_last_unit_whole) st.units_.back().kept_whole = true;
}

void ModelShard::start_gather(Stage& st, int piece) {
  Piece& pc = st.pieces_[static_cast<size_t>(piece)];
  Communicator& group = *pc.group;
  pc.values = Tensor(dev_, static_cast<int64_t>(pc.shard_len * pc.members), 1);
  if (gathering_for_backward_ && !pc.held.empty()) {  // reshard_after_forward N: over those N only
    shard_transfer([&] { pc.gathering = sharding_.reshard->start_all_gather(pc.held.data(), pc.values.data(), pc.held.size()); });
    return;
  }
  const float* mine = nullptr;
  if (sharding_.offload_params) {  // offloaded parameters come host → device first
    pc.staged = Tensor(dev_, static_cast<int64_t>(pc.shard_len), 1);
    dev_.upload(st.host_values_.data() + pc.shard_offset, pc.staged.data(), pc.shard_len);
    mine = pc.staged.data();
  } else {
    mine = st.value_shard_.data() + pc.shard_offset;
  }
  shard_transfer([&] { pc.gathering = group.start_all_gather(mine, pc.values.data(), pc.shard_len); });
}

void ModelShard::prefetch(const Unit& u) {
  if (sharding_.zero_stage < 3) return;
  for (auto [s, i] : u.pieces)
    if (s->pieces_[static_cast<size_t>(i)].values.empty()) start_gather(*s, i);
}

void ModelShard::finish_parameter_gather(Piece& pc) {
  if (!pc.gathering) return;
  shard_transfer([&] { pc.gathering->wait(); });
  pc.gathering.reset();
  pc.staged.reset();
}

void ModelShard::complete_parameter_gathers() {
  if (sharding_.zero_stage == 0 || sharding_.zero_stage >= 3) return;
  for (auto& st : stages_)
    for (Piece& pc : st->pieces_) finish_parameter_gather(pc);
}

void ModelShard::acquire(const Unit& u) {
  if (sharding_.zero_stage < 3) {  // overlap_param_gather: the step's gathers of the unit's pieces
    for (auto [s, i] : u.pieces) finish_parameter_gather(s->pieces_[static_cast<size_t>(i)]);
    return;
  }
  for (auto [s, i] : u.pieces) {
    Piece& pc = s->pieces_[static_cast<size_t>(i)];
    if (pc.users++ > 0) continue;
    if (pc.values.empty()) start_gather(*s, i);
    if (pc.gathering) {
      shard_transfer([&] { pc.gathering->wait(); });
      pc.gathering.reset();
      pc.staged.reset();
    }
    relink(*s, i);
  }
}

bool ModelShard::word_shared_by_end_units(const Stage& st) const {
  return sharding_.zero_stage >= 3 && reads_embedding_at_head() && st.slice_.first() && st.slice_.last();
}

void ModelShard::release(const Unit& u) {
  if (sharding_.zero_stage < 3) return;
  for (auto [s, i] : u.pieces) {
    Piece& pc = s->pieces_[static_cast<size_t>(i)];
    PTDP_ASSERT(pc.users > 0, "releasing a unit that was not gathered");
    if (--pc.users > 0) continue;
    dev_.synchronize();  // the last kernels reading it are done
    PTDP_ASSERT(!pc.gathering, "freeing a unit whose gather is in flight");
    pc.values.reset();
    relink(*s, i);
  }
}

void ModelShard::release_after_forward(const Unit& u) {
  if (sharding_.zero_stage < 3 || u.kept_whole) return;  // kept: its backward releases the forward's hold
  if (sharding_.reshard != nullptr) {
    // This member's N-block: the piece's members / N consecutive shards at its place in the reshard group.
    const auto n = static_cast<size_t>(sharding_.reshard->size()), r = static_cast<size_t>(sharding_.reshard->rank());
    for (auto [s, i] : u.pieces) {
      Piece& pc = s->pieces_[static_cast<size_t>(i)];
      PTDP_ASSERT(pc.group == sharding_.group, "a unit kept over the reshard group shards over the sharding group");
      if (pc.holds++ > 0) continue;
      const size_t block = pc.shard_len * pc.members / n;
      pc.held = Tensor(dev_, static_cast<int64_t>(block), 1);
      dev_.copy(pc.values.data() + r * block, pc.held.data(), block);
    }
  }
  release(u);
}

void ModelShard::release_after_backward(const Unit& u) {
  release(u);
  if (sharding_.zero_stage < 3) return;
  if (u.kept_whole) return release(u);  // the forward's hold
  if (sharding_.reshard == nullptr) return;
  for (auto [s, i] : u.pieces) {
    Piece& pc = s->pieces_[static_cast<size_t>(i)];
    PTDP_ASSERT(pc.holds > 0, "a backward of a unit whose forward kept nothing");
    if (--pc.holds == 0) {
      dev_.synchronize();  // the backward's gather read it
      pc.held.reset();
    }
  }
}

void ModelShard::unshard_stage(int stage_id) {
  in_transfer_action_ = true;
  for (const Unit& u : stage(stage_id).units_) acquire(u);
  in_transfer_action_ = false;
}

void ModelShard::reshard_stage(int stage_id) {
  for (const Unit& u : stage(stage_id).units_) release(u);
}

void ModelShard::open_grads(const Unit& u) {
  if (sharding_.zero_stage < 2) return;
  for (auto [s, i] : u.pieces) {
    Piece& pc = s->pieces_[static_cast<size_t>(i)];
    if (!pc.grads.empty()) continue;
    pc.grads = Tensor::zeros(dev_, static_cast<int64_t>(pc.shard_len * pc.members), 1);
    relink(*s, i);
  }
}

void ModelShard::flush_grads(Stage& st, int piece) {
  Piece& pc = st.pieces_[static_cast<size_t>(piece)];
  if (pc.grads.empty()) return;
  // Reduce-scatter (sum) of this microbatch's full gradient; the shard accumulates it.
  Tensor part(dev_, static_cast<int64_t>(pc.shard_len), 1);
  dev_.synchronize();
  shard_transfer([&] { pc.group->reduce_scatter(pc.grads.data(), part.data(), pc.shard_len); });
  dev_.axpy(pc.shard_len, 1.0f, part.data(), st.grad_shard_.data() + pc.shard_offset);
  pc.grads.reset();
  relink(st, piece);
}

void ModelShard::flush_all_grads() {
  if (sharding_.zero_stage < 2) return;
  for (auto& st : stages_)
    for (size_t i = 0; i < st->pieces_.size(); ++i) flush_grads(*st, static_cast<int>(i));
}

void ModelShard::zero_grads() {
  for (auto& st : stages_) {
    if (!st->grads_.empty()) dev_.fill(st->grads_.data(), st->grads_.size(), 0.0f);
    if (!st->grad_shard_.empty()) dev_.fill(st->grad_shard_.data(), st->grad_shard_.size(), 0.0f);
  }
}

void ModelShard::update_expert_bias(Communicator& data, Communicator* mirror, Communicator* tensor) {
  if (!spec_.moe.aux_free || !spec_.has_moe()) return;
  // Every layer of the model in one vector (DualPipe's copies of a stage fill the same slots).
  const auto E = static_cast<size_t>(spec_.moe.num_experts);
  // Slot j of a stage's expert_load_: its layer j, or past its layers the multi-token-prediction
  // module j − layers (the model's layer num_layers + that).
  auto layer_of = [&](const Stage& st, size_t j) {
    const auto n = static_cast<size_t>(st.slice_.num_layers);
    return j < n ? static_cast<size_t>(st.slice_.first_layer) + j : static_cast<size_t>(spec_.num_layers) + (j - n);
  };
  std::vector<float> load(static_cast<size_t>(spec_.num_layers + spec_.mtp_layers) * E, 0.0f);
  for (auto& st : stages_)
    for (size_t j = 0; j < st->expert_load_.size(); ++j) {
      std::vector<float>& mine = st->expert_load_[j];
      for (size_t e = 0; e < mine.size(); ++e) load[layer_of(*st, j) * E + e] += mine[e];
      std::fill(mine.begin(), mine.end(), 0.0f);
    }
  Tensor sum(dev_, static_cast<int64_t>(load.size()), 1);
  dev_.upload(load.data(), sum.data(), load.size());
  dev_.synchronize();
  data.all_reduce(sum.data(), load.size(), ReduceOp::Sum);
  if (mirror != nullptr) mirror->all_reduce(sum.data(), load.size(), ReduceOp::Sum);
  if (tensor != nullptr) tensor->all_reduce(sum.data(), load.size(), ReduceOp::Sum);
  dev_.download(sum.data(), load.data(), load.size());
  std::vector<float> values;
  for (auto& st : stages_)
    for (size_t j = 0; j < st->expert_load_.size(); ++j) {
      const size_t layer = layer_of(*st, j);
      const int64_t module = static_cast<int64_t>(layer) - spec_.num_layers;
      const int i = param_index(st->params_, (module >= 0 ? "mtp.layers." + std::to_string(module) + ".transformer_layer."
                                                          : "layers." + std::to_string(layer) + ".") +
                                                 "mlp.router.expert_bias");
      if (i < 0) continue;
      const float* c = load.data() + static_cast<size_t>(layer) * E;
      double total = 0;
      for (size_t e = 0; e < E; ++e) total += c[e];
      const double mean = total / static_cast<double>(E);
      // The elements this rank keeps (all of them, or under stage 3 its shard's).
      std::vector<std::pair<size_t, size_t>> ranges;
      if (sharding_.zero_stage < 3) ranges.emplace_back(0, E);
      else
        for (const ShardSegment& g : st->segments_)
          if (g.param == i) ranges.emplace_back(g.begin, g.count);
      const ParamInfo& p = st->params_[static_cast<size_t>(i)];
      for (auto [begin, count] : ranges) {
        values.resize(count);
        read_values(*st, p, begin, count, values.data());
        for (size_t e = 0; e < count; ++e) {
          const double off = mean - c[begin + e];
          values[e] += off > 0 ? kExpertBiasUpdateRate : off < 0 ? -kExpertBiasUpdateRate : 0.0f;
        }
        write_values(*st, p, begin, count, values.data());
      }
    }
  dev_.synchronize();
}

double ModelShard::expert_grad_sum_squares() {
  double total = 0;
  // The experts' fc2 biases are replicated over the expert-tensor group: counted on its rank 0.
  auto counted = [&](const ParamInfo& p) { return p.expert && p.counted_in_norm && !(p.tp_replicated && etp_rank_ != 0); };
  for (auto& st : stages_) {
    if (sharding_.zero_stage == 0) {
      for (const ParamInfo& p : st->params_)
        if (counted(p)) total += dev_.sum_squares(p.count(), st->grads_.data() + p.offset);
    } else {  // sharded: this rank's part of the experts' reduced gradients
      for (const ShardSegment& g : st->segments_) {
        const ParamInfo& p = st->params_[static_cast<size_t>(g.param)];
        if (counted(p)) total += dev_.sum_squares(g.count, st->grad_shard_.data() + g.shard_offset);
      }
    }
  }
  return total;
}

double ModelShard::grad_sum_squares() {
  double total = 0;
  auto counted = [&](const ParamInfo& p) { return p.counted_in_norm && !p.expert && !(p.tp_replicated && tp_rank_ != 0); };
  for (auto& st : stages_) {
    if (sharding_.zero_stage == 0) {
      for (const ParamInfo& p : st->params_)
        if (counted(p)) total += dev_.sum_squares(p.count(), st->grads_.data() + p.offset);
    } else {
      for (const ShardSegment& g : st->segments_)
        if (counted(st->params_[static_cast<size_t>(g.param)]))
          total += dev_.sum_squares(g.count, st->grad_shard_.data() + g.shard_offset);
    }
  }
  return total;
}

std::vector<std::pair<float*, size_t>> ModelShard::tied_embedding_grads() {
  std::vector<std::pair<float*, size_t>> out;
  if (!reads_embedding_at_head()) return out;  // the output layer is its own parameter, nothing else reads the embedding
  for (auto& st : stages_) {
    const int i = param_index(st->params_, "embedding.word_embeddings.weight");
    if (i < 0) continue;
    const ParamInfo& p = st->params_[static_cast<size_t>(i)];
    if (sharding_.zero_stage == 0) {
      out.emplace_back(st->grads_.data() + p.offset, p.count());
    } else {  // its own piece on both stages: the same elements in both shards
      const Piece& pc = st->pieces_[static_cast<size_t>(st->piece_of_param_[static_cast<size_t>(i)])];
      out.emplace_back(st->grad_shard_.data() + pc.shard_offset, pc.shard_len);
    }
  }
  return out;
}

void ModelShard::arm_overlapped_reduction(int stage_id, Communicator& data, size_t bucket_elements) {
  PTDP_ASSERT(sharding_.zero_stage <= 1, "overlapped reduction of whole gradients (zero_stage 0 or 1)");
  if (data.size() == 1) return;  // (folded experts at d 1 reduce at REDUCE_GRAD, unbucketed)
  Stage& st = stage(stage_id);
  Buckets b;
  if (sharding_.zero_stage == 1) {
    // The distributed optimizer: buckets of whole pieces (each reduce-scattered over its own
    // group into the shard, as REDUCE_GRAD does), filled as Megatron fills them, in the
    // backward's order from the last piece: a bucket closes once it holds bucket_elements, or
    // where the group changes (the routed experts' piece shards over its own).
    if (st.pieces_.empty()) return;
    size_t filled = 0;
    const Communicator* last = nullptr;
    for (size_t i = st.pieces_.size(); i-- > 0;) {
      const Piece& pc = st.pieces_[i];
      if (b.bounds.empty() || filled >= bucket_elements || pc.group != last) {
        b.bounds.push_back(pc.begin);
        b.groups.push_back(pc.group);
        filled = 0;
      }
      b.bounds.back() = pc.begin;  // the bucket reaches down to this piece
      filled += pc.shard_len * pc.members;
      last = pc.group;
    }
    std::reverse(b.bounds.begin(), b.bounds.end());
    std::reverse(b.groups.begin(), b.groups.end());
    b.bounds.push_back(st.pieces_.back().begin + st.pieces_.back().shard_len * st.pieces_.back().members);
  }
  // The dense region over `data`, the routed experts' (expert parallelism) over the expert-data
  // group, each cut at whole all-reduce pieces of its group from the region's start.
  auto cut = [&](size_t from, size_t to, Communicator* group) {
    if (from >= to) return;
    const size_t piece = std::max<size_t>(1, group->all_reduce_piece());
    const size_t size = std::max(piece, (std::max<size_t>(1, bucket_elements) + piece - 1) / piece * piece);
    for (size_t at = from; at < to; at += size) {
      b.bounds.push_back(at);
      b.groups.push_back(group);
    }
  };
  if (sharding_.zero_stage == 0) {
    const size_t dense = expert_data_ != nullptr ? std::min(st.expert_begin_, st.flat_size_) : st.flat_size_;
    const size_t end = dense < st.flat_size_ && expert_data_->size() > 1 ? st.flat_size_ : dense;
    cut(0, dense, &data);
    cut(dense, end, expert_data_);
    if (b.bounds.empty()) return;
    b.bounds.push_back(end);
  }
  b.unready.assign(b.bounds.size() - 1, 0);
  b.piece_ready.assign(st.pieces_.size(), false);
  for (const Piece& pc : st.pieces_) {
    const size_t end = pc.begin + pc.shard_len * pc.members;
    for (size_t k = 0; k + 1 < b.bounds.size(); ++k)
      if (pc.begin < b.bounds[k + 1] && end > b.bounds[k]) ++b.unready[k];
  }
  buckets_[&st] = std::move(b);
}

void ModelShard::piece_final(Stage& st, int piece) {
  auto it = buckets_.find(&st);
  if (it == buckets_.end()) return;
  Buckets& b = it->second;
  if (b.piece_ready[static_cast<size_t>(piece)]) return;
  b.piece_ready[static_cast<size_t>(piece)] = true;
  const Piece& pc = st.pieces_[static_cast<size_t>(piece)];
  const size_t end = pc.begin + pc.shard_len * pc.members;
  for (size_t k = 0; k + 1 < b.bounds.size(); ++k)
    if (pc.begin < b.bounds[k + 1] && end > b.bounds[k]) --b.unready[k];
  start_ready_buckets(st, b);
}

void ModelShard::start_ready_buckets(Stage& st, Buckets& b) {
  const size_t n = b.bounds.size() - 1;
  bool started = false;
  while (b.started < n && b.unready[n - 1 - b.started] == 0) {
    const size_t k = n - 1 - b.started;
    if (!started) {
      dev_.synchronize();  // the backward's writes are in the buffer
      if (on_buckets) on_buckets(st.slice_.stage);
    }
    started = true;
    if (sharding_.zero_stage == 0) {
      b.requests.push_back(b.groups[k]->start_all_reduce(st.grads_.data() + b.bounds[k], b.bounds[k + 1] - b.bounds[k], ReduceOp::Sum));
    } else {  // the bucket's pieces, reduce-scattered into the shard
      const size_t first = b.requests.size();
      for (const Piece& pc : st.pieces_)
        if (pc.begin >= b.bounds[k] && pc.begin < b.bounds[k + 1])
          b.requests.push_back(pc.group->start_reduce_scatter(st.grads_.data() + pc.begin, st.grad_shard_.data() + pc.shard_offset,
                                                              pc.shard_len));
      b.started_list.push_back({k, first, b.requests.size()});
    }
    ++b.started;
    ++buckets_started_;
  }
  if (started && on_buckets) on_buckets(-1);
  // MPI progresses non-blocking collectives inside its calls: poke the ones in flight.
  for (auto& r : b.requests) r->test();
  start_replica_reductions(st, b, false);
}

void ModelShard::start_replica_reductions(Stage& st, Buckets& b, bool wait) {
  if (sharding_.replicas == nullptr || sharding_.zero_stage != 1) return;
  bool booked = false;
  while (b.replicas_started < b.started_list.size()) {
    const Buckets::Started& s = b.started_list[b.replicas_started];
    bool done = true;
    for (size_t i = s.first; i < s.last; ++i) {
      if (wait) b.requests[i]->wait();
      else done = done && b.requests[i]->test();
    }
    if (!done) break;
    if (!booked && on_buckets) on_buckets(st.slice_.stage);  // booked to the stage's REDUCE_GRAD
    booked = true;
    for (const Piece& pc : st.pieces_)
      if (pc.begin >= b.bounds[s.bucket] && pc.begin < b.bounds[s.bucket + 1])
        b.replica_requests.push_back(sharding_.replicas->start_all_reduce(st.grad_shard_.data() + pc.shard_offset, pc.shard_len, ReduceOp::Sum));
    ++b.replicas_started;
  }
  if (booked && on_buckets) on_buckets(-1);
  for (auto& r : b.replica_requests) r->test();
}

void ModelShard::gradients_final(int stage_id) {
  Stage& st = stage(stage_id);
  for (size_t i = 0; i < st.pieces_.size(); ++i) piece_final(st, static_cast<int>(i));
}

void ModelShard::reduce_gradients(int stage_id, Communicator& data) {
  Stage& st = stage(stage_id);
  const float inv_d = 1.0f / static_cast<float>(data.size());
  dev_.synchronize();
  bool replicas_reduced = false;  // in the buckets (start_replica_reductions)
  if (auto it = buckets_.find(&st); it != buckets_.end()) {
    // Overlapped: what the backward left unstarted starts now; then every bucket is waited for.
    Buckets& b = it->second;
    b.unready.assign(b.unready.size(), 0);
    const int64_t during_backward = buckets_started_;
    start_ready_buckets(st, b);
    buckets_started_ = during_backward;  // counted: the buckets the backward started
    for (auto& r : b.requests) r->wait();
    start_replica_reductions(st, b, true);
    for (auto& r : b.replica_requests) r->wait();
    replicas_reduced = !b.started_list.empty();
    buckets_.erase(it);
    if (sharding_.zero_stage == 0) {
      dev_.scale(st.flat_size_, inv_d, st.grads_.data());
      return;
    }
  } else if (sharding_.zero_stage == 1) {
    for (const Piece& pc : st.pieces_)
      pc.group->reduce_scatter(st.grads_.data() + pc.begin, st.grad_shard_.data() + pc.shard_offset, pc.shard_len);
  }
  if (sharding_.zero_stage == 0) {
    // Routed experts: each expert's gradient already sums the tokens its expert-parallel group
    // sent it; the other groups' copies of the expert add theirs. The mean is over all d ranks.
    // Without expert parallelism (no expert-data group) every data rank holds every expert.
    const size_t dense = expert_data_ != nullptr ? std::min(st.expert_begin_, st.flat_size_) : st.flat_size_;
    if (mirror_ != nullptr) {
      if (dense < st.flat_size_) mirror_->all_reduce(st.grads_.data() + dense, st.flat_size_ - dense, ReduceOp::Sum);
      if (data.size() == 1) {
        mirror_->all_reduce(st.grads_.data(), dense, ReduceOp::Sum);
      } else {
        // Reduce-scatter over d (padded to d equal parts), the pair sums this rank's part,
        // all-gather: the data-parallel all-reduce with the copies' sum folded in.
        const size_t n = static_cast<size_t>(data.size()), part = (dense + n - 1) / n;
        Tensor padded(dev_, static_cast<int64_t>(part * n), 1), mine(dev_, static_cast<int64_t>(part), 1);
        dev_.fill(padded.data() + dense, part * n - dense, 0.0f);
        dev_.copy(st.grads_.data(), padded.data(), dense);
        dev_.synchronize();
        data.reduce_scatter(padded.data(), mine.data(), part);
        mirror_->all_reduce(mine.data(), part, ReduceOp::Sum);
        data.all_gather(mine.data(), padded.data(), part);
        dev_.copy(padded.data(), st.grads_.data(), dense);
      }
      if (dense < st.flat_size_ && expert_data_->size() > 1)
        expert_data_->all_reduce(st.grads_.data() + dense, st.flat_size_ - dense, ReduceOp::Sum);
      dev_.scale(st.flat_size_, inv_d, st.grads_.data());
      return;
    }
    const bool experts = dense < st.flat_size_ && expert_data_->size() > 1;
    if (data.size() == 1 && !experts) return;
    if (data.size() > 1) data.all_reduce(st.grads_.data(), dense, ReduceOp::Sum);
    if (experts) expert_data_->all_reduce(st.grads_.data() + dense, st.flat_size_ - dense, ReduceOp::Sum);
    dev_.scale(st.flat_size_, inv_d, st.grads_.data());
    return;
  }
  if (sharding_.zero_stage >= 2) {
    in_transfer_action_ = true;
    for (size_t i = 0; i < st.pieces_.size(); ++i) flush_grads(st, static_cast<int>(i));
    in_transfer_action_ = false;
  }
  if (sharding_.replicas != nullptr && !replicas_reduced) {  // hybrid: the other nodes hold the same shard
    PTDP_ASSERT(sharding_.expert_group == nullptr, "hybrid sharding with expert parallelism (refused by train)");
    dev_.synchronize();
    sharding_.replicas->all_reduce(st.grad_shard_.data(), st.shard_size_, ReduceOp::Sum);
  }
  if (mirror_ != nullptr) {  // DualPipe: the copy of the stage on the mirror rank holds the same shard
    dev_.synchronize();
    mirror_->all_reduce(st.grad_shard_.data(), st.shard_size_, ReduceOp::Sum);
  }
  dev_.scale(st.shard_size_, inv_d, st.grad_shard_.data());
}

ModelShard::OptimizerSnapshot ModelShard::save_optimizer_state() {
  OptimizerSnapshot snap;
  complete_parameter_gathers();
  dev_.synchronize();
  for (auto& stp : stages_) {
    Stage& st = *stp;
    for (Tensor* t : {&st.values_, &st.adam_m_, &st.adam_v_, &st.value_shard_}) {
      std::vector<float> copy(t->size());
      if (!copy.empty()) dev_.download(t->data(), copy.data(), copy.size());
      snap.buffers.push_back(std::move(copy));
    }
    for (std::vector<float>* h : {&st.host_m_, &st.host_v_, &st.host_values_}) snap.buffers.push_back(*h);
  }
  return snap;
}

void ModelShard::restore_optimizer_state(const OptimizerSnapshot& snap) {
  size_t k = 0;
  for (auto& stp : stages_) {
    Stage& st = *stp;
    for (Tensor* t : {&st.values_, &st.adam_m_, &st.adam_v_, &st.value_shard_}) {
      const std::vector<float>& copy = snap.buffers.at(k++);
      PTDP_ASSERT(copy.size() == t->size(), "optimizer snapshot of another model");
      if (!copy.empty()) dev_.upload(copy.data(), t->data(), copy.size());
    }
    for (std::vector<float>* h : {&st.host_m_, &st.host_v_, &st.host_values_}) *h = snap.buffers.at(k++);
  }
  dev_.synchronize();
}

void ModelShard::adam_step(const AdamOptions& opt, int64_t step, float grad_scale) {
  complete_parameter_gathers();  // (every forward of the iteration waited for them already)
  AdamStep a = adam_step_of(opt, step, grad_scale);
  const float decay = static_cast<float>(opt.weight_decay);
  for (auto& stp : stages_) {
    Stage& st = *stp;
    if (sharding_.zero_stage == 0) {
      for (const ParamInfo& p : st.params_) {
        a.weight_decay = p.weight_decay ? decay : 0.0f;
        const size_t off = p.offset;
        dev_.adam_update(p.count(), a, st.values_.data() + off, st.grads_.data() + off, st.adam_m_.data() + off,
                         st.adam_v_.data() + off);
      }
      continue;
    }
    // The shard: on the host with offload (gradient shard down, Adam on the CPU, master up).
    if (sharding_.offload_optimizer)
      shard_transfer([&] { dev_.download(st.grad_shard_.data(), st.host_grads_.data(), st.shard_size_); });
    for (const ShardSegment& g : st.segments_) {
      const ParamInfo& p = st.params_[static_cast<size_t>(g.param)];
      a.weight_decay = p.weight_decay ? decay : 0.0f;
      if (sharding_.offload_optimizer) {
        const math::AdamConstants c = math::adam_constants(a);
        for (size_t e = g.shard_offset; e < g.shard_offset + g.count; ++e)
          math::adam_element(c, st.host_values_[e], st.host_m_[e], st.host_v_[e], st.host_grads_[e]);
      } else {
        float* values = sharding_.zero_stage == 3 ? st.value_shard_.data() + g.shard_offset
                                                  : st.values_.data() + p.offset + g.begin;
        dev_.adam_update(g.count, a, values, st.grad_shard_.data() + g.shard_offset, st.adam_m_.data() + g.shard_offset,
                         st.adam_v_.data() + g.shard_offset);
      }
    }
    if (sharding_.offload_optimizer && !sharding_.offload_params) {
      shard_transfer([&] {
        if (sharding_.zero_stage == 3) {
          dev_.upload(st.host_values_.data(), st.value_shard_.data(), st.shard_size_);
        } else {
          for (const Piece& pc : st.pieces_)
            dev_.upload(st.host_values_.data() + pc.shard_offset,
                        st.values_.data() + pc.begin + pc.member * pc.shard_len, pc.shard_len);
        }
      });
    }
    if (sharding_.zero_stage < 3) {  // every member's updated block, over the sharding group
      dev_.synchronize();
      for (Piece& pc : st.pieces_) {
        Tensor mine(dev_, static_cast<int64_t>(pc.shard_len), 1);
        dev_.copy(st.values_.data() + pc.begin + pc.member * pc.shard_len, mine.data(),
                  pc.shard_len);
        dev_.synchronize();
        if (sharding_.overlap_param_gather) {  // waited for by the first forward using the piece
          pc.gathering = pc.group->start_all_gather(mine.data(), st.values_.data() + pc.begin, pc.shard_len);
          pc.staged = std::move(mine);
        } else {
          shard_transfer([&] { pc.group->all_gather(mine.data(), st.values_.data() + pc.begin, pc.shard_len); });
        }
      }
    }
  }
}

void ModelShard::read_values(Stage& st, const ParamInfo& p, size_t begin, size_t count, float* host) {
  complete_parameter_gathers();
  if (sharding_.zero_stage < 3) {
    dev_.download(st.values_.data() + p.offset + begin, host, count);
    return;
  }
  const int idx = static_cast<int>(&p - st.params_.data());
  size_t covered = 0;
  for (const ShardSegment& g : st.segments_) {
    if (g.param != idx) continue;
    const size_t a = std::max(begin, g.begin), e = std::min(begin + count, g.begin + g.count);
    if (a >= e) continue;
    const size_t so = g.shard_offset + (a - g.begin);
    if (sharding_.offload_params) std::copy_n(st.host_values_.data() + so, e - a, host + (a - begin));
    else dev_.download(st.value_shard_.data() + so, host + (a - begin), e - a);
    covered += e - a;
  }
  PTDP_ASSERT(covered == count, "reading parameter values outside this rank's shard");
}

void ModelShard::write_values(Stage& st, const ParamInfo& p, size_t begin, size_t count, const float* host) {
  complete_parameter_gathers();  // a gather in flight would overwrite the values
  if (sharding_.zero_stage < 3) dev_.upload(host, st.values_.data() + p.offset + begin, count);
  if (sharding_.zero_stage == 0 || (sharding_.zero_stage < 3 && !sharding_.offload_optimizer)) return;
  const int idx = static_cast<int>(&p - st.params_.data());
  for (const ShardSegment& g : st.segments_) {
    if (g.param != idx) continue;
    const size_t a = std::max(begin, g.begin), e = std::min(begin + count, g.begin + g.count);
    if (a >= e) continue;
    const size_t so = g.shard_offset + (a - g.begin);
    if (sharding_.offload_optimizer) std::copy_n(host + (a - begin), e - a, st.host_values_.data() + so);
    if (sharding_.zero_stage == 3 && !sharding_.offload_params)
      dev_.upload(host + (a - begin), st.value_shard_.data() + so, e - a);
  }
}

void ModelShard::read_moments(Stage& st, size_t offset, size_t count, float* m, float* v) {
  if (sharding_.offload_optimizer) {
    std::copy_n(st.host_m_.data() + offset, count, m);
    std::copy_n(st.host_v_.data() + offset, count, v);
  } else {
    dev_.download(st.adam_m_.data() + offset, m, count);
    dev_.download(st.adam_v_.data() + offset, v, count);
  }
}

void ModelShard::write_moments(Stage& st, size_t offset, size_t count, const float* m, const float* v) {
  if (sharding_.offload_optimizer) {
    std::copy_n(m, count, st.host_m_.data() + offset);
    std::copy_n(v, count, st.host_v_.data() + offset);
  } else {
    dev_.upload(m, st.adam_m_.data() + offset, count);
    dev_.upload(v, st.adam_v_.data() + offset, count);
  }
}

}  // namespace ptdp::exec
