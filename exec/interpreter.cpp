#include "exec/interpreter.hpp"

#include <map>
#include <set>

#include <cmath>
#include <optional>
#include <unordered_map>

#include "core/error.hpp"
#include "exec/runtime/cpu_time.hpp"

namespace ptdp::exec {
namespace {

enum Direction { kForward = 0, kBackward = 1 };

// A boundary tensor on its way in: posted receive (whole tensor, or this rank's 1/t part under
// scatter/gather) or handed over by a stage of the same rank.
struct Incoming {
  Tensor full;
  Tensor part;
  std::unique_ptr<Request> request;
  int peer = -1;  // global rank of the sender
};

struct Outgoing {
  Tensor buffer;
  std::unique_ptr<Request> request;
  Action action;        // the SEND
  int peer = -1;        // its receiver's global rank
  double posted_s = 0;  // when it was posted
};

class IterationRun {
 public:
  IterationRun(ModelShard& model, ProcessGroups& groups, const Schedule& s, const InterpreterOptions& opt, int64_t step,
               const IterationBatch& batch, std::vector<TimelineEvent>* events, double t0)
      : model_(model),
        dev_(model.device()),
        g_(groups),
        s_(s),
        opt_(opt),
        step_(step),
        batch_(batch),
        events_(events),
        t0_(t0),
        me_(groups.coords.pp),
        ctx_{model.device(), *groups.tensor, {}, {}, groups.context.get(), groups.expert.get()} {
    ctx_.fp8 = opt.fp8;
    ctx_.tp_comm_overlap = opt.tp_comm_overlap;
    ctx_.expert_tensor = groups.expert_tensor.get();
    ctx_.expert_model = groups.expert_model.get();
    if (events_ != nullptr) {
      ctx_.on_tp_collective = [this](double a, double b) { record(current_, Stream::TP, a, b, "tp all-reduce"); };
      ctx_.on_recompute = [this](double a, double b) { record(current_, Stream::Compute, a, b, kRecompute); };
    }
    // Sharding transfers inside F/B/I/W/OPTIM: their exposed part (kShardWait).
    model_.on_shard_wait = nullptr;
    // The buckets a backward starts belong to the stage's REDUCE_GRAD (schedule.hpp): booked there.
    model_.on_buckets = nullptr;
    if (opt_.ledger != nullptr)
      model_.on_buckets = [this](int stage) {
        opt_.ledger->set_action(stage >= 0 ? Action{ActionKind::REDUCE_GRAD, stage, -1} : current_);
        opt_.ledger->set_bucketed(stage >= 0);
      };
    if (events_ != nullptr)
      model_.on_shard_wait = [this](double a, double b) { record(current_, Stream::DP, a, b, kShardWait); };
    const LayerShape& sh = model.shape();
    loss_scale_ = static_cast<float>(opt.loss_scale / (static_cast<double>(sh.tokens()) * static_cast<double>(s.m)));
    // Sequence parallelism sends each rank's own shard already: no scatter/gather on top.
    // The plan's rule (model/units.hpp scatter_gather_applies), decided by train.
    scatter_ = opt.scatter_gather;
  }

