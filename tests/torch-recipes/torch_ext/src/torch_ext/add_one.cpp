// One op registered with the dispatcher: links libc10 and libtorch_cpu from the installed torch.
// The light headers (not torch/extension.h) keep the compile to seconds.
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

static at::Tensor add_one(const at::Tensor& x) { return x.add(1); }

TORCH_LIBRARY(torch_ext, m) { m.def("add_one(Tensor x) -> Tensor", &add_one); }

// A module with nothing in it: importing it loads the library, which registers the op.
static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module_def); }
