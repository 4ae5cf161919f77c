// A deterministic Model for engine tests: the next token after position p is
// script[p % script.size()] (so a greedy sequence spells the script), with
// hooks to block inside a step, fail a step with an error, and count steps.
#pragma once

#include <algorithm>
#include <limits>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"
#include "fake_kv_pool.hpp"

namespace vg::testing {

class FakeModel final : public Model {
 public:
  explicit FakeModel(std::string script = "hello world. ") : script_(std::move(script)) {
    config_.family = "fake";
    config_.n_layer = 1;
    config_.n_head = 1;
    config_.n_kv_head = 1;
    config_.n_embd = 8;
    config_.n_positions = 128;
    config_.vocab_size = 257;
    config_.eos_token_id = 256;
  }

  const ModelConfig& config() const override { return config_; }
  std::int64_t parameter_count() const override { return 1; }
  const Tokenizer& tokenizer() const override { return tokenizer_; }

  Result<std::unique_ptr<KvCache>> new_cache(int capacity_tokens) override {
    if (pool_) return pool_->open(capacity_tokens, {});
    if (take_cache_failure()) return Error(ErrorCode::kOutOfMemory, "fake KV cache allocation out of memory");
    return std::unique_ptr<KvCache>(std::make_unique<FakeCache>(capacity_tokens));
  }
  Result<std::unique_ptr<KvCache>> new_cache_for_prompt(int capacity_tokens,
                                                        std::span<const std::int32_t> prompt) override {
    if (pool_) return pool_->open(capacity_tokens, prompt);
    return new_cache(capacity_tokens);
  }
  // The block pool (fake_kv_pool.hpp): engine thread only, like the caches.
  Status use_kv_pool(const KvPoolOptions& options) override {
    pool_ = std::make_unique<FakePool>(options);
    return Status::Ok();
  }
  Status resize_kv_pool(std::int64_t blocks) override {
    if (!pool_) return Model::resize_kv_pool(blocks);
    std::lock_guard lk(mu_);
    ++pool_resizes_;
    return pool_->resize(blocks);
  }
  std::optional<KvBlockCounts> kv_pool_counts() const override {
    if (!pool_) return std::nullopt;
    return pool_->counts();
  }
  std::int64_t kv_blocks_evicted() const override { return pool_ ? pool_->evicted() : 0; }
  std::int64_t kv_block_bytes() const override { return pool_ ? pool_->block_bytes() : 0; }
  Status grow_cache(KvCache& cache, int capacity_tokens) override {
    if (!pool_) return Model::grow_cache(cache, capacity_tokens);
    return pool_->grow(static_cast<FakeCache&>(cache), capacity_tokens);
  }
  int pool_resizes() {
    std::lock_guard lk(mu_);
    return pool_resizes_;
  }
  FakePool* pool() { return pool_.get(); }
  /// Steps asked for while the pool had lost its storage (refused).
  int steps_on_lost_pool() {
    std::lock_guard lk(mu_);
    return steps_on_lost_pool_;
  }

  Result<std::vector<std::vector<float>>> step(std::span<const StepInput> inputs) override {
    std::optional<Error> fail;
    if (pool_ && pool_->lost()) {
      std::lock_guard lk(mu_);
      ++steps_on_lost_pool_;
      return Error(ErrorCode::kOutOfMemory, "the fake KV block pool has no storage");
    }
    {
      std::unique_lock lk(mu_);
      ++steps_;
      step_tokens_ += static_cast<int>(inputs.size());
      max_inputs_ = std::max(max_inputs_, static_cast<int>(inputs.size()));
      int tokens = 0;
      for (const StepInput& in : inputs) tokens += static_cast<int>(in.tokens.size());
      max_tokens_ = std::max(max_tokens_, tokens);
      const bool prefill = std::any_of(inputs.begin(), inputs.end(),
                                       [](const StepInput& in) { return in.tokens.size() > 1; });
      std::vector<int> sizes;
      for (const StepInput& in : inputs) sizes.push_back(static_cast<int>(in.tokens.size()));
      steps_log_.push_back(std::move(sizes));
      in_step_ = true;
      (prefill ? in_prefill_ : in_decode_) = true;
      cv_.notify_all();
      cv_.wait(lk, [&] { return !blocked_ && !(prefill ? prefill_blocked_ : decode_blocked_); });
      in_step_ = false;
      (prefill ? in_prefill_ : in_decode_) = false;
      if (fail_at_step_ && steps_ >= *fail_at_step_ && steps_ < *fail_at_step_ + fail_count_) {
        fail = Error(ErrorCode::kOutOfMemory, "injected");
      }
      if (fault_at_step_ && steps_ == *fault_at_step_) {
        // What compat::current_exception_error makes of a CUDA fault.
        fail = Error(ErrorCode::kDeviceFault, "CUDA error: an illegal memory access was encountered");
      }
      for (const StepInput& in : inputs) inputs_log_.push_back(static_cast<int>(in.tokens.size()));
    }
    if (fail) return *fail;
    std::vector<std::vector<float>> out;
    for (const StepInput& in : inputs) {
      auto* c = static_cast<FakeCache*>(in.cache);
      if (c->length_ + static_cast<int>(in.tokens.size()) > c->capacity()) {
        return Error(ErrorCode::kInvalidRequest, "cache overflow");
      }
      const int first = in.all_logits ? 1 : static_cast<int>(in.tokens.size());
      std::vector<float> logits;
      for (int j = first; j <= static_cast<int>(in.tokens.size()); ++j) {
        const int length = c->length_ + j;  // the cache length once this token is in
        std::vector<float> row(257, 0.0f);
        const int next = eos_at_ && length == *eos_at_
                             ? 256
                             : static_cast<unsigned char>(script_[static_cast<std::size_t>(length) % script_.size()]);
        row[static_cast<std::size_t>(next)] = 10.0f;
        row[static_cast<std::size_t>((next + 1) % 256)] = 9.0f;  // a runner-up, for sampling and logprobs
        if (nan_at_ && length == *nan_at_) row[3] = std::numeric_limits<float>::quiet_NaN();
        logits.insert(logits.end(), row.begin(), row.end());
      }
      c->length_ += static_cast<int>(in.tokens.size());
      if (pool_) {
        c->tokens_.insert(c->tokens_.end(), in.tokens.begin(), in.tokens.end());
        pool_->publish(*c);
      }
      out.push_back(std::move(logits));
    }
    return out;
  }

