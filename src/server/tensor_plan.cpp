// The capacity plan of a TorchScript model (see tensor_plan.hpp).
#include "server/tensor_plan.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "admission/admission_policy.hpp"
#include "admission/memory_profile.hpp"
#include "common/decimal.hpp"
#include "device/device.hpp"
#include "engine/tensor_profiler.hpp"
#include "model/model.hpp"
#include "model/runtime.hpp"
#include "model/torchscript_model.hpp"
#include "service/model_setup.hpp"

namespace vg {

TensorPlan make_tensor_plan(const TensorModelSpec& spec, TensorPlan plan) {
  const auto policy = parse_admission_policy(plan.admission);
  for (double fraction : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    const auto shapes = profile_shapes(spec, fraction, 1);
    TensorPlanRow row;
    row.shape = shapes.front();
    row.elements = total_elements(shapes);
    row.predicted_bytes = predicted_peak(plan.profile, row.elements);
    row.cost_bytes = tensor_cost(plan.profile, row.elements);
    row.memory_fit = row.cost_bytes > 0 ? plan.budget_bytes / row.cost_bytes : 0;
    row.concurrent = std::min<std::int64_t>(row.memory_fit, plan.max_batch);
    if (policy.ok() && policy->kind == AdmissionPolicy::Kind::kFixed) {
      row.concurrent = std::min<std::int64_t>(row.concurrent, policy->fixed_slots);
    }
    plan.rows.push_back(row);
  }
  return plan;
}

Result<TensorPlan> measure_tensor_plan(const ServeConfig& config) {
  retain_freed_host_memory();
  set_compute_threads(config.threads);
  auto setup = load_profiled_model(config);
  if (!setup.ok()) return std::move(setup).error();
  if (!setup->tensor_model) return Error(ErrorCode::kConfig, "'" + setup->id + "' is not a TorchScript model");
  TensorPlan plan;
  plan.model_id = setup->id;
  plan.device = setup->device->name();
  plan.admission = config.admission;
  const TensorModelSpec& spec = setup->tensor_model->spec();
  plan.max_batch = spec.batched ? std::min<int>(config.max_batch_or_default(), static_cast<int>(spec.max_batch())) : 1;
  plan.capacity_bytes = setup->device->memory().capacity;
  plan.budget_bytes = setup->budget_bytes;
  plan.profile = setup->tensor_profile;
  return make_tensor_plan(spec, std::move(plan));
}

namespace {

std::string line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string line(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

}  // namespace

std::string format_tensor_plan_text(const TensorPlan& plan) {
  const TensorMemoryProfile& p = plan.profile;
  std::string out;
  out += line("model %s (torchscript) on %s: admission %s, max_batch %d\n", plan.model_id.c_str(),
              plan.device.c_str(), plan.admission.c_str(), plan.max_batch);
  out += "memory profile: resident " + format_bytes(p.resident_bytes) + "; " + fit_text(p) + "; safety x" +
         format_decimal(p.safety_factor) + "\n";
  out += "held-out runs: prediction " + format_decimal(std::round((1 + p.held_out_min_error) * 1000) / 10) + "% to " +
         format_decimal(std::round((1 + p.held_out_max_error) * 1000) / 10) + "% of the measured peak\n";
  out += "budget " + std::to_string(plan.budget_bytes) + " bytes (" + format_bytes(plan.budget_bytes) + ") of " +
         format_bytes(plan.capacity_bytes) + " capacity\n\n";
  out += line("%-22s %10s %14s %14s %11s %10s\n", "shape", "elements", "predicted", "cost_bytes", "memory_fit",
              "concurrent");
  for (const TensorPlanRow& r : plan.rows) {
    out += line("%-22s %10" PRId64 " %14" PRId64 " %14" PRId64 " %11" PRId64 " %10" PRId64 "\n",
                shape_text(r.shape).c_str(), r.elements, r.predicted_bytes, r.cost_bytes, r.memory_fit, r.concurrent);
  }
  return out;
}

std::string format_tensor_plan_json(const TensorPlan& plan) {
  const TensorMemoryProfile& p = plan.profile;
  std::string out = "{\"model\":\"" + plan.model_id + "\",\"device\":\"" + plan.device + "\",\"admission\":\"" +
                    plan.admission + "\"";
  out += line(",\"max_batch\":%d,\"capacity_bytes\":%" PRId64 ",\"budget_bytes\":%" PRId64, plan.max_batch,
              plan.capacity_bytes, plan.budget_bytes);
  out += line(",\"resident_bytes\":%" PRId64 ",\"fixed_bytes\":%" PRId64, p.resident_bytes, p.fixed_bytes);
  out += ",\"bytes_per_element\":" + format_decimal(p.bytes_per_element) + ",\"safety_factor\":" +
         format_decimal(p.safety_factor) + ",\"held_out_min_error\":" + format_decimal(p.held_out_min_error) +
         ",\"held_out_max_error\":" + format_decimal(p.held_out_max_error) + ",\"rows\":[";
  for (std::size_t i = 0; i < plan.rows.size(); ++i) {
    const TensorPlanRow& r = plan.rows[i];
    out += i ? ",{\"shape\":[" : "{\"shape\":[";
    for (std::size_t d = 0; d < r.shape.size(); ++d) out += (d ? "," : "") + std::to_string(r.shape[d]);
    out += line("],\"elements\":%" PRId64 ",\"predicted_bytes\":%" PRId64 ",\"cost_bytes\":%" PRId64
                ",\"memory_fit\":%" PRId64 ",\"concurrent\":%" PRId64 "}",
                r.elements, r.predicted_bytes, r.cost_bytes, r.memory_fit, r.concurrent);
  }
  return out + "]}\n";
}

}  // namespace vg
