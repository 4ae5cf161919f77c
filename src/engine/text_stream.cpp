#include "engine/text_stream.hpp"

#include <algorithm>

#include "common/utf8.hpp"

namespace vg {

TextStream::TextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

std::size_t TextStream::stop_prefix_holdback() const {
  // Longest suffix of pending_ that is a proper prefix of some stop string.
  std::size_t best = 0;
  for (const auto& s : stop_) {
    const std::size_t max_len = std::min(s.size() - 1, pending_.size());
    for (std::size_t len = max_len; len > best; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

std::string TextStream::push(std::string_view bytes) {
  if (stopped_) return {};
  pending_.append(bytes);

  std::size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = sanitize_utf8(std::string_view(pending_).substr(0, first));
    pending_.clear();
    return out;
  }

  std::size_t emit = pending_.size() - stop_prefix_holdback();
  emit = complete_utf8_prefix(std::string_view(pending_).substr(0, emit));
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, emit));
  pending_.erase(0, emit);
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace vg
