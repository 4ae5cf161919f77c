// DecoderModel's step layout and causal attention over the KV cache (see
// decoder.hpp): the Plan of a step, the host decode kernel's sequences, the
// tensor path's decode groups gathered from the pool, and prefill chunks.
// Called from the model's engine thread.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "model/decoder.hpp"
#include "model/gpt2_attention.hpp"

namespace vg::detail {
namespace {

/// A view of `base`'s storage with `sizes`, `strides` and `offset` (in
/// elements), made directly rather than through the dispatcher: a view
/// launches nothing, and per-sequence views of the caches are the only
/// per-sequence host work of a batched decode layer. The caller keeps the
/// view inside the storage.
at::Tensor direct_view(const at::Tensor& base, at::IntArrayRef sizes, at::IntArrayRef strides, std::int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                   base.key_set(), base.dtype());
  impl->set_sizes_and_strides(sizes, strides);
  impl->set_storage_offset(offset);
  return at::Tensor(std::move(impl));
}

/// `count` slots of a pool view [slots, n_kv_head, head_dim] from `first`.
at::Tensor slot_range(const at::Tensor& pool, std::int64_t first, std::int64_t count) {
  return direct_view(pool, {count, pool.size(1), pool.size(2)}, pool.strides(),
                     pool.storage_offset() + first * pool.stride(0));
}

/// The cached keys or values a segment reads from a pool view [slots,
/// n_kv_head, head_dim]: a view of consecutive slots, or gathered from its slots.
at::Tensor read_positions(const at::Tensor& pool, const Segment& s, std::int64_t count) {
  return s.first_slot >= 0 ? slot_range(pool, s.first_slot, count) : pool.index_select(0, s.slots);
}

/// libtorch's CPU batched matrix product runs a small-matrix kernel (float
/// accumulation) when contraction x rows x columns is below this, BLAS-style
/// kernels otherwise (aten/src/ATen/native/LinearAlgebra.cpp,
/// bmm_out_or_baddbmm_); a decode's two products are head_dim x per_kv x keys
/// (attend_grouped: the query heads of one KV head are the rows).
constexpr std::int64_t kSmallMatrixProduct = 400;

}  // namespace

