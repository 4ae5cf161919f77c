// The decode graphs a DecoderModel holds (Model::record_decode_graphs): one
// recorded static-shape decode step per (batch bucket, key blocks), each
// with its own input buffer on the device, all writing their logits into
// one buffer. Owned and used by the model's engine thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "device/step_graph.hpp"
#include "model/model.hpp"

namespace vg::detail {

/// The shape of a static-shape decode step (StaticDecode): `rows` real
/// rows padded to `bucket`, every row reading `blocks` blocks of keys.
struct StaticShape {
  std::int64_t rows = 0;
  std::int64_t bucket = 0;
  std::int64_t blocks = 0;
  /// The parts of a step's input buffer, in order: ids, positions, write
  /// slots and padding flags [bucket] int64 each, then the block table
  /// [bucket, blocks].
  enum class Part { kIds, kPositions, kWrite, kPadding, kTable };
  /// Where `part` starts in the buffer (int64 values).
  std::int64_t at(Part part) const { return static_cast<std::int64_t>(part) * bucket; }
  /// int64 values in the buffer.
  std::int64_t input_size() const { return at(Part::kTable) + bucket * blocks; }
};

/// One recorded step: replaying `graph` reads `inputs` (a step's input
/// buffer, StaticShape::input_size() int64 on the device) and writes the
/// first `bucket` rows of DecodeGraphs::logits.
struct DecodeGraph {
  at::Tensor inputs;
  std::unique_ptr<StepGraph> graph;
};

struct DecodeGraphs {
  DecodeGraphOptions options;
  at::Tensor logits;  ///< [largest bucket, vocab] float32 on the device
  std::map<std::pair<std::int64_t, std::int64_t>, DecodeGraph> graphs;  ///< by (bucket, blocks)

  /// The graph of `shape`, or nullptr.
  DecodeGraph* find(const StaticShape& shape) {
    auto it = graphs.find({shape.bucket, shape.blocks});
    return it == graphs.end() ? nullptr : &it->second;
  }
};

}  // namespace vg::detail
