// WakeupBatch (see wakeup_batch.hpp).
#include "common/wakeup_batch.hpp"

#include <utility>
#include <vector>

namespace vg {
namespace {

struct ThreadBatch {
  int depth = 0;
  std::vector<std::pair<const void*, std::function<void()>>> deferred;
};

ThreadBatch& this_thread_batch() {
  thread_local ThreadBatch batch;
  return batch;
}

}  // namespace

WakeupBatch::WakeupBatch() { ++this_thread_batch().depth; }

WakeupBatch::~WakeupBatch() {
  ThreadBatch& b = this_thread_batch();
  if (--b.depth > 0) return;
  // A wake-up may send more (and so defer again): those run at once, since
  // the batch is closed now.
  auto deferred = std::move(b.deferred);
  b.deferred.clear();
  for (auto& [key, wake] : deferred) wake();
}

bool WakeupBatch::open() { return this_thread_batch().depth > 0; }

void WakeupBatch::defer(const void* key, std::function<void()> wake) {
  ThreadBatch& b = this_thread_batch();
  if (b.depth == 0) {
    wake();
    return;
  }
  for (const auto& d : b.deferred) {
    if (d.first == key) return;
  }
  b.deferred.emplace_back(key, std::move(wake));
}

}  // namespace vg
