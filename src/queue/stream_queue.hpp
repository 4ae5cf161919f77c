// The shared queue's primitives on Redis Streams: one stream per model and
// cost class, one consumer group of engines per stream, so that the
// group's pending-entries list is exactly the set of entries some engine
// has taken (and reserved bytes for) but not finished. Also a token bucket
// shared by every gateway. Each operation is one round trip (scripts run
// atomically on the server), over a RedisClient.
//
// Cost classes. An entry of cost c bytes goes to class k = ceil(log2(c)),
// the smallest k with c <= 2^k (c <= 1 is class 0), so every entry of class
// k costs at most 2^k bytes. An engine with a free budget of B bytes reads
// only classes k <= floor(log2(B)): whatever it reads fits, without looking
// at the entry first. It tries the largest such class first, so that large
// entries (which few engines can hold) are not starved by small ones.
//
// Keys: PREFIX:{MODEL}:c<k> (the braces keep a model's streams in one Redis
// Cluster slot, as the scripts touching several of them need).
//
// Threads: any thread may call any method; callbacks run on the client's
// strand (see redis_client.hpp), exactly once. Pending callbacks refer to
// the StreamQueue: close the client before destroying it. Errors: those of
// RedisClient::command, plus kInvalidRequest for a bad model name or cost,
// and kInternal when Redis answers with an error reply or a reply of an
// unexpected shape (its text in the message).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "queue/redis_client.hpp"

namespace vg::queue {

class StreamQueue {
 public:
  struct Options {
    std::string prefix = "vg:q";     ///< key prefix
    std::string group = "engines";   ///< the consumer group of every stream
    Duration timeout = std::chrono::seconds(1);  ///< deadline of each operation (all its round trips)
  };

  using Fields = std::vector<std::pair<std::string, std::string>>;

  /// One entry as read from a stream. Its fields are validated here only as
  /// far as the queue needs: a field "cost" holding a decimal byte count of
  /// this class. When that fails, `problem` says why (the entry is still in
  /// the pending list, for the caller to dead-letter).
  struct Entry {
    int cost_class = 0;
    std::string id;          ///< the stream entry id, e.g. "1700000000000-0"
    std::int64_t cost_bytes = 0;
    Fields fields;           ///< all fields, "cost" included, in stream order
    std::string problem;     ///< empty when valid
  };

  /// An entry's place in the pending-entries list.
  struct PendingInfo {
    std::string consumer;      ///< who holds it
    Duration idle{};           ///< since its last delivery (or touch)
    std::int64_t deliveries = 0;  ///< times it was delivered (read or claimed)
  };

  /// A token-bucket decision.
  struct RateDecision {
    bool allowed = false;
    double tokens_left = 0;    ///< after this take
    double retry_after_s = 0;  ///< when refused: until enough tokens are back
  };

  struct Stats {
    std::uint64_t script_loads = 0;  ///< SCRIPT LOADs sent (first use, or after NOSCRIPT)
  };

  template <class T>
  using Done = std::function<void(Result<T>)>;

  static constexpr int kMaxClass = 62;

  StreamQueue(RedisClient& client, Options options);

  /// Class of a cost: ceil(log2(cost)), 0 for cost <= 1. kMaxClass at most.
  static int cost_class(std::int64_t cost_bytes);
  /// The largest class a budget holds: floor(log2(budget)), -1 below 1 byte.
  static int top_class(std::int64_t budget_bytes);
  /// The stream of one model and class. Model names: 1..200 bytes, no
  /// braces, spaces or control characters (validate_model).
  std::string stream_key(const std::string& model, int cost_class) const;
  static Status validate_model(const std::string& model);

  /// XGROUP CREATE key group 0 MKSTREAM; an existing group is success.
  void ensure_group(const std::string& model, int cost_class, Done<bool> done);
  /// XADD of an entry of `cost_bytes` to its class's stream, with a "cost"
  /// field first, then `fields`. Gives the entry (id and class).
  void add(const std::string& model, std::int64_t cost_bytes, Fields fields, Done<Entry> done);
  /// XREADGROUP COUNT 1 for `consumer` from the largest class at or below
  /// `budget_bytes` that has a new entry (one script). nullopt: none.
  void read_fit(const std::string& model, std::int64_t budget_bytes, const std::string& consumer,
                Done<std::optional<Entry>> done);
  /// XACK and XDEL of a finished entry: true when it was pending.
  void ack(const std::string& model, int cost_class, const std::string& id, Done<bool> done);
  /// A heartbeat: resets the entry's idle time for `consumer` (its holder)
  /// without counting a delivery (XCLAIM ... JUSTID). false: not pending.
  void touch(const std::string& model, int cost_class, const std::string& consumer, const std::string& id,
             Done<bool> done);
  /// XAUTOCLAIM: entries of a class idle longer than `min_idle` move to
  /// `consumer` (their delivery count goes up by one), at most `count`,
  /// scanning from the start of the pending list.
  void autoclaim(const std::string& model, int cost_class, const std::string& consumer, Duration min_idle,
                 int count, Done<std::vector<Entry>> done);
  /// XPENDING of one entry: nullopt when it is not pending.
  void pending_info(const std::string& model, int cost_class, const std::string& id,
                    Done<std::optional<PendingInfo>> done);
  /// XLEN of a class's stream (entries not yet acknowledged and deleted).
  void length(const std::string& model, int cost_class, Done<std::int64_t> done);

  /// Takes `cost` tokens from the bucket PREFIX:rate:{key}, which refills at
  /// `rate_per_s` up to `burst`, on Redis's clock (TIME), so every gateway
  /// shares one bucket whatever its own clock says. One atomic script.
  void take_tokens(const std::string& key, double rate_per_s, double burst, double cost, Done<RateDecision> done);

  Stats stats() const { return Stats{script_loads_.load()}; }

  /// A Lua script of the queue (static storage), run with EVALSHA and
  /// loaded with SCRIPT LOAD on first use or after NOSCRIPT.
  struct Script {
    const char* name;
    const char* source;
  };

 private:
  void eval(const Script& script, RedisClient::Args keys, RedisClient::Args args, Done<RedisValue> done);
  void eval_loaded(const Script& script, std::string sha, RedisClient::Args keys, RedisClient::Args args,
                   TimePoint deadline, bool may_reload, Done<RedisValue> done);
  void load_and_eval(const Script& script, RedisClient::Args keys, RedisClient::Args args, TimePoint deadline,
                     Done<RedisValue> done);

  RedisClient& client_;
  const Options options_;
  std::mutex mu_;
  std::vector<std::pair<const Script*, std::string>> shas_;  // guarded by mu_: SCRIPT LOAD's answers
  std::atomic<std::uint64_t> script_loads_{0};
};

}  // namespace vg::queue
