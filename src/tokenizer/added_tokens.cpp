// AddedTokens: a linear scan for the token texts (vocabularies have at most a
// few hundred added tokens; prompts are short). Any thread (const).
#include "tokenizer/added_tokens.hpp"

namespace vg::tok {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

void AddedTokens::add(AddedToken token) {
  if (token.content.empty()) return;
  first_byte_[static_cast<unsigned char>(token.content[0])] = true;
  auto it = by_content_.find(token.content);
  if (it != by_content_.end()) {
    tokens_[it->second] = std::move(token);  // a later definition wins
    by_id_[tokens_[it->second].id] = it->second;
    return;
  }
  by_content_[token.content] = tokens_.size();
  by_id_[token.id] = tokens_.size();
  tokens_.push_back(std::move(token));
}

const AddedToken* AddedTokens::find(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedTokens::find(std::int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::vector<Segment> AddedTokens::split(std::string_view text) const {
  std::vector<Segment> out;
  std::size_t text_start = 0;  // start of the pending plain text
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const AddedToken* best = nullptr;
    for (const AddedToken& t : tokens_) {
      if (t.content.size() <= text.size() - pos && text.compare(pos, t.content.size(), t.content) == 0 &&
          (!best || t.content.size() > best->content.size())) {
        best = &t;
      }
    }
    if (!best) {
      ++pos;
      continue;
    }
    std::size_t text_end = pos;
    if (best->lstrip) {
      while (text_end > text_start && is_space(text[text_end - 1])) --text_end;
    }
    if (text_end > text_start) out.push_back({text.substr(text_start, text_end - text_start), text_start, std::nullopt});
    out.push_back({text.substr(pos, best->content.size()), pos, best->id});
    pos += best->content.size();
    if (best->rstrip) {
      while (pos < text.size() && is_space(text[pos])) ++pos;
    }
    text_start = pos;
  }
  if (text_start < text.size()) out.push_back({text.substr(text_start), text_start, std::nullopt});
  return out;
}

}  // namespace vg::tok
