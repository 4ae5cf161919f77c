// Unit tests of the JSON codec: request decoding (each valid and invalid case
// of the OpenAI fields), error bodies, responses, SSE framing, UTF-8 safety.
#include "http/json_codec.hpp"

#include <gtest/gtest.h>

#include <limits>

#include <boost/json.hpp>

#include "http/json_fields.hpp"
#include "json_test_util.hpp"

namespace vg {
namespace {

namespace json = boost::json;

CompletionRequest decode_ok(std::string_view body) {
  auto r = decode_completion_request(body);
  EXPECT_TRUE(r.ok()) << body << " -> " << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : CompletionRequest{};
}

/// Decoding must fail with 400 invalid_request and a message containing `needle`.
void expect_invalid(std::string_view body, std::string_view needle) {
  auto r = decode_completion_request(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest) << body;
  EXPECT_EQ(http_status(r.error().code), 400);
  EXPECT_NE(r.error().message.find(needle), std::string::npos)
      << body << " -> message '" << r.error().message << "' lacks '" << needle << "'";
}

using test::parse_object;

TEST(DecodeCompletion, MinimalRequestGetsOpenAIDefaults) {
  CompletionRequest r = decode_ok(R"({"prompt":"hello"})");
  ASSERT_TRUE(std::holds_alternative<std::string>(r.prompt));
  EXPECT_EQ(std::get<std::string>(r.prompt), "hello");
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.model.empty());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.timeout_s.has_value());
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 1.0);
  EXPECT_DOUBLE_EQ(r.sampling.top_p, 1.0);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.sampling.seed.has_value());
}

TEST(DecodeCompletion, AllFields) {
  CompletionRequest r = decode_ok(
      R"({"model":"tinylm","prompt":"hi","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":40,)"
      R"("seed":42,"stop":["\n","END"],"stream":true,"timeout":2.5})");
  EXPECT_EQ(r.model, "tinylm");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 0.0);
  EXPECT_DOUBLE_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.stream);
  EXPECT_DOUBLE_EQ(*r.timeout_s, 2.5);
}

TEST(DecodeCompletion, UnknownFieldsAndNullsAreIgnored) {
  CompletionRequest r = decode_ok(
      R"({"prompt":"x","echo":false,"logit_bias":{"1":2},"user":"u","max_tokens":null,"temperature":null})");
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 1.0);
}

TEST(DecodeCompletion, PromptForms) {
  CompletionRequest tokens = decode_ok(R"({"prompt":[1,2,3]})");
  ASSERT_TRUE(std::holds_alternative<std::vector<std::int32_t>>(tokens.prompt));
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(tokens.prompt), (std::vector<std::int32_t>{1, 2, 3}));
  CompletionRequest one = decode_ok(R"({"prompt":["only one"]})");
  EXPECT_EQ(std::get<std::string>(one.prompt), "only one");
}

TEST(DecodeCompletion, PromptErrors) {
  expect_invalid(R"({})", "prompt is required");
  expect_invalid(R"({"prompt":null})", "prompt is required");
  EXPECT_EQ(std::get<std::string>(decode_ok(R"({"prompt":""})").prompt), "");
  expect_invalid(R"({"prompt":[]})", "prompt must not be empty");
  expect_invalid(R"({"prompt":5})", "prompt must be");
  expect_invalid(R"({"prompt":["a","b"]})", "batched");
  expect_invalid(R"({"prompt":[[1,2]]})", "batched");
  expect_invalid(R"({"prompt":[1,-2]})", "prompt[1]");
  expect_invalid(R"({"prompt":[1,1.5]})", "prompt[1]");
  expect_invalid(R"({"prompt":[3000000000]})", "prompt[0]");
}

TEST(DecodeCompletion, MaxTokensValidAndBoundaries) {
  EXPECT_EQ(decode_ok(R"({"prompt":"x","max_tokens":1})").max_tokens, 1);
  EXPECT_EQ(decode_ok(R"({"prompt":"x","max_tokens":2147483647})").max_tokens, 2147483647);
  EXPECT_EQ(decode_ok(R"({"prompt":"x","max_tokens":5.0})").max_tokens, 5);  // integral number
}

