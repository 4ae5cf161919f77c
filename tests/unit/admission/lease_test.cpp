// Lease: released exactly once across moves, explicit release and destruction.
#include "admission/lease.hpp"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace vg {
namespace {

struct FakeLedger final : LeaseLedger {
  std::vector<std::pair<RequestId, std::int64_t>> returned;
  void return_lease(RequestId id, std::int64_t bytes) noexcept override { returned.emplace_back(id, bytes); }
};

TEST(Lease, DestructorReleasesOnce) {
  auto ledger = std::make_shared<FakeLedger>();
  {
    Lease lease(ledger, 7, 100);
    EXPECT_TRUE(lease.held());
    EXPECT_EQ(lease.bytes(), 100);
    EXPECT_EQ(lease.request_id(), 7u);
    EXPECT_TRUE(ledger->returned.empty());
  }
  ASSERT_EQ(ledger->returned.size(), 1u);
  EXPECT_EQ(ledger->returned[0], std::make_pair(RequestId{7}, std::int64_t{100}));
}

TEST(Lease, ExplicitReleaseThenDestructorReleasesOnce) {
  auto ledger = std::make_shared<FakeLedger>();
  {
    Lease lease(ledger, 1, 50);
    lease.release();
    EXPECT_FALSE(lease.held());
    EXPECT_EQ(lease.bytes(), 0);
    lease.release();
    EXPECT_EQ(ledger->returned.size(), 1u);
  }
  EXPECT_EQ(ledger->returned.size(), 1u);
}

TEST(Lease, MovedFromReleasesNothing) {
  auto ledger = std::make_shared<FakeLedger>();
  {
    Lease a(ledger, 3, 30);
    Lease b(std::move(a));
    EXPECT_FALSE(a.held());  // NOLINT(bugprone-use-after-move): checking the moved-from state
    EXPECT_TRUE(b.held());
    EXPECT_EQ(b.bytes(), 30);
    a.release();
    EXPECT_TRUE(ledger->returned.empty());
    Lease c;
    c = std::move(b);
    EXPECT_TRUE(ledger->returned.empty());
    EXPECT_EQ(c.bytes(), 30);
  }
  ASSERT_EQ(ledger->returned.size(), 1u);
  EXPECT_EQ(ledger->returned[0].first, 3u);
}

TEST(Lease, MoveAssignReleasesTheOldReservationFirst) {
  auto ledger = std::make_shared<FakeLedger>();
  Lease a(ledger, 1, 10);
  Lease b(ledger, 2, 20);
  a = std::move(b);
  ASSERT_EQ(ledger->returned.size(), 1u);
  EXPECT_EQ(ledger->returned[0].first, 1u);
  EXPECT_EQ(a.request_id(), 2u);
  a.release();
  ASSERT_EQ(ledger->returned.size(), 2u);
  EXPECT_EQ(ledger->returned[1], std::make_pair(RequestId{2}, std::int64_t{20}));
}

TEST(Lease, EmptyLeaseHoldsNothing) {
  Lease lease;
  EXPECT_FALSE(lease);
  EXPECT_EQ(lease.bytes(), 0);
  lease.release();  // no ledger: nothing to do, must not crash
}

TEST(Lease, KeepsItsLedgerAliveUntilReleased) {
  struct CountingLedger final : LeaseLedger {
    std::shared_ptr<int> returns;
    explicit CountingLedger(std::shared_ptr<int> r) : returns(std::move(r)) {}
    void return_lease(RequestId, std::int64_t) noexcept override { ++*returns; }
  };
  auto returns = std::make_shared<int>(0);
  auto ledger = std::make_shared<CountingLedger>(returns);
  std::weak_ptr<CountingLedger> weak = ledger;
  Lease lease(ledger, 9, 1);
  ledger.reset();
  EXPECT_FALSE(weak.expired());
  lease.release();
  EXPECT_EQ(*returns, 1);
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace vg
