# VG_BUNDLED_DEPS=ON: the header-only dependencies come from one folder
# (VG_BUNDLED_INCLUDE_DIR, filled by `scripts/gpu-check prepare` from the
# Debian packages) instead of the installed packages: Boost (Beast, Asio and
# Boost.JSON, the latter compiled once from <boost/json/src.hpp>), spdlog and
# fmt (SPDLOG_HEADER_ONLY / FMT_HEADER_ONLY), CLI11 and toml++
# (TOML_HEADER_ONLY). It defines the same targets the packages' CMake files
# do, so the rest of the build does not change. Used to build on a machine
# that has a compiler and a libtorch but none of these packages.
set(VG_BUNDLED_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/gpu-bundle/include"
    CACHE PATH "Folder holding the bundled boost/, spdlog/, fmt/, CLI/ and toml++/ headers")
foreach(dir boost spdlog fmt CLI toml++)
  if(NOT EXISTS "${VG_BUNDLED_INCLUDE_DIR}/${dir}")
    message(FATAL_ERROR "VG_BUNDLED_DEPS: ${VG_BUNDLED_INCLUDE_DIR}/${dir} is missing "
                        "(run `scripts/gpu-check prepare` on a Debian machine with the packages installed)")
  endif()
endforeach()

add_library(vg_bundled_headers INTERFACE)
target_include_directories(vg_bundled_headers SYSTEM INTERFACE "${VG_BUNDLED_INCLUDE_DIR}")
target_compile_definitions(vg_bundled_headers INTERFACE FMT_HEADER_ONLY SPDLOG_FMT_EXTERNAL TOML_HEADER_ONLY=1)

add_library(Boost::headers ALIAS vg_bundled_headers)
add_library(spdlog::spdlog ALIAS vg_bundled_headers)
add_library(CLI11::CLI11 ALIAS vg_bundled_headers)
add_library(tomlplusplus::tomlplusplus ALIAS vg_bundled_headers)
set(Boost_INCLUDE_DIRS "${VG_BUNDLED_INCLUDE_DIR}")

# Boost.JSON's implementation, compiled once for the whole program.
add_library(vg_boost_json STATIC "${CMAKE_CURRENT_LIST_DIR}/boost_json_src.cpp")
target_link_libraries(vg_boost_json PUBLIC vg_bundled_headers)
add_library(Boost::json ALIAS vg_boost_json)

# The compiled C libraries, as static archives copied from the Debian
# packages into VG_BUNDLED_LIB_DIR: PCRE2 (8-bit) and OpenSSL's libcrypto.
set(VG_BUNDLED_LIB_DIR "${PROJECT_SOURCE_DIR}/gpu-bundle/lib"
    CACHE PATH "Folder holding the bundled libpcre2-8.a and libcrypto.a")
foreach(lib pcre2-8 crypto)
  if(NOT EXISTS "${VG_BUNDLED_LIB_DIR}/lib${lib}.a")
    message(FATAL_ERROR "VG_BUNDLED_DEPS: ${VG_BUNDLED_LIB_DIR}/lib${lib}.a is missing")
  endif()
endforeach()
add_library(PkgConfig::PCRE2 INTERFACE IMPORTED)
target_link_libraries(PkgConfig::PCRE2 INTERFACE vg_bundled_headers "${VG_BUNDLED_LIB_DIR}/libpcre2-8.a")
add_library(OpenSSL::Crypto INTERFACE IMPORTED)
target_link_libraries(OpenSSL::Crypto INTERFACE vg_bundled_headers "${VG_BUNDLED_LIB_DIR}/libcrypto.a"
                      ${CMAKE_DL_LIBS} Threads::Threads)

message(STATUS "Bundled dependencies from ${VG_BUNDLED_INCLUDE_DIR}")
