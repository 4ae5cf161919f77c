// What a server process sets up around itself: its exit status on a failed
// start, the private runtime folder engine sockets live in, and the engine
// executable. Torch-free (the gateway binary links it); main thread only.
#pragma once

#include <string>

#include "common/error.hpp"

namespace vg {

/// The exit status of a start-up that failed with `error`: 2 when the
/// settings or the device cannot serve (kConfig: a device too small for the
/// model and one request, memory other processes hold included), else 1.
int start_failure_status(const Error& error);

/// A folder only this user can use: created 0700 when missing; an existing
/// one must belong to this user and give others no access (it is never
/// changed). Errors: kConfig saying what is wrong.
Status private_folder(const std::string& dir);

/// $XDG_RUNTIME_DIR/vramgate, or /tmp/vramgate-UID without it.
std::string default_runtime_dir();

/// The file name of the executable that loads models (libtorch): engine
/// processes, `serve --in-process` and `plan` run in it.
inline constexpr const char* kEngineExecutable = "vramgate-engine";

/// kEngineExecutable in the folder of this process's own executable
/// (/proc/self/exe): the two are built and installed side by side.
std::string engine_executable_path();

/// Replaces this process with the engine executable, run with `argv` (its
/// argv[0] becomes the engine executable's path), so the same command line
/// runs where libtorch is loaded. Returns only when exec failed, with the
/// exit status 1 after printing why on stderr.
int exec_engine_executable(char** argv);

}  // namespace vg
