// The request fields vramgate refuses rather than ignore (docs/http-api.md "The
// OpenAI fields"): each with the one value that changes nothing.
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include <boost/json.hpp>

#include "http/json_fields.hpp"

namespace vg::json_fields {

namespace json = boost::json;

/// Fields vramgate does not implement that would change the answer: a
/// request that sets one (to anything but the value that changes nothing)
/// is refused, naming it, rather than answered as if it were absent.
Status refuse_unimplemented(const json::object& o) {
  auto empty_array = [](const json::value& v) { return v.is_array() && v.get_array().empty(); };
  auto is_string = [](const json::value& v, std::initializer_list<std::string_view> ok) {
    return v.is_string() && std::find(ok.begin(), ok.end(), std::string_view(v.get_string())) != ok.end();
  };
  struct Rule {
    std::string_view name;
    std::function<bool(const json::value&)> harmless;
    std::string_view why;
  };
  const Rule rules[] = {
      {"suffix", [](const json::value& v) { return v.is_string() && v.get_string().empty(); }, "insertion"},
      {"tools", empty_array, "tool calling"},
      {"functions", empty_array, "function calling"},
      {"tool_choice", [&](const json::value& v) { return is_string(v, {"none", "auto"}); }, "tool calling"},
      {"function_call", [&](const json::value& v) { return is_string(v, {"none", "auto"}); }, "function calling"},
      {"response_format",
       [](const json::value& v) {
         const json::object* f = v.if_object();
         const json::value* t = f ? f->if_contains("type") : nullptr;
         return t && t->is_string() && t->get_string() == "text";
       },
       "structured output (only {\"type\": \"text\"})"},
      {"modalities",
       [](const json::value& v) {
         return v.is_array() && std::all_of(v.get_array().begin(), v.get_array().end(), [](const json::value& m) {
                  return m.is_string() && m.get_string() == "text";
                });
       },
       "output modalities other than text"},
      {"audio", [](const json::value&) { return false; }, "audio output"},
      {"min_p", [](const json::value& v) { return v.is_number() && v.to_number<double>() == 0; }, "min-p sampling"},
      {"min_tokens", [](const json::value& v) { return v.is_number() && v.to_number<double>() == 0; }, "min_tokens"},
      {"use_beam_search", [](const json::value& v) { return v.is_bool() && !v.get_bool(); }, "beam search"},
      {"length_penalty", [](const json::value& v) { return v.is_number() && v.to_number<double>() == 1; },
       "beam search"},
      {"stop_token_ids", empty_array, "stop token ids"},
      {"prompt_logprobs", [](const json::value&) { return false; }, "prompt_logprobs (use echo with logprobs)"},
      {"guided_json", [](const json::value&) { return false; }, "guided decoding"},
      {"guided_regex", [](const json::value&) { return false; }, "guided decoding"},
      {"guided_choice", [](const json::value&) { return false; }, "guided decoding"},
      {"guided_grammar", [](const json::value&) { return false; }, "guided decoding"},
      {"logits_processors", [](const json::value&) { return false; }, "logits processors"},
  };
  for (const Rule& r : rules) {
    const json::value* v = field(o, r.name);
    if (v == nullptr) continue;
    bool harmless = false;
    try {
      harmless = r.harmless(*v);
    } catch (const std::exception&) {  // to_number of a number that does not convert
      harmless = false;
    }
    if (!harmless) {
      return invalid(std::string(r.name) + " is not supported: vramgate does not implement " + std::string(r.why) +
                     " (got " + shown(*v) + ")");
    }
  }
  return {};
}

}  // namespace vg::json_fields
