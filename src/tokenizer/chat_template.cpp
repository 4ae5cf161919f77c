// Rendering of the four chat formats, following the Jinja templates their
// models ship (Llama-2-chat, Meta-Llama-3-Instruct, zephyr-7b-beta and
// ChatML as in OpenHermes): same strings, same trimming, same errors. Any
// thread.
#include "tokenizer/chat_template.hpp"

#include <boost/json.hpp>

#include "tokenizer/json_util.hpp"

namespace vg {
namespace {

constexpr std::string_view kSpaces = " \t\n\r\f\v";

/// Jinja's trim / Python's str.strip().
std::string strip(std::string_view s) {
  const std::size_t b = s.find_first_not_of(kSpaces);
  if (b == std::string_view::npos) return {};
  const std::size_t e = s.find_last_not_of(kSpaces);
  return std::string(s.substr(b, e - b + 1));
}

Error invalid(std::string message) { return Error(ErrorCode::kInvalidRequest, std::move(message)); }

std::string bos_of(ChatFormat f, const ChatTokens& t) {
  if (!t.bos.empty()) return t.bos;
  return f == ChatFormat::kLlama3 ? "<|begin_of_text|>" : "<s>";
}

std::string eos_of(const ChatTokens& t) { return t.eos.empty() ? "</s>" : t.eos; }

Result<std::string> render_llama2(std::span<const ChatMessage> messages, const ChatTokens& tokens) {
  std::string system;
  bool has_system = false;
  if (messages.front().role == "system") {
    system = messages.front().content;
    has_system = true;
    messages = messages.subspan(1);
  }
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0) || (m.role != "user" && m.role != "assistant")) {
      return invalid("the llama-2 chat format needs roles that alternate user/assistant/user/... after an optional "
                     "first system message; message " + std::to_string(i + (has_system ? 1 : 0)) + " is '" + m.role +
                     "'");
    }
    std::string content = m.content;
    if (i == 0 && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + m.content;
    if (m.role == "user") {
      out += bos_of(ChatFormat::kLlama2, tokens) + "[INST] " + strip(content) + " [/INST]";
    } else {
      out += " " + strip(content) + " " + eos_of(tokens);
    }
  }
  return out;
}

}  // namespace

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  if (name == "chatml") return ChatFormat::kChatMl;
  if (name == "llama-2" || name == "llama2") return ChatFormat::kLlama2;
  if (name == "llama-3" || name == "llama3") return ChatFormat::kLlama3;
  if (name == "zephyr") return ChatFormat::kZephyr;
  return std::nullopt;
}

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kChatMl: return "chatml";
    case ChatFormat::kLlama2: return "llama-2";
    case ChatFormat::kLlama3: return "llama-3";
    case ChatFormat::kZephyr: return "zephyr";
  }
  return "unknown";
}

std::optional<ChatFormat> detect_chat_format(std::string_view t) {
  const auto has = [t](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatFormat::kChatMl;
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatFormat::kLlama3;
  if (has("[INST]") && has("[/INST]") && has("<<SYS>>")) return ChatFormat::kLlama2;
  if (has("<|user|>") && has("<|assistant|>")) return ChatFormat::kZephyr;
  return std::nullopt;
}

Result<ChatFormat> chat_format_from(std::string_view name_or_template) {
  if (auto f = parse_chat_format(name_or_template)) return *f;
  if (auto f = detect_chat_format(name_or_template)) return *f;
  return invalid("chat template '" + std::string(name_or_template.substr(0, 80)) +
                 "' is not a known format (supported: chatml, llama-2, llama-3, zephyr, or a Jinja template of one)");
}

Result<std::string> render_chat(ChatFormat format, std::span<const ChatMessage> messages, const ChatTokens& tokens) {
  if (messages.empty()) return invalid("messages must not be empty");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return invalid("messages[" + std::to_string(i) + "].role '" + r +
                     "' is not one of system (or developer), user, assistant");
    }
  }
  std::string out;
  switch (format) {
    case ChatFormat::kChatMl:
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      return out;
    case ChatFormat::kLlama3:
      out = bos_of(format, tokens);
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + strip(m.content) + "<|eot_id|>";
      }
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFormat::kZephyr:
      for (const ChatMessage& m : messages) out += "<|" + m.role + "|>\n" + m.content + eos_of(tokens) + "\n";
      out += "<|assistant|>\n";
      return out;
    case ChatFormat::kLlama2:
      return render_llama2(messages, tokens);
  }
  return invalid("unknown chat format");
}

std::string chat_stop_text(ChatFormat format, const ChatTokens& tokens) {
  switch (format) {
    case ChatFormat::kChatMl: return "<|im_end|>";
    case ChatFormat::kLlama3: return "<|eot_id|>";
    case ChatFormat::kLlama2:
    case ChatFormat::kZephyr: return eos_of(tokens);
  }
  return eos_of(tokens);
}

Result<RenderedChat> render_chat_request(std::span<const ChatMessage> messages, std::string_view requested,
                                         std::optional<ChatFormat> configured, const ChatTokens& tokens,
                                         std::string_view model) {
  std::optional<ChatFormat> format = configured;
  if (!requested.empty()) {
    Result<ChatFormat> f = chat_format_from(requested);
    if (!f) return std::move(f).error();
    format = *f;
  }
  if (!format) {
    return invalid("model '" + std::string(model) +
                   "' has no chat template vramgate knows: send chat_template (chatml, llama-2, llama-3 or zephyr) "
                   "or start the server with --chat-template");
  }
  Result<std::string> prompt = render_chat(*format, messages, tokens);
  if (!prompt) return std::move(prompt).error();
  return RenderedChat{*format, std::move(*prompt), chat_stop_text(*format, tokens)};
}

Result<ChatTemplateFile> read_chat_template(const std::filesystem::path& dir) {
  ChatTemplateFile out;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(dir / "tokenizer_config.json", ec)) return out;
  Result<boost::json::value> doc = tok::read_json_file(dir / "tokenizer_config.json");
  if (!doc) return std::move(doc).error();
  const boost::json::object* o = doc->if_object();
  if (!o) return out;
  out.tokens.bos = tok::json_string(*o, "bos_token");
  out.tokens.eos = tok::json_string(*o, "eos_token");
  if (const boost::json::value* t = o->if_contains("chat_template")) {
    if (const boost::json::string* s = t->if_string()) {
      out.jinja = std::string(*s);
    } else if (const boost::json::array* list = t->if_array()) {
      // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
      for (const boost::json::value& v : *list) {
        const boost::json::object* named = v.if_object();
        if (named && tok::json_string(*named, "name") == "default") out.jinja = tok::json_string(*named, "template");
      }
    }
  }
  return out;
}

}  // namespace vg
