// InferenceService's TorchScript side (see inference_service.hpp): model
// lookup, /v2 metadata and tensor submissions.
#include <algorithm>
#include <chrono>

#include "model/torchscript_model.hpp"
#include "service/inference_service_entries.hpp"

namespace vg {

std::vector<TensorEngine*> InferenceService::tensor_engines() const {
  std::vector<TensorEngine*> out;
  for (auto& d : devices_) {
    for (auto& e : d->tensor_engines) out.push_back(e.get());
  }
  return out;
}

Result<TensorModelInfo> InferenceService::tensor_model(const std::string& name) const {
  auto found = find_model(name);
  if (!found.ok()) return std::move(found).error();
  if (!(*found)->tensor_model) {
    return Error(ErrorCode::kModelNotFound, "model '" + name + "' is a language model: use /v1/completions");
  }
  return (*found)->tensor_info;
}

Result<TensorSubmission> InferenceService::submit_tensor(TensorInferRequest request, TensorDone done) {
  auto found = find_model(request.model);
  if (!found.ok()) return std::move(found).error();
  ModelEntry* entry = *found;
  if (!entry->tensor_model) {
    return Error(ErrorCode::kModelNotFound,
                 "model '" + request.model + "' is a language model: use /v1/completions or /v1/chat/completions");
  }
  if (draining_.load()) {
    return shutting_down();
  }
  const TensorModelSpec& spec = entry->tensor_info.spec;
  if (Status st = check_inputs(spec, request.inputs, request.dtypes); !st.ok()) return st.error();
  for (const std::string& name : request.outputs) {
    bool known = false;
    for (const TensorSpec& o : spec.outputs) known = known || o.name == name;
    if (!known) return Error(ErrorCode::kInvalidRequest, "output '" + name + "': the model has no such output");
  }
  TensorRequest tr;
  tr.id = request.request_id.empty() ? "req-" + std::to_string(next_id_.fetch_add(1)) : request.request_id;
  for (const HostTensor* t : ordered_inputs(spec, request.inputs)) tr.inputs.push_back(*t);
  double timeout = config_.request_timeout_s;
  if (request.timeout_s) timeout = std::min(timeout, *request.timeout_s);
  tr.deadline = Clock::now() + from_seconds(timeout);
  tr.priority = request.priority.value_or(Priority::kNormal);
  TensorEngine* engine = entry->tensor_engines.front();
  TensorSubmission sub;
  sub.model = entry->info.id;
  sub.cost_bytes = engine->cost(tr);
  auto handle = engine->submit(std::move(tr), std::move(done), &sub.queue_position);
  if (!handle.ok()) return std::move(handle).error();
  sub.handle = std::move(handle).value();
  return sub;
}

}  // namespace vg
