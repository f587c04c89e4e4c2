/* A stand-in for NVIDIA's libcuda.so.1 (tests/e2e, nvml_query notflyt): a driver
 * library without Flyt's flyt_nvml_snapshot, which Flyt's libnvidia-ml.so.1 must
 * refuse with NVML_ERROR_LIBRARY_NOT_FOUND. */
int cuInit(unsigned int flags) {
  (void)flags;
  return 100; /* CUDA_ERROR_NO_DEVICE */
}
