#include "server/process_setup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

namespace vg {

int start_failure_status(const Error& error) { return error.code == ErrorCode::kConfig ? 2 : 1; }

Status private_folder(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    const mode_t old = ::umask(077);
    std::filesystem::create_directories(dir, ec);
    ::umask(old);
    if (ec) return Error(ErrorCode::kConfig, "cannot create the runtime folder " + dir + ": " + ec.message());
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Error(ErrorCode::kConfig, dir + " is not a folder this process can read");
  }
  if (st.st_uid != ::geteuid()) {
    return Error(ErrorCode::kConfig,
                 "runtime folder " + dir + " belongs to another user (uid " + std::to_string(st.st_uid) + ")");
  }
  if ((st.st_mode & 077) != 0) {
    return Error(ErrorCode::kConfig, fmt::format("folder {} has mode {:o}: the engine socket needs a folder only its "
                                                 "user can use (mode 0700)",
                                                 dir, st.st_mode & 0777));
  }
  return Status::Ok();
}

std::string default_runtime_dir() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) return std::string(xdg) + "/vramgate";
  return "/tmp/vramgate-" + std::to_string(::geteuid());
}

std::string engine_executable_path() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return kEngineExecutable;  // then found on PATH by execvp
  return (self.parent_path() / kEngineExecutable).string();
}

int exec_engine_executable(char** argv) {
  const std::string path = engine_executable_path();
  argv[0] = const_cast<char*>(path.c_str());
  ::execvp(path.c_str(), argv);
  std::cerr << "vramgate: cannot run " << path << " (built and installed beside vramgate): " << std::strerror(errno)
            << "\n";
  return 1;
}

}  // namespace vg
