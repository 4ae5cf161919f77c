// Clang thread-safety annotations and an annotated mutex (admission, the
// gateway). libstdc++'s std::mutex carries no capability attributes, so the
// analysis needs this thin wrapper. Under other compilers the macros vanish.
// The analysis runs only when clang gets -Wthread-safety on its command line
// (a #pragma cannot switch it on).
// Any thread; the types are as thread-safe as std::mutex.
#pragma once

#include <mutex>

#if defined(__clang__)
#define VG_TSA(x) __attribute__((x))
#else
#define VG_TSA(x)
#endif

#define VG_CAPABILITY(name) VG_TSA(capability(name))
#define VG_SCOPED_CAPABILITY VG_TSA(scoped_lockable)
#define VG_GUARDED_BY(mu) VG_TSA(guarded_by(mu))
#define VG_REQUIRES(...) VG_TSA(requires_capability(__VA_ARGS__))
#define VG_EXCLUDES(...) VG_TSA(locks_excluded(__VA_ARGS__))
#define VG_ACQUIRE(...) VG_TSA(acquire_capability(__VA_ARGS__))
#define VG_RELEASE(...) VG_TSA(release_capability(__VA_ARGS__))

namespace vg {

/// std::mutex with a capability, so members can be VG_GUARDED_BY it.
class VG_CAPABILITY("mutex") Mutex {
 public:
  void lock() VG_ACQUIRE() { mu_.lock(); }
  void unlock() VG_RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

/// Scoped lock of a Mutex (the analysis sees acquire/release).
class VG_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) VG_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() VG_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

/// Scoped lock of a Mutex that can be released and taken again inside its
/// scope: what std::condition_variable_any waits with (it calls unlock()
/// and lock()), and what a loop that works off the lock uses.
class VG_SCOPED_CAPABILITY MutexUniqueLock {
 public:
  explicit MutexUniqueLock(Mutex& mu) VG_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexUniqueLock() VG_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexUniqueLock(const MutexUniqueLock&) = delete;
  MutexUniqueLock& operator=(const MutexUniqueLock&) = delete;
  void lock() VG_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }
  void unlock() VG_RELEASE() {
    held_ = false;
    mu_.unlock();
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

}  // namespace vg
