// Wire codecs (see codec.hpp). Decoding throws a local DecodeError from the
// field readers and turns it into a kInvalidRequest at each public function.
#include "wire/codec.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

namespace vg::wire {
namespace json = boost::json;
namespace {

// Bounds on what a peer may send (the frame limit bounds the total too).
constexpr std::size_t kMaxTokens = 1u << 20;     // prompt ids, resume tokens
constexpr std::size_t kMaxList = 1u << 16;       // messages, logprob entries, waiting entries
constexpr std::size_t kMaxSmallList = 1024;      // stop strings, logit_bias, devices, models

struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what) { throw DecodeError(what); }

const json::object& as_object(const json::value& v, const char* what) {
  if (!v.is_object()) fail(std::string(what) + " must be an object");
  return v.as_object();
}

const json::value* get(const json::object& o, const char* key) {
  const json::value* v = o.if_contains(key);
  return v && !v->is_null() ? v : nullptr;
}

std::string str(const json::object& o, const char* key, bool required = false) {
  const json::value* v = get(o, key);
  if (!v) {
    if (required) fail(std::string("missing \"") + key + "\"");
    return {};
  }
  if (!v->is_string()) fail(std::string("\"") + key + "\" must be a string");
  return std::string(v->as_string());
}

std::int64_t integer(const json::object& o, const char* key, std::int64_t lo, std::int64_t hi, std::int64_t dflt,
                     bool required = false) {
  const json::value* v = get(o, key);
  if (!v) {
    if (required) fail(std::string("missing \"") + key + "\"");
    return dflt;
  }
  std::int64_t x = 0;
  if (v->is_int64()) {
    x = v->as_int64();
  } else if (v->is_uint64() && v->as_uint64() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    x = static_cast<std::int64_t>(v->as_uint64());
  } else {
    fail(std::string("\"") + key + "\" must be an integer");
  }
  if (x < lo || x > hi) {
    fail(std::string("\"") + key + "\" = " + std::to_string(x) + " is outside " + std::to_string(lo) + ".." +
         std::to_string(hi));
  }
  return x;
}

double number(const json::object& o, const char* key, double lo, double hi, double dflt) {
  const json::value* v = get(o, key);
  if (!v) return dflt;
  double x = 0;
  if (v->is_double()) {
    x = v->as_double();
  } else if (v->is_int64()) {
    x = static_cast<double>(v->as_int64());
  } else if (v->is_uint64()) {
    x = static_cast<double>(v->as_uint64());
  } else {
    fail(std::string("\"") + key + "\" must be a number");
  }
  if (!std::isfinite(x) || x < lo || x > hi) fail(std::string("\"") + key + "\" is out of range");
  return x;
}

/// A duration (ms or s) measured by the peer: finite; a value just below 0
/// (two clocks read in the other order) counts as 0.
double duration(const json::object& o, const char* key) {
  return std::max(0.0, number(o, key, -1e12, 1e12, 0));
}

bool boolean(const json::object& o, const char* key) {
  const json::value* v = get(o, key);
  if (!v) return false;
  if (!v->is_bool()) fail(std::string("\"") + key + "\" must be a boolean");
  return v->as_bool();
}

const json::array* array(const json::object& o, const char* key, std::size_t max) {
  const json::value* v = get(o, key);
  if (!v) return nullptr;
  if (!v->is_array()) fail(std::string("\"") + key + "\" must be an array");
  if (v->as_array().size() > max) fail(std::string("\"") + key + "\" has too many entries");
  return &v->as_array();
}

std::vector<std::int32_t> ids(const json::object& o, const char* key) {
  std::vector<std::int32_t> out;
  if (const json::array* a = array(o, key, kMaxTokens)) {
    out.reserve(a->size());
    for (const json::value& x : *a) {
      if (!x.is_int64() || x.as_int64() < 0 || x.as_int64() > std::numeric_limits<std::int32_t>::max()) {
        fail(std::string("\"") + key + "\" entries must be token ids (integers >= 0)");
      }
      out.push_back(static_cast<std::int32_t>(x.as_int64()));
    }
  }
  return out;
}

std::vector<std::string> strings(const json::object& o, const char* key, std::size_t max) {
  std::vector<std::string> out;
  if (const json::array* a = array(o, key, max)) {
    for (const json::value& x : *a) {
      if (!x.is_string()) fail(std::string("\"") + key + "\" entries must be strings");
      out.emplace_back(x.as_string());
    }
  }
  return out;
}

json::array id_array(const std::vector<std::int32_t>& v) {
  json::array a;
  a.reserve(v.size());
  for (std::int32_t x : v) a.push_back(x);
  return a;
}

json::array string_array(const std::vector<std::string>& v) {
  json::array a;
  for (const std::string& s : v) a.emplace_back(s);
  return a;
}

template <class T, class F>
Result<T> guarded(F&& f) {
  try {
    return f();
  } catch (const DecodeError& e) {
    return Error(ErrorCode::kInvalidRequest, e.what());
  } catch (const std::exception& e) {  // bad_alloc, length_error: still the peer's frame
    return Error(ErrorCode::kInvalidRequest, std::string("undecodable message: ") + e.what());
  }
}

// -- sampling and requests

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
  s.top_k = static_cast<int>(integer(o, "top_k", 0, std::numeric_limits<std::int32_t>::max(), 0));
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
  s.repetition_penalty = number(o, "repetition_penalty", 1e-300, 100, 1.0);
  if (const json::array* a = array(o, "logit_bias", kMaxSmallList)) {
    for (const json::value& e : *a) {
      if (!e.is_array() || e.as_array().size() != 2 || !e.as_array()[0].is_int64()) fail("bad \"logit_bias\" entry");
      const std::int64_t id = e.as_array()[0].as_int64();
      const json::value& b = e.as_array()[1];
      const double bias = b.is_double() ? b.as_double() : b.is_int64() ? static_cast<double>(b.as_int64()) : NAN;
      if (id < 0 || id > std::numeric_limits<std::int32_t>::max() || !(bias >= -100 && bias <= 100)) {
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
  o["sampling"] = encode_sampling(r.sampling);
  o["stop"] = string_array(r.stop);
  o["stream"] = r.stream;
  o["ignore_eos"] = r.ignore_eos;
  if (r.timeout_s) o["timeout_s"] = *r.timeout_s;
  if (r.chat) {
    json::array messages;
    for (const ChatMessage& m : r.chat->messages) messages.push_back(json::object{{"role", m.role}, {"content", m.content}});
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
    r.max_tokens = static_cast<int>(integer(o, "max_tokens", 0, std::numeric_limits<std::int32_t>::max(), 16));
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
      for (const std::string* s : {&r.retry.client, &r.retry.fingerprint, &r.retry.idempotency_key, &r.retry.token,
                                   &r.retry.offered_token}) {
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

json::object encode(const Accepted& a) {
  return json::object{{"model", a.model},
                      {"prompt_tokens", a.prompt_tokens},
                      {"queue_position", a.queue_position},
                      {"cost_bytes", a.cost_bytes},
                      {"echo_text", a.echo_text},
                      {"retry_claimed_by", a.retry_claimed_by}};
}

Result<Accepted> decode_accepted(const json::value& v) {
  return guarded<Accepted>([&] {
    const json::object& o = as_object(v, "\"submission\"");
    Accepted a;
    a.model = str(o, "model");
    a.prompt_tokens = static_cast<int>(integer(o, "prompt_tokens", 0, std::numeric_limits<std::int32_t>::max(), 0));
    a.queue_position = static_cast<int>(integer(o, "queue_position", 0, std::numeric_limits<std::int32_t>::max(), 0));
    a.cost_bytes = integer(o, "cost_bytes", 0, std::numeric_limits<std::int64_t>::max(), 0);
    a.echo_text = str(o, "echo_text");
    a.retry_claimed_by = str(o, "retry_claimed_by");
    return a;
  });
}

// Error codes travel by their error_type() name, so the two sides need not
// share the enum's numbering.
json::object encode(const Error& e) {
  json::object o{{"type", error_type(e.code)}, {"message", e.message}};
  if (e.retry_after_s) o["retry_after_s"] = *e.retry_after_s;
  if (e.needed_bytes) o["needed_bytes"] = *e.needed_bytes;
  if (e.budget_bytes) o["budget_bytes"] = *e.budget_bytes;
  if (e.retry_position) o["retry_position"] = *e.retry_position;
  if (!e.retry_token.empty()) o["retry_token"] = e.retry_token;
  return o;
}

namespace {
struct ErrorBox {
  Error error;
};
}  // namespace

Status decode_error(const json::value& v, Error* out) {
  Result<ErrorBox> r = guarded<ErrorBox>([&] {
    const json::object& o = as_object(v, "\"error\"");
    const std::string type = str(o, "type", true);
    std::optional<ErrorCode> code;
    for (int c = 0; c <= static_cast<int>(kLastErrorCode); ++c) {
      if (type == error_type(static_cast<ErrorCode>(c))) code = static_cast<ErrorCode>(c);
    }
    if (!code) fail("unknown error type \"" + type + "\"");
    Error e(*code, str(o, "message"));
    if (get(o, "retry_after_s")) e.retry_after_s = number(o, "retry_after_s", 0, 1e9, 0);
    if (get(o, "needed_bytes")) e.needed_bytes = integer(o, "needed_bytes", 0, std::numeric_limits<std::int64_t>::max(), 0);
    if (get(o, "budget_bytes")) e.budget_bytes = integer(o, "budget_bytes", 0, std::numeric_limits<std::int64_t>::max(), 0);
    if (get(o, "retry_position")) e.retry_position = integer(o, "retry_position", 0, std::numeric_limits<std::int32_t>::max(), 0);
    e.retry_token = str(o, "retry_token");
    return ErrorBox{std::move(e)};
  });
  if (!r.ok()) return r.error();
  *out = std::move(r->error);
  return Status::Ok();
}

namespace {

json::object encode_usage(const Usage& u) {
  return json::object{{"prompt", u.prompt_tokens}, {"completion", u.completion_tokens}};
}
Usage decode_usage(const json::object& o) {
  const json::value* v = get(o, "usage");
  if (!v) return {};
  const json::object& u = as_object(*v, "\"usage\"");
  return Usage{static_cast<int>(integer(u, "prompt", 0, std::numeric_limits<std::int32_t>::max(), 0)),
               static_cast<int>(integer(u, "completion", 0, std::numeric_limits<std::int32_t>::max(), 0))};
}
json::object encode_timings(const Timings& t) {
  return json::object{{"queue_ms", t.queue_ms}, {"prefill_ms", t.prefill_ms}, {"decode_ms", t.decode_ms}};
}
Timings decode_timings(const json::object& o) {
  const json::value* v = get(o, "timings");
  if (!v) return {};
  const json::object& t = as_object(*v, "\"timings\"");
  return Timings{duration(t, "queue_ms"), duration(t, "prefill_ms"), duration(t, "decode_ms")};
}
// A logprob travels as the shortest decimal string that reads back to the
// same double (std::to_chars / std::from_chars): Boost.JSON 1.81 parses
// numbers to within an ulp, not exactly, and a client must see the same
// logprobs from an engine process as from one process.
json::string exact_logprob(double d) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, std::isnan(d) ? -std::numeric_limits<double>::infinity() : d);
  return json::string(std::string_view(buf, static_cast<std::size_t>(r.ptr - buf)));
}
json::array encode_logprobs(const std::vector<TokenLogprobs>& v) {
  json::array a;
  for (const TokenLogprobs& t : v) {
    json::array top;
    for (const auto& [tok, lp] : t.top) top.push_back(json::array{json::string(tok), exact_logprob(lp)});
    json::object e{{"token", t.token}, {"top", std::move(top)}};
    if (t.logprob) e["logprob"] = exact_logprob(*t.logprob);
    a.push_back(std::move(e));
  }
  return a;
}
double logprob_value(const json::value& x) {
  double d = NAN;
  if (x.is_string()) {
    const std::string_view s = x.get_string();
    const auto r = std::from_chars(s.data(), s.data() + s.size(), d);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) d = NAN;
  }
  if (!(d <= 0)) fail("a logprob must be a decimal string of a number <= 0");
  return d;
}
std::vector<TokenLogprobs> decode_logprobs(const json::object& o, const char* key) {
  std::vector<TokenLogprobs> out;
  if (const json::array* a = array(o, key, kMaxList)) {
    for (const json::value& e : *a) {
      const json::object& eo = as_object(e, "a logprob entry");
      TokenLogprobs t;
      t.token = str(eo, "token");
      if (const json::value* lp = get(eo, "logprob")) t.logprob = logprob_value(*lp);
      if (const json::array* top = array(eo, "top", 20)) {
        for (const json::value& x : *top) {
          if (!x.is_array() || x.as_array().size() != 2 || !x.as_array()[0].is_string()) fail("bad top logprob");
          t.top.emplace_back(std::string(x.as_array()[0].as_string()), logprob_value(x.as_array()[1]));
        }
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace

json::object encode(const EngineEvent& ev) {
  return std::visit(
      [](const auto& e) -> json::object {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, QueuedEvent>) {
          return json::object{{"k", "queued"}, {"position", e.position}};
        } else if constexpr (std::is_same_v<T, StartedEvent>) {
          return json::object{{"k", "started"}, {"queue_ms", e.queue_ms}};
        } else if constexpr (std::is_same_v<T, TextEvent>) {
          json::object o{{"k", "text"}, {"text", e.text}, {"tokens", e.tokens}, {"choice", e.choice},
                         {"ids", id_array(e.token_ids)}};
          if (!e.logprobs.empty()) o["logprobs"] = encode_logprobs(e.logprobs);
          return o;
        } else if constexpr (std::is_same_v<T, PromptEvent>) {
          return json::object{{"k", "prompt"}, {"logprobs", encode_logprobs(e.logprobs)}};
        } else if constexpr (std::is_same_v<T, ChoiceEndEvent>) {
          return json::object{{"k", "choice_end"}, {"choice", e.choice}, {"finish_reason", e.finish_reason}};
        } else if constexpr (std::is_same_v<T, FinishedEvent>) {
          return json::object{{"k", "finished"},
                              {"finish_reason", e.finish_reason},
                              {"usage", encode_usage(e.usage)},
                              {"timings", encode_timings(e.timings)},
                              {"choice", e.choice}};
        } else {
          return json::object{{"k", "failed"},
                              {"error", encode(e.error)},
                              {"usage", encode_usage(e.usage)},
                              {"timings", encode_timings(e.timings)}};
        }
      },
      ev);
}

Result<EngineEvent> decode_event(const json::value& v) {
  return guarded<EngineEvent>([&]() -> EngineEvent {
    const json::object& o = as_object(v, "event");
    const std::string k = str(o, "k", true);
    constexpr std::int64_t kMaxInt = std::numeric_limits<std::int32_t>::max();
    if (k == "queued") return QueuedEvent{static_cast<int>(integer(o, "position", 0, kMaxInt, 0))};
    if (k == "started") return StartedEvent{duration(o, "queue_ms")};
    if (k == "text") {
      TextEvent t;
      t.text = str(o, "text");
      t.tokens = static_cast<int>(integer(o, "tokens", 0, kMaxInt, 0));
      t.choice = static_cast<int>(integer(o, "choice", 0, 255, 0));
      t.token_ids = ids(o, "ids");
      t.logprobs = decode_logprobs(o, "logprobs");
      return t;
    }
    if (k == "prompt") return PromptEvent{decode_logprobs(o, "logprobs")};
    if (k == "choice_end") {
      return ChoiceEndEvent{static_cast<int>(integer(o, "choice", 0, 255, 0)), str(o, "finish_reason")};
    }
    if (k == "finished") {
      FinishedEvent f;
      f.finish_reason = str(o, "finish_reason", true);
      f.usage = decode_usage(o);
      f.timings = decode_timings(o);
      f.choice = static_cast<int>(integer(o, "choice", 0, 255, 0));
      return f;
    }
    if (k == "failed") {
      const json::value* e = get(o, "error");
      if (!e) fail("a failed event needs \"error\"");
      Error err;
      if (Status st = decode_error(*e, &err); !st.ok()) fail(st.error().message);
      return FailedEvent{std::move(err), decode_usage(o), decode_timings(o)};
    }
    fail("unknown event kind \"" + k + "\"");
  });
}

json::object encode(const ModelInfo& m) {
  return json::object{{"id", m.id},
                      {"family", m.family},
                      {"dtype", m.dtype},
                      {"context_length", m.context_length},
                      {"parameter_count", m.parameter_count},
                      {"device", m.device},
                      {"devices", string_array(m.devices)},
                      {"resident_bytes", m.resident_bytes},
                      {"created", m.created},
                      {"workspace_bytes", m.workspace_bytes},
                      {"kv_bytes_per_token", m.kv_bytes_per_token},
                      {"sequence_overhead_bytes", m.sequence_overhead_bytes},
                      {"safety_factor", m.safety_factor},
                      {"dir", m.dir},
                      {"vocab_size", m.vocab_size},
                      {"eos_token_id", m.eos_token_id}};
}

Result<ModelInfo> decode_model_info(const json::value& v) {
  return guarded<ModelInfo>([&] {
    const json::object& o = as_object(v, "model");
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    ModelInfo m;
    m.id = str(o, "id", true);
    m.family = str(o, "family");
    m.dtype = str(o, "dtype");
    m.context_length = static_cast<int>(integer(o, "context_length", 0, std::numeric_limits<std::int32_t>::max(), 0));
    m.parameter_count = integer(o, "parameter_count", 0, kMax, 0);
    m.device = str(o, "device");
    m.devices = strings(o, "devices", kMaxSmallList);
    m.resident_bytes = integer(o, "resident_bytes", 0, kMax, 0);
    m.created = integer(o, "created", 0, kMax, 0);
    m.workspace_bytes = integer(o, "workspace_bytes", 0, kMax, 0);
    m.kv_bytes_per_token = integer(o, "kv_bytes_per_token", 0, kMax, 0);
    m.sequence_overhead_bytes = integer(o, "sequence_overhead_bytes", 0, kMax, 0);
    m.safety_factor = number(o, "safety_factor", 0, 1e6, 1.0);
    m.dir = str(o, "dir");
    if (m.dir.size() > 4096) fail("\"dir\" is longer than 4096 bytes");
    m.vocab_size = static_cast<int>(integer(o, "vocab_size", 0, std::numeric_limits<std::int32_t>::max(), 0));
    m.eos_token_id = static_cast<int>(integer(o, "eos_token_id", -1, std::numeric_limits<std::int32_t>::max(), -1));
    return m;
  });
}

// Every integer field of DeviceState and AdmissionState, by name, so encode
// and decode cannot drift apart.
namespace {
using DeviceInt = std::int64_t DeviceState::*;
const std::pair<const char*, DeviceInt> kDeviceInts[] = {
    {"capacity_bytes", &DeviceState::capacity_bytes},
    {"budget_bytes", &DeviceState::budget_bytes},
    {"effective_budget_bytes", &DeviceState::effective_budget_bytes},
    {"reserved_bytes", &DeviceState::reserved_bytes},
    {"used_bytes", &DeviceState::used_bytes},
    {"peak_bytes", &DeviceState::peak_bytes},
    {"allocated_bytes", &DeviceState::allocated_bytes},
    {"cache_reserved_bytes", &DeviceState::cache_reserved_bytes},
    {"resident_bytes", &DeviceState::resident_bytes},
    {"workspace_bytes", &DeviceState::workspace_bytes},
    {"peak_reserved_bytes", &DeviceState::peak_reserved_bytes},
    {"completed", &DeviceState::completed},
    {"out_of_memory", &DeviceState::out_of_memory},
    {"preemptions", &DeviceState::preemptions},
    {"foreign_bytes", &DeviceState::foreign_bytes},
    {"budget_cuts_out_of_memory", &DeviceState::budget_cuts_out_of_memory},
    {"budget_raises_quiet_period", &DeviceState::budget_raises_quiet_period},
    {"budget_cuts_foreign", &DeviceState::budget_cuts_foreign},
    {"budget_raises_foreign", &DeviceState::budget_raises_foreign},
    {"kv_block_bytes", &DeviceState::kv_block_bytes},
    {"kv_blocks_total", &DeviceState::kv_blocks_total},
    {"kv_blocks_used", &DeviceState::kv_blocks_used},
    {"kv_blocks_cached", &DeviceState::kv_blocks_cached},
    {"kv_blocks_evicted", &DeviceState::kv_blocks_evicted},
    {"kv_prompt_tokens", &DeviceState::kv_prompt_tokens},
    {"kv_prefix_hit_tokens", &DeviceState::kv_prefix_hit_tokens},
    {"kv_recomputed_tokens", &DeviceState::kv_recomputed_tokens},
    {"kv_growth_preemptions", &DeviceState::kv_growth_preemptions},
};
using StateInt = std::int64_t AdmissionState::*;
const std::pair<const char*, StateInt> kStateInts[] = {
    {"admitted", &AdmissionState::admitted},
    {"rejected_never_fits", &AdmissionState::rejected_never_fits},
    {"rejected_queue_full", &AdmissionState::rejected_queue_full},
    {"queue_timeouts", &AdmissionState::queue_timeouts},
    {"deadline_expired", &AdmissionState::deadline_expired},
    {"cancelled_queued", &AdmissionState::cancelled_queued},
    {"moved", &AdmissionState::moved},
    {"cancelled", &AdmissionState::cancelled},
    {"completed", &AdmissionState::completed},
    {"failed", &AdmissionState::failed},
    {"out_of_memory", &AdmissionState::out_of_memory},
    {"oom_budget_cuts", &AdmissionState::oom_budget_cuts},
    {"preemptions", &AdmissionState::preemptions},
    {"not_ready_trips", &AdmissionState::not_ready_trips},
    {"retry_booked", &AdmissionState::retry_booked},
    {"retry_claimed", &AdmissionState::retry_claimed},
    {"retry_expired", &AdmissionState::retry_expired},
    {"retry_early", &AdmissionState::retry_early},
    {"retry_refused", &AdmissionState::retry_refused},
};
using StateSmall = int AdmissionState::*;
const std::pair<const char*, StateSmall> kStateSmall[] = {
    {"queue_depth", &AdmissionState::queue_depth},   {"queued", &AdmissionState::queued},
    {"running", &AdmissionState::running},           {"retry_bookings", &AdmissionState::retry_bookings},
    {"retry_places", &AdmissionState::retry_places},
};
constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMax32 = std::numeric_limits<std::int32_t>::max();
}  // namespace

json::object encode(const AdmissionState& s) {
  json::object o{{"policy", s.policy}, {"draining", s.draining}};
  for (const auto& [k, m] : kStateInts) o[k] = s.*m;
  for (const auto& [k, m] : kStateSmall) o[k] = s.*m;
  json::array devices;
  for (const DeviceState& d : s.devices) {
    json::object dv{{"name", d.name},
                    {"ready", d.ready},
                    {"state", d.state},
                    {"reason", d.reason},
                    {"models", string_array(d.models)},
                    {"running", d.running},
                    {"max_running", d.max_running},
                    {"kv_reservation", d.kv_reservation},
                    {"kv_block_tokens", d.kv_block_tokens}};
    for (const auto& [k, m] : kDeviceInts) dv[k] = d.*m;
    devices.push_back(std::move(dv));
  }
  o["devices"] = std::move(devices);
  json::array waiting;
  for (const WaitingRequest& w : s.waiting) {
    waiting.push_back(json::object{{"position", w.position}, {"cost_bytes", w.cost_bytes}, {"waited_s", w.waited_s},
                                   {"priority", w.priority}});
  }
  o["waiting"] = std::move(waiting);
  return o;
}

Result<AdmissionState> decode_admission_state(const json::value& v) {
  return guarded<AdmissionState>([&] {
    const json::object& o = as_object(v, "admission state");
    AdmissionState s;
    s.policy = str(o, "policy");
    s.draining = boolean(o, "draining");
    for (const auto& [k, m] : kStateInts) s.*m = integer(o, k, 0, kMax64, 0);
    for (const auto& [k, m] : kStateSmall) s.*m = static_cast<int>(integer(o, k, 0, kMax32, 0));
    if (const json::array* a = array(o, "devices", kMaxSmallList)) {
      for (const json::value& e : *a) {
        const json::object& dv = as_object(e, "a device");
        DeviceState d;
        d.name = str(dv, "name", true);
        d.ready = boolean(dv, "ready");
        d.state = str(dv, "state");
        d.reason = str(dv, "reason");
        d.models = strings(dv, "models", kMaxSmallList);
        d.running = static_cast<int>(integer(dv, "running", 0, kMax32, 0));
        d.max_running = static_cast<int>(integer(dv, "max_running", 0, kMax32, 0));
        d.kv_reservation = str(dv, "kv_reservation");
        d.kv_block_tokens = static_cast<int>(integer(dv, "kv_block_tokens", 0, kMax32, 0));
        for (const auto& [k, m] : kDeviceInts) d.*m = integer(dv, k, 0, kMax64, 0);
        s.devices.push_back(std::move(d));
      }
    }
    if (const json::array* a = array(o, "waiting", AdmissionState::kMaxWaitingShown)) {
      for (const json::value& e : *a) {
        const json::object& w = as_object(e, "a waiting entry");
        s.waiting.push_back(WaitingRequest{static_cast<int>(integer(w, "position", 0, kMax32, 0)),
                                           integer(w, "cost_bytes", 0, kMax64, 0), duration(w, "waited_s"),
                                           str(w, "priority")});
      }
    }
    return s;
  });
}

json::object encode(const EngineStatus& s) {
  return json::object{{"ready", s.ready},
                      {"not_ready_reason", s.not_ready_reason},
                      {"healthy", s.healthy},
                      {"health_reason", s.health_reason}};
}

Result<EngineStatus> decode_status(const json::value& v) {
  return guarded<EngineStatus>([&] {
    const json::object& o = as_object(v, "status");
    EngineStatus s;
    s.ready = boolean(o, "ready");
    s.not_ready_reason = str(o, "not_ready_reason");
    s.healthy = boolean(o, "healthy");
    s.health_reason = str(o, "health_reason");
    return s;
  });
}

json::object encode(const HistogramSample& h) {
  json::array bounds, buckets;
  for (double b : h.bounds) bounds.push_back(b);
  for (std::uint64_t c : h.buckets) buckets.push_back(c);
  json::object o{{"name", h.name}, {"bounds", std::move(bounds)}, {"buckets", std::move(buckets)}, {"sum", h.sum}};
  if (!h.labels.empty()) o["labels"] = string_array(h.labels);
  return o;
}

Result<HistogramSample> decode_histogram(const json::value& v) {
  return guarded<HistogramSample>([&] {
    const json::object& o = as_object(v, "histogram");
    HistogramSample h;
    h.name = str(o, "name", true);
    h.labels = strings(o, "labels", 8);
    const json::array* bounds = array(o, "bounds", 256);
    const json::array* buckets = array(o, "buckets", 257);
    if (!bounds || !buckets || buckets->size() != bounds->size() + 1) fail("histogram buckets do not match its bounds");
    for (const json::value& b : *bounds) {
      if (!b.is_number()) fail("histogram bounds must be numbers");
      h.bounds.push_back(b.to_number<double>());
    }
    for (const json::value& c : *buckets) {
      if (c.is_uint64()) {
        h.buckets.push_back(c.as_uint64());
      } else if (c.is_int64() && c.as_int64() >= 0) {
        h.buckets.push_back(static_cast<std::uint64_t>(c.as_int64()));
      } else {
        fail("histogram counts must be integers >= 0");
      }
    }
    h.sum = number(o, "sum", -1e300, 1e300, 0);
    return h;
  });
}

// -- TorchScript (tensor) requests

namespace {

constexpr std::size_t kMaxTensors = 256;             // inputs, outputs, names of a request or model
constexpr std::size_t kMaxRank = 16;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 26;  // one tensor's elements (the frame bounds the sum)

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The floats' bytes (host order: both ends of a Unix socket share a host) as base64.
std::string floats_base64(const std::vector<float>& data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t n = data.size() * sizeof(float);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (std::size_t i = 0; i < n; i += 3) {
    const std::uint32_t b0 = p[i];
    const std::uint32_t b1 = i + 1 < n ? p[i + 1] : 0;
    const std::uint32_t b2 = i + 2 < n ? p[i + 2] : 0;
    const std::uint32_t w = (b0 << 16) | (b1 << 8) | b2;
    out.push_back(kB64[(w >> 18) & 63]);
    out.push_back(kB64[(w >> 12) & 63]);
    out.push_back(i + 1 < n ? kB64[(w >> 6) & 63] : '=');
    out.push_back(i + 2 < n ? kB64[w & 63] : '=');
  }
  return out;
}

/// The floats of base64 `text` (a whole number of floats, at most kMaxElements).
std::vector<float> base64_floats(std::string_view text, const std::string& what) {
  if (text.size() % 4 != 0) fail(what + ": data is not base64");
  std::size_t bytes = text.size() / 4 * 3;
  if (!text.empty() && text.back() == '=') --bytes;
  if (text.size() >= 2 && text[text.size() - 2] == '=') --bytes;
  if (bytes % sizeof(float) != 0) fail(what + ": data is not a whole number of floats");
  const std::size_t elements = bytes / sizeof(float);
  if (elements > static_cast<std::size_t>(kMaxElements)) {
    fail(what + " has more than " + std::to_string(kMaxElements) + " values");
  }
  auto value = [&](char c) -> std::uint32_t {
    if (c >= 'A' && c <= 'Z') return static_cast<std::uint32_t>(c - 'A');
    if (c >= 'a' && c <= 'z') return static_cast<std::uint32_t>(c - 'a' + 26);
    if (c >= '0' && c <= '9') return static_cast<std::uint32_t>(c - '0' + 52);
    if (c == '+') return 62;
    if (c == '/') return 63;
    fail(what + ": data is not base64");
  };
  std::vector<float> out(elements);
  auto* q = reinterpret_cast<unsigned char*>(out.data());
  std::size_t o = 0;
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const bool pad2 = last && text[i + 2] == '=';
    const bool pad3 = last && text[i + 3] == '=';
    if (pad2 && !pad3) fail(what + ": data is not base64");
    const std::uint32_t w = (value(text[i]) << 18) | (value(text[i + 1]) << 12) |
                            (pad2 ? 0 : value(text[i + 2]) << 6) | (pad3 ? 0 : value(text[i + 3]));
    const unsigned char b[3] = {static_cast<unsigned char>(w >> 16), static_cast<unsigned char>(w >> 8),
                                static_cast<unsigned char>(w)};
    for (int k = 0; k < 3 && o < bytes; ++k) q[o++] = b[k];
  }
  return out;
}

json::array int_array(const std::vector<std::int64_t>& v) {
  json::array a;
  for (std::int64_t x : v) a.push_back(x);
  return a;
}

std::vector<std::int64_t> shape_of(const json::object& o, const char* key, const std::string& what) {
  std::vector<std::int64_t> shape;
  const json::array* a = array(o, key, kMaxRank);
  if (!a) fail(what + ": missing \"" + key + "\"");
  for (const json::value& x : *a) {
    if (!x.is_int64() || x.as_int64() < 0 || x.as_int64() > kMaxElements) {
      fail(what + ": \"" + key + "\" entries must be sizes (integers 0.." + std::to_string(kMaxElements) + ")");
    }
    shape.push_back(x.as_int64());
  }
  return shape;
}

json::object encode_tensor(const HostTensor& t) {
  return json::object{{"name", t.name}, {"shape", int_array(t.shape)}, {"data", floats_base64(t.data)}};
}

HostTensor decode_tensor(const json::value& v) {
  const json::object& o = as_object(v, "tensor");
  HostTensor t;
  t.name = str(o, "name", true);
  const std::string what = "tensor '" + t.name + "'";
  // Whether the data fits the shape is the engine's check (check_inputs,
  // a 400 naming the input), not a broken frame.
  t.shape = shape_of(o, "shape", what);
  const json::value* data = get(o, "data");
  if (!data || !data->is_string()) fail(what + ": \"data\" must be a base64 string");
  t.data = base64_floats(std::string_view(data->as_string()), what);
  return t;
}

json::array tensors(const std::vector<HostTensor>& v) {
  json::array a;
  for (const HostTensor& t : v) a.push_back(encode_tensor(t));
  return a;
}

std::vector<HostTensor> tensors_of(const json::object& o, const char* key) {
  std::vector<HostTensor> out;
  if (const json::array* a = array(o, key, kMaxTensors)) {
    for (const json::value& x : *a) out.push_back(decode_tensor(x));
  }
  return out;
}

json::object encode_spec(const TensorSpec& t) {
  json::array shape;
  for (const DimSpec& d : t.shape) {
    if (const auto* n = std::get_if<std::int64_t>(&d)) {
      shape.push_back(*n);
    } else {
      shape.emplace_back(std::get<std::string>(d));
    }
  }
  return json::object{{"name", t.name}, {"dtype", t.dtype}, {"shape", std::move(shape)}};
}

TensorSpec decode_spec(const json::value& v) {
  const json::object& o = as_object(v, "tensor spec");
  TensorSpec t;
  t.name = str(o, "name", true);
  t.dtype = str(o, "dtype", true);
  const json::array* a = array(o, "shape", kMaxRank);
  if (!a) fail("tensor spec '" + t.name + "' has no shape");
  for (const json::value& x : *a) {
    if (x.is_int64() && x.as_int64() >= 1) {
      t.shape.emplace_back(x.as_int64());
    } else if (x.is_string() && !x.as_string().empty()) {
      t.shape.emplace_back(std::string(x.as_string()));
    } else {
      fail("tensor spec '" + t.name + "': a dimension is a size >= 1 or a name");
    }
  }
  return t;
}

}  // namespace

json::object encode(const TensorInferRequest& r) {
  json::object o{{"request_id", r.request_id}, {"model", r.model},      {"id", r.id},
                 {"inputs", tensors(r.inputs)}, {"dtypes", string_array(r.dtypes)},
                 {"outputs", string_array(r.outputs)}};
  if (r.timeout_s) o["timeout_s"] = *r.timeout_s;
  if (r.priority) o["priority"] = static_cast<int>(*r.priority);
  return o;
}

Result<TensorInferRequest> decode_tensor_request(const json::value& v) {
  return guarded<TensorInferRequest>([&] {
    const json::object& o = as_object(v, "tensor request");
    TensorInferRequest r;
    r.request_id = str(o, "request_id");
    r.model = str(o, "model", true);
    r.id = str(o, "id");
    r.inputs = tensors_of(o, "inputs");
    r.dtypes = strings(o, "dtypes", kMaxTensors);
    if (r.dtypes.size() != r.inputs.size()) fail("\"dtypes\" must name each input's datatype");
    r.outputs = strings(o, "outputs", kMaxTensors);
    if (get(o, "timeout_s")) r.timeout_s = number(o, "timeout_s", 0, 1e9, 0);
    if (get(o, "priority")) r.priority = static_cast<Priority>(integer(o, "priority", 0, 2, 1));
    return r;
  });
}

std::size_t encoded_tensors_bound(const std::vector<HostTensor>& tensors) {
  std::size_t bytes = 0;
  for (const HostTensor& t : tensors) {
    bytes += (t.data.size() * sizeof(float) + 2) / 3 * 4;  // base64
    bytes += 6 * t.name.size() + 64 + 24 * t.shape.size();  // name (escaped at worst), keys, shape
  }
  return bytes;
}

json::object encode(const TensorResult& r) {
  return json::object{{"outputs", tensors(r.outputs)},
                      {"batch_requests", r.batch_requests},
                      {"batch_shape", int_array(r.batch_shape)},
                      {"batch_cost_bytes", r.batch_cost_bytes},
                      {"queue_ms", r.queue_ms},
                      {"compute_ms", r.compute_ms}};
}

Result<TensorResult> decode_tensor_result(const json::value& v) {
  return guarded<TensorResult>([&] {
    const json::object& o = as_object(v, "tensor result");
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    TensorResult r;
    r.outputs = tensors_of(o, "outputs");
    r.batch_requests = static_cast<int>(integer(o, "batch_requests", 1, 1 << 20, 1));
    if (get(o, "batch_shape")) r.batch_shape = shape_of(o, "batch_shape", "tensor result");
    r.batch_cost_bytes = integer(o, "batch_cost_bytes", 0, kMax, 0);
    r.queue_ms = duration(o, "queue_ms");
    r.compute_ms = duration(o, "compute_ms");
    return r;
  });
}

json::object encode(const TensorModelInfo& m) {
  json::array inputs, outputs, dims, samples;
  for (const TensorSpec& t : m.spec.inputs) inputs.push_back(encode_spec(t));
  for (const TensorSpec& t : m.spec.outputs) outputs.push_back(encode_spec(t));
  for (const DimRange& d : m.spec.dims) dims.push_back(json::object{{"name", d.name}, {"min", d.min}, {"max", d.max}});
  for (const PeakSample& s : m.profile.samples) {
    samples.push_back(json::object{{"shape", int_array(s.shape)},
                                   {"elements", s.elements},
                                   {"peak_bytes", s.peak_bytes},
                                   {"held_out", s.held_out},
                                   {"predicted_bytes", s.predicted_bytes}});
  }
  const TensorMemoryProfile& p = m.profile;
  return json::object{
      {"id", m.id},
      {"devices", string_array(m.devices)},
      {"spec", json::object{{"inputs", std::move(inputs)},
                            {"outputs", std::move(outputs)},
                            {"dims", std::move(dims)},
                            {"batched", m.spec.batched},
                            {"pad", string_array(m.spec.pad)}}},
      {"profile", json::object{{"resident_bytes", p.resident_bytes},
                               {"fixed_bytes", p.fixed_bytes},
                               {"bytes_per_element", p.bytes_per_element},
                               {"safety_factor", p.safety_factor},
                               {"held_out_max_error", p.held_out_max_error},
                               {"held_out_min_error", p.held_out_min_error},
                               {"samples", std::move(samples)}}},
      {"max_batch", m.max_batch},
      {"budget_bytes", m.budget_bytes}};
}

Result<TensorModelInfo> decode_tensor_model_info(const json::value& v) {
  return guarded<TensorModelInfo>([&] {
    const json::object& o = as_object(v, "tensor model");
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    TensorModelInfo m;
    m.id = str(o, "id", true);
    m.devices = strings(o, "devices", kMaxSmallList);
    const json::value* sv = get(o, "spec");
    if (!sv) fail("tensor model '" + m.id + "' has no spec");
    const json::object& so = as_object(*sv, "spec");
    if (const json::array* a = array(so, "inputs", kMaxTensors)) {
      for (const json::value& x : *a) m.spec.inputs.push_back(decode_spec(x));
    }
    if (const json::array* a = array(so, "outputs", kMaxTensors)) {
      for (const json::value& x : *a) m.spec.outputs.push_back(decode_spec(x));
    }
    if (const json::array* a = array(so, "dims", kMaxTensors)) {
      for (const json::value& x : *a) {
        const json::object& d = as_object(x, "dimension");
        DimRange r;
        r.name = str(d, "name", true);
        r.min = integer(d, "min", 1, kMax, 1, true);
        r.max = integer(d, "max", r.min, kMax, r.min, true);
        m.spec.dims.push_back(std::move(r));
      }
    }
    m.spec.batched = boolean(so, "batched");
    m.spec.pad = strings(so, "pad", kMaxTensors);
    const json::value* pv = get(o, "profile");
    if (!pv) fail("tensor model '" + m.id + "' has no profile");
    const json::object& po = as_object(*pv, "profile");
    TensorMemoryProfile& p = m.profile;
    p.resident_bytes = integer(po, "resident_bytes", 0, kMax, 0);
    p.fixed_bytes = integer(po, "fixed_bytes", 0, kMax, 0);
    p.bytes_per_element = number(po, "bytes_per_element", 0, 1e15, 0);
    p.safety_factor = number(po, "safety_factor", 1, 1e6, 1);
    p.held_out_max_error = number(po, "held_out_max_error", -1e6, 1e6, 0);
    p.held_out_min_error = number(po, "held_out_min_error", -1e6, 1e6, 0);
    if (const json::array* a = array(po, "samples", kMaxSmallList)) {
      for (const json::value& x : *a) {
        const json::object& so2 = as_object(x, "profile sample");
        PeakSample s;
        s.shape = shape_of(so2, "shape", "profile sample");
        s.elements = integer(so2, "elements", 0, kMax, 0);
        s.peak_bytes = integer(so2, "peak_bytes", 0, kMax, 0);
        s.held_out = boolean(so2, "held_out");
        s.predicted_bytes = integer(so2, "predicted_bytes", 0, kMax, 0);
        p.samples.push_back(std::move(s));
      }
    }
    m.max_batch = static_cast<int>(integer(o, "max_batch", 1, 1 << 20, 1));
    m.budget_bytes = integer(o, "budget_bytes", 0, kMax, 0);
    return m;
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
