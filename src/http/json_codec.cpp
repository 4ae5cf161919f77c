// JSON codec of the HTTP API (see json_codec.hpp). Boost.JSON is used here and
// nowhere outside src/http. Every string written into a response goes through
// sanitize_utf8 (common/utf8) so the output is always well-formed JSON.
#include "http/json_codec.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>

#include <boost/json.hpp>

#include "common/decimal.hpp"
#include "common/utf8.hpp"
#include "http/json_fields.hpp"

namespace vg {

namespace json_fields {

boost::json::string safe(std::string_view s) { return boost::json::string(sanitize_utf8(s)); }

boost::json::object usage_json(const Usage& u) {
  boost::json::object o;
  o["prompt_tokens"] = u.prompt_tokens;
  o["completion_tokens"] = u.completion_tokens;
  o["total_tokens"] = static_cast<std::int64_t>(u.prompt_tokens) + u.completion_tokens;
  return o;
}

Error invalid(std::string message) { return Error(ErrorCode::kInvalidRequest, std::move(message)); }

Error with_param(Error error, std::string_view body) {
  if (error.code != ErrorCode::kInvalidRequest || !error.param.empty()) return error;
  const std::string& m = error.message;
  const std::size_t root_end = m.find_first_not_of("abcdefghijklmnopqrstuvwxyz_");
  const std::string root = m.substr(0, root_end);
  if (root.empty()) return error;
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(boost::json::string_view(body.data(), body.size()), ec);
  const boost::json::object* o = ec ? nullptr : v.if_object();
  const bool named = (o && o->contains(root)) || root == "prompt" || root == "messages";
  if (named) error.param = m.substr(0, m.find(' '));
  return error;
}

/// Short printable rendering of a JSON value for error messages.
std::string shown(const boost::json::value& v) {
  std::string s = json_fields::serialize(v);
  constexpr std::size_t kMax = 40;
  if (s.size() > kMax) {
    s.resize(kMax);
    s += "...";
  }
  return sanitize_utf8(s);
}

/// The field, or nullptr when absent or null (OpenAI treats null as "use the default").
const boost::json::value* field(const boost::json::object& o, std::string_view key) {
  const boost::json::value* v = o.if_contains(key);
  return (v == nullptr || v->is_null()) ? nullptr : v;
}

namespace {

void write_json(const boost::json::value& v, std::string& out);

void write_array(const boost::json::array& a, std::string& out) {
  out += '[';
  bool first = true;
  for (const boost::json::value& e : a) {
    if (!first) out += ',';
    first = false;
    write_json(e, out);
  }
  out += ']';
}

void write_object(const boost::json::object& o, std::string& out) {
  out += '{';
  bool first = true;
  for (const boost::json::key_value_pair& kv : o) {
    if (!first) out += ',';
    first = false;
    out += boost::json::serialize(kv.key());
    out += ':';
    write_json(kv.value(), out);
  }
  out += '}';
}

void write_json(const boost::json::value& v, std::string& out) {
  switch (v.kind()) {
    case boost::json::kind::null: out += "null"; return;
    case boost::json::kind::bool_: out += v.get_bool() ? "true" : "false"; return;
    case boost::json::kind::int64: out += std::to_string(v.get_int64()); return;
    case boost::json::kind::uint64: out += std::to_string(v.get_uint64()); return;
    case boost::json::kind::double_:
      out += std::isfinite(v.get_double()) ? format_decimal(v.get_double()) : "null";
      return;
    case boost::json::kind::string: out += boost::json::serialize(v.get_string()); return;
    case boost::json::kind::array: write_array(v.get_array(), out); return;
    case boost::json::kind::object: write_object(v.get_object(), out); return;
  }
}

}  // namespace

std::string serialize(const boost::json::value& v) {
  std::string out;
  write_json(v, out);
  return out;
}

std::string serialize(const boost::json::object& o) {
  std::string out;
  write_object(o, out);
  return out;
}

std::string serialize(const boost::json::array& a) {
  std::string out;
  write_array(a, out);
  return out;
}

boost::json::array string_array(const std::vector<std::string>& items) {
  boost::json::array out;
  for (const std::string& x : items) out.push_back(safe(x));
  return out;
}

boost::json::value number(double x) {
  if (std::isfinite(x) && std::trunc(x) == x && std::fabs(x) < 9.0e15) return static_cast<std::int64_t>(x);
  if (!std::isfinite(x)) return nullptr;
  return x;
}

boost::json::value millis(double ms) { return number(std::round(ms * 1000.0) / 1000.0); }

}  // namespace json_fields

namespace {

namespace json = boost::json;
using json_fields::field;
using json_fields::invalid;
using json_fields::millis;
using json_fields::number;
using json_fields::safe;
using json_fields::shown;
using json_fields::usage_json;

constexpr double kMaxTimeoutS = 86400;  // one day: keeps deadlines far from overflow
constexpr std::size_t kMaxStops = 4;
constexpr std::int64_t kMaxChoices = 256;  // the service's --max-n is the real limit
constexpr std::int64_t kMaxLogprobs = kMaxTopLogprobs;

/// An integral JSON number (an integral double such as 5.0 counts) within [lo, hi].
std::optional<std::int64_t> as_integer(const json::value& v, std::int64_t lo, std::int64_t hi) {
  std::int64_t x = 0;
  if (v.is_int64()) {
    x = v.get_int64();
  } else if (v.is_uint64()) {
    if (v.get_uint64() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    x = static_cast<std::int64_t>(v.get_uint64());
  } else if (v.is_double()) {
    const double d = v.get_double();
    // 2^63 is exactly representable; anything at or beyond it is out of int64 range.
    if (!std::isfinite(d) || std::trunc(d) != d || d < -9.2233720368547758e18 || d >= 9.2233720368547758e18) {
      return std::nullopt;
    }
    x = static_cast<std::int64_t>(d);
  } else {
    return std::nullopt;
  }
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

std::optional<double> as_number(const json::value& v) {
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  if (v.is_double() && std::isfinite(v.get_double())) return v.get_double();
  return std::nullopt;
}

Status decode_prompt(const json::object& o, CompletionRequest& out) {
  const json::value* v = field(o, "prompt");
  if (v == nullptr) return invalid("prompt is required");
  if (v->is_string()) {
    // An empty text prompt is allowed (OpenAI's default prompt is
    // <|endoftext|>): the service starts a new document for it.
    out.prompt = std::string(v->get_string());
    return {};
  }
  const char* shape = "prompt must be a string, an array of token ids, or an array holding one string";
  if (!v->is_array()) return invalid(std::string(shape) + " (got " + shown(*v) + ")");
  const json::array& a = v->get_array();
  if (a.empty()) return invalid("prompt must not be empty");
  if (a.size() == 1 && a[0].is_string()) {
    if (a[0].get_string().empty()) return invalid("prompt must not be empty");
    out.prompt = std::string(a[0].get_string());
    return {};
  }
  std::vector<std::int32_t> tokens;
  tokens.reserve(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto id = as_integer(a[i], 0, std::numeric_limits<std::int32_t>::max());
    if (!id) {
      if (!a[i].is_number()) return invalid(std::string(shape) + " (batched prompts are not supported)");
      return invalid("prompt[" + std::to_string(i) + "] must be a token id between 0 and 2147483647 (got " +
                     shown(a[i]) + ")");
    }
    tokens.push_back(static_cast<std::int32_t>(*id));
  }
  out.prompt = std::move(tokens);
  return {};
}

Status decode_stop(const json::object& o, CompletionRequest& out) {
  const json::value* v = field(o, "stop");
  if (v == nullptr) return {};
  if (v->is_string()) {
    if (v->get_string().empty()) return invalid("stop must not be an empty string");
    out.stop.emplace_back(v->get_string());
    return {};
  }
  if (!v->is_array()) return invalid("stop must be a string or an array of up to 4 strings (got " + shown(*v) + ")");
  const json::array& a = v->get_array();
  if (a.size() > kMaxStops) {
    return invalid("stop may hold at most 4 strings (got " + std::to_string(a.size()) + ")");
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string() || a[i].get_string().empty()) {
      return invalid("stop[" + std::to_string(i) + "] must be a non-empty string (got " + shown(a[i]) + ")");
    }
    out.stop.emplace_back(a[i].get_string());
  }
  return {};
}

Status decode_sampling(const json::object& o, SamplingParams& s) {
  if (const json::value* v = field(o, "temperature")) {
    auto t = as_number(*v);
    if (!t || *t < 0 || *t > 2) return invalid("temperature must be a number between 0 and 2 (got " + shown(*v) + ")");
    s.temperature = *t;
  }
  if (const json::value* v = field(o, "top_p")) {
    auto p = as_number(*v);
    if (!p || *p <= 0 || *p > 1) return invalid("top_p must be a number in (0, 1] (got " + shown(*v) + ")");
    s.top_p = *p;
  }
  if (const json::value* v = field(o, "top_k")) {
    auto k = as_integer(*v, 0, std::numeric_limits<int>::max());
    if (!k) return invalid("top_k must be an integer >= 0 (got " + shown(*v) + ")");
    s.top_k = static_cast<int>(*k);
  }
  const auto penalty = [&](const char* name, double& out) -> Status {
    const json::value* v = field(o, name);
    if (v == nullptr) return {};
    auto x = as_number(*v);
    if (!x || *x < -2 || *x > 2) {
      return invalid(std::string(name) + " must be a number between -2 and 2 (got " + shown(*v) + ")");
    }
    out = *x;
    return {};
  };
  if (Status st = penalty("presence_penalty", s.presence_penalty); !st) return st;
  if (Status st = penalty("frequency_penalty", s.frequency_penalty); !st) return st;
  if (const json::value* v = field(o, "repetition_penalty")) {
    auto x = as_number(*v);
    if (!x || *x <= 0 || *x > 100)
      return invalid("repetition_penalty must be a number in (0, 100] (got " + shown(*v) + ")");
    s.repetition_penalty = *x;
  }
  if (const json::value* v = field(o, "logit_bias")) {
    if (!v->is_object()) return invalid("logit_bias must be an object of token id -> bias (got " + shown(*v) + ")");
    constexpr std::size_t kMaxBias = 1024;
    if (v->get_object().size() > kMaxBias) return invalid("logit_bias may hold at most 1024 token ids");
    for (const auto& kv : v->get_object()) {
      const std::string key(kv.key());
      std::int64_t id = -1;
      const bool digits = !key.empty() && key.size() <= 10 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) id = std::stoll(key);
      if (!digits || id > std::numeric_limits<std::int32_t>::max()) {
        return invalid("logit_bias keys must be token ids (decimal strings), got \"" + sanitize_utf8(key) + "\"");
      }
      auto bias = as_number(kv.value());
      if (!bias || *bias < -100 || *bias > 100) {
        return invalid("logit_bias[\"" + key + "\"] must be a number between -100 and 100 (got " + shown(kv.value()) +
                       ")");
      }
      s.logit_bias.emplace_back(static_cast<std::int32_t>(id), static_cast<float>(*bias));
    }
  }
  if (const json::value* v = field(o, "seed")) {
    if (v->is_uint64()) {
      s.seed = v->get_uint64();
    } else if (auto seed =
                   as_integer(*v, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max())) {
      s.seed = static_cast<std::uint64_t>(*seed);  // negative seeds wrap: still deterministic
    } else {
      return invalid("seed must be an integer (got " + shown(*v) + ")");
    }
  }
  return {};
}

Status decode_scalars(const json::object& o, bool infer, CompletionRequest& out) {
  if (const json::value* v = field(o, "echo")) {
    if (!v->is_bool()) return invalid("echo must be a boolean (got " + shown(*v) + ")");
    out.echo = v->get_bool();
  }
  if (const json::value* v = field(o, "max_completion_tokens")) {
    // Chat's name for max_tokens (chat_codec.cpp turns it into max_tokens).
    return invalid("max_completion_tokens is a field of chat completions: /v1/completions takes max_tokens (got " +
                   shown(*v) + ")");
  }
  if (const json::value* v = field(o, "max_tokens")) {
    auto n = as_integer(*v, 0, std::numeric_limits<int>::max());
    if (!n || (*n == 0 && !out.echo)) {
      return invalid("max_tokens must be an integer between 1 and 2147483647 (0 only with echo: true) (got " +
                     shown(*v) + ")");
    }
    out.max_tokens = static_cast<int>(*n);
  }
  if (const json::value* v = field(o, "model")) {
    if (!v->is_string()) return invalid("model must be a string (got " + shown(*v) + ")");
    out.model = std::string(v->get_string());
  }
  if (const json::value* v = field(o, "stream"); v != nullptr && !infer) {
    if (!v->is_bool()) return invalid("stream must be a boolean (got " + shown(*v) + ")");
    out.stream = v->get_bool();
  }
  if (const json::value* v = field(o, "ignore_eos")) {
    if (!v->is_bool()) return invalid("ignore_eos must be a boolean (got " + shown(*v) + ")");
    out.ignore_eos = v->get_bool();
  }
  if (const json::value* v = field(o, "timeout")) {
    auto t = as_number(*v);
    if (!t || *t <= 0 || *t > kMaxTimeoutS) {
      return invalid("timeout must be a number of seconds in (0, 86400] (got " + shown(*v) + ")");
    }
    out.timeout_s = *t;
  }
  if (const json::value* v = field(o, "priority")) {
    std::optional<Priority> p;
    if (v->is_string()) p = parse_priority(std::string_view(v->get_string()));
    if (auto n = as_integer(*v, 0, 2)) p = static_cast<Priority>(*n);
    if (!p) return invalid("priority must be \"low\", \"normal\", \"high\" or 0..2 (got " + shown(*v) + ")");
    out.priority = *p;
  }
  if (const json::value* v = field(o, "n")) {
    auto n = as_integer(*v, 1, kMaxChoices);
    if (!n) return invalid("n must be an integer between 1 and 256 (got " + shown(*v) + ")");
    out.n = static_cast<int>(*n);
  }
  if (const json::value* v = field(o, "logprobs")) {
    auto n = as_integer(*v, 0, kMaxLogprobs);
    if (!n) return invalid("logprobs must be an integer between 0 and 20 (got " + shown(*v) + ")");
    out.logprobs = static_cast<int>(*n);
  }
  if (const json::value* v = field(o, "stream_options")) {
    const json::object* so = v->if_object();
    if (!so) return invalid("stream_options must be an object (got " + shown(*v) + ")");
    if (!out.stream) return invalid("stream_options is only allowed with stream: true");
    if (const json::value* u = field(*so, "include_usage")) {
      if (!u->is_bool()) return invalid("stream_options.include_usage must be a boolean (got " + shown(*u) + ")");
      out.include_usage = u->get_bool();
    }
  }
  if (const json::value* v = field(o, "best_of")) {
    // best_of = n generates nothing more; anything else would pick among hidden samples.
    if (as_integer(*v, out.n, out.n) != out.n) {
      return invalid("best_of is not supported (got " + shown(*v) + "): vramgate returns every sampled choice; use n");
    }
  }
  if (infer && (out.n != 1 || out.logprobs || out.echo)) {
    return invalid("n, logprobs and echo are not supported by /infer; use /v1/completions");
  }
  return {};
}

Result<CompletionRequest> decode_request(std::string_view body, bool infer) {
  boost::system::error_code ec;
  json::value root = json::parse(json::string_view(body.data(), body.size()), ec);
  if (ec) return invalid("request body is not valid JSON: " + ec.message());
  if (!root.is_object()) return invalid("request body must be a JSON object");
  const json::object& o = root.get_object();

  CompletionRequest out;
  if (Status st = json_fields::refuse_unimplemented(o); !st) return st.error();
  if (Status st = decode_prompt(o, out); !st) return st.error();
  if (Status st = decode_scalars(o, infer, out); !st) return st.error();
  if (Status st = decode_sampling(o, out.sampling); !st) return st.error();
  if (Status st = decode_stop(o, out); !st) return st.error();
  return out;
}

}  // namespace

Result<CompletionRequest> decode_completion_request(std::string_view body) {
  Result<CompletionRequest> r = decode_request(body, false);
  if (!r) return json_fields::with_param(std::move(r).error(), body);
  return r;
}

Result<CompletionRequest> decode_infer_request(std::string_view body) {
  Result<CompletionRequest> r = decode_request(body, true);
  if (!r) return json_fields::with_param(std::move(r).error(), body);
  return r;
}

std::string encode_error(const Error& error) {
  json::object e;
  e["message"] = safe(error.message);
  e["type"] = error_type(error.code);
  // OpenAI's param and code; what vramgate adds follows.
  e["param"] = error.param.empty() ? json::value(nullptr) : json::value(safe(error.param));
  e["code"] = safe(api_code(error));
  if (error.needed_bytes) e["needed_bytes"] = *error.needed_bytes;
  if (error.budget_bytes) e["budget_bytes"] = *error.budget_bytes;
  if (error.retry_after_s) {
    e["retry_after_s"] = number(*error.retry_after_s);
    e["retry_after_ms"] = retry_after_ms(*error.retry_after_s);
  }
  if (error.retry_position) e["retry_position"] = *error.retry_position;
  if (error.retry_after_s && error.code == ErrorCode::kOverloaded) e["retry_booked"] = !error.retry_token.empty();
  if (!error.retry_token.empty()) e["retry_token"] = safe(error.retry_token);
  json::object o;
  o["error"] = std::move(e);
  return json_fields::serialize(o);
}

std::string encode_completion(const CompletionBody& body) {
  CompletionResponse r{body.id, body.model, body.created, {}, body.usage, false};
  r.choices.push_back(CompletionChoice{0, body.text, body.finish_reason});
  return encode_completion_response(r);
}

std::string encode_completion_chunk(const CompletionChunk& chunk) {
  CompletionResponse r{chunk.id, chunk.model, chunk.created, {}, chunk.usage, false};
  r.choices.push_back(CompletionChoice{0, chunk.text, chunk.finish_reason});
  return encode_completion_response(r);
}

std::string encode_infer_response(const InferBody& body) {
  json::object o;
  o["result"] = safe(body.result);
  o["latency_ms"] = millis(body.latency_ms);
  o["queue_ms"] = millis(body.queue_ms);
  o["finish_reason"] = safe(body.finish_reason);
  o["usage"] = usage_json(body.usage);
  return json_fields::serialize(o);
}

std::string sse_data(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  out += "data: ";
  out += payload;
  out += "\n\n";
  return out;
}

}  // namespace vg
