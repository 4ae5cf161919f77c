#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "queue/redis_url.hpp"

namespace vg::queue {
namespace {

RedisUrl parse_ok(const std::string& text) {
  auto url = parse_redis_url(text);
  EXPECT_TRUE(url.ok()) << text << ": " << (url ? "" : url.error().message);
  return url ? *url : RedisUrl{};
}

std::string parse_error(const std::string& text) {
  auto url = parse_redis_url(text);
  EXPECT_FALSE(url.ok()) << text << " parsed";
  if (url) return "";
  EXPECT_EQ(url.error().code, ErrorCode::kConfig);
  return url.error().message;
}

TEST(RedisUrl, HostOnlyTakesTheDefaults) {
  RedisUrl url = parse_ok("redis://queue.internal");
  EXPECT_EQ(url.host, "queue.internal");
  EXPECT_EQ(url.port, 6379);
  EXPECT_EQ(url.db, 0);
  EXPECT_TRUE(url.user.empty());
  EXPECT_TRUE(url.password.empty());
}

TEST(RedisUrl, PortAndDatabase) {
  RedisUrl url = parse_ok("redis://127.0.0.1:7001/5");
  EXPECT_EQ(url.host, "127.0.0.1");
  EXPECT_EQ(url.port, 7001);
  EXPECT_EQ(url.db, 5);
  EXPECT_EQ(parse_ok("redis://h:1/").db, 0);
  EXPECT_EQ(parse_ok("redis://h:65535").port, 65535);
}

TEST(RedisUrl, UserAndPassword) {
  RedisUrl url = parse_ok("redis://alice:s3cret@10.0.0.2:6380/1");
  EXPECT_EQ(url.user, "alice");
  EXPECT_EQ(url.password, "s3cret");
  EXPECT_EQ(url.host, "10.0.0.2");
  EXPECT_EQ(url.port, 6380);
  EXPECT_EQ(url.db, 1);
}

TEST(RedisUrl, PasswordForTheDefaultUser) {
  RedisUrl url = parse_ok("redis://:only-a-password@h");
  EXPECT_TRUE(url.user.empty());
  EXPECT_EQ(url.password, "only-a-password");
}

TEST(RedisUrl, PercentDecodingOfUserAndPassword) {
  RedisUrl url = parse_ok("redis://b%6Fb:p%40ss%3Aw%2Frd%25%20x@h:1");
  EXPECT_EQ(url.user, "bob");
  EXPECT_EQ(url.password, "p@ss:w/rd% x");
  // A raw '@' inside the password: the last '@' ends the credentials.
  EXPECT_EQ(parse_ok("redis://u:a@b@h").password, "a@b");
  // ':' after the first one belongs to the password.
  EXPECT_EQ(parse_ok("redis://u:a:b@h").password, "a:b");
}

TEST(RedisUrl, UserWithoutPasswordTakesItFromASource) {
  RedisUrl url = parse_ok("redis://alice@h");
  EXPECT_EQ(url.user, "alice");
  EXPECT_TRUE(url.password.empty());
}

TEST(RedisUrl, Ipv6InBrackets) {
  RedisUrl url = parse_ok("redis://[::1]:6390/2");
  EXPECT_EQ(url.host, "::1");
  EXPECT_EQ(url.port, 6390);
  EXPECT_EQ(url.db, 2);
  EXPECT_EQ(url.redacted(), "redis://[::1]:6390/2");
}

TEST(RedisUrl, RedactedNeverShowsThePassword) {
  RedisUrl url = parse_ok("redis://alice:topsecret@h:7/3");
  EXPECT_EQ(url.redacted(), "redis://alice@h:7/3");
  EXPECT_EQ(url.redacted().find("topsecret"), std::string::npos);
}

TEST(RedisUrl, BadUrlsAreRefusedWithAReason) {
  EXPECT_NE(parse_error("http://h").find("redis://"), std::string::npos);
  EXPECT_NE(parse_error("rediss://h").find("TLS"), std::string::npos);
  EXPECT_NE(parse_error("redis://").find("empty host"), std::string::npos);
  EXPECT_NE(parse_error("redis://:6379").find("empty host"), std::string::npos);
  EXPECT_NE(parse_error("redis://h:0").find("port"), std::string::npos);
  EXPECT_NE(parse_error("redis://h:65536").find("port"), std::string::npos);
  EXPECT_NE(parse_error("redis://h:").find("port"), std::string::npos);
  EXPECT_NE(parse_error("redis://h:+1").find("port"), std::string::npos);
  EXPECT_NE(parse_error("redis://h:12x").find("port"), std::string::npos);
  EXPECT_NE(parse_error("redis://h/-1").find("database"), std::string::npos);
  EXPECT_NE(parse_error("redis://h/1/2").find("database"), std::string::npos);
  EXPECT_NE(parse_error("redis://h/x").find("database"), std::string::npos);
  EXPECT_NE(parse_error("redis://h?db=1").find("query"), std::string::npos);
  EXPECT_NE(parse_error("redis://@h").find("empty user"), std::string::npos);
  EXPECT_NE(parse_error("redis://alice:@h").find("empty password"), std::string::npos);
  EXPECT_NE(parse_error("redis://u:p%4@h").find("percent"), std::string::npos);
  EXPECT_NE(parse_error("redis://u:p%zz@h").find("percent"), std::string::npos);
  EXPECT_NE(parse_error("redis://u%2:p@h").find("percent"), std::string::npos);
  EXPECT_NE(parse_error("redis://h h").find("host"), std::string::npos);
  EXPECT_NE(parse_error("redis://[::1").find("["), std::string::npos);
  EXPECT_NE(parse_error("redis://[::1]x").find("]"), std::string::npos);
  EXPECT_NE(parse_error("redis://[zz]").find("IPv6"), std::string::npos);
}

TEST(RedisUrl, ErrorsNeverRepeatThePassword) {
  std::string message = parse_error("redis://u:hunter2@h:99999");
  EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
}

TEST(PercentDecode, DecodesEscapesOfEitherCase) {
  auto out = percent_decode("a%2fb%2Fc%00d");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, std::string("a/b/c\0d", 7));
  EXPECT_FALSE(percent_decode("%").ok());
  EXPECT_FALSE(percent_decode("%a").ok());
  EXPECT_FALSE(percent_decode("%g0").ok());
  EXPECT_EQ(*percent_decode("1+2"), "1+2");
}

PasswordSource source(const std::string& file, const std::string& env_var) {
  PasswordSource s;
  s.file = file;
  s.env_var = env_var;
  return s;
}

class PasswordFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("vg_redis_url_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content) {
    auto path = dir_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path.string();
  }
  std::filesystem::path dir_;
};

