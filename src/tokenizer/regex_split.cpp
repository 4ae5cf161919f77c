// RegexSplitter over PCRE2 (8-bit, UTF, UCP so that \s \d \w are Unicode
// classes as in Python's regex and Oniguruma), JIT-compiled when available.
// Any thread.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.hpp"

#include <pcre2.h>

namespace vg::tok {

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code) pcre2_code_free(code);
  }
};

Result<RegexSplitter> RegexSplitter::create(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return Error(ErrorCode::kModelLoad, "pre-tokenizer pattern does not compile at offset " + std::to_string(offset) +
                                            ": " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; interpretation works without it
  RegexSplitter s;
  auto c = std::make_shared<Code>();
  c->code = code;
  s.code_ = std::move(c);
  return s;
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text, bool keep_gaps) const {
  std::vector<std::string_view> pieces;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  std::size_t gap_start = 0;
  while (pos <= text.size()) {
    // PCRE2 refuses a subject that is not UTF-8 (rc < 0): callers sanitize first.
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, 0, md.get(), nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const std::size_t start = ov[0];
    const std::size_t end = ov[1];
    if (end == start) {
      // An empty match: step over one character and look again.
      pos = end + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (keep_gaps && start > gap_start) pieces.push_back(text.substr(gap_start, start - gap_start));
    pieces.push_back(text.substr(start, end - start));
    pos = end;
    gap_start = end;
  }
  if (keep_gaps && gap_start < text.size()) pieces.push_back(text.substr(gap_start));
  return pieces;
}

}  // namespace vg::tok
