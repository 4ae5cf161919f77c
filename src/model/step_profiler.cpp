// The Chrome-trace writer of model/step_profiler.hpp. The JSON is written by
// hand: the model core links no JSON library, and the format is a flat list
// of one kind of object.
#include "model/step_profiler.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace vg {
namespace {

/// `text` as a JSON string literal (quotes, backslashes and control bytes escaped).
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// A number of microseconds with nanosecond precision, never in exponent form.
std::string micros(double us) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", us);
  return buf;
}

std::string event_json(const TraceEvent& e, long pid) {
  return "{\"ph\":\"X\",\"cat\":" + json_string(e.category) + ",\"name\":" + json_string(e.name) +
         ",\"ts\":" + micros(e.start_us) + ",\"dur\":" + micros(e.duration_us) + ",\"pid\":" + std::to_string(pid) +
         ",\"tid\":" + std::to_string(e.thread) + "}";
}

}  // namespace

Status write_chrome_trace(const std::filesystem::path& path, std::span<const TraceEvent> events) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) {
    return Error(ErrorCode::kConfig, "cannot write the trace to " + path.string() + ": " + std::strerror(errno));
  }
  const long pid = static_cast<long>(::getpid());
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (std::size_t i = 0; i < events.size(); ++i) {
    out << event_json(events[i], pid) << (i + 1 < events.size() ? ",\n" : "\n");
  }
  out << "]}\n";
  out.close();
  if (!out) return Error(ErrorCode::kConfig, "cannot write the trace to " + path.string() + ": write failed");
  return Status::Ok();
}

}  // namespace vg
