// Helpers for the model tests (see model_test_util.hpp).
#include "model_test_util.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>

#include "model/model.hpp"

namespace vg::testing {

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("vg_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string f32_bytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string safetensors_header(const std::vector<RawTensor>& tensors) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::size_t offset = 0;
  for (const RawTensor& t : tensors) {
    h += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.data.size()) + "]}";
    offset += t.data.size();
  }
  return h + "}";
}

void write_raw_safetensors(const std::filesystem::path& path, std::uint64_t header_length, const std::string& header,
                           const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header_length >> (8 * i)) & 0xff));
  out << header << data;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void write_safetensors(const std::filesystem::path& path, const std::vector<RawTensor>& tensors) {
  const std::string header = safetensors_header(tensors);
  std::string data;
  for (const RawTensor& t : tensors) data += t.data;
  write_raw_safetensors(path, header.size(), header, data);
}

void write_random_gpt2(const std::filesystem::path& dir, const RandomGpt2& s) {
  std::filesystem::create_directories(dir);
  {
    std::ofstream config(dir / "config.json");
    config << "{\"model_type\":\"" << s.model_type << "\",\"n_layer\":" << s.n_layer << ",\"n_head\":" << s.n_head
           << ",\"n_embd\":" << s.n_embd << ",\"n_positions\":" << s.n_positions << ",\"vocab_size\":" << s.vocab_size
           << ",\"eos_token_id\":" << s.vocab_size - 1 << ",\"layer_norm_epsilon\":1e-5}";
  }
  std::mt19937 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<RawTensor> tensors;
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape, float mean, float scale) {
    for (const std::string& skipped : s.skip) {
      if (skipped == name) return;
    }
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    std::vector<float> values(static_cast<std::size_t>(n));
    for (float& v : values) v = mean + scale * normal(rng);
    tensors.push_back({name, "F32", std::move(shape), f32_bytes(values)});
  };
  const std::int64_t d = s.n_embd;
  const float w = 0.5f / std::sqrt(static_cast<float>(d));
  add("wte.weight", {s.vocab_size, d}, 0, w);
  add("wpe.weight", {s.n_positions, d}, 0, w);
  for (int i = 0; i < s.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {d}, 1, 0.2f);
    add(h + "ln_1.bias", {d}, 0, 0.1f);
    add(h + "attn.c_attn.weight", {d, 3 * d}, 0, w);
    add(h + "attn.c_attn.bias", {3 * d}, 0, 0.1f);
    add(h + "attn.c_proj.weight", {d, d}, 0, w);
    add(h + "attn.c_proj.bias", {d}, 0, 0.1f);
    add(h + "ln_2.weight", {d}, 1, 0.2f);
    add(h + "ln_2.bias", {d}, 0, 0.1f);
    add(h + "mlp.c_fc.weight", {d, 4 * d}, 0, w);
    add(h + "mlp.c_fc.bias", {4 * d}, 0, 0.1f);
    add(h + "mlp.c_proj.weight", {4 * d, d}, 0, w / 2);
    add(h + "mlp.c_proj.bias", {d}, 0, 0.1f);
  }
  add("ln_f.weight", {d}, 1, 0.2f);
  add("ln_f.bias", {d}, 0, 0.1f);
  write_safetensors(dir / "model.safetensors", tensors);
}

int run_python_tool(const std::string& script, const std::string& args) {
  const std::string command =
      "/usr/bin/python3 '" + std::string(VG_SOURCE_DIR) + "/tools/" + script + "' " + args + " 1>&2";
  const int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

std::filesystem::path trained_tinylm() {
  const std::filesystem::path dir = std::filesystem::path(VG_SOURCE_DIR) / "models" / "tinylm";
  const bool trained = std::filesystem::exists(dir / "config.json") && std::filesystem::exists(dir / "model.safetensors");
  return trained ? dir : std::filesystem::path();
}

std::vector<std::vector<float>> read_reference_logits(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::vector<float>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::size_t positions = 0;
    fields >> positions;
    std::vector<float> logits;
    double v = 0;
    while (fields >> v) logits.push_back(static_cast<float>(v));
    out.push_back(std::move(logits));
  }
  return out;
}

