// The inputs a RecordFunction start callback sees, read the same way in every
// build type.
#pragma once

#include <ATen/record_function.h>

namespace vg::testing {

/// `fn.inputs()` for a callback registered with needsInputs(true).
/// RecordFunction::inputs() checks a member that only a debug build of
/// libtorch sets; Debian's libtorch is built with NDEBUG, so a Debug build of
/// ours calling the inline getter reads an uninitialised bool. This reads the
/// inputs from a translation unit compiled with NDEBUG, as libtorch is.
c10::ArrayRef<const c10::IValue> op_inputs(const at::RecordFunction& fn);

}  // namespace vg::testing
