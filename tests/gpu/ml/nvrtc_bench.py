"""NVRTC compile time in this process: one fixed templated kernel compiled four times
for sm_90 through the libnvrtc that torch ships (the one cuDNN loads).

Usage: python3 nvrtc_bench.py [cuda|nocuda]   (cuda: touch the GPU through torch first)
NVRTC_EXTRA: more NVRTC options (the program log is printed then).
Prints the result code, the cubin size and each compile's milliseconds. Natively the
driver helps NVRTC (private table da9151d3): later compiles are fast. Owns nothing else.
"""
import ctypes, glob, os, sys, time
import torch  # its NVRTC, as cuDNN loads it
paths = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libnvrtc.so.1*")) + ["libnvrtc.so.13"]
lib = ctypes.CDLL(paths[0])
src = b"""
template <int N> __device__ float poly(float x) {
  float r = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) r = r * x + i;
  return r;
}
extern "C" __global__ void k(float* o, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = in[i];
  o[i] = poly<2048>(x) + poly<1025>(x * 2) + poly<513>(x * 3);
}
"""
if len(sys.argv) > 1 and sys.argv[1] == "cuda":
    torch.zeros(1, device="cuda")  # the driver (Flyt's under flyt run) loaded and used
opts = [b"--gpu-architecture=sm_90", b"--std=c++17"] + [o.encode() for o in os.environ.get("NVRTC_EXTRA", "").split()]
arr = (ctypes.c_char_p * len(opts))(*opts)
times = []
for r in range(4):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
    t = time.perf_counter()
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    times.append((time.perf_counter() - t) * 1000)
    size = ctypes.c_size_t(); lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    if os.environ.get("NVRTC_EXTRA"):
        n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
        print("log", r, log.value.decode(errors="replace")[:2000])
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
print("nvrtc", sys.argv[1:], "rc", rc, "cubin", size.value, "ms", [round(x, 1) for x in times])
