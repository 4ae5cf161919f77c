// ServerState registries (see server_state.hpp). Any thread.
#include "http/server_state.hpp"

#include <vector>

#include "http/event_queue.hpp"

namespace vg::httpd {

std::uint64_t ServerState::add_connection(std::function<void()> closer) {
  std::lock_guard lock(mu_);
  if (closing_ || connections_.size() >= static_cast<std::size_t>(options_.max_connections)) return 0;
  const std::uint64_t id = next_id_++;
  connections_.emplace(id, std::move(closer));
  return id;
}

void ServerState::remove_connection(std::uint64_t id) {
  std::lock_guard lock(mu_);
  connections_.erase(id);
  if (connections_.empty()) no_connections_.notify_all();
}

void ServerState::close_all_connections() {
  std::vector<std::function<void()>> closers;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    for (auto& [id, closer] : connections_) closers.push_back(closer);
  }
  for (auto& closer : closers) closer();
}

bool ServerState::wait_no_connections(std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  return no_connections_.wait_for(lock, limit, [this] { return connections_.empty(); });
}

void ServerState::forget_connections() {
  std::lock_guard lock(mu_);
  connections_.clear();
}

bool ServerState::add_queue(EventQueue* queue) {
  std::lock_guard lock(mu_);
  if (closing_) return false;
  queues_.insert(queue);
  return true;
}

void ServerState::remove_queue(EventQueue* queue) {
  std::lock_guard lock(mu_);
  queues_.erase(queue);
}

void ServerState::detach_all_queues() {
  std::lock_guard lock(mu_);
  closing_ = true;
  for (EventQueue* q : queues_) q->detach();
  queues_.clear();
}

}  // namespace vg::httpd
