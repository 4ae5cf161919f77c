#include "server/serve_in_process.hpp"

#include <spdlog/spdlog.h>

#include "model/runtime.hpp"
#include "server/http_front.hpp"
#include "server/process_setup.hpp"
#include "service/inference_service.hpp"

namespace vg {
namespace {

std::variant<ServingStack, StartFailure> in_process_stack(const ServeConfig& config, metrics::ServerMetrics* metrics) {
  retain_freed_host_memory();
  set_compute_threads(config.threads);
  spdlog::info("vramgate starting in one process: {}", torch_runtime_description());
  auto service = InferenceService::create(config, metrics);
  if (!service.ok()) return StartFailure{service.error().message, start_failure_status(service.error())};
  ServingStack stack;
  stack.services.push_back(std::move(service).value());
  return stack;
}

}  // namespace

int run_in_process_server(const ServeConfig& config) { return serve_over_http(config, in_process_stack); }

}  // namespace vg