Plan DecoderModel::plan(std::span<const StepInput> inputs, std::span<DecoderCache* const> caches) const {
  Plan p;
  p.host_decode = uses_host_decode();
  // Input indices in row order: decode first. On the tensor path in host
  // memory, decodes whose products are small enough for libtorch's
  // small-matrix kernel come before the others and attend as their own
  // DecodeGroup, so that each gets the arithmetic it gets alone.
  const bool small_group = !p.host_decode && torch_device().is_cpu();
  const std::int64_t per_kv = config_.n_head / config_.n_kv_head;
  const auto pass_of = [&](std::size_t i) {
    if (caches[i] == nullptr || inputs[i].tokens.size() != 1) return 2;
    const std::int64_t keys = caches[i]->length() + 1;
    return small_group && keys * config_.head_dim * per_kv < kSmallMatrixProduct ? 0 : 1;
  };
  std::vector<std::size_t> order;
  std::int64_t n_small = 0;
  for (int pass = 0; pass <= 2; ++pass) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (pass_of(i) != pass) continue;
      order.push_back(i);
      if (pass == 0) ++n_small;
    }
  }
  // One host buffer [ids | positions | last rows | groups' gather and pad |
  // decode write slots | segments' slots], copied to the device at once.
  std::vector<std::int64_t> ids, positions, last_rows(inputs.size());
  p.first_rows.resize(inputs.size());
  for (std::size_t i : order) {
    Segment s;
    s.cache = caches[i];
    s.pos0 = s.cache != nullptr ? s.cache->length() : 0;
    s.t = static_cast<std::int64_t>(inputs[i].tokens.size());
    s.row0 = p.rows;
    p.rows += s.t;
    last_rows[i] = p.rows - 1;
    p.first_rows[i] = s.row0;
    for (std::int64_t j = 0; j < s.t; ++j) {
      ids.push_back(inputs[i].tokens[static_cast<std::size_t>(j)]);
      positions.push_back(s.pos0 + j);
    }
    if (s.t > 1) {
      // mask[j][k]: the query at position pos0 + j must not see key k > pos0 + j.
      const at::TensorOptions device_long = at::TensorOptions().dtype(at::kLong).device(torch_device());
      const at::Tensor rows = at::arange(s.pos0, s.pos0 + s.t, device_long).unsqueeze(1);
      const at::Tensor cols = at::arange(s.pos0 + s.t, device_long).unsqueeze(0);
      s.mask = cols > rows;
    } else if (s.cache != nullptr) {
      ++p.n_decode;
    }
    p.segments.push_back(std::move(s));
  }
  std::vector<std::int64_t> host = std::move(ids);
  host.insert(host.end(), positions.begin(), positions.end());
  host.insert(host.end(), last_rows.begin(), last_rows.end());
  if (p.n_decode > 0 && !p.host_decode) plan_decode_groups(p, n_small, host);
  const std::vector<std::int64_t> slot_lengths = plan_segment_slots(p, host);
  const at::Tensor on_device = at::tensor(host, at::TensorOptions().dtype(at::kLong)).to(torch_device());
  const auto n = static_cast<std::int64_t>(inputs.size());
  p.ids = on_device.narrow(0, 0, p.rows);
  p.positions = on_device.narrow(0, p.rows, p.rows);
  p.last_rows = on_device.narrow(0, 2 * p.rows, n);
  std::int64_t offset = 2 * p.rows + n;
  for (DecodeGroup& g : p.decode.groups) {
    const std::int64_t size = g.rows * g.keys;
    g.gather = on_device.narrow(0, offset, size);
    g.pad = on_device.narrow(0, offset + size, size).view({1, g.rows, 1, g.keys}).ne(0);
    offset += 2 * size;
  }
  if (p.decode.pool != nullptr) {
    p.decode.write = on_device.narrow(0, offset, p.n_decode);
    offset += p.n_decode;
  }
  for (std::size_t i = 0; i < p.segments.size(); ++i) {
    if (slot_lengths[i] == 0) continue;
    p.segments[i].slots = on_device.narrow(0, offset, slot_lengths[i]);
    offset += slot_lengths[i];
  }
  if (!p.decode.groups.empty() && p.decode.pool == nullptr) {
    p.decode.new_kv.reserve(2 * static_cast<std::size_t>(config_.n_layer));
  }
  return p;
}

void DecoderModel::plan_decode_groups(Plan& p, std::int64_t n_small, std::vector<std::int64_t>& host) const {
  // One pool for every decode segment: new keys go to it, and keys are gathered from it.
  p.decode.pool = &p.segments.front().cache->pool();
  for (std::int64_t i = 1; i < p.n_decode; ++i) {
    if (&p.segments[static_cast<std::size_t>(i)].cache->pool() != p.decode.pool) p.decode.pool = nullptr;
  }
  for (const auto& [row0, rows] : {std::pair{std::int64_t{0}, n_small}, std::pair{n_small, p.n_decode - n_small}}) {
    if (rows == 0) continue;
    DecodeGroup g{row0, rows, 0, {}, {}};
    for (std::int64_t i = row0; i < row0 + rows; ++i) {
      g.keys = std::max(g.keys, p.segments[static_cast<std::size_t>(i)].pos0 + 1);
    }
    p.decode.groups.push_back(std::move(g));
  }
  // Padded key j of the group's segment i reads pool slot or row gather[i *
  // keys + j]; in the concatenation [cached keys of its segments | their new
  // keys], segment i's cached keys start at the sum of the lengths before it.
  for (const DecodeGroup& g : p.decode.groups) {
    std::int64_t cached = 0;
    for (std::int64_t i = g.row0; i < g.row0 + g.rows; ++i) cached += p.segments[static_cast<std::size_t>(i)].pos0;
    const std::size_t gather = host.size();
    host.resize(gather + 2 * static_cast<std::size_t>(g.rows * g.keys));
    std::int64_t* out = host.data() + gather;
    std::int64_t* pad = out + g.rows * g.keys;
    for (std::int64_t i = 0, first = 0; i < g.rows; ++i) {
      const Segment& s = p.segments[static_cast<std::size_t>(g.row0 + i)];
      const std::int64_t length = s.pos0;
      for (std::int64_t j = 0; j < g.keys; ++j, ++out, ++pad) {
        if (p.decode.pool != nullptr) {
          *out = s.cache->slot(j <= length ? j : 0);
        } else {
          *out = j < length ? first + j : j == length ? cached + i : 0;
        }
        *pad = j > length ? 1 : 0;
      }
      first += length;
    }
  }
  if (p.decode.pool != nullptr) {
    for (std::int64_t i = 0; i < p.n_decode; ++i) {
      const Segment& s = p.segments[static_cast<std::size_t>(i)];
      host.push_back(s.cache->slot(s.pos0));
    }
  }
}

