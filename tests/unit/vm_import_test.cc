// Tests of src/store/vm_import: MongoDB JSON exports (array, one document per
// line, Extended JSON numbers) and CSV (quoting, any column order), and the
// file:line: field errors operators see.
#include "store/vm_import.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace flyt::store {
namespace {

class VmImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/flyt-vm-import-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::vector<VmRequirement> ParseOk(const std::string& name, const std::string& text) {
    std::vector<VmRequirement> vms;
    Status s = ParseVmFile(Write(name, text), &vms);
    EXPECT_TRUE(s.ok()) << s.message();
    return vms;
  }
  // The error message, which must start with "PATH:".
  std::string ParseError(const std::string& name, const std::string& text) {
    std::vector<VmRequirement> vms = {VmRequirement()};
    std::string path = Write(name, text);
    Status s = ParseVmFile(path, &vms);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message().rfind(path + ":", 0), 0u) << s.message();
    EXPECT_EQ(vms.size(), 1u) << "output must be untouched on error";
    return s.message().substr(std::min(s.message().size(), dir_.size() + 1));
  }

  std::string dir_;
};

void ExpectVm(const VmRequirement& vm, const std::string& ip, const std::string& host, int units,
              double gb) {
  EXPECT_EQ(vm.vm_ip, ip);
  EXPECT_EQ(vm.host_ip, host);
  EXPECT_EQ(vm.compute_units, units);
  EXPECT_EQ(vm.memory_gb, gb);
}

TEST_F(VmImportTest, JsonArray) {
  auto vms = ParseOk("vms.json", R"(
  [
    {"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}, "vm_ip": "10.0.0.1", "host_ip": "192.168.1.1",
     "compute_units": 8, "memory": 1.5},
    {
      "vm_ip": "10.0.0.2",
      "memory": 4,
      "compute_units": 16,
      "host_ip": "192.168.1.2",
      "comment": "extra fields are ignored"
    }
  ]
  )");
  ASSERT_EQ(vms.size(), 2u);
  ExpectVm(vms[0], "10.0.0.1", "192.168.1.1", 8, 1.5);
  ExpectVm(vms[1], "10.0.0.2", "192.168.1.2", 16, 4);
  EXPECT_TRUE(ParseOk("empty.json", " [ ] \n").empty());
}

TEST_F(VmImportTest, JsonLinesAsMongoexportWritesThem) {
  auto vms = ParseOk("vms.json",
                     "{\"_id\":{\"$oid\":\"65a1\"},\"vm_ip\":\"10.0.0.1\",\"host_ip\":\"h1\","
                     "\"compute_units\":{\"$numberInt\":\"8\"},\"memory\":{\"$numberDouble\":"
                     "\"1.5\"}}\n"
                     "{\"_id\":{\"$oid\":\"65a2\"},\"vm_ip\":\"10.0.0.2\",\"host_ip\":\"h2\","
                     "\"compute_units\":{\"$numberLong\":\"132\"},\"memory\":{\"$numberInt\":"
                     "\"80\"}}\r\n"
                     "\n"
                     "{\"vm_ip\":\"10.0.0.3\",\"host_ip\":\"h3\",\"compute_units\":4.0,"
                     "\"memory\":{\"$numberDecimal\":\"0.25\"}}\n");
  ASSERT_EQ(vms.size(), 3u);
  ExpectVm(vms[0], "10.0.0.1", "h1", 8, 1.5);
  ExpectVm(vms[1], "10.0.0.2", "h2", 132, 80);
  ExpectVm(vms[2], "10.0.0.3", "h3", 4, 0.25);
}

TEST_F(VmImportTest, JsonMemoryGbAliasAndBom) {
  auto vms = ParseOk("vms.json",
                     "\xEF\xBB\xBF[{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,"
                     "\"memory_gb\":2}]");
  ASSERT_EQ(vms.size(), 1u);
  ExpectVm(vms[0], "a", "b", 1, 2);
}