  IterationResult run() {
    // Overlapped gradient reduction: the backward actions each stage runs, so that the last one
    // arms its buckets (a whole B, or the last W of a split backward).
    std::map<int, int> backwards_left;
    const bool overlap = opt_.overlap_bucket_elements > 0 && model_.zero_stage() <= 1 && g_.data->size() > 1;
    if (overlap)
      for (const Action& a : s_.programs[me_].actions)
        if (a.kind == ActionKind::B || a.kind == ActionKind::W) ++backwards_left[a.stage];
    const std::vector<Action>& program = s_.programs[me_].actions;
    for (size_t i = 0; i < program.size(); ++i) {
      const Action& a = program[i];
      current_ = a;
      position_ = i;
      if (opt_.ledger) opt_.ledger->set_action(a);
      poll_sends();
      const bool last_backward = overlap && (a.kind == ActionKind::B || a.kind == ActionKind::W) && --backwards_left[a.stage] == 0;
      if (last_backward) model_.arm_overlapped_reduction(a.stage, *g_.data, opt_.overlap_bucket_elements);
      const bool compute = a.kind == ActionKind::F || a.kind == ActionKind::B || a.kind == ActionKind::I ||
                           a.kind == ActionKind::W || a.kind == ActionKind::OPTIM;
      // parallel.overlap_p2p false: the rank waits for its boundary sends before its next
      // compute (Megatron's batched p2p; the engines' blocking SEND, sim/costing.hpp).
      if (compute && opt_.blocking_p2p) finish_blocking_sends();
      const double cpu0 = compute ? compute_cpu_s() : 0;
      switch (a.kind) {
        case ActionKind::F:
          // An OVERLAP_F_B pair starts with both inputs received (schedule.hpp): the partner's
          // gradient is waited for before the F, as the engines and DualPipe wait for it.
          if (a.overlap > 0) await_partner_input(a, i);
          forward(a);
          break;
        case ActionKind::B:
        case ActionKind::I: backward(a); break;
        case ActionKind::W: weight_backward(a); break;
        case ActionKind::SEND_F: send(a, kForward); break;
        case ActionKind::SEND_B: send(a, kBackward); break;
        case ActionKind::RECV_F:
        case ActionKind::RECV_B:
          if (!posted_early_.count(i)) receive(a, a.kind == ActionKind::RECV_F ? kForward : kBackward);
          break;
        case ActionKind::REDUCE_GRAD: reduce_grad(a); break;
        case ActionKind::OPTIM: optimizer_step(a); break;
        case ActionKind::UNSHARD:
        case ActionKind::RESHARD: shard_window(a); break;
      }
      if (last_backward && a.kind == ActionKind::W) model_.gradients_final(a.stage);
      if (compute) {
        auto& [cpu, count] = result_.compute_cpu_s[{a.kind, a.kind == ActionKind::OPTIM ? me_ : a.stage}];
        cpu += compute_cpu_s() - cpu0;
        ++count;
      }
    }
    finish_sends();
    if (opt_.ledger) opt_.ledger->set_action(std::nullopt);
    model_.on_shard_wait = nullptr;
    model_.on_buckets = nullptr;
    PTDP_ASSERT(acts_.empty(), "the schedule left " + std::to_string(acts_.size()) + " microbatch(es) without backward");
    for (int d = 0; d < 2; ++d) {
      PTDP_ASSERT(in_[d].empty(), "the schedule received a tensor no action consumed");
      PTDP_ASSERT(out_[d].empty(), "the schedule produced a tensor it never sent");
    }
    return result_;
  }

 private:
  int key(int stage, int mb) const { return stage * s_.m + mb; }
  bool local(int stage) const { return s_.stage_to_rank[stage] == me_; }
  int tag(Direction d, int receiver_stage, int mb) const {
    const int64_t t = (static_cast<int64_t>(d) * s_.num_stages() + receiver_stage) * s_.m + mb;
    PTDP_ASSERT(t <= g_.pipeline->max_tag(), "too many stages × microbatches for MPI tags");
    return static_cast<int>(t);
  }
  int global_of(int stage) const { return g_.coords.global_rank_at_pipeline(s_.stage_to_rank[stage]); }
  const int32_t* tokens(int mb) const { return batch_.inputs.empty() ? nullptr : batch_.inputs[mb].data(); }
  const int32_t* targets(int mb) const { return batch_.targets.empty() ? nullptr : batch_.targets[mb].data(); }

  void record(const Action& a, Stream stream, double start, double end, std::string label = {}, int peer = -1) {
    if (events_ == nullptr) return;
    TimelineEvent e;
    e.device = g_.coords.global_rank();
    e.pipeline_rank = me_;
    e.action = a;
    e.stream = stream;
    e.start_s = start - t0_;
    e.end_s = end - t0_;
    e.label = std::move(label);
    e.peer = peer;
    events_->push_back(std::move(e));
  }

  void poll_sends() {
    if (opt_.blocking_p2p) return;  // finish_sends records each wait
    std::erase_if(sends_, [](Outgoing& o) { return o.request->test(); });
  }

