// `vramgate plan` for a TorchScript model: loads it onto the device, measures
// its memory profile with the server's own code, and prints the fit and a
// table of input shapes with their predicted peak, cost and how many fit at
// once. make_tensor_plan() and the formatters are pure; measure_tensor_plan()
// loads the model and must run on the main thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "admission/tensor_cost.hpp"
#include "common/error.hpp"
#include "config/config.hpp"
#include "model/tensor_spec.hpp"

namespace vg {

struct TensorPlanRow {
  std::vector<std::int64_t> shape;  ///< the first input's shape, batch 1
  std::int64_t elements = 0;        ///< input elements
  std::int64_t predicted_bytes = 0; ///< predicted_peak()
  std::int64_t cost_bytes = 0;      ///< tensor_cost()
  std::int64_t memory_fit = 0;      ///< floor(budget / cost)
  std::int64_t concurrent = 0;      ///< min of memory_fit, max_batch and fixed:N
};

struct TensorPlan {
  std::string model_id;
  std::string device;
  std::string admission;
  int max_batch = 1;
  std::int64_t capacity_bytes = 0;
  std::int64_t budget_bytes = 0;
  TensorMemoryProfile profile;
  std::vector<TensorPlanRow> rows;
};

/// Rows at 0, 1/4, 1/2, 3/4 and all of every variable dimension's range.
TensorPlan make_tensor_plan(const TensorModelSpec& spec, TensorPlan plan);

/// Loads the first model of --model-dir (a TorchScript folder) on the first
/// --device and plans. Errors: kConfig, kModelLoad.
Result<TensorPlan> measure_tensor_plan(const ServeConfig& config);

std::string format_tensor_plan_text(const TensorPlan& plan);
std::string format_tensor_plan_json(const TensorPlan& plan);

}  // namespace vg
