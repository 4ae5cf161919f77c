// Boost.JSON's implementation for VG_BUNDLED_DEPS builds (cmake/bundled_deps.cmake),
// where there is no libboost_json to link: compiled once, header-only.
#include <boost/json/src.hpp>
