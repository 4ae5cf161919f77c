// One engine's counters across its processes (see counter_carry.hpp).
#include "tracking/counter_carry.hpp"

namespace vg::tracking {

CounterTotals CounterTotals::of(const AdmissionState& state) {
  CounterTotals t;
  t.counters = state.counters;
  for (const DeviceState& d : state.devices) t.devices[d.name] += d.counters;
  return t;
}

CounterTotals& CounterTotals::operator+=(const CounterTotals& other) {
  counters += other.counters;
  for (const auto& [name, c] : other.devices) devices[name] += c;
  return *this;
}

void CounterTotals::raise_to(const CounterTotals& other) {
  counters.raise_to(other.counters);
  for (const auto& [name, c] : other.devices) devices[name].raise_to(c);
}

void CounterCarry::begin(const ProcessId& process) {
  if (process_ == process) return;
  retired_ += current_;
  current_ = CounterTotals{};
  process_ = process;
}

void CounterCarry::report(const CounterTotals& totals) { current_.raise_to(totals); }

CounterTotals CounterCarry::totals() const {
  CounterTotals t = retired_;
  t += current_;
  return t;
}

void CounterCarry::apply(AdmissionState& state) const {
  const CounterTotals t = totals();
  state.counters = t.counters;
  for (DeviceState& d : state.devices) {
    const auto it = t.devices.find(d.name);
    d.counters = it == t.devices.end() ? DeviceCounters{} : it->second;
  }
}

}  // namespace vg::tracking