std::vector<std::int64_t> DecoderModel::plan_segment_slots(Plan& p, std::vector<std::int64_t>& host) const {
  // Positions a segment reads from its cache: pos0 + t for a prefill chunk
  // (after writing its t), pos0 for a decode of the concatenation; none for
  // decodes through the host kernel or from one pool.
  const bool decode_reads = !p.host_decode && p.decode.pool == nullptr;
  std::vector<std::int64_t> lengths(p.segments.size(), 0);
  for (std::size_t i = 0; i < p.segments.size(); ++i) {
    Segment& s = p.segments[i];
    if (s.cache == nullptr) continue;
    const bool decode = i < static_cast<std::size_t>(p.n_decode);
    if (decode && !decode_reads) continue;
    const std::int64_t reads = decode ? s.pos0 : s.pos0 + s.t;
    s.first_slot = s.cache->contiguous_first_slot(reads);
    if (s.first_slot >= 0 || reads == 0) continue;
    for (std::int64_t j = 0; j < reads; ++j) host.push_back(s.cache->slot(j));
    lengths[i] = reads;
  }
  return lengths;
}

at::Tensor DecoderModel::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                   const Plan& plan) const {
  // A static-shape decode step attends through its block table. Otherwise
  // decode segments attend together: in host memory in one decode_attention
  // call (float32 or float64), elsewhere as one DecodeBatch; every other
  // segment attends with its own tensor ops.
  if (plan.fixed.pool != nullptr) return attend_static(q, k, v, layer, plan);
  const auto first = static_cast<std::size_t>(plan.n_decode);
  std::vector<at::Tensor> y;  // attention output pieces in row order
  y.reserve(plan.segments.size() - first + 1);
  if (plan.n_decode > 0 && plan.host_decode) {
    y.push_back(dtype_ == at::kFloat    ? attend_decode<float>(q, k, v, layer, plan)
                : dtype_ == at::kDouble ? attend_decode<double>(q, k, v, layer, plan)
                                        : attend_decode<float, std::uint16_t>(q, k, v, layer, plan));
  } else if (plan.n_decode > 0) {
    y.push_back(attend_decode_batch(q, k, v, layer, plan));
  }
  for (std::size_t i = first; i < plan.segments.size(); ++i) {
    const Segment& s = plan.segments[i];
    const at::Tensor qs = q.narrow(0, s.row0, s.t);
    const at::Tensor ks = k.narrow(0, s.row0, s.t);  // [t, n_kv_head, head_dim]
    const at::Tensor vs = v.narrow(0, s.row0, s.t);
    if (s.cache == nullptr) {
      y.push_back(attend(qs, ks, vs, s.mask));
      continue;
    }
    const at::Tensor& pool_k = s.cache->pool().k(layer);
    const at::Tensor& pool_v = s.cache->pool().v(layer);
    if (s.first_slot >= 0) {
      pool_k.narrow(0, s.first_slot + s.pos0, s.t).copy_(ks);
      pool_v.narrow(0, s.first_slot + s.pos0, s.t).copy_(vs);
    } else {
      const at::Tensor write = s.slots.narrow(0, s.pos0, s.t);
      pool_k.index_copy_(0, write, ks);
      pool_v.index_copy_(0, write, vs);
    }
    y.push_back(attend(qs, read_positions(pool_k, s, s.pos0 + s.t), read_positions(pool_v, s, s.pos0 + s.t), s.mask));
  }
  return y.size() == 1 ? y[0] : at::cat(y, 0);  // [rows, n_head * head_dim]
}

