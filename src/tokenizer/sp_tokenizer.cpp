// SentencePiece models (tokenizer.model), read without libsentencepiece:
// Debian's libsentencepiece bundles its own protobuf runtime and exports its
// symbols, which clash with the libprotobuf that libtorch loads (the process
// crashes while loading). The model file is a small protobuf (ModelProto)
// that is decoded here; BPE models then run through the same Bpe as
// tokenizer.json, the way Hugging Face converts them (merges ordered by the
// merged piece's score, byte fallback, a "▁" dummy prefix). Control pieces
// written in the text ("<s>", "</s>") are split out first, as LlamaTokenizer
// does. Built once (any thread); immutable afterwards.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tokenizer/bpe.hpp"
#include "tokenizer/tokenizers.hpp"

namespace vg::tok {
namespace {

enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct Piece {
  std::string text;
  float score = 0;
  int type = kNormal;
};

struct ModelProto {
  std::vector<Piece> pieces;
  int model_type = 1;  // UNIGRAM=1, BPE=2, WORD=3, CHAR=4
  bool byte_fallback = false;
  int unk_id = 0, bos_id = 1, eos_id = 2;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  std::string normalizer = "nmt_nfkc";
};

/// A protobuf wire-format reader over one message's bytes.
class Wire {
 public:
  explicit Wire(std::string_view b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }
  bool ok() const { return ok_; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64 && pos_ < b_.size(); shift += 7) {
      const auto c = static_cast<unsigned char>(b_[pos_++]);
      v |= static_cast<std::uint64_t>(c & 0x7F) << shift;
      if (!(c & 0x80)) return v;
    }
    ok_ = false;
    return 0;
  }
  std::string_view bytes() {
    const std::uint64_t n = varint();
    if (!ok_ || n > b_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string_view s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  float fixed32() {
    if (b_.size() - pos_ < 4) {
      ok_ = false;
      return 0;
    }
    float f;
    std::memcpy(&f, b_.data() + pos_, 4);  // little-endian, as protobuf writes it
    pos_ += 4;
    return f;
  }
  /// Skips a field of `wire_type`.
  void skip(int wire_type) {
    switch (wire_type) {
      case 0: varint(); break;
      case 1: pos_ = std::min(b_.size() + 1, pos_ + 8); break;
      case 2: bytes(); break;
      case 5: pos_ = std::min(b_.size() + 1, pos_ + 4); break;
      default: ok_ = false;
    }
    if (pos_ > b_.size()) ok_ = false;
  }

 private:
  std::string_view b_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

bool parse_piece(std::string_view b, Piece& p) {
  Wire w(b);
  while (!w.done() && w.ok()) {
    const std::uint64_t key = w.varint();
    const int field = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
    if (field == 1 && type == 2) p.text = std::string(w.bytes());
    else if (field == 2 && type == 5) p.score = w.fixed32();
    else if (field == 3 && type == 0) p.type = static_cast<int>(w.varint());
    else w.skip(type);
  }
  return w.ok();
}

bool parse_model(std::string_view b, ModelProto& m) {
  Wire w(b);
  while (!w.done() && w.ok()) {
    const std::uint64_t key = w.varint();
    const int field = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
    if (field == 1 && type == 2) {
      Piece p;
      if (!parse_piece(w.bytes(), p)) return false;
      m.pieces.push_back(std::move(p));
    } else if ((field == 2 || field == 3) && type == 2) {
      Wire sub(w.bytes());  // 2: TrainerSpec, 3: NormalizerSpec
      while (!sub.done() && sub.ok()) {
        const std::uint64_t k = sub.varint();
        const int f = static_cast<int>(k >> 3), t = static_cast<int>(k & 7);
        if (field == 2 && t == 0 && (f == 3 || f == 35 || f == 40 || f == 41 || f == 42)) {
          const auto v = static_cast<std::int64_t>(sub.varint());
          if (f == 3) m.model_type = static_cast<int>(v);
          if (f == 35) m.byte_fallback = v != 0;
          if (f == 40) m.unk_id = static_cast<int>(static_cast<std::int32_t>(v));
          if (f == 41) m.bos_id = static_cast<int>(static_cast<std::int32_t>(v));
          if (f == 42) m.eos_id = static_cast<int>(static_cast<std::int32_t>(v));
        } else if (field == 3 && f == 1 && t == 2) {
          m.normalizer = std::string(sub.bytes());
        } else if (field == 3 && t == 0 && (f == 3 || f == 4)) {
          const bool v = sub.varint() != 0;
          (f == 3 ? m.add_dummy_prefix : m.remove_extra_whitespaces) = v;
        } else {
          sub.skip(t);
        }
      }
      if (!sub.ok()) return false;
    } else {
      w.skip(type);
    }
  }
  return w.ok();
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  Bpe bpe;
  AddedTokens controls;  ///< control and user-defined pieces, matched in the text
  std::vector<std::string> bytes_of;
  SpecialIds ids;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> out;
    for (const Segment& seg : controls.split(text)) {
      if (seg.token) {
        out.push_back(*seg.token);
        continue;
      }
      std::string s(seg.text);
      if (remove_extra_whitespaces) {
        std::string t;
        for (char c : s) {
          if (c == ' ' && (t.empty() || t.back() == ' ')) continue;
          t += c;
        }
        while (!t.empty() && t.back() == ' ') t.pop_back();
        s = std::move(t);
      }
      if (s.empty()) continue;
      if (add_dummy_prefix) s.insert(0, " ");
      std::string word;
      for (char c : s) word += c == ' ' ? std::string(kSpaceMark) : std::string(1, c);
      bpe.encode_word(word, out);
    }
    return out;
  }
  std::string token_bytes(std::int32_t id) const override {
    if (id < 0 || id >= static_cast<std::int32_t>(bytes_of.size())) return {};
    return bytes_of[static_cast<std::size_t>(id)];
  }
  std::optional<std::int32_t> eos_id() const override { return ids.eos; }
  std::int32_t vocab_size() const override { return static_cast<std::int32_t>(bytes_of.size()); }
  std::optional<std::int32_t> bos_id() const override { return ids.bos; }
  bool adds_bos() const override { return ids.add_bos && ids.bos.has_value(); }
  bool is_eos(std::int32_t id) const override {
    return std::find(ids.end_ids.begin(), ids.end_ids.end(), id) != ids.end_ids.end();
  }
  std::optional<std::int32_t> special_token_id(std::string_view text) const override {
    if (const AddedToken* t = controls.find(text)) return t->id;
    return std::nullopt;
  }
  std::string decode(std::span<const std::int32_t> token_ids) const override {
    std::string out;
    for (std::int32_t id : token_ids) out += token_bytes(id);
    if (add_dummy_prefix && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::filesystem::path& model_file,
                                                      const SpecialTokens& special) {
  const auto bad = [&](const std::string& what) { return Error(ErrorCode::kModelLoad, model_file.string() + ": " + what); };
  std::ifstream in(model_file, std::ios::binary);
  if (!in) return bad("cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  ModelProto m;
  if (!parse_model(ss.str(), m) || m.pieces.empty()) return bad("not a SentencePiece model (ModelProto)");
  if (m.model_type != 2) {
    return bad("SentencePiece model type " + std::to_string(m.model_type) +
               " is not supported (supported: BPE, as LLaMA-2, TinyLlama and Mistral use)");
  }
  auto t = std::make_unique<SentencePieceTokenizer>();
  t->add_dummy_prefix = m.add_dummy_prefix;
  t->remove_extra_whitespaces = m.remove_extra_whitespaces;
  const auto n = static_cast<std::int32_t>(m.pieces.size());
  Bpe::Options bo;
  t->bytes_of.resize(m.pieces.size());
  std::vector<std::int32_t> mergeable;
  for (std::int32_t id = 0; id < n; ++id) {
    const Piece& p = m.pieces[static_cast<std::size_t>(id)];
    bo.vocab.emplace(p.text, id);
    std::string& bytes = t->bytes_of[static_cast<std::size_t>(id)];
    if (p.type == kControl) {
      t->controls.add({p.text, id, true, false, false});
    } else if (p.type == kByte && p.text.size() == 6) {
      bytes = std::string(1, static_cast<char>(std::stoi(p.text.substr(3, 2), nullptr, 16)));  // "<0xAB>"
    } else if (p.type == kUnknown) {
      bytes = " \xE2\x81\x87 ";  // " ⁇ ", SentencePiece's surface for unknown text
      bo.unk_token = p.text;
    } else {
      bytes = p.text;
      for (std::size_t pos = 0; (pos = bytes.find(kSpaceMark, pos)) != std::string::npos; ++pos) {
        bytes.replace(pos, kSpaceMark.size(), " ");
      }
      if (p.type == kUserDefined) t->controls.add({p.text, id, false, false, false});
      if (p.type == kNormal) mergeable.push_back(id);
    }
  }
  // Merges: every split of a normal piece into two pieces, the highest-scored
  // merged piece first (SentencePiece's BPE merges by the merged piece's score).
  std::stable_sort(mergeable.begin(), mergeable.end(), [&m](std::int32_t a, std::int32_t b) {
    return m.pieces[static_cast<std::size_t>(a)].score > m.pieces[static_cast<std::size_t>(b)].score;
  });
  for (std::int32_t id : mergeable) {
    const std::string& text = m.pieces[static_cast<std::size_t>(id)].text;
    for (std::size_t k = 1; k < text.size(); ++k) {
      if ((static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
      const std::string left = text.substr(0, k), right = text.substr(k);
      if (bo.vocab.count(left) && bo.vocab.count(right)) bo.merges.emplace_back(left, right);
    }
  }
  bo.byte_fallback = m.byte_fallback;
  bo.fuse_unk = true;
  auto bpe = Bpe::create(std::move(bo));
  if (!bpe) return bad(bpe.error().message);
  t->bpe = std::move(*bpe);
  for (const AddedToken& a : special.added) {
    if (a.id >= 0 && a.id < n && !t->controls.find(a.content)) t->controls.add(a);
  }
  const auto lookup = [&t](const std::string& text) -> std::optional<std::int32_t> {
    auto it = t->bpe.vocab().find(text);
    if (it == t->bpe.vocab().end()) return std::nullopt;
    return it->second;
  };
  const auto maybe = [n](int id) -> std::optional<std::int32_t> {
    if (id < 0 || id >= n) return std::nullopt;
    return id;
  };
  // LlamaTokenizer starts text with BOS unless tokenizer_config.json says otherwise.
  t->ids = resolve_special_ids(special, lookup, n, maybe(m.bos_id), maybe(m.eos_id), true);
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace vg::tok