TEST_F(VmImportTest, CsvWithQuotingAndReorderedColumns) {
  auto vms = ParseOk("vms.csv",
                     "memory,\"vm_ip\", Compute_Units ,host_ip,comment\r\n"
                     "1.5,10.0.0.1,8,192.168.1.1,plain\r\n"
                     "\r\n"
                     "\"2\", \"10.0.0.2\" ,16,192.168.1.2,\"has, a comma and \"\"quotes\"\"\"\n"
                     "0,10.0.0.3,0,192.168.1.3,\"spans\ntwo lines\"\n"
                     "3.25,10.0.0.4,132,192.168.1.4,\n");
  ASSERT_EQ(vms.size(), 4u);
  ExpectVm(vms[0], "10.0.0.1", "192.168.1.1", 8, 1.5);
  ExpectVm(vms[1], "10.0.0.2", "192.168.1.2", 16, 2);
  ExpectVm(vms[2], "10.0.0.3", "192.168.1.3", 0, 0);
  ExpectVm(vms[3], "10.0.0.4", "192.168.1.4", 132, 3.25);
  EXPECT_TRUE(ParseOk("header_only.csv", "vm_ip,host_ip,compute_units,memory\n").empty());
  vms = ParseOk("gb.csv", "vm_ip,host_ip,compute_units,memory_gb\na,b,1,2");
  ASSERT_EQ(vms.size(), 1u);
  ExpectVm(vms[0], "a", "b", 1, 2);
}

TEST_F(VmImportTest, GpuCountIsOptionalAndDefaultsToOne) {
  auto vms = ParseOk("gpus.json",
                     "[{\"vm_ip\":\"a\",\"host_ip\":\"h\",\"compute_units\":8,\"memory\":1,"
                     "\"gpus\":{\"$numberInt\":\"4\"}},\n"
                     " {\"vm_ip\":\"b\",\"host_ip\":\"h\",\"compute_units\":8,\"memory\":1}]");
  ASSERT_EQ(vms.size(), 2u);
  EXPECT_EQ(vms[0].gpus, 4);
  EXPECT_EQ(vms[1].gpus, 1);
  vms = ParseOk("gpus.csv", "vm_ip,host_ip,compute_units,memory,gpus\na,h,8,1,2\nb,h,8,1,\n");
  ASSERT_EQ(vms.size(), 2u);
  EXPECT_EQ(vms[0].gpus, 2);
  EXPECT_EQ(vms[1].gpus, 1);  // an empty cell is the default
  EXPECT_EQ(ParseOk("old.csv", "vm_ip,host_ip,compute_units,memory\na,h,8,1\n")[0].gpus, 1);
  EXPECT_EQ(ParseError("zero.csv", "vm_ip,host_ip,compute_units,memory,gpus\na,h,8,1,0\n"),
            "zero.csv:2: field gpus: must be at least 1 (GPUs for the VM), got \"0\"");
  EXPECT_EQ(ParseError("text.json",
                       "{\"vm_ip\":\"a\",\"host_ip\":\"h\",\"compute_units\":8,\"memory\":1,"
                       "\"gpus\":\"two\"}"),
            "text.json:1: field gpus: expected a whole number, got \"two\"");
}

