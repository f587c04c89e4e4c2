// Logging for every Flyt process and for the client library.
//
// Owns: the log level (FLYT_LOG=error|warn|info|debug|trace, default warn), the
// destination (FLYT_LOG_FILE=path, default stderr) and the call trace switch
// (FLYT_TRACE=1). Never writes to stdout: the client library lives inside other
// people's processes. Must not allocate in a way that can fail at load time; all
// state is initialised lazily on first use.
#pragma once

#include <cstdarg>

namespace flyt::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// True when messages of `level` are written.
bool Enabled(Level level);
// True when FLYT_TRACE asks for one line per remoted call.
bool TraceCalls();
// printf-style message, prefixed with time, process tag, pid and level.
void Write(Level level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Tag printed in each line ("client", "server", ...). Call once at start-up.
void SetProcessTag(const char* tag);

}  // namespace flyt::log

#define FLYT_LOG_AT(lvl, ...)                                            \
  do {                                                                   \
    if (::flyt::log::Enabled(lvl)) ::flyt::log::Write(lvl, __VA_ARGS__); \
  } while (0)
#define FLYT_ERROR(...) FLYT_LOG_AT(::flyt::log::Level::kError, __VA_ARGS__)
#define FLYT_WARN(...) FLYT_LOG_AT(::flyt::log::Level::kWarn, __VA_ARGS__)
#define FLYT_INFO(...) FLYT_LOG_AT(::flyt::log::Level::kInfo, __VA_ARGS__)
#define FLYT_DEBUG(...) FLYT_LOG_AT(::flyt::log::Level::kDebug, __VA_ARGS__)
#define FLYT_TRACE(...) FLYT_LOG_AT(::flyt::log::Level::kTrace, __VA_ARGS__)