TEST_F(PasswordFileTest, OneTrailingNewlineIsDropped) {
  EXPECT_EQ(*read_password_file(write("a", "pw\n")), "pw");
  EXPECT_EQ(*read_password_file(write("b", "pw\r\n")), "pw");
  EXPECT_EQ(*read_password_file(write("c", "pw")), "pw");
  EXPECT_EQ(*read_password_file(write("d", " spaced pw ")), " spaced pw ");
}

TEST_F(PasswordFileTest, BadFilesAreRefused) {
  EXPECT_FALSE(read_password_file((dir_ / "missing").string()).ok());
  EXPECT_FALSE(read_password_file(write("empty", "")).ok());
  EXPECT_FALSE(read_password_file(write("newline-only", "\n")).ok());
  EXPECT_FALSE(read_password_file(write("two-lines", "a\nb\n")).ok());
  EXPECT_FALSE(read_password_file(write("nul", std::string("a\0b", 3))).ok());
  EXPECT_FALSE(read_password_file(write("big", std::string(5000, 'x'))).ok());
  auto error = read_password_file(write("empty2", ""));
  EXPECT_EQ(error.error().code, ErrorCode::kConfig);
  EXPECT_NE(error.error().message.find("empty"), std::string::npos);
}

TEST_F(PasswordFileTest, WithPasswordFromAFileOrTheEnvironment) {
  std::map<std::string, std::string> vars{{"VG_REDIS_PASSWORD", "from-env"}, {"EMPTY", ""}};
  EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  RedisUrl base = *parse_redis_url("redis://h:1");
  RedisUrl with_user = *parse_redis_url("redis://alice@h:1");

  auto from_file = with_password(with_user, source(write("pw", "from-file\n"), ""), env);
  ASSERT_TRUE(from_file.ok()) << from_file.error().message;
  EXPECT_EQ(from_file->password, "from-file");
  EXPECT_EQ(from_file->user, "alice");

  auto from_env = with_password(base, source("", "VG_REDIS_PASSWORD"), env);
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->password, "from-env");

  EXPECT_EQ(with_password(base, {}, env)->password, "");
  EXPECT_FALSE(with_password(base, source("", "UNSET"), env).ok());
  EXPECT_FALSE(with_password(base, source("", "EMPTY"), env).ok());
  EXPECT_FALSE(with_password(base, source(write("x", "a"), "VG_REDIS_PASSWORD"), env).ok());
  RedisUrl has_one = *parse_redis_url("redis://u:inurl@h");
  auto twice = with_password(has_one, source("", "VG_REDIS_PASSWORD"), env);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("twice"), std::string::npos);
}

}  // namespace
}  // namespace vg::queue