TEST(DecodeCompletion, MaxTokensMalformed) {
  for (const char* v : {"-5", "0", "1.5", "\"5\"", "true", "2147483648", "1e30", "99999999999999999999", "[1]",
                        "{}"}) {
    expect_invalid(std::string(R"({"prompt":"x","max_tokens":)") + v + "}", "max_tokens");
  }
}

TEST(DecodeCompletion, MaxTokensMessageShowsTheValue) { expect_invalid(R"({"prompt":"x","max_tokens":-5})", "-5"); }

TEST(DecodeCompletion, ChatsMaxCompletionTokensIsRefusedByName) {
  // Not a field of /v1/completions: ignoring it would give a length the client did not ask for.
  expect_invalid(R"({"prompt":"x","max_completion_tokens":5})",
                 "max_completion_tokens is a field of chat completions: /v1/completions takes max_tokens");
}

TEST(DecodeCompletion, TemperatureRange) {
  EXPECT_DOUBLE_EQ(decode_ok(R"({"prompt":"x","temperature":2})").sampling.temperature, 2.0);
  expect_invalid(R"({"prompt":"x","temperature":2.01})", "temperature");
  expect_invalid(R"({"prompt":"x","temperature":-0.1})", "temperature");
  expect_invalid(R"({"prompt":"x","temperature":"hot"})", "temperature");
}

TEST(DecodeCompletion, TopPAndTopK) {
  EXPECT_DOUBLE_EQ(decode_ok(R"({"prompt":"x","top_p":1})").sampling.top_p, 1.0);
  expect_invalid(R"({"prompt":"x","top_p":0})", "top_p");
  expect_invalid(R"({"prompt":"x","top_p":1.5})", "top_p");
  EXPECT_EQ(decode_ok(R"({"prompt":"x","top_k":0})").sampling.top_k, 0);
  expect_invalid(R"({"prompt":"x","top_k":-1})", "top_k");
  expect_invalid(R"({"prompt":"x","top_k":2.5})", "top_k");
}

TEST(DecodeCompletion, Seed) {
  EXPECT_EQ(decode_ok(R"({"prompt":"x","seed":18446744073709551615})").sampling.seed, 18446744073709551615u);
  EXPECT_EQ(decode_ok(R"({"prompt":"x","seed":-1})").sampling.seed, 18446744073709551615u);
  expect_invalid(R"({"prompt":"x","seed":1.5})", "seed");
  expect_invalid(R"({"prompt":"x","seed":"7"})", "seed");
}

TEST(DecodeCompletion, Stop) {
  EXPECT_EQ(decode_ok(R"({"prompt":"x","stop":"\n"})").stop, (std::vector<std::string>{"\n"}));
  EXPECT_TRUE(decode_ok(R"({"prompt":"x","stop":[]})").stop.empty());
  EXPECT_EQ(decode_ok(R"({"prompt":"x","stop":["a","b","c","d"]})").stop.size(), 4u);
  expect_invalid(R"({"prompt":"x","stop":["a","b","c","d","e"]})", "at most 4");
  expect_invalid(R"({"prompt":"x","stop":""})", "stop");
  expect_invalid(R"({"prompt":"x","stop":["a",""]})", "stop[1]");
  expect_invalid(R"({"prompt":"x","stop":[1]})", "stop[0]");
  expect_invalid(R"({"prompt":"x","stop":7})", "stop");
}

TEST(DecodeCompletion, StreamModelTimeoutN) {
  expect_invalid(R"({"prompt":"x","stream":"yes"})", "stream");
  expect_invalid(R"({"prompt":"x","model":3})", "model");
  expect_invalid(R"({"prompt":"x","timeout":0})", "timeout");
  expect_invalid(R"({"prompt":"x","timeout":-1})", "timeout");
  expect_invalid(R"({"prompt":"x","timeout":1e9})", "timeout");
  EXPECT_EQ(decode_ok(R"({"prompt":"x","n":1})").max_tokens, 16);
  EXPECT_EQ(decode_ok(R"({"prompt":"x","n":3})").n, 3);
  EXPECT_EQ(decode_ok(R"({"prompt":"x","n":null})").n, 1);
  expect_invalid(R"({"prompt":"x","n":0})", "n must be");
  expect_invalid(R"({"prompt":"x","n":"2"})", "n must be");
  expect_invalid(R"({"prompt":"x","n":257})", "n must be");
}

