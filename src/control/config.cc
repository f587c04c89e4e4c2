#include "control/config.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <toml.hpp>

namespace flyt::control {
namespace {

std::string FlagName(const std::string& name) {
  std::string f = name;
  for (auto& c : f) c = c == '_' ? '-' : c;
  return "--" + f;
}

std::string EnvName(const std::string& prefix, const std::string& name) {
  std::string e = "FLYT_" + prefix + "_";
  for (char c : name) e += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

}  // namespace

Settings::Settings(std::string program, std::string section, std::string env_prefix)
    : program_(std::move(program)),
      section_(std::move(section)),
      env_prefix_(std::move(env_prefix)) {}

void Settings::Add(const char* name, std::string* target, const char* doc) {
  fields_.push_back({name, Type::kString, target, doc});
}
void Settings::Add(const char* name, int64_t* target, const char* doc) {
  fields_.push_back({name, Type::kInt, target, doc});
}
void Settings::Add(const char* name, double* target, const char* doc) {
  fields_.push_back({name, Type::kDouble, target, doc});
}
void Settings::Add(const char* name, bool* target, const char* doc) {
  fields_.push_back({name, Type::kBool, target, doc});
}

Status Settings::Set(const Field& f, const std::string& text, const std::string& source) {
  auto bad = [&](const char* what) {
    return Status::Error(source + ": `" + f.name + "` must be " + what + ", got '" + text + "'");
  };
  switch (f.type) {
    case Type::kString:
      *static_cast<std::string*>(f.target) = text;
      return Status::Ok();
    case Type::kInt: {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno != 0) return bad("an integer");
      *static_cast<int64_t*>(f.target) = v;
      return Status::Ok();
    }
    case Type::kDouble: {
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0') return bad("a number");
      *static_cast<double*>(f.target) = v;
      return Status::Ok();
    }
    case Type::kBool:
      if (text == "true" || text == "1" || text == "yes" || text == "on") {
        *static_cast<bool*>(f.target) = true;
      } else if (text == "false" || text == "0" || text == "no" || text == "off") {
        *static_cast<bool*>(f.target) = false;
      } else {
        return bad("true or false");
      }
      return Status::Ok();
  }
  return Status::Ok();
}

Status Settings::Load(int argc, char** argv, bool* help) {
  *help = false;
  // 1. Which file: --config wins over $FLYT_CONFIG over /etc/flyt/flyt.toml.
  std::string file;
  bool explicit_file = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      *help = true;
      return Status::Ok();
    }
    if (a == "--config" && i + 1 < argc) {
      file = argv[i + 1];
      explicit_file = true;
    } else if (a.rfind("--config=", 0) == 0) {
      file = a.substr(9);
      explicit_file = true;
    }
  }
  if (!explicit_file) {
    if (const char* e = std::getenv("FLYT_CONFIG"); e && *e) {
      file = e;
      explicit_file = true;
    } else if (std::filesystem::exists("/etc/flyt/flyt.toml")) {
      file = "/etc/flyt/flyt.toml";
    }
  }
  // 2. The file's section.
  if (!file.empty()) {
    if (!std::filesystem::exists(file)) {
      return Status::Error("config file " + file + " does not exist");
    }
    config_file_ = file;
    try {
      const toml::value root = toml::parse(file);
      if (root.contains(section_)) {
        const auto& table = toml::find(root, section_).as_table();
        for (const auto& [key, value] : table) {
          const Field* f = nullptr;
          for (const auto& cand : fields_) {
            if (cand.name == key) f = &cand;
          }
          std::string where = file + " [" + section_ + "]";
          if (!f) return Status::Error(where + ": unknown setting `" + key + "`");
          std::string text;
          if (value.is_string()) {
            text = value.as_string().str;
          } else if (value.is_integer()) {
            text = std::to_string(value.as_integer());
          } else if (value.is_floating()) {
            std::ostringstream os;
            os << value.as_floating();
            text = os.str();
          } else if (value.is_boolean()) {
            text = value.as_boolean() ? "true" : "false";
          } else {
            return Status::Error(where + ": `" + key + "` has an unsupported type");
          }
          if (f->type == Type::kString && !value.is_string()) {
            return Status::Error(where + ": `" + key + "` must be a string");
          }
          Status s = Set(*f, text, where);
          if (!s.ok()) return s;
        }
      }
    } catch (const std::exception& e) {
      return Status::Error("cannot read config file " + file + ": " + e.what());
    }
  }
  // 3. Environment.
  for (const auto& f : fields_) {
    std::string env = EnvName(env_prefix_, f.name);
    if (const char* v = std::getenv(env.c_str())) {
      Status s = Set(f, v, "environment " + env);
      if (!s.ok()) return s;
    }
  }
  // 4. Flags.
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    bool has_value = false;
    if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    if (a == "--config") {
      if (!has_value) ++i;
      continue;
    }
    const Field* f = nullptr;
    for (const auto& cand : fields_) {
      if (FlagName(cand.name) == a) f = &cand;
    }
    if (!f) return Status::Error("unknown argument '" + a + "' (see " + program_ + " --help)");
    if (!has_value) {
      if (i + 1 >= argc) return Status::Error(a + " needs a value");
      value = argv[++i];
    }
    Status s = Set(*f, value, "flag " + a);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

bool Settings::LoadForMain(int argc, char** argv, int* exit_code) {
  bool help = false;
  Status st = Load(argc, argv, &help);
  if (help) {
    std::fputs(Usage().c_str(), stderr);
    *exit_code = 0;
    return false;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), st.message().c_str());
    *exit_code = 2;
    return false;
  }
  return true;
}

std::string Settings::Usage() const {
  std::ostringstream os;
  os << "usage: " << program_ << " [--config FILE] [--SETTING VALUE]...\n\n"
     << "Settings (TOML section [" << section_ << "] of the config file; environment FLYT_"
     << env_prefix_ << "_<NAME>; flags win over the environment, which wins over the file):\n";
  for (const auto& f : fields_) {
    std::string def;
    switch (f.type) {
      case Type::kString:
        def = "\"" + *static_cast<std::string*>(f.target) + "\"";
        break;
      case Type::kInt:
        def = std::to_string(*static_cast<int64_t*>(f.target));
        break;
      case Type::kDouble: {
        std::ostringstream d;
        d << *static_cast<double*>(f.target);
        def = d.str();
        break;
      }
      case Type::kBool:
        def = *static_cast<bool*>(f.target) ? "true" : "false";
        break;
    }
    os << "  " << FlagName(f.name) << " (" << EnvName(env_prefix_, f.name) << ", default " << def
       << ")\n      " << f.doc << "\n";
  }
  os << "The config file is --config FILE, else $FLYT_CONFIG, else /etc/flyt/flyt.toml if it "
        "exists.\n";
  return os.str();
}

std::string DefaultStateDir() {
  if (const char* e = std::getenv("FLYT_STATE_DIR"); e && *e) return e;
  if (::geteuid() == 0) return "/var/lib/flyt";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.local/state/flyt";
}

std::string DefaultHostAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "127.0.0.1";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  ::freeifaddrs(list);
  return found.empty() ? "127.0.0.1" : found;
}

}  // namespace flyt::control
