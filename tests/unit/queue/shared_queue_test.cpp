// The shared queue's scripts against a real redis-server: add and take by
// class, the waiting count, fenced events (a claim moves the epoch and the
// old holder's events are refused), resume state, cancel before and after a
// take, gateways that are gone, dead letters, heartbeats that do not count
// a delivery, the gateway's check for requests Redis lost, and
// Idempotency-Keys shared by gateways (followers, replay, conflicts).
#include <gtest/gtest.h>

#include "queue/shared_queue.hpp"
#include "redis_fixture.hpp"

namespace vg::queue {
namespace {

using namespace std::chrono_literals;
using testing::RedisFixture;

TEST(SharedQueueIds, FormatAndParse) {
  EXPECT_EQ(format_ids({}), "");
  EXPECT_EQ(format_ids({1, 22, 0}), "1,22,0,");
  auto ids = parse_ids("1,22,0,", 10);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::int32_t>{1, 22, 0}));
  EXPECT_TRUE(parse_ids("", 10)->empty());
  EXPECT_EQ(*parse_ids("5", 10), std::vector<std::int32_t>{5});
  EXPECT_FALSE(parse_ids("1,,2", 10).ok());
  EXPECT_FALSE(parse_ids("1,x", 10).ok());
  EXPECT_FALSE(parse_ids("-1,", 10).ok());
  EXPECT_FALSE(parse_ids("99999999999,", 10).ok());
  EXPECT_FALSE(parse_ids("1,2,3,", 2).ok());
  EXPECT_TRUE(valid_queue_id("gw-host-12-00ff.a_b"));
  EXPECT_FALSE(valid_queue_id(""));
  EXPECT_FALSE(valid_queue_id("a:b"));
  EXPECT_FALSE(valid_queue_id("a{b}"));
  EXPECT_FALSE(valid_queue_id(std::string(65, 'a')));
  EXPECT_EQ(parse_stream_id("1700-3"), std::make_pair(std::uint64_t{1700}, std::uint64_t{3}));
  EXPECT_FALSE(parse_stream_id("1700").has_value());
  EXPECT_FALSE(parse_stream_id("-3").has_value());
  EXPECT_FALSE(parse_stream_id("17x-3").has_value());
  EXPECT_LT(*parse_stream_id("1700-9"), *parse_stream_id("1701-0"));
}

class SharedQueueTest : public RedisFixture {
 protected:
  void SetUp() override {
    RedisFixture::SetUp();
    if (HasFatalFailure()) return;
    c_ = &connect();
    alive("gw1");
  }

