// StreamQueue: the queue's Redis commands and scripts, and strict reading
// of their replies (see stream_queue.hpp).
#include "queue/stream_queue.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace vg::queue {
namespace {

Error reply_error(const std::string& what, const RedisValue& v) {
  return Error(ErrorCode::kInternal, "redis " + what + ": unexpected reply " + v.debug_string().substr(0, 300));
}

std::optional<std::int64_t> parse_int(const std::string& text) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::optional<double> parse_double(const std::string& text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string number_arg(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// [id, [field, value, ...]] as an Entry of class `k`; nullopt on a bad shape
// (a deleted entry shows as nil in some replies).
std::optional<StreamQueue::Entry> to_entry(const RedisValue& v, int k) {
  const auto* pair = v.as_array();
  if (pair == nullptr || pair->size() != 2 || (*pair)[0].as_string() == nullptr) return std::nullopt;
  StreamQueue::Entry entry;
  entry.cost_class = k;
  entry.id = *(*pair)[0].as_string();
  const auto* flat = (*pair)[1].as_array();
  if (flat == nullptr) {
    entry.problem = "entry has no fields";
    return entry;
  }
  if (flat->size() % 2 != 0) {
    entry.problem = "odd number of field names and values";
    return entry;
  }
  bool has_cost = false;
  for (std::size_t i = 0; i < flat->size(); i += 2) {
    const std::string* name = (*flat)[i].as_string();
    const std::string* value = (*flat)[i + 1].as_string();
    if (name == nullptr || value == nullptr) {
      entry.problem = "a field is not a string";
      return entry;
    }
    if (*name == "cost" && !has_cost) {
      has_cost = true;
      auto cost = parse_int(*value);
      if (!cost || *cost < 0) {
        entry.problem = "field cost is not a byte count";
      } else {
        entry.cost_bytes = *cost;
      }
    }
    entry.fields.emplace_back(*name, *value);
  }
  if (!has_cost && entry.problem.empty()) entry.problem = "no cost field";
  if (entry.problem.empty() && StreamQueue::cost_class(entry.cost_bytes) != k) {
    entry.problem = "cost " + std::to_string(entry.cost_bytes) + " bytes does not belong in class " + std::to_string(k);
  }
  return entry;
}

// Reads an entry from XREADGROUP or XAUTOCLAIM's first array.
Result<std::vector<StreamQueue::Entry>> to_entries(const RedisValue& v, int k, const std::string& what) {
  const auto* list = v.as_array();
  if (list == nullptr) return reply_error(what, v);
  std::vector<StreamQueue::Entry> out;
  for (const auto& e : *list) {
    if (e.is_nil()) continue;  // deleted meanwhile
    auto entry = to_entry(e, k);
    if (!entry) return reply_error(what, v);
    out.push_back(std::move(*entry));
  }
  return out;
}

// The callback of a command whose error replies become kInternal.
template <class T, class F>
RedisClient::Callback expect(std::string what, StreamQueue::Done<T> done, F convert) {
  return [what = std::move(what), done = std::move(done), convert = std::move(convert)](Result<RedisValue> r) {
    if (!r) {
      done(std::move(r).error());
      return;
    }
    if (r->is_error()) {
      done(Error(ErrorCode::kInternal, "redis " + what + ": " + *r->as_error()));
      return;
    }
    done(convert(*r));
  };
}

}  // namespace

namespace {

// KEYS: class streams to try, in order. ARGV: group, consumer.
// Returns {index of the key, id, {field, value, ...}} or false.
const char kReadFitSource[] = R"lua(
for i, key in ipairs(KEYS) do
  local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', key, '>')
  if type(r) == 'table' and r.err == nil and r[1] ~= nil then
    local e = r[1][2][1]
    return {i - 1, e[1], e[2]}
  end
end
return false
)lua";

// XACK then XDEL. KEYS: stream. ARGV: group, id. Returns XACK's count.
const char kAckSource[] = R"lua(
local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return n
)lua";

// Token bucket on the server's clock. KEYS: bucket. ARGV: rate per second,
// burst, cost. Returns {allowed (0/1), tokens left, wait in microseconds}
// (numbers as strings: Lua numbers become integers on the way out).
const char kTokenBucketSource[] = R"lua(
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate / 1000000)
  ts = now
