#include "engine/compute_thread.hpp"

#include <future>
#include <utility>

#include "device/device.hpp"

namespace vg {

std::thread start_compute_thread(Device& device, std::function<void()> body) {
  std::promise<void> prepared;
  std::future<void> done = prepared.get_future();
  std::thread t([&device, body = std::move(body), prepared = std::move(prepared)]() mutable {
    {
      DeviceScope scope(&device);
      device.prepare_compute_thread();
    }
    prepared.set_value();
    body();
  });
  done.wait();
  return t;
}

}  // namespace vg
