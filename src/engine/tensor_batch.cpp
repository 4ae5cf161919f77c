// Batch selection for tensor models (see tensor_batch.hpp).
#include "engine/tensor_batch.hpp"

#include <algorithm>

namespace vg {

std::vector<std::int64_t> batch_key(const TensorModelSpec& spec, std::span<const std::vector<std::int64_t>> shapes) {
  std::vector<std::int64_t> k;
  const std::size_t first = spec.batched ? 1 : 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    k.push_back(static_cast<std::int64_t>(shapes[i].size()));
    for (std::size_t d = first; d < shapes[i].size(); ++d) k.push_back(spec.paddable(i, d) ? -1 : shapes[i][d]);
  }
  return k;
}

std::vector<std::vector<std::int64_t>> batch_shapes(
    const TensorModelSpec& spec, std::span<const std::vector<std::vector<std::int64_t>>* const> requests) {
  if (requests.empty()) return {};
  std::vector<std::vector<std::int64_t>> out = *requests.front();
  for (std::size_t r = 1; r < requests.size(); ++r) {
    const auto& shapes = *requests[r];
    for (std::size_t i = 0; i < out.size() && i < shapes.size(); ++i) {
      for (std::size_t d = 0; d < out[i].size() && d < shapes[i].size(); ++d) {
        if (d == 0 && spec.batched) out[i][d] += shapes[i][d];
        else out[i][d] = std::max(out[i][d], shapes[i][d]);
      }
    }
  }
  return out;
}

std::int64_t total_elements(std::span<const std::vector<std::int64_t>> shapes) {
  std::int64_t total = 0;
  for (const auto& s : shapes) {
    std::int64_t n = 1;
    for (std::int64_t d : s) n *= d;
    total += n;
  }
  return total;
}

BatchPlan plan_batch(const TensorModelSpec& spec, const TensorMemoryProfile& profile,
                     std::span<const BatchCandidate> candidates, const BatchLimits& limits) {
  BatchPlan plan;
  if (candidates.empty()) return plan;
  const auto rows = [&](const BatchCandidate& c) -> std::int64_t {
    return spec.batched && !c.shapes.empty() && !c.shapes.front().empty() ? c.shapes.front().front() : 1;
  };
  const std::vector<std::int64_t> key = batch_key(spec, candidates.front().shapes);
  const int max_requests = spec.batched ? std::max(1, limits.max_requests) : 1;
  std::vector<const std::vector<std::vector<std::int64_t>>*> members{&candidates.front().shapes};
  plan.members.push_back(0);
  plan.held_bytes = candidates.front().held_bytes;
  std::int64_t total_rows = rows(candidates.front());
  for (std::size_t i = 1; i < candidates.size(); ++i) {
    const BatchCandidate& c = candidates[i];
    if (batch_key(spec, c.shapes) != key) continue;
    if (static_cast<int>(plan.members.size()) == max_requests || total_rows + rows(c) > limits.max_rows) {
      plan.full = true;
      break;
    }
    members.push_back(&c.shapes);
    const std::int64_t cost = tensor_cost(profile, total_elements(batch_shapes(spec, members)));
    if (limits.extra_bytes && cost > plan.held_bytes + c.held_bytes + *limits.extra_bytes) {
      members.pop_back();  // its padding would pass the free budget: leave it for a later pass
      continue;
    }
    plan.members.push_back(i);
    plan.held_bytes += c.held_bytes;
    total_rows += rows(c);
  }
  if (static_cast<int>(plan.members.size()) == max_requests || total_rows == limits.max_rows) plan.full = true;
  plan.shapes = batch_shapes(spec, members);
  plan.cost_bytes = tensor_cost(profile, total_elements(plan.shapes));
  return plan;
}

}  // namespace vg
