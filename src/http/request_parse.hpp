// The checks on an HTTP request's head and the error answered when a request
// cannot be read, as pure functions over Beast types: the parser limits, the
// classification of a failed read (408, 413, 414, 431, 400 or nobody to
// answer), the checks on a parsed head, and parse_request(), which does over a
// byte buffer what a Connection does over its socket (the fuzz target for the
// HTTP parsing path drives it). No I/O, no shared state: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "common/error.hpp"

namespace vg::httpd {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

/// Limits on one request. Exceeding them is answered with a JSON error and
/// the connection is closed.
struct HeadLimits {
  std::uint32_t header_bytes = 16 * 1024;  ///< request line + header fields, bytes -> 431 header_too_large
  std::size_t target_bytes = 8 * 1024;     ///< request target (path + query), bytes -> 414 uri_too_long
  std::uint64_t body_bytes = 1 << 20;      ///< body, bytes -> 413 body_too_large
  double read_timeout_s = 30;              ///< only quoted in the 408 message
};

/// Sets `parser`'s header and body limits from `limits`.
void configure_parser(RequestParser& parser, const HeadLimits& limits);

/// The error to answer after reading a request failed with `ec`, or nullopt
/// when there is nobody to answer (the client closed or reset).
/// beast::error::timeout gives 408 request_timeout. A header-limit failure is
/// 414 uri_too_long when the target is longer than `target_bytes`, else 431
/// header_too_large: `parsed_target` is the parser's target (set once it has
/// read the request line), and when it is empty `buffered` (the unparsed
/// bytes held, which then start with the request line) is measured instead;
/// no line end within them counts as a long target.
std::optional<Error> read_error(boost::beast::error_code ec, std::string_view buffered,
                                std::string_view parsed_target, const HeadLimits& limits);

/// Checks on a parsed head before its body is read: a target longer than
/// `target_bytes` is kUriTooLong. The Content-Type is not checked: bodies are
/// read as JSON whatever it says (curl -d sends form-urlencoded).
Status check_head(const Request& head, const HeadLimits& limits);

/// A path segment with its %XX escapes decoded (RFC 3986 2.1; '+' stays
/// '+'). nullopt for a '%' not followed by two hex digits.
std::optional<std::string> percent_decode(std::string_view segment);

/// One request parsed from the start of `bytes`.
struct ParsedRequest {
  Request request;
  std::size_t consumed = 0;  ///< bytes of `bytes` it used; what follows is the next pipelined request
};

/// Parses the first request in `bytes` with the limits and checks a
/// Connection applies. Errors: as read_error() and check_head(); a request
/// that `bytes` holds only part of is kInvalidRequest ("incomplete").
Result<ParsedRequest> parse_request(std::string_view bytes, const HeadLimits& limits);

}  // namespace vg::httpd
