// PromptEncoder (see prompt_encoder.hpp).
#include "tokenizer/prompt_encoder.hpp"

#include <utility>

namespace vg {

PromptEncoder::PromptEncoder(std::shared_ptr<const Tokenizer> tokenizer, std::optional<ChatFormat> chat_format,
                             ChatTokens chat_tokens, std::string model)
    : tokenizer_(std::move(tokenizer)),
      chat_format_(chat_format),
      chat_tokens_(std::move(chat_tokens)),
      model_(std::move(model)) {}

Result<PromptEncoder> PromptEncoder::load(const std::filesystem::path& dir, const VocabularyFacts& facts,
                                          std::string_view chat_template, std::string model) {
  Result<std::unique_ptr<Tokenizer>> tokenizer = choose_tokenizer(dir, facts);
  if (!tokenizer.ok()) return std::move(tokenizer).error();
  return load(std::shared_ptr<const Tokenizer>(std::move(tokenizer).value()), dir, chat_template, std::move(model));
}

Result<PromptEncoder> PromptEncoder::load(std::shared_ptr<const Tokenizer> tokenizer, const std::filesystem::path& dir,
                                          std::string_view chat_template, std::string model) {
  Result<ChatTemplateFile> chat_file = read_chat_template(dir);
  if (!chat_file.ok()) return std::move(chat_file).error();
  const std::optional<ChatFormat> format =
      chat_template.empty() ? detect_chat_format(chat_file->jinja) : parse_chat_format(chat_template);
  PromptEncoder out(std::move(tokenizer), format, chat_file->tokens, std::move(model));
  out.unknown_model_template_ = !format && !chat_file->jinja.empty();
  return out;
}

std::string PromptEncoder::chat_format_description() const {
  if (chat_format_) return std::string(chat_format_name(*chat_format_));
  return std::string("none known (/v1/chat/completions needs a request chat_template)") +
         (unknown_model_template_ ? "; the model's chat_template is not one of chatml, llama-2, llama-3, zephyr" : "");
}

Result<std::vector<std::int32_t>> PromptEncoder::encode(std::string_view text) const {
  if (!tokenizer_->encodes_text()) {
    return Error(ErrorCode::kInvalidRequest,
                 "model '" + model_ + "' has no tokenizer vramgate can read: send prompt as a list of token ids");
  }
  return tokenizer_->encode(text);
}

Result<EncodedPrompt> PromptEncoder::encode_text(std::string_view text) const {
  Result<std::vector<std::int32_t>> ids = encode(text);
  if (!ids.ok()) return std::move(ids).error();
  EncodedPrompt out;
  out.ids = std::move(ids).value();
  if (tokenizer_->adds_bos() && tokenizer_->bos_id()) out.ids.insert(out.ids.begin(), *tokenizer_->bos_id());
  return out;
}

Result<EncodedPrompt> PromptEncoder::encode_chat(std::span<const ChatMessage> messages,
                                                 std::string_view requested) const {
  Result<RenderedChat> chat = render_chat_request(messages, requested, chat_format_, chat_tokens_, model_);
  if (!chat.ok()) return std::move(chat).error();
  Result<std::vector<std::int32_t>> ids = encode(chat->prompt);
  if (!ids.ok()) return std::move(ids).error();
  return EncodedPrompt{std::move(ids).value(), std::move(chat->stop)};
}

}  // namespace vg
