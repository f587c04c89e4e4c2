// Implementation of common/log.h. State is read from the environment on first
// use (no global constructors that can fail).
#include "common/log.h"

#include <fcntl.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace flyt::log {
namespace {

struct State {
  int level = static_cast<int>(Level::kWarn);
  bool trace = false;
  int fd = 2;
  char tag[16] = "flyt";
};

State* GetState() {
  static State* state = [] {
    static State s;
    if (const char* v = std::getenv("FLYT_LOG")) {
      static const char* const kNames[] = {"error", "warn", "info", "debug", "trace"};
      for (int i = 0; i < 5; ++i)
        if (std::strcmp(v, kNames[i]) == 0) s.level = i;
    }
    if (const char* v = std::getenv("FLYT_TRACE")) s.trace = v[0] != '\0' && v[0] != '0';
    if (s.trace && s.level < static_cast<int>(Level::kInfo))
      s.level = static_cast<int>(Level::kInfo);
    if (const char* path = std::getenv("FLYT_LOG_FILE"); path != nullptr && path[0] != '\0') {
      int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) s.fd = fd;
    }
    return &s;
  }();
  return state;
}

}  // namespace

bool Enabled(Level level) { return static_cast<int>(level) <= GetState()->level; }
bool TraceCalls() { return GetState()->trace; }

void SetProcessTag(const char* tag) {
  State* s = GetState();
  std::snprintf(s->tag, sizeof(s->tag), "%s", tag);
}

void Write(Level level, const char* fmt, ...) {
  static const char* const kNames[] = {"E", "W", "I", "D", "T"};
  State* s = GetState();
  char line[2048];
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm tmv{};
  localtime_r(&tv.tv_sec, &tmv);
  int n = std::snprintf(line, sizeof(line), "%02d:%02d:%02d.%06ld %s[%d] %s ", tmv.tm_hour,
                        tmv.tm_min, tmv.tm_sec, static_cast<long>(tv.tv_usec), s->tag,
                        static_cast<int>(getpid()), kNames[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  line[len++] = '\n';
  ssize_t unused = ::write(s->fd, line, len);  // one write: lines never interleave
  (void)unused;
}

}  // namespace flyt::log
