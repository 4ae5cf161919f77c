// DecoderModel::decode_step (see decoder.hpp): a decode step whose tensors
// have fixed shapes (batch and key buckets, StaticDecode) on the tensor
// path, the layout of step() elsewhere, and the picks made on the device.
// Called from the model's engine thread.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/decoder.hpp"
#include "model/device_sampler.hpp"

namespace vg::detail {
namespace {

/// The smallest power of two >= n (n >= 1).
std::int64_t next_power_of_two(std::int64_t n) {
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

std::int64_t DecoderModel::batch_bucket(std::int64_t rows) {
  return next_power_of_two(std::max<std::int64_t>(1, rows));
}

bool DecoderModel::static_decode_fits(std::span<DecoderCache* const> caches) const {
  if (uses_host_decode() || !pool_) return false;
  return std::all_of(caches.begin(), caches.end(),
                     [&](const DecoderCache* c) { return c->pool_ptr() == pool_ && c->length() >= 1; });
}

StaticShape DecoderModel::static_shape(std::span<DecoderCache* const> caches) const {
  const std::int64_t bt = pool_->block_tokens();
  std::int64_t blocks = 1;
  for (const DecoderCache* c : caches) blocks = std::max(blocks, blocks_for_tokens(c->length() + 1, bt));
  const auto rows = static_cast<std::int64_t>(caches.size());
  return {rows, batch_bucket(rows), std::min(next_power_of_two(blocks), blocks_for_tokens(config_.n_positions, bt))};
}

std::vector<std::int64_t> DecoderModel::static_inputs(std::span<const StepInput> inputs,
                                                      std::span<DecoderCache* const> caches,
                                                      const StaticShape& shape) const {
  const std::int64_t b = shape.bucket;
  const std::int64_t blocks = shape.blocks;
  using Part = StaticShape::Part;
  std::vector<std::int64_t> host(static_cast<std::size_t>(shape.input_size()), 0);
  std::int64_t* ids = host.data() + shape.at(Part::kIds);
  std::int64_t* positions = host.data() + shape.at(Part::kPositions);
  std::int64_t* write = host.data() + shape.at(Part::kWrite);
  std::int64_t* padding = host.data() + shape.at(Part::kPadding);
  std::int64_t* table = host.data() + shape.at(Part::kTable);
  for (std::int64_t i = 0; i < b; ++i) {
    const bool real = i < shape.rows;
    const DecoderCache& c = *caches[static_cast<std::size_t>(real ? i : 0)];
    ids[i] = real ? inputs[static_cast<std::size_t>(i)].tokens[0] : 0;
    positions[i] = real ? c.length() : 0;
    write[i] = c.slot(real ? c.length() : 0);
    padding[i] = real ? 0 : 1;
    const std::vector<std::int32_t>& own = c.blocks();
    for (std::int64_t j = 0; j < blocks; ++j) {
      table[i * blocks + j] = j < static_cast<std::int64_t>(own.size()) ? own[static_cast<std::size_t>(j)] : own[0];
    }
  }
  return host;
}

Plan DecoderModel::static_views(const at::Tensor& buffer, const StaticShape& shape) const {
  Plan p;
  StaticDecode& f = p.fixed;
  const std::int64_t b = shape.bucket;
  const std::int64_t bt = pool_->block_tokens();
  f.pool = pool_.get();
  f.rows = shape.rows;
  f.bucket = b;
  f.keys = shape.blocks * bt;
  const at::TensorOptions device_long = at::TensorOptions().dtype(at::kLong).device(torch_device());
  p.rows = b;
  p.n_decode = b;
  using Part = StaticShape::Part;
  p.ids = buffer.narrow(0, shape.at(Part::kIds), b);
  p.positions = buffer.narrow(0, shape.at(Part::kPositions), b);
  f.write = buffer.narrow(0, shape.at(Part::kWrite), b);
  f.padding = buffer.narrow(0, shape.at(Part::kPadding), b).ne(0).view({b, 1, 1});
  const at::Tensor block_table = buffer.narrow(0, shape.at(Part::kTable), b * shape.blocks).view({b, shape.blocks, 1});
  f.slots = block_table.mul(bt).add(at::arange(bt, device_long)).view({b * f.keys});
  f.pad = at::arange(f.keys, device_long).view({1, f.keys}).gt(p.positions.view({b, 1})).view({1, b, 1, f.keys});
  return p;
}

at::Tensor DecoderModel::static_logits(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches) {
  const StaticShape shape = static_shape(caches);
  std::vector<std::int64_t> host = static_inputs(inputs, caches, shape);
  const at::Tensor on_host = at::from_blob(host.data(), {shape.input_size()}, at::TensorOptions().dtype(at::kLong));
  if (DecodeGraph* g = graphs_ ? graphs_->find(shape) : nullptr) {
    g->inputs.copy_(on_host);
    g->graph->replay();
    ++graph_stats_.replays;
    return graphs_->logits.narrow(0, 0, shape.rows);
  }
  if (graphs_) ++graph_stats_.eager;
  // The LM head on every padded row, as a replay runs it: the same shapes
  // give the same kernels (cuBLAS picks by shape and is not batch-invariant
  // across them), so a step's logits do not depend on whether a graph ran it.
  const at::Tensor x = hidden(static_views(on_host.to(torch_device()), shape));
  return head(x).narrow(0, 0, shape.rows);
}

at::Tensor DecoderModel::attend_static(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                       const Plan& plan) const {
  const StaticDecode& f = plan.fixed;
  const std::int64_t n = f.bucket;
  const std::int64_t keys = f.keys;
  const std::int64_t kv_heads = config_.n_kv_head;
  const std::int64_t head_dim = config_.head_dim;
  const at::Tensor& pool_k = f.pool->k(layer);
  const at::Tensor& pool_v = f.pool->v(layer);
  // New keys and values to their slots (padding rows write back what is there).
  pool_k.index_copy_(0, f.write, at::where(f.padding, pool_k.index_select(0, f.write), k));
  pool_v.index_copy_(0, f.write, at::where(f.padding, pool_v.index_select(0, f.write), v));
  // [bucket * keys] slots -> [kv_heads * bucket, keys, head_dim], as attend_decode_group lays them out.
  const auto padded = [&](const at::Tensor& pool) {
    return pool.index_select(0, f.slots)
        .view({n, keys, kv_heads, head_dim})
        .permute({2, 0, 1, 3})
        .contiguous()
        .view({kv_heads * n, keys, head_dim});
  };
  return attend_grouped(q, padded(pool_k), padded(pool_v), f.pad, n);
}

at::Tensor DecoderModel::attend_grouped(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                        const at::Tensor& pad, std::int64_t n) const {
  const std::int64_t kv_heads = config_.n_kv_head;
  const std::int64_t per_kv = config_.n_head / kv_heads;
  const std::int64_t head_dim = config_.head_dim;
  const std::int64_t width = keys.size(1);
  // Query head h reads KV head h / per_kv: the per_kv query heads of a KV
  // head are the rows of one product with that head's keys, so K and V are
  // read once, not copied per query head (a broadcast product would expand
  // them to [.., per_kv, ..] first).
  const at::Tensor qg =
      q.reshape({n, kv_heads, per_kv, head_dim}).permute({1, 0, 2, 3}).reshape({kv_heads * n, per_kv, head_dim});
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor scores = at::bmm(qg, keys.transpose(1, 2)).mul_(scale);  // [kv_heads * n, per_kv, keys]
  scores.view({kv_heads, n, per_kv, width}).masked_fill_(pad, -std::numeric_limits<double>::infinity());
  const at::Tensor y = at::bmm(at::softmax(scores, -1), values);  // [kv_heads * n, per_kv, head_dim]
  return y.view({kv_heads, n, per_kv, head_dim}).permute({1, 0, 2, 3}).reshape({n, config_.n_head * head_dim});
}

at::Tensor DecoderModel::ragged_logits(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches) const {
  const Plan p = plan(inputs, caches);
  const at::Tensor x = hidden(p);
  if (p.n_decode > 0 && !p.host_decode && p.decode.pool == nullptr) write_decode_kv(p);
  return head(x.index_select(0, p.last_rows));
}

Result<std::vector<SampledToken>> DecoderModel::decode_step(std::span<const StepInput> inputs,
                                                            std::span<const SampleSpec> specs) {
  // In host memory the host kernels' step and the host sampler are faster
  // than the sampler's tensor ops, whose every op may wake the compute threads.
  if (uses_host_decode()) return Model::decode_step(inputs, specs);
  if (Status s = check_decode_inputs(inputs, specs); !s.ok()) return s.error();
  std::vector<DecoderCache*> caches;
  if (Status s = validate(inputs, caches); !s.ok()) return s.error();
  if (inputs.empty()) return std::vector<SampledToken>();
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  try {
    std::vector<SampledToken> out = sample_on_device(
        static_decode_fits(caches) ? static_logits(inputs, caches) : ragged_logits(inputs, caches), specs);
    for (std::size_t i = 0; i < inputs.size(); ++i) caches[i]->advance(inputs[i].tokens);
    return out;
  } catch (...) {
    return current_exception_error("decode step of " + std::to_string(inputs.size()) + " inputs on " + device_->name());
  }
}

}  // namespace vg::detail
