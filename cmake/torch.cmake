# libtorch: found with find_package(Torch) (Debian's libtorch-dev, or any
# libtorch with a TorchConfig.cmake), or, with VG_TORCH_DIR, taken straight
# from a torch Python package folder (pip wheels: their TorchConfig.cmake
# wants a full CUDA toolkit, which a GPU machine may lack). Sets
# TORCH_INCLUDE_DIRS, TORCH_LIBRARIES and VG_TORCH_HAS_CUDA, and defines the
# target `cuda_syntax_check`.
set(VG_TORCH_DIR "" CACHE PATH "A torch Python package folder (python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))'); empty: find_package(Torch)")
set(VG_TORCH_CXX11_ABI "" CACHE STRING "_GLIBCXX_USE_CXX11_ABI of VG_TORCH_DIR's libraries (torch.compiled_with_cxx11_abi(): 1 or 0)")
set(VG_CUDA_INCLUDE_DIR "" CACHE PATH "With VG_TORCH_DIR and a CUDA torch: the folder holding cuda_runtime_api.h")
set(VG_CUDART_LIBRARY "" CACHE FILEPATH "With VG_TORCH_DIR and a CUDA torch: libcudart.so (any version suffix)")

set(VG_TORCH_HAS_CUDA OFF)
if(VG_TORCH_DIR)
  set(TORCH_INCLUDE_DIRS "${VG_TORCH_DIR}/include" "${VG_TORCH_DIR}/include/torch/csrc/api/include")
  # Kineto's headers, where the wheel ships them: the profiler headers the
  # step profiler includes name none of them today (they forward-declare
  # Kineto's types), but a later torch may.
  if(EXISTS "${VG_TORCH_DIR}/include/kineto")
    list(APPEND TORCH_INCLUDE_DIRS "${VG_TORCH_DIR}/include/kineto")
  endif()
  set(_vg_libs "")
  foreach(lib torch torch_cpu c10)
    find_library(VG_TORCH_LIB_${lib} ${lib} PATHS "${VG_TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
    list(APPEND _vg_libs "${VG_TORCH_LIB_${lib}}")
  endforeach()
  find_library(VG_TORCH_LIB_c10_cuda c10_cuda PATHS "${VG_TORCH_DIR}/lib" NO_DEFAULT_PATH)
  find_library(VG_TORCH_LIB_torch_cuda torch_cuda PATHS "${VG_TORCH_DIR}/lib" NO_DEFAULT_PATH)
  if(VG_TORCH_LIB_c10_cuda AND VG_TORCH_LIB_torch_cuda)
    if(NOT VG_CUDA_INCLUDE_DIR OR NOT VG_CUDART_LIBRARY)
      message(FATAL_ERROR "${VG_TORCH_DIR} has CUDA: set VG_CUDA_INCLUDE_DIR and VG_CUDART_LIBRARY")
    endif()
    set(VG_TORCH_HAS_CUDA ON)
    list(APPEND TORCH_INCLUDE_DIRS "${VG_CUDA_INCLUDE_DIR}")
    # torch_cuda registers the CUDA kernels from static initialisers; no
    # symbol of it is referenced, so keep --as-needed from dropping it.
    list(APPEND _vg_libs "-Wl,--no-as-needed,${VG_TORCH_LIB_torch_cuda},--as-needed" "${VG_TORCH_LIB_c10_cuda}"
         "${VG_CUDART_LIBRARY}")
  endif()
  set(TORCH_LIBRARIES ${_vg_libs})
  if(NOT VG_TORCH_CXX11_ABI STREQUAL "")
    # Every translation unit must agree with libtorch on std::string's ABI.
    add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${VG_TORCH_CXX11_ABI})
  endif()
  message(STATUS "libtorch from ${VG_TORCH_DIR} (CUDA: ${VG_TORCH_HAS_CUDA})")
else()
  find_package(Torch REQUIRED)
  if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
    # A libtorch built with the pre-C++11 string ABI (older pip wheels): every
    # translation unit must use it. ABI 1 is the compiler's default.
    add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=0)
  endif()
  if(TARGET c10_cuda OR TARGET torch_cuda OR "${TORCH_LIBRARIES}" MATCHES "c10_cuda|torch_cuda")
    set(VG_TORCH_HAS_CUDA ON)
    if(TARGET c10_cuda)
      list(APPEND TORCH_LIBRARIES c10_cuda)
    endif()
    if(TARGET CUDA::cudart)
      list(APPEND TORCH_LIBRARIES CUDA::cudart)
    elseif(CUDA_CUDART_LIBRARY)
      list(APPEND TORCH_LIBRARIES "${CUDA_CUDART_LIBRARY}")
    endif()
  endif()
endif()
message(STATUS "CUDA device (cuda:N): ${VG_TORCH_HAS_CUDA}")

# `ninja cuda_syntax_check`: compiles src/device/cuda_device.cpp and
# cuda_graph.cpp with
# -fsyntax-only against this libtorch's c10/cuda headers and the CUDA
# toolkit's headers, so a build without a CUDA libtorch still checks it.
# Not part of `all`. A CPU-only libtorch may lack the generated
# c10/cuda/impl/cuda_cmake_macros.h; a one-line stand-in is written for it.
if(NOT VG_TORCH_HAS_CUDA)
  find_path(VG_CUDA_SYNTAX_INCLUDE_DIR cuda_runtime_api.h
            PATHS "$ENV{CUDA_HOME}/include" /usr/local/cuda/include /usr/include NO_CACHE)
  find_path(VG_C10_CUDA_DIR c10/cuda/CUDACachingAllocator.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH NO_CACHE)
  if(VG_CUDA_SYNTAX_INCLUDE_DIR AND VG_C10_CUDA_DIR)
    set(_vg_stub "${PROJECT_BINARY_DIR}/cuda_syntax_stub")
    if(NOT EXISTS "${VG_C10_CUDA_DIR}/c10/cuda/impl/cuda_cmake_macros.h")
      file(WRITE "${_vg_stub}/c10/cuda/impl/cuda_cmake_macros.h" "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    endif()
    set(_vg_isystem "")
    foreach(dir "${_vg_stub}" ${TORCH_INCLUDE_DIRS} "${VG_CUDA_SYNTAX_INCLUDE_DIR}")
      if(NOT dir STREQUAL "/usr/include")  # already searched; -isystem would break #include_next
        list(APPEND _vg_isystem -isystem "${dir}")
      endif()
    endforeach()
    set(_vg_cuda_check)
    foreach(file cuda_device.cpp cuda_graph.cpp)
      list(APPEND _vg_cuda_check
           COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Werror
                   -I${PROJECT_SOURCE_DIR}/src ${_vg_isystem} ${PROJECT_SOURCE_DIR}/src/device/${file})
    endforeach()
    add_custom_target(cuda_syntax_check ${_vg_cuda_check}
      COMMENT "Syntax check of src/device/cuda_device.cpp and cuda_graph.cpp against the CUDA headers"
      VERBATIM)
    set(VG_CUDA_SYNTAX_CHECK ON)
  endif()
endif()
