// TorchScriptModel (see torchscript_model.hpp): torch::jit::load onto the
// device, the load-time checks, and batched forward passes. libtorch
// exceptions become error codes here.
#include "model/torchscript_model.hpp"

#include <c10/core/InferenceMode.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "device/device.hpp"
#include "model/decoder.hpp"

namespace vg {

struct TorchScriptModel::Impl {
  torch::jit::Module module;
  torch::Device device{torch::kCPU};
  std::filesystem::path dir;
};

namespace {

/// forward()'s result as a list of tensors (a tensor, or a tuple/list of them).
Result<std::vector<at::Tensor>> output_tensors(const c10::IValue& out, const std::string& where) {
  std::vector<at::Tensor> tensors;
  if (out.isTensor()) {
    tensors.push_back(out.toTensor());
  } else if (out.isTuple()) {
    for (const c10::IValue& v : out.toTupleRef().elements()) {
      if (!v.isTensor()) return Error(ErrorCode::kInternal, where + ": forward() returned a tuple holding a non-tensor");
      tensors.push_back(v.toTensor());
    }
  } else if (out.isTensorList()) {
    for (const at::Tensor& t : out.toTensorVector()) tensors.push_back(t);
  } else {
    return Error(ErrorCode::kInternal, where + ": forward() returned " + out.tagKind() + ", not a tensor or a tuple");
  }
  return tensors;
}

/// Checks the outputs of a run at named dimensions `bound` against the spec.
Status check_outputs(const TensorModelSpec& spec, const std::vector<at::Tensor>& outs,
                     std::span<const std::pair<std::string, std::int64_t>> bound, const std::string& where) {
  if (outs.size() != spec.outputs.size()) {
    return Error(ErrorCode::kModelLoad, where + ": forward() returned " + std::to_string(outs.size()) +
                                            " tensors, config.json declares " + std::to_string(spec.outputs.size()) +
                                            " outputs");
  }
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const TensorSpec& s = spec.outputs[i];
    const std::vector<std::int64_t> want = bind_shape(spec, s, bound);
    const std::vector<std::int64_t> got(outs[i].sizes().begin(), outs[i].sizes().end());
    if (got != want) {
      return Error(ErrorCode::kModelLoad, where + ": output '" + s.name + "' has shape " + shape_text(got) +
                                              " where config.json declares " + shape_text(s) + " = " +
                                              shape_text(want));
    }
    if (outs[i].scalar_type() != at::kFloat) {
      return Error(ErrorCode::kModelLoad, where + ": output '" + s.name + "' is " +
                                              std::string(c10::toString(outs[i].scalar_type())) +
                                              ", config.json declares float32");
    }
  }
  return Status::Ok();
}

/// The error of the exception being handled. The TorchScript interpreter
/// rethrows an error raised inside the graph (out of memory, a CUDA fault) as
/// a plain c10::Error carrying the original message; the classification reads
/// the message (device/device_error.hpp), so those keep their kind.
Error forward_error(const std::string& op) { return detail::current_exception_error(op); }

HostTensor to_host(const at::Tensor& t, const std::string& name) {
  HostTensor h;
  h.name = name;
  h.shape.assign(t.sizes().begin(), t.sizes().end());
  at::Tensor c = t.to(at::kCPU).contiguous();
  h.data.resize(static_cast<std::size_t>(c.numel()));
  if (c.numel() > 0) std::memcpy(h.data.data(), c.data_ptr<float>(), h.data.size() * sizeof(float));
  return h;
}

/// The size a request gives dimension `name` (from the first input that uses
/// it), or nullopt.
std::optional<std::int64_t> bound_dim(const TensorModelSpec& spec, const TensorInputs& request, const std::string& name) {
  for (std::size_t i = 0; i < spec.inputs.size() && i < request.size(); ++i) {
    const TensorSpec& s = spec.inputs[i];
    for (std::size_t d = 0; d < s.shape.size() && d < request[i]->shape.size(); ++d) {
      const auto* n = std::get_if<std::string>(&s.shape[d]);
      if (n != nullptr && *n == name) return request[i]->shape[d];
    }
  }
  return std::nullopt;
}

}  // namespace

TorchScriptModel::TorchScriptModel(std::unique_ptr<Impl> impl, TensorModelSpec spec)
    : impl_(std::move(impl)), spec_(std::move(spec)) {}

TorchScriptModel::~TorchScriptModel() = default;