template <typename T, typename C>
at::Tensor DecoderModel::attend_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                       const Plan& plan) const {
  constexpr bool kWidened = !std::is_same_v<T, C>;  // bfloat16 cache, float32 arithmetic
  const DecodeAttentionShape shape{config_.n_head, config_.n_kv_head, config_.head_dim};
  const std::int64_t q_dim = shape.n_head * shape.head_dim;
  const std::int64_t kv_dim = shape.n_kv_head * shape.head_dim;
  // Decode rows come first; contiguous [n_decode, heads, head_dim] copies
  // (queries widened to float32 when the cache is bfloat16: exact).
  const at::Tensor q_narrow = q.narrow(0, 0, plan.n_decode);
  const at::Tensor qd = kWidened ? q_narrow.to(at::kFloat).contiguous() : q_narrow.contiguous();
  const at::Tensor kd = k.narrow(0, 0, plan.n_decode).contiguous();
  const at::Tensor vd = v.narrow(0, 0, plan.n_decode).contiguous();
  const at::Tensor out = at::empty({plan.n_decode, q_dim}, qd.options());
  const T* q_row = qd.data_ptr<T>();
  const C* k_row = host_elements<C>(kd);
  const C* v_row = host_elements<C>(vd);
  T* out_row = out.data_ptr<T>();
  std::vector<DecodeSequence<T, C>> sequences;
  sequences.reserve(static_cast<std::size_t>(plan.n_decode));
  for (std::int64_t i = 0; i < plan.n_decode; ++i, q_row += q_dim, k_row += kv_dim, v_row += kv_dim, out_row += q_dim) {
    const Segment& s = plan.segments[static_cast<std::size_t>(i)];
    const KvPool& pool = s.cache->pool();
    sequences.push_back({q_row, k_row, v_row, host_elements<C>(pool.k(layer)), host_elements<C>(pool.v(layer)),
                         s.cache->blocks().data(), pool.block_tokens(), s.pos0, out_row});
  }
  decode_attention<T, C>(sequences, shape);
  return kWidened ? out.to(q.scalar_type()) : out;  // one rounding to bfloat16
}

at::Tensor DecoderModel::attend_decode_batch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layer,
                                             const Plan& plan) const {
  const at::Tensor k_new = k.narrow(0, 0, plan.n_decode).contiguous();  // [n_decode, kv_heads, head_dim]
  const at::Tensor v_new = v.narrow(0, 0, plan.n_decode).contiguous();
  if (plan.decode.pool != nullptr) {
    plan.decode.pool->k(layer).index_copy_(0, plan.decode.write, k_new);
    plan.decode.pool->v(layer).index_copy_(0, plan.decode.write, v_new);
  } else {
    plan.decode.new_kv.push_back(k_new);
    plan.decode.new_kv.push_back(v_new);
  }
  std::vector<at::Tensor> y;
  for (const DecodeGroup& g : plan.decode.groups) {
    y.push_back(attend_decode_group(q.narrow(0, g.row0, g.rows), k_new.narrow(0, g.row0, g.rows),
                                    v_new.narrow(0, g.row0, g.rows), layer, plan, g));
  }
  return y.size() == 1 ? y[0] : at::cat(y, 0);
}

