#include "cluster/metrics_text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace flyt::cluster {

namespace {
// Backslash and newline escaped; double quotes too in label values (not in HELP text).
std::string Escape(std::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\' || (quotes && c == '"')) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

std::string EscapeLabelValue(std::string_view value) { return Escape(value, true); }

namespace {
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9.0e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    return buf;
  }
  char buf[40];
  for (int digits = 6; digits <= 17; ++digits) {  // the shortest text that reads back as v
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}
}  // namespace

void MetricsText::Family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += Escape(help, false);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void MetricsText::Sample(std::string_view name, const MetricLabels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) out_ += ',';
      out_ += labels[i].first;
      out_ += "=\"";
      out_ += EscapeLabelValue(labels[i].second);
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += Number(value);
  out_ += '\n';
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double seconds) {
  size_t i = 0;
  while (i < bounds_.size() && seconds > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += seconds;
  ++count_;
}

void Histogram::Write(MetricsText* out, std::string_view name, const MetricLabels& labels) const {
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    MetricLabels with = labels;
    with.emplace_back("le", i < bounds_.size() ? Number(bounds_[i]) : "+Inf");
    out->Sample(bucket, with, static_cast<double>(cumulative));
  }
  out->Sample(std::string(name) + "_sum", labels, sum_);
  out->Sample(std::string(name) + "_count", labels, static_cast<double>(count_));
}

}  // namespace flyt::cluster