  // Completes the outstanding sends; blocking ones (parallel.overlap_p2p false) are shown from
  // their post to their completion, the time their rank waited for them.
  void finish_sends() {
    for (Outgoing& o : sends_) complete(o);
    sends_.clear();
  }
  void complete(Outgoing& o) {
    o.request->wait();
    if (opt_.blocking_p2p) record_wait(o);
  }
  void record_wait(const Outgoing& o) { record(o.action, Stream::PP, o.posted_s, now_s(), kBlockingSend, o.peer); }

  // Before the compute at program[i]: the blocking sends complete. A send completes once its
  // receiver has posted the RECV, which that rank may reach only after waiting for a send of its
  // own to this one, or for a tensor this rank sends after the pending one: a rank that waits
  // (for a send or a receive) posts its later RECVs ahead, one at a time, until the wait ends —
  // at worst all of them, as the engines' receivers take messages eagerly. No two ranks can then
  // hold each other up.
  void finish_blocking_sends() {
    while (!sends_.empty()) {
      std::erase_if(sends_, [this](Outgoing& o) {
        if (!o.request->test()) return false;
        record_wait(o);
        return true;
      });
      if (sends_.empty()) break;
      if (post_receive_ahead()) continue;
      complete(sends_.front());
      sends_.erase(sends_.begin());
    }
  }

  // Posts the first RECV after the current action that is not posted yet; false when none is
  // left (finish_blocking_sends, await_input).
  bool post_receive_ahead() {
    const std::vector<Action>& program = s_.programs[me_].actions;
    auto receives = [](ActionKind k) { return k == ActionKind::RECV_F || k == ActionKind::RECV_B; };
    ahead_ = std::max(ahead_, position_ + 1);
    while (ahead_ < program.size() && (!receives(program[ahead_].kind) || posted_early_.count(ahead_))) ++ahead_;
    if (ahead_ == program.size()) return false;
    const Action& r = program[ahead_];
    if (opt_.ledger) opt_.ledger->set_action(r);
    receive(r, r.kind == ActionKind::RECV_F ? kForward : kBackward);
    if (opt_.ledger) opt_.ledger->set_action(current_);
    posted_early_.insert(ahead_++);
    return true;
  }

  // Completes the receive of a boundary tensor (the exposed wait is the RECV's event) and
  // all-gathers the parts under scatter/gather; the tensor then waits in `in_` for its consumer.
  // A tensor received from this rank itself, or already completed, costs nothing.
  void await_input(Direction d, int stage, int mb) {
    auto it = in_[d].find(key(stage, mb));
    PTDP_ASSERT(it != in_[d].end(), "no " + std::string(d == kForward ? "activation" : "gradient") + " for stage " +
                                        std::to_string(stage) + " microbatch " + std::to_string(mb) +
                                        ": the schedule consumes it before receiving it");
    Incoming& in = it->second;
    if (!in.request) return;
    const Action recv{d == kForward ? ActionKind::RECV_F : ActionKind::RECV_B, stage, mb};
    const double start = now_s();
    // Blocking sends: the sender of this tensor may be waiting for a receive this rank posts
    // only later (finish_blocking_sends).
    if (opt_.blocking_p2p)
      while (!in.request->test() && post_receive_ahead()) {
      }
    in.request->wait();
    in.request.reset();
    record(recv, Stream::PP, start, now_s(), {}, in.peer);
    if (!in.part.empty()) {
      const double gather_start = now_s();
      // The all-gather is part of the RECV (schedule.hpp), though it runs where the data is used.
      if (opt_.ledger) opt_.ledger->set_action(recv);
      g_.tensor->all_gather(in.part.data(), in.full.data(), in.part.size());
      if (opt_.ledger) opt_.ledger->set_action(current_);
      record(recv, Stream::PP, gather_start, now_s(), kPipelineAllGather, in.peer);
      in.part = Tensor();
    }
  }

  // The gradient input of the partner (the next compute action) of the OVERLAP_F_B pair begun by
  // program[i], when it arrives from another rank and has been posted.
  void await_partner_input(const Action& a, size_t i) {
    const std::vector<Action>& program = s_.programs[me_].actions;
    size_t k = i + 1;
    while (k < program.size() && !is_compute(program[k].kind)) ++k;
    PTDP_ASSERT(k < program.size() && program[k].overlap < 0 && program[k].stage == a.overlap_stage,
                "the OVERLAP_F_B pair of " + a.str() + " has no partner after it");
    const Action& partner = program[k];
    if (in_[kBackward].count(key(partner.stage, partner.microbatch))) await_input(kBackward, partner.stage, partner.microbatch);
  }