Result<std::unique_ptr<TorchScriptModel>> TorchScriptModel::load(const Options& options) {
  if (options.device == nullptr) return Error(ErrorCode::kModelLoad, "TorchScript model: no device given");
  auto spec = read_tensor_model_spec(options.dir);
  if (!spec.ok()) return std::move(spec).error();
  const std::filesystem::path file = options.dir / "model.pt";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    return Error(ErrorCode::kModelLoad, file.string() + ": missing (a TorchScript folder holds model.pt, "
                                                        "e.g. torch.jit.trace(model, example).save(\"model.pt\"))");
  }
  auto impl = std::make_unique<Impl>();
  impl->dir = options.dir;
  impl->device = torch::Device(options.device->torch_device());
  DeviceScope scope(options.device);
  // The graph executor runs the graph as saved: its profiling passes would
  // recompile per new input shape, and their allocations would make a
  // forward pass's peak depend on which shapes came before (the memory
  // profile must not). Process-wide; only TorchScript models use it.
  torch::jit::setGraphExecutorOptimize(false);
  try {
    impl->module = torch::jit::load(file.string(), impl->device);
    impl->module.eval();
  } catch (...) {
    Error e = detail::current_exception_error(file.string() + ": torch::jit::load");
    if (e.code != ErrorCode::kOutOfMemory) e.code = ErrorCode::kModelLoad;
    return e;
  }
  auto method = impl->module.find_method("forward");
  if (!method) return Error(ErrorCode::kModelLoad, file.string() + ": the module has no forward() method");
  const std::size_t args = method->function().getSchema().arguments().size();  // includes self
  if (args != spec->inputs.size() + 1) {
    return Error(ErrorCode::kModelLoad, file.string() + ": forward() takes " + std::to_string(args - 1) +
                                            " arguments, config.json declares " +
                                            std::to_string(spec->inputs.size()) + " inputs");
  }
  std::unique_ptr<TorchScriptModel> model(new TorchScriptModel(std::move(impl), std::move(spec).value()));

  // One run at the smallest shapes: the declared outputs must match.
  std::vector<std::pair<std::string, std::int64_t>> bound;
  for (const DimRange& d : model->spec_.dims) bound.emplace_back(d.name, d.min);
  try {
    c10::InferenceMode inference;
    std::vector<c10::IValue> in;
    for (const TensorSpec& s : model->spec_.inputs) {
      in.emplace_back(torch::zeros(bind_shape(model->spec_, s, bound),
                                   torch::TensorOptions().dtype(torch::kFloat).device(model->impl_->device)));
    }
    const c10::IValue out = model->impl_->module.forward(std::move(in));
    auto outs = output_tensors(out, file.string());
    if (!outs.ok()) return Error(ErrorCode::kModelLoad, outs.error().message);
    Status st = check_outputs(model->spec_, *outs, bound, file.string() + " (run at the smallest shapes)");
    if (!st.ok()) return st.error();
  } catch (...) {
    Error e = forward_error(file.string() + ": forward() at the smallest shapes");
    if (e.code != ErrorCode::kOutOfMemory) e.code = ErrorCode::kModelLoad;
    return e;
  }
  return model;
}

std::int64_t TorchScriptModel::parameter_bytes() const {
  std::int64_t n = 0;
  for (const at::Tensor& p : impl_->module.parameters()) n += p.numel() * static_cast<std::int64_t>(p.element_size());
  for (const at::Tensor& b : impl_->module.buffers()) n += b.numel() * static_cast<std::int64_t>(b.element_size());
  return n;
}

