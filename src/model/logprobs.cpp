// token_logprobs (see logprobs.hpp): one max, one sum of exponentials, then
// a partial sort for the top alternatives.
#include "model/logprobs.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vg {

LogprobResult token_logprobs(std::span<const float> logits, std::int32_t token, int top) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  LogprobResult out;
  double max = kNegInf;
  for (float x : logits) {
    if (!std::isnan(x) && x > max) max = x;
  }
  double sum = 0;
  if (std::isfinite(max)) {
    for (float x : logits) {
      if (!std::isnan(x)) sum += std::exp(static_cast<double>(x) - max);
    }
  }
  const double log_z = std::isfinite(max) && sum > 0 ? max + std::log(sum) : kNegInf;
  auto value = [&](std::size_t i) {
    const float x = logits[i];
    if (std::isnan(x) || !std::isfinite(log_z)) return kNegInf;
    return static_cast<double>(x) - log_z;
  };
  out.logprob = token >= 0 && static_cast<std::size_t>(token) < logits.size()
                    ? value(static_cast<std::size_t>(token))
                    : kNegInf;
  const std::size_t k = std::min(logits.size(), static_cast<std::size_t>(std::max(0, top)));
  if (k == 0) return out;
  std::vector<std::int32_t> ids(logits.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  auto key = [&](std::int32_t i) {
    const float x = logits[static_cast<std::size_t>(i)];
    return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x;
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](std::int32_t a, std::int32_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); });
  out.top.reserve(k);
  for (std::size_t i = 0; i < k; ++i) out.top.push_back({ids[i], value(static_cast<std::size_t>(ids[i]))});
  return out;
}

}  // namespace vg