  // The boundary tensor a compute action consumes (received first, see await_input).
  Tensor take(Direction d, int stage, int mb) {
    await_input(d, stage, mb);
    auto it = in_[d].find(key(stage, mb));
    Tensor full = std::move(it->second.full);
    in_[d].erase(it);
    return full;
  }

  // Hands a produced boundary tensor to the consumer stage: directly when it lives on this
  // rank, else it waits for the SEND action.
  void deliver(Direction d, int from_stage, int to_stage, int mb, Tensor t) {
    if (local(to_stage)) {
      Incoming in;
      in.full = std::move(t);
      in_[d][key(to_stage, mb)] = std::move(in);
    } else {
      out_[d][key(from_stage, mb)] = std::move(t);
    }
  }

  // The dropout masks of microbatch `mb` (the layer is set per layer by the model).
  void draw_dropout(int mb) {
    ctx_.dropout.seed = opt_.dropout_seed;
    ctx_.dropout.step = step_;
    ctx_.dropout.first_sample = batch_.first_sample.empty() ? mb : batch_.first_sample[static_cast<size_t>(mb)];
  }

  void forward(const Action& a) {
    Tensor input;
    if (!s_.first_stage(a.stage)) input = take(kForward, a.stage, a.microbatch);
    const double start = now_s();
    StageActivations& st = acts_[key(a.stage, a.microbatch)];
    draw_dropout(a.microbatch);
    const double loss = model_.forward(ctx_, a.stage, tokens(a.microbatch), targets(a.microbatch), std::move(input), st,
                                       opt_.recompute);
    dev_.synchronize();
    record(a, Stream::Compute, start, now_s());
    if (s_.last_stage(a.stage)) {
      result_.loss_sum += loss;
      result_.mtp_loss_sum += st.mtp_loss;
    } else {
      deliver(kForward, a.stage, a.stage + 1, a.microbatch, std::move(st.output));
    }
  }

  void backward(const Action& a) {
    Tensor dout;
    if (!s_.last_stage(a.stage)) dout = take(kBackward, a.stage, a.microbatch);
    const double start = now_s();
    const int k = key(a.stage, a.microbatch);
    auto it = acts_.find(k);
    PTDP_ASSERT(it != acts_.end() && !it->second.backward_done, "backward " + a.str() + " without its forward");
    const bool split = a.kind == ActionKind::I;
    draw_dropout(a.microbatch);
    Tensor dx = model_.backward(ctx_, a.stage, tokens(a.microbatch), targets(a.microbatch), std::move(dout), it->second,
                                loss_scale_, opt_.recompute, split);
    if (!split) acts_.erase(it);
    dev_.synchronize();
    record(a, Stream::Compute, start, now_s());
    if (!s_.first_stage(a.stage)) deliver(kBackward, a.stage, a.stage - 1, a.microbatch, std::move(dx));
  }

  void weight_backward(const Action& a) {
    const double start = now_s();
    auto it = acts_.find(key(a.stage, a.microbatch));
    PTDP_ASSERT(it != acts_.end() && it->second.backward_done, "W " + a.str() + " without its I");
    model_.weight_backward(it->second);
    acts_.erase(it);
    dev_.synchronize();
    record(a, Stream::Compute, start, now_s());
  }

  void send(const Action& a, Direction d) {
    const int to = d == kForward ? a.stage + 1 : a.stage - 1;
    if (local(to)) return;  // handed over in memory when produced
    auto it = out_[d].find(key(a.stage, a.microbatch));
    PTDP_ASSERT(it != out_[d].end(), "send " + a.str() + " before the action producing it");
    const double start = now_s();
    Outgoing o;
    o.buffer = std::move(it->second);
    out_[d].erase(it);
    size_t count = o.buffer.size();
    const float* data = o.buffer.data();
    if (scatter_) {
      count /= static_cast<size_t>(g_.tensor->size());
      data += count * static_cast<size_t>(g_.tensor->rank());
    }
    dev_.synchronize();
    o.request = g_.pipeline->isend(data, count, s_.stage_to_rank[to], tag(d, to, a.microbatch));
    o.action = a, o.peer = global_of(to), o.posted_s = start;
    sends_.push_back(std::move(o));
    if (!opt_.blocking_p2p) record(a, Stream::PP, start, now_s(), {}, global_of(to));
  }

