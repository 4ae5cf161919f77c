#include "admission/batch_size.hpp"

namespace vg {
namespace {

std::int64_t workspace_sum(std::span<const MemoryProfile> profiles, int batch) {
  std::int64_t sum = 0;
  for (const MemoryProfile& p : profiles) sum += at_batch(p, batch).workspace_bytes;
  return sum;
}

}  // namespace

int choose_max_batch(std::span<const MemoryProfile> profiles, std::int64_t budget_bytes, int max_batch_tokens) {
  const std::int64_t base = workspace_sum(profiles, kDefaultMaxBatch);
  const std::int64_t allowance = budget_bytes > 0 ? budget_bytes / 8 : 0;
  for (int batch = kLargestMaxBatch; batch > kDefaultMaxBatch; batch /= 2) {
    if (batch > max_batch_tokens) continue;
    if (workspace_sum(profiles, batch) - base <= allowance) return batch;
  }
  return kDefaultMaxBatch;
}

}  // namespace vg
