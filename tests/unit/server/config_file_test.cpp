// Tests of the TOML config file (config/config_file) and the merge of file
// and flags (config/config_cli): good files, sections, errors naming the key.
#include <CLI/CLI.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "config/config.hpp"
#include "config/config_cli.hpp"
#include "config/config_fields.hpp"
#include "config/config_file.hpp"

namespace vg {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string message(const Result<ServeConfig>& r) { return r.ok() ? "(ok)" : r.error().message; }

TEST(ConfigTyped, TextSettingsAreParsedOnceIntoTheirTypes) {
  ServeConfig c;
  EXPECT_EQ(c.admission_policy().kind, AdmissionPolicy::Kind::kMemory);
  EXPECT_EQ(c.memory_reserve_bytes(), 0);
  c.admission = "fixed:3";
  c.memory_reserve = "64MiB";
  ASSERT_FALSE(c.check().has_value());
  EXPECT_EQ(c.admission_policy(), (AdmissionPolicy{AdmissionPolicy::Kind::kFixed, 3}));
  EXPECT_EQ(c.memory_reserve_bytes(), std::int64_t{64} << 20);
  c.admission = "none";
  EXPECT_EQ(c.admission_policy().kind, AdmissionPolicy::Kind::kNone);
}

TEST(ConfigTyped, DeviceSpecsKeepTheOrderAndTheTextGiven) {
  ServeConfig c;
  std::vector<DeviceSpec> specs = c.device_specs();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].kind, DeviceKind::kAuto);
  EXPECT_EQ(specs[0].name(), "auto");
  c.device = {"virt:1=512MiB", "cuda:0", "virt:0=1GiB"};
  ASSERT_FALSE(c.check().has_value());
  specs = c.device_specs();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].kind, DeviceKind::kVirtual);
  EXPECT_EQ(specs[0].index, 1);
  EXPECT_EQ(specs[0].capacity, std::int64_t{512} << 20);
  EXPECT_EQ(specs[0].text, "virt:1=512MiB");
  EXPECT_EQ(specs[0].name(), "virt:1");
  EXPECT_EQ(specs[1].kind, DeviceKind::kCuda);
  EXPECT_EQ(specs[1].name(), "cuda:0");
  EXPECT_EQ(specs[1].capacity, 0);
  EXPECT_EQ(specs[2].name(), "virt:0");
  EXPECT_EQ(specs[2].capacity, std::int64_t{1} << 30);
}

TEST(ConfigTypedDeathTest, AValueCheckWouldRefuseEndsTheProcessNamingTheKey) {
  ServeConfig c;
  c.admission = "fixed:0";
  ASSERT_TRUE(c.check().has_value());
  EXPECT_DEATH((void)c.admission_policy(), "setting admission was used without ServeConfig::check");
  c = ServeConfig{};
  c.device = {"virt:0=1GiB", "virt:0=2GiB"};
  ASSERT_TRUE(c.check().has_value());
  EXPECT_DEATH((void)c.device_specs(), "setting device was used without ServeConfig::check.*given twice");
}

TEST(ConfigFile, GoodFileSetsFieldsAndKeepsDefaults) {
  auto c = parse_config_toml(R"(
max_batch = 4
device = "virt:0=1GiB"
memory_utilization = 0.5
read_timeout = 12          # an integer where seconds are a float
[memory]
admission = "fixed:3"
memory_reserve = "64MiB"
[operability]
log_request_text = true
)",
                             "x.toml");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_EQ(c->max_batch, 4);
  EXPECT_EQ(c->device, std::vector<std::string>{"virt:0=1GiB"});
  EXPECT_DOUBLE_EQ(c->memory_utilization, 0.5);
  EXPECT_DOUBLE_EQ(c->read_timeout_s, 12.0);
  EXPECT_EQ(c->admission, "fixed:3");
  EXPECT_EQ(c->memory_reserve, "64MiB");
  EXPECT_TRUE(c->log_request_text);
  EXPECT_EQ(c->max_queue, ServeConfig{}.max_queue);
  EXPECT_EQ(c->model_dir, ServeConfig{}.model_dir);
}

TEST(ConfigFile, ByteSizeMayBeAnInteger) {
  auto c = parse_config_toml("memory_reserve = 1048576\n", "x.toml");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_EQ(c->memory_reserve, "1048576");
}