Result<std::vector<std::vector<HostTensor>>> TorchScriptModel::forward(std::span<const TensorInputs> batch) {
  if (batch.empty()) return std::vector<std::vector<HostTensor>>{};
  if (!spec_.batched && batch.size() > 1) {
    return Error(ErrorCode::kInvalidRequest, "the model has no batch dimension: one request per forward pass");
  }
  const std::size_t n_inputs = spec_.inputs.size();
  std::vector<std::int64_t> rows;  // each request's batch size
  // The forward pass's shape of each input: the requests' rows summed, each
  // paddable dimension at the batch's largest.
  std::vector<std::vector<std::int64_t>> shapes;
  for (std::size_t i = 0; i < n_inputs; ++i) shapes.push_back(batch.front()[i]->shape);
  bool padded = false;
  for (const TensorInputs& r : batch) {
    if (r.size() != n_inputs) return Error(ErrorCode::kInvalidRequest, "a request of the batch lacks inputs");
    rows.push_back(spec_.batched ? r.front()->shape.front() : 1);
    for (std::size_t i = 0; i < n_inputs; ++i) {
      const auto& a = r[i]->shape;
      auto& b = shapes[i];
      bool fits = a.size() == b.size();
      for (std::size_t d = 1; fits && d < a.size(); ++d) {
        if (a[d] == b[d]) continue;
        if (!spec_.paddable(i, d)) fits = false;
        padded = true;
        b[d] = std::max(a[d], b[d]);
      }
      if (!fits) {
        return Error(ErrorCode::kInvalidRequest, "input '" + spec_.inputs[i].name + "': shapes " + shape_text(a) +
                                                     " and " + shape_text(batch.front()[i]->shape) +
                                                     " cannot be batched together");
      }
    }
  }
  try {
    c10::InferenceMode inference;
    std::vector<c10::IValue> in;
    const auto to_device = torch::TensorOptions().dtype(torch::kFloat).device(impl_->device);
    for (std::size_t i = 0; i < n_inputs; ++i) {
      std::vector<std::int64_t> shape = shapes[i];
      if (spec_.batched) {
        shape.front() = 0;
        for (std::int64_t b : rows) shape.front() += b;
      }
      // Padding is zeros; an unpadded batch is overwritten whole.
      at::Tensor t = padded ? torch::zeros(shape, to_device) : torch::empty(shape, to_device);
      std::int64_t offset = 0;
      for (const TensorInputs& r : batch) {
        const HostTensor& h = *r[i];
        at::Tensor src = torch::from_blob(const_cast<float*>(h.data.data()), h.shape, torch::kFloat);
        if (spec_.batched) {
          at::Tensor dst = t.narrow(0, offset, h.shape.front());
          for (std::size_t d = 1; d < h.shape.size(); ++d) dst = dst.narrow(static_cast<std::int64_t>(d), 0, h.shape[d]);
          dst.copy_(src);
          offset += h.shape.front();
        } else {
          t.copy_(src);
        }
      }
      in.emplace_back(std::move(t));
    }
    const c10::IValue out = impl_->module.forward(std::move(in));
    in.clear();
    auto outs = output_tensors(out, "forward");
    if (!outs.ok()) return std::move(outs).error();
    if (outs->size() != spec_.outputs.size()) {
      return Error(ErrorCode::kInternal, "forward() returned " + std::to_string(outs->size()) + " tensors, " +
                                             std::to_string(spec_.outputs.size()) + " outputs declared");
    }
    std::vector<std::vector<HostTensor>> result(batch.size());
    for (std::size_t o = 0; o < outs->size(); ++o) {
      const at::Tensor& t = (*outs)[o];
      const TensorSpec& os = spec_.outputs[o];
      std::int64_t offset = 0;
      for (std::size_t r = 0; r < batch.size(); ++r) {
        if (!spec_.batched) {
          result[r].push_back(to_host(t, os.name));
          continue;
        }
        at::Tensor mine = t.narrow(0, offset, rows[r]);
        offset += rows[r];
        // Crop back: an output dimension named like a padded input dimension
        // takes the request's own size of it.
        for (std::size_t d = 1; padded && d < os.shape.size() && d < static_cast<std::size_t>(mine.dim()); ++d) {
          const auto* name = std::get_if<std::string>(&os.shape[d]);
          if (name == nullptr || !spec_.paddable(*name)) continue;
          if (auto own = bound_dim(spec_, batch[r], *name)) {
            mine = mine.narrow(static_cast<std::int64_t>(d), 0, std::min(*own, mine.size(static_cast<std::int64_t>(d))));
          }
        }
        result[r].push_back(to_host(mine, os.name));
      }
    }
    return result;
  } catch (...) {
    return forward_error("forward of " + impl_->dir.string());
  }
}

Status TorchScriptModel::forward_zeros(std::span<const std::vector<std::int64_t>> shapes) {
  if (shapes.size() != spec_.inputs.size()) return Error(ErrorCode::kInternal, "forward_zeros: wrong input count");
  try {
    c10::InferenceMode inference;
    std::vector<c10::IValue> in;
    for (const auto& shape : shapes) {
      in.emplace_back(torch::zeros(shape, torch::TensorOptions().dtype(torch::kFloat).device(impl_->device)));
    }
    const c10::IValue out = impl_->module.forward(std::move(in));
    (void)out;
    return Status::Ok();
  } catch (...) {
    return forward_error("profile run of " + impl_->dir.string());
  }
}

}  // namespace vg
