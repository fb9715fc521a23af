// The canary's device code and its Python bindings, in one HIP translation unit.
#include <Python.h>
#include <hip/hip_runtime.h>

__global__ void add_one(int *values, int count) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) values[i] += 1;
}

// Number of visible GPUs; 0 when the runtime finds none (no exception: this runs on build hosts).
static PyObject *device_count(PyObject *self, PyObject *args) {
  int count = 0;
  if (hipGetDeviceCount(&count) != hipSuccess) count = 0;
  return PyLong_FromLong(count);
}

// Runs add_one on the GPU over [0..n) and returns the sum of the results (n*(n+1)/2).
static PyObject *run_kernel(PyObject *self, PyObject *args) {
  int n = 256;
  if (!PyArg_ParseTuple(args, "|i", &n)) return NULL;
  int *host = (int *)PyMem_Malloc(sizeof(int) * n);
  int *device = NULL;
  for (int i = 0; i < n; ++i) host[i] = i;
  hipError_t err = hipMalloc((void **)&device, sizeof(int) * n);
  if (err == hipSuccess) err = hipMemcpy(device, host, sizeof(int) * n, hipMemcpyHostToDevice);
  if (err == hipSuccess) {
    hipLaunchKernelGGL(add_one, dim3((n + 255) / 256), dim3(256), 0, 0, device, n);
    err = hipGetLastError();
  }
  if (err == hipSuccess) err = hipMemcpy(host, device, sizeof(int) * n, hipMemcpyDeviceToHost);
  if (device) hipFree(device);
  long long total = 0;
  for (int i = 0; i < n; ++i) total += host[i];
  PyMem_Free(host);
  if (err != hipSuccess) {
    PyErr_Format(PyExc_RuntimeError, "HIP error: %s", hipGetErrorString(err));
    return NULL;
  }
  return PyLong_FromLongLong(total);
}

static PyObject *runtime_version(PyObject *self, PyObject *args) {
  int version = 0;
  if (hipRuntimeGetVersion(&version) != hipSuccess) version = 0;
  return PyLong_FromLong(version);
}

static PyMethodDef methods[] = {
    {"device_count", device_count, METH_NOARGS, "Number of visible AMD GPUs (0 if none)."},
    {"run_kernel", run_kernel, METH_VARARGS, "Run a kernel on the GPU; returns sum(i + 1 for i < n)."},
    {"runtime_version", runtime_version, METH_NOARGS, "HIP runtime version number (0 if unknown)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_canary", NULL, -1, methods};

PyMODINIT_FUNC PyInit__canary(void) { return PyModule_Create(&module); }
