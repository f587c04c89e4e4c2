// stdout interposers for NVIDIA's driver inside flyt-server (see
// server/device_output.h). Exported from the executable (-rdynamic), so the
// driver's calls bind to them; anything not aimed at stdout from a session
// thread that is executing a call goes to the real function.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "server/device_output.h"

namespace {

template <typename F>
F Real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

bool Capture(FILE* stream) {
  return flyt::server::DeviceOutputSink() != nullptr && stream == stdout;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int vfprintf(FILE* stream, const char* fmt, va_list ap) {
  if (!Capture(stream)) {
    static auto real = Real<int (*)(FILE*, const char*, va_list)>("vfprintf");
    return real(stream, fmt, ap);
  }
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n > 0) {
    size_t at = flyt::server::DeviceOutputSink()->size();
    flyt::server::DeviceOutputSink()->resize(at + static_cast<size_t>(n) + 1);
    vsnprintf(flyt::server::DeviceOutputSink()->data() + at, static_cast<size_t>(n) + 1, fmt, ap);
    flyt::server::DeviceOutputSink()->resize(at + static_cast<size_t>(n));
  }
  return n;
}

__attribute__((visibility("default"))) int fprintf(FILE* stream, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vfprintf(stream, fmt, ap);
  va_end(ap);
  return n;
}

__attribute__((visibility("default"))) int printf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vfprintf(stdout, fmt, ap);
  va_end(ap);
  return n;
}

__attribute__((visibility("default"))) int vprintf(const char* fmt, va_list ap) {
  return vfprintf(stdout, fmt, ap);
}

__attribute__((visibility("default"))) size_t fwrite(const void* p, size_t size, size_t n,
                                                     FILE* stream) {
  if (!Capture(stream)) {
    static auto real = Real<size_t (*)(const void*, size_t, size_t, FILE*)>("fwrite");
    return real(p, size, n, stream);
  }
  flyt::server::DeviceOutputSink()->append(static_cast<const char*>(p), size * n);
  return n;
}

__attribute__((visibility("default"))) int fputs(const char* s, FILE* stream) {
  if (!Capture(stream)) {
    static auto real = Real<int (*)(const char*, FILE*)>("fputs");
    return real(s, stream);
  }
  flyt::server::DeviceOutputSink()->append(s);
  return 1;
}

__attribute__((visibility("default"))) int puts(const char* s) {
  if (flyt::server::DeviceOutputSink() == nullptr) {
    static auto real = Real<int (*)(const char*)>("puts");
    return real(s);
  }
  flyt::server::DeviceOutputSink()->append(s);
  flyt::server::DeviceOutputSink()->push_back('\n');
  return 1;
}

__attribute__((visibility("default"))) ssize_t write(int fd, const void* p, size_t n) {
  if (fd != STDOUT_FILENO || flyt::server::DeviceOutputSink() == nullptr) {
    static auto real = Real<ssize_t (*)(int, const void*, size_t)>("write");
    return real(fd, p, n);
  }
  flyt::server::DeviceOutputSink()->append(static_cast<const char*>(p), n);
  return static_cast<ssize_t>(n);
}

}  // extern "C"
