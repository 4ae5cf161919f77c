// The shared request queue of Redis mode: the keys and the atomic scripts
// that gateways (queue_service.hpp) and engines (queue_worker.hpp) use to
// place requests, take them by free budget, send their events back, fence
// a late engine out, and hand work of a dead engine to another.
//
// Keys (P = the prefix, "vg:q"; M = a model; the braces keep one model's
// keys in one Redis Cluster slot):
//   P:{M}:c<k>         stream of the requests of cost class k (stream_queue.hpp), group "engines";
//                      its pending-entries list is exactly the taken, unfinished set
//   P:{M}:r:<rid>      hash of one request: epoch (the fencing epoch of its current delivery),
//                      taken (0/1), cancel (0/1), gw (its gateway), entry, cls, sent (prompt
//                      logprobs sent), out (any text sent), seq (events written so far)
//                      (and idem, ittl: its Idempotency-Key's hash and replay ttl ms; orphan: its
//                      own client left, it runs for its followers)
//   P:{M}:r:<rid>:ids  the token ids of choice 0 sent so far, "id,id,..." (what a new engine resumes after)
//   P:{M}:r:<rid>:h    a request with an Idempotency-Key: every event written (fields epoch, ev),
//                      kept for the key's replay ttl after it completed
//   P:{M}:r:<rid>:f    set of its followers "gw|rid": requests of other gateways with the same key,
//                      to whose reply streams its events are written too
//   P:idem:<sha256>    hash of one Idempotency-Key (scoped by API key): req (the request hash
//                      holding it), fp (the fingerprint of route + body), state (run | done)
//   P:{M}:waiting      requests added and not yet taken (queue position)
//   P:{M}:bell         a short list an engine blocks on (BLPOP) to learn of new entries at once
//   P:{M}:dead         dead letters: entries delivered too often, or malformed (bounded)
//   P:gw:<id>:out      one gateway's reply stream: fields rid, epoch, ev (a wire-encoded event)
//   P:gw:<id>:alive    present while that gateway lives (expiry a few heartbeats)
//   P:engines          hash: engine id -> its registration (JSON, refreshed every heartbeat)
//
// Fencing. Each take or claim increments the request's epoch and returns it;
// an engine's every event goes through one script that writes it only while
// the hash still holds that epoch, the request is not cancelled and its
// gateway lives. So once another engine has claimed a request, the first
// one's late events are refused at the source (and it stops), and the
// gateway, which also drops any event of an older epoch than it has seen,
// never shows a token twice. The new engine resumes after the ids the
// scripts recorded, which are exactly the tokens written before its claim.
//
// Scripts touch keys they compute from their arguments (all in one model's
// slot but the gateway's), so Redis Cluster is not supported: one Redis,
// with replicas and Sentinel for failover (docs/redis.md "Redis mode").
//
// Threads: pure functions and script text; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "queue/redis_client.hpp"

namespace vg::queue {

/// How long Redis keeps a request's keys (its hash, ids and history) after
/// each write, in ms: longer than any request deadline.
inline constexpr std::int64_t kRequestTtlMs = 3600 * 1000;

/// Key names of the shared queue under one prefix.
struct SharedQueueKeys {
  std::string prefix = "vg:q";
  std::string group = "engines";

  std::string model_tag(const std::string& model) const { return prefix + ":{" + model + "}"; }
  std::string request(const std::string& model, const std::string& rid) const { return model_tag(model) + ":r:" + rid; }
  std::string ids(const std::string& model, const std::string& rid) const { return request(model, rid) + ":ids"; }
  std::string waiting(const std::string& model) const { return model_tag(model) + ":waiting"; }
  std::string bell(const std::string& model) const { return model_tag(model) + ":bell"; }
  std::string dead(const std::string& model) const { return model_tag(model) + ":dead"; }
  std::string reply(const std::string& gateway) const { return prefix + ":gw:" + gateway + ":out"; }
  std::string alive(const std::string& gateway) const { return prefix + ":gw:" + gateway + ":alive"; }
  std::string engines() const { return prefix + ":engines"; }
};

/// Request ids and gateway/engine ids: 1..64 of [A-Za-z0-9_.-] (they become
/// parts of key names).
bool valid_queue_id(const std::string& id);

/// "12,7,9" <-> ids. Parsing is strict: kInvalidRequest on anything but
/// comma-terminated or comma-separated decimal int32 values, or more than `max` of them.
std::string format_ids(const std::vector<std::int32_t>& ids);
Result<std::vector<std::int32_t>> parse_ids(const std::string& text, std::size_t max);

/// Runs a Lua script with EVAL (Redis caches the compiled body by its
/// digest, so sending the text costs bytes only; and EVAL, unlike EVALSHA,
/// cannot fail after a Redis restart emptied the script cache). Error
/// replies become kInternal with Redis's text.
Result<RedisValue> eval_sync(RedisClient& client, const char* script, RedisClient::Args keys, RedisClient::Args args,
                             Duration timeout);
void eval_async(RedisClient& client, const char* script, RedisClient::Args keys, RedisClient::Args args,
                Duration timeout, std::function<void(Result<RedisValue>)> done);

/// An entry as a take or claim script returns it.
struct TakenEntry {
  std::string stream;  ///< the class stream it is in
  std::string id;      ///< its entry id
  std::vector<std::pair<std::string, std::string>> fields;
  /// "ok": taken, with epoch/ids/sent/out set; "skip": cancelled, finished or its
  /// gateway is gone (acknowledged and removed); "bad": no rid or gw field
  /// (left pending, for the caller to dead-letter); "dead": delivered too
  /// often (dead-lettered by the script, its gateway told).
  std::string outcome;
  std::int64_t epoch = 0;
  std::string ids;
  bool prompt_sent = false;
  bool output_sent = false;
  std::int64_t deliveries = 0;
  std::int64_t seq = 0;  ///< events of the request written so far (the next one is seq + 1)
  /// The value of a field, or nullptr.
  const std::string* field(const std::string& name) const;
};

/// Decodes a take/claim reply ({stream index or id, ...}); nullopt for "none".
Result<std::optional<TakenEntry>> decode_taken(const RedisValue& v, const std::vector<std::string>& streams);

// The scripts (their KEYS and ARGV are documented in shared_queue.cpp).
extern const char kAddScript[];
extern const char kTakeScript[];
extern const char kClaimScript[];
extern const char kEmitScript[];
extern const char kTouchScript[];
extern const char kCancelScript[];
extern const char kDeadLetterScript[];
extern const char kVerifyScript[];
extern const char kPruneConsumersScript[];

/// A stream entry id "MS-SEQ" as a pair (ordered as Redis orders them); nullopt when malformed.
std::optional<std::pair<std::uint64_t, std::uint64_t>> parse_stream_id(const std::string& id);

}  // namespace vg::queue
