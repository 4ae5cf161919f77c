// A Redis reply as our own value type (RESP2: nil, integer, status, error,
// bulk string, array), so that no hiredis type leaves src/queue's .cpp
// files. Plain value; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace vg::queue {

class RedisValue {
 public:
  enum class Kind { kNil, kInteger, kStatus, kError, kString, kArray };
  struct Nil {};
  struct StatusText {
    std::string text;  ///< a simple-string reply such as "OK" or "PONG"
  };
  struct ErrorText {
    std::string text;  ///< an error reply such as "WRONGTYPE Operation against a key ..."
  };
  using Array = std::vector<RedisValue>;

  RedisValue() = default;  ///< nil
  static RedisValue nil() { return RedisValue(); }
  static RedisValue integer(std::int64_t v) { return RedisValue(Storage(std::in_place_index<1>, v)); }
  static RedisValue status(std::string text) { return RedisValue(Storage(StatusText{std::move(text)})); }
  static RedisValue error(std::string text) { return RedisValue(Storage(ErrorText{std::move(text)})); }
  static RedisValue string(std::string bytes) { return RedisValue(Storage(std::in_place_index<4>, std::move(bytes))); }
  static RedisValue array(Array elements) { return RedisValue(Storage(std::move(elements))); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_nil() const { return kind() == Kind::kNil; }
  bool is_error() const { return kind() == Kind::kError; }
  /// The integer, or nullopt for any other kind.
  std::optional<std::int64_t> as_integer() const;
  /// The bytes of a bulk string, or nullptr for any other kind.
  const std::string* as_string() const { return std::get_if<4>(&v_); }
  /// The text of a status reply, or nullptr.
  const std::string* as_status() const;
  /// The text of an error reply, or nullptr.
  const std::string* as_error() const;
  /// The elements of an array, or nullptr.
  const Array* as_array() const { return std::get_if<5>(&v_); }

  /// A short readable form for logs and test messages, e.g. `["a", 3, nil]`.
  std::string debug_string() const;

  friend bool operator==(const RedisValue& a, const RedisValue& b);

 private:
  using Storage = std::variant<Nil, std::int64_t, StatusText, ErrorText, std::string, Array>;
  explicit RedisValue(Storage v) : v_(std::move(v)) {}
  Storage v_;
};

}  // namespace vg::queue
