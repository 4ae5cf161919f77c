// Flight (see flight.hpp): record, replay, forward; cancel with the last client.
#include "traffic/flight.hpp"

#include <algorithm>

namespace vg::traffic {

class Flight::Attachment final : public RequestHandle {
 public:
  Attachment(std::shared_ptr<Flight> flight, std::uint64_t token) : flight_(std::move(flight)), token_(token) {}
  ~Attachment() override { cancel(); }
  void cancel() override {
    std::shared_ptr<Flight> f;
    {
      std::lock_guard lock(mu_);
      f.swap(flight_);
    }
    if (f) f->detach(token_);
  }
  const std::string& id() const override { return id_; }
  void set_id(std::string id) { id_ = std::move(id); }

 private:
  std::mutex mu_;
  std::shared_ptr<Flight> flight_;  // guarded by mu_; null once detached
  const std::uint64_t token_;
  std::string id_;
};

std::shared_ptr<Flight> Flight::create(std::string id, EndCallback on_end) {
  return std::shared_ptr<Flight>(new Flight(std::move(id), std::move(on_end)));
}

void Flight::push(EngineEvent event) {
  bool terminal = false;
  bool completed = false;
  {
    std::lock_guard lock(mu_);
    if (ended_) return;
    terminal = is_terminal(event);
    completed = std::holds_alternative<FinishedEvent>(event);
    for (auto& [token, sink] : sinks_) sink->push(event);
    if (std::holds_alternative<QueuedEvent>(event) && !recorded_.empty() &&
        std::holds_alternative<QueuedEvent>(recorded_.back())) {
      recorded_.back() = std::move(event);
    } else {
      recorded_.push_back(std::move(event));
    }
    if (terminal) {
      ended_ = true;
      sinks_.clear();  // nothing follows: release the clients' queues
      work_.reset();
    }
  }
  if (terminal && on_end_) on_end_(*this, completed);
}

std::shared_ptr<RequestHandle> Flight::attach(std::shared_ptr<EventSink> sink) {
  std::uint64_t token = 0;
  {
    std::lock_guard lock(mu_);
    token = next_token_++;
    for (const EngineEvent& e : recorded_) sink->push(e);
    if (!ended_) sinks_.emplace_back(token, std::move(sink));
  }
  auto handle = std::make_shared<Attachment>(shared_from_this(), token);
  handle->set_id(id_);
  return handle;
}

void Flight::detach(std::uint64_t token) {
  std::shared_ptr<RequestHandle> cancel;
  {
    std::lock_guard lock(mu_);
    const auto it = std::find_if(sinks_.begin(), sinks_.end(), [&](const auto& s) { return s.first == token; });
    if (it == sinks_.end()) return;  // already ended (or detached)
    sinks_.erase(it);
    if (!sinks_.empty() || ended_) return;
    if (work_) {
      cancel = work_;
    } else {
      abandoned_ = true;  // start() will cancel
    }
  }
  if (cancel) cancel->cancel();  // outside the lock: the engine may be pushing into us
}

void Flight::start(std::shared_ptr<RequestHandle> work, FlightOrigin origin) {
  bool cancel_now = false;
  {
    std::lock_guard lock(mu_);
    origin_ = std::move(origin);
    if (ended_) return;
    work_ = work;
    cancel_now = abandoned_;
  }
  if (cancel_now) work->cancel();
}

void Flight::fail(Error error) { push(FailedEvent{std::move(error), {}, {}}); }

FlightOrigin Flight::origin() const {
  std::lock_guard lock(mu_);
  return origin_;
}

bool Flight::ended() const {
  std::lock_guard lock(mu_);
  return ended_;
}

int Flight::attached() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(sinks_.size());
}

}  // namespace vg::traffic
