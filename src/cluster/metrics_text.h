// Prometheus text exposition format (version 0.0.4): what /metrics answers.
//
// Owns: writing metric families (# HELP, # TYPE, then samples) with label
// values escaped as the format requires, and a fixed-bucket histogram. Must
// not know the cluster: the cluster manager decides what to expose
// (ClusterManager::MetricsText). Debian ships no maintained C++ Prometheus
// client (prometheus-cpp is not packaged), and the format is small, so it is
// written here and checked by a real Prometheus server in the tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flyt::cluster {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Backslash, double quote and newline escaped, as label values need them.
std::string EscapeLabelValue(std::string_view value);

class MetricsText {
 public:
  // Starts a family; its samples follow. type: gauge, counter or histogram.
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // One sample of the current family (name may carry a suffix: _bucket, _sum, _count).
  void Sample(std::string_view name, const MetricLabels& labels, double value);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// Observations of a duration, in fixed buckets (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double seconds);
  // The family's _bucket (cumulative, le="+Inf" last), _sum and _count samples.
  void Write(MetricsText* out, std::string_view name, const MetricLabels& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace flyt::cluster
