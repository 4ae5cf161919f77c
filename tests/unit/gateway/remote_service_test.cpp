// The gateway's RemoteService against real EngineServers over Unix sockets,
// with a scripted fake Service behind each (remote_service_fixture.hpp):
// submissions and their events, refusals, cancellation, the secret, and what
// happens to requests when an engine goes away (resubmission, resume after
// the tokens sent, the crash limit). Waits are on conditions with deadlines,
// never sleeps.
#include "gateway/remote_service.hpp"

#include <gtest/gtest.h>

#include "remote_service_fixture.hpp"

namespace vg::gateway::remote_testing {
namespace {

TEST_F(RemoteServiceTest, SubmitsAndForwardsEventsInOrder) {
  FakeService& fake = new_fake();
  start_engine(fake);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  auto rec = std::make_shared<Recorder>();
  auto sub = gateway_->submit(request("r1"), rec);
  ASSERT_TRUE(sub.ok()) << sub.error().message;
  EXPECT_EQ(sub->prompt_tokens, 3);
  EXPECT_EQ(sub->cost_bytes, 1000);
  auto s = fake.wait_sub(1);
  EXPECT_EQ(s.request.request_id, "r1");
  s.sink->push(StartedEvent{1.0});
  s.sink->push(TextEvent{"ab", 2, 0, {}, {5, 6}});
  s.sink->push(FinishedEvent{"length", {3, 2}, {}, 0});
  ASSERT_TRUE(rec->wait_terminal());
  EXPECT_EQ(rec->text(), "ab");
  EXPECT_EQ(std::get<FinishedEvent>(rec->events.back()).usage.completion_tokens, 2);
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
  EXPECT_EQ(gateway_->models().at(0).id, "fake");
  EXPECT_EQ(gateway_->admission_state().counters[CounterId::kCompleted], 1);
}

TEST_F(RemoteServiceTest, ARequestThatEndsBeforeItsSubmitIsAnsweredIsStillAccepted) {
  FakeService& fake = new_fake();
  fake.finish_in_submit = true;
  start_engine(fake);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  for (int i = 0; i < 20; ++i) {
    auto rec = std::make_shared<Recorder>();
    const TimePoint t0 = Clock::now();
    auto sub = gateway_->submit(request("r" + std::to_string(i)), rec);
    ASSERT_TRUE(sub.ok()) << sub.error().message;
    EXPECT_LT(Clock::now() - t0, 5s);  // answered, not timed out
    ASSERT_TRUE(rec->wait_terminal());
    EXPECT_EQ(rec->text(), "x");
  }
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
}

TEST_F(RemoteServiceTest, EngineRefusalIsTheSubmitError) {
  FakeService& fake = new_fake();
  Error e(ErrorCode::kOverloaded, "queue full");
  e.retry_after_s = 2.0;
  fake.refuse = e;
  start_engine(fake);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  auto sub = gateway_->submit(request("r1"), std::make_shared<Recorder>());
  ASSERT_FALSE(sub.ok());
  EXPECT_EQ(sub.error().code, ErrorCode::kOverloaded);
  EXPECT_EQ(sub.error().retry_after_s, std::optional<double>(2.0));
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
}

TEST_F(RemoteServiceTest, CancelReachesTheEngine) {
  FakeService& fake = new_fake();
  start_engine(fake);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  auto rec = std::make_shared<Recorder>();
  auto sub = gateway_->submit(request("r1"), rec);
  ASSERT_TRUE(sub.ok());
  auto s = fake.wait_sub(1);
  sub->handle->cancel();
  EXPECT_TRUE(fake.wait_cancelled(s));
  s.sink->push(FailedEvent{Error(ErrorCode::kCancelled, "gone"), {}, {}});
  ASSERT_TRUE(rec->wait_terminal());
}

TEST_F(RemoteServiceTest, WrongSecretIsRefused) {
  FakeService& fake = new_fake();
  start_engine(fake, "another secret");
  start_gateway();
  EXPECT_FALSE(gateway_->wait_ready(Clock::now() + 1s));
  EXPECT_EQ(engine_->connections(), 0);
  auto sub = gateway_->submit(request("r1"), std::make_shared<Recorder>());
  ASSERT_FALSE(sub.ok());
  EXPECT_EQ(sub.error().code, ErrorCode::kOverloaded);
  EXPECT_TRUE(sub.error().retry_after_s.has_value());
  EXPECT_FALSE(gateway_->ready());
}

TEST_F(RemoteServiceTest, ResumesAfterTheTokensSentWhenTheEngineGoes) {
  FakeService& first = new_fake();
  start_engine(first);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  auto rec = std::make_shared<Recorder>();
  CompletionRequest r1 = request("r1");
  r1.timeout_s = 60;
  auto sub = gateway_->submit(r1, rec);
  ASSERT_TRUE(sub.ok());
  auto s1 = first.wait_sub(1);
  ASSERT_TRUE(s1.request.timeout_s.has_value());
  EXPECT_LE(*s1.request.timeout_s, 60.0);
  s1.sink->push(StartedEvent{});
  s1.sink->push(TextEvent{"ab", 2, 0, {}, {5, 6}});
  ASSERT_TRUE(rec->wait_count(2));
  // The engine goes away; a new one takes its socket.
  engine_->stop();
  engine_.reset();
  FakeService& second = new_fake();
  start_engine(second);
  auto s2 = second.wait_sub(1);
  EXPECT_EQ(s2.resume.tokens, (std::vector<std::int32_t>{5, 6}));
  EXPECT_EQ(s2.request.request_id, "r1");
  // Its deadline runs from the client's request: the new engine gets what is left.
  ASSERT_TRUE(s2.request.timeout_s.has_value());
  EXPECT_LT(*s2.request.timeout_s, *s1.request.timeout_s);
  EXPECT_GT(*s2.request.timeout_s, 0.0);
  s2.sink->push(StartedEvent{});  // not shown twice
  s2.sink->push(TextEvent{"c", 1, 0, {}, {7}});
  s2.sink->push(FinishedEvent{"length", {3, 3}, {}, 0});
  ASSERT_TRUE(rec->wait_terminal());
  EXPECT_EQ(rec->text(), "abc");
  EXPECT_EQ(rec->count_started(), 1);
  EXPECT_TRUE(std::holds_alternative<FinishedEvent>(rec->events.back()));
}

TEST_F(RemoteServiceTest, AResumedRequestTheNewEngineHasNoRoomForIsOfferedAgainNotEnded) {
  FakeService& first = new_fake();
  start_engine(first);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  auto rec = std::make_shared<Recorder>();
  ASSERT_TRUE(gateway_->submit(request("r1"), rec).ok());
  auto s1 = first.wait_sub(1);
  s1.sink->push(StartedEvent{});
  s1.sink->push(TextEvent{"ab", 2, 0, {}, {5, 6}});
  ASSERT_TRUE(rec->wait_count(2));
  engine_->stop();
  engine_.reset();
  // The new engine's queue is full the first two times the gateway offers
  // the request (Retry-After 0.05 s); the third offer is taken.
  FakeService& second = new_fake();
  second.refuse_first = 2;
  second.first_refusal.retry_after_s = 0.05;
  second.first_refusal.retry_token = "booked-1";
  start_engine(second);
  auto s2 = second.wait_sub(1);
  EXPECT_EQ(second.refused.load(), 2);
  EXPECT_EQ(s2.resume.tokens, (std::vector<std::int32_t>{5, 6}));
  EXPECT_EQ(s2.request.retry.token, "booked-1");  // it claims the place the engine booked for it
  EXPECT_EQ(rec->count(), 2u);  // the client saw nothing of the refusals
  s2.sink->push(TextEvent{"c", 1, 0, {}, {7}});
  s2.sink->push(FinishedEvent{"length", {3, 3}, {}, 0});
  ASSERT_TRUE(rec->wait_terminal());
  EXPECT_EQ(rec->text(), "abc");
  EXPECT_TRUE(std::holds_alternative<FinishedEvent>(rec->events.back()));
}

TEST_F(RemoteServiceTest, ARequestHeldAfterARefusalGoesToAnEngineWithRoomBeforeItsRetryAfter) {
  // Two engines; the request runs on the first, which goes away. The second
  // is full: it refuses with a Retry-After of 60 s and a booked place. The
  // first comes back empty: the request goes there at once, without the
  // other engine's token.
  FakeService& a = new_fake();
  FakeService& b = new_fake();
  a.budget_bytes = 1'000'000;
  b.budget_bytes = 500'000;  // less free budget: the request is placed on a
  b.refuse_first = 1;
  b.first_refusal.retry_after_s = 60;
  b.first_refusal.retry_token = "booked-on-b";
  start_engines_and_gateway({&a, &b});
  auto rec = std::make_shared<Recorder>();
  ASSERT_TRUE(gateway_->submit(request("r1"), rec).ok());
  auto s1 = a.wait_sub(1);
  s1.sink->push(StartedEvent{});
  s1.sink->push(TextEvent{"ab", 2, 0, {}, {5, 6}});
  ASSERT_TRUE(rec->wait_count(2));
  more_engines_[0]->stop();
  ASSERT_TRUE(b.wait_refused(1));  // b is offered it and refuses
  FakeService& a2 = new_fake();
  a2.budget_bytes = 1'000'000;
  ASSERT_FALSE(start_numbered_engine(0, a2).empty());  // a restarted on its socket
  auto s2 = a2.wait_sub(1);  // within 10 s: long before b's 60 s
  EXPECT_EQ(s2.request.request_id, "r1");
  EXPECT_EQ(s2.resume.tokens, (std::vector<std::int32_t>{5, 6}));
  EXPECT_TRUE(s2.request.retry.token.empty());  // b's booked place is b's
  EXPECT_EQ(b.submissions(), 0u);
  s2.sink->push(FinishedEvent{"length", {3, 2}, {}, 0});
  ASSERT_TRUE(rec->wait_terminal());
  EXPECT_EQ(rec->text(), "ab");
}

TEST_F(RemoteServiceTest, RequestRunningAtEachCrashFailsWithEngineCrashed) {
  FakeService& first = new_fake();
  start_engine(first);
  start_gateway(/*max_crash_retries=*/2);
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  auto rec = std::make_shared<Recorder>();
  ASSERT_TRUE(gateway_->submit(request("poison"), rec).ok());
  auto queued = std::make_shared<Recorder>();
  ASSERT_TRUE(gateway_->submit(request("queued"), queued).ok());
  first.wait_sub(2);
  first.wait_sub(1).sink->push(StartedEvent{});  // running; "queued" never starts
  ASSERT_TRUE(rec->wait_count(1));
  engine_->stop();
  engine_.reset();
  FakeService& second = new_fake();
  start_engine(second);
  // Both come back as suspects, in their order, one at a time.
  auto again = second.wait_sub(1);
  EXPECT_EQ(again.request.request_id, "poison");
  again.sink->push(StartedEvent{});
  engine_->stop();
  engine_.reset();
  ASSERT_TRUE(rec->wait_terminal());
  const auto& f = std::get<FailedEvent>(rec->events.back());
  EXPECT_EQ(f.error.code, ErrorCode::kEngineCrashed);
  EXPECT_NE(f.error.message.find("poison"), std::string::npos);
  // The other one was held (queued) at the first crash only, and waited
  // for the suspect ahead of it at the second: it carries on.
  FakeService& third = new_fake();
  start_engine(third);
  auto q = third.wait_sub(1);
  EXPECT_EQ(q.request.request_id, "queued");
  q.sink->push(FinishedEvent{"stop", {3, 0}, {}, 0});
  ASSERT_TRUE(queued->wait_terminal());
  EXPECT_TRUE(std::holds_alternative<FinishedEvent>(queued->events.back()));
}

TEST_F(RemoteServiceTest, PlacesEachRequestOnTheEngineWithTheMostFreeBudget) {
  FakeService& a = new_fake();
  FakeService& b = new_fake();
  a.budget_bytes = b.budget_bytes = 10'000;
  a.reserved_bytes = 6'000;  // 4,000 free
  b.reserved_bytes = 3'000;  // 7,000 free
  start_engines_and_gateway({&a, &b});
  std::vector<std::shared_ptr<RequestHandle>> held;
  // b has the more free budget until what the gateway placed there (1,000
  // each) leaves it with less than a: 7,000, 6,000, 5,000, then 4,000 = a's
  // 4,000 (a tie: fewer requests in flight wins).
  for (int i = 0; i < 4; ++i) {
    auto sub = gateway_->submit(request("b" + std::to_string(i)), std::make_shared<Recorder>());
    ASSERT_TRUE(sub.ok()) << sub.error().message;
    held.push_back(sub->handle);
  }
  EXPECT_EQ(b.submissions(), 3u);
  EXPECT_EQ(a.submissions(), 1u);
  // The engines' own state, once known, decides again: a frees its other bytes.
  a.reserved_bytes = 0;
  (void)gateway_->admission_state();
  auto sub = gateway_->submit(request("a"), std::make_shared<Recorder>());
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(a.submissions(), 2u);
  for (auto& h : held) h->cancel();
  sub->handle->cancel();
}

TEST_F(RemoteServiceTest, PlacementPrefersAnEngineWithAFreeSequenceSlot) {
  FakeService& a = new_fake();
  FakeService& b = new_fake();
  a.budget_bytes = b.budget_bytes = 100'000;
  b.reserved_bytes = 50'000;            // less free budget than a ...
  a.max_running = b.max_running = 2;
  a.running = 2;                        // ... but a's batch is full
  start_engines_and_gateway({&a, &b});
  auto sub = gateway_->submit(request("r"), std::make_shared<Recorder>());
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(b.wait_sub(1).request.request_id, "r");
  EXPECT_EQ(a.submissions(), 0u);
  sub->handle->cancel();
}

TEST_F(RemoteServiceTest, ARequestTooLargeForOneEngineGoesToAnEngineWithALargerBudget) {
  FakeService& small = new_fake();
  FakeService& large = new_fake();
  small.budget_bytes = 1'000;   // all free: placement tries it first
  large.budget_bytes = 8'000;
  large.reserved_bytes = 7'500;  // 500 free
  small.refuse = exceeds_device_memory(5'000, 1'000, false);
  start_engines_and_gateway({&small, &large});
  auto sub = gateway_->submit(request("big"), std::make_shared<Recorder>());
  ASSERT_TRUE(sub.ok()) << sub.error().message;
  EXPECT_EQ(large.wait_sub(1).request.request_id, "big");
  EXPECT_EQ(small.submissions(), 0u);  // it refused
  sub->handle->cancel();
}

TEST_F(RemoteServiceTest, ARequestTooLargeForEveryEngineIsRefusedWithTheLargestBudget) {
  FakeService& small = new_fake();
  FakeService& large = new_fake();
  small.budget_bytes = 1'000;
  large.budget_bytes = 2'000;
  large.reserved_bytes = 1'500;
  small.refuse = exceeds_device_memory(5'000, 1'000, false);
  large.refuse = exceeds_device_memory(5'000, 2'000, false);
  start_engines_and_gateway({&small, &large});
  auto sub = gateway_->submit(request("huge"), std::make_shared<Recorder>());
  ASSERT_FALSE(sub.ok());
  EXPECT_EQ(sub.error().code, ErrorCode::kExceedsDeviceMemory);
  EXPECT_EQ(sub.error().needed_bytes, std::optional<std::int64_t>(5'000));
  EXPECT_EQ(sub.error().budget_bytes, std::optional<std::int64_t>(2'000));
  EXPECT_NE(sub.error().message.find("largest device budget"), std::string::npos) << sub.error().message;
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
}

TEST_F(RemoteServiceTest, ARequestWaitingInOneEnginesQueueMovesToAnEngineWhereRoomFreed) {
  FakeService& a = new_fake();
  FakeService& b = new_fake();
  a.budget_bytes = b.budget_bytes = 1'000;
  a.reserved_bytes = b.reserved_bytes = 1'000;  // both full
  start_engines_and_gateway({&a, &b});
  auto rec = std::make_shared<Recorder>();
  auto sub = gateway_->submit(request("r1"), rec);  // a tie: the first engine
  ASSERT_TRUE(sub.ok());
  auto on_a = a.wait_sub(1);
  a.queue_depth = 1;  // it waits there
  b.reserved_bytes = 0;  // b's other request ended: room for one
  (void)gateway_->admission_state();
  ASSERT_TRUE(a.wait_withdrawn(on_a));
  auto on_b = b.wait_sub(1);
  EXPECT_EQ(on_b.request.request_id, "r1");
  EXPECT_TRUE(on_b.resume.tokens.empty());
  EXPECT_FALSE(on_a.cancelled->load());  // taken back, not cancelled
  on_b.sink->push(StartedEvent{});
  on_b.sink->push(TextEvent{"ok", 1, 0, {}, {9}});
  on_b.sink->push(FinishedEvent{"length", {3, 1}, {}, 0});
  ASSERT_TRUE(rec->wait_terminal());
  EXPECT_EQ(rec->text(), "ok");
  EXPECT_EQ(rec->count_started(), 1);
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
}

TEST_F(RemoteServiceTest, ARequestAdmittedBeforeItCouldBeMovedStaysWhereItIs) {
  FakeService& a = new_fake();
  FakeService& b = new_fake();
  a.budget_bytes = b.budget_bytes = 1'000;
  a.reserved_bytes = b.reserved_bytes = 1'000;
  a.admitted = true;  // withdraw comes too late
  start_engines_and_gateway({&a, &b});
  auto rec = std::make_shared<Recorder>();
  auto sub = gateway_->submit(request("r1"), rec);
  ASSERT_TRUE(sub.ok());
  auto on_a = a.wait_sub(1);
  a.queue_depth = 1;
  b.reserved_bytes = 0;
  (void)gateway_->admission_state();
  // The gateway asks (the monitor runs every 20 ms) and is refused: the
  // request runs on a, and b never sees it.
  ASSERT_TRUE(a.wait_withdraw_asked());
  on_a.sink->push(StartedEvent{});
  on_a.sink->push(TextEvent{"x", 1, 0, {}, {4}});
  on_a.sink->push(FinishedEvent{"length", {3, 1}, {}, 0});
  ASSERT_TRUE(rec->wait_terminal());
  EXPECT_EQ(rec->text(), "x");
  EXPECT_EQ(b.submissions(), 0u);
  EXPECT_FALSE(on_a.withdrawn->load());
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
}

TEST_F(RemoteServiceTest, TheGatewayEncodesTextAndChatPromptsWithTheModelsTokenizer) {
  FakeService& fake = new_fake();
  fake.model_dir = (dir_ / "model").string();
  std::filesystem::create_directories(fake.model_dir);
  std::ofstream(fake.model_dir + "/config.json") << R"({"model_type": "gpt2", "vocab_size": 257})";
  std::ofstream(fake.model_dir + "/tokenizer_config.json")
      << R"({"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + )"
         R"(message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"})";
  start_engine(fake);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));

