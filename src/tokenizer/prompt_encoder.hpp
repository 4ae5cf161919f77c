// How a model's prompts become token ids: its tokenizer, its chat format and
// the BOS/EOS texts its chat templates write. The gateway encodes each text
// or chat prompt with it before the request leaves for an engine process;
// the in-process service (and an engine, for a prompt that reaches it as
// text) encodes with the same code. Torch-free; immutable after
// construction, so any thread may use it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/load_tokenizer.hpp"
#include "tokenizer/tokenizer.hpp"

namespace vg {

/// A text or chat prompt as the engine runs it.
struct EncodedPrompt {
  /// Token ids; a text prompt starts with the tokenizer's BOS when it asks
  /// for one (LLaMA), as Hugging Face's encode does; a chat template writes
  /// its own BOS text. Empty for an empty text (the engine starts a new
  /// document with EOS).
  std::vector<std::int32_t> ids;
  /// A chat's end-of-turn text (chat_stop_text()): generation stops there,
  /// so it joins the request's stop strings. Empty for a text prompt.
  std::string stop;
};

class PromptEncoder {
 public:
  /// `tokenizer` must not be null; `chat_format` is the server's
  /// --chat-template, else the model's own (nullopt: a chat request must
  /// name its chat_template); `model` names the model in errors.
  PromptEncoder(std::shared_ptr<const Tokenizer> tokenizer, std::optional<ChatFormat> chat_format,
                ChatTokens chat_tokens, std::string model);

  /// Reads the model folder `dir`: its tokenizer (choose_tokenizer with
  /// `facts`) and its tokenizer_config.json chat template. `chat_template`:
  /// the server's --chat-template (empty: the model's own). Errors:
  /// kModelLoad from the files.
  static Result<PromptEncoder> load(const std::filesystem::path& dir, const VocabularyFacts& facts,
                                    std::string_view chat_template, std::string model);
  /// As load(), with a tokenizer already loaded (a loaded model's): reads
  /// only the chat template of `dir`.
  static Result<PromptEncoder> load(std::shared_ptr<const Tokenizer> tokenizer, const std::filesystem::path& dir,
                                    std::string_view chat_template, std::string model);

  /// A text prompt's ids. Errors: kInvalidRequest when the model has no
  /// tokenizer that encodes text (prompts as token ids only).
  Result<EncodedPrompt> encode_text(std::string_view text) const;
  /// Renders `messages` with the chat format `requested` names (a request's
  /// chat_template: a format name or a Jinja template; empty: the
  /// configured one) and encodes the result. Errors: kInvalidRequest from
  /// render_chat_request() or as encode_text().
  Result<EncodedPrompt> encode_chat(std::span<const ChatMessage> messages, std::string_view requested) const;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  std::optional<ChatFormat> chat_format() const { return chat_format_; }
  /// For the start-up log: the chat format's name, or why there is none.
  std::string chat_format_description() const;
  const std::string& model() const { return model_; }

 private:
  Result<std::vector<std::int32_t>> encode(std::string_view text) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::optional<ChatFormat> chat_format_;
  ChatTokens chat_tokens_;
  std::string model_;
  bool unknown_model_template_ = false;  ///< the folder has a chat_template of no known format
};

}  // namespace vg
