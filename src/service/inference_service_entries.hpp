// The device and model entries of InferenceService (see inference_service.hpp),
// shared by its two source files: inference_service.cpp (start-up, language
// models, health, admission state, shutdown) and inference_service_tensor.cpp
// (TorchScript models). Internal to src/server.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "engine/tensor_engine.hpp"
#include "service/inference_service.hpp"
#include "service/model_setup.hpp"
#include "tokenizer/prompt_encoder.hpp"

namespace vg {

struct InferenceService::DeviceEntry {
  std::string name;                              ///< the device's name, or the --device text when it failed to start
  std::string failure;                           ///< why it failed at start-up; empty when it serves
  std::int64_t failed_capacity = 0;              ///< a failed virtual device's capacity from its --device text
  DeviceSetup setup;                             ///< device and model replicas (empty when it failed)
  int topology_index = -1;                       ///< its index among the serving devices (admission)
  std::vector<std::unique_ptr<Engine>> engines;  ///< one per language model; destroyed before `setup`
  std::vector<std::unique_ptr<TensorEngine>> tensor_engines;  ///< one per TorchScript model; destroyed before `setup`
};

struct InferenceService::ModelEntry {
  ModelInfo info;
  const Model* model =
      nullptr;  ///< the first replica: config and tokenizer (the same on every device); null for TorchScript
  std::vector<Engine*> engines;  ///< one per serving device (language models)
  /// A TorchScript model: its first replica, metadata and one engine per serving device.
  const TorchScriptModel* tensor_model = nullptr;
  TensorModelInfo tensor_info;
  std::vector<TensorEngine*> tensor_engines;
  /// Its prompts' encoding: the tokenizer of `model`, and the chat format of
  /// /v1/chat/completions (--chat-template, else the model's
  /// tokenizer_config.json) with the BOS/EOS texts its templates write.
  /// Set for language models.
  std::optional<PromptEncoder> prompts;
};

}  // namespace vg