  void receive(const Action& a, Direction d) {
    const int from = d == kForward ? a.stage - 1 : a.stage + 1;
    if (local(from)) return;
    const LayerShape& sh = model_.shape();
    Incoming in;
    in.full = Tensor(dev_, sh.local_tokens(), sh.hidden);
    in.peer = global_of(from);
    float* dst = in.full.data();
    size_t count = in.full.size();
    if (scatter_) {
      count /= static_cast<size_t>(g_.tensor->size());
      in.part = Tensor(dev_, static_cast<int64_t>(count), 1);
      dst = in.part.data();
    }
    in.request = g_.pipeline->irecv(dst, count, s_.stage_to_rank[from], tag(d, a.stage, a.microbatch));
    auto [it, inserted] = in_[d].try_emplace(key(a.stage, a.microbatch), std::move(in));
    PTDP_ASSERT(inserted, "receive " + a.str() + " posted twice");
    // Posting is instantaneous; the exposed wait is recorded when the consumer needs the data.
  }

  // UNSHARD / RESHARD: stage 3 gathers the stage's units and keeps them until the RESHARD;
  // without parameter sharding the parameters are already whole (nothing happens).
  void shard_window(const Action& a) {  // UNSHARD opens the window, RESHARD closes it
    if (model_.zero_stage() < 3) return;
    const double start = now_s();
    if (a.kind == ActionKind::UNSHARD) model_.unshard_stage(a.stage);
    else model_.reshard_stage(a.stage);
    record(a, Stream::DP, start, now_s());
  }

  void reduce_grad(const Action& a) {
    const double start = now_s();
    // DualPipe: reduce_gradients also sums the stage's copy in the other lane (on the mirror
    // rank, which reduces its stages in the same order: Schedule's reduction_order).
    model_.reduce_gradients(a.stage, *g_.data);
    // Sequence parallelism: the norms', row-parallel biases' and positions' gradients cover
    // this rank's tokens only; their sum over the TP group is the gradient (a sum: after the
    // data-parallel reduction as well as before).
    const auto partial = model_.sequence_parallel_grads(a.stage);
    if (!partial.empty()) {
      dev_.synchronize();
      for (auto [grad, count] : partial) g_.tensor->all_reduce(grad, count, ReduceOp::Sum);
    }
    // The tied embedding's two copies (first and last stage, on different pipeline ranks) get
    // the sum of both gradients.
    if (g_.embedding && (s_.first_stage(a.stage) || s_.last_stage(a.stage))) {
      dev_.synchronize();
      for (auto [grad, count] : model_.tied_embedding_grads()) g_.embedding->all_reduce(grad, count, ReduceOp::Sum);
    }
    record(a, Stream::DP, start, now_s());
  }