end
local allowed = 0
local wait_us = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait_us = math.ceil((cost - tokens) * 1000000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%d', ts))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, string.format('%.17g', tokens), string.format('%d', wait_us)}
)lua";

const StreamQueue::Script kReadFit{"read_fit", kReadFitSource};
const StreamQueue::Script kAck{"ack", kAckSource};
const StreamQueue::Script kTokenBucket{"token_bucket", kTokenBucketSource};

}  // namespace

StreamQueue::StreamQueue(RedisClient& client, Options options) : client_(client), options_(std::move(options)) {}

int StreamQueue::cost_class(std::int64_t cost_bytes) {
  int k = 0;
  while (k < kMaxClass && (std::int64_t{1} << k) < cost_bytes) ++k;
  return k;
}

int StreamQueue::top_class(std::int64_t budget_bytes) {
  if (budget_bytes < 1) return -1;
  int k = 0;
  while (k < kMaxClass && (std::int64_t{1} << (k + 1)) <= budget_bytes) ++k;
  return k;
}

Status StreamQueue::validate_model(const std::string& model) {
  if (model.empty() || model.size() > 200) {
    return Error(ErrorCode::kInvalidRequest, "queue: a model name has 1..200 bytes");
  }
  for (unsigned char c : model) {
    if (c <= 0x20 || c == 0x7f || c == '{' || c == '}') {
      return Error(ErrorCode::kInvalidRequest, "queue: model name '" + model + "' holds a space, brace or control character");
    }
  }
  return Status::Ok();
}

std::string StreamQueue::stream_key(const std::string& model, int k) const {
  return options_.prefix + ":{" + model + "}:c" + std::to_string(k);
}

void StreamQueue::ensure_group(const std::string& model, int k, Done<bool> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  client_.command({"XGROUP", "CREATE", stream_key(model, k), options_.group, "0", "MKSTREAM"}, options_.timeout,
                  [done = std::move(done)](Result<RedisValue> r) {
                    if (!r) return done(std::move(r).error());
                    if (r->is_error()) {
                      if (r->as_error()->rfind("BUSYGROUP", 0) == 0) return done(false);  // already there
                      return done(Error(ErrorCode::kInternal, "redis XGROUP CREATE: " + *r->as_error()));
                    }
                    done(true);
                  });
}

void StreamQueue::add(const std::string& model, std::int64_t cost_bytes, Fields fields, Done<Entry> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  if (cost_bytes < 0) return done(Error(ErrorCode::kInvalidRequest, "queue: negative cost"));
  int k = cost_class(cost_bytes);
  RedisClient::Args args{"XADD", stream_key(model, k), "*", "cost", std::to_string(cost_bytes)};
  for (const auto& [name, value] : fields) {
    args.push_back(name);
    args.push_back(value);
  }
  Entry entry;
  entry.cost_class = k;
  entry.cost_bytes = cost_bytes;
  entry.fields.emplace_back("cost", std::to_string(cost_bytes));
  entry.fields.insert(entry.fields.end(), fields.begin(), fields.end());
  client_.command(std::move(args), options_.timeout,
                  expect<Entry>("XADD", std::move(done), [entry = std::move(entry)](const RedisValue& v) -> Result<Entry> {
                    if (v.as_string() == nullptr) return reply_error("XADD", v);
                    Entry e = entry;
                    e.id = *v.as_string();
                    return e;
                  }));
}

void StreamQueue::read_fit(const std::string& model, std::int64_t budget_bytes, const std::string& consumer,
                           Done<std::optional<Entry>> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  int top = top_class(budget_bytes);
  if (top < 0) return done(std::optional<Entry>());
  RedisClient::Args keys;
  for (int k = top; k >= 0; --k) keys.push_back(stream_key(model, k));
  eval(kReadFit, std::move(keys), {options_.group, consumer},
       [top, done = std::move(done)](Result<RedisValue> r) {
         if (!r) return done(std::move(r).error());
         if (r->is_nil()) return done(std::optional<Entry>());
         const auto* a = r->as_array();
         if (a == nullptr || a->size() != 3 || !(*a)[0].as_integer()) return done(reply_error("read_fit", *r));
         std::int64_t index = *(*a)[0].as_integer();
         if (index < 0 || index > top) return done(reply_error("read_fit", *r));
         auto entry = to_entry(RedisValue::array({(*a)[1], (*a)[2]}), top - static_cast<int>(index));
         if (!entry) return done(reply_error("read_fit", *r));
         done(std::optional<Entry>(std::move(*entry)));
       });
}