  Status copy_cache(const KvCache& from, KvCache& to) override {
    auto& dst = static_cast<FakeCache&>(to);
    if (from.length() > dst.capacity()) return Error(ErrorCode::kInvalidRequest, "cache too small");
    const auto& src = static_cast<const FakeCache&>(from);
    if (pool_) {
      pool_->share_prefix(src, dst);
      dst.tokens_ = src.tokens_;
      dst.published_key_ = src.published_key_;
      dst.published_blocks_ = src.published_blocks_;
    }
    dst.length_ = from.length();
    std::lock_guard lk(mu_);
    ++cache_copies_;
    return Status::Ok();
  }
  int cache_copies() {
    std::lock_guard lk(mu_);
    return cache_copies_;
  }

  Result<std::vector<float>> forward_full(std::span<const std::int32_t>) override {
    return Error(ErrorCode::kInternal, "not used");
  }

  // ---- hooks (any thread)
  void block() { hold(blocked_, true); }
  void unblock() { hold(blocked_, false); }
  /// Holds only steps with a prefill chunk (an input of more than one token).
  void block_prefill() { hold(prefill_blocked_, true); }
  void unblock_prefill() { hold(prefill_blocked_, false); }
  /// Waits until a step with a prefill chunk is running (held by block_prefill).
  bool wait_in_prefill() { return wait_for(in_prefill_); }
  /// Holds only steps without a prefill chunk (decode steps).
  void block_decode() { hold(decode_blocked_, true); }
  void unblock_decode() { hold(decode_blocked_, false); }
  /// Waits until a decode step is running (held by block_decode).
  bool wait_in_decode() { return wait_for(in_decode_); }
  /// Waits until the engine thread is inside a (blocked) step.
  bool wait_in_step() { return wait_for(in_step_); }
  /// Per step so far: the token count of each of its inputs.
  std::vector<std::vector<int>> steps_log() {
    std::lock_guard lk(mu_);
    return steps_log_;
  }
  /// Steps n .. n+count-1 (1-based, counted from the first step) fail with
  /// out-of-memory, leaving every cache as it was.
  void fail_at_step(int n, int count = 1) {
    std::lock_guard lk(mu_);
    fail_at_step_ = n;
    fail_count_ = count;
  }
  /// The next `count` KV caches opened outside a block pool fail with
  /// out-of-memory.
  void fail_next_caches(int count) {
    std::lock_guard lk(mu_);
    cache_failures_ = count;
  }
  /// Step `n` (1-based) fails with a device fault (kDeviceFault), leaving
  /// every cache as it was.
  void fault_at_step(int n) {
    std::lock_guard lk(mu_);
    fault_at_step_ = n;
  }
  /// Token counts of every step input so far (prefill chunks > 1), in order.
  std::vector<int> inputs_log() {
    std::lock_guard lk(mu_);
    return inputs_log_;
  }
  void eos_at_length(int n) { eos_at_ = n; }
  /// The logits after `n` cache tokens contain a NaN (a poisoned device).
  void nan_at_length(int n) { nan_at_ = n; }
  int steps() {
    std::lock_guard lk(mu_);
    return steps_;
  }
  int max_inputs_per_step() {
    std::lock_guard lk(mu_);
    return max_inputs_;
  }
  int max_tokens_per_step() {
    std::lock_guard lk(mu_);
    return max_tokens_;
  }
  int step_tokens() {
    std::lock_guard lk(mu_);
    return step_tokens_;
  }

 private:
  void hold(bool& flag, bool on) {
    std::lock_guard lk(mu_);
    flag = on;
    cv_.notify_all();
  }
  bool take_cache_failure() {
    std::lock_guard lk(mu_);
    if (cache_failures_ <= 0) return false;
    --cache_failures_;
    return true;
  }
  bool wait_for(const bool& flag) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(10), [&] { return flag; });
  }

  std::string script_;
  ModelConfig config_;
  ByteTokenizer tokenizer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool blocked_ = false;
  bool in_step_ = false;
  bool prefill_blocked_ = false;
  bool decode_blocked_ = false;
  bool in_prefill_ = false;
  bool in_decode_ = false;
  std::vector<std::vector<int>> steps_log_;
  int steps_ = 0;
  int step_tokens_ = 0;
  int max_inputs_ = 0;
  int max_tokens_ = 0;
  std::optional<int> fail_at_step_;
  int cache_failures_ = 0;
  int fail_count_ = 1;
  std::optional<int> fault_at_step_;
  std::vector<int> inputs_log_;
  std::optional<int> eos_at_;
  std::optional<int> nan_at_;
  int cache_copies_ = 0;
  int pool_resizes_ = 0;
  int steps_on_lost_pool_ = 0;
  std::unique_ptr<FakePool> pool_;  // null without use_kv_pool; its caches never outlive the model
};

}  // namespace vg::testing
