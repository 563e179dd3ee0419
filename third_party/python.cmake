# Python headers of the interpreter we build for (only limited-API calls are used: abi3).
execute_process(
  COMMAND ${DSV4_PYTHON} -c "import sysconfig; print(sysconfig.get_paths()['include'])"
  OUTPUT_VARIABLE DSV4_PYTHON_INCLUDE OUTPUT_STRIP_TRAILING_WHITESPACE)
