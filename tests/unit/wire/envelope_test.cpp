// Envelopes of the engine wire protocol: every message of both directions
// round-trips through its frame; malformed envelopes (not JSON, no type, an
// unknown type, missing or wrongly typed fields) are DecodeError values
// naming the type, the request and the field, never an exception; the bytes
// of the messages are those the protocol has always had.
#include "wire/envelope.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "wire/frame.hpp"

namespace vg::wire {
namespace {

/// The payload of a frame encode_frame made.
std::string payload(const std::string& frame) {
  EXPECT_GE(frame.size(), kHeaderBytes);
  FrameReader r(kMaxFrameBytes);
  r.append(frame);
  auto p = r.next();
  EXPECT_TRUE(p && p->ok());
  return p && p->ok() ? std::string(**p) : std::string();
}

CompletionRequest sample_request() {
  CompletionRequest r;
  r.request_id = "req-1";
  r.model = "tinylm";
  r.prompt = std::vector<std::int32_t>{1, 2, 3};
  r.max_tokens = 7;
  r.sampling.temperature = 0.5;
  r.sampling.seed = 42;
  r.stop = {"\n"};
  r.stream = true;
  r.timeout_s = 2.5;
  r.n = 1;
  r.logprobs = 2;
  return r;
}

TensorInferRequest sample_tensor_request() {
  TensorInferRequest r;
  r.request_id = "t-1";
  r.model = "adder";
  r.inputs = {HostTensor{"x", {2}, {1.5f, -2.0f}}};
  r.dtypes = {"FP32"};
  r.outputs = {"y"};
  r.timeout_s = 4.0;
  return r;
}

std::vector<ToEngine> every_to_engine() {
  return {
      GatewayHello{kProtocolVersion, "s3cret", "pid 42"},
      Submit{5, sample_request(), ResumeState{{9, 10}, true}, true},
      Submit{6, sample_request(), std::nullopt, false},
      Infer{7, sample_tensor_request()},
      Cancel{8},
      Withdraw{9},
      QueryState{10},
      Release{},
  };
}

AdmissionState sample_admission() {
  AdmissionState s;
  s.policy = "memory";
  s.queued = 2;
  s.counters[CounterId::kCompleted] = 11;
  DeviceState d;
  d.name = "virt:0";
  d.budget_bytes = 1 << 30;
  d.kv_blocks_total = 64;
  s.devices.push_back(d);
  s.waiting.push_back(WaitingRequest{1, 500, 0.25, "high"});
  return s;
}

EngineMetrics sample_metrics() {
  EngineMetrics m;
  m.histograms.push_back(HistogramSample{"queue_wait_seconds", {}, {0.5, 1.0}, {1, 2, 0}, 1.25});
  m.histograms.push_back(HistogramSample{"tensor_batch_size", {"adder"}, {1.0}, {3, 0}, 3.0});
  m.counters.push_back(CounterSample{"tensor_requests_total", {"adder", "ok"}, 3.0});
  m.generated_tokens = 17.0;
  return m;
}

std::vector<ToGateway> every_to_gateway() {
  EngineHello hello;
  hello.pid = 4242;
  ModelInfo model;
  model.id = "tinylm";
  model.context_length = 256;
  model.devices = {"virt:0"};
  hello.models = {model};
  TensorModelInfo tensor;
  tensor.id = "adder";
  tensor.spec.inputs = {TensorSpec{"x", "FP32", {std::string("n")}}};
  tensor.spec.dims = {DimRange{"n", 1, 8}};
  hello.tensor_models = {tensor};
  hello.devices = {"virt:0"};
  hello.model_dir = "/models";
  hello.config_digest = "abc";
  hello.gateways = 1;
  hello.started_at = 1700000000.5;
  hello.load_s = 0.25;
  hello.admission = sample_admission();

  Error refusal(ErrorCode::kOverloaded, "queue full");
  refusal.retry_after_s = 1.5;
  refusal.retry_token = "tok";
  TextEvent text;
  text.text = "hi";
  text.tokens = 1;
  text.token_ids = {104};
  text.logprobs = {TokenLogprobs{"hi", -0.5, {{"hi", -0.5}}}};
  TensorResult result;
  result.outputs = {HostTensor{"y", {1}, {0.5f}}};
  result.batch_requests = 2;
  result.batch_shape = {2};
  return {
      hello,
      Refused{"wrong or missing secret"},
      SubmitAccepted{5, Accepted{"tinylm", 3, 1, 4096, "", "token"}},
      SubmitRejected{6, refusal},
      Event{5, text},
      Event{5, FinishedEvent{"length", {3, 1}, {0.5, 1.0, 2.0}, 0}},
      Event{5, FailedEvent{refusal, {3, 0}, {}}},
      InferDone{7, result},
      InferDone{8, Error(ErrorCode::kCancelled, "cancelled")},
      Withdrawn{9, true},
      StateReport{10, sample_admission(), sample_metrics()},
      StatusReport{EngineStatus{false, "draining", true, ""}, sample_admission(), sample_metrics()},
  };
}

TEST(Envelope, EveryMessageToTheEngineRoundTrips) {
  std::set<std::size_t> kinds;
  for (const ToEngine& m : every_to_engine()) {
    kinds.insert(m.index());
    const std::string frame = encode_frame(m);
    Decoded<ToEngine> back = decode_to_engine(payload(frame));
    ASSERT_TRUE(back.ok()) << type_name(m) << ": " << back.error().message;
    EXPECT_EQ(back->index(), m.index());
    // Everything encoded came back: encoding it again gives the same bytes.
    EXPECT_EQ(encode_frame(*back), frame) << type_name(m);
  }
  EXPECT_EQ(kinds.size(), std::variant_size_v<ToEngine>);
}

TEST(Envelope, EveryMessageToTheGatewayRoundTrips) {
  std::set<std::size_t> kinds;
  for (const ToGateway& m : every_to_gateway()) {
    kinds.insert(m.index());
    const std::string frame = encode_frame(m);
    Decoded<ToGateway> back = decode_to_gateway(payload(frame));
    ASSERT_TRUE(back.ok()) << type_name(m) << ": " << back.error().message;
    EXPECT_EQ(back->index(), m.index());
    EXPECT_EQ(encode_frame(*back), frame) << type_name(m);
  }
  EXPECT_EQ(kinds.size(), std::variant_size_v<ToGateway>);
}

TEST(Envelope, DecodedFieldsAreTheOnesSent) {
  Decoded<ToEngine> submit = decode_to_engine(payload(encode_frame(every_to_engine()[1])));
  ASSERT_TRUE(submit.ok());
  const auto& s = std::get<Submit>(*submit);
  EXPECT_EQ(s.rid, 5u);
  EXPECT_EQ(s.request.max_tokens, 7);
  EXPECT_EQ(s.request.timeout_s, std::optional<double>(2.5));
  ASSERT_TRUE(s.resume.has_value());
  EXPECT_EQ(s.resume->tokens, (std::vector<std::int32_t>{9, 10}));
  EXPECT_TRUE(s.resume->prompt_sent);
  EXPECT_TRUE(s.admitted_before);

  Decoded<ToGateway> status = decode_to_gateway(payload(encode_frame(every_to_gateway().back())));
  ASSERT_TRUE(status.ok());
  const auto& st = std::get<StatusReport>(*status);
  EXPECT_FALSE(st.status.ready);
  EXPECT_EQ(st.status.not_ready_reason, "draining");
  ASSERT_TRUE(st.admission.has_value());
  EXPECT_EQ(st.admission->devices.at(0).kv_blocks_total, 64);
  ASSERT_EQ(st.metrics.counters.size(), 1u);
  EXPECT_EQ(st.metrics.counters[0].labels, (std::vector<std::string>{"adder", "ok"}));
  EXPECT_EQ(st.metrics.generated_tokens, std::optional<double>(17.0));

  Decoded<ToGateway> failed = decode_to_gateway(payload(encode_frame(every_to_gateway()[8])));
  ASSERT_TRUE(failed.ok());
  const auto& done = std::get<InferDone>(*failed);
  ASSERT_FALSE(done.result.ok());
  EXPECT_EQ(done.result.error().code, ErrorCode::kCancelled);
}

TEST(Envelope, TheBytesAreTheProtocolsOwn) {
  // The envelope fields and their names are those engines and gateways
  // have always exchanged; payload codecs are codec_test.cpp's.
  EXPECT_EQ(payload(encode_frame(Cancel{5})), R"({"t":"cancel","rid":5})");
  EXPECT_EQ(payload(encode_frame(Withdraw{6})), R"({"t":"withdraw","rid":6})");
  EXPECT_EQ(payload(encode_frame(QueryState{7})), R"({"t":"state","qid":7})");
  EXPECT_EQ(payload(encode_frame(Release{})), R"({"t":"release"})");
  EXPECT_EQ(payload(encode_frame(Withdrawn{8, false})), R"({"t":"withdrawn","rid":8,"ok":false})");
  EXPECT_EQ(payload(encode_frame(Refused{"no"})), R"({"t":"refused","reason":"no"})");
  // A hello as a peer of another make writes it (no "gateway") decodes.
  Decoded<ToEngine> hello = decode_to_engine(R"({"t":"hello","v":3,"secret":"s"})");
  ASSERT_TRUE(hello.ok());
  EXPECT_EQ(std::get<GatewayHello>(*hello).secret, "s");
  // A hello of another version decodes: the engine answers it with a refusal.
  Decoded<ToEngine> old = decode_to_engine(R"({"t":"hello","v":99})");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(std::get<GatewayHello>(*old).version, 99);
}

TEST(Envelope, TokenBytesThatAreNotUtf8TravelAsTheyAre) {
  TextEvent t;
  t.text = "\xe2\x82";  // a token may be part of a UTF-8 character
  Decoded<ToGateway> back = decode_to_gateway(payload(encode_frame(Event{3, t})));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(std::get<TextEvent>(std::get<Event>(*back).event).text, t.text);
}

struct Malformed {
  const char* payload;
  const char* type;     ///< the DecodeError's type
  std::uint64_t rid;    ///< the DecodeError's rid
  const char* mention;  ///< a part of its message
};

void expect_refused(const Malformed& c, bool to_engine) {
  SCOPED_TRACE(c.payload);
  DecodeError e;
  EXPECT_NO_THROW({
    if (to_engine) {
      Decoded<ToEngine> d = decode_to_engine(c.payload);
      ASSERT_FALSE(d.ok());
      e = d.error();
    } else {
      Decoded<ToGateway> d = decode_to_gateway(c.payload);
      ASSERT_FALSE(d.ok());
      e = d.error();
    }
  });
  EXPECT_EQ(e.type, c.type);
  EXPECT_EQ(e.rid, c.rid);
  EXPECT_NE(e.message.find(c.mention), std::string::npos) << e.message;
}

TEST(Envelope, MalformedMessagesToTheEngineAreDecodeErrors) {
  const Malformed cases[] = {
      {"not json", "", 0, "not JSON"},
      {"[1,2]", "", 0, "not a JSON object"},
      {R"({"rid":1})", "", 0, "no message type"},
      {R"({"t":3})", "", 0, "no message type"},
      {R"({"t":"explode","rid":4})", "explode", 4, "unknown message type \"explode\""},
      {R"({"t":"status"})", "status", 0, "unknown message type"},  // the other direction's
      {R"({"t":"submit","rid":1})", "submit", 1, "bad submit: missing \"request\""},
      {R"({"t":"submit","request":{"prompt":"x"}})", "submit", 0, "missing \"rid\""},
      {R"({"t":"submit","rid":7,"request":{"prompt":"x","max_tokens":-5}})", "submit", 7, "\"max_tokens\""},
      {R"({"t":"submit","rid":7,"request":[1]})", "submit", 7, "must be an object"},
      {R"({"t":"submit","rid":7,"request":{},"resume":{"tokens":"x"}})", "submit", 7, "\"tokens\""},
      {R"({"t":"submit","rid":7,"request":{},"admitted_before":1})", "submit", 7, "\"admitted_before\""},
      {R"({"t":"cancel","rid":"7"})", "cancel", 0, "\"rid\" must be an integer"},
      {R"({"t":"cancel","rid":0})", "cancel", 0, "\"rid\""},
      {R"({"t":"withdraw"})", "withdraw", 0, "missing \"rid\""},
      {R"({"t":"state","qid":-1})", "state", 0, "\"qid\""},
      {R"({"t":"infer","rid":2,"request":{"model":"m","inputs":[{"name":"x","shape":[1],"data":"@@@@@@@@@@@@@@@@"}],"dtypes":["FP32"]}})",
       "infer", 2, "base64"},
      {R"({"t":"hello","v":"3"})", "hello", 0, "\"v\""},
  };
  for (const Malformed& c : cases) expect_refused(c, true);
}

TEST(Envelope, MalformedMessagesToTheGatewayAreDecodeErrors) {
  const Malformed cases[] = {
      {"{", "", 0, "not JSON"},
      {R"({"t":"cancel","rid":3})", "cancel", 3, "unknown message type"},  // the other direction's
      {R"({"t":"event","rid":3})", "event", 3, "missing \"event\""},
      {R"({"t":"event","rid":3,"event":{"k":"exploded"}})", "event", 3, "unknown event kind"},
      {R"({"t":"event","rid":3,"event":{"k":"text","ids":[-1]}})", "event", 3, "\"ids\""},
      {R"({"t":"accepted","rid":4,"submission":{"cost_bytes":-1}})", "accepted", 4, "\"cost_bytes\""},
      {R"({"t":"rejected","rid":4,"error":{"type":"no_such_error"}})", "rejected", 4, "unknown error type"},
      {R"({"t":"rejected","rid":4})", "rejected", 4, "missing \"error\""},
      {R"({"t":"infer_done","rid":5})", "infer_done", 5, "missing \"result\""},
      {R"({"t":"withdrawn","rid":6,"ok":"yes"})", "withdrawn", 6, "\"ok\""},
      {R"({"t":"status"})", "status", 0, "missing \"status\""},
      {R"({"t":"status","status":{},"admission":7})", "status", 0, "must be an object"},
      {R"({"t":"status","status":{},"histograms":[{"name":"h","bounds":[1],"buckets":[1]}]})", "status", 0, "buckets"},
      {R"({"t":"state","qid":1,"counters":[{"labels":[]}]})", "state", 0, "missing \"name\""},
      {R"({"t":"hello","models":[{"context_length":1}]})", "hello", 0, "missing \"id\""},
  };
  for (const Malformed& c : cases) expect_refused(c, false);
}

TEST(Envelope, DeepOrHugeInputIsAnErrorNotACrash) {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_FALSE(decode_to_engine(deep).ok());
  EXPECT_FALSE(decode_to_gateway(deep).ok());
  std::string ids = R"({"t":"submit","rid":1,"request":{"prompt_ids":[)";
  for (int i = 0; i < 3; ++i) ids += "1,";
  ids += "2147483648]}}";  // past int32
  Decoded<ToEngine> d = decode_to_engine(ids);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("prompt_ids"), std::string::npos) << d.error().message;
}

}  // namespace
}  // namespace vg::wire
