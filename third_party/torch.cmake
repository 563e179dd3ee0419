# Locates torch's headers and libraries through the given Python interpreter (no vendoring).
execute_process(
  COMMAND ${DSV4_PYTHON} -c "import torch, os; print(os.path.dirname(torch.__file__))"
  OUTPUT_VARIABLE DSV4_TORCH_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dsv4: '${DSV4_PYTHON}' cannot import torch; install torch >= 2.10 first")
endif()
set(DSV4_TORCH_INCLUDE "${DSV4_TORCH_ROOT}/include")
set(DSV4_TORCH_LIB "${DSV4_TORCH_ROOT}/lib")
message(STATUS "dsv4: torch at ${DSV4_TORCH_ROOT}")

# Stable-ABI code calls the C shims in libtorch_cpu; link it even under --as-needed.
function(dsv4_link_torch target)
  target_link_directories(${target} PRIVATE ${DSV4_TORCH_LIB})
  target_link_libraries(${target} PRIVATE -Wl,--no-as-needed torch_cpu c10 -Wl,--as-needed)
endfunction()