  RedisValue eval(const char* script, RedisClient::Args keys, RedisClient::Args args) {
    auto r = eval_sync(*c_, script, std::move(keys), std::move(args), 5s);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r ? *r : RedisValue::error("(error)");
  }
  void alive(const std::string& gw) { run(*c_, {"SET", k_.alive(gw), "1", "PX", "60000"}); }
  /// The alive key an ADD refreshes: the gateway's, except for "gw2" (a
  /// gateway that is gone: its adds came before it died).
  std::string alive_key(const std::string& gw) const { return gw == "gw2" ? "unused:alive" : k_.alive(gw); }
  std::string stream(int k) const { return k_.model_tag("m") + ":c" + std::to_string(k); }
  std::vector<std::string> streams(int top) const {
    std::vector<std::string> out;
    for (int k = top; k >= 0; --k) out.push_back(stream(k));
    return out;
  }
  /// ADD of request `rid` (cost class `k`) from gateway `gw`: the waiting count after it.
  std::int64_t add(const std::string& rid, int k, const std::string& gw = "gw1", const std::string& epoch = "0",
                   const std::string& ids = "") {
    RedisValue v = eval(kAddScript,
                        {stream(k), k_.request("m", rid), k_.ids("m", rid), k_.waiting("m"), k_.bell("m"), alive_key(gw)},
                        {std::to_string(std::int64_t{1} << k), rid, gw, "{\"r\":1}", "60000", std::to_string(k), epoch,
                         ids, "0", "0", k_.group, "60000"});
    const auto* a = v.as_array();
    EXPECT_TRUE(a != nullptr && a->size() >= 2) << v.debug_string();
    return a ? (*a)[1].as_integer().value_or(-1) : -1;
  }
  /// ADD of `rid` (class 3) from `gw` with Idempotency-Key hash `idem` and fingerprint `fp`: the raw reply.
  RedisValue add_idem(const std::string& rid, const std::string& gw, const std::string& fp,
                      const std::string& idem = "vg:q:idem:k1", const std::string& ttl_ms = "60000") {
    return eval(kAddScript,
                {stream(3), k_.request("m", rid), k_.ids("m", rid), k_.waiting("m"), k_.bell("m"), k_.alive(gw), idem},
                {"8", rid, gw, "{\"r\":1}", "60000", "3", "0", "", "0", "0", k_.group, "60000", fp, ttl_ms,
                 gw + "|" + rid, k_.prefix});
  }
  /// The ev fields of a stream's entries (a reply stream or a request's history).
  std::vector<std::string> events(const std::string& key) {
    std::vector<std::string> out;
    RedisValue v = run(*c_, {"XRANGE", key, "-", "+"});
    for (const RedisValue& e : *v.as_array()) {
      const auto& f = *(*e.as_array())[1].as_array();
      for (std::size_t i = 0; i + 1 < f.size(); i += 2) {
        if (*f[i].as_string() == "ev") out.push_back(*f[i + 1].as_string());
      }
    }
    return out;
  }
  std::optional<TakenEntry> take(const std::string& consumer, int top) {
    const auto s = streams(top);
    RedisValue v = eval(kTakeScript, s, {k_.group, consumer, k_.model_tag("m"), k_.prefix});
    auto t = decode_taken(v, s);
    EXPECT_TRUE(t.ok()) << v.debug_string();
    return t.ok() ? *t : std::nullopt;
  }
  std::optional<TakenEntry> claim(const std::string& consumer, int top, int most_deliveries = 2,
                                  const std::string& min_idle_ms = "0") {
    const auto s = streams(top);
    RedisValue v = eval(kClaimScript, s,
                        {k_.group, consumer, min_idle_ms, k_.model_tag("m"), k_.prefix, std::to_string(most_deliveries),
                         "{\"dead\":1}", "1000"});
    auto t = decode_taken(v, s);
    EXPECT_TRUE(t.ok()) << v.debug_string();
    return t.ok() ? *t : std::nullopt;
  }
  /// EMIT of one event as number `seq` of the request (default: the next one).
  std::int64_t emit(const TakenEntry& e, const std::string& rid, std::int64_t epoch, const std::string& ev,
                    const std::string& ids, bool terminal, const std::string& gw = "gw1", std::int64_t seq = 0,
                    bool completed = false) {
    if (seq == 0) {
      RedisValue cur = run(*c_, {"HGET", k_.request("m", rid), "seq"});
      seq = (cur.as_string() ? std::stoll(*cur.as_string()) : 0) + 1;
    }
    std::string flags = std::string(ids.empty() ? "" : "o") + (terminal ? "t" : "") + (completed ? "c" : "");
    RedisValue v = eval(kEmitScript,
                        {k_.request("m", rid), k_.ids("m", rid), k_.reply(gw), k_.alive(gw), e.stream},
                        {std::to_string(epoch), std::to_string(seq), "60000", "1000", rid, k_.group, e.id, "1", ev, ids,
                         flags, k_.prefix});
    return v.as_integer().value_or(-99);
  }
  /// The (epoch, ev) of each entry of gateway `gw`'s reply stream.
  std::vector<std::pair<std::string, std::string>> replies(const std::string& gw = "gw1") {
    RedisValue v = run(*c_, {"XRANGE", k_.reply(gw), "-", "+"});
    std::vector<std::pair<std::string, std::string>> out;
    for (const RedisValue& e : *v.as_array()) {
      const auto& f = *(*e.as_array())[1].as_array();
      std::string epoch, ev;
      for (std::size_t i = 0; i + 1 < f.size(); i += 2) {
        if (*f[i].as_string() == "epoch") epoch = *f[i + 1].as_string();
        if (*f[i].as_string() == "ev") ev = *f[i + 1].as_string();
      }
      out.emplace_back(epoch, ev);
    }
    return out;
  }
  std::int64_t integer(RedisClient::Args args) { return run(*c_, std::move(args)).as_integer().value_or(-99); }
  std::string waiting() {
    RedisValue v = run(*c_, {"GET", k_.waiting("m")});
    return v.as_string() ? *v.as_string() : "nil";
  }

