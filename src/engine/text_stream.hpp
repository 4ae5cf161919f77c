// Turns a sequence's generated token bytes into text that is safe to send:
// whole UTF-8 characters only (a character split across tokens is held back
// until it completes; ill-formed bytes become U+FFFD), and never any part of a
// stop string (text that could be the start of one is held back until it is
// ruled out). Pure; owned by the engine thread that owns the sequence.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vg {

class TextStream {
 public:
  /// `stop`: stop strings (none empty). Generation ends where the first one
  /// starts; neither it nor anything after it is emitted.
  explicit TextStream(std::vector<std::string> stop);

  /// Appends one token's bytes; returns the text that can be sent now
  /// (possibly empty). After a stop string completes, stopped() is true and
  /// further input is ignored.
  std::string push(std::string_view bytes);

  /// End of generation: returns whatever was held back (an incomplete
  /// character becomes U+FFFD; a partial stop string is plain text).
  std::string finish();

  bool stopped() const { return stopped_; }

 private:
  std::size_t stop_prefix_holdback() const;

  std::vector<std::string> stop_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace vg
