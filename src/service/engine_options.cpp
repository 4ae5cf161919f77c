#include "service/engine_options.hpp"

#include <algorithm>

#include "common/clock.hpp"

namespace vg {

OomGovernorOptions oom_governor_options(const ServeConfig& config) {
  OomGovernorOptions o;
  o.decrease_factor = config.oom_decrease_factor;
  o.floor_fraction = config.oom_budget_floor;
  o.quiet_period = from_seconds(config.oom_quiet_period_s);
  o.increase_step = config.oom_increase_step;
  return o;
}

MemoryProfile cost_profile(const std::vector<const MemoryProfile*>& profiles) {
  MemoryProfile p = *profiles.front();
  for (const MemoryProfile* q : profiles) {
    p.kv_bytes_per_token = std::max(p.kv_bytes_per_token, q->kv_bytes_per_token);
    p.sequence_overhead_bytes = std::max(p.sequence_overhead_bytes, q->sequence_overhead_bytes);
    p.safety_factor = std::max(p.safety_factor, q->safety_factor);
  }
  return p;
}

Engine::Options engine_options(const ServeConfig& config) {
  Engine::Options eo;
  eo.max_batch = config.max_batch_or_default();
  eo.max_batch_tokens = config.max_batch_tokens;
  eo.prefill_worker = config.prefill_worker;
  eo.oom_governor = oom_governor_options(config);
  eo.max_preemptions = config.max_preemptions;
  eo.oom_unready_after = config.oom_unready_after;
  eo.step_delay_ms = config.test_step_delay_ms;
  eo.inject_oom_at_step = config.test_inject_oom_step;
  eo.inject_oom_count = config.test_inject_oom_count;
  eo.test_leak_bytes_on_oom = config.test_leak_bytes_on_oom;
  eo.test_poison_logits_at_step = config.test_poison_logits_step;
  eo.test_device_fault_at_step = config.test_device_fault_step;
  // Checked by ServeConfig::check(); an empty hook otherwise.
  if (auto hook = parse_foreign_bytes_hook(config.test_foreign_bytes); hook.ok()) eo.test_foreign_bytes = *hook;
  return eo;
}

TensorEngine::Options tensor_engine_options(const ServeConfig& config) {
  TensorEngine::Options to;
  to.max_batch_delay_ms = config.max_batch_delay_ms;
  to.oom_governor = oom_governor_options(config);
  to.step_delay_ms = config.test_step_delay_ms;
  to.inject_oom_at_pass = config.test_inject_oom_step;
  to.inject_oom_count = config.test_inject_oom_count;
  return to;
}

}  // namespace vg
