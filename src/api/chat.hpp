// One message of a chat request (tokenizer/chat_template.hpp renders them).
// Plain data; any thread.
#pragma once

#include <string>

namespace vg {

/// One message: role is "system", "user" or "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

}  // namespace vg
