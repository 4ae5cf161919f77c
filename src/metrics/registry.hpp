// A Prometheus metrics registry: counter, gauge and histogram families with
// labels, and their text exposition (format 0.0.4). One Registry is created
// by the server and passed to whoever records; there is no global instance.
// Torch-free and Beast-free.
//
// Threads: registration (Registry::counter/gauge/histogram) happens at
// start-up, before recording begins. Recording (inc/set/observe) and lookups
// of labelled children (Family::with) are thread-safe: values are atomics,
// a family's children are created under the family's mutex, and references
// to them stay valid for the registry's life. expose() may run concurrently
// with recording.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace vg::metrics {

/// A monotonically increasing value.
class Counter {
 public:
  void inc(double v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  /// Copies a count kept elsewhere (a monotonically increasing source read at
  /// scrape time); never use it to go down.
  void mirror(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

/// A value that goes up and down.
class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

/// Observations counted into fixed buckets (upper bounds, ascending; +Inf is
/// implicit), with their sum. Lock-free: one atomic per bucket.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  /// Adds observations counted elsewhere (another process's histogram of the
  /// same bounds): `buckets` non-cumulative, bounds + 1 entries (extra or
  /// missing entries are ignored), and their sum.
  void add(const std::vector<std::uint64_t>& buckets, double sum);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> cumulative;  ///< one per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;  ///< == cumulative.back()
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_;  // non-cumulative; bounds_.size() + 1
  std::atomic<double> sum_{0};
};

/// Exponential bucket bounds: start, start*factor, ... (count bounds).
std::vector<double> exponential_buckets(double start, double factor, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

/// The samples of one metric name, one child per combination of label values.
template <typename T>
class Family {
 public:
  Family(std::vector<std::string> label_names, std::vector<double> bounds = {})
      : label_names_(std::move(label_names)), bounds_(std::move(bounds)) {}

  const std::vector<std::string>& label_names() const { return label_names_; }

  /// The child for these label values (in label_names order), created on
  /// first use. Throws std::invalid_argument on a wrong number of values.
  T& with(const std::vector<std::string>& values);

  /// Calls f(values, child) for every child, in label-value order.
  template <typename F>
  void for_each(F&& f) const {
    std::lock_guard lk(mu_);
    for (const auto& [values, child] : children_) f(values, *child);
  }

 private:
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

template <typename T>
T& Family<T>::with(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) throw std::invalid_argument("metrics: wrong number of label values");
  std::lock_guard lk(mu_);
  auto it = children_.find(values);
  if (it == children_.end()) {
    std::unique_ptr<T> child;
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<T>(bounds_);
    } else {
      child = std::make_unique<T>();
    }
    it = children_.emplace(values, std::move(child)).first;
  }
  return *it->second;
}

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// Registers a family. Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and be
  /// unique; label names [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" and,
  /// for histograms, not "le". A violation is a programming error: throws
  /// std::invalid_argument.
  CounterFamily& counter(std::string name, std::string help, std::vector<std::string> labels = {});
  GaugeFamily& gauge(std::string name, std::string help, std::vector<std::string> labels = {});
  HistogramFamily& histogram(std::string name, std::string help, std::vector<double> bounds,
                             std::vector<std::string> labels = {});

  /// The whole registry in the Prometheus text format 0.0.4, families in
  /// registration order.
  std::string expose() const;

 private:
  struct Entry;
  void check_new(const std::string& name, const std::vector<std::string>& labels, MetricType type) const;
  std::vector<std::unique_ptr<Entry>> entries_;
};

/// The Content-Type of expose()'s output.
inline constexpr std::string_view kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

/// Escapes a label value (backslash, double quote, newline).
std::string escape_label_value(std::string_view v);
/// Escapes HELP text (backslash, newline).
std::string escape_help(std::string_view v);
/// A sample value in plain decimal (common/decimal: "0.0005", not "5e-04";
/// integers without a fraction), +Inf, -Inf, NaN.
std::string format_value(double v);

}  // namespace vg::metrics
