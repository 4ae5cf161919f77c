// Wire codecs of what an engine answers about a request: a submit's
// answer, errors, and the request's events with their usage, timings and
// exact logprobs (see codec.hpp).
#include "wire/codec.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "wire/json_fields.hpp"

namespace vg::wire {
using namespace fields;

json::object encode(const Accepted& a) {
  return json::object{
      {"model", a.model},           {"prompt_tokens", a.prompt_tokens}, {"queue_position", a.queue_position},
      {"cost_bytes", a.cost_bytes}, {"echo_text", a.echo_text},         {"retry_claimed_by", a.retry_claimed_by}};
}

Result<Accepted> decode_accepted(const json::value& v) {
  return guarded<Accepted>([&] {
    const json::object& o = as_object(v, "\"submission\"");
    Accepted a;
    a.model = str(o, "model");
    a.prompt_tokens = static_cast<int>(integer(o, "prompt_tokens", 0, kMaxInt32, 0));
    a.queue_position = static_cast<int>(integer(o, "queue_position", 0, kMaxInt32, 0));
    a.cost_bytes = integer(o, "cost_bytes", 0, kMaxInt64, 0);
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
  if (!e.param.empty()) o["param"] = e.param;
  if (!e.api_code.empty()) o["api_code"] = e.api_code;
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
    if (get(o, "needed_bytes")) e.needed_bytes = integer(o, "needed_bytes", 0, kMaxInt64, 0);
    if (get(o, "budget_bytes")) e.budget_bytes = integer(o, "budget_bytes", 0, kMaxInt64, 0);
    if (get(o, "retry_position")) e.retry_position = integer(o, "retry_position", 0, kMaxInt32, 0);
    e.retry_token = str(o, "retry_token");
    e.param = str(o, "param");
    e.api_code = str(o, "api_code");
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
  return Usage{static_cast<int>(integer(u, "prompt", 0, kMaxInt32, 0)),
               static_cast<int>(integer(u, "completion", 0, kMaxInt32, 0))};
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
          json::object o{{"k", "text"},
                         {"text", e.text},
                         {"tokens", e.tokens},
                         {"choice", e.choice},
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
    constexpr std::int64_t kMaxInt = kMaxInt32;
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

}  // namespace vg::wire
