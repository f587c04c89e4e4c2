// A stand-in for Flyt's libcuda.so.1 in nvml_test: flyt_nvml_snapshot answers
// what the test sets (nvml_fake_set), so that Flyt's libnvidia-ml.so.1 can be
// driven through malformed, large and failing snapshots without a server.
#include <cstddef>
#include <cstring>
#include <mutex>
#include <vector>

namespace {
std::mutex g_mu;
int g_rc = 100;  // CUDA_ERROR_NO_DEVICE until the test says otherwise
std::vector<unsigned char> g_bytes;
int g_calls = 0;
unsigned long long g_cuda_calls = 0;  // what flyt_client_stats reports
}  // namespace

// The test's stand-in for the CUDA calls the process makes between queries.
extern "C" __attribute__((visibility("default"))) void nvml_fake_cuda_call() {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_cuda_calls;
}

// The contract of src/client/api_device.cc: out[0] sync, out[1] async calls.
extern "C" __attribute__((visibility("default"))) int flyt_client_stats(unsigned long long* out,
                                                                        int n) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (out == nullptr || n < 2) return 0;
  out[0] = g_cuda_calls + static_cast<unsigned long long>(g_calls);  // snapshots are calls too
  out[1] = 0;
  return 2;
}

extern "C" __attribute__((visibility("default"))) void nvml_fake_set(int rc, const void* bytes,
                                                                     size_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_rc = rc;
  g_bytes.assign(static_cast<const unsigned char*>(bytes),
                 static_cast<const unsigned char*>(bytes) + n);
}

extern "C" __attribute__((visibility("default"))) int nvml_fake_calls() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_calls;
}

// The contract of src/client/api_nvml.cc.
extern "C" __attribute__((visibility("default"))) int flyt_nvml_snapshot(void* buf, size_t cap,
                                                                         size_t* len) {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_calls;
  *len = 0;
  if (g_rc != 0) return g_rc;
  *len = g_bytes.size();
  if (g_bytes.size() > cap) return 1;  // CUDA_ERROR_INVALID_VALUE: call again with more room
  std::memcpy(buf, g_bytes.data(), g_bytes.size());
  return 0;
}
