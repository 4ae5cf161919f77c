// Request-head limits and read-error classification (see request_parse.hpp).
#include "http/request_parse.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>

#include "common/decimal.hpp"

namespace vg::httpd {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

/// Length of the request line at the start of `head`, or nullopt when no
/// line end is among the bytes held.
std::optional<std::size_t> request_line_length(std::string_view head) {
  const std::size_t end = head.find('\n');
  if (end == std::string_view::npos) return std::nullopt;
  return end;
}

Error uri_too_long(const HeadLimits& limits) {
  return Error(ErrorCode::kUriTooLong,
               "request target exceeds the limit of " + std::to_string(limits.target_bytes) + " bytes");
}

}  // namespace

void configure_parser(RequestParser& parser, const HeadLimits& limits) {
  parser.header_limit(limits.header_bytes);
  parser.body_limit(limits.body_bytes);
}

std::optional<Error> read_error(beast::error_code ec, std::string_view buffered, std::string_view parsed_target,
                                const HeadLimits& limits) {
  if (ec == beast::error::timeout) {
    return Error(ErrorCode::kRequestTimeout,
                 "request not received within " + format_decimal(limits.read_timeout_s) + " s");
  }
  if (ec == bhttp::error::body_limit) {
    return Error(ErrorCode::kBodyTooLarge,
                 "request body exceeds the limit of " + std::to_string(limits.body_bytes) + " bytes");
  }
  if (ec == bhttp::error::header_limit) {
    // Before the request line is parsed its length stands for the target's
    // (it holds the method and version too): longer than the target limit
    // alone, it is answered as a long URI.
    const std::optional<std::size_t> length =
        parsed_target.empty() ? request_line_length(buffered) : std::optional<std::size_t>(parsed_target.size());
    if (!length || *length > limits.target_bytes) return uri_too_long(limits);
    return Error(ErrorCode::kHeaderTooLarge,
                 "request header exceeds the limit of " + std::to_string(limits.header_bytes) + " bytes");
  }
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == net::error::eof ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted ||
      ec == net::error::broken_pipe) {
    return std::nullopt;  // the client went away: nobody to answer
  }
  return Error(ErrorCode::kInvalidRequest, "malformed HTTP request: " + ec.message());
}

Status check_head(const Request& head, const HeadLimits& limits) {
  if (head.target().size() > limits.target_bytes) return uri_too_long(limits);
  return {};
}

Result<ParsedRequest> parse_request(std::string_view bytes, const HeadLimits& limits) {
  RequestParser parser;
  configure_parser(parser, limits);
  std::size_t used = 0;
  bool head_checked = false;
  while (!parser.is_done()) {
    beast::error_code ec;
    const std::size_t n = parser.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == bhttp::error::need_more || (!ec && n == 0 && !parser.is_done() && head_checked)) {
      return Error(ErrorCode::kInvalidRequest, "incomplete HTTP request");
    }
    if (ec) {
      std::optional<Error> error = read_error(ec, bytes.substr(used), parser.get().target(), limits);
      if (!error) return Error(ErrorCode::kInvalidRequest, "incomplete HTTP request");
      return *std::move(error);
    }
    if (parser.is_header_done() && !head_checked) {
      head_checked = true;
      if (Status st = check_head(parser.get(), limits); !st) return st.error();
    }
  }
  return ParsedRequest{parser.release(), used};
}

std::optional<std::string> percent_decode(std::string_view segment) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(segment.size());
  for (std::size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      out += segment[i];
      continue;
    }
    const int hi = i + 2 < segment.size() ? hex(segment[i + 1]) : -1;
    const int lo = hi >= 0 ? hex(segment[i + 2]) : -1;
    if (lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

}  // namespace vg::httpd
