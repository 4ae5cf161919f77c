// The gateway's prompt encoders, one per language model its engines serve:
// loaded from the model folder an engine's hello names, so the gateway
// renders chat requests and tokenizes prompts itself and only token ids
// cross the wire. A model whose folder the gateway cannot read is left to
// its engines (they encode a text prompt themselves).
//
// Threads: any; one mutex guards the map (tokenizer files are read and
// prompts encoded outside it).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/types.hpp"
#include "common/error.hpp"
#include "common/thread_annotations.hpp"
#include "tokenizer/prompt_encoder.hpp"

namespace vg::gateway {

class PromptEncoders {
 public:
  /// `chat_template`: the server's --chat-template (empty: each model's own).
  explicit PromptEncoders(std::string chat_template) : chat_template_(std::move(chat_template)) {}

  /// Loads the encoder of each language model in `models` (an accepted
  /// engine's hello) from the folder the engine loaded it from, unless one
  /// for the same folder, vocabulary and EOS id is loaded. A folder it
  /// cannot read (no config.json it can open) drops that model's encoder;
  /// the next hello tries again. Blocks on the tokenizer files.
  void learn(const std::vector<ModelInfo>& models) VG_EXCLUDES(mu_);

  /// Encodes the text or chat prompt of `request` with the encoder of
  /// `model` into token ids, adding its chat stop text; leaves it as it is
  /// when `model` has none (its engine encodes it) or its prompt is ids.
  /// Errors (400): the encoder's, and a prompt + max_tokens over the
  /// model's context length.
  Status encode(CompletionRequest& request, const std::string& model) const VG_EXCLUDES(mu_);

 private:
  /// A model's encoder and the hello facts it was loaded for.
  struct Encoding {
    std::shared_ptr<const PromptEncoder> encoder;
    std::string dir;
    VocabularyFacts facts;
    int context_length = 0;  ///< tokens; 0: unknown (the engine checks)
  };
  /// True when `m`'s encoder is loaded for its folder and facts (its context length refreshed).
  bool known(const ModelInfo& m, const VocabularyFacts& facts) VG_EXCLUDES(mu_);

  const std::string chat_template_;
  mutable Mutex mu_;
  std::map<std::string, Encoding> encoders_ VG_GUARDED_BY(mu_);  // model id -> its encoding
};

}  // namespace vg::gateway