TEST(DecodeCompletion, LogprobsEchoAndStreamOptions) {
  const CompletionRequest r = decode_ok(R"({"prompt":"x","logprobs":5,"echo":true,"max_tokens":0})");
  ASSERT_TRUE(r.logprobs.has_value());
  EXPECT_EQ(*r.logprobs, 5);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_FALSE(decode_ok(R"({"prompt":"x","logprobs":null})").logprobs.has_value());
  expect_invalid(R"({"prompt":"x","logprobs":21})", "logprobs must be");
  expect_invalid(R"({"prompt":"x","logprobs":true})", "logprobs must be");
  expect_invalid(R"({"prompt":"x","max_tokens":0})", "0 only with echo");
  expect_invalid(R"({"prompt":"x","echo":"yes"})", "echo must be");
  EXPECT_TRUE(decode_ok(R"({"prompt":"x","stream":true,"stream_options":{"include_usage":true}})").include_usage);
  EXPECT_FALSE(decode_ok(R"({"prompt":"x","stream":true,"stream_options":{}})").include_usage);
  expect_invalid(R"({"prompt":"x","stream_options":{"include_usage":true}})", "only allowed with stream");
  expect_invalid(R"({"prompt":"x","stream":true,"stream_options":{"include_usage":1}})", "include_usage");
}

TEST(DecodeCompletion, PenaltiesAndLogitBias) {
  const CompletionRequest r = decode_ok(
      R"({"prompt":"x","presence_penalty":-1.5,"frequency_penalty":2,"repetition_penalty":1.3,"logit_bias":{"65":-100,"7":2.5}})");
  EXPECT_DOUBLE_EQ(r.sampling.presence_penalty, -1.5);
  EXPECT_DOUBLE_EQ(r.sampling.frequency_penalty, 2);
  EXPECT_DOUBLE_EQ(r.sampling.repetition_penalty, 1.3);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0].first, 65);
  EXPECT_FLOAT_EQ(r.sampling.logit_bias[0].second, -100.0f);
  EXPECT_EQ(r.sampling.logit_bias[1].first, 7);
  expect_invalid(R"({"prompt":"x","presence_penalty":2.1})", "presence_penalty");
  expect_invalid(R"({"prompt":"x","frequency_penalty":"1"})", "frequency_penalty");
  expect_invalid(R"({"prompt":"x","repetition_penalty":0})", "repetition_penalty");
  expect_invalid(R"({"prompt":"x","logit_bias":[1]})", "logit_bias");
  expect_invalid(R"({"prompt":"x","logit_bias":{"-1":1}})", "token ids");
  expect_invalid(R"({"prompt":"x","logit_bias":{"12345678901":1}})", "token ids");
  expect_invalid(R"({"prompt":"x","logit_bias":{"1":-100.5}})", "between -100 and 100");
}

TEST(DecodeCompletion, FieldsThatWouldChangeTheAnswerAreRefusedByName) {
  for (const char* field : {R"("best_of":2)", R"("suffix":"end")", R"("tools":[{}])", R"("tool_choice":"required")",
                            R"("functions":[{}])", R"("function_call":{"name":"f"})",
                            R"("response_format":{"type":"json_schema"})", R"("min_p":0.1)", R"("min_tokens":2)",
                            R"("use_beam_search":true)", R"("stop_token_ids":[2])", R"("guided_regex":"a+")",
                            R"("audio":{})", R"("modalities":["audio"])", R"("prompt_logprobs":1)"}) {
    const std::string body = std::string(R"({"prompt":"x",)") + field + "}";
    const std::string name = std::string(field).substr(1, std::string(field).find('"', 1) - 1);
    expect_invalid(body, name + " is not supported");
  }
  // Values that change nothing, and fields that change nothing, pass.
  decode_ok(R"({"prompt":"x","best_of":1,"suffix":"","tools":[],"tool_choice":"auto","response_format":{"type":"text"},
               "modalities":["text"],"min_tokens":0,"use_beam_search":false,"user":"u","metadata":{},"store":true,
               "best_of":null,"tools":null})");
  EXPECT_EQ(decode_ok(R"({"prompt":"x","n":2,"best_of":2})").n, 2);
}

