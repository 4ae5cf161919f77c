// Wire codecs of a completion request: sampling, the request, its resume
// state (see codec.hpp).
#include "wire/codec.hpp"

#include <limits>
#include <string>
#include <variant>

#include "wire/json_fields.hpp"

namespace vg::wire {
using namespace fields;

namespace {

json::object encode_sampling(const SamplingParams& s) {
  json::object o;
  o["temperature"] = s.temperature;
  o["top_p"] = s.top_p;
  o["top_k"] = s.top_k;
  if (s.seed) o["seed"] = *s.seed;
  o["presence_penalty"] = s.presence_penalty;
  o["frequency_penalty"] = s.frequency_penalty;
  o["repetition_penalty"] = s.repetition_penalty;
  json::array bias;
  for (const auto& [id, b] : s.logit_bias) bias.push_back(json::array{id, static_cast<double>(b)});
  o["logit_bias"] = std::move(bias);
  return o;
}

SamplingParams decode_sampling(const json::object& o) {
  SamplingParams s;
  s.temperature = number(o, "temperature", 0, 2, 1.0);
  s.top_p = number(o, "top_p", 0, 1, 1.0);
  if (!(s.top_p > 0)) fail("\"top_p\" must be in (0, 1]");
  s.top_k = static_cast<int>(integer(o, "top_k", 0, kMaxInt32, 0));
  if (const json::value* v = get(o, "seed")) {
    if (v->is_uint64()) {
      s.seed = v->as_uint64();
    } else if (v->is_int64() && v->as_int64() >= 0) {
      s.seed = static_cast<std::uint64_t>(v->as_int64());
    } else {
      fail("\"seed\" must be an integer >= 0");
    }
  }
  s.presence_penalty = number(o, "presence_penalty", -2, 2, 0);
  s.frequency_penalty = number(o, "frequency_penalty", -2, 2, 0);
  // (0, 100], as the HTTP layer accepts it: any positive double.
  s.repetition_penalty = number(o, "repetition_penalty", std::numeric_limits<double>::denorm_min(), 100, 1.0);
  if (const json::array* a = array(o, "logit_bias", kMaxSmallList)) {
    for (const json::value& e : *a) {
      if (!e.is_array() || e.as_array().size() != 2 || !e.as_array()[0].is_int64()) fail("bad \"logit_bias\" entry");
      const std::int64_t id = e.as_array()[0].as_int64();
      const json::value& b = e.as_array()[1];
      const double bias = b.is_double() ? b.as_double() : b.is_int64() ? static_cast<double>(b.as_int64()) : NAN;
      if (id < 0 || id > kMaxInt32 || !(bias >= -100 && bias <= 100)) {
        fail("bad \"logit_bias\" entry");
      }
      s.logit_bias.emplace_back(static_cast<std::int32_t>(id), static_cast<float>(bias));
    }
  }
  return s;
}

}  // namespace

json::object encode(const CompletionRequest& r) {
  json::object o;
  o["request_id"] = r.request_id;
  o["model"] = r.model;
  if (const auto* text = std::get_if<std::string>(&r.prompt)) {
    o["prompt"] = *text;
  } else {
    o["prompt_ids"] = id_array(std::get<std::vector<std::int32_t>>(r.prompt));
  }
  o["max_tokens"] = r.max_tokens;
  if (r.max_tokens_from == MaxTokensFrom::kRestOfContext) o["max_tokens_from"] = "rest_of_context";
  o["sampling"] = encode_sampling(r.sampling);
  o["stop"] = string_array(r.stop);
  o["stream"] = r.stream;
  o["ignore_eos"] = r.ignore_eos;
  if (r.timeout_s) o["timeout_s"] = *r.timeout_s;
  if (r.chat) {
    json::array messages;
    for (const ChatMessage& m : r.chat->messages)
      messages.push_back(json::object{{"role", m.role}, {"content", m.content}});
    o["chat"] = json::object{{"messages", std::move(messages)}, {"chat_template", r.chat->chat_template}};
  }
  if (r.priority) o["priority"] = static_cast<int>(*r.priority);
  o["n"] = r.n;
  if (r.logprobs) o["logprobs"] = *r.logprobs;
  o["echo"] = r.echo;
  o["include_usage"] = r.include_usage;
  o["retry"] = json::object{{"client", r.retry.client},
                            {"fingerprint", r.retry.fingerprint},
                            {"idempotency_key", r.retry.idempotency_key},
                            {"token", r.retry.token},
                            {"offered_token", r.retry.offered_token},
                            {"attempt", static_cast<int>(r.retry.attempt)}};
  return o;
}

Result<CompletionRequest> decode_completion_request(const json::value& v) {
  return guarded<CompletionRequest>([&] {
    const json::object& o = as_object(v, "request");
    CompletionRequest r;
    r.request_id = str(o, "request_id");
    if (r.request_id.size() > 256) fail("\"request_id\" is longer than 256 bytes");
    r.model = str(o, "model");
    if (const json::value* p = get(o, "prompt")) {
      if (!p->is_string()) fail("\"prompt\" must be a string");
      r.prompt = std::string(p->as_string());
    } else {
      r.prompt = ids(o, "prompt_ids");
    }
    r.max_tokens = static_cast<int>(integer(o, "max_tokens", 0, kMaxInt32, 16));
    if (get(o, "max_tokens_from")) {
      if (str(o, "max_tokens_from") != "rest_of_context") fail("\"max_tokens_from\" must be \"rest_of_context\"");
      r.max_tokens_from = MaxTokensFrom::kRestOfContext;
    }
    if (const json::value* s = get(o, "sampling")) r.sampling = decode_sampling(as_object(*s, "\"sampling\""));
    r.stop = strings(o, "stop", 16);
    for (const std::string& s : r.stop) {
      if (s.empty()) fail("\"stop\" strings must not be empty");
    }
    r.stream = boolean(o, "stream");
    r.ignore_eos = boolean(o, "ignore_eos");
    if (get(o, "timeout_s")) r.timeout_s = number(o, "timeout_s", 1e-6, 1e9, 0);
    if (const json::value* c = get(o, "chat")) {
      const json::object& co = as_object(*c, "\"chat\"");
      ChatPrompt chat;
      if (const json::array* m = array(co, "messages", kMaxList)) {
        for (const json::value& e : *m) {
          const json::object& mo = as_object(e, "a chat message");
          chat.messages.push_back(ChatMessage{str(mo, "role", true), str(mo, "content")});
        }
      }
      chat.chat_template = str(co, "chat_template");
      r.chat = std::move(chat);
    }
    if (get(o, "priority")) r.priority = static_cast<Priority>(integer(o, "priority", 0, 2, 1));
    r.n = static_cast<int>(integer(o, "n", 1, 256, 1));
    if (get(o, "logprobs")) r.logprobs = static_cast<int>(integer(o, "logprobs", 0, 20, 0));
    r.echo = boolean(o, "echo");
    r.include_usage = boolean(o, "include_usage");
    if (const json::value* rv = get(o, "retry")) {
      const json::object& ro = as_object(*rv, "\"retry\"");
      r.retry.client = str(ro, "client");
      r.retry.fingerprint = str(ro, "fingerprint");
      r.retry.idempotency_key = str(ro, "idempotency_key");
      r.retry.token = str(ro, "token");
      r.retry.offered_token = str(ro, "offered_token");
      r.retry.attempt = static_cast<RetryAttempt>(integer(ro, "attempt", 0, 2, 0));
      for (const std::string* s :
           {&r.retry.client, &r.retry.fingerprint, &r.retry.idempotency_key, &r.retry.token, &r.retry.offered_token}) {
        if (s->size() > 1024) fail("a \"retry\" field is longer than 1024 bytes");
      }
    }
    return r;
  });
}

json::object encode(const ResumeState& r) {
  return json::object{{"tokens", id_array(r.tokens)}, {"prompt_sent", r.prompt_sent}};
}

Result<ResumeState> decode_resume(const json::value& v) {
  return guarded<ResumeState>([&] {
    const json::object& o = as_object(v, "\"resume\"");
    ResumeState r;
    r.tokens = ids(o, "tokens");
    r.prompt_sent = boolean(o, "prompt_sent");
    return r;
  });
}

bool contains_text(const CompletionRequest& r, const std::string& needle) {
  if (needle.empty()) return false;
  if (const auto* text = std::get_if<std::string>(&r.prompt); text && text->find(needle) != std::string::npos) {
    return true;
  }
  if (r.chat) {
    for (const ChatMessage& m : r.chat->messages) {
      if (m.content.find(needle) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace vg::wire
