// `import dsv4._C_cuda` loads this library and so registers the CUDA kernels of every dsv4 op (the schemas come
// from dsv4._C, imported first); it exposes no Python names.
#include <Python.h>

PyMODINIT_FUNC PyInit__C_cuda(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C_cuda", nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