TEST(ConfigFile, MaxBodyBytesTakesAUnitOrAnInteger) {
  auto unit = parse_config_toml("[http]\nmax_body_bytes = \"2MiB\"\n", "x.toml");
  ASSERT_TRUE(unit.ok()) << message(unit);
  EXPECT_EQ(unit->max_body_bytes, 2 << 20);
  auto plain = parse_config_toml("max_body_bytes = 65536\n", "x.toml");
  ASSERT_TRUE(plain.ok()) << message(plain);
  EXPECT_EQ(plain->max_body_bytes, 65536);
  auto bad = parse_config_toml("\nmax_body_bytes = \"64 parsecs\"\n", "x.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message, HasSubstr("x.toml:2: key 'max_body_bytes': invalid byte size '64 parsecs'"));
  auto small = parse_config_toml("max_body_bytes = \"1KB\"\n", "x.toml");
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(small.error().message, HasSubstr("key 'max_body_bytes': must be >= 1024"));
}

TEST(ConfigFile, RelativePathsAreRelativeToTheFilesFolder) {
  auto c = parse_config_toml(
      "model_dir = \"../models/tinylm\"\napi_keys = \"keys.txt\"\n"
      "[operability]\nprofile_trace = \"/var/tmp/trace.json\"\n",
      "deploy/vramgate.toml");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_EQ(c->model_dir, "models/tinylm");
  EXPECT_EQ(c->api_keys, "deploy/keys.txt");
  EXPECT_EQ(c->profile_trace, "/var/tmp/trace.json") << "an absolute path as it is";
  auto here = parse_config_toml("model_dir = \"m\"\n", "x.toml");
  ASSERT_TRUE(here.ok()) << message(here);
  EXPECT_EQ(here->model_dir, "m") << "a file in the current folder";
  // Printed, a path is absolute: the printed file means the same wherever it is saved.
  const std::string printed = format_config_toml(*c);
  const std::string absolute = std::filesystem::absolute("models/tinylm").lexically_normal().string();
  EXPECT_THAT(printed, HasSubstr("model_dir = \"" + absolute + "\""));
  auto again = parse_config_toml(printed, "elsewhere/printed.toml");
  ASSERT_TRUE(again.ok()) << message(again);
  EXPECT_EQ(again->model_dir, absolute);
}

TEST(ConfigFile, UnknownKeyIsNamedWithFileAndLine) {
  auto c = parse_config_toml("max_batch = 4\nmax_bach = 8\n", "deploy/x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kConfig);
  EXPECT_THAT(c.error().message, HasSubstr("deploy/x.toml:2"));
  EXPECT_THAT(c.error().message, HasSubstr("unknown key 'max_bach'"));
}

TEST(ConfigFile, KeyInTheWrongSectionIsNamed) {
  auto c = parse_config_toml("[http]\nmax_batch = 4\n", "x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("unknown key 'http.max_batch'"));
  EXPECT_THAT(c.error().message, HasSubstr("[scheduling]"));
}

TEST(ConfigFile, UnknownTableIsNamed) {
  auto c = parse_config_toml("[server]\nport = 1\n", "x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("unknown key 'server'"));
}

TEST(ConfigFile, WrongTypeNamesKeyAndExpectedType) {
  auto c = parse_config_toml("\n\nmax_queue = \"lots\"\n", "x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("x.toml:3: key 'max_queue': expected an integer, got a string"));
  auto f = parse_config_toml("max_batch = 2.5\n", "x.toml");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.error().message, HasSubstr("key 'max_batch': expected an integer, got a float"));
  auto b = parse_config_toml("log_request_text = 1\n", "x.toml");
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.error().message, HasSubstr("key 'log_request_text': expected a boolean"));
}

TEST(ConfigFile, IntegerBeyondIntRangeIsRejected) {
  auto c = parse_config_toml("port = 99999999999\n", "x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("key 'port': 99999999999 is out of range"));
}

TEST(ConfigFile, OutOfRangeValueNamesKeyAndLineWithTheValidationRule) {
  auto c = parse_config_toml("max_queue = 3\n[memory]\nmemory_utilization = 1.5\n", "x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("x.toml:3: key 'memory_utilization': must be in (0, 1]"));
  auto d = parse_config_toml("device = \"virt:0=lots\"\n", "x.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.error().message, HasSubstr("x.toml:1: key 'device'"));
}

TEST(ConfigFile, DeviceMayBeAStringOrAnArrayOfStrings) {
  auto one = parse_config_toml("[model]\ndevice = \"virt:0=1GiB\"\n", "x.toml");
  ASSERT_TRUE(one.ok()) << message(one);
  EXPECT_THAT(one->device, ElementsAre("virt:0=1GiB"));
  auto two = parse_config_toml("[model]\ndevice = [\"virt:0=1GiB\", \"virt:1=512MiB\"]\n", "x.toml");
  ASSERT_TRUE(two.ok()) << message(two);
  EXPECT_THAT(two->device, ElementsAre("virt:0=1GiB", "virt:1=512MiB"));
  auto one_in_array = parse_config_toml("device = [\"cuda:1\"]\n", "x.toml");
  ASSERT_TRUE(one_in_array.ok()) << message(one_in_array);
  EXPECT_THAT(one_in_array->device, ElementsAre("cuda:1"));
}

TEST(ConfigFile, DeviceArrayReplacesTheBaseList) {
  ServeConfig base;
  base.device = {"virt:0=1GiB", "virt:1=1GiB"};
  auto c = parse_config_toml("device = \"virt:5=1GiB\"\n", "x.toml", base);
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_THAT(c->device, ElementsAre("virt:5=1GiB"));
  auto kept = parse_config_toml("max_batch = 2\n", "x.toml", base);
  ASSERT_TRUE(kept.ok()) << message(kept);
  EXPECT_EQ(kept->device, base.device);
}

TEST(ConfigFile, DeviceOfAnotherTypeNamesTheKey) {
  auto i = parse_config_toml("\ndevice = 0\n", "x.toml");
  ASSERT_FALSE(i.ok());
  EXPECT_THAT(i.error().message,
              HasSubstr("x.toml:2: key 'device': expected a string or an array of strings, got an integer"));
  auto mixed = parse_config_toml("device = [\"virt:0=1GiB\", 1]\n", "x.toml");
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.error().message,
              HasSubstr("x.toml:1: key 'device': expected a string or an array of strings, got an array with an "
                        "integer at index 1"));
  auto table = parse_config_toml("[model.device]\nkind = \"virt\"\n", "x.toml");
  ASSERT_FALSE(table.ok());
  EXPECT_THAT(table.error().message, HasSubstr("key 'device': expected a string or an array of strings, got a table"));
  auto empty = parse_config_toml("max_batch = 2\ndevice = []\n", "x.toml");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.error().message, HasSubstr("x.toml:2: key 'device': needs at least one device"));
}

TEST(ConfigFile, DeviceListRulesNameTheKeyAndLine) {
  auto dup = parse_config_toml("max_batch = 2\ndevice = [\"virt:0=1GiB\", \"virt:0=2GiB\"]\n", "x.toml");
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.error().message, HasSubstr("x.toml:2: key 'device': virt:0 is given twice"));
  auto mixed = parse_config_toml("device = [\"auto\", \"virt:1=1GiB\"]\n", "x.toml");
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.error().message, HasSubstr("x.toml:1: key 'device': auto must be the only device"));
}

TEST(ConfigFile, KeySetTwiceIsRejected) {
  auto c = parse_config_toml("max_batch = 4\n[scheduling]\nmax_batch = 5\n", "x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("x.toml:3: key 'max_batch' is set twice (first on line 1)"));
}

TEST(ConfigFile, SyntaxErrorNamesFileAndPosition) {
  auto c = parse_config_toml("max_batch = \n", "x.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("x.toml:1:"));
  EXPECT_THAT(c.error().message, HasSubstr("not valid TOML"));
}

TEST(ConfigFile, MissingFileIsNamed) {
  auto c = load_config_file("/nonexistent/vramgate.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kConfig);
  EXPECT_THAT(c.error().message, HasSubstr("cannot read config file '/nonexistent/vramgate.toml'"));
}

TEST(ConfigFile, PrintedConfigReadsBackToTheSameValues) {
  ServeConfig c;
  c.model_dir = "models/with \"quotes\"\\";
  c.memory_utilization = 0.1 + 0.2;
  c.max_queue = 7;
  c.log_request_text = true;
  c.test_inject_oom_step = 1LL << 40;
  c.read_timeout_s = 30;
  const std::string text = format_config_toml(c);
  auto back = parse_config_toml(text, "printed");
  ASSERT_TRUE(back.ok()) << message(back) << "\n" << text;
  EXPECT_EQ(format_config_toml(*back), text);
  EXPECT_EQ(back->model_dir, std::filesystem::absolute(c.model_dir).lexically_normal().string()) << "printed absolute";
  EXPECT_EQ(back->memory_utilization, c.memory_utilization);
  EXPECT_EQ(back->test_inject_oom_step, c.test_inject_oom_step);
  EXPECT_THAT(text, HasSubstr("read_timeout = 30.0\n"));
  EXPECT_THAT(text, HasSubstr("\ndevice = \"auto\"\n"));  // one device: a plain string, as before
  for (const ConfigField& f : config_fields()) EXPECT_THAT(text, HasSubstr(std::string("\n") + f.key + " = "));
}

TEST(ConfigFile, PrintedConfigWithSeveralDevicesReadsBack) {
  ServeConfig c;
  c.device = {"virt:0=1GiB", "virt:1=512MiB", "cuda:0"};
  const std::string text = format_config_toml(c);
  EXPECT_THAT(text, HasSubstr("\ndevice = [\"virt:0=1GiB\", \"virt:1=512MiB\", \"cuda:0\"]\n"));
  auto back = parse_config_toml(text, "printed");
  ASSERT_TRUE(back.ok()) << message(back) << "\n" << text;
  EXPECT_EQ(back->device, c.device);
  EXPECT_EQ(format_config_toml(*back), text);
}

// --- flags and file together (ConfigFlags)

class ConfigFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("vramgate-config-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".toml");
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void write(const std::string& text) { std::ofstream(path_) << text; }

  Result<ServeConfig> parse(const std::string& args) {
    CLI::App app;
    ConfigFlags flags(app);
    app.parse(args, false);
    return flags.resolve();
  }

  std::filesystem::path path_;
};

TEST_F(ConfigFlagsTest, FlagsWinOverTheFileAndTheFileOverDefaults) {
  write("max_batch = 4\nmax_queue = 9\n[memory]\nadmission = \"fixed:2\"\n");
  auto c = parse("--config " + path_.string() + " --max-batch 6 --log-request-text");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_EQ(c->max_batch, 6);         // flag over file
  EXPECT_EQ(c->max_queue, 9);         // file over default
  EXPECT_EQ(c->admission, "fixed:2");
  EXPECT_TRUE(c->log_request_text);   // flag over default
  EXPECT_EQ(c->port, ServeConfig{}.port);
}

TEST_F(ConfigFlagsTest, AFlagGivenWithTheDefaultValueStillWinsOverTheFile) {
  write("max_batch = 4\n");
  auto c = parse("--max-batch 8 --config " + path_.string());
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_EQ(c->max_batch, 8);
}

TEST_F(ConfigFlagsTest, NoConfigFileMeansFlagsOverDefaults) {
  auto c = parse("--max-queue 3");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_EQ(c->max_queue, 3);
  EXPECT_EQ(c->max_batch, ServeConfig{}.max_batch);
}

TEST_F(ConfigFlagsTest, BadFileIsReportedEvenWhenAFlagOverridesTheKey) {
  write("max_batch = 257\n");
  auto c = parse("--config " + path_.string() + " --max-batch 4");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message,
              HasSubstr(path_.string() + ":1: key 'max_batch': must be in 0..256 (0: chosen at start-up)"));
}

TEST_F(ConfigFlagsTest, OutOfRangeFlagNamesTheFlag) {
  auto c = parse("--max-batch=-1");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message, "--max-batch: must be in 0..256 (0: chosen at start-up)");
  auto chosen = parse("--max-batch 0");
  ASSERT_TRUE(chosen.ok()) << message(chosen);
  EXPECT_EQ(chosen->max_batch, 0);
  EXPECT_EQ(chosen->max_batch_or_default(), kDefaultMaxBatch);
}

TEST_F(ConfigFlagsTest, StepProfileNeedsItsTracePath) {
  auto missing = parse("--profile-steps 3");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message, HasSubstr("--profile-trace: is required when --profile-steps is above 0"));
  auto given = parse("--profile-steps 3 --profile-min-batch 2 --profile-trace /tmp/step.json");
  ASSERT_TRUE(given.ok()) << message(given);
  EXPECT_EQ(given->profile_steps, 3);
  EXPECT_EQ(given->profile_min_batch, 2);
  EXPECT_EQ(given->profile_trace, "/tmp/step.json");
  EXPECT_EQ(message(parse("--profile-min-batch 0")), "--profile-min-batch: must be >= 1");
  EXPECT_EQ(message(parse("--profile-steps -1")), "--profile-steps: must be in 0..100000");
  EXPECT_TRUE(parse("--profile-trace /tmp/step.json").ok());  // a path alone records nothing
}

TEST_F(ConfigFlagsTest, MaxBodyBytesFlagTakesAUnitLikeMemoryReserve) {
  auto c = parse("--max-body-bytes 64MiB --memory-reserve 64MiB");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_EQ(c->max_body_bytes, std::int64_t{64} << 20);
  EXPECT_EQ(c->memory_reserve, "64MiB");
  auto plain = parse("--max-body-bytes 65536");
  ASSERT_TRUE(plain.ok()) << message(plain);
  EXPECT_EQ(plain->max_body_bytes, 65536);
  auto decimal = parse("--max-body-bytes 1.5MB");
  ASSERT_TRUE(decimal.ok()) << message(decimal);
  EXPECT_EQ(decimal->max_body_bytes, 1500000);
  auto small = parse("--max-body-bytes 1KB");
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().message, "--max-body-bytes: must be >= 1024");
  try {
    auto accepted = parse("--max-body-bytes 64parsecs");
    (void)accepted;
    ADD_FAILURE() << "64parsecs was accepted";
  } catch (const CLI::ParseError& e) {
    EXPECT_THAT(e.what(), HasSubstr("invalid byte size '64parsecs'"));
  }
}

TEST_F(ConfigFlagsTest, MissingConfigFileIsAnError) {
  auto c = parse("--config " + path_.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr("cannot read config file"));
}

TEST_F(ConfigFlagsTest, RepeatedDeviceFlagGivesSeveralDevices) {
  auto c = parse("--device virt:0=1GiB --max-batch 2 --device virt:1=1GiB");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_THAT(c->device, ElementsAre("virt:0=1GiB", "virt:1=1GiB"));
  auto one = parse("--device cuda:0");
  ASSERT_TRUE(one.ok()) << message(one);
  EXPECT_THAT(one->device, ElementsAre("cuda:0"));  // replaces the default "auto", does not add to it
  auto none = parse("--max-batch 2");
  ASSERT_TRUE(none.ok()) << message(none);
  EXPECT_THAT(none->device, ElementsAre("auto"));
}

TEST_F(ConfigFlagsTest, DeviceFlagMayBeCommaSeparated) {
  auto c = parse("--device virt:0=1GiB,virt:1=2GiB --device cuda:0");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_THAT(c->device, ElementsAre("virt:0=1GiB", "virt:1=2GiB", "cuda:0"));
}

TEST_F(ConfigFlagsTest, DeviceFlagTakesOneValuePerOccurrence) {
  CLI::App app;
  ConfigFlags flags(app);
  EXPECT_THROW(app.parse("--device virt:0=1GiB virt:1=1GiB", false), CLI::ParseError);
}

TEST_F(ConfigFlagsTest, DeviceFlagsReplaceTheFileList) {
  write("[model]\ndevice = [\"virt:0=1GiB\", \"virt:1=1GiB\"]\n");
  auto from_file = parse("--config " + path_.string());
  ASSERT_TRUE(from_file.ok()) << message(from_file);
  EXPECT_THAT(from_file->device, ElementsAre("virt:0=1GiB", "virt:1=1GiB"));
  auto c = parse("--config " + path_.string() + " --device virt:2=1GiB");
  ASSERT_TRUE(c.ok()) << message(c);
  EXPECT_THAT(c->device, ElementsAre("virt:2=1GiB"));
}

TEST_F(ConfigFlagsTest, DeviceFlagRulesNameTheFlag) {
  auto dup = parse("--device virt:0=1GiB --device virt:0=2GiB");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().message, "--device: virt:0 is given twice ('virt:0=1GiB' and 'virt:0=2GiB')");
  auto cuda = parse("--device cuda:1,cuda:1");
  ASSERT_FALSE(cuda.ok());
  EXPECT_THAT(cuda.error().message, HasSubstr("--device: cuda:1 is given twice"));
  auto mixed = parse("--device auto --device virt:1=1GiB");
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.error().message, HasSubstr("--device: auto must be the only device"));
  auto bad = parse("--device virt:0=1GiB --device gpu0");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message, HasSubstr("--device: "));
  EXPECT_THAT(bad.error().message, HasSubstr("virt:N=SIZE"));
}

TEST(ConfigFlags, EveryFieldIsAFlag) {
  CLI::App app;
  ConfigFlags flags(app);
  for (const ConfigField& f : config_fields()) EXPECT_NE(app.get_option_no_throw(flag_name(f.key)), nullptr) << f.key;
  EXPECT_NE(app.get_option_no_throw("--config"), nullptr);
}

TEST(ConfigFlags, KeysLimitTheFlags) {
  CLI::App app;
  const char* keys[] = {"device", "max_batch"};
  ConfigFlags flags(app, keys);
  EXPECT_NE(app.get_option_no_throw("--device"), nullptr);
  EXPECT_NE(app.get_option_no_throw("--max-batch"), nullptr);
  EXPECT_EQ(app.get_option_no_throw("--port"), nullptr);
}

}  // namespace
}  // namespace vg
