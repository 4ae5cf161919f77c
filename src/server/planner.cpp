// `vramgate plan`: the budget arithmetic and per-size concurrency table of a
// model on a device (see planner.hpp).
#include "server/planner.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>

#include "admission/admission_policy.hpp"
#include "common/decimal.hpp"
#include "device/device.hpp"
#include "model/model.hpp"
#include "model/runtime.hpp"
#include "model/torchscript_model.hpp"
#include "service/model_setup.hpp"

namespace vg {
namespace {

__attribute__((format(printf, 1, 2))) std::string printf_string(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += printf_string("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

Plan make_plan(const PlanInputs& inputs, std::span<const int> prompt_tokens, std::span<const int> max_tokens) {
  Plan plan;
  plan.inputs = inputs;
  plan.budget_bytes = device_budget(DeviceBudgetInputs{inputs.capacity_bytes, inputs.utilization, inputs.foreign_bytes,
                                                       inputs.profile.resident_bytes, inputs.profile.workspace_bytes,
                                                       inputs.reserve_bytes});
  AdmissionPolicy policy;
  if (auto p = parse_admission_policy(inputs.admission); p.ok()) policy = *p;
  for (int prompt : prompt_tokens) {
    for (int gen : max_tokens) {
      if (prompt < 1 || gen < 1 || static_cast<std::int64_t>(prompt) + gen > inputs.context_length) continue;
      PlanRow row;
      row.prompt_tokens = prompt;
      row.max_tokens = gen;
      row.cost_bytes = request_cost(inputs.profile, prompt, gen);
      row.memory_fit = row.cost_bytes > 0 ? plan.budget_bytes / row.cost_bytes : 0;
      row.concurrent = inputs.max_batch;
      row.bound_by = "max_batch";
      if (policy.kind == AdmissionPolicy::Kind::kFixed && policy.fixed_slots < row.concurrent) {
        row.concurrent = policy.fixed_slots;
        row.bound_by = to_string(policy);
      }
      if (policy.kind == AdmissionPolicy::Kind::kMemory && row.memory_fit < row.concurrent) {
        row.concurrent = row.memory_fit;
        row.bound_by = row.memory_fit == 0 ? "never fits (413)" : "memory";
      }
      plan.rows.push_back(row);
    }
  }
  return plan;
}

Result<Plan> measure_plan(const ServeConfig& config, std::span<const int> prompt_tokens,
                          std::span<const int> max_tokens) {
  retain_freed_host_memory();
  set_compute_threads(config.threads);
  auto setup = load_profiled_model(config);
  if (!setup.ok()) return std::move(setup).error();
  if (!setup->model) {
    return Error(ErrorCode::kConfig, "'" + setup->id + "' is a TorchScript model: plan it with measure_tensor_plan");
  }
  PlanInputs in;
  in.profile = setup->profile;
  in.context_length = setup->model->config().n_positions;
  in.model_id = setup->id;
  in.device = setup->device->name();
  in.capacity_bytes = setup->device->memory().capacity;
  in.foreign_bytes = setup->device->memory().foreign;
  in.utilization = config.memory_utilization;
  in.reserve_bytes = setup->reserve_bytes;
  in.max_batch = setup->max_batch;
  in.max_batch_tokens = config.max_batch_tokens;
  in.admission = config.admission;
  return make_plan(in, prompt_tokens, max_tokens);
}

std::string format_plan_text(const Plan& plan) {
  const PlanInputs& in = plan.inputs;
  const MemoryProfile& p = in.profile;
  std::string out;
  out += printf_string("model %s on %s: context %d tokens; admission %s, max_batch %d, max_batch_tokens %d\n",
             in.model_id.c_str(), in.device.c_str(), in.context_length, in.admission.c_str(), in.max_batch,
             in.max_batch_tokens);
  out += printf_string("memory profile: resident %s, workspace %s, KV cache %" PRId64 " bytes/token + %" PRId64
             " bytes/sequence, safety x%g\n",
             format_bytes(p.resident_bytes).c_str(), format_bytes(p.workspace_bytes).c_str(), p.kv_bytes_per_token,
             p.sequence_overhead_bytes, p.safety_factor);
  out += "budget = capacity x utilization - resident - workspace - reserve\n";
  if (in.foreign_bytes > 0) {
    out += printf_string("  (capacity x utilization at most capacity - %" PRId64 " bytes other processes hold)\n",
                         in.foreign_bytes);
  }
  out += printf_string("       = %" PRId64 " x %g - %" PRId64 " - %" PRId64 " - %" PRId64 " = %" PRId64 " bytes (%s)\n",
             in.capacity_bytes, in.utilization, p.resident_bytes, p.workspace_bytes, in.reserve_bytes,
             plan.budget_bytes, format_bytes(plan.budget_bytes).c_str());
  out += "cost = ((prompt + max_tokens) x KV bytes/token + bytes/sequence) x safety\n\n";
  out += printf_string("%8s %10s %14s %10s %11s %10s  %s\n", "prompt", "max_tokens", "cost_bytes", "cost", "memory_fit",
             "concurrent", "bound_by");
  for (const PlanRow& r : plan.rows) {
    out += printf_string("%8d %10d %14" PRId64 " %10s %11" PRId64 " %10" PRId64 "  %s\n", r.prompt_tokens, r.max_tokens,
               r.cost_bytes, format_bytes(r.cost_bytes).c_str(), r.memory_fit, r.concurrent, r.bound_by.c_str());
  }
  if (in.admission != "memory") {
    out += "\nnote: --admission " + in.admission +
           " does not check memory: running more than memory_fit requests at once can run out of memory\n";
  }
  return out;
}

std::string format_plan_json(const Plan& plan) {
  const PlanInputs& in = plan.inputs;
  const MemoryProfile& p = in.profile;
  std::string out = "{";
  out += "\"model\":" + json_string(in.model_id) + ",\"device\":" + json_string(in.device);
  out += printf_string(",\"context_length\":%d,\"capacity_bytes\":%" PRId64, in.context_length, in.capacity_bytes);
  out += ",\"memory_utilization\":" + format_decimal(in.utilization);
  out += printf_string(",\"foreign_bytes\":%" PRId64, in.foreign_bytes);
  out += printf_string(",\"reserve_bytes\":%" PRId64 ",\"max_batch\":%d,\"max_batch_tokens\":%d", in.reserve_bytes,
             in.max_batch, in.max_batch_tokens);
  out += ",\"admission\":" + json_string(in.admission);
  out += printf_string(",\"resident_bytes\":%" PRId64 ",\"workspace_bytes\":%" PRId64 ",\"kv_bytes_per_token\":%" PRId64
             ",\"sequence_overhead_bytes\":%" PRId64,
             p.resident_bytes, p.workspace_bytes, p.kv_bytes_per_token, p.sequence_overhead_bytes);
  out += ",\"safety_factor\":" + format_decimal(p.safety_factor);
  out += printf_string(",\"budget_bytes\":%" PRId64 ",\"rows\":[", plan.budget_bytes);
  for (std::size_t i = 0; i < plan.rows.size(); ++i) {
    const PlanRow& r = plan.rows[i];
    out += printf_string("%s{\"prompt_tokens\":%d,\"max_tokens\":%d,\"cost_bytes\":%" PRId64 ",\"memory_fit\":%" PRId64
               ",\"concurrent\":%" PRId64 ",\"bound_by\":",
               i ? "," : "", r.prompt_tokens, r.max_tokens, r.cost_bytes, r.memory_fit, r.concurrent);
    out += json_string(r.bound_by) + "}";
  }
  return out + "]}\n";
}

}  // namespace vg
