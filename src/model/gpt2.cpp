// GPT-2 family: weights from Hugging Face-named safetensors (names with or
// without a 'transformer.' prefix) and the forward pass: learned position
// embeddings, pre-LayerNorm blocks, causal self-attention over the KV cache
// (decoder.cpp), gelu_new MLP, LM head tied to the token embedding. A
// Gpt2Model and its caches belong to one engine thread.

#include "device/device.hpp"
#include "model/decoder.hpp"
#include "model/families.hpp"

namespace vg {
namespace {

using detail::Plan;

struct Layer {
  at::Tensor ln_1_w, ln_1_b;
  at::Tensor attn_w, attn_b;       // c_attn, Conv1D [n_embd, n_embd + 2 * kv_dim]
  at::Tensor attn_proj_w, attn_proj_b;
  at::Tensor ln_2_w, ln_2_b;
  at::Tensor fc_w, fc_b;           // [n_embd, intermediate_size]
  at::Tensor mlp_proj_w, mlp_proj_b;
};

class Gpt2Model final : public detail::DecoderModel {
 public:
  using DecoderModel::DecoderModel;
  Status load_weights(const Checkpoint& checkpoint);

 private:
  at::Tensor hidden(const Plan& plan) const override;
  at::Tensor head(const at::Tensor& x) const override;
  at::Tensor block(const at::Tensor& x, int layer, const Plan& plan) const;

  at::Tensor wte_, wpe_, ln_f_w_, ln_f_b_;
  std::vector<Layer> layers_;
};

Status Gpt2Model::load_weights(const Checkpoint& checkpoint) {
  const std::string prefix = !checkpoint.contains("wte.weight") && checkpoint.contains("transformer.wte.weight")
                                 ? "transformer."
                                 : "";
  const std::int64_t d = config_.n_embd;
  const std::int64_t kv_dim = static_cast<std::int64_t>(config_.n_kv_head) * config_.head_dim;
  const std::int64_t inner = config_.intermediate_size;
  return read_weights(checkpoint, prefix, [&](detail::WeightLoader& w) {
    wte_ = w.get("wte.weight", {config_.vocab_size, d});
    wpe_ = w.get("wpe.weight", {config_.n_positions, d});
    for (int i = 0; i < config_.n_layer; ++i) {
      const std::string h = "h." + std::to_string(i) + ".";
      Layer l;
      l.ln_1_w = w.get(h + "ln_1.weight", {d});
      l.ln_1_b = w.get(h + "ln_1.bias", {d});
      l.attn_w = w.get(h + "attn.c_attn.weight", {d, d + 2 * kv_dim}, conv1d_transposed());
      l.attn_b = w.get(h + "attn.c_attn.bias", {d + 2 * kv_dim});
      l.attn_proj_w = w.get(h + "attn.c_proj.weight", {d, d}, conv1d_transposed());
      l.attn_proj_b = w.get(h + "attn.c_proj.bias", {d});
      l.ln_2_w = w.get(h + "ln_2.weight", {d});
      l.ln_2_b = w.get(h + "ln_2.bias", {d});
      l.fc_w = w.get(h + "mlp.c_fc.weight", {d, inner}, conv1d_transposed());
      l.fc_b = w.get(h + "mlp.c_fc.bias", {inner});
      l.mlp_proj_w = w.get(h + "mlp.c_proj.weight", {inner, d}, conv1d_transposed());
      l.mlp_proj_b = w.get(h + "mlp.c_proj.bias", {d});
      layers_.push_back(std::move(l));
    }
    ln_f_w_ = w.get("ln_f.weight", {d});
    ln_f_b_ = w.get("ln_f.bias", {d});
  });
}

at::Tensor Gpt2Model::hidden(const Plan& plan) const {
  at::Tensor x = wte_.index_select(0, plan.ids).add_(wpe_.index_select(0, plan.positions));
  for (int l = 0; l < config_.n_layer; ++l) x = block(x, l, plan);
  return x;
}

at::Tensor Gpt2Model::block(const at::Tensor& x, int layer, const Plan& plan) const {
  const Layer& w = layers_[static_cast<std::size_t>(layer)];
  const std::int64_t rows = x.size(0);
  const std::int64_t d = config_.n_embd;
  const std::int64_t head_dim = config_.head_dim;
  const std::int64_t kv_dim = config_.n_kv_head * head_dim;

  at::Tensor h = layer_norm(x, w.ln_1_w, w.ln_1_b);
  const at::Tensor qkv = conv1d(h, w.attn_w, w.attn_b);  // [rows, d + 2 * kv_dim]
  const std::vector<at::Tensor> parts = qkv.split_with_sizes({d, kv_dim, kv_dim}, 1);
  const at::Tensor attn = attention(parts[0].view({rows, config_.n_head, head_dim}),
                                    parts[1].view({rows, config_.n_kv_head, head_dim}),
                                    parts[2].view({rows, config_.n_kv_head, head_dim}), layer, plan);  // [rows, d]
  at::Tensor out = conv1d(attn, w.attn_proj_w, w.attn_proj_b).add_(x);
  h = layer_norm(out, w.ln_2_w, w.ln_2_b);
  h = at::gelu(conv1d(h, w.fc_w, w.fc_b), "tanh");
  out.add_(conv1d(h, w.mlp_proj_w, w.mlp_proj_b));
  return out;
}

at::Tensor Gpt2Model::head(const at::Tensor& x) const {
  const at::Tensor h = layer_norm(x, ln_f_w_, ln_f_b_);
  return linear(h, wte_, {}).to(at::kFloat);
}

}  // namespace

Result<std::unique_ptr<Model>> load_gpt2(const ModelConfig& config, const Checkpoint& checkpoint, Device* device,
                                         std::unique_ptr<Tokenizer> tokenizer) {
  return detail::load_decoder<Gpt2Model>(config, checkpoint, device, std::move(tokenizer));
}

}  // namespace vg