  // A text prompt reaches the engine as the byte tokenizer's ids, and echoes as sent.
  CompletionRequest text = request("r1");
  text.prompt = std::string("hi!");
  text.echo = true;
  auto sub = gateway_->submit(text, std::make_shared<Recorder>());
  ASSERT_TRUE(sub.ok()) << sub.error().message;
  EXPECT_EQ(sub->echo_text, "hi!");
  auto s1 = fake.wait_sub(1);
  ASSERT_TRUE(std::holds_alternative<std::vector<std::int32_t>>(s1.request.prompt));
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(s1.request.prompt), (std::vector<std::int32_t>{'h', 'i', '!'}));
  EXPECT_TRUE(s1.request.model.empty());  // the engines' default, as the client asked

  // A chat is rendered in the model's format (ChatML, from its
  // tokenizer_config.json) and encoded; its end-of-turn text joins the stops.
  CompletionRequest chat = request("r2");
  chat.chat = ChatPrompt{{ChatMessage{"user", "yo"}}, ""};
  chat.stop = {"\n\n"};
  ASSERT_TRUE(gateway_->submit(chat, std::make_shared<Recorder>()).ok());
  auto s2 = fake.wait_sub(2);
  EXPECT_FALSE(s2.request.chat.has_value());
  const std::string rendered = "<|im_start|>user\nyo<|im_end|>\n<|im_start|>assistant\n";
  ASSERT_TRUE(std::holds_alternative<std::vector<std::int32_t>>(s2.request.prompt));
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(s2.request.prompt),
            std::vector<std::int32_t>(rendered.begin(), rendered.end()));
  EXPECT_EQ(s2.request.stop, (std::vector<std::string>{"\n\n", "<|im_end|>"}));

  // Token ids pass as they are; a chat naming an unknown format is refused
  // by the gateway (400), before any engine sees it.
  CompletionRequest ids = request("r3");
  ids.prompt = std::vector<std::int32_t>{7, 8};
  ASSERT_TRUE(gateway_->submit(ids, std::make_shared<Recorder>()).ok());
  EXPECT_EQ(std::get<std::vector<std::int32_t>>(fake.wait_sub(3).request.prompt), (std::vector<std::int32_t>{7, 8}));
  CompletionRequest bad = request("r4");
  bad.chat = ChatPrompt{{ChatMessage{"user", "yo"}}, "no-such-format"};
  auto refused = gateway_->submit(bad, std::make_shared<Recorder>());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidRequest);
  // So is a prompt whose ids and max_tokens pass the context length (64).
  CompletionRequest long_prompt = request("r5");
  long_prompt.prompt = std::string(60, 'a');
  long_prompt.max_tokens = 5;
  auto too_long = gateway_->submit(long_prompt, std::make_shared<Recorder>());
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().code, ErrorCode::kInvalidRequest);
  EXPECT_EQ(too_long.error().message,
            "prompt (60 tokens) + max_tokens (5) = 65 exceeds the context length of model 'fake' (64 tokens)");
  EXPECT_EQ(fake.submissions(), 3u);
  for (std::size_t i = 1; i <= 3; ++i) fake.wait_sub(i).sink->push(FinishedEvent{"stop", {1, 0}, {}, 0});
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
}