TEST(DecodeInfer, RefusesChoicesLogprobsAndEcho) {
  for (const char* body : {R"({"prompt":"x","n":2})", R"({"prompt":"x","logprobs":1})", R"({"prompt":"x","echo":true})"}) {
    auto r = decode_infer_request(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.error().message.find("/infer"), std::string::npos);
  }
}

TEST(EncodeCompletion, LogprobsInOpenAIsShape) {
  CompletionResponse r{"cmpl-1", "m", 7, {}, Usage{2, 2}, false};
  std::vector<TokenLogprobs> lp;
  lp.push_back(TokenLogprobs{"a", -0.5, {{"b", -0.25}, {"c", -1.0}}});     // chosen not in the top 2
  lp.push_back(TokenLogprobs{"\xe2", -1.5, {{"\xe2", -1.5}}});           // part of a character
  r.choices.push_back(CompletionChoice{0, "a", std::string("length"), lp, {0, 1}});
  const auto v = boost::json::parse(encode_completion_response(r));
  const auto& l = v.at("choices").at(0).at("logprobs");
  EXPECT_EQ(l.at("tokens").at(0).as_string(), "a");
  EXPECT_EQ(l.at("tokens").at(1).as_string(), "bytes:\\xe2");
  EXPECT_DOUBLE_EQ(l.at("token_logprobs").at(0).as_double(), -0.5);
  const auto& top = l.at("top_logprobs").at(0).as_object();
  ASSERT_EQ(top.size(), 3u);  // the chosen token is added in its place
  std::vector<std::string> keys;
  for (const auto& kv : top) keys.emplace_back(kv.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(l.at("text_offset").at(1).as_int64(), 1);
}

TEST(EncodeCompletion, PromptLogprobsStartWithNullAndInfinityIsFloored) {
  CompletionResponse r{"cmpl-1", "m", 7, {}, std::nullopt, true};
  std::vector<TokenLogprobs> lp;
  lp.push_back(TokenLogprobs{"H", std::nullopt, {}});
  lp.push_back(TokenLogprobs{"i", -std::numeric_limits<double>::infinity(), {}});
  r.choices.push_back(CompletionChoice{1, "Hi", std::nullopt, lp, {0, 1}});
  const auto v = boost::json::parse(encode_completion_response(r));
  EXPECT_TRUE(v.at("usage").is_null());
  const auto& l = v.at("choices").at(0).at("logprobs");
  EXPECT_EQ(v.at("choices").at(0).at("index").as_int64(), 1);
  EXPECT_TRUE(l.at("token_logprobs").at(0).is_null());
  EXPECT_TRUE(l.at("top_logprobs").at(0).is_null());
  EXPECT_DOUBLE_EQ(l.at("token_logprobs").at(1).to_number<double>(), -9999.0);
}

TEST(DecodeCompletion, BadJsonAndNonObjects) {
  expect_invalid("", "not valid JSON");
  expect_invalid("{", "not valid JSON");
  expect_invalid(R"({"prompt":"x",})", "not valid JSON");
  expect_invalid("[1,2]", "must be a JSON object");
  expect_invalid("\"text\"", "must be a JSON object");
  expect_invalid("null", "must be a JSON object");
  expect_invalid("{\"prompt\":\"\xff\"}", "not valid JSON");  // invalid UTF-8 in the body
}

TEST(DecodeCompletion, DeepNestingIsRejectedNotCrashing) {
  std::string deep = R"({"prompt":"x","junk":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_invalid(deep, "not valid JSON");
}

TEST(DecodeInfer, ShortFormAndStreamIgnored) {
  auto r = decode_infer_request(R"({"prompt":"hi","max_tokens":3,"stream":true,"temperature":0})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<std::string>(r->prompt), "hi");
  EXPECT_EQ(r->max_tokens, 3);
  EXPECT_FALSE(r->stream);
  EXPECT_DOUBLE_EQ(r->sampling.temperature, 0.0);
  auto bad = decode_infer_request(R"({"prompt":"hi","max_tokens":0})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidRequest);
}

// Doubles appear in the text as people write them, not as Boost.JSON's "4.19E0".
TEST(EncodeNumbers, PlainDecimalsInTheText) {
  Error busy(ErrorCode::kOverloaded, "queue full");
  busy.retry_after_s = 4.19;
  EXPECT_NE(encode_error(busy).find("\"retry_after_s\":4.19,"), std::string::npos) << encode_error(busy);
  busy.retry_after_s = 3.0;
  EXPECT_NE(encode_error(busy).find("\"retry_after_s\":3,"), std::string::npos) << encode_error(busy);

  const std::string infer = encode_infer_response({"out", 12.3456, 0.007, "stop", {1, 2}});
  EXPECT_NE(infer.find("\"latency_ms\":12.346,"), std::string::npos) << infer;
  EXPECT_NE(infer.find("\"queue_ms\":0.007,"), std::string::npos) << infer;

  ModelInfo m;
  m.safety_factor = 1.1;
  const std::string models = encode_models({m});
  EXPECT_NE(models.find("\"safety_factor\":1.1}"), std::string::npos) << models;
  for (const std::string& text : {encode_error(busy), infer, models}) {
    EXPECT_EQ(text.find("E0"), std::string::npos) << text;
    EXPECT_EQ(text.find("e-"), std::string::npos) << text;
  }
}

TEST(EncodeNumbers, SerializeMatchesBoostExceptForDoubles) {
  const json::value v = json::parse(R"({"a":[1,-2,18446744073709551615,true,false,null],"b":"x\"\n\u00e9","c":{}})");
  EXPECT_EQ(json_fields::serialize(v), json::serialize(v));
  json::object o;
  o["d"] = 0.25;
  o["big"] = 1e300;
  o["inf"] = std::numeric_limits<double>::infinity();
  EXPECT_EQ(json_fields::serialize(o), R"({"d":0.25,"big":1e+300,"inf":null})");
  EXPECT_EQ(json::parse(json_fields::serialize(o)).at("big").as_double(), 1e300);
}

TEST(EncodeCompletion, OpenAIShape) {
  json::object o = parse_object(encode_completion({"cmpl-1", "tinylm", 1700000000, "hello", "length", {3, 4}}));
  EXPECT_EQ(o.at("id").as_string(), "cmpl-1");
  EXPECT_EQ(o.at("object").as_string(), "text_completion");
  EXPECT_EQ(o.at("created").as_int64(), 1700000000);
  EXPECT_EQ(o.at("model").as_string(), "tinylm");
  const json::object& c = o.at("choices").as_array().at(0).as_object();
  EXPECT_EQ(c.at("text").as_string(), "hello");
  EXPECT_EQ(c.at("index").as_int64(), 0);
  EXPECT_TRUE(c.at("logprobs").is_null());
  EXPECT_EQ(c.at("finish_reason").as_string(), "length");
  const json::object& u = o.at("usage").as_object();
  EXPECT_EQ(u.at("prompt_tokens").as_int64(), 3);
  EXPECT_EQ(u.at("completion_tokens").as_int64(), 4);
  EXPECT_EQ(u.at("total_tokens").as_int64(), 7);
}

TEST(EncodeChunk, DeltaHasNullFinishAndNoUsageLastHasBoth) {
  json::object mid = parse_object(encode_completion_chunk({"cmpl-1", "m", 1, "tok", std::nullopt, std::nullopt}));
  EXPECT_EQ(mid.at("choices").as_array().at(0).at("text").as_string(), "tok");
  EXPECT_TRUE(mid.at("choices").as_array().at(0).at("finish_reason").is_null());
  EXPECT_FALSE(mid.contains("usage"));
  json::object last = parse_object(encode_completion_chunk({"cmpl-1", "m", 1, "", "stop", Usage{2, 5}}));
  EXPECT_EQ(last.at("choices").as_array().at(0).at("finish_reason").as_string(), "stop");
  EXPECT_EQ(last.at("usage").at("total_tokens").as_int64(), 7);
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse_data("[DONE]"), "data: [DONE]\n\n");
  std::string chunk = encode_completion_chunk({"c", "m", 1, "line1\nline2\r\n", std::nullopt, std::nullopt});
  EXPECT_EQ(chunk.find('\n'), std::string::npos) << "a newline in the payload would break SSE framing";
  std::string ev = sse_data(chunk);
  EXPECT_EQ(ev.rfind("data: ", 0), 0u);
  EXPECT_EQ(ev.substr(ev.size() - 2), "\n\n");
}

TEST(EncodeInfer, Shape) {
  json::object o = parse_object(encode_infer_response({"out", 12.3456, 1.5, "stop", {1, 2}}));
  EXPECT_EQ(o.at("result").as_string(), "out");
  EXPECT_NEAR(o.at("latency_ms").to_number<double>(), 12.346, 1e-9);
  EXPECT_NEAR(o.at("queue_ms").to_number<double>(), 1.5, 1e-9);
  EXPECT_EQ(o.at("usage").at("completion_tokens").as_int64(), 2);
}

TEST(EncodeModels, Shape) {
  ModelInfo m;
  m.id = "tinylm";
  m.family = "gpt2";
  m.dtype = "float32";
  m.context_length = 256;
  m.parameter_count = 1234;
  m.device = "virt:0";
  m.devices = {"virt:0", "virt:1"};
  m.resident_bytes = 5678;
  m.created = 99;
  m.workspace_bytes = 21;
  m.kv_bytes_per_token = 22;
  m.sequence_overhead_bytes = 23;
  m.safety_factor = 1.25;
  json::object o = parse_object(encode_models({m}));
  EXPECT_EQ(o.at("object").as_string(), "list");
  const json::object& d = o.at("data").as_array().at(0).as_object();
  EXPECT_EQ(d.at("id").as_string(), "tinylm");
  EXPECT_EQ(d.at("object").as_string(), "model");
  EXPECT_EQ(d.at("owned_by").as_string(), "vramgate");
  EXPECT_EQ(d.at("created").as_int64(), 99);
  EXPECT_EQ(d.at("family").as_string(), "gpt2");
  EXPECT_EQ(d.at("dtype").as_string(), "float32");
  EXPECT_EQ(d.at("context_length").as_int64(), 256);
  EXPECT_EQ(d.at("parameter_count").as_int64(), 1234);
  EXPECT_EQ(d.at("device").as_string(), "virt:0");
  ASSERT_EQ(d.at("devices").as_array().size(), 2u);
  EXPECT_EQ(d.at("devices").as_array()[0].as_string(), "virt:0");
  EXPECT_EQ(d.at("devices").as_array()[1].as_string(), "virt:1");
  EXPECT_EQ(d.at("resident_bytes").as_int64(), 5678);
  EXPECT_EQ(d.at("workspace_bytes").as_int64(), 21);
  EXPECT_EQ(d.at("kv_bytes_per_token").as_int64(), 22);
  EXPECT_EQ(d.at("sequence_overhead_bytes").as_int64(), 23);
  EXPECT_DOUBLE_EQ(d.at("safety_factor").to_number<double>(), 1.25);
}

TEST(EncodeAdmission, AKvBlockPoolIsShownOnlyWhereThereIsOne) {
  AdmissionState s;
  DeviceState paged;
  paged.name = "virt:0";
  paged.kv_reservation = "full";
  paged.kv_block_tokens = 16;
  paged.kv_block_bytes = 4096;
  paged.kv_blocks_total = 10;
  paged.kv_blocks_used = 6;
  paged.kv_blocks_cached = 3;
  paged.counters[DeviceCounterId::kKvPromptTokens] = 90;
  paged.counters[DeviceCounterId::kKvPrefixHitTokens] = 48;
  s.devices.push_back(paged);
  DeviceState plain;
  plain.name = "virt:1";
  s.devices.push_back(plain);
  json::object o = parse_object(encode_admission(s));
  const json::object& k = o.at("devices").as_array().at(0).as_object().at("kv_blocks").as_object();
  EXPECT_EQ(k.at("reservation").as_string(), "full");
  EXPECT_EQ(k.at("block_tokens").as_int64(), 16);
  EXPECT_EQ(k.at("block_bytes").as_int64(), 4096);
  EXPECT_EQ(k.at("total").as_int64(), 10);
  EXPECT_EQ(k.at("used").as_int64(), 6);
  EXPECT_EQ(k.at("cached").as_int64(), 3);
  EXPECT_EQ(k.at("free").as_int64(), 1);
  EXPECT_EQ(k.at("prompt_tokens").as_int64(), 90);
  EXPECT_EQ(k.at("prefix_hit_tokens").as_int64(), 48);
  EXPECT_FALSE(o.at("devices").as_array().at(1).as_object().contains("kv_blocks"));
}

TEST(EncodeAdmission, Shape) {
  AdmissionState s;
  s.policy = "memory";
  DeviceState d;
  d.name = "virt:0";
  d.capacity_bytes = 100;
  d.budget_bytes = 80;
  d.effective_budget_bytes = 70;
  d.reserved_bytes = 40;
  d.peak_reserved_bytes = 45;
  d.used_bytes = 30;
  d.peak_bytes = 50;
  d.resident_bytes = 10;
  d.workspace_bytes = 5;
  d.models = {"a", "b"};
  d.running = 3;
  d.counters[DeviceCounterId::kCompleted] = 31;
  d.counters[DeviceCounterId::kOutOfMemory] = 32;
  d.counters[DeviceCounterId::kPreemptions] = 33;
  s.devices.push_back(d);
  DeviceState sick;
  sick.name = "virt:1";
  sick.ready = false;
  sick.state = "unhealthy";
  sick.reason = "weights do not fit";
  s.devices.push_back(sick);
  s.queue_depth = 3;
  s.running = 2;
  s.draining = true;
  s.counters[CounterId::kAdmitted] = 11;
  s.counters[CounterId::kRejectedNeverFits] = 12;
  s.counters[CounterId::kRejectedQueueFull] = 13;
  s.counters[CounterId::kQueueTimeouts] = 14;
  s.counters[CounterId::kCancelled] = 15;
  s.counters[CounterId::kCompleted] = 16;
  s.counters[CounterId::kFailed] = 17;
  s.counters[CounterId::kOutOfMemory] = 18;
  s.counters[CounterId::kOomBudgetCuts] = 19;
  json::object o = parse_object(encode_admission(s));
  EXPECT_EQ(o.at("policy").as_string(), "memory");
  EXPECT_EQ(o.at("queue_depth").as_int64(), 3);
  EXPECT_EQ(o.at("running").as_int64(), 2);
  EXPECT_TRUE(o.at("draining").as_bool());
  std::int64_t expected = 11;
  for (const char* k : {"admitted", "rejected_never_fits", "rejected_queue_full", "queue_timeouts", "cancelled",
                        "completed", "failed", "out_of_memory", "oom_budget_cuts"}) {
    EXPECT_EQ(o.at(k).as_int64(), expected++) << k;
  }
  const json::object& j = o.at("devices").as_array().at(0).as_object();
  EXPECT_EQ(j.at("name").as_string(), "virt:0");
  EXPECT_EQ(j.at("capacity_bytes").as_int64(), 100);
  EXPECT_EQ(j.at("budget_bytes").as_int64(), 80);
  EXPECT_EQ(j.at("effective_budget_bytes").as_int64(), 70);
  EXPECT_EQ(j.at("reserved_bytes").as_int64(), 40);
  EXPECT_EQ(j.at("peak_reserved_bytes").as_int64(), 45);
  EXPECT_EQ(j.at("used_bytes").as_int64(), 30);
  EXPECT_EQ(j.at("peak_bytes").as_int64(), 50);
  EXPECT_EQ(j.at("resident_bytes").as_int64(), 10);
  EXPECT_EQ(j.at("workspace_bytes").as_int64(), 5);
  EXPECT_TRUE(j.at("ready").as_bool());
  EXPECT_EQ(j.at("state").as_string(), "ready");
  EXPECT_FALSE(j.contains("reason"));  // only when not ready
  ASSERT_EQ(j.at("models").as_array().size(), 2u);
  EXPECT_EQ(j.at("models").as_array()[1].as_string(), "b");
  EXPECT_EQ(j.at("running").as_int64(), 3);
  EXPECT_EQ(j.at("completed").as_int64(), 31);
  EXPECT_EQ(j.at("out_of_memory").as_int64(), 32);
  EXPECT_EQ(j.at("preemptions").as_int64(), 33);
  const json::object& u = o.at("devices").as_array().at(1).as_object();
  EXPECT_EQ(u.at("name").as_string(), "virt:1");
  EXPECT_FALSE(u.at("ready").as_bool());
  EXPECT_EQ(u.at("state").as_string(), "unhealthy");
  EXPECT_EQ(u.at("reason").as_string(), "weights do not fit");
  EXPECT_TRUE(u.at("models").as_array().empty());
  EXPECT_EQ(u.at("completed").as_int64(), 0);
}

TEST(EncodeReady, StatusReasonAndDevices) {
  DeviceState a;
  a.name = "virt:0";
  DeviceState b;
  b.name = "virt:1";
  b.ready = false;
  b.state = "not_ready";
  b.reason = "3 out-of-memory steps";
  json::object ready = parse_object(encode_ready("", {a, b}));
  EXPECT_EQ(ready.at("status").as_string(), "ready");
  EXPECT_FALSE(ready.contains("reason"));
  const json::array& devices = ready.at("devices").as_array();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].at("name").as_string(), "virt:0");
  EXPECT_EQ(devices[0].at("state").as_string(), "ready");
  EXPECT_FALSE(devices[0].as_object().contains("reason"));
  EXPECT_EQ(devices[1].at("state").as_string(), "not_ready");
  EXPECT_EQ(devices[1].at("reason").as_string(), "3 out-of-memory steps");
  json::object down = parse_object(encode_ready("server draining", {}));
  EXPECT_EQ(down.at("status").as_string(), "not_ready");
  EXPECT_EQ(down.at("reason").as_string(), "server draining");
  EXPECT_TRUE(down.at("devices").as_array().empty());
}