  RedisClient* c_ = nullptr;
  SharedQueueKeys k_;
};

TEST_F(SharedQueueTest, TakeReadsOnlyClassesTheBudgetHoldsAndCountsWaiting) {
  EXPECT_EQ(add("small", 4), 1);
  EXPECT_EQ(add("large", 20), 2);
  EXPECT_EQ(waiting(), "2");
  auto first = take("e1", 10);  // classes 10..0: only the small one
  ASSERT_TRUE(first);
  EXPECT_EQ(first->outcome, "ok");
  EXPECT_EQ(*first->field("rid"), "small");
  EXPECT_EQ(first->epoch, 1);
  EXPECT_EQ(first->deliveries, 1);
  EXPECT_EQ(first->stream, stream(4));
  EXPECT_EQ(waiting(), "1");
  EXPECT_FALSE(take("e1", 10));
  auto second = take("e2", 25);
  ASSERT_TRUE(second);
  EXPECT_EQ(*second->field("rid"), "large");
  EXPECT_EQ(waiting(), "0");
  // A re-add of a request Redis still has changes nothing.
  EXPECT_EQ(add("small", 4), 0);
  EXPECT_FALSE(take("e3", 30));
}

TEST_F(SharedQueueTest, EventsAreFencedByEpochAndAClaimResumesAfterTheSentTokens) {
  add("r", 5);
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  EXPECT_EQ(emit(*held, "r", 1, "a", "7,8,", false), 1);
  EXPECT_EQ(emit(*held, "r", 1, "b", "9,", false), 1);
  // e1 stalls; e2 claims the request (idle past 0 ms): the epoch moves on.
  auto claimed = claim("e2", 10);
  ASSERT_TRUE(claimed);
  EXPECT_EQ(claimed->outcome, "ok");
  EXPECT_EQ(claimed->epoch, 2);
  EXPECT_EQ(claimed->deliveries, 2);
  EXPECT_EQ(claimed->ids, "7,8,9,");
  EXPECT_TRUE(claimed->output_sent);
  // e1 wakes up: refused at the source, nothing reaches the gateway.
  EXPECT_EQ(emit(*held, "r", 1, "late", "10,", false), -3);
  EXPECT_EQ(emit(*claimed, "r", 2, "c", "11,", false), 1);
  EXPECT_EQ(emit(*claimed, "r", 2, "done", "", true), 1);
  const auto got = replies();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], std::make_pair(std::string("1"), std::string("a")));
  EXPECT_EQ(got[1], std::make_pair(std::string("1"), std::string("b")));
  EXPECT_EQ(got[2], std::make_pair(std::string("2"), std::string("c")));
  EXPECT_EQ(got[3], std::make_pair(std::string("2"), std::string("done")));
  // The terminal event acknowledged and removed everything.
  EXPECT_EQ(integer({"XLEN", stream(5)}), 0);
  EXPECT_EQ(integer({"EXISTS", k_.request("m", "r"), k_.ids("m", "r")}), 0);
  EXPECT_EQ(run(*c_, {"XPENDING", stream(5), k_.group}).as_array()->at(0).as_integer(), 0);
  EXPECT_EQ(emit(*claimed, "r", 2, "after", "", false), -2);
}

TEST_F(SharedQueueTest, HeartbeatsKeepAClaimWithoutCountingDeliveries) {
  add("r", 3);
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  RedisValue t = eval(kTouchScript, {held->stream, k_.request("m", "r"), k_.alive("gw1")},
                      {k_.group, "e1", held->id, "1"});
  ASSERT_TRUE(t.as_array()) << t.debug_string();
  EXPECT_EQ(t.as_array()->at(0).as_integer(), 1);
  // Not idle for 60 s: nobody claims it.
  EXPECT_FALSE(claim("e2", 10, 2, "60000"));
  // A heartbeat under an old epoch is refused (and does not take it back).
  auto claimed = claim("e2", 10);
  ASSERT_TRUE(claimed);
  t = eval(kTouchScript, {held->stream, k_.request("m", "r"), k_.alive("gw1")}, {k_.group, "e1", held->id, "1"});
  EXPECT_EQ(t.as_array()->at(0).as_integer(), 0);
  RedisValue p = run(*c_, {"XPENDING", stream(3), k_.group, "-", "+", "10"});
  ASSERT_EQ(p.as_array()->size(), 1u);
  EXPECT_EQ(*p.as_array()->at(0).as_array()->at(1).as_string(), "e2");
  EXPECT_EQ(p.as_array()->at(0).as_array()->at(3).as_integer(), 2);  // two deliveries, heartbeats not counted
}