std::vector<std::vector<float>> reference_logits(const std::filesystem::path& model_dir,
                                                 const std::vector<std::vector<std::int32_t>>& prompts) {
  TempDir work;
  {
    std::ofstream out(work / "prompts.json");
    out << "[";
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      out << (i ? ",[" : "[");
      for (std::size_t j = 0; j < prompts[i].size(); ++j) out << (j ? "," : "") << prompts[i][j];
      out << "]";
    }
    out << "]";
  }
  const int status = run_python_tool("reference_forward.py", "--model '" + model_dir.string() + "' --prompts @'" +
                                                                 (work / "prompts.json").string() +
                                                                 "' --format text --out '" +
                                                                 (work / "logits.txt").string() + "'");
  if (status != 0) return {};
  return read_reference_logits(work / "logits.txt");
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = a.size() == b.size() ? 0.0f : INFINITY;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

/// forward_full, then prefill of half of each prompt and decode of the rest
/// one token at a time, against the reference logits of every position.
void expect_sequential_match(Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                             const std::vector<std::vector<float>>& reference, float tolerance) {
  const auto v = static_cast<std::size_t>(model.config().vocab_size);
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    const auto& ids = prompts[p];
    ASSERT_EQ(reference[p].size(), ids.size() * v) << "prompt " << p;
    auto full = model.forward_full(ids);
    ASSERT_TRUE(full.ok()) << full.error().message;
    EXPECT_LE(max_abs_diff(*full, reference[p]), tolerance) << "forward_full, prompt " << p;

    auto cache = std::move(model.new_cache(static_cast<int>(ids.size()))).value();
    const std::size_t prefill = std::max<std::size_t>(1, ids.size() / 2);
    for (std::size_t start = 0; start < ids.size();) {
      const std::size_t n = start == 0 ? prefill : 1;
      const StepInput input{cache.get(), std::span(ids).subspan(start, n)};
      auto step = model.step(std::span(&input, 1));
      ASSERT_TRUE(step.ok()) << step.error().message;
      start += n;
      ASSERT_LE(max_abs_diff(step->at(0), std::span(reference[p]).subspan((start - 1) * v, v)), tolerance)
          << "step ending at position " << start - 1 << ", prompt " << p;
    }
    EXPECT_EQ(cache->length(), static_cast<int>(ids.size()));
  }
}

int Schedule::tokens() const {
  int n = 0;
  for (const auto& c : chunks) n += static_cast<int>(c.size());
  return n;
}

std::vector<std::vector<std::vector<float>>> run_batched(Model& model, const std::vector<Schedule>& schedules,
                                                         std::size_t* largest_step) {
  std::vector<std::unique_ptr<KvCache>> caches;
  for (const Schedule& s : schedules) caches.push_back(std::move(model.new_cache(s.tokens())).value());
  std::vector<std::vector<std::vector<float>>> out(schedules.size());
  for (int step = 0;; ++step) {
    std::vector<StepInput> inputs;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < schedules.size(); ++i) {
      const int k = step - schedules[i].join;
      if (k >= 0 && k < static_cast<int>(schedules[i].chunks.size())) {
        inputs.push_back({caches[i].get(), schedules[i].chunks[static_cast<std::size_t>(k)]});
        who.push_back(i);
      }
    }
    if (inputs.empty() && step > 0) break;
    if (largest_step != nullptr) *largest_step = std::max(*largest_step, inputs.size());
    auto r = model.step(inputs);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return out;
    EXPECT_EQ(r->size(), inputs.size());
    for (std::size_t j = 0; j < who.size(); ++j) out[who[j]].push_back(r->at(j));
  }
  for (std::size_t i = 0; i < schedules.size(); ++i) EXPECT_EQ(caches[i]->length(), schedules[i].tokens()) << i;
  return out;
}

std::unique_ptr<Model> load_pooled(const std::filesystem::path& dir, Device* device, bool host_kernel, int block_tokens,
                                   std::int64_t blocks) {
  auto m = Model::load({dir, device, "float32", host_kernel});
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (!m.ok()) return nullptr;
  std::unique_ptr<Model> model = std::move(m).value();
  const Status pooled = model->use_kv_pool({block_tokens, blocks, true});
  EXPECT_TRUE(pooled.ok()) << pooled.error().message;
  return pooled.ok() ? std::move(model) : nullptr;
}

}  // namespace vg::testing
