// PromptEncoders (see prompt_encoders.hpp).
#include "gateway/prompt_encoders.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace vg::gateway {

bool PromptEncoders::known(const ModelInfo& m, const VocabularyFacts& facts) {
  MutexLock lock(mu_);
  auto it = encoders_.find(m.id);
  if (it == encoders_.end() || it->second.dir != m.dir || !(it->second.facts == facts)) return false;
  it->second.context_length = m.context_length;
  return true;
}

void PromptEncoders::learn(const std::vector<ModelInfo>& models) {
  for (const ModelInfo& m : models) {
    if (m.family == "torchscript" || m.dir.empty() || m.vocab_size <= 0) continue;
    const VocabularyFacts facts{m.family, m.vocab_size, m.eos_token_id};
    if (known(m, facts)) continue;
    // A folder this process cannot see (another mount namespace, no access)
    // would look like one without tokenizer files: require its config.json.
    Result<PromptEncoder> loaded = Error(ErrorCode::kModelLoad, "cannot open " + m.dir + "/config.json");
    if (std::ifstream(std::filesystem::path(m.dir) / "config.json").good()) {
      loaded = PromptEncoder::load(m.dir, facts, chat_template_, m.id);
    }
    MutexLock lock(mu_);
    if (!loaded.ok()) {
      spdlog::warn("gateway: cannot read the tokenizer of model '{}' ({}); its engines encode its prompts", m.id,
                   loaded.error().message);
      encoders_.erase(m.id);
      continue;
    }
    spdlog::info("gateway: encodes the prompts of model '{}' (tokenizer of {}, chat format {})", m.id, m.dir,
                 loaded->chat_format_description());
    encoders_[m.id] =
        Encoding{std::make_shared<const PromptEncoder>(std::move(loaded).value()), m.dir, facts, m.context_length};
  }
}

Status PromptEncoders::encode(CompletionRequest& request, const std::string& model) const {
  const std::string* text = std::get_if<std::string>(&request.prompt);
  if (!request.chat && !text) return Status::Ok();  // token ids: the engine checks them
  Encoding encoding;
  {
    MutexLock lock(mu_);
    auto it = encoders_.find(model);
    if (it == encoders_.end()) return Status::Ok();
    encoding = it->second;
  }
  const PromptEncoder& encoder = *encoding.encoder;
  Result<EncodedPrompt> encoded = request.chat
                                      ? encoder.encode_chat(request.chat->messages, request.chat->chat_template)
                                      : encoder.encode_text(*text);
  if (!encoded.ok()) return std::move(encoded).error();
  // Checked here too: the ids of a prompt that cannot run never cross the wire.
  const auto tokens = static_cast<std::int64_t>(encoded->ids.size());
  if (encoding.context_length > 0) {
    Result<int> max_tokens = fit_max_tokens(request, tokens, encoding.context_length, encoder.model());
    if (!max_tokens.ok()) return std::move(max_tokens).error();
    request.max_tokens = *max_tokens;
    request.max_tokens_from = MaxTokensFrom::kRequest;
  }
  request.prompt = std::move(encoded->ids);
  request.chat.reset();
  if (!encoded->stop.empty() &&
      std::find(request.stop.begin(), request.stop.end(), encoded->stop) == request.stop.end()) {
    request.stop.push_back(std::move(encoded->stop));
  }
  return Status::Ok();
}

}  // namespace vg::gateway