at::Tensor DecoderModel::attend_decode_group(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                                             int layer, const Plan& plan, const DecodeGroup& group) const {
  const std::int64_t n = group.rows;
  const std::int64_t keys = group.keys;
  const std::int64_t kv_heads = config_.n_kv_head;
  const std::int64_t head_dim = config_.head_dim;
  // Rows are gathered whole (contiguous [kv_heads * head_dim] each), then laid
  // out head-major in one copy: [kv_heads * n, keys, head_dim].
  const auto padded = [&](const at::Tensor& rows) {
    return rows.index_select(0, group.gather)
        .view({n, keys, kv_heads, head_dim})
        .permute({2, 0, 1, 3})
        .contiguous()
        .view({kv_heads * n, keys, head_dim});
  };
  // From one pool (the new keys already in it), or from [cached keys of each
  // sequence..., new keys].
  const auto rows = [&](bool values) {
    if (plan.decode.pool != nullptr) return values ? plan.decode.pool->v(layer) : plan.decode.pool->k(layer);
    std::vector<at::Tensor> parts;
    parts.reserve(static_cast<std::size_t>(n) + 1);
    for (std::int64_t i = group.row0; i < group.row0 + n; ++i) {
      const Segment& s = plan.segments[static_cast<std::size_t>(i)];
      if (s.pos0 == 0) continue;
      const KvPool& pool = s.cache->pool();
      parts.push_back(read_positions(values ? pool.v(layer) : pool.k(layer), s, s.pos0));
    }
    parts.push_back(values ? v_new : k_new);
    return at::cat(parts, 0);
  };
  // The products have the same shapes for every sequence of the group, with
  // the sequences as one more batch dimension, so each sequence's arithmetic
  // is the one it gets alone (attend_grouped).
  return attend_grouped(q, padded(rows(false)), padded(rows(true)), group.pad, n);
}


void DecoderModel::write_decode_kv(const Plan& plan) const {
  const std::int64_t n = plan.n_decode;
  // [n, n_layer * 2, kv_heads, head_dim] -> one [n_layer, 2, kv_heads, head_dim] slice per sequence.
  const at::Tensor all = at::stack(plan.decode.new_kv, 1).view({n, config_.n_layer, 2, config_.n_kv_head, config_.head_dim});
  std::vector<at::Tensor> slots;
  slots.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const Segment& s = plan.segments[static_cast<std::size_t>(i)];
    const at::Tensor& storage = s.cache->pool().storage();  // [n_layer, 2, slots, kv_heads, head_dim]
    slots.push_back(direct_view(storage, {storage.size(0), 2, storage.size(3), storage.size(4)},
                                {storage.stride(0), storage.stride(1), storage.stride(3), storage.stride(4)},
                                storage.storage_offset() + s.cache->slot(s.pos0) * storage.stride(2)));
  }
  at::unbind_copy_out(slots, all, 0);
}

at::Tensor DecoderModel::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& mask) const {
  const std::int64_t t = q.size(0);
  const std::int64_t kv_heads = k.size(1);
  const std::int64_t group = config_.n_head / kv_heads;
  const std::int64_t head_dim = q.size(2);
  // Query head h reads KV head h / group: q [kv_heads, group, t, head_dim]
  // against k and v [kv_heads, 1, keys, head_dim].
  const at::Tensor qg = q.reshape({t, kv_heads, group, head_dim}).permute({1, 2, 0, 3});
  const at::Tensor kh = k.transpose(0, 1).unsqueeze(1);
  const at::Tensor vh = v.transpose(0, 1).unsqueeze(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor scores = at::matmul(qg, kh.transpose(2, 3)).mul_(scale);  // [kv_heads, group, t, keys]
  if (mask.defined()) scores.masked_fill_(mask, -std::numeric_limits<double>::infinity());
  const at::Tensor y = at::matmul(at::softmax(scores, -1), vh);  // [kv_heads, group, t, head_dim]
  return y.permute({2, 0, 1, 3}).reshape({t, config_.n_head * head_dim});
}


}  // namespace vg::detail
