// Chat templates: turns OpenAI-style chat messages into the prompt text of
// the common chat formats (ChatML, Llama-2, Llama-3, Zephyr), exactly as
// their Hugging Face Jinja templates render them (trim_blocks, lstrip_blocks,
// add_generation_prompt). No Jinja engine: a model's template is recognised
// by the marker strings it contains. Pure functions; any thread.
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "api/chat.hpp"
#include "common/error.hpp"

namespace vg {

enum class ChatFormat {
  kChatMl,  ///< "<|im_start|>role\ncontent<|im_end|>\n" (Qwen, Hermes, ...)
  kLlama2,  ///< "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>" (Llama-2-chat)
  kLlama3,  ///< "<|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>"
  kZephyr,  ///< "<|system|>\ncontent</s>\n<|user|>\n...</s>\n<|assistant|>\n" (Zephyr, TinyLlama-Chat)
};

/// The BOS/EOS texts a template writes (tokenizer_config.json bos_token,
/// eos_token); empty: the format's usual one ("<s>"/"</s>", Llama-3's
/// "<|begin_of_text|>").
struct ChatTokens {
  std::string bos;
  std::string eos;
};

/// "chatml", "llama-2", "llama-3", "zephyr" (also "llama2", "llama3").
std::optional<ChatFormat> parse_chat_format(std::string_view name);
/// The canonical name ("chatml", "llama-2", "llama-3", "zephyr").
std::string_view chat_format_name(ChatFormat format);
/// Recognises a Jinja chat template (tokenizer_config.json chat_template) by
/// its markers; nullopt for anything else.
std::optional<ChatFormat> detect_chat_format(std::string_view jinja_template);
/// A format name, or else a Jinja template to recognise. Errors:
/// kInvalidRequest naming the supported formats.
Result<ChatFormat> chat_format_from(std::string_view name_or_template);

/// The prompt text for `messages`, ending with the assistant's header
/// (add_generation_prompt). Errors: kInvalidRequest for no messages, an
/// unknown role, or (Llama-2) roles that do not alternate user/assistant
/// after an optional first system message.
Result<std::string> render_chat(ChatFormat format, std::span<const ChatMessage> messages, const ChatTokens& tokens);

/// The text that ends an assistant turn in `format` ("<|im_end|>",
/// "<|eot_id|>", or the EOS text): generation stops there.
std::string chat_stop_text(ChatFormat format, const ChatTokens& tokens);

/// A chat request ready to tokenize.
struct RenderedChat {
  ChatFormat format;
  std::string prompt;  ///< the rendered text (special-token texts included)
  std::string stop;    ///< chat_stop_text() of the format
};
/// Renders `messages` in the format `requested` names (a format name or a
/// Jinja template; empty: none requested), else `configured` (the server's
/// --chat-template or the model's template). Errors: kInvalidRequest when
/// neither gives a known format (naming `model` and the supported formats),
/// or from render_chat().
Result<RenderedChat> render_chat_request(std::span<const ChatMessage> messages, std::string_view requested,
                                         std::optional<ChatFormat> configured, const ChatTokens& tokens,
                                         std::string_view model);

/// What tokenizer_config.json of a model folder says about chat.
struct ChatTemplateFile {
  std::string jinja;   ///< chat_template (the "default" one of a named list); empty: none
  ChatTokens tokens;
};
/// Reads dir/tokenizer_config.json; an absent file gives an empty result.
/// Errors: kModelLoad when the file is not JSON.
Result<ChatTemplateFile> read_chat_template(const std::filesystem::path& dir);

}  // namespace vg
