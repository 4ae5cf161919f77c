// Overloaded: an overload set of lambdas, for std::visit over a variant
// (one lambda per alternative; a missing one does not compile unless a
// generic lambda takes it). Header-only; any thread.
#pragma once

namespace vg {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace vg