void StreamQueue::ack(const std::string& model, int k, const std::string& id, Done<bool> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  eval(kAck, {stream_key(model, k)}, {options_.group, id}, [done = std::move(done)](Result<RedisValue> r) {
    if (!r) return done(std::move(r).error());
    if (!r->as_integer()) return done(reply_error("ack", *r));
    done(*r->as_integer() > 0);
  });
}

void StreamQueue::touch(const std::string& model, int k, const std::string& consumer, const std::string& id,
                        Done<bool> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  client_.command({"XCLAIM", stream_key(model, k), options_.group, consumer, "0", id, "JUSTID"}, options_.timeout,
                  expect<bool>("XCLAIM", std::move(done), [](const RedisValue& v) -> Result<bool> {
                    if (v.as_array() == nullptr) return reply_error("XCLAIM", v);
                    return !v.as_array()->empty();
                  }));
}

void StreamQueue::autoclaim(const std::string& model, int k, const std::string& consumer, Duration min_idle,
                            int count, Done<std::vector<Entry>> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  if (count < 1) return done(Error(ErrorCode::kInvalidRequest, "queue: autoclaim count below 1"));
  auto idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(min_idle).count();
  client_.command({"XAUTOCLAIM", stream_key(model, k), options_.group, consumer, std::to_string(idle_ms), "0-0",
                   "COUNT", std::to_string(count)},
                  options_.timeout,
                  expect<std::vector<Entry>>("XAUTOCLAIM", std::move(done),
                                             [k](const RedisValue& v) -> Result<std::vector<Entry>> {
                                               const auto* a = v.as_array();
                                               if (a == nullptr || a->size() < 2) return reply_error("XAUTOCLAIM", v);
                                               return to_entries((*a)[1], k, "XAUTOCLAIM");
                                             }));
}

void StreamQueue::pending_info(const std::string& model, int k, const std::string& id,
                               Done<std::optional<PendingInfo>> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  client_.command({"XPENDING", stream_key(model, k), options_.group, id, id, "1"}, options_.timeout,
                  expect<std::optional<PendingInfo>>(
                      "XPENDING", std::move(done), [](const RedisValue& v) -> Result<std::optional<PendingInfo>> {
                        const auto* a = v.as_array();
                        if (a == nullptr) return reply_error("XPENDING", v);
                        if (a->empty()) return std::optional<PendingInfo>();
                        const auto* row = (*a)[0].as_array();
                        if (row == nullptr || row->size() != 4 || (*row)[1].as_string() == nullptr ||
                            !(*row)[2].as_integer() || !(*row)[3].as_integer()) {
                          return reply_error("XPENDING", v);
                        }
                        PendingInfo info;
                        info.consumer = *(*row)[1].as_string();
                        info.idle = std::chrono::milliseconds(*(*row)[2].as_integer());
                        info.deliveries = *(*row)[3].as_integer();
                        return std::optional<PendingInfo>(std::move(info));
                      }));
}

void StreamQueue::length(const std::string& model, int k, Done<std::int64_t> done) {
  if (Status s = validate_model(model); !s) return done(s.error());
  client_.command({"XLEN", stream_key(model, k)}, options_.timeout,
                  expect<std::int64_t>("XLEN", std::move(done), [](const RedisValue& v) -> Result<std::int64_t> {
                    if (!v.as_integer()) return reply_error("XLEN", v);
                    return *v.as_integer();
                  }));
}

