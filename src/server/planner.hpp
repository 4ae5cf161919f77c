// The capacity planner behind `vramgate plan`: loads a model onto a device,
// measures its memory profile with the server's own code, and works out the
// budget and how many requests of each size fit at once under the admission
// settings. make_plan() and the formatters are pure; measure_plan() loads the
// model and must run on the main thread before anything else uses the device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "admission/memory_profile.hpp"
#include "common/error.hpp"
#include "config/config.hpp"

namespace vg {

/// What the plan is computed from: the settings and the measured profile.
struct PlanInputs {
  std::string model_id;              ///< model folder name, as /v1/models shows it
  std::string device;                ///< device name, e.g. "virt:0"
  int context_length = 0;            ///< tokens
  std::int64_t capacity_bytes = 0;   ///< device capacity
  double utilization = 0.9;          ///< --memory-utilization
  std::int64_t foreign_bytes = 0;    ///< held by others when measured (DeviceMemory::foreign)
  std::int64_t reserve_bytes = 0;    ///< --memory-reserve
  int max_batch = 8;                 ///< --max-batch
  int max_batch_tokens = 512;        ///< --max-batch-tokens
  std::string admission = "memory";  ///< --admission
  MemoryProfile profile;             ///< measured
};

/// One request size: prompt tokens + max_tokens.
struct PlanRow {
  int prompt_tokens = 0;
  int max_tokens = 0;
  std::int64_t cost_bytes = 0;       ///< request_cost() of this size
  std::int64_t memory_fit = 0;       ///< floor(budget / cost): how many fit in the budget
  std::int64_t concurrent = 0;       ///< min of memory_fit, max_batch and fixed:N
  std::string bound_by;              ///< "memory", "max_batch", "fixed:N", or "never fits" (413)
};

struct Plan {
  PlanInputs inputs;
  std::int64_t budget_bytes = 0;     ///< device_budget() of the inputs
  std::vector<PlanRow> rows;         ///< prompt-major; sizes beyond the context length are left out
};

/// The plan for every (prompt, max_tokens) pair with prompt + max_tokens <=
/// the context length.
Plan make_plan(const PlanInputs& inputs, std::span<const int> prompt_tokens, std::span<const int> max_tokens);

/// Creates the device of `config`, loads its model, measures the memory
/// profile as the server does at start-up, and plans. Errors: kConfig (bad
/// device, profile does not fit), kModelLoad (bad model folder).
Result<Plan> measure_plan(const ServeConfig& config, std::span<const int> prompt_tokens,
                          std::span<const int> max_tokens);

/// Human-readable: the budget arithmetic, then one table row per size.
std::string format_plan_text(const Plan& plan);

/// The same as one JSON object (inputs, profile, budget_bytes, rows).
std::string format_plan_json(const Plan& plan);

}  // namespace vg
