// SIGINT/SIGTERM handling for the server process: a handler installed first
// thing in main records each signal (async-signal-safe: an atomic and a
// semaphore post), so a signal during start-up waits until the server can
// shut down cleanly, and a second one during the drain cuts it short. Never
// the default action: the process always exits through its shutdown path.
// The recorded state is process-wide by nature (signals are); main thread only.
#pragma once

#include "common/clock.hpp"

namespace vg {

/// Installs the handlers (idempotent). Call before any other thread starts
/// work that a signal could interrupt.
void install_shutdown_signal_handlers();

/// Blocks until a SIGINT or SIGTERM has arrived (at any time since the
/// install) that no earlier wait took; returns its number.
int wait_for_shutdown_signal();

/// Takes a pending signal without blocking: its number, or 0 when none.
int take_shutdown_signal();

/// Waits for a pending signal until `deadline`: its number, or 0.
int wait_for_shutdown_signal_until(TimePoint deadline);

}  // namespace vg
