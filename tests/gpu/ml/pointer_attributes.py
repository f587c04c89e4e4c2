#!/usr/bin/env python3
"""cuPointerGetAttribute for each kind of memory a program meets (cudaMalloc,
cudaMallocAsync from the default pool, cudaMallocHost, cudaHostAlloc mapped), every
attribute 1..17 that answers a number, printed as key=value lines: run it natively and
under `flyt run` and compare. Needs CuPy (allocations) and ctypes (the driver call)."""
import ctypes
import sys


def main():
    import cupy
    rt = cupy.cuda.runtime
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    rt.free(rt.malloc(16))  # a context
    stream = cupy.cuda.Stream(non_blocking=True)
    kinds = {
        "malloc": rt.malloc(1 << 20),
        "malloc_async": rt.mallocAsync(1 << 20, stream.ptr),
        "host": rt.hostAlloc(1 << 16, 0),
        "host_mapped": rt.hostAlloc(1 << 16, 2),  # cudaHostAllocMapped
    }
    stream.synchronize()
    # attribute -> width: CONTEXT(1) and HOST_POINTER(4), P2P_TOKENS(5) are not numbers
    attrs = {2: 4, 6: 4, 7: 8, 8: 4, 9: 4, 10: 4, 11: 8, 12: 8, 13: 4, 14: 8, 15: 4, 16: 8,
             17: 8}
    for name, ptr in kinds.items():
        for a, width in attrs.items():
            val = ctypes.c_uint64(0) if width == 8 else ctypes.c_uint32(0)
            rc = cuda.cuPointerGetAttribute(ctypes.byref(val), a, ptr)
            v = val.value
            if a in (7, 11, 12, 17):  # buffer id, range start, range size, pool handle
                v = "nonzero" if v else 0
                if a == 11:
                    v = "base" if val.value == ptr else "other"
            print(f"{name}.attr{a}={'rc' + str(rc) if rc else v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
