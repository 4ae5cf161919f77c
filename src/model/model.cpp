// Model::load: reads config.json, opens the weights, chooses the tokenizer
// and dispatches on the family. Called once per model at start-up, from any
// thread.
#include "model/model.hpp"

#include "model/checkpoint.hpp"
#include "model/families.hpp"
#include "model/model_config.hpp"
#include "tokenizer/load_tokenizer.hpp"

namespace vg {

Result<std::unique_ptr<Model>> Model::load(const Options& options) {
  if (options.device == nullptr) {
    return Error{ErrorCode::kModelLoad, options.dir.string() + ": no device given to load the model onto"};
  }
  Result<ModelConfig> config = read_model_config(options.dir / "config.json");
  if (!config.ok()) return std::move(config).error();
  config->dtype = options.dtype;
  config->host_decode_kernel = options.host_decode_kernel;
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      choose_tokenizer(options.dir, VocabularyFacts{config->family, config->vocab_size, config->eos_token_id});
  if (!tokenizer.ok()) return std::move(tokenizer).error();
  Result<Checkpoint> checkpoint = Checkpoint::open(options.dir);
  if (!checkpoint.ok()) return std::move(checkpoint).error();
  if (config->family == "gpt2") return load_gpt2(*config, *checkpoint, options.device, std::move(tokenizer).value());
  if (config->family == "llama") return load_llama(*config, *checkpoint, options.device, std::move(tokenizer).value());
  return Error{ErrorCode::kModelLoad, (options.dir / "config.json").string() + ": model_type '" + config->family +
                                          "' is not supported (supported: " + kSupportedFamilies + ")"};
}

}  // namespace vg
