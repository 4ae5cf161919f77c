// Model::load: reads config.json and dispatches on the family. Called once
// per model at start-up, from any thread.
#include "model/model.hpp"

#include "model/gpt2.hpp"
#include "model/model_config.hpp"

namespace vg {

Result<std::unique_ptr<Model>> Model::load(const Options& options) {
  if (options.device == nullptr) {
    return Error{ErrorCode::kModelLoad, options.dir.string() + ": no device given to load the model onto"};
  }
  Result<ModelConfig> config = read_model_config(options.dir / "config.json");
  if (!config.ok()) return std::move(config).error();
  config->dtype = options.dtype;
  if (config->family == "gpt2") return load_gpt2(*config, options.dir, options.device);
  return Error{ErrorCode::kModelLoad, (options.dir / "config.json").string() + ": model_type '" + config->family +
                                          "' is not supported (supported: " + kSupportedFamilies + ")"};
}

}  // namespace vg