TEST_F(SharedQueueTest, CancelRemovesAnUntakenRequestAndStopsATakenOne) {
  add("queued", 3);
  add("running", 3);
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  EXPECT_EQ(*held->field("rid"), "queued");
  // Only-if-untaken refuses a taken request.
  EXPECT_EQ(eval(kCancelScript, {k_.request("m", "queued"), k_.ids("m", "queued"), k_.waiting("m"), stream(3)}, {"1"})
                .as_integer(),
            1);
  // The untaken one is removed: no engine sees it, and it no longer waits.
  EXPECT_EQ(waiting(), "1");
  EXPECT_EQ(eval(kCancelScript, {k_.request("m", "running"), k_.ids("m", "running"), k_.waiting("m"), stream(3)}, {"1"})
                .as_integer(),
            0);
  EXPECT_EQ(waiting(), "0");
  EXPECT_FALSE(take("e2", 10));
  // The taken one is marked: its next event is refused, its last one removes it.
  EXPECT_EQ(eval(kCancelScript, {k_.request("m", "queued"), k_.ids("m", "queued"), k_.waiting("m"), stream(3)}, {"0"})
                .as_integer(),
            2);
  EXPECT_EQ(emit(*held, "queued", 1, "x", "1,", false), -1);
  EXPECT_EQ(emit(*held, "queued", 1, "end", "", true), -1);
  EXPECT_TRUE(replies().empty());
  EXPECT_EQ(integer({"EXISTS", k_.request("m", "queued")}), 0);
  EXPECT_EQ(integer({"XLEN", stream(3)}), 0);
}

TEST_F(SharedQueueTest, RequestsOfAGoneGatewayAreDropped) {
  add("orphan", 3, "gw2");  // gw2 has no alive key
  auto t = take("e1", 10);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->outcome, "skip");
  EXPECT_EQ(integer({"EXISTS", k_.request("m", "orphan")}), 0);
  EXPECT_EQ(integer({"XLEN", stream(3)}), 0);
  EXPECT_EQ(waiting(), "0");
  // A held one stops at its next event once the gateway's key lapses.
  alive("gw3");
  add("held", 3, "gw3");
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  run(*c_, {"DEL", k_.alive("gw3")});
  // Nothing is written while it is missing (the engine tries again for a grace period).
  EXPECT_EQ(emit(*held, "held", 1, "x", "", false, "gw3"), -5);
  EXPECT_TRUE(replies("gw3").empty());
  RedisValue touched = eval(kTouchScript, {held->stream, k_.request("m", "held"), k_.alive("gw3")},
                            {k_.group, "e1", held->id, "1"});
  EXPECT_EQ(touched.as_array()->at(0).as_integer(), 2);
  alive("gw3");
  EXPECT_EQ(emit(*held, "held", 1, "x", "", false, "gw3"), 1);
  EXPECT_EQ(replies("gw3").size(), 1u);
}

TEST_F(SharedQueueTest, ABatchSentAgainIsWrittenOnceAndAGapIsRefused) {
  add("r", 3);
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->seq, 0);
  EXPECT_EQ(emit(*held, "r", 1, "a", "1,", false, "gw1", 1), 1);
  EXPECT_EQ(emit(*held, "r", 1, "a", "1,", false, "gw1", 1), 1);  // its reply was lost: sent again
  EXPECT_EQ(emit(*held, "r", 1, "c", "3,", false, "gw1", 3), -4);  // event 2 is missing
  EXPECT_EQ(emit(*held, "r", 1, "b", "2,", false, "gw1", 2), 1);
  ASSERT_EQ(replies().size(), 2u);
  auto claimed = claim("e2", 10);
  ASSERT_TRUE(claimed);
  EXPECT_EQ(claimed->seq, 2);
  EXPECT_EQ(claimed->ids, "1,2,");
}