TEST(Utf8, EncodedResponsesWithBrokenTextStayValidJson) {
  const std::string broken = "tok\xF0\x9F\x98 \xFF end";
  std::string body = encode_completion({"c", "m", 1, broken, "stop", {}});
  json::object o = parse_object(body);  // Boost.JSON rejects invalid UTF-8 when parsing
  EXPECT_EQ(o.at("choices").as_array().at(0).at("text").as_string(), "tok\xEF\xBF\xBD \xEF\xBF\xBD end");
  Error e(ErrorCode::kInternal, broken);
  parse_object(encode_error(e));
  parse_object(encode_completion_chunk({"c", "m", 1, broken, std::nullopt, std::nullopt}));
  parse_object(encode_infer_response({broken, 1, 1, "stop", {}}));
}

TEST(Utf8, EveryTwoByteTextEncodesToParsableJson) {
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const char raw[2] = {static_cast<char>(a), static_cast<char>(b)};
      const std::string body = encode_completion_chunk({"c", "m", 1, std::string(raw, 2), std::nullopt, std::nullopt});
      boost::system::error_code ec;
      json::parse(body, ec);
      ASSERT_FALSE(ec) << "bytes " << a << "," << b << " broke the JSON: " << ec.message();
    }
  }
}

}  // namespace
}  // namespace vg
