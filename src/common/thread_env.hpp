// How the compute thread pools wait when they have no work: libgomp (the
// OpenMP runtime libtorch runs its intra-op threads on) and OpenBLAS read
// their wait settings from the environment once, when they are loaded, before
// main() runs; by default their idle threads spin (OpenBLAS for about 2^28
// cycles after each call, with sched_yield), taking the cores the HTTP and
// engine threads need between steps. vramgate sets passive waits and, when
// they were not in its environment, starts itself again with them. Torch-free;
// called once, first thing in main(), on the main thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace vg {

/// The variables that make the pools wait passively: OMP_WAIT_POLICY=PASSIVE
/// (idle OpenMP threads sleep at once) and OPENBLAS_THREAD_TIMEOUT=4 (idle
/// OpenBLAS threads sleep after 2^4 cycles, the shortest it allows).
std::vector<std::pair<std::string, std::string>> passive_thread_waits();

/// Those of passive_thread_waits() that `getenv` does not already define
/// (a value the user set is kept); empty when VRAMGATE_THREAD_ENV is set.
std::vector<std::pair<std::string, std::string>> missing_thread_waits(const char* (*getenv)(const char*));

/// Sets those of passive_thread_waits() that are missing, and
/// VRAMGATE_THREAD_ENV=1, in this process's environment without restarting
/// it: for a process that loads no thread pool itself and starts those that
/// do (they inherit the variables). Does nothing when VRAMGATE_THREAD_ENV is set.
void set_passive_thread_waits();

/// When some of passive_thread_waits() are missing from the environment:
/// sets them and VRAMGATE_THREAD_ENV=1, then re-executes /proc/self/exe with
/// `argv`, so the runtimes read them as they load. Returns (having changed
/// nothing that matters) when nothing is missing, when VRAMGATE_THREAD_ENV is
/// set (the restarted process, or a user who opts out), or when exec fails.
void ensure_passive_thread_waits(char** argv);

}  // namespace vg
