// load_tokenizer: which file of a model folder wins, and the special-token
// ids from its JSON files. Called at start-up; any thread.
#include "tokenizer/load_tokenizer.hpp"

#include <algorithm>
#include <system_error>

#include <boost/json.hpp>

#include "tokenizer/json_util.hpp"
#include "tokenizer/tokenizers.hpp"

namespace vg {
namespace tok {
namespace {

namespace json = boost::json;

/// key as an id or a list of ids (eos_token_id may be either).
std::vector<std::int32_t> json_ids(const json::object& o, std::string_view key) {
  std::vector<std::int32_t> ids;
  const json::value* v = o.if_contains(key);
  if (!v) return ids;
  const auto add = [&ids](const json::value& x) {
    if (x.is_int64() && x.as_int64() >= 0) ids.push_back(static_cast<std::int32_t>(x.as_int64()));
  };
  if (const json::array* a = v->if_array()) {
    for (const json::value& x : *a) add(x);
  } else {
    add(*v);
  }
  return ids;
}

bool file_exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}

/// Reads what generation_config.json, config.json and tokenizer_config.json
/// say (the files that exist). Errors: kModelLoad for a file that is not JSON.
Result<SpecialTokens> read_special_tokens(const std::filesystem::path& dir) {
  SpecialTokens t;
  for (const char* name : {"generation_config.json", "config.json"}) {
    if (!file_exists(dir / name)) continue;
    Result<json::value> doc = read_json_file(dir / name);
    if (!doc) return std::move(doc).error();
    const json::object* o = doc->if_object();
    if (!o) continue;
    for (std::int32_t id : json_ids(*o, "bos_token_id")) t.bos_ids.push_back(id);
    for (std::int32_t id : json_ids(*o, "eos_token_id")) t.eos_ids.push_back(id);
  }
  if (file_exists(dir / "tokenizer_config.json")) {
    Result<json::value> doc = read_json_file(dir / "tokenizer_config.json");
    if (!doc) return std::move(doc).error();
    if (const json::object* o = doc->if_object()) {
      t.bos_token = json_string(*o, "bos_token");
      t.eos_token = json_string(*o, "eos_token");
      if (const json::value* v = o->if_contains("add_bos_token"); v && v->is_bool()) t.add_bos = v->as_bool();
      if (const json::object* added = json_object(*o, "added_tokens_decoder")) {
        for (const auto& kv : *added) {
          const json::object* a = kv.value().if_object();
          char* end = nullptr;
          const std::string key(kv.key());
          const long id = std::strtol(key.c_str(), &end, 10);
          if (!a || end == key.c_str() || *end != '\0' || id < 0) continue;
          t.added.push_back({json_string(*a, "content"), static_cast<std::int32_t>(id), json_bool(*a, "special", false),
                             json_bool(*a, "lstrip", false), json_bool(*a, "rstrip", false)});
        }
      }
    }
  }
  return t;
}

}  // namespace

SpecialIds resolve_special_ids(const SpecialTokens& t,
                               const std::function<std::optional<std::int32_t>(const std::string&)>& lookup,
                               std::int32_t vocab_size, std::optional<std::int32_t> default_bos,
                               std::optional<std::int32_t> default_eos, bool default_add_bos) {
  const auto valid = [vocab_size](std::int32_t id) { return id >= 0 && id < vocab_size; };
  SpecialIds ids;
  for (std::int32_t id : t.bos_ids) {
    if (valid(id)) {
      ids.bos = id;
      break;
    }
  }
  if (!ids.bos && !t.bos_token.empty()) ids.bos = lookup(t.bos_token);
  if (!ids.bos && default_bos && valid(*default_bos)) ids.bos = default_bos;

  const auto add_end = [&ids](std::int32_t id) {
    if (std::find(ids.end_ids.begin(), ids.end_ids.end(), id) == ids.end_ids.end()) ids.end_ids.push_back(id);
  };
  for (std::int32_t id : t.eos_ids) {
    if (valid(id)) add_end(id);
  }
  if (!t.eos_token.empty()) {
    if (std::optional<std::int32_t> id = lookup(t.eos_token); id && valid(*id)) add_end(*id);
  }
  if (ids.end_ids.empty() && default_eos && valid(*default_eos)) add_end(*default_eos);
  if (!ids.end_ids.empty()) ids.eos = ids.end_ids.front();
  ids.add_bos = t.add_bos.value_or(default_add_bos);
  return ids;
}

}  // namespace tok

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::filesystem::path& dir) {
  const bool has_json = tok::file_exists(dir / "tokenizer.json");
  const bool has_gpt2 = tok::file_exists(dir / "vocab.json") && tok::file_exists(dir / "merges.txt");
  const bool has_spm = tok::file_exists(dir / "tokenizer.model");
  if (!has_json && !has_gpt2 && !has_spm) return std::unique_ptr<Tokenizer>();
  Result<tok::SpecialTokens> special = tok::read_special_tokens(dir);
  if (!special) return std::move(special).error();
  if (has_json) return tok::load_tokenizer_json(dir / "tokenizer.json", *special);
  if (has_gpt2) return tok::load_vocab_merges(dir / "vocab.json", dir / "merges.txt", *special);
  return tok::load_sentencepiece(dir / "tokenizer.model", *special);
}

}  // namespace vg

namespace vg {

Result<std::unique_ptr<Tokenizer>> choose_tokenizer(const std::filesystem::path& dir, const VocabularyFacts& facts) {
  Result<std::unique_ptr<Tokenizer>> files = load_tokenizer(dir);
  if (!files.ok()) return std::move(files).error();
  if (*files) {
    if ((*files)->vocab_size() > facts.vocab_size) {
      return Error(ErrorCode::kModelLoad, dir.string() + ": the tokenizer has " + std::to_string((*files)->vocab_size()) +
                                              " tokens, more than the model's vocab_size " +
                                              std::to_string(facts.vocab_size));
    }
    return std::move(files).value();
  }
  if (facts.family == "gpt2" && facts.vocab_size == ByteTokenizer{}.vocab_size()) {
    return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<IdTokenizer>(facts.vocab_size, facts.eos_token_id));
}

}  // namespace vg