TEST_F(SharedQueueTest, ARequestClaimedTooOftenIsDeadLetteredAndItsGatewayTold) {
  add("poison", 3);
  ASSERT_TRUE(take("e1", 10));                   // delivery 1: e1 crashes
  auto second = claim("e2", 10, 2);               // delivery 2: e2 crashes
  ASSERT_TRUE(second);
  EXPECT_EQ(second->outcome, "ok");
  auto third = claim("e3", 10, 2);                // delivery 3 > 2: dead
  ASSERT_TRUE(third);
  EXPECT_EQ(third->outcome, "dead");
  EXPECT_EQ(third->deliveries, 3);
  const auto got = replies();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second, "{\"dead\":1}");
  EXPECT_EQ(got[0].first, "3");
  EXPECT_EQ(integer({"XLEN", k_.dead("m")}), 1);
  EXPECT_EQ(integer({"XLEN", stream(3)}), 0);
  EXPECT_EQ(integer({"EXISTS", k_.request("m", "poison")}), 0);
  EXPECT_FALSE(claim("e4", 10, 2));
}

TEST_F(SharedQueueTest, AnEntryWithoutIdsIsReportedBadAndCanBeDeadLettered) {
  run(*c_, {"XGROUP", "CREATE", stream(2), k_.group, "0", "MKSTREAM"});
  run(*c_, {"XADD", stream(2), "*", "cost", "4", "req", "x"});
  auto t = take("e1", 10);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->outcome, "bad");
  eval(kDeadLetterScript, {t->stream, k_.dead("m")}, {k_.group, t->id, "no rid"});
  EXPECT_EQ(integer({"XLEN", k_.dead("m")}), 1);
  EXPECT_EQ(integer({"XLEN", stream(2)}), 0);
  EXPECT_FALSE(take("e1", 10));
}

TEST_F(SharedQueueTest, AReAddResumesAboveTheOldEpochs) {
  add("r", 3, "gw1", "1001", "4,5,");
  auto t = take("e1", 10);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->epoch, 1002);
  EXPECT_EQ(t->ids, "4,5,");
  EXPECT_EQ(emit(*t, "r", 1, "stale", "", false), -3);  // an engine of the lost delivery
}

TEST_F(SharedQueueTest, VerifyNamesTheMissingRequestsAndTheNewestReply) {
  add("kept", 3);
  auto t = take("e1", 10);
  ASSERT_TRUE(t);
  emit(*t, "kept", 1, "x", "", false);
  RedisValue v = eval(kVerifyScript, {k_.reply("gw1"), k_.request("m", "kept"), k_.request("m", "lost")}, {});
  const auto* a = v.as_array();
  ASSERT_TRUE(a && a->size() == 3) << v.debug_string();
  const auto newest = parse_stream_id(*a->at(0).as_string());
  ASSERT_TRUE(newest);
  EXPECT_GT(newest->first, 0u);
  ASSERT_EQ(a->at(1).as_array()->size(), 1u);
  EXPECT_EQ(a->at(1).as_array()->at(0).as_integer(), 1);
}