TEST_F(VmImportTest, JsonErrorsNameLineAndField) {
  std::string err = ParseError("bad.json",
                               "{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,"
                               "\"memory\":1}\n"
                               "{\"vm_ip\":\"c\",\"host_ip\":\"d\",\"compute_units\":-3,"
                               "\"memory\":1}\n");
  EXPECT_EQ(err, "bad.json:2: field compute_units: must be between 0 and 2147483647, got \"-3\"");

  err = ParseError("missing.json",
                   "[\n  {\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,\"memory\":1},\n"
                   "  {\"vm_ip\":\"c\",\"host_ip\":\"d\",\n   \"compute_units\":1}\n]");
  EXPECT_EQ(err, "missing.json:3: field memory: missing from the document");

  err = ParseError("pretty.json",
                   "[\n {\n  \"vm_ip\": \"a\",\n  \"host_ip\": \"b\",\n  \"compute_units\": 1,\n"
                   "  \"memory\": {\"$numberDouble\": \"lots\"}\n }\n]\n");
  EXPECT_EQ(err, "pretty.json:6: field memory: expected a number (GB), got \"lots\"");

  err = ParseError("neg.json",
                   "{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,"
                   "\"memory\":{\"$numberDouble\":\"-1.0\"}}");
  EXPECT_EQ(err, "neg.json:1: field memory: must be >= 0, got \"-1.0\"");

  err = ParseError("empty_ip.json",
                   "\n\n{\"vm_ip\":\"\",\"host_ip\":\"b\",\"compute_units\":1,\"memory\":1}");
  EXPECT_EQ(err, "empty_ip.json:3: field vm_ip: is empty");

  err = ParseError("type.json", "{\"vm_ip\":7,\"host_ip\":\"b\",\"compute_units\":1,\"memory\":1}");
  EXPECT_EQ(err, "type.json:1: field vm_ip: expected a string, got 7");

  err = ParseError("frac.json",
                   "{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1.5,\"memory\":1}");
  EXPECT_EQ(err, "frac.json:1: field compute_units: expected a whole number, got \"1.5\"");

  err = ParseError("syntax.json",
                   "{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,\"memory\":1}\n"
                   "{\"vm_ip\":\"c\",\n\"host_ip\":\"d\" \"compute_units\":1,\"memory\":1}\n");
  EXPECT_EQ(err.rfind("syntax.json:3: invalid JSON: ", 0), 0u) << err;

  err = ParseError("open.json",
                   "[{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,\"memory\":1}");
  EXPECT_EQ(err, "open.json:1: unexpected end of file: the JSON array is not closed");

  err = ParseError("unclosed.json", "\n{\"vm_ip\":\"a\",\n\"host_ip\":\"b\"");
  EXPECT_EQ(err, "unclosed.json:2: unexpected end of file inside the document that starts here");

  err = ParseError("scalar.json",
                   "[{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,"
                   "\"memory\":1},\n 42]");
  EXPECT_EQ(err, "scalar.json:2: expected a document ({...}), found '4'");

  err = ParseError("dup.json",
                   "{\"vm_ip\":\"a\",\"host_ip\":\"b\",\"compute_units\":1,\"memory\":1}\n"
                   "{\"vm_ip\":\"a\",\"host_ip\":\"c\",\"compute_units\":2,\"memory\":2}\n");
  EXPECT_EQ(err, "dup.json:2: field vm_ip: \"a\" already listed on line 1");
}

TEST_F(VmImportTest, CsvErrorsNameLineAndField) {
  std::string err = ParseError("bad.csv",
                               "vm_ip,host_ip,compute_units,memory\n"
                               "10.0.0.1,h,8,1\n"
                               "10.0.0.2,h,-3,1\n");
  EXPECT_EQ(err, "bad.csv:3: field compute_units: must be between 0 and 2147483647, got \"-3\"");

  err = ParseError("mem.csv", "memory,vm_ip,host_ip,compute_units\n\"x\ny\",a,b,1\n");
  EXPECT_EQ(err, "mem.csv:2: field memory: expected a number (GB), got \"x\ny\"");

  err = ParseError("count.csv", "vm_ip,host_ip,compute_units,memory\na,b,1\n");
  EXPECT_EQ(err, "count.csv:2: expected 4 fields as in the header, found 3");

  err = ParseError("header.csv", "vm_ip,host,compute_units,memory\na,b,1,1\n");
  EXPECT_EQ(err.rfind("header.csv:1: CSV header lacks column host_ip", 0), 0u) << err;

  err = ParseError("quote.csv", "vm_ip,host_ip,compute_units,memory\na,b,1,1\n\"c,d,1,1\n");
  EXPECT_EQ(err, "quote.csv:3: unterminated quoted field (missing closing \")");

  err = ParseError("stray.csv", "vm_ip,host_ip,compute_units,memory\na,b\"x,1,1\n");
  EXPECT_EQ(err.rfind("stray.csv:2: stray \" in unquoted field 2", 0), 0u) << err;

  err = ParseError("host.csv", "vm_ip,host_ip,compute_units,memory\n\n\na, ,1,1\n");
  EXPECT_EQ(err, "host.csv:4: field host_ip: is empty");

  err = ParseError("dup.csv", "vm_ip,host_ip,compute_units,memory\na,b,1,1\nc,d,1,1\na,e,1,1\n");
  EXPECT_EQ(err, "dup.csv:4: field vm_ip: \"a\" already listed on line 2");
}

TEST_F(VmImportTest, FileErrors) {
  std::vector<VmRequirement> vms;
  Status s = ParseVmFile(dir_ + "/absent.csv", &vms);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot read " + dir_ + "/absent.csv"), std::string::npos)
      << s.message();
  s = ParseVmFile(Write("empty.csv", " \n\n"), &vms);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("empty file"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace flyt::store