void StreamQueue::take_tokens(const std::string& key, double rate_per_s, double burst, double cost,
                              Done<RateDecision> done) {
  if (!(rate_per_s > 0) || !(burst > 0) || !(cost >= 0) || !std::isfinite(rate_per_s) || !std::isfinite(burst) ||
      !std::isfinite(cost)) {
    return done(Error(ErrorCode::kInvalidRequest, "queue: token bucket needs rate > 0, burst > 0, cost >= 0"));
  }
  eval(kTokenBucket, {options_.prefix + ":rate:{" + key + "}"},
       {number_arg(rate_per_s), number_arg(burst), number_arg(cost)}, [done = std::move(done)](Result<RedisValue> r) {
         if (!r) return done(std::move(r).error());
         const auto* a = r->as_array();
         if (a == nullptr || a->size() != 3 || !(*a)[0].as_integer() || (*a)[1].as_string() == nullptr ||
             (*a)[2].as_string() == nullptr) {
           return done(reply_error("token bucket", *r));
         }
         auto tokens = parse_double(*(*a)[1].as_string());
         auto wait_us = parse_int(*(*a)[2].as_string());
         if (!tokens || !wait_us) return done(reply_error("token bucket", *r));
         RateDecision d;
         d.allowed = *(*a)[0].as_integer() == 1;
         d.tokens_left = *tokens;
         d.retry_after_s = static_cast<double>(*wait_us) / 1e6;
         done(d);
       });
}

// --- scripts ---

void StreamQueue::eval(const Script& script, RedisClient::Args keys, RedisClient::Args args, Done<RedisValue> done) {
  TimePoint deadline = Clock::now() + options_.timeout;
  std::string sha;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [s, h] : shas_) {
      if (s == &script) sha = h;
    }
  }
  if (sha.empty()) return load_and_eval(script, std::move(keys), std::move(args), deadline, std::move(done));
  eval_loaded(script, std::move(sha), std::move(keys), std::move(args), deadline, true, std::move(done));
}

void StreamQueue::eval_loaded(const Script& script, std::string sha, RedisClient::Args keys, RedisClient::Args args,
                              TimePoint deadline, bool may_reload, Done<RedisValue> done) {
  RedisClient::Args cmd{"EVALSHA", sha, std::to_string(keys.size())};
  cmd.insert(cmd.end(), keys.begin(), keys.end());
  cmd.insert(cmd.end(), args.begin(), args.end());
  client_.command(std::move(cmd), deadline - Clock::now(),
                  [this, &script, keys = std::move(keys), args = std::move(args), deadline, may_reload,
                   done = std::move(done)](Result<RedisValue> r) mutable {
                    if (!r) return done(std::move(r).error());
                    if (r->is_error()) {
                      // The server lost its scripts (a restart, SCRIPT FLUSH): load it again, once.
                      if (may_reload && r->as_error()->rfind("NOSCRIPT", 0) == 0) {
                        return load_and_eval(script, std::move(keys), std::move(args), deadline, std::move(done));
                      }
                      return done(Error(ErrorCode::kInternal,
                                        std::string("redis script ") + script.name + ": " + *r->as_error()));
                    }
                    done(std::move(*r));
                  });
}

void StreamQueue::load_and_eval(const Script& script, RedisClient::Args keys, RedisClient::Args args,
                                TimePoint deadline, Done<RedisValue> done) {
  script_loads_.fetch_add(1);
  client_.command({"SCRIPT", "LOAD", script.source}, deadline - Clock::now(),
                  [this, &script, keys = std::move(keys), args = std::move(args), deadline,
                   done = std::move(done)](Result<RedisValue> r) mutable {
                    if (!r) return done(std::move(r).error());
                    if (r->as_string() == nullptr) {
                      return done(Error(ErrorCode::kInternal, std::string("redis SCRIPT LOAD ") + script.name + ": " +
                                                                  r->debug_string().substr(0, 300)));
                    }
                    std::string sha = *r->as_string();
                    {
                      std::lock_guard<std::mutex> lock(mu_);
                      bool found = false;
                      for (auto& [s, h] : shas_) {
                        if (s == &script) {
                          h = sha;
                          found = true;
                        }
                      }
                      if (!found) shas_.emplace_back(&script, sha);
                    }
                    eval_loaded(script, std::move(sha), std::move(keys), std::move(args), deadline, false,
                                std::move(done));
                  });
}

}  // namespace vg::queue
