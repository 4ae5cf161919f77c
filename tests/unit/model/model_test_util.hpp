// Helpers for the model tests: temporary folders, safetensors files written
// byte by byte (good and bad), random GPT-2 folders, and the Python tools
// (checkpoint generators and the reference forward pass).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace vg {
class Device;
class Model;
}

namespace vg::testing {

/// A fresh folder under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// One tensor to store: `data` holds its raw little-endian bytes.
struct RawTensor {
  std::string name;
  std::string dtype = "F32";
  std::vector<std::int64_t> shape;
  std::string data;
};

/// The bytes of `values` as F32.
std::string f32_bytes(const std::vector<float>& values);

/// The JSON header a well-formed file for `tensors` has (offsets in order).
std::string safetensors_header(const std::vector<RawTensor>& tensors);

/// Writes u64 LE `header_length`, `header`, then `data`, byte for byte.
void write_raw_safetensors(const std::filesystem::path& path, std::uint64_t header_length, const std::string& header,
                           const std::string& data);

/// Writes a well-formed safetensors file.
void write_safetensors(const std::filesystem::path& path, const std::vector<RawTensor>& tensors);

struct RandomGpt2 {
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 32;
  int n_positions = 32;
  int vocab_size = 257;
  std::uint32_t seed = 1;
  std::string model_type = "gpt2";
  std::vector<std::string> skip;  ///< tensor names to leave out
};

/// Writes config.json + model.safetensors (F32, random weights) into `dir`.
void write_random_gpt2(const std::filesystem::path& dir, const RandomGpt2& spec);

/// Runs `/usr/bin/python3 <VG_SOURCE_DIR>/tools/<script> <args>`; returns the
/// exit status (0 on success).
int run_python_tool(const std::string& script, const std::string& args);

/// <VG_SOURCE_DIR>/models/tinylm, or an empty path while it has no trained
/// checkpoint (config.json and model.safetensors).
std::filesystem::path trained_tinylm();

/// Reads reference_forward.py --format text output: per prompt, the logits of
/// every position, row-major [positions * vocab].
std::vector<std::vector<float>> read_reference_logits(const std::filesystem::path& path);

/// Runs reference_forward.py on `model_dir` for `prompts`; per prompt the
/// logits of every position ([positions * vocab]); empty on failure.
std::vector<std::vector<float>> reference_logits(const std::filesystem::path& model_dir,
                                                 const std::vector<std::vector<std::int32_t>>& prompts);

/// Largest |a[i] - b[i]|; infinity when the sizes differ.
float max_abs_diff(std::span<const float> a, std::span<const float> b);

/// GoogleTest checks of `model` against `reference` (reference_logits() of
/// `prompts`) within `tolerance`: forward_full, then prefill of half of each
/// prompt and decode of the rest one token at a time, every position.
void expect_sequential_match(Model& model, const std::vector<std::vector<std::int32_t>>& prompts,
                             const std::vector<std::vector<float>>& reference, float tolerance);

/// One sequence's schedule in a run of steps: the step at which it joins,
/// then the token chunks it feeds, one chunk per step (prefill chunks, then
/// decode tokens).
struct Schedule {
  int join = 0;
  std::vector<std::vector<std::int32_t>> chunks;
  int tokens() const;
};

/// Runs all schedules together, one Model::step per step index; every step
/// holds the next chunk of every sequence that has joined and is not done.
/// Returns, per schedule, the logits of each of its chunks; `largest_step`
/// (if given) gets the most inputs one step held. GoogleTest failures for a
/// step error or a cache whose length ends wrong.
std::vector<std::vector<std::vector<float>>> run_batched(Model& model, const std::vector<Schedule>& schedules,
                                                         std::size_t* largest_step = nullptr);

/// The float32 model of `dir` on `device` (the host kernels or the tensor
/// path) with a KV block pool of `blocks` blocks of `block_tokens` and the
/// prefix cache; nullptr (and a GoogleTest failure) when either fails.
std::unique_ptr<Model> load_pooled(const std::filesystem::path& dir, Device* device, bool host_kernel, int block_tokens,
                                   std::int64_t blocks);

}  // namespace vg::testing
