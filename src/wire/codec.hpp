// JSON codecs of the engine wire protocol for the service types of
// api/types.hpp and api/events.hpp (a gateway and an engine process
// exchange these). Decoding is as strict as the HTTP decoder: every field
// type-checked and range-checked, sizes bounded, so a broken or hostile peer
// gets an error value and can neither crash the receiver nor make it
// allocate past the frame it sent. The structs they carry besides api/'s
// are in payloads.hpp. Pure; any thread. Defined by topic: request_codec.cpp,
// event_codec.cpp (answers, errors, events), state_codec.cpp (models,
// admission, status, metrics), tensor_codec.cpp; their shared field readers
// are json_fields.hpp's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "api/events.hpp"
#include "api/service.hpp"
#include "api/types.hpp"
#include "common/error.hpp"
#include "wire/payloads.hpp"

namespace vg::wire {

boost::json::object encode(const CompletionRequest& r);
Result<CompletionRequest> decode_completion_request(const boost::json::value& v);

boost::json::object encode(const ResumeState& r);
Result<ResumeState> decode_resume(const boost::json::value& v);

boost::json::object encode(const Accepted& a);
Result<Accepted> decode_accepted(const boost::json::value& v);

boost::json::object encode(const Error& e);
/// Decodes an Error into `*out`; the Status says whether it could.
Status decode_error(const boost::json::value& v, Error* out);

/// TextEvent carries its token ids ("ids"), which a resume needs.
boost::json::object encode(const EngineEvent& e);
Result<EngineEvent> decode_event(const boost::json::value& v);

boost::json::object encode(const ModelInfo& m);
Result<ModelInfo> decode_model_info(const boost::json::value& v);

boost::json::object encode(const AdmissionState& s);
Result<AdmissionState> decode_admission_state(const boost::json::value& v);

boost::json::object encode(const EngineStatus& s);
Result<EngineStatus> decode_status(const boost::json::value& v);

boost::json::object encode(const HistogramSample& h);
Result<HistogramSample> decode_histogram(const boost::json::value& v);

/// TorchScript requests: tensors travel as their float32 bytes in base64
/// (host byte order; both ends share the host). Decoding bounds the rank
/// (16), the tensors (256) and each tensor's values (2^26); whether the
/// values fit the shape is the engine's check_inputs (a 400 naming the input).
/// An engine's metrics go into a message beside its other fields:
/// "histograms" and "counters" (arrays, empty when none) and
/// "generated_tokens" (when set); decoding reads those fields of `message`.
void encode_metrics(const EngineMetrics& m, boost::json::object& message);
Result<EngineMetrics> decode_metrics(const boost::json::object& message);

boost::json::object encode(const TensorInferRequest& r);
Result<TensorInferRequest> decode_tensor_request(const boost::json::value& v);

boost::json::object encode(const TensorResult& r);
/// An upper bound of the bytes `tensors` take in an encoded message (their
/// base64 data, names and shapes), without encoding them.
std::size_t encoded_tensors_bound(const std::vector<HostTensor>& tensors);
Result<TensorResult> decode_tensor_result(const boost::json::value& v);

boost::json::object encode(const TensorModelInfo& m);
Result<TensorModelInfo> decode_tensor_model_info(const boost::json::value& v);

/// Whether the prompt (or a chat message) of `r` contains `needle`; false
/// for an empty needle. The test hook --test-crash-on-prompt.
bool contains_text(const CompletionRequest& r, const std::string& needle);

}  // namespace vg::wire
