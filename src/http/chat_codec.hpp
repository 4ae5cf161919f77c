// JSON codec of POST /v1/chat/completions (OpenAI chat): decodes the request
// into a CompletionRequest carrying the messages, and encodes chat.completion
// bodies and chat.completion.chunk SSE payloads. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "api/events.hpp"
#include "api/types.hpp"
#include "common/error.hpp"

namespace vg {

/// Decodes a chat request: `messages` (role system/user/assistant; content a
/// string or a list of {"type":"text","text":...} parts), `chat_template` (a
/// format name or a Jinja template; vramgate extension), `max_completion_tokens`
/// as a synonym of `max_tokens`, and every sampling field of /v1/completions
/// with the same rules. Errors: kInvalidRequest naming the field.
Result<CompletionRequest> decode_chat_request(std::string_view body);

/// A finished chat completion (OpenAI `chat.completion`).
struct ChatBody {
  std::string id;  ///< "chatcmpl-..."
  std::string model;
  std::int64_t created = 0;  ///< unix seconds
  std::string content;
  std::string finish_reason;
  Usage usage;
};
std::string encode_chat_completion(const ChatBody& body);

/// One `chat.completion.chunk`: delta {role?, content?}; finish_reason null
/// until the last chunk, which also carries usage.
struct ChatChunk {
  std::string id;
  std::string model;
  std::int64_t created = 0;
  bool role = false;  ///< the first chunk says role "assistant"
  std::optional<std::string> content;
  std::optional<std::string> finish_reason;
  std::optional<Usage> usage;
};
std::string encode_chat_chunk(const ChatChunk& chunk);

/// One choice of a chat completion or chunk.
struct ChatChoice {
  int index = 0;
  bool role = false;  ///< chunk: the delta says role "assistant" (a full message always does)
  std::optional<std::string> content;
  std::optional<std::string> finish_reason;
  /// With logprobs requested: `content` entries; nullopt: "logprobs": null.
  std::optional<std::vector<TokenLogprobs>> logprobs{};
};
/// A `chat.completion` (chunk = false: choices carry `message`) or a
/// `chat.completion.chunk` (choices carry `delta`).
struct ChatResponse {
  std::string id;
  std::string model;
  std::int64_t created = 0;
  bool chunk = false;
  std::vector<ChatChoice> choices{};
  std::optional<Usage> usage{};
  bool usage_null = false;  ///< write "usage": null when usage is absent (stream_options.include_usage)
};
std::string encode_chat_response(const ChatResponse& response);

}  // namespace vg
