// Unit tests of cluster/metrics_text: the Prometheus exposition the cluster
// manager's /metrics answers (a real Prometheus parses it in the control tests).
#include "cluster/metrics_text.h"

#include <gtest/gtest.h>

namespace flyt::cluster {
namespace {

TEST(MetricsText, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
}

TEST(MetricsText, FamilyAndSamples) {
  MetricsText m;
  m.Family("flyt_x", "gauge", "help with \\ and\nnewline but \"quotes\" kept");
  m.Sample("flyt_x", {}, 3);
  m.Sample("flyt_x", {{"vm", "10.0.0.1"}, {"gpu", "GPU-\"1\""}}, 0.25);
  m.Sample("flyt_x", {{"big", "1"}}, 68719476736.0);  // 64 GiB: an integer, no exponent
  EXPECT_EQ(m.text(),
            "# HELP flyt_x help with \\\\ and\\nnewline but \"quotes\" kept\n"
            "# TYPE flyt_x gauge\n"
            "flyt_x 3\n"
            "flyt_x{vm=\"10.0.0.1\",gpu=\"GPU-\\\"1\\\"\"} 0.25\n"
            "flyt_x{big=\"1\"} 68719476736\n");
}

TEST(MetricsText, HistogramBucketsAreCumulativeWithInf) {
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.1);  // on the bound: counted in le="0.1"
  h.Observe(0.5);
  h.Observe(7);
  MetricsText m;
  h.Write(&m, "flyt_h", {{"k", "v"}});
  EXPECT_EQ(m.text(),
            "flyt_h_bucket{k=\"v\",le=\"0.1\"} 2\n"
            "flyt_h_bucket{k=\"v\",le=\"1\"} 3\n"
            "flyt_h_bucket{k=\"v\",le=\"+Inf\"} 4\n"
            "flyt_h_sum{k=\"v\"} 7.65\n"
            "flyt_h_count{k=\"v\"} 4\n");
}

}  // namespace
}  // namespace flyt::cluster