TEST_F(SharedQueueTest, AnIdempotencyKeySentToAnotherGatewayFollowsTheRequestThenReplaysIt) {
  alive("gw4");
  RedisValue first = add_idem("a", "gw1", "F");
  ASSERT_TRUE(first.as_array()) << first.debug_string();
  EXPECT_EQ(first.as_array()->at(0).as_integer(), 1);
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  EXPECT_EQ(emit(*held, "a", 1, "one", "1,", false), 1);
  // The same key at gw4 while it runs: it follows, and is given what was written so far.
  RedisValue follow = add_idem("b", "gw4", "F");
  const auto* f = follow.as_array();
  ASSERT_TRUE(f && f->size() == 7) << follow.debug_string();
  EXPECT_EQ(f->at(0).as_integer(), 3);
  EXPECT_EQ(*f->at(1).as_string(), k_.request("m", "a"));
  EXPECT_EQ(*f->at(2).as_string(), "run");
  ASSERT_EQ(f->at(3).as_array()->size(), 1u);
  EXPECT_EQ(*f->at(4).as_string(), "gw1");
  EXPECT_EQ(*f->at(5).as_string(), k_.waiting("m"));
  EXPECT_EQ(*f->at(6).as_string(), stream(3));
  EXPECT_EQ(waiting(), "0");  // nothing new was queued
  // Another body with the key: refused.
  EXPECT_EQ(add_idem("c", "gw4", "G").as_array()->at(0).as_integer(), 2);
  EXPECT_EQ(emit(*held, "a", 1, "two", "2,", false), 1);
  EXPECT_EQ(emit(*held, "a", 1, "done", "", true, "gw1", 0, true), 1);
  EXPECT_EQ(events(k_.reply("gw1")), (std::vector<std::string>{"one", "two", "done"}));
  EXPECT_EQ(events(k_.reply("gw4")), (std::vector<std::string>{"two", "done"}));
  RedisValue rid = run(*c_, {"XRANGE", k_.reply("gw4"), "-", "+"});
  EXPECT_EQ(*rid.as_array()->at(0).as_array()->at(1).as_array()->at(1).as_string(), "b");  // under its own rid
  // Completed: the request is gone, its key and history stay for replay.
  EXPECT_EQ(integer({"EXISTS", k_.request("m", "a"), k_.request("m", "a") + ":f"}), 0);
  EXPECT_EQ(*run(*c_, {"HGET", "vg:q:idem:k1", "state"}).as_string(), "done");
  EXPECT_GT(integer({"PTTL", "vg:q:idem:k1"}), 0);
  RedisValue replay = add_idem("d", "gw4", "F");
  ASSERT_TRUE(replay.as_array() && replay.as_array()->size() == 7) << replay.debug_string();
  EXPECT_EQ(*replay.as_array()->at(2).as_string(), "done");
  EXPECT_EQ(replay.as_array()->at(3).as_array()->size(), 3u);
  EXPECT_EQ(integer({"EXISTS", k_.request("m", "a") + ":f"}), 0);  // a replay follows nothing
}

TEST_F(SharedQueueTest, AFailedRequestFreesItsIdempotencyKey) {
  EXPECT_EQ(add_idem("a", "gw1", "F").as_array()->at(0).as_integer(), 1);
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  EXPECT_EQ(emit(*held, "a", 1, "failed", "", true), 1);  // terminal, not completed
  EXPECT_EQ(integer({"EXISTS", "vg:q:idem:k1", k_.request("m", "a") + ":h"}), 0);
  // A retry runs again, under its own request.
  EXPECT_EQ(add_idem("b", "gw1", "F").as_array()->at(0).as_integer(), 1);
  EXPECT_EQ(*run(*c_, {"HGET", "vg:q:idem:k1", "req"}).as_string(), k_.request("m", "b"));
}

TEST_F(SharedQueueTest, AKeyOfAGoneGatewayOrWithoutTtlIsNotFollowed) {
  alive("gw4");
  add_idem("a", "gw4", "F");
  run(*c_, {"DEL", k_.alive("gw4")});  // gw4 died: nobody will read its answer
  EXPECT_EQ(add_idem("b", "gw1", "F").as_array()->at(0).as_integer(), 1);  // runs anew
  // ttl 0: kept while it runs only.
  add_idem("c", "gw1", "F", "vg:q:idem:k2", "0");
  auto held = take("e1", 10);
  ASSERT_TRUE(held);
  while (held && *held->field("rid") != "c") held = take("e1", 10);
  ASSERT_TRUE(held);
  EXPECT_EQ(emit(*held, "c", 1, "done", "", true, "gw1", 0, true), 1);
  EXPECT_EQ(integer({"EXISTS", "vg:q:idem:k2"}), 0);
}