  void optimizer_step(const Action& a) {
    const double own_start = now_s();
    dev_.synchronize();
    // Aux-loss-free routers: the expert biases move by this iteration's loads (as Megatron's
    // finalize_model_grads does, whatever the step then does).
    // (With sequence parallelism each tensor rank counted its own tokens.)
    model_.update_expert_bias(*g_.data, g_.mirror.get(),
                              g_.expert_tensor && model_.shape().sequence_parallel() ? g_.tensor.get() : nullptr);
    double sq = model_.grad_sum_squares();
    double experts = model_.expert_grad_sum_squares();
    // Sharded: each member of the sharding group holds a different part of the gradients; with
    // expert parallelism each member of the expert-data group a different part of its experts'.
    if (model_.zero_stage() > 0) {
      if (Communicator* e = model_.expert_sharding_group()) {
        e->all_reduce(&experts, 1, ReduceOp::Sum);
      } else {
        sq += experts;
        experts = 0;
      }
      model_.sharding().group->all_reduce(&sq, 1, ReduceOp::Sum);
    }
    // Routed experts: each member of the expert-parallel group holds different ones. Folded
    // (expert-tensor size ≠ t): each member of the expert-model group holds different shards of
    // them, and the stage's tensor rank 0 adds their sum once to the model group's norm.
    if (model_.shape().moe_folded && g_.expert_model) {
      g_.expert_model->all_reduce(&experts, 1, ReduceOp::Sum);
      if (g_.coords.tp != 0) experts = 0;
    } else if (g_.expert) {
      g_.expert->all_reduce(&experts, 1, ReduceOp::Sum);
    }
    sq += experts;
    // Post-validated: step now with unclipped gradients, keeping the state to roll back to.
    std::optional<ModelShard::OptimizerSnapshot> before;
    if (opt_.post_validate) {
      before = model_.save_optimizer_state();
      model_.adam_step(opt_.adam, step_ + 1 - opt_.skipped_steps, static_cast<float>(1.0 / opt_.loss_scale));
      dev_.synchronize();
    }
    const double own_s = now_s() - own_start;
    // Gradient norm over the model-parallel group: a synchronisation point of the pipeline.
    // Waiting in it for the other ranks is idle time (as in every engine), so the action's
    // event covers this rank's own work only.
    g_.model->all_reduce(&sq, 1, ReduceOp::Sum);
    const double start = now_s() - own_s;
    // Loss scaling: every gradient is loss_scale times the true one; an inf or NaN anywhere makes
    // Σ grad² non-finite on every rank (the reductions carry it), so all skip the step alike.
    const double norm = std::sqrt(sq) / opt_.loss_scale;
    result_.grad_norm = norm;
    if (opt_.loss_scale != 1.0 && !std::isfinite(norm)) {
      result_.overflow = true;
      if (before) model_.restore_optimizer_state(*before);
      dev_.synchronize();
      record(a, Stream::Compute, start, now_s());
      return;
    }
    float scale = 1.0f;
    if (opt_.adam.clip_grad > 0 && norm > opt_.adam.clip_grad)
      scale = static_cast<float>(opt_.adam.clip_grad / (norm + 1e-6));
    if (before && (scale != 1.0f || !std::isfinite(norm))) {  // the check failed: as with the barrier
      model_.restore_optimizer_state(*before);
      result_.rolled_back = true;
      before.reset();
    }
    if (!before) model_.adam_step(opt_.adam, step_ + 1 - opt_.skipped_steps, static_cast<float>(scale / opt_.loss_scale));
    dev_.synchronize();
    record(a, Stream::Compute, start, now_s());
  }

  ModelShard& model_;
  Device& dev_;
  ProcessGroups& g_;
  const Schedule& s_;
  const InterpreterOptions& opt_;
  int64_t step_;
  const IterationBatch& batch_;
  std::vector<TimelineEvent>* events_;
  double t0_;
  int me_;
  LayerContext ctx_;
  float loss_scale_ = 1;
  bool scatter_ = false;
  Action current_;
  std::unordered_map<int, StageActivations> acts_;
  std::unordered_map<int, Incoming> in_[2];  // by (receiver stage, mb)
  std::unordered_map<int, Tensor> out_[2];   // by (sender stage, mb): produced, not yet sent
  std::vector<Outgoing> sends_;
  std::set<size_t> posted_early_;  // program positions of RECVs posted ahead (post_receive_ahead)
  size_t position_ = 0;            // of the current action in the program
  size_t ahead_ = 0;               // where post_receive_ahead looks next
  IterationResult result_;
};

}  // namespace

Interpreter::Interpreter(ModelShard& model, ProcessGroups& groups, const Schedule& schedule, InterpreterOptions options)
    : model_(model), groups_(groups), schedule_(schedule), options_(std::move(options)) {
  PTDP_ASSERT(schedule.lowered, "the interpreter runs lowered schedules");
  PTDP_ASSERT(schedule.p == groups.pipeline->size(), "schedule p differs from the pipeline group size");
}

IterationResult Interpreter::run(int64_t step, const IterationBatch& batch, std::vector<TimelineEvent>* events,
                                 double t0_s) {
  IterationRun run(model_, groups_, schedule_, options_, step, batch, events, t0_s);
  return run.run();
}

}  // namespace ptdp::exec
