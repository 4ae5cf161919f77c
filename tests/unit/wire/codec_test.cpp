// Wire codecs: every field survives a round trip; out-of-range and
// wrongly typed fields are refused with a message naming them.
#include "wire/codec.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

namespace vg::wire {
namespace {

namespace json = boost::json;

TEST(Codec, CompletionRequestRoundTrips) {
  CompletionRequest r;
  r.request_id = "abc";
  r.model = "tinylm";
  r.prompt = std::vector<std::int32_t>{1, 2, 3};
  r.max_tokens = 9;
  r.max_tokens_from = MaxTokensFrom::kRestOfContext;
  r.sampling.temperature = 0.5;
  r.sampling.top_p = 0.9;
  r.sampling.top_k = 4;
  r.sampling.seed = 42;
  r.sampling.presence_penalty = 0.25;
  r.sampling.logit_bias = {{5, -100.0f}};
  r.stop = {"\n\n"};
  r.stream = true;
  r.timeout_s = 3.5;
  r.chat = ChatPrompt{{{"user", "hi"}}, "chatml"};
  r.priority = Priority::kHigh;
  r.n = 3;
  r.logprobs = 2;
  r.echo = true;
  r.include_usage = true;
  r.retry.client = "addr:1.2.3.4";
  r.retry.offered_token = "tok";
  r.retry.attempt = RetryAttempt::kFirst;
  auto back = decode_completion_request(json::value(encode(r)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->request_id, "abc");
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(back->prompt), (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(back->max_tokens, 9);
  EXPECT_EQ(back->max_tokens_from, MaxTokensFrom::kRestOfContext);
  EXPECT_DOUBLE_EQ(back->sampling.temperature, 0.5);
  EXPECT_EQ(back->sampling.top_k, 4);
  EXPECT_EQ(back->sampling.seed, std::optional<std::uint64_t>(42));
  ASSERT_EQ(back->sampling.logit_bias.size(), 1u);
  EXPECT_EQ(back->sampling.logit_bias[0].first, 5);
  EXPECT_EQ(back->stop, r.stop);
  EXPECT_TRUE(back->stream);
  ASSERT_TRUE(back->chat.has_value());
  EXPECT_EQ(back->chat->messages[0].content, "hi");
  EXPECT_EQ(back->priority, std::optional<Priority>(Priority::kHigh));
  EXPECT_EQ(back->n, 3);
  EXPECT_EQ(back->logprobs, std::optional<int>(2));
  EXPECT_TRUE(back->echo);
  EXPECT_TRUE(back->include_usage);
  EXPECT_EQ(back->retry.offered_token, "tok");
  EXPECT_EQ(back->retry.attempt, RetryAttempt::kFirst);  // the engine must not match it by body
}

TEST(Codec, AnyPositiveRepetitionPenaltyCrossesTheWireAsHttpAcceptsIt) {
  for (double penalty : {1e-320, 1e-300, 0.5, 100.0}) {
    CompletionRequest r;
    r.prompt = std::vector<std::int32_t>{1};
    r.sampling.repetition_penalty = penalty;
    auto back = decode_completion_request(json::value(encode(r)));
    ASSERT_TRUE(back.ok()) << penalty << ": " << back.error().message;
    EXPECT_EQ(back->sampling.repetition_penalty, penalty);
  }
  CompletionRequest zero;
  zero.prompt = std::vector<std::int32_t>{1};
  zero.sampling.repetition_penalty = 0;
  EXPECT_FALSE(decode_completion_request(json::value(encode(zero))).ok());
}

TEST(Codec, RefusesOutOfRangeFields) {
  CompletionRequest r;
  r.prompt = std::string("x");
  const json::object good = encode(r);
  const std::pair<const char*, json::value> bad[] = {
      {"max_tokens", json::value(-1)},
      {"n", json::value(0)},
      {"n", json::value(1000)},
      {"logprobs", json::value(21)},
      {"priority", json::value(7)},
      {"stop", json::value("x")},
      {"prompt_ids", json::value(json::array{-3})},
      {"max_tokens_from", json::value("all")},
  };
  for (const auto& [key, v] : bad) {
    json::object o = good;
    if (std::string(key) == "prompt_ids") o.erase("prompt");
    o[key] = v;
    auto d = decode_completion_request(json::value(o));
    EXPECT_FALSE(d.ok()) << key;
    if (!d.ok()) {
      EXPECT_NE(d.error().message.find(key), std::string::npos) << d.error().message;
    }
  }
  json::object hot = good;
  hot["sampling"] = json::object{{"temperature", 1e300}};
  EXPECT_FALSE(decode_completion_request(json::value(hot)).ok());
  EXPECT_FALSE(decode_completion_request(json::value("not an object")).ok());
}

TEST(Codec, LogprobsCrossTheWireBitForBit) {
  // Through serialize and parse, as in a frame: every double comes back
  // exactly (a JSON number parsed by Boost.JSON 1.81 may be an ulp off).
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> value(-30.0, 0.0);
  TextEvent t;
  t.text = "x";
  for (int i = 0; i < 2000; ++i) {
    const double lp = i == 0 ? -1.5938860570075555 : value(rng);
    t.logprobs.push_back(TokenLogprobs{"x", lp, {{"x", lp}, {"y", std::nextafter(lp, -100.0)}}});
  }
  const std::string wire_text = json::serialize(encode(EngineEvent(t)));
  auto back = decode_event(json::parse(wire_text));
  ASSERT_TRUE(back.ok()) << back.error().message;
  const auto& bt = std::get<TextEvent>(*back);
  ASSERT_EQ(bt.logprobs.size(), t.logprobs.size());
  for (std::size_t i = 0; i < t.logprobs.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint64_t>(*bt.logprobs[i].logprob), std::bit_cast<std::uint64_t>(*t.logprobs[i].logprob))
        << i;
    ASSERT_EQ(std::bit_cast<std::uint64_t>(bt.logprobs[i].top[1].second),
              std::bit_cast<std::uint64_t>(t.logprobs[i].top[1].second))
        << i;
  }
  // Anything but a decimal string of a number <= 0 is refused.
  for (const char* bad : {"0.5", "nan", "-1x", ""}) {
    TextEvent one;
    one.logprobs = {TokenLogprobs{"x", -1.0, {}}};
    json::object o = encode(EngineEvent(one));
    o["logprobs"].as_array()[0].as_object()["logprob"] = bad;
    EXPECT_FALSE(decode_event(json::value(o)).ok()) << bad;
  }
}

TEST(Codec, EventsRoundTripWithTokenIdsAndLogprobs) {
  TextEvent t;
  t.text = "hi";
  t.tokens = 2;
  t.choice = 1;
  t.token_ids = {10, 11};
  t.logprobs = {TokenLogprobs{"h", -0.5, {{"h", -0.5}, {"x", -2.0}}},
                TokenLogprobs{"i", -std::numeric_limits<double>::infinity(), {}}};
  auto back = decode_event(json::value(encode(EngineEvent(t))));
  ASSERT_TRUE(back.ok()) << back.error().message;
  const auto& bt = std::get<TextEvent>(*back);
  EXPECT_EQ(bt.text, "hi");
  EXPECT_EQ(bt.token_ids, t.token_ids);
  EXPECT_EQ(bt.choice, 1);
  ASSERT_EQ(bt.logprobs.size(), 2u);
  EXPECT_EQ(bt.logprobs[0].top.size(), 2u);
  EXPECT_TRUE(std::isinf(*bt.logprobs[1].logprob));

  Error e(ErrorCode::kOverloaded, "queue full");
  e.retry_after_s = 2.5;
  e.retry_token = "tok";
  auto failed = decode_event(json::value(encode(EngineEvent(FailedEvent{e, {3, 4}, {}}))));
  ASSERT_TRUE(failed.ok());
  const auto& f = std::get<FailedEvent>(*failed);
  EXPECT_EQ(f.error.code, ErrorCode::kOverloaded);
  EXPECT_EQ(f.error.retry_after_s, std::optional<double>(2.5));
  EXPECT_EQ(f.error.retry_token, "tok");
  EXPECT_EQ(f.usage.completion_tokens, 4);

  auto done = decode_event(json::value(encode(EngineEvent(FinishedEvent{"length", {1, 2}, {}, 0}))));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(std::get<FinishedEvent>(*done).finish_reason, "length");
  EXPECT_FALSE(decode_event(json::value(json::object{{"k", "exploded"}})).ok());
}

TEST(Codec, ADurationJustBelowZeroIsZeroAndNaNIsRefused) {
  // Two clocks read in the other order give a tiny negative wait.
  auto started = decode_event(json::value(json::object{{"k", "started"}, {"queue_ms", -0.0004}}));
  ASSERT_TRUE(started.ok()) << started.error().message;
  EXPECT_EQ(std::get<StartedEvent>(*started).queue_ms, 0.0);
  auto bad = decode_event(json::value(json::object{{"k", "started"}, {"queue_ms", "soon"}}));
  EXPECT_FALSE(bad.ok());
}

TEST(Codec, ErrorsTravelByTypeName) {
  Error e(ErrorCode::kEngineCrashed, "boom");
  Error out;
  ASSERT_TRUE(decode_error(json::value(encode(e)), &out).ok());
  EXPECT_EQ(out.code, ErrorCode::kEngineCrashed);
  EXPECT_EQ(out.message, "boom");
  EXPECT_FALSE(decode_error(json::value(json::object{{"type", "no_such_error"}}), &out).ok());
}

TEST(Codec, AnErrorsParamAndApiCodeCrossTheWire) {
  const Error e = exceeds_context_length(10, 300, "tinylm", 256);
  Error out;
  ASSERT_TRUE(decode_error(json::value(encode(e)), &out).ok());
  EXPECT_EQ(out.param, "max_tokens");
  EXPECT_EQ(out.api_code, "context_length_exceeded");
}

TEST(Codec, AdmissionStateRoundTrips) {
  AdmissionState s;
  s.policy = "memory";
  s.queued = 3;
  s.counters[CounterId::kCompleted] = 99;
  s.counters[CounterId::kRetryClaimed] = 4;
  s.counters[CounterId::kMoved] = 7;
  DeviceState d;
  d.name = "virt:0";
  d.budget_bytes = 1 << 30;
  d.reserved_bytes = 12345;
  d.running = 2;
  s.devices.push_back(d);
  s.waiting.push_back(WaitingRequest{1, 500, 0.25, "high"});
  auto back = decode_admission_state(json::value(encode(s)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->queued, 3);
  EXPECT_EQ(back->counters[CounterId::kCompleted], 99);
  EXPECT_EQ(back->counters[CounterId::kRetryClaimed], 4);
  EXPECT_EQ(back->counters[CounterId::kMoved], 7);
  ASSERT_EQ(back->devices.size(), 1u);
  EXPECT_EQ(back->devices[0].reserved_bytes, 12345);
  EXPECT_EQ(back->devices[0].running, 2);
  ASSERT_EQ(back->waiting.size(), 1u);
  EXPECT_EQ(back->waiting[0].priority, "high");
}

TEST(Codec, EveryCounterRoundTripsUnderItsKey) {
  AdmissionState s;
  for (const CounterInfo& c : kCounters) s.counters[c.id] = 1000 + static_cast<std::int64_t>(c.id);
  const json::value v(encode(s));
  for (const CounterInfo& c : kCounters) EXPECT_EQ(v.as_object().at(c.key).as_int64(), s.counters[c.id]) << c.key;
  auto back = decode_admission_state(v);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->counters, s.counters);
}

TEST(Codec, EveryDeviceCounterRoundTripsUnderItsKey) {
  AdmissionState s;
  DeviceState d;
  d.name = "virt:0";
  for (const DeviceCounterInfo& c : kDeviceCounters) d.counters[c.id] = 2000 + static_cast<std::int64_t>(c.id);
  s.devices.push_back(d);
  const json::value v(encode(s));
  const json::object& dv = v.as_object().at("devices").as_array().at(0).as_object();
  for (const DeviceCounterInfo& c : kDeviceCounters) EXPECT_EQ(dv.at(c.key).as_int64(), d.counters[c.id]) << c.key;
  auto back = decode_admission_state(v);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->devices.at(0).counters, d.counters);
}

TEST(Codec, ADevicesKvBlockPoolRoundTrips) {
  AdmissionState s;
  DeviceState d;
  d.name = "virt:0";
  d.kv_reservation = "on-demand";
  d.kv_block_tokens = 16;
  d.kv_block_bytes = 49152;
  d.kv_blocks_total = 187;
  d.kv_blocks_used = 40;
  d.kv_blocks_cached = 9;
  d.counters[DeviceCounterId::kKvBlocksEvicted] = 3;
  d.counters[DeviceCounterId::kKvPromptTokens] = 1000;
  d.counters[DeviceCounterId::kKvPrefixHitTokens] = 640;
  d.counters[DeviceCounterId::kKvRecomputedTokens] = 77;
  d.counters[DeviceCounterId::kKvGrowthPreemptions] = 2;
  s.devices.push_back(d);
  auto back = decode_admission_state(json::value(encode(s)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  const DeviceState& b = back->devices.at(0);
  EXPECT_EQ(b.kv_reservation, "on-demand");
  EXPECT_EQ(b.kv_block_tokens, 16);
  EXPECT_EQ(b.kv_block_bytes, 49152);
  EXPECT_EQ(b.kv_blocks_total, 187);
  EXPECT_EQ(b.kv_blocks_used, 40);
  EXPECT_EQ(b.kv_blocks_cached, 9);
  EXPECT_EQ(b.counters[DeviceCounterId::kKvBlocksEvicted], 3);
  EXPECT_EQ(b.counters[DeviceCounterId::kKvPromptTokens], 1000);
  EXPECT_EQ(b.counters[DeviceCounterId::kKvPrefixHitTokens], 640);
  EXPECT_EQ(b.counters[DeviceCounterId::kKvRecomputedTokens], 77);
  EXPECT_EQ(b.counters[DeviceCounterId::kKvGrowthPreemptions], 2);
}

TEST(Codec, TensorRequestRoundTripsItsFloatsBitForBit) {
  TensorInferRequest r;
  r.request_id = "rq";
  r.model = "image_classifier";
  r.id = "client-id";
  // Sizes 0..4 floats cover every base64 padding case; odd values survive bit for bit.
  for (int n = 0; n <= 4; ++n) {
    HostTensor t;
    t.name = "in" + std::to_string(n);
    t.shape = {1, n};
    for (int i = 0; i < n; ++i) t.data.push_back(i == 0 ? -0.0f : 1.0f / 3.0f + static_cast<float>(i) * 1e-7f);
    r.inputs.push_back(t);
    r.dtypes.push_back("FP32");
  }
  r.inputs[1].data[0] = std::numeric_limits<float>::denorm_min();
  r.outputs = {"logits"};
  r.timeout_s = 2.5;
  r.priority = Priority::kHigh;
  auto back = decode_tensor_request(json::value(encode(r)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->request_id, "rq");
  EXPECT_EQ(back->model, "image_classifier");
  EXPECT_EQ(back->id, "client-id");
  ASSERT_EQ(back->inputs.size(), r.inputs.size());
  for (std::size_t i = 0; i < r.inputs.size(); ++i) {
    EXPECT_EQ(back->inputs[i].name, r.inputs[i].name);
    EXPECT_EQ(back->inputs[i].shape, r.inputs[i].shape);
    ASSERT_EQ(back->inputs[i].data.size(), r.inputs[i].data.size());
    for (std::size_t k = 0; k < r.inputs[i].data.size(); ++k) {
      EXPECT_EQ(std::memcmp(&back->inputs[i].data[k], &r.inputs[i].data[k], sizeof(float)), 0) << i << " " << k;
    }
  }
  EXPECT_EQ(back->dtypes, r.dtypes);
  EXPECT_EQ(back->outputs, r.outputs);
  EXPECT_EQ(back->timeout_s, 2.5);
  EXPECT_EQ(back->priority, Priority::kHigh);
}

TEST(Codec, TensorDataThatDoesNotFitItsShapeIsTheEnginesCheck) {
  // Ten values for a [1, 3] shape decode (check_inputs then answers 400
  // naming the input); a broken encoding does not.
  TensorInferRequest r;
  r.model = "m";
  r.inputs.push_back(HostTensor{"x", {1, 3}, std::vector<float>(10, 1.0f)});
  r.dtypes.push_back("FP32");
  auto ok = decode_tensor_request(json::value(encode(r)));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->inputs[0].data.size(), 10u);

  json::object o = encode(r);
  auto with_data = [&](const char* data) {
    json::object bad = o;
    bad["inputs"].as_array()[0].as_object()["data"] = data;
    return decode_tensor_request(json::value(bad));
  };
  EXPECT_FALSE(with_data("AAA").ok());       // not a multiple of 4
  EXPECT_FALSE(with_data("AA==").ok());      // one byte: not a whole float
  EXPECT_FALSE(with_data("AAAA!AAA").ok());  // not base64
  EXPECT_FALSE(with_data("A=AA").ok());      // padding inside
  json::object no_dtypes = o;
  no_dtypes["dtypes"] = json::array{};
  auto e = decode_tensor_request(json::value(no_dtypes));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("dtypes"), std::string::npos) << e.error().message;
  json::object deep = o;
  deep["inputs"].as_array()[0].as_object()["shape"] = json::array(17, 1);
  EXPECT_FALSE(decode_tensor_request(json::value(deep)).ok());
}

TEST(Codec, TensorModelInfoAndResultRoundTrip) {
  TensorModelInfo m;
  m.id = "image_to_image";
  m.devices = {"virt:0"};
  m.spec.inputs.push_back(TensorSpec{"image", "float32", {std::string("batch"), std::int64_t{3}, std::string("side")}});
  m.spec.outputs.push_back(TensorSpec{"out", "float32", {std::string("batch"), std::int64_t{3}, std::string("side")}});
  m.spec.dims = {DimRange{"batch", 1, 4}, DimRange{"side", 8, 256}};
  m.spec.batched = true;
  m.spec.pad = {"side"};
  m.profile.resident_bytes = 20107;
  m.profile.fixed_bytes = 9216;
  m.profile.bytes_per_element = 68.5;
  m.profile.safety_factor = 1.2;
  m.profile.held_out_max_error = 0.01;
  m.profile.held_out_min_error = -0.02;
  m.profile.samples.push_back(PeakSample{{1, 3, 8, 8}, 192, 22000, true, 22100});
  m.max_batch = 4;
  m.budget_bytes = 1 << 24;
  auto back = decode_tensor_model_info(json::value(encode(m)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->id, m.id);
  EXPECT_EQ(back->devices, m.devices);
  ASSERT_EQ(back->spec.inputs.size(), 1u);
  EXPECT_EQ(back->spec.inputs[0].shape, m.spec.inputs[0].shape);
  ASSERT_EQ(back->spec.dims.size(), 2u);
  EXPECT_EQ(back->spec.dims[1].name, "side");
  EXPECT_EQ(back->spec.dims[1].max, 256);
  EXPECT_TRUE(back->spec.batched);
  EXPECT_EQ(back->spec.pad, m.spec.pad);
  EXPECT_EQ(back->profile.fixed_bytes, 9216);
  EXPECT_DOUBLE_EQ(back->profile.bytes_per_element, 68.5);
  ASSERT_EQ(back->profile.samples.size(), 1u);
  EXPECT_TRUE(back->profile.samples[0].held_out);
  EXPECT_EQ(back->profile.samples[0].predicted_bytes, 22100);
  EXPECT_EQ(back->max_batch, 4);
  EXPECT_EQ(back->budget_bytes, 1 << 24);

  json::object bad_dim = encode(m);
  bad_dim["spec"].as_object()["dims"].as_array()[0].as_object()["max"] = 0;  // below its min
  EXPECT_FALSE(decode_tensor_model_info(json::value(bad_dim)).ok());

  TensorResult r;
  r.outputs.push_back(HostTensor{"out", {1, 2}, {0.25f, -8.0f}});
  r.batch_requests = 3;
  r.batch_shape = {3, 3, 16, 16};
  r.batch_cost_bytes = 123456;
  r.queue_ms = 1.5;
  r.compute_ms = 7.25;
  auto rb = decode_tensor_result(json::value(encode(r)));
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  ASSERT_EQ(rb->outputs.size(), 1u);
  EXPECT_EQ(rb->outputs[0].data, r.outputs[0].data);
  EXPECT_EQ(rb->batch_requests, 3);
  EXPECT_EQ(rb->batch_shape, r.batch_shape);
  EXPECT_EQ(rb->batch_cost_bytes, 123456);
  EXPECT_DOUBLE_EQ(rb->compute_ms, 7.25);
}

TEST(Codec, LabelledHistogramsCarryTheirLabels) {
  HistogramSample h{"tensor_batch_size", {"image_classifier"}, {1, 2}, {1, 0, 2}, 5};
  auto back = decode_histogram(json::value(encode(h)));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->labels, h.labels);
  HistogramSample plain{"batch_size", {}, {1}, {0, 1}, 2};
  auto pb = decode_histogram(json::value(encode(plain)));
  ASSERT_TRUE(pb.ok());
  EXPECT_TRUE(pb->labels.empty());
}

}  // namespace
}  // namespace vg::wire