TEST_F(RemoteServiceTest, AModelFolderTheGatewayCannotReadLeavesItsPromptsToTheEngine) {
  FakeService& fake = new_fake();
  fake.model_dir = (dir_ / "elsewhere").string();  // not on this gateway's file system
  start_engine(fake);
  start_gateway();
  ASSERT_TRUE(gateway_->wait_ready(Clock::now() + 10s));
  CompletionRequest chat = request("r1");
  chat.chat = ChatPrompt{{ChatMessage{"user", "yo"}}, ""};
  ASSERT_TRUE(gateway_->submit(chat, std::make_shared<Recorder>()).ok());
  auto s1 = fake.wait_sub(1);
  ASSERT_TRUE(s1.request.chat.has_value());  // sent as it came: the engine renders and encodes it
  EXPECT_EQ(s1.request.chat->messages.at(0).content, "yo");
  ASSERT_TRUE(gateway_->submit(request("r2"), std::make_shared<Recorder>()).ok());
  EXPECT_EQ(std::get<std::string>(fake.wait_sub(2).request.prompt), "hello");
  for (std::size_t i = 1; i <= 2; ++i) fake.wait_sub(i).sink->push(FinishedEvent{"stop", {1, 0}, {}, 0});
  EXPECT_TRUE(gateway_->wait_idle(Clock::now() + 5s));
}

}  // namespace
}  // namespace vg::gateway::remote_testing
