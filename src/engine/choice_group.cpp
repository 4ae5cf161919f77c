// ChoiceGroup (see engine_impl.hpp): the n choices of one request merged
// into the one event stream its owner expects.
#include <utility>

#include "engine/engine_impl.hpp"

namespace vg::engine_detail {
namespace {

class ChoiceSink final : public EventSink {
 public:
  ChoiceSink(std::shared_ptr<ChoiceGroup> group, int choice) : group_(std::move(group)), choice_(choice) {}
  void push(EngineEvent event) override { group_->push(choice_, std::move(event)); }

 private:
  std::shared_ptr<ChoiceGroup> group_;
  int choice_;
};

}  // namespace

std::shared_ptr<EventSink> ChoiceGroup::sink_for(int choice) {
  return std::make_shared<ChoiceSink>(shared_from_this(), choice);
}

bool ChoiceGroup::ends_request(bool completed) {
  std::lock_guard lk(mu_);
  if (counted_) return false;
  if (completed && --to_complete_ > 0) return false;
  counted_ = true;
  return true;
}

bool ChoiceGroup::first_token() { return first_token_.exchange(false); }

void ChoiceGroup::push(int choice, EngineEvent event) {
  bool abort = false;
  {
    std::lock_guard lk(mu_);
    if (ended_) return;
    if (std::holds_alternative<QueuedEvent>(event) || std::holds_alternative<ChoiceEndEvent>(event)) return;
    if (std::holds_alternative<StartedEvent>(event)) {
      if (std::exchange(started_, true)) return;
    } else if (std::holds_alternative<PromptEvent>(event)) {
      if (std::exchange(prompt_sent_, true)) return;
    } else if (auto* t = std::get_if<TextEvent>(&event)) {
      t->choice = choice;
    } else if (auto* f = std::get_if<FinishedEvent>(&event)) {
      usage_.prompt_tokens = f->usage.prompt_tokens;
      usage_.completion_tokens += f->usage.completion_tokens;
      if (--remaining_ > 0) {
        event = ChoiceEndEvent{choice, std::move(f->finish_reason)};
      } else {
        f->usage = usage_;
        f->choice = choice;
        ended_ = true;
      }
    } else if (auto* e = std::get_if<FailedEvent>(&event)) {
      usage_.prompt_tokens = e->usage.prompt_tokens;
      usage_.completion_tokens += e->usage.completion_tokens;
      e->usage = usage_;
      ended_ = true;
      abort = true;
      aborted_.store(true);
    }
    sink_->push(std::move(event));  // never blocks (EventSink's contract)
  }
  if (abort && on_abort_) on_abort_();
}

}  // namespace vg::engine_detail
