// Daemon settings: one place where every daemon reads its configuration.
//
// Owns: the precedence rule (built-in default < TOML file < environment <
// command-line flag), the mapping between a field name `heartbeat_ms`, its TOML
// key `heartbeat_ms` in the daemon's section, its environment variable
// `FLYT_<PREFIX>_HEARTBEAT_MS` and its flag `--heartbeat-ms`, and the usage
// text. The config file is `--config FILE`, else $FLYT_CONFIG, else
// /etc/flyt/flyt.toml when it exists; one file holds the sections of all
// daemons (etc/flyt.example.toml documents every field). Must not know what
// any field means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace flyt::control {

class Settings {
 public:
  // section: TOML table ("cluster_manager"); env_prefix: "CM" -> FLYT_CM_*.
  Settings(std::string program, std::string section, std::string env_prefix);
  void Add(const char* name, std::string* target, const char* doc);
  void Add(const char* name, int64_t* target, const char* doc);
  void Add(const char* name, double* target, const char* doc);
  void Add(const char* name, bool* target, const char* doc);
  // Applies file, environment and argv (argv[0] skipped). Unknown flags, keys
  // of the section and badly typed values are errors that name the source.
  // Sets *help (and loads nothing more) on --help/-h.
  Status Load(int argc, char** argv, bool* help);
  // For a daemon's main(): Load, then --help's text or the error (prefixed
  // with the program's name) on stderr. False: main returns *exit_code.
  bool LoadForMain(int argc, char** argv, int* exit_code);
  std::string Usage() const;
  // Where the values came from, for the start-up log line.
  const std::string& config_file() const { return config_file_; }

 private:
  enum class Type { kString, kInt, kDouble, kBool };
  struct Field {
    std::string name;
    Type type;
    void* target;
    std::string doc;
  };
  Status Set(const Field& f, const std::string& text, const std::string& source);
  std::string program_, section_, env_prefix_, config_file_;
  std::vector<Field> fields_;
};

// The folder for state (database, secret) when none is configured:
// $FLYT_STATE_DIR, else /var/lib/flyt for root, else ~/.local/state/flyt.
std::string DefaultStateDir();

// The first non-loopback IPv4 address of an interface that is up, else
// 127.0.0.1: what a host advertises and a VM calls itself by default.
std::string DefaultHostAddress();

}  // namespace flyt::control
