// Chat request decoding and chat response encoding (see chat_codec.hpp). The
// fields chat shares with /v1/completions are decoded by the completions
// decoder itself, so both routes accept and refuse exactly the same values.
#include "http/chat_codec.hpp"

#include <string>
#include <string_view>

#include <boost/json.hpp>

#include "api/sampling.hpp"
#include "http/json_codec.hpp"
#include "http/json_fields.hpp"

namespace vg {
namespace {

namespace json = boost::json;
using json_fields::invalid;
using json_fields::safe;
using json_fields::shown;
using json_fields::usage_json;

Result<std::string> message_content(const json::value& v, const std::string& where) {
  if (const json::string* s = v.if_string()) return std::string(*s);
  const json::array* parts = v.if_array();
  if (!parts) return invalid(where + ".content must be a string or an array of text parts");
  std::string text;
  for (std::size_t i = 0; i < parts->size(); ++i) {
    const json::object* p = (*parts)[i].if_object();
    const json::value* type = p ? p->if_contains("type") : nullptr;
    const json::value* t = p ? p->if_contains("text") : nullptr;
    if (!type || !type->is_string() || type->get_string() != "text" || !t || !t->is_string()) {
      return invalid(where + ".content[" + std::to_string(i) + "] must be {\"type\": \"text\", \"text\": string}");
    }
    text += t->get_string();
  }
  return text;
}

/// `error` of the completions decoder, its max_tokens message naming the
/// field the chat request used (`field`) and without its echo hint (a chat
/// has no echo), its param that field.
Error length_error_named(Error error, const std::string& field) {
  const std::string_view prefix = "max_tokens must be an integer between 1 and 2147483647 (0 only with echo: true)";
  if (error.message.compare(0, prefix.size(), prefix) == 0) {
    error.message = field + " must be an integer between 1 and 2147483647" + error.message.substr(prefix.size());
    error.param = field;
  }
  return error;
}

/// decode_chat_request() without the param of its errors.
Result<CompletionRequest> decode_chat(std::string_view body) {
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec);
  if (ec) return invalid("request body is not valid JSON: " + ec.message());
  json::object* o = doc.if_object();
  if (!o) return invalid("request body must be a JSON object");
  const json::value* list = o->if_contains("messages");
  if (!list) return invalid("messages is required");
  if (!list->is_array() || list->get_array().empty()) return invalid("messages must be a non-empty array");
  ChatPrompt chat;
  for (std::size_t i = 0; i < list->get_array().size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json::object* m = list->get_array()[i].if_object();
    if (!m) return invalid(where + " must be an object");
    const json::value* role = m->if_contains("role");
    if (!role || !role->is_string()) return invalid(where + ".role must be a string");
    const json::value* content = m->if_contains("content");
    if (!content) return invalid(where + ".content is required");
    Result<std::string> text = message_content(*content, where);
    if (!text) return std::move(text).error();
    // OpenAI's `developer` role carries system instructions (what current
    // SDKs send in place of `system`): chat templates know it as system.
    std::string name(role->get_string());
    if (name == "developer") name = "system";
    chat.messages.push_back({std::move(name), std::move(*text)});
  }
  const auto present = [&](std::string_view key) {  // null means absent, as in OpenAI's API
    const json::value* v = o->if_contains(key);
    return v != nullptr && !v->is_null();
  };
  if (present("chat_template")) {
    const json::value& t = o->at("chat_template");
    if (!t.is_string()) return invalid("chat_template must be a string");
    chat.chat_template = std::string(t.get_string());
  }
  if (present("echo")) {
    const json::value& e = o->at("echo");
    if (!e.is_bool() || e.get_bool()) return invalid("echo is not supported by /v1/chat/completions");
  }
  // Chat's logprobs is a boolean, with top_logprobs alternatives per token.
  bool logprobs = false;
  if (present("logprobs")) {
    const json::value& l = o->at("logprobs");
    if (!l.is_bool()) return invalid("logprobs must be a boolean in chat completions");
    logprobs = l.get_bool();
  }
  std::optional<int> top;
  if (present("top_logprobs")) {
    const json::value& t = o->at("top_logprobs");
    const std::optional<std::int64_t> k = t.is_int64() ? std::optional(t.get_int64())
                                          : t.is_uint64() && t.get_uint64() <= kMaxTopLogprobs
                                              ? std::optional(static_cast<std::int64_t>(t.get_uint64()))
                                              : std::nullopt;
    if (!k || *k < 0 || *k > kMaxTopLogprobs) {
      return invalid("top_logprobs must be an integer between 0 and " + std::to_string(kMaxTopLogprobs));
    }
    if (!logprobs) return invalid("top_logprobs requires logprobs: true");
    top = static_cast<int>(*k);
  }
  o->erase("logprobs");
  o->erase("top_logprobs");
  o->erase("echo");
  // The remaining fields are those of /v1/completions: max_completion_tokens
  // (OpenAI's current name) is max_tokens there.
  std::string length_field = "max_tokens";
  if (present("max_completion_tokens")) {
    const json::value m = o->at("max_completion_tokens");
    if (present("max_tokens") && o->at("max_tokens") != m) {
      return invalid("max_tokens (" + shown(o->at("max_tokens")) + ") and max_completion_tokens (" + shown(m) +
                     ") differ: send one of them");
    }
    length_field = "max_completion_tokens";
    (*o)["max_tokens"] = m;
  }
  o->erase("max_completion_tokens");
  // Neither: generate until end-of-sequence or the context, as OpenAI does.
  const MaxTokensFrom max_tokens_from = present("max_tokens") ? MaxTokensFrom::kRequest : MaxTokensFrom::kRestOfContext;
  if (present("max_tokens")) {
    const json::value& m = o->at("max_tokens");
    if ((m.is_int64() && m.get_int64() == 0) || (m.is_uint64() && m.get_uint64() == 0)) {
      return invalid(length_field + " must be at least 1 in chat completions");
    }
  }
  o->erase("messages");
  (*o)["prompt"] = "";
  Result<CompletionRequest> request = decode_completion_request(json_fields::serialize(doc));
  if (!request) return length_error_named(std::move(request).error(), length_field);
  request->chat = std::move(chat);
  request->max_tokens_from = max_tokens_from;
  if (logprobs) request->logprobs = top.value_or(0);
  return request;
}

}  // namespace

Result<CompletionRequest> decode_chat_request(std::string_view body) {
  Result<CompletionRequest> r = decode_chat(body);
  if (!r) return json_fields::with_param(std::move(r).error(), body);
  return r;
}

std::string encode_chat_completion(const ChatBody& body) {
  ChatResponse r{body.id, body.model, body.created, false, {}, body.usage, false};
  r.choices.push_back(ChatChoice{0, true, body.content, body.finish_reason});
  return encode_chat_response(r);
}

std::string encode_chat_chunk(const ChatChunk& chunk) {
  ChatResponse r{chunk.id, chunk.model, chunk.created, true, {}, chunk.usage, false};
  r.choices.push_back(ChatChoice{0, chunk.role, chunk.content, chunk.finish_reason});
  return encode_chat_response(r);
}

}  // namespace vg
