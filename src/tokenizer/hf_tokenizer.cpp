// BPE tokenizers from Hugging Face tokenizer.json and from GPT-2's
// vocab.json + merges.txt: the pipeline added tokens -> normalizers ->
// pre-tokenizers -> BPE, and per-token bytes for decoding. Built once at
// start-up (any thread); immutable afterwards, so any thread may encode.
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "common/utf8.hpp"
#include "tokenizer/bpe.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/json_util.hpp"
#include "tokenizer/regex_split.hpp"
#include "tokenizer/tokenizers.hpp"

namespace vg::tok {
namespace {

namespace json = boost::json;

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) {
    s.replace(pos, from.size(), to);
  }
}

/// One step of normalization or pre-tokenization, applied to every word.
struct Step {
  enum class Kind { kPrepend, kReplace, kSplit, kByteLevel, kMetaspace } kind;
  std::string a;  ///< Prepend: text; Replace: pattern; Metaspace: replacement
  std::string b;  ///< Replace: content
  std::optional<RegexSplitter> regex;  ///< Split, ByteLevel with use_regex
  bool add_prefix_space = false;       ///< ByteLevel
  std::string prepend_scheme = "always";  ///< Metaspace: always, first, never
  bool split = false;                  ///< Metaspace: split words at the replacement
};

class HfTokenizer final : public Tokenizer {
 public:
  Bpe bpe;
  AddedTokens added;
  std::vector<Step> steps;             ///< normalizers, then pre-tokenizers
  std::vector<std::string> bytes_of;   ///< id -> bytes (empty for special tokens)
  std::int32_t size = 0;
  SpecialIds ids;
  bool strip_leading_space = false;    ///< decoders Strip/Metaspace drop the prepended space

  std::vector<std::int32_t> encode(std::string_view text) const override {
    const std::string clean = sanitize_utf8(text);  // PCRE2 matches valid UTF-8 only
    text = clean;
    std::vector<std::int32_t> out;
    for (const Segment& seg : added.split(text)) {
      if (seg.token) {
        out.push_back(*seg.token);
        continue;
      }
      std::vector<std::string> words{std::string(seg.text)};
      for (const Step& step : steps) words = apply(step, std::move(words), seg.offset == 0);
      for (const std::string& w : words) bpe.encode_word(w, out);
    }
    return out;
  }

