// flyt: runs an application with Flyt's client library in place of NVIDIA's
// driver, without root and without changing the system.
//
// Owns: the `flyt run` command line. It sets LD_LIBRARY_PATH (Flyt's library
// folder first), LD_PRELOAD (Flyt's libcupti and libnccl), FLYT_SERVER and FLYT_TOKEN, then
// replaces itself with the application, so the app's output and exit code are its own.
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: flyt run [--server ADDR[,ADDR...]] [--token TOKEN] [--timeout-ms N] -- APP "
               "[ARGS...]\n"
               "  ADDR: tcp://HOST:PORT, HOST:PORT or unix:///PATH (default: $FLYT_SERVER,\n"
               "        else tcp://127.0.0.1:14833); several, comma-separated: the GPUs of\n"
               "        all of them as one ordinal list, in that order\n"
               "  logging: FLYT_LOG=error|warn|info|debug|trace, FLYT_LOG_FILE, FLYT_TRACE=1\n");
}

// The folder holding Flyt's libcuda.so.1 and libnvidia-ml.so.1: FLYT_LIB_DIR, else
// ../lib/flyt next to this binary.
std::string LibraryDir(const char* argv0) {
  if (const char* d = std::getenv("FLYT_LIB_DIR"); d != nullptr && d[0] != '\0') return d;
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv0);
  std::string dir = path.substr(0, path.rfind('/'));
  std::string prefix = dir.substr(0, dir.rfind('/'));
  return prefix + "/lib/flyt";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "run") != 0) {
    Usage();
    return 2;
  }
  std::string server, token, timeout;
  int i = 2;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if ((a == "--server" || a == "--token" || a == "--timeout-ms") && i + 1 < argc) {
      (a == "--server" ? server : a == "--token" ? token : timeout) = argv[++i];
    } else if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    } else if (a[0] != '-') {
      break;
    } else {
      std::fprintf(stderr, "flyt: unknown option '%s'\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (i >= argc) {
    Usage();
    return 2;
  }
  std::string lib = LibraryDir(argv[0]);
  if (access((lib + "/libcuda.so.1").c_str(), R_OK) != 0) {
    std::fprintf(stderr,
                 "flyt: %s/libcuda.so.1 not found; set FLYT_LIB_DIR to the folder that "
                 "holds Flyt's client library\n",
                 lib.c_str());
    return 127;
  }
  const char* old = std::getenv("LD_LIBRARY_PATH");
  std::string path = lib + (old != nullptr && old[0] != '\0' ? ":" + std::string(old) : "");
  // A UCX carried beside Flyt's libraries (tests/gpu/stage_build.sh: lib/ucx/) for ucx://:
  // libucs finds its libucm by soname only, so the folder goes last on the search path
  // (the application's own settings come first).
  if (std::string ucx = lib + "/../ucx"; access((ucx + "/libucm.so.0").c_str(), R_OK) == 0)
    path += ":" + ucx;
  setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  // Flyt's CUPTI is preloaded: frameworks find NVIDIA's libcupti.so.13 through
  // their RPATH, ahead of LD_LIBRARY_PATH, and NVIDIA's cannot work without a
  // local GPU. A preloaded library answers for its soname.
  // Flyt's NCCL likewise (the GPU servers run the collectives).
  for (const char* name : {"/libcupti.so.13", "/libnccl.so.2"}) {
    if (std::string preloaded = lib + name; access(preloaded.c_str(), R_OK) == 0) {
      const char* pre = std::getenv("LD_PRELOAD");
      std::string all =
          preloaded + (pre != nullptr && pre[0] != '\0' ? ":" + std::string(pre) : "");
      setenv("LD_PRELOAD", all.c_str(), 1);
    }
  }
  if (!server.empty()) setenv("FLYT_SERVER", server.c_str(), 1);
  if (!token.empty()) setenv("FLYT_TOKEN", token.c_str(), 1);
  if (!timeout.empty()) setenv("FLYT_TIMEOUT_MS", timeout.c_str(), 1);
  execvp(argv[i], argv + i);
  std::fprintf(stderr, "flyt: cannot run '%s': %s\n", argv[i], std::strerror(errno));
  return 127;
}
