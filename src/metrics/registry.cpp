// Registry, Histogram and the text exposition (see registry.hpp).
#include "metrics/registry.hpp"

#include <algorithm>
#include <cmath>
#include <variant>

#include "common/decimal.hpp"

namespace vg::metrics {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<std::uint64_t>[bounds_.size() + 1]) {
  for (std::size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  // Upper bounds are inclusive: v lands in the first bucket with v <= bound.
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  buckets_[static_cast<std::size_t>(it - bounds_.begin())].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

void Histogram::add(const std::vector<std::uint64_t>& buckets, double sum) {
  const std::size_t n = std::min(buckets.size(), bounds_.size() + 1);
  for (std::size_t i = 0; i < n; ++i) buckets_[i].fetch_add(buckets[i], std::memory_order_relaxed);
  sum_.fetch_add(sum, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::uint64_t running = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  // The count is derived from the buckets so that +Inf == _count always holds.
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

namespace {

bool valid_name(std::string_view n, bool colon) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string label_block(const std::vector<std::string>& names, const std::vector<std::string>& values,
                        const std::string& extra = {}) {
  if (names.empty() && extra.empty()) return {};
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i] + "=\"" + escape_label_value(values[i]) + '"';
  }
  if (!extra.empty()) {
    if (!names.empty()) out += ',';
    out += extra;
  }
  return out + "}";
}

}  // namespace

struct Registry::Entry {
  std::string name;
  std::string help;
  MetricType type;
  std::variant<std::unique_ptr<CounterFamily>, std::unique_ptr<GaugeFamily>, std::unique_ptr<HistogramFamily>> family;
};

Registry::Registry() = default;
Registry::~Registry() = default;

void Registry::check_new(const std::string& name, const std::vector<std::string>& labels, MetricType type) const {
  if (!valid_name(name, true)) throw std::invalid_argument("metrics: bad metric name '" + name + "'");
  for (const auto& e : entries_) {
    if (e->name == name) throw std::invalid_argument("metrics: '" + name + "' registered twice");
  }
  for (const auto& l : labels) {
    if (!valid_name(l, false) || l.rfind("__", 0) == 0 || (type == MetricType::kHistogram && l == "le")) {
      throw std::invalid_argument("metrics: bad label name '" + l + "' on '" + name + "'");
    }
  }
}

CounterFamily& Registry::counter(std::string name, std::string help, std::vector<std::string> labels) {
  check_new(name, labels, MetricType::kCounter);
  auto fam = std::make_unique<CounterFamily>(std::move(labels));
  CounterFamily& ref = *fam;
  if (ref.label_names().empty()) ref.with({});  // unlabelled: the sample exists from the start
  entries_.push_back(std::make_unique<Entry>(Entry{std::move(name), std::move(help), MetricType::kCounter, std::move(fam)}));
  return ref;
}

GaugeFamily& Registry::gauge(std::string name, std::string help, std::vector<std::string> labels) {
  check_new(name, labels, MetricType::kGauge);
  auto fam = std::make_unique<GaugeFamily>(std::move(labels));
  GaugeFamily& ref = *fam;
  if (ref.label_names().empty()) ref.with({});
  entries_.push_back(std::make_unique<Entry>(Entry{std::move(name), std::move(help), MetricType::kGauge, std::move(fam)}));
  return ref;
}

HistogramFamily& Registry::histogram(std::string name, std::string help, std::vector<double> bounds,
                                     std::vector<std::string> labels) {
  check_new(name, labels, MetricType::kHistogram);
  if (bounds.empty() || !std::is_sorted(bounds.begin(), bounds.end()) ||
      std::adjacent_find(bounds.begin(), bounds.end()) != bounds.end() || !std::isfinite(bounds.back())) {
    throw std::invalid_argument("metrics: histogram '" + name + "' needs finite ascending bucket bounds");
  }
  auto fam = std::make_unique<HistogramFamily>(std::move(labels), std::move(bounds));
  HistogramFamily& ref = *fam;
  if (ref.label_names().empty()) ref.with({});
  entries_.push_back(
      std::make_unique<Entry>(Entry{std::move(name), std::move(help), MetricType::kHistogram, std::move(fam)}));
  return ref;
}

std::string Registry::expose() const {
  std::string out;
  for (const auto& e : entries_) {
    static constexpr const char* kTypes[] = {"counter", "gauge", "histogram"};
    out += "# HELP " + e->name + " " + escape_help(e->help) + "\n";
    out += "# TYPE " + e->name + " " + kTypes[static_cast<int>(e->type)] + "\n";
    if (auto* c = std::get_if<std::unique_ptr<CounterFamily>>(&e->family)) {
      (*c)->for_each([&](const std::vector<std::string>& values, const Counter& x) {
        out += e->name + label_block((*c)->label_names(), values) + " " + format_value(x.value()) + "\n";
      });
    } else if (auto* g = std::get_if<std::unique_ptr<GaugeFamily>>(&e->family)) {
      (*g)->for_each([&](const std::vector<std::string>& values, const Gauge& x) {
        out += e->name + label_block((*g)->label_names(), values) + " " + format_value(x.value()) + "\n";
      });
    } else {
      const auto& h = std::get<std::unique_ptr<HistogramFamily>>(e->family);
      h->for_each([&](const std::vector<std::string>& values, const Histogram& x) {
        const Histogram::Snapshot s = x.snapshot();
        const auto& names = h->label_names();
        for (std::size_t i = 0; i < s.cumulative.size(); ++i) {
          const std::string le = i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf";
          out += e->name + "_bucket" + label_block(names, values, "le=\"" + le + "\"") + " " +
                 format_value(static_cast<double>(s.cumulative[i])) + "\n";
        }
        out += e->name + "_sum" + label_block(names, values) + " " + format_value(s.sum) + "\n";
        out += e->name + "_count" + label_block(names, values) + " " + format_value(static_cast<double>(s.count)) + "\n";
      });
    }
  }
  return out;
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escape_help(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_value(double v) { return format_decimal(v); }

}  // namespace vg::metrics
