// Deferred wake-ups for a thread's batch of work. While a WakeupBatch is
// open on a thread (the engine thread, over one turn of its loop: admission,
// a decode step and the events it produced), a consumer that the thread
// hands work to (a wire channel's writer thread) is woken once, when the
// batch closes, instead of at each message: a step's events for one gateway
// cost one wake-up and one socket write, however many sequences it ran.
//
// Threads: each thread has its own batch (thread-local); batches nest, and
// the outermost one runs the deferred wake-ups as it closes, on that thread.
#pragma once

#include <functional>

namespace vg {

class WakeupBatch {
 public:
  WakeupBatch();
  ~WakeupBatch();
  WakeupBatch(const WakeupBatch&) = delete;
  WakeupBatch& operator=(const WakeupBatch&) = delete;

  /// True while a batch is open on the calling thread.
  static bool open();
  /// Runs `wake` when the calling thread's outermost batch closes, once per
  /// `key` (a later call with a key already deferred in this batch is
  /// dropped); at once when no batch is open. `wake` must not throw.
  static void defer(const void* key, std::function<void()> wake);
};

}  // namespace vg
