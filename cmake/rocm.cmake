# _C_cuda for a ROCm torch (DSV4_ENABLE_ROCM): the portable tier and the CUDA bindings are hipified into the build
# tree with torch.utils.hipify (tools/check/hipify_portable.py) and built with HIP. The Hopper tier is CUDA only; an op
# without a kernel here runs its reference (python/dsv4/rocm_fallback.py).
set(DSV4_HIP_ARCHS "gfx90a;gfx942" CACHE STRING "AMD GPU targets of the portable tier (semicolon list)")
set(CMAKE_HIP_ARCHITECTURES "${DSV4_HIP_ARCHS}")  # before enable_language: no GPU query at configure time
enable_language(HIP)
find_package(hip REQUIRED)

# Hipified at configure time; any edit of the CUDA sources re-runs configure and so re-hipifies.
set(DSV4_HIPIFIED_DIR "${CMAKE_BINARY_DIR}/hipified")
file(GLOB_RECURSE DSV4_HIPIFY_INPUTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/csrc/cuda/* ${PROJECT_SOURCE_DIR}/csrc/common/*
  ${PROJECT_SOURCE_DIR}/csrc/api/*)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${DSV4_HIPIFY_INPUTS})
execute_process(
  COMMAND ${DSV4_PYTHON} ${PROJECT_SOURCE_DIR}/tools/check/hipify_portable.py ${PROJECT_SOURCE_DIR}/csrc ${DSV4_HIPIFIED_DIR}
    --bindings
  OUTPUT_VARIABLE DSV4_HIP_UNITS ERROR_VARIABLE hipify_log RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dsv4: hipifying the portable tier failed:\n${hipify_log}")
endif()
string(REPLACE "\n" ";" DSV4_HIP_UNITS "${DSV4_HIP_UNITS}")
set(DSV4_HIP_KERNELS ${DSV4_HIP_UNITS})
list(FILTER DSV4_HIP_KERNELS INCLUDE REGEX "\\.hip$")
set(DSV4_HIP_BINDINGS ${DSV4_HIP_UNITS})
list(FILTER DSV4_HIP_BINDINGS EXCLUDE REGEX "\\.hip$")

set_source_files_properties(${DSV4_HIP_KERNELS} PROPERTIES LANGUAGE HIP)
add_library(dsv4_hip_portable OBJECT ${DSV4_HIP_KERNELS})
set_target_properties(dsv4_hip_portable PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(dsv4_hip_portable PRIVATE ${DSV4_HIPIFIED_DIR}/csrc)
# Exact rounding like the CPU tiers (nvcc's --fmad=false): hip-clang contracts a * b + c by default.
target_compile_options(dsv4_hip_portable PRIVATE -ffp-contract=off -fvisibility=hidden)
target_compile_features(dsv4_hip_portable PRIVATE cxx_std_17)

# The bindings are host C++ against the HIP runtime; USE_CUDA: torch's current-stream shim (HIP streams on ROCm).
add_library(dsv4_hip_bindings OBJECT ${DSV4_HIP_BINDINGS})
target_include_directories(dsv4_hip_bindings PRIVATE ${DSV4_HIPIFIED_DIR}/csrc ${DSV4_PYTHON_INCLUDE}
  ${DSV4_TORCH_INCLUDE})
target_compile_options(dsv4_hip_bindings PRIVATE ${DSV4_COMMON_OPTS})
target_compile_definitions(dsv4_hip_bindings PRIVATE ${DSV4_COMMON_DEFS} DSV4_BACKEND_CUDA USE_CUDA USE_ROCM)
target_link_libraries(dsv4_hip_bindings PRIVATE hip::host)

if(NOT DSV4_CUDA_COMPILE_ONLY)
  add_library(_C_cuda MODULE $<TARGET_OBJECTS:dsv4_hip_bindings> $<TARGET_OBJECTS:dsv4_hip_portable>)
  set_target_properties(_C_cuda PROPERTIES LINKER_LANGUAGE HIP PREFIX "" SUFFIX ".abi3.so"
    LIBRARY_OUTPUT_DIRECTORY "${DSV4_OUTPUT_DIR}")
  dsv4_link_torch(_C_cuda)
  # ROCm torch exports the current-stream shim from libtorch_hip; the HIP runtime is the one torch loads.
  target_link_libraries(_C_cuda PRIVATE -Wl,--no-as-needed torch_hip -Wl,--as-needed hip::host)
endif()
