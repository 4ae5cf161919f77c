// LLaMA family: weights under Hugging Face LlamaForCausalLM names and the
// forward pass: RMSNorm (computed in float32 at least, as Hugging Face does),
// rotary position embeddings (rotate-half form, base rope_theta),
// grouped-query attention over the KV cache (decoder.cpp), SwiGLU MLP, and an
// LM head that is lm_head.weight or, with tie_word_embeddings, the token
// embedding. Q, K and V (and gate and up) are fused into one matrix each at
// load time, so a layer runs two matrix products before attention and two
// after. A LlamaModel and its caches belong to one engine thread.

#include <cmath>

#include "device/device.hpp"
#include "model/decoder.hpp"
#include "model/families.hpp"

namespace vg {
namespace {

using detail::Plan;

struct LlamaLayer {
  at::Tensor input_norm;      // [hidden]
  at::Tensor qkv;             // [(n_head + 2 * n_kv_head) * head_dim, hidden]: q_proj, k_proj, v_proj
  at::Tensor o_proj;          // [hidden, n_head * head_dim]
  at::Tensor post_norm;       // [hidden]
  at::Tensor gate_up;         // [2 * intermediate, hidden]: gate_proj, up_proj
  at::Tensor down;            // [hidden, intermediate]
};

class LlamaModel final : public detail::DecoderModel {
 public:
  using DecoderModel::DecoderModel;
  Status load_weights(const Checkpoint& checkpoint);

 private:
  at::Tensor hidden(const Plan& plan) const override;
  at::Tensor head(const at::Tensor& x) const override;
  at::Tensor block(const at::Tensor& x, int layer, const Plan& plan, const at::Tensor& cos,
                   const at::Tensor& sin) const;
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const;

  at::Tensor embed_, norm_, lm_head_;  // lm_head_ is embed_ when tied
  at::Tensor inv_freq_;                // [head_dim / 2] float64 on the device
  std::vector<LlamaLayer> layers_;
};

Status LlamaModel::load_weights(const Checkpoint& checkpoint) {
  const std::int64_t d = config_.n_embd;
  const std::int64_t hd = config_.head_dim;
  const std::int64_t q_dim = config_.n_head * hd;
  const std::int64_t kv_dim = config_.n_kv_head * hd;
  const std::int64_t inner = config_.intermediate_size;
  return read_weights(checkpoint, "", [&](detail::WeightLoader& w) {
    embed_ = w.get("model.embed_tokens.weight", {config_.vocab_size, d});
    for (int i = 0; i < config_.n_layer; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LlamaLayer l;
      l.input_norm = w.get(p + "input_layernorm.weight", {d});
      const at::Tensor q = w.get(p + "self_attn.q_proj.weight", {q_dim, d});
      const at::Tensor k = w.get(p + "self_attn.k_proj.weight", {kv_dim, d});
      const at::Tensor v = w.get(p + "self_attn.v_proj.weight", {kv_dim, d});
      l.o_proj = w.get(p + "self_attn.o_proj.weight", {d, q_dim});
      l.post_norm = w.get(p + "post_attention_layernorm.weight", {d});
      const at::Tensor gate = w.get(p + "mlp.gate_proj.weight", {inner, d});
      const at::Tensor up = w.get(p + "mlp.up_proj.weight", {inner, d});
      l.down = w.get(p + "mlp.down_proj.weight", {d, inner});
      if (!w.status().ok()) break;
      l.qkv = at::cat({q, k, v}, 0);
      l.gate_up = at::cat({gate, up}, 0);
      layers_.push_back(std::move(l));
    }
    norm_ = w.get("model.norm.weight", {d});
    // Tied checkpoints usually omit lm_head.weight; when one is stored anyway
    // it equals the embedding, which is used.
    lm_head_ = config_.tie_word_embeddings ? embed_ : w.get("lm_head.weight", {config_.vocab_size, d});
    // inv_freq[i] = theta^(-2i / head_dim), i < head_dim / 2 (RoFormer; Hugging Face LlamaRotaryEmbedding).
    inv_freq_ = at::pow(config_.rope_theta,
                        at::arange(0, hd, 2, at::TensorOptions().dtype(at::kDouble).device(torch_device())) /
                            static_cast<double>(hd))
                    .reciprocal();
  });
}

at::Tensor LlamaModel::rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
  // x * rsqrt(mean(x^2) + eps) in float32 (float64 in the float64 mode),
  // back to the compute dtype, then scaled.
  const at::ScalarType norm_dtype = dtype_ == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(norm_dtype);
  const at::Tensor scale = xf.pow(2).mean({-1}, /*keepdim=*/true).add_(config_.layer_norm_epsilon).rsqrt_();
  return (xf * scale).to(dtype_).mul_(weight);
}

at::Tensor LlamaModel::hidden(const Plan& plan) const {
  // Rotary tables for the plan's positions: angle[r, i] = position[r] * inv_freq[i],
  // cos and sin [rows, 1, head_dim] (the half-width tables repeated twice).
  const at::Tensor angles = at::outer(plan.positions.to(at::kDouble), inv_freq_);
  const at::Tensor full = at::cat({angles, angles}, -1).unsqueeze(1);
  const at::Tensor cos = full.cos().to(dtype_);
  const at::Tensor sin = full.sin().to(dtype_);
  at::Tensor x = embed_.index_select(0, plan.ids);
  for (int l = 0; l < config_.n_layer; ++l) x = block(x, l, plan, cos, sin);
  return x;
}

/// x * cos + rotate_half(x) * sin, rotate_half([a, b]) = [-b, a] over the
/// last dimension (halves of head_dim).
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor LlamaModel::block(const at::Tensor& x, int layer, const Plan& plan, const at::Tensor& cos,
                             const at::Tensor& sin) const {
  const LlamaLayer& w = layers_[static_cast<std::size_t>(layer)];
  const std::int64_t rows = x.size(0);
  const std::int64_t hd = config_.head_dim;
  const std::int64_t q_dim = config_.n_head * hd;
  const std::int64_t kv_dim = config_.n_kv_head * hd;

  const at::Tensor qkv = linear(rms_norm(x, w.input_norm), w.qkv, {});  // [rows, q_dim + 2 * kv_dim]
  const std::vector<at::Tensor> parts = qkv.split_with_sizes({q_dim, kv_dim, kv_dim}, 1);
  const at::Tensor q = rotate(parts[0].view({rows, config_.n_head, hd}), cos, sin);
  const at::Tensor k = rotate(parts[1].view({rows, config_.n_kv_head, hd}), cos, sin);
  const at::Tensor v = parts[2].view({rows, config_.n_kv_head, hd});
  at::Tensor out = linear(attention(q, k, v, layer, plan), w.o_proj, {}).add_(x);
  const at::Tensor gate_up = linear(rms_norm(out, w.post_norm), w.gate_up, {});  // [rows, 2 * intermediate]
  const std::int64_t inner = config_.intermediate_size;
  const at::Tensor act = at::silu(gate_up.narrow(1, 0, inner)).mul_(gate_up.narrow(1, inner, inner));
  out.add_(linear(act, w.down, {}));
  return out;
}

at::Tensor LlamaModel::head(const at::Tensor& x) const {
  return linear(rms_norm(x, norm_), lm_head_, {}).to(at::kFloat);
}

}  // namespace

Result<std::unique_ptr<Model>> load_llama(const ModelConfig& config, const Checkpoint& checkpoint, Device* device,
                                          std::unique_ptr<Tokenizer> tokenizer) {
  return detail::load_decoder<LlamaModel>(config, checkpoint, device, std::move(tokenizer));
}

}  // namespace vg