  std::string token_bytes(std::int32_t id) const override {
    if (id < 0 || id >= static_cast<std::int32_t>(bytes_of.size())) return {};
    return bytes_of[static_cast<std::size_t>(id)];
  }
  std::optional<std::int32_t> eos_id() const override { return ids.eos; }
  std::int32_t vocab_size() const override { return size; }
  std::optional<std::int32_t> bos_id() const override { return ids.bos; }
  bool adds_bos() const override { return ids.add_bos && ids.bos.has_value(); }
  bool is_eos(std::int32_t id) const override {
    return std::find(ids.end_ids.begin(), ids.end_ids.end(), id) != ids.end_ids.end();
  }
  std::optional<std::int32_t> special_token_id(std::string_view text) const override {
    if (const AddedToken* t = added.find(text)) return t->id;
    return std::nullopt;
  }
  std::string decode(std::span<const std::int32_t> token_ids) const override {
    std::string out;
    for (std::int32_t id : token_ids) out += token_bytes(id);
    if (strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

 private:
  static std::vector<std::string> apply(const Step& step, std::vector<std::string> words, bool first_section) {
    std::vector<std::string> out;
    for (std::string& w : words) {
      switch (step.kind) {
        case Step::Kind::kPrepend:
          if (!w.empty()) w.insert(0, step.a);
          out.push_back(std::move(w));
          break;
        case Step::Kind::kReplace:
          replace_all(w, step.a, step.b);
          out.push_back(std::move(w));
          break;
        case Step::Kind::kSplit:
          for (std::string_view p : step.regex->split(w)) out.emplace_back(p);
          break;
        case Step::Kind::kByteLevel: {
          if (step.add_prefix_space && !w.empty() && w[0] != ' ') w.insert(0, " ");
          if (step.regex) {
            for (std::string_view p : step.regex->split(w)) out.push_back(byte_level_encode(p));
          } else {
            out.push_back(byte_level_encode(w));
          }
          break;
        }
        case Step::Kind::kMetaspace: {
          replace_all(w, " ", step.a);
          const bool prepend = step.prepend_scheme == "always" || (step.prepend_scheme == "first" && first_section);
          if (prepend && !w.starts_with(step.a)) w.insert(0, step.a);
          if (!step.split) {
            out.push_back(std::move(w));
            break;
          }
          std::size_t start = 0;
          for (std::size_t pos = w.find(step.a, step.a.size()); pos != std::string::npos;
               pos = w.find(step.a, pos + step.a.size())) {
            if (pos > start) out.push_back(w.substr(start, pos - start));
            start = pos;
          }
          if (start < w.size()) out.push_back(w.substr(start));
          break;
        }
      }
    }
    return out;
  }
};

Error bad(const std::filesystem::path& file, const std::string& what) {
  return Error(ErrorCode::kModelLoad, file.string() + ": " + what);
}

/// Appends the steps of one normalizer object (null: none).
Status add_normalizer(const json::value& v, const std::filesystem::path& file, std::vector<Step>& steps) {
  if (v.is_null()) return {};
  const json::object* o = v.if_object();
  if (!o) return bad(file, "normalizer is not an object");
  const std::string type = json_string(*o, "type");
  if (type == "Sequence") {
    const json::array* list = json_array(*o, "normalizers");
    if (!list) return bad(file, "normalizer Sequence without a normalizers list");
    for (const json::value& n : *list) {
      if (Status st = add_normalizer(n, file, steps); !st) return st;
    }
    return {};
  }
  if (type == "Prepend") {
    steps.push_back({Step::Kind::kPrepend, json_string(*o, "prepend"), {}, {}});
    return {};
  }
  if (type == "Replace") {
    const json::object* pattern = json_object(*o, "pattern");
    if (!pattern || !pattern->contains("String")) return bad(file, "normalizer Replace supports only a String pattern");
    steps.push_back({Step::Kind::kReplace, json_string(*pattern, "String"), json_string(*o, "content"), {}});
    return {};
  }
  // Unicode normalization forms need tables vramgate does not carry; text that
  // is already in that form (the common case) tokenizes the same without it.
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") return {};
  return bad(file, "normalizer '" + type + "' is not supported (supported: Sequence, Prepend, Replace, NFC)");
}

Status add_pre_tokenizer(const json::value& v, const std::filesystem::path& file, std::vector<Step>& steps) {
  if (v.is_null()) return {};
  const json::object* o = v.if_object();
  if (!o) return bad(file, "pre_tokenizer is not an object");
  const std::string type = json_string(*o, "type");
  if (type == "Sequence") {
    const json::array* list = json_array(*o, "pretokenizers");
    if (!list) return bad(file, "pre_tokenizer Sequence without a pretokenizers list");
    for (const json::value& p : *list) {
      if (Status st = add_pre_tokenizer(p, file, steps); !st) return st;
    }
    return {};
  }
  if (type == "ByteLevel") {
    Step s{Step::Kind::kByteLevel, {}, {}, {}};
    s.add_prefix_space = json_bool(*o, "add_prefix_space", false);
    if (json_bool(*o, "use_regex", true)) {
      auto re = RegexSplitter::create(kGpt2Pattern);
      if (!re) return re.error();
      s.regex = std::move(*re);
    }
    steps.push_back(std::move(s));
    return {};
  }
  if (type == "Split") {
    const json::object* pattern = json_object(*o, "pattern");
    const std::string behavior = json_string(*o, "behavior");
    if (!pattern || !pattern->contains("Regex")) return bad(file, "pre_tokenizer Split supports only a Regex pattern");
    if (behavior != "Isolated" || json_bool(*o, "invert", false)) {
      return bad(file, "pre_tokenizer Split supports only behavior Isolated without invert, not '" + behavior + "'");
    }
    auto re = RegexSplitter::create(json_string(*pattern, "Regex"));
    if (!re) return bad(file, re.error().message);
    Step s{Step::Kind::kSplit, {}, {}, std::move(*re)};
    steps.push_back(std::move(s));
    return {};
  }
  if (type == "Metaspace") {
    Step s{Step::Kind::kMetaspace, json_string(*o, "replacement"), {}, {}};
    if (s.a.empty()) s.a = kSpaceMark;
    if (o->contains("prepend_scheme")) {
      s.prepend_scheme = json_string(*o, "prepend_scheme");
    } else {
      s.prepend_scheme = json_bool(*o, "add_prefix_space", true) ? "always" : "never";
    }
    if (s.prepend_scheme != "always" && s.prepend_scheme != "first" && s.prepend_scheme != "never") {
      return bad(file, "Metaspace prepend_scheme '" + s.prepend_scheme + "' is unknown");
    }
    s.split = json_bool(*o, "split", true);
    steps.push_back(std::move(s));
    return {};
  }
  return bad(file, "pre_tokenizer '" + type + "' is not supported (supported: ByteLevel, Split, Metaspace, Sequence)");
}

/// Whether the decoder (or one in its Sequence) has `type`; for Strip also
/// whether it strips a leading space.
bool decoder_has(const json::value& v, std::string_view type) {
  const json::object* o = v.if_object();
  if (!o) return false;
  const std::string t = json_string(*o, "type");
  if (t == "Sequence") {
    if (const json::array* list = json_array(*o, "decoders")) {
      for (const json::value& d : *list) {
        if (decoder_has(d, type)) return true;
      }
    }
    return false;
  }
  if (t != type) return false;
  if (t == "Strip") return json_string(*o, "content") == " " && json_int(*o, "start", 0) > 0;
  if (t == "Metaspace") {
    return json_string(*o, "prepend_scheme") != "never" && json_bool(*o, "add_prefix_space", true);
  }
  return true;
}

/// The special token the post-processor puts before the text
/// (TemplateProcessing whose "single" starts with a SpecialToken), if any.
std::optional<std::string> post_processor_bos(const json::value& v) {
  const json::object* o = v.if_object();
  if (!o) return std::nullopt;
  const std::string t = json_string(*o, "type");
  if (t == "Sequence") {
    if (const json::array* list = json_array(*o, "processors")) {
      for (const json::value& p : *list) {
        if (auto bos = post_processor_bos(p)) return bos;
      }
    }
    return std::nullopt;
  }
  if (t != "TemplateProcessing") return std::nullopt;
  const json::array* single = json_array(*o, "single");
  if (!single || single->empty() || !single->front().is_object()) return std::nullopt;
  const json::object* first = json_object(single->front().as_object(), "SpecialToken");
  if (!first) return std::nullopt;
  return json_string(*first, "id");
}

/// Fills bytes_of from the vocabulary and added tokens.
void build_bytes(HfTokenizer& t, bool byte_level) {
  std::int32_t size = 0;
  for (const auto& [text, id] : t.bpe.vocab()) size = std::max(size, id + 1);
  for (const AddedToken& a : t.added.all()) size = std::max(size, a.id + 1);
  t.size = size;
  t.bytes_of.assign(static_cast<std::size_t>(size), std::string());
  for (const auto& [text, id] : t.bpe.vocab()) {
    std::string bytes;
    if (byte_level) {
      bytes = byte_level_decode(text).value_or(text);
    } else if (text.size() == 6 && text.starts_with("<0x") && text.ends_with(">")) {
      bytes = std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
    } else {
      bytes = text;
      replace_all(bytes, kSpaceMark, " ");
    }
    t.bytes_of[static_cast<std::size_t>(id)] = std::move(bytes);
  }
  for (const AddedToken& a : t.added.all()) {
    t.bytes_of[static_cast<std::size_t>(a.id)] = a.special ? std::string() : a.content;
  }
}

void finish_special(HfTokenizer& t, const SpecialTokens& special, const std::optional<std::string>& post_bos) {
  for (const AddedToken& a : special.added) {
    if (!t.added.find(a.content)) t.added.add(a);
  }
  const auto lookup = [&t](const std::string& text) -> std::optional<std::int32_t> {
    if (const AddedToken* a = t.added.find(text)) return a->id;
    auto it = t.bpe.vocab().find(text);
    if (it != t.bpe.vocab().end()) return it->second;
    return std::nullopt;
  };
  const std::optional<std::int32_t> default_bos = post_bos ? lookup(*post_bos) : std::nullopt;
  t.ids = resolve_special_ids(special, lookup, t.size, default_bos, std::nullopt, default_bos.has_value());
}

Result<std::string> read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return bad(file, "cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::filesystem::path& file,
                                                       const SpecialTokens& special) {
  Result<json::value> doc = read_json_file(file);
  if (!doc) return std::move(doc).error();
  const json::object* root = doc->if_object();
  if (!root) return bad(file, "not a JSON object");
  const json::object* model = json_object(*root, "model");
  if (!model) return bad(file, "no model object");
  const std::string type = json_string(*model, "type");
  if (type != "BPE" && !(type.empty() && model->contains("merges"))) {
    return bad(file, "model type '" + type + "' is not supported (supported: BPE)");
  }
  if (!json_string(*model, "continuing_subword_prefix").empty() || !json_string(*model, "end_of_word_suffix").empty()) {
    return bad(file, "BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
  }
  Bpe::Options bo;
  const json::object* vocab = json_object(*model, "vocab");
  const json::array* merges = json_array(*model, "merges");
  if (!vocab || !merges) return bad(file, "model.vocab or model.merges is missing");
  bo.vocab.reserve(vocab->size());
  for (const auto& kv : *vocab) {
    if (!kv.value().is_int64()) return bad(file, "model.vocab['" + std::string(kv.key()) + "'] is not an integer");
    bo.vocab.emplace(std::string(kv.key()), static_cast<std::int32_t>(kv.value().as_int64()));
  }
  bo.merges.reserve(merges->size());
  for (const json::value& m : *merges) {
    if (const json::string* s = m.if_string()) {
      const std::string_view sv = *s;
      const std::size_t sp = sv.find(' ', 1);
      if (sp == std::string_view::npos) return bad(file, "merge '" + std::string(sv) + "' is not 'left right'");
      bo.merges.emplace_back(std::string(sv.substr(0, sp)), std::string(sv.substr(sp + 1)));
    } else if (const json::array* a = m.if_array(); a && a->size() == 2 && (*a)[0].is_string() && (*a)[1].is_string()) {
      bo.merges.emplace_back(std::string((*a)[0].as_string()), std::string((*a)[1].as_string()));
    } else {
      return bad(file, "a merge is neither 'left right' nor [left, right]");
    }
  }
  bo.byte_fallback = json_bool(*model, "byte_fallback", false);
  bo.ignore_merges = json_bool(*model, "ignore_merges", false);
  bo.fuse_unk = json_bool(*model, "fuse_unk", false);
  bo.unk_token = json_string(*model, "unk_token");
  auto bpe = Bpe::create(std::move(bo));
  if (!bpe) return bad(file, bpe.error().message);

  auto t = std::make_unique<HfTokenizer>();
  t->bpe = std::move(*bpe);
  if (const json::array* list = json_array(*root, "added_tokens")) {
    for (const json::value& v : *list) {
      const json::object* a = v.if_object();
      if (!a || !a->contains("id")) return bad(file, "an added_tokens entry has no id");
      t->added.add({json_string(*a, "content"), static_cast<std::int32_t>(json_int(*a, "id", 0)),
                    json_bool(*a, "special", false), json_bool(*a, "lstrip", false), json_bool(*a, "rstrip", false)});
    }
  }
  const json::value* normalizer = root->if_contains("normalizer");
  if (normalizer) {
    if (Status st = add_normalizer(*normalizer, file, t->steps); !st) return st.error();
  }
  const json::value* pre = root->if_contains("pre_tokenizer");
  if (pre) {
    if (Status st = add_pre_tokenizer(*pre, file, t->steps); !st) return st.error();
  }
  bool byte_level = false;
  for (const Step& s : t->steps) byte_level = byte_level || s.kind == Step::Kind::kByteLevel;
  const json::value* decoder = root->if_contains("decoder");
  if (decoder) {
    byte_level = byte_level || decoder_has(*decoder, "ByteLevel");
    t->strip_leading_space = decoder_has(*decoder, "Strip") || decoder_has(*decoder, "Metaspace");
  }
  build_bytes(*t, byte_level);
  const json::value* post = root->if_contains("post_processor");
  finish_special(*t, special, post ? post_processor_bos(*post) : std::nullopt);
  build_bytes(*t, byte_level);  // again: tokenizer_config.json may have added tokens
  return std::unique_ptr<Tokenizer>(std::move(t));
}

Result<std::unique_ptr<Tokenizer>> load_vocab_merges(const std::filesystem::path& vocab_json,
                                                     const std::filesystem::path& merges_txt,
                                                     const SpecialTokens& special) {
  Result<json::value> doc = read_json_file(vocab_json);
  if (!doc) return std::move(doc).error();
  const json::object* vocab = doc->if_object();
  if (!vocab) return bad(vocab_json, "not a JSON object of token -> id");
  Bpe::Options bo;
  for (const auto& kv : *vocab) {
    if (!kv.value().is_int64()) return bad(vocab_json, "'" + std::string(kv.key()) + "' is not an integer id");
    bo.vocab.emplace(std::string(kv.key()), static_cast<std::int32_t>(kv.value().as_int64()));
  }
  Result<std::string> text = read_file(merges_txt);
  if (!text) return std::move(text).error();
  std::istringstream lines(*text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.starts_with("#version"))) continue;
    const std::size_t sp = line.find(' ', 1);
    if (sp == std::string::npos) return bad(merges_txt, "line " + std::to_string(number) + " is not 'left right'");
    bo.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  auto bpe = Bpe::create(std::move(bo));
  if (!bpe) return bad(merges_txt, bpe.error().message);
  auto t = std::make_unique<HfTokenizer>();
  t->bpe = std::move(*bpe);
  auto eot = t->bpe.vocab().find("<|endoftext|>");
  if (eot != t->bpe.vocab().end()) t->added.add({"<|endoftext|>", eot->second, true, false, false});
  Step s{Step::Kind::kByteLevel, {}, {}, {}};
  auto re = RegexSplitter::create(kGpt2Pattern);
  if (!re) return re.error();
  s.regex = std::move(*re);
  t->steps.push_back(std::move(s));
  build_bytes(*t, true);
  finish_special(*t, special, std::nullopt);
  if (!t->ids.eos && eot != t->bpe.vocab().end()) {
    t->ids.eos = eot->second;
    t->ids.end_ids.push_back(eot->second);
  }
  build_bytes(*t, true);
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace vg::tok
