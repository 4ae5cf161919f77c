// choose_tokenizer() (see tokenizer_choice.hpp).
#include "model/tokenizer_choice.hpp"

#include "tokenizer/load_tokenizer.hpp"

namespace vg {

Result<std::unique_ptr<Tokenizer>> choose_tokenizer(const std::filesystem::path& dir, const ModelConfig& config) {
  Result<std::unique_ptr<Tokenizer>> files = load_tokenizer(dir);
  if (!files.ok()) return std::move(files).error();
  if (*files) {
    if ((*files)->vocab_size() > config.vocab_size) {
      return Error(ErrorCode::kModelLoad, dir.string() + ": the tokenizer has " + std::to_string((*files)->vocab_size()) +
                                              " tokens, more than the model's vocab_size " +
                                              std::to_string(config.vocab_size));
    }
    return std::move(files).value();
  }
  if (config.family == "gpt2" && config.vocab_size == ByteTokenizer{}.vocab_size()) {
    return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<IdTokenizer>(config.vocab_size, config.eos_token_id));
}

}  // namespace vg
