// API key file parsing, bearer lookup and key ids (traffic/api_keys.hpp).
#include "traffic/api_keys.hpp"

#include <gtest/gtest.h>

namespace vg::traffic {
namespace {

TEST(ApiKeys, ParsesKeysOptionsAndComments) {
  auto t = ApiKeyTable::parse(
      "# tenants\n"
      "sk-abc rate=5 burst=10 priority=high   # the batch team\n"
      "\n"
      "  sk-def\tpriority=0\r\n"
      "sk-ghi rate=0.5\n",
      "keys.txt");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->size(), 3u);
  const ApiKey* abc = t->find("sk-abc");
  ASSERT_NE(abc, nullptr);
  EXPECT_EQ(abc->rate, 5.0);
  EXPECT_EQ(abc->burst, 10.0);
  EXPECT_EQ(abc->priority, Priority::kHigh);
  const ApiKey* def = t->find("sk-def");
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(def->priority, Priority::kLow);
  EXPECT_FALSE(def->rate.has_value());
  EXPECT_EQ(t->find("sk-ghi")->rate, 0.5);
  EXPECT_EQ(t->find("sk-nope"), nullptr);
  EXPECT_EQ(t->find("sk-ab"), nullptr);
}

TEST(ApiKeys, KeyIdIsShortHexAndNotTheKey) {
  auto t = ApiKeyTable::parse("sk-secret-123\nsk-secret-124\n", "k");
  ASSERT_TRUE(t.ok());
  const ApiKey* a = t->find("sk-secret-123");
  const ApiKey* b = t->find("sk-secret-124");
  EXPECT_EQ(a->id.size(), 8u);
  EXPECT_EQ(a->id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a->id, b->id);
  EXPECT_EQ(a->id, key_id("sk-secret-123"));
  EXPECT_EQ(a->scope.size(), 64u);
  EXPECT_EQ(a->scope.substr(0, 8), a->id);
  // SHA-256("abc") starts ba7816bf (FIPS 180-2, appendix B.1).
  EXPECT_EQ(key_id("abc"), "ba7816bf");
}

TEST(ApiKeys, BearerHeaderForms) {
  auto t = ApiKeyTable::parse("sk-abc\n", "k");
  ASSERT_TRUE(t.ok());
  EXPECT_NE(t->authorize("Bearer sk-abc"), nullptr);
  EXPECT_NE(t->authorize("bearer sk-abc"), nullptr);
  EXPECT_NE(t->authorize("  BEARER   sk-abc  "), nullptr);
  EXPECT_EQ(t->authorize(""), nullptr);
  EXPECT_EQ(t->authorize("sk-abc"), nullptr);
  EXPECT_EQ(t->authorize("Basic sk-abc"), nullptr);
  EXPECT_EQ(t->authorize("Bearer"), nullptr);
  EXPECT_EQ(t->authorize("Bearer "), nullptr);
  EXPECT_EQ(t->authorize("Bearer sk-abd"), nullptr);
  EXPECT_EQ(t->authorize("Bearer sk-abc extra"), nullptr);
}

TEST(ApiKeys, ErrorsNameTheLineAndNeverTheKey) {
  const struct {
    const char* text;
    const char* line;
    const char* what;
  } cases[] = {
      {"sk-a\nsk-b rate=fast\n", "k:2:", "rate must be"},
      {"sk-a rate=0\n", "k:1:", "rate must be"},
      {"sk-a burst=0.5\n", "k:1:", "burst must be"},
      {"sk-a priority=urgent\n", "k:1:", "priority must be"},
      {"sk-a colour=red\n", "k:1:", "unknown option 'colour'"},
      {"sk-a rate\n", "k:1:", "expected name=value"},
      {"rate=5\n", "k:1:", "must start with the key"},
      {"sk-a\n# again\nsk-a\n", "k:3:", "duplicate key"},
      {"# nothing\n\n", "k:2:", "no API key"},
      {"", "k:1:", "no API key"},
  };
  for (const auto& c : cases) {
    auto t = ApiKeyTable::parse(c.text, "k");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.error().code, ErrorCode::kConfig);
    EXPECT_EQ(t.error().message.rfind(c.line, 0), 0u) << t.error().message;
    EXPECT_NE(t.error().message.find(c.what), std::string::npos) << t.error().message;
    EXPECT_EQ(t.error().message.find("sk-a"), std::string::npos) << t.error().message;
  }
}

TEST(ApiKeys, LoadReportsUnreadableFile) {
  auto t = ApiKeyTable::load("/nonexistent/keys.txt");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("/nonexistent/keys.txt"), std::string::npos);
}

TEST(Priority, ParsesNamesAndNumbers) {
  EXPECT_EQ(parse_priority("low"), Priority::kLow);
  EXPECT_EQ(parse_priority("1"), Priority::kNormal);
  EXPECT_EQ(parse_priority("high"), Priority::kHigh);
  EXPECT_EQ(parse_priority("2"), Priority::kHigh);
  EXPECT_FALSE(parse_priority("3").has_value());
  EXPECT_FALSE(parse_priority("HIGH").has_value());
  EXPECT_FALSE(parse_priority("").has_value());
  EXPECT_EQ(min_priority(Priority::kHigh, Priority::kNormal), Priority::kNormal);
  EXPECT_STREQ(to_string(Priority::kLow), "low");
}

}  // namespace
}  // namespace vg::traffic
