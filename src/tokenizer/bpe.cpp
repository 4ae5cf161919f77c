// Bpe: merges the lowest-ranked adjacent pair first (leftmost on ties), with a
// heap over a linked list of symbols, as Hugging Face tokenizers' Word does,
// so long words (SentencePiece-style BPE sees whole sentences) stay
// O(n log n). Any thread (const).
#include "tokenizer/bpe.hpp"

#include <cstdio>
#include <queue>

namespace vg::tok {
namespace {

std::size_t utf8_char_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;  // a stray continuation or invalid byte: a character of its own
}

}  // namespace

Result<Bpe> Bpe::create(Options options) {
  Bpe bpe;
  bpe.vocab_ = std::move(options.vocab);
  bpe.ignore_merges_ = options.ignore_merges;
  bpe.fuse_unk_ = options.fuse_unk;
  if (!options.unk_token.empty()) {
    auto it = bpe.vocab_.find(options.unk_token);
    if (it == bpe.vocab_.end()) {
      return Error(ErrorCode::kModelLoad, "unk_token '" + options.unk_token + "' is not in the vocabulary");
    }
    bpe.unk_id_ = it->second;
  }
  if (options.byte_fallback) {
    bpe.byte_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = bpe.vocab_.find(name);
      if (it != bpe.vocab_.end()) bpe.byte_ids_[static_cast<std::size_t>(b)] = it->second;
    }
  }
  bpe.merges_.reserve(options.merges.size());
  for (std::size_t rank = 0; rank < options.merges.size(); ++rank) {
    const auto& [left, right] = options.merges[rank];
    auto l = bpe.vocab_.find(left);
    auto r = bpe.vocab_.find(right);
    auto m = bpe.vocab_.find(left + right);
    if (l == bpe.vocab_.end() || r == bpe.vocab_.end() || m == bpe.vocab_.end()) {
      return Error(ErrorCode::kModelLoad, "merge " + std::to_string(rank) + " ('" + left + "' '" + right +
                                              "') uses a token that is not in the vocabulary");
    }
    // The first (highest-priority) rule for a pair wins, as in HF tokenizers.
    bpe.merges_.try_emplace(pair_key(l->second, r->second), Merge{static_cast<std::int32_t>(rank), m->second});
  }
  return bpe;
}

void Bpe::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    std::int32_t id;
    int prev;
    int next;
    bool gone;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  bool last_unk = false;
  const auto push = [&](std::int32_t id) {
    const int n = static_cast<int>(syms.size());
    syms.push_back({id, n - 1, n + 1, false});
  };
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t len = std::min(utf8_char_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::string ch(word.substr(i, len));
    i += len;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      push(it->second);
      last_unk = false;
      continue;
    }
    bool bytes_ok = !byte_ids_.empty();
    for (char c : ch) bytes_ok = bytes_ok && byte_ids_[static_cast<unsigned char>(c)] >= 0;
    if (bytes_ok) {
      for (char c : ch) push(byte_ids_[static_cast<unsigned char>(c)]);
      last_unk = false;
    } else if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_unk)) push(unk_id_);
      last_unk = true;
    }
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  struct Candidate {
    std::int32_t rank;
    int pos;
    std::int32_t left_id;
    std::int32_t right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto offer = [&](int pos) {
    if (pos < 0 || syms[static_cast<std::size_t>(pos)].next < 0) return;
    const Symbol& a = syms[static_cast<std::size_t>(pos)];
    const Symbol& b = syms[static_cast<std::size_t>(a.next)];
    auto it = merges_.find(pair_key(a.id, b.id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, a.id, b.id});
  };
  for (int p = 0; p + 1 < static_cast<int>(syms.size()); ++p) offer(p);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& a = syms[static_cast<std::size_t>(c.pos)];
    // Stale: the left symbol was merged away or changed, or its right neighbour did.
    if (a.gone || a.id != c.left_id || a.next < 0) continue;
    Symbol& b = syms[static_cast<std::size_t>(a.next)];
    if (b.id != c.right_id) continue;
    a.id = merges_.at(pair_key(c.left_id, c.right_id)).merged_id;
    b.gone = true;
    a.next = b.next;
    if (b.next >= 0) syms[static_cast<std::size_t>(b.next)].prev = c.pos;
    offer(a.prev);
    offer(c.pos);
  }
  for (int p = 0; p >= 0; p = syms[static_cast<std::size_t>(p)].next) out.push_back(syms[static_cast<std::size_t>(p)].id);
}

}  // namespace vg::tok
