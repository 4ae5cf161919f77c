// Chat templates render exactly the strings the models' own Jinja templates
// produce (worked out from the templates in their tokenizer_config.json),
// and model templates are recognised by their markers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/chat_template.hpp"

namespace vg {
namespace {

const std::vector<ChatMessage> kConversation{
    {"system", "You are terse."},
    {"user", "Hi there "},
    {"assistant", "Hello."},
    {"user", "What is 2+2?"},
};

std::string render(ChatFormat f, const std::vector<ChatMessage>& m, ChatTokens t = {}) {
  auto r = render_chat(f, m, t);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : std::string();
}

TEST(ChatTemplate, ChatMl) {
  EXPECT_EQ(render(ChatFormat::kChatMl, kConversation),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi there <|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chat_stop_text(ChatFormat::kChatMl, {}), "<|im_end|>");
}

TEST(ChatTemplate, Llama2) {
  EXPECT_EQ(render(ChatFormat::kLlama2, kConversation),
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello. </s>"
            "<s>[INST] What is 2+2? [/INST]");
  EXPECT_EQ(render(ChatFormat::kLlama2, {{"user", "  Hi  "}}), "<s>[INST] Hi [/INST]");
  EXPECT_EQ(chat_stop_text(ChatFormat::kLlama2, {}), "</s>");
}

TEST(ChatTemplate, Llama2RolesMustAlternate) {
  auto r = render_chat(ChatFormat::kLlama2, std::vector<ChatMessage>{{"user", "a"}, {"user", "b"}}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(r.error().message.find("alternate"), std::string::npos);
  EXPECT_FALSE(render_chat(ChatFormat::kLlama2, std::vector<ChatMessage>{{"assistant", "a"}}, {}).ok());
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(render(ChatFormat::kLlama3, kConversation),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(chat_stop_text(ChatFormat::kLlama3, {}), "<|eot_id|>");
}

TEST(ChatTemplate, Zephyr) {
  EXPECT_EQ(render(ChatFormat::kZephyr, kConversation),
            "<|system|>\nYou are terse.</s>\n"
            "<|user|>\nHi there </s>\n"
            "<|assistant|>\nHello.</s>\n"
            "<|user|>\nWhat is 2+2?</s>\n"
            "<|assistant|>\n");
}

TEST(ChatTemplate, TokenTextsFromTheModel) {
  const ChatTokens t{"<BOS>", "<EOS>"};
  EXPECT_EQ(render(ChatFormat::kZephyr, {{"user", "x"}}, t), "<|user|>\nx<EOS>\n<|assistant|>\n");
  EXPECT_EQ(render(ChatFormat::kLlama2, {{"user", "x"}, {"assistant", "y"}}, t), "<BOS>[INST] x [/INST] y <EOS>");
  EXPECT_EQ(chat_stop_text(ChatFormat::kZephyr, t), "<EOS>");
}

TEST(ChatTemplate, RejectsEmptyAndUnknownRoles) {
  EXPECT_FALSE(render_chat(ChatFormat::kChatMl, std::vector<ChatMessage>{}, {}).ok());
  auto r = render_chat(ChatFormat::kChatMl, std::vector<ChatMessage>{{"tool", "x"}}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("messages[0].role"), std::string::npos);
}

TEST(ChatTemplate, RecognisesModelTemplates) {
  // Abbreviated from the models' tokenizer_config.json.
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const std::string llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}";
  const std::string llama2 =
      "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
      "'\\n<</SYS>>\\n\\n' + message['content'] %}{% endif %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}";
  const std::string zephyr =
      "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + "
      "eos_token }}\n{% endif %}{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}";
  EXPECT_EQ(detect_chat_format(chatml), ChatFormat::kChatMl);
  EXPECT_EQ(detect_chat_format(llama3), ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_format(llama2), ChatFormat::kLlama2);
  EXPECT_EQ(detect_chat_format(zephyr), ChatFormat::kZephyr);
  EXPECT_FALSE(detect_chat_format("{{ messages[0]['content'] }}").has_value());
  EXPECT_EQ(chat_format_from("llama-3").value(), ChatFormat::kLlama3);
  EXPECT_EQ(chat_format_from(zephyr).value(), ChatFormat::kZephyr);
  auto unknown = chat_format_from("vicuna");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, ErrorCode::kInvalidRequest);
  for (ChatFormat f : {ChatFormat::kChatMl, ChatFormat::kLlama2, ChatFormat::kLlama3, ChatFormat::kZephyr}) {
    EXPECT_EQ(parse_chat_format(chat_format_name(f)), f);
  }
}

TEST(ChatTemplate, RequestFormatWinsOverConfigured) {
  const std::vector<ChatMessage> m{{"user", "x"}};
  auto by_request = render_chat_request(m, "zephyr", ChatFormat::kChatMl, {}, "m");
  ASSERT_TRUE(by_request.ok());
  EXPECT_EQ(by_request->format, ChatFormat::kZephyr);
  EXPECT_EQ(by_request->prompt, "<|user|>\nx</s>\n<|assistant|>\n");
  EXPECT_EQ(by_request->stop, "</s>");
  auto configured = render_chat_request(m, "", ChatFormat::kChatMl, {}, "m");
  ASSERT_TRUE(configured.ok());
  EXPECT_EQ(configured->stop, "<|im_end|>");
  auto none = render_chat_request(m, "", std::nullopt, {}, "tinylm");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(none.error().message.find("model 'tinylm' has no chat template"), std::string::npos);
}

TEST(ChatTemplate, ReadsTokenizerConfig) {
  const auto dir = std::filesystem::temp_directory_path() / ("vg_chat_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto none = read_chat_template(dir);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->jinja.empty());
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>", "special": true}, "eos_token": "<|im_end|>",
            "chat_template": [{"name": "tool_use", "template": "x"},
                              {"name": "default", "template": "<|im_start|>{{m}}<|im_end|>"}]})";
  auto got = read_chat_template(dir);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->jinja, "<|im_start|>{{m}}<|im_end|>");
  EXPECT_EQ(got->tokens.bos, "<s>");
  EXPECT_EQ(got->tokens.eos, "<|im_end|>");
  std::ofstream(dir / "tokenizer_config.json") << "{not json";
  auto bad = read_chat_template(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kModelLoad);
}

}  // namespace
}  // namespace vg