TEST_F(SharedQueueTest, ARequestWhoseClientLeftRunsOnForItsFollowers) {
  alive("gw4");
  add_idem("a", "gw1", "F");
  add_idem("b", "gw4", "F");
  const RedisClient::Args keys{k_.request("m", "a"), k_.ids("m", "a"), k_.waiting("m"), stream(3)};
  // gw1's client leaves: left for gw4's (an engine may still take it).
  EXPECT_EQ(eval(kCancelScript, keys, {"0", ""}).as_integer(), 3);
  EXPECT_EQ(waiting(), "1");
  // gw4 checks that it still follows, and that gw1 lives.
  RedisValue v = eval(kVerifyScript, {k_.reply("gw4"), k_.request("m", "a") + ":f"}, {"gw4|b " + k_.alive("gw1")});
  ASSERT_TRUE(v.as_array() && v.as_array()->size() == 3) << v.debug_string();
  EXPECT_TRUE(v.as_array()->at(1).as_array()->empty());
  EXPECT_TRUE(v.as_array()->at(2).as_array()->empty());
  // The last follower leaves: now it is cancelled (not taken: removed).
  EXPECT_EQ(eval(kCancelScript, keys, {"0", "gw4|b"}).as_integer(), 0);
  EXPECT_EQ(waiting(), "0");
  EXPECT_EQ(integer({"EXISTS", k_.request("m", "a"), "vg:q:idem:k1"}), 0);
  EXPECT_FALSE(take("e1", 10));
  v = eval(kVerifyScript, {k_.reply("gw4"), k_.request("m", "a") + ":f"}, {"gw4|b " + k_.alive("gw9")});
  EXPECT_EQ(v.as_array()->at(1).as_array()->size(), 1u);  // no longer followed
  EXPECT_EQ(v.as_array()->at(2).as_array()->size(), 1u);  // and gw9 is not alive
}

TEST_F(SharedQueueTest, AReAddAfterRedisLostTheRequestFreesItsIdempotencyKey) {
  alive("gw4");
  add_idem("a", "gw1", "F");
  // Redis lost the request (and its history) but kept the key: the gateway adds it again.
  run(*c_, {"DEL", k_.request("m", "a"), k_.request("m", "a") + ":h"});
  RedisValue readd = add_idem("a", "gw1", "");
  ASSERT_TRUE(readd.as_array()) << readd.debug_string();
  EXPECT_EQ(readd.as_array()->at(0).as_integer(), 1);
  EXPECT_EQ(integer({"EXISTS", "vg:q:idem:k1"}), 0);
  EXPECT_EQ(integer({"HEXISTS", k_.request("m", "a"), "idem"}), 0);  // records no history
  // A retry elsewhere runs anew instead of following a request whose first events are gone.
  EXPECT_EQ(add_idem("b", "gw4", "F").as_array()->at(0).as_integer(), 1);
}

TEST_F(SharedQueueTest, ConsumersOfGoneEnginesArePrunedButNeverOnesWithPendingEntries) {
  add("r", 3);
  ASSERT_TRUE(take("busy", 10));  // holds r: pending 1
  // An engine that took and finished its work, then went: a consumer with nothing pending.
  run(*c_, {"XGROUP", "CREATECONSUMER", stream(3), k_.group, "idle"});
  const auto s = streams(10);
  auto consumers = [&] { return run(*c_, {"XINFO", "CONSUMERS", stream(3), k_.group}).as_array()->size(); };
  ASSERT_EQ(consumers(), 2u);
  // Idle for less than an hour: kept.
  EXPECT_EQ(eval(kPruneConsumersScript, s, {k_.group, "3600000", ""}).as_integer(), 0);
  // Only one name: only it.
  EXPECT_EQ(eval(kPruneConsumersScript, s, {k_.group, "-1", "someone-else"}).as_integer(), 0);
  // Any idle one with nothing pending: "idle" goes, "busy" (pending 1) stays.
  EXPECT_GE(eval(kPruneConsumersScript, s, {k_.group, "-1", ""}).as_integer(), 1);
  RedisValue left = run(*c_, {"XINFO", "CONSUMERS", stream(3), k_.group});
  ASSERT_EQ(left.as_array()->size(), 1u);
  EXPECT_EQ(*left.as_array()->at(0).as_array()->at(1).as_string(), "busy");
  EXPECT_EQ(run(*c_, {"XPENDING", stream(3), k_.group}).as_array()->at(0).as_integer(), 1);
}

}  // namespace
}  // namespace vg::queue
