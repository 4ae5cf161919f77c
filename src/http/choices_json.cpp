// Choices with logprobs, as the OpenAI API writes them: completions'
// `text_completion` bodies and chunks with any number of choices, chat's
// `chat.completion` and chunks, and the two logprobs shapes they carry.
// Boost.JSON stays inside src/http (see json_fields.hpp).
#include <algorithm>
#include <cstdio>

#include <boost/json.hpp>

#include "common/utf8.hpp"
#include "http/chat_codec.hpp"
#include "http/json_codec.hpp"
#include "http/json_fields.hpp"

namespace vg {

namespace json_fields {

namespace json = boost::json;

std::string token_text(std::string_view bytes) {
  if (sanitize_utf8(bytes) == bytes) return std::string(bytes);
  std::string out = "bytes:";
  char hex[5];
  for (unsigned char c : bytes) {
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

json::value logprob_json(double logprob) {
  constexpr double kFloor = -9999.0;
  if (!(logprob > kFloor)) return kFloor;
  return logprob;
}

std::int64_t text_chars(std::string_view bytes) {
  return std::count_if(bytes.begin(), bytes.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

json::object completion_logprobs_json(const std::vector<TokenLogprobs>& tokens,
                                      const std::vector<std::int64_t>& text_offset) {
  json::array text, values, top, offsets;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const TokenLogprobs& t = tokens[i];
    text.push_back(safe(token_text(t.token)));
    if (t.logprob) {
      values.push_back(logprob_json(*t.logprob));
    } else {
      values.push_back(nullptr);
    }
    if (!t.logprob) {
      top.push_back(nullptr);  // the first prompt token: nothing predicts it
    } else {
      // Most likely first; the chosen token too, in its place, where it is not among them.
      std::vector<std::pair<std::string, double>> entries = t.top;
      const bool listed = std::any_of(entries.begin(), entries.end(),
                                      [&](const auto& e) { return e.first == t.token; });
      if (!listed) {
        auto at = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.second < *t.logprob; });
        entries.insert(at, {t.token, *t.logprob});
      }
      json::object alternatives;
      for (const auto& [bytes, logprob] : entries) {
        const std::string key = sanitize_utf8(token_text(bytes));
        if (!alternatives.contains(key)) alternatives[key] = logprob_json(logprob);
      }
      top.push_back(std::move(alternatives));
    }
    offsets.push_back(i < text_offset.size() ? text_offset[i] : 0);
  }
  json::object o;
  o["tokens"] = std::move(text);
  o["token_logprobs"] = std::move(values);
  o["top_logprobs"] = std::move(top);
  o["text_offset"] = std::move(offsets);
  return o;
}

namespace {

json::array byte_list(std::string_view bytes) {
  json::array out;
  for (unsigned char c : bytes) out.push_back(static_cast<std::int64_t>(c));
  return out;
}

json::object chat_token(std::string_view bytes, double logprob) {
  json::object o;
  o["token"] = safe(token_text(bytes));
  o["logprob"] = logprob_json(logprob);
  o["bytes"] = byte_list(bytes);
  return o;
}

}  // namespace

json::object chat_logprobs_json(const std::vector<TokenLogprobs>& tokens) {
  json::array content;
  for (const TokenLogprobs& t : tokens) {
    json::object entry = chat_token(t.token, t.logprob.value_or(0));
    json::array top;
    for (const auto& [bytes, logprob] : t.top) top.push_back(chat_token(bytes, logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  json::object o;
  o["content"] = std::move(content);
  o["refusal"] = nullptr;
  return o;
}

}  // namespace json_fields

namespace {

namespace json = boost::json;
using json_fields::safe;
using json_fields::usage_json;

/// The fields around the choices, shared by every completion and chat body and chunk.
std::string envelope(std::string_view id, std::string_view object, std::int64_t created, std::string_view model,
                     json::array choices, const std::optional<Usage>& usage, bool usage_null) {
  json::object o;
  o["id"] = safe(id);
  o["object"] = object;
  o["created"] = created;
  o["model"] = safe(model);
  o["choices"] = std::move(choices);
  if (usage) {
    o["usage"] = usage_json(*usage);
  } else if (usage_null) {
    o["usage"] = nullptr;
  }
  return json_fields::serialize(o);
}

json::value reason_json(const std::optional<std::string>& reason) {
  if (reason) return safe(*reason);
  return nullptr;
}

}  // namespace

std::string encode_completion_response(const CompletionResponse& r) {
  json::array choices;
  for (const CompletionChoice& c : r.choices) {
    json::object choice;
    choice["text"] = safe(c.text);
    choice["index"] = c.index;
    if (c.logprobs) {
      choice["logprobs"] = json_fields::completion_logprobs_json(*c.logprobs, c.text_offset);
    } else {
      choice["logprobs"] = nullptr;
    }
    choice["finish_reason"] = reason_json(c.finish_reason);
    choices.push_back(std::move(choice));
  }
  return envelope(r.id, "text_completion", r.created, r.model, std::move(choices), r.usage, r.usage_null);
}

std::string encode_chat_response(const ChatResponse& r) {
  json::array choices;
  for (const ChatChoice& c : r.choices) {
    json::object message;
    if (!r.chunk || c.role) message["role"] = "assistant";
    if (c.content) {
      message["content"] = safe(*c.content);
    } else if (!r.chunk) {
      message["content"] = "";
    }
    json::object choice;
    choice["index"] = c.index;
    choice[r.chunk ? "delta" : "message"] = std::move(message);
    if (c.logprobs) {
      choice["logprobs"] = json_fields::chat_logprobs_json(*c.logprobs);
    } else {
      choice["logprobs"] = nullptr;
    }
    choice["finish_reason"] = reason_json(c.finish_reason);
    choices.push_back(std::move(choice));
  }
  return envelope(r.id, r.chunk ? "chat.completion.chunk" : "chat.completion", r.created, r.model, std::move(choices),
                  r.usage, r.usage_null);
}

}  // namespace vg
