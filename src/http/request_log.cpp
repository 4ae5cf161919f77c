// The request log line (see request_log.hpp).
#include "http/request_log.hpp"

#include <cmath>
#include <string_view>

#include <boost/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "common/utf8.hpp"

namespace vg::httpd {
namespace {

// Built by hand so that milliseconds read "1.234" (Boost.JSON writes doubles
// as "1.234E0"); strings still go through Boost.JSON's escaping.
class LineWriter {
 public:
  void field(std::string_view key, std::string_view text) {
    open(key);
    out_ += boost::json::serialize(boost::json::string(sanitize_utf8(text)));
  }
  void field(std::string_view key, std::int64_t n) {
    open(key);
    out_ += std::to_string(n);
  }
  void field(std::string_view key, bool b) {
    open(key);
    out_ += b ? "true" : "false";
  }
  void millis(std::string_view key, double ms) {
    open(key);
    out_ += fmt::format("{:.3f}", std::isfinite(ms) ? ms : 0.0);
  }
  void raw(std::string_view key, const std::string& json) {
    open(key);
    out_ += json;
  }
  std::string finish() { return out_ + "}"; }

 private:
  void open(std::string_view key) {
    out_ += out_.size() == 1 ? "\"" : ",\"";
    out_ += key;
    out_ += "\":";
  }
  std::string out_ = "{";
};

}  // namespace

std::string encode_request_log(const RequestLogLine& l) {
  LineWriter w;
  w.field("id", l.id);
  w.field("model", l.model);
  w.field("route", l.route);
  w.field("stream", l.stream);
  w.field("status", std::int64_t{l.status});
  w.field("prompt_tokens", std::int64_t{l.prompt_tokens});
  w.field("completion_tokens", std::int64_t{l.completion_tokens});
  w.field("reserved_bytes", l.reserved_bytes);
  w.millis("queue_ms", l.queue_ms);
  w.millis("prefill_ms", l.prefill_ms);
  w.millis("decode_ms", l.decode_ms);
  w.millis("duration_ms", l.duration_ms);
  w.field("outcome", l.outcome);
  w.field("reason", l.reason);
  if (!l.key_id.empty()) w.field("key_id", l.key_id);
  if (!l.priority.empty()) w.field("priority", l.priority);
  if (!l.idempotency.empty()) w.field("idempotency", l.idempotency);
  if (!l.retry.empty()) w.field("retry", l.retry);
  if (l.compute_ms) w.millis("compute_ms", *l.compute_ms);
  if (l.batch_requests) w.field("batch_requests", std::int64_t{*l.batch_requests});
  if (l.prompt) {
    if (const auto* text = std::get_if<std::string>(&*l.prompt)) {
      w.field("prompt", *text);
    } else {
      boost::json::array ids;
      for (std::int32_t t : std::get<std::vector<std::int32_t>>(*l.prompt)) ids.push_back(t);
      w.raw("prompt", boost::json::serialize(ids));
    }
  }
  if (l.output) w.field("output", *l.output);
  return w.finish();
}

void log_request(const RequestLogLine& line) {
  if (!spdlog::should_log(spdlog::level::info)) return;
  spdlog::info("request {}", encode_request_log(line));
}

void log_request_end(RequestLogLine& line, TimePoint start, std::string outcome, std::string reason, int status) {
  line.outcome = std::move(outcome);
  line.reason = std::move(reason);
  line.status = status;
  line.duration_ms = ms_between(start, Clock::now());
  log_request(line);
}

}  // namespace vg::httpd
