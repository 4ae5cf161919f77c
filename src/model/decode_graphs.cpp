// DecoderModel's decode graphs (decoder.hpp, decode_graphs.hpp): recorded
// static-shape decode steps, one per (batch bucket, key blocks), over the
// KV block pool's storage. Engine thread.
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "device/device.hpp"
#include "model/decoder.hpp"

namespace vg::detail {
namespace {

/// 1, 2, 4, ... below `most`, then `most`: the sizes a power-of-two bucket
/// capped at `most` takes, largest first.
std::vector<std::int64_t> buckets_up_to(std::int64_t most) {
  std::vector<std::int64_t> out;
  for (std::int64_t p = 1; p < most; p *= 2) out.push_back(p);
  out.push_back(most);
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

void DecoderModel::record_graphs(DecodeGraphs& g) const {
  const std::int64_t largest = batch_bucket(g.options.max_batch);
  const at::Device device = torch_device();
  g.logits = at::empty({largest, config_.vocab_size}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const std::int64_t bucket : buckets_up_to(largest)) {
    for (const std::int64_t blocks : buckets_up_to(blocks_for_tokens(config_.n_positions, pool_->block_tokens()))) {
      const StaticShape shape{bucket, bucket, blocks};
      DecodeGraph graph;
      // Every row a padding row while recording: the recorded run writes
      // back what block 0's first slot holds, and changes no cache.
      graph.inputs = at::zeros({shape.input_size()}, at::TensorOptions().dtype(at::kLong).device(device));
      graph.inputs.narrow(0, shape.at(StaticShape::Part::kPadding), bucket).fill_(1);
      const at::Tensor inputs = graph.inputs;
      const at::Tensor out = g.logits.narrow(0, 0, bucket);
      // Run on the recorder's thread (and replayed, emulated, on the
      // engine's): inference mode is per thread.
      graph.graph = recorder_->record([this, inputs, out, shape] {
        const c10::InferenceMode inference;
        const Plan p = static_views(inputs, shape);
        out.copy_(head(hidden(p)));
      });
      g.graphs.emplace(std::pair{bucket, blocks}, std::move(graph));
    }
  }
}

std::unique_ptr<StepGraphRecorder> DecoderModel::make_recorder(DecodeGraphKind kind) const {
  std::unique_ptr<StepGraphRecorder> inner =
      kind == DecodeGraphKind::kCuda ? make_cuda_graph_recorder(torch_device().index())
                                     : make_emulated_graph_recorder(device_->as_virtual(), kEmulatedGraphCosts);
  return inner ? record_on_one_thread(std::move(inner), device_) : nullptr;
}

Result<DecodeGraphStats> DecoderModel::record_decode_graphs(const DecodeGraphOptions& options) {
  if (!pool_ || uses_host_decode()) {
    return Error{ErrorCode::kInvalidRequest, "decode graphs need the tensor path and a KV block pool"};
  }
  if (options.max_batch < 1) {
    return Error{ErrorCode::kInvalidRequest, "decode graphs: max_batch must be >= 1"};
  }
  const bool cuda = torch_device().is_cuda();
  if (options.kind == DecodeGraphKind::kCuda && !cuda) {
    return Error{ErrorCode::kInvalidRequest, "CUDA graphs need a CUDA device, not " + device_->name()};
  }
  if (recording_failed_) {
    // A failed capture may leave state behind that only eager work is
    // known to be safe with (the default CUDA generator's capture flag,
    // the host allocator's routing): no capture is tried again.
    return Error{ErrorCode::kInternal,
                 "decode graphs on " + device_->name() + ": an earlier recording failed; decode steps run eagerly"};
  }
  // One recorder per model, kept, recording on a thread of its own: on CUDA
  // that thread's side-stream cuBLAS workspace is made once, and counted by
  // the first recording only, whichever thread asks for a recording later.
  if (!recorder_ || recorder_kind_ != options.kind) {
    recorder_ = make_recorder(options.kind);
    recorder_kind_ = options.kind;
  }
  if (!recorder_) return Error{ErrorCode::kInvalidRequest, "this build's libtorch has no CUDA graphs"};
  free_graphs();
  graphs_wanted_ = options;
  auto g = std::make_unique<DecodeGraphs>();
  g->options = options;
  DeviceScope scope(device_);
  c10::InferenceMode inference;
  // Cached blocks released on both sides: what stays is what the graphs hold.
  device_->release_cached_memory();
  const DeviceMemory before = device_->memory();
  try {
    record_graphs(*g);
  } catch (...) {
    g.reset();
    recording_failed_ = true;
    // A capture that could not be undone leaves the allocator counting it
    // as underway: its cache is not touched here.
    if (!recorder_->broken()) device_->release_cached_memory();
    return current_exception_error("recording decode graphs on " + device_->name());
  }
  device_->release_cached_memory();
  const DeviceMemory after = device_->memory();
  graph_stats_.graphs = static_cast<int>(g->graphs.size());
  graph_stats_.bytes = std::max<std::int64_t>(0, after.own - before.own);
  graph_stats_.outside_bytes = std::max<std::int64_t>(0, after.foreign - before.foreign);
  ++graph_stats_.records;
  graphs_ = std::move(g);
  return graph_stats_;
}

void DecoderModel::drop_decode_graphs() {
  graphs_wanted_.reset();
  free_graphs();
}

void DecoderModel::free_graphs() {
  if (!graphs_) return;
  DeviceScope scope(device_);
  graphs_.reset();
  device_->release_cached_memory();
  graph_stats_.graphs = 0;
  graph_stats_.bytes = 0;
}

DecodeGraphStats DecoderModel::decode_graph_stats() const { return graph_stats_; }

void DecoderModel::record_again() {
  if (!graphs_wanted_) return;
  Result<DecodeGraphStats> again = record_decode_graphs(*graphs_wanted_);
  if (!again.ok()) {
    // Never again in this process: a failed capture may have left libtorch's
    // allocator in a state that only eager work is known to be safe with.
    graphs_wanted_.reset();
    log_line(LogLevel::kError, "decode graphs on " + device_->name() + " not recorded again after the KV block pool " +
                                   "moved (" + again.error().message +
                                   "): decode steps run eagerly from now on, for the life of this process");
    return;
  }
  log_line(LogLevel::kInfo, "decode graphs on " + device_->name() + " recorded again after the KV block pool moved: " +
                                std::to_string(again->graphs) + " graphs, " + std::to_string(again->bytes) + " B");
}

}  // namespace vg::detail
