#pragma once
/// \file
/// Groups items queued on the control thread into batches, one storage statement per batch:
/// a batch runs when it is full (or at once when asked), else after a short delay. One batch
/// is in flight at a time. Private to the runtime; control thread only.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <iterator>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

namespace tenure::detail {

template <class Item>
class batcher {
 public:
  /// `run` receives each batch and must call answered() once its statement answered (or
  /// put_back() to retry it).
  batcher(boost::asio::io_context& io, std::function<void(std::vector<Item>)> run)
      : timer_(io), run_(std::move(run)) {}

  void configure(std::size_t max_size, std::chrono::milliseconds delay) {
    max_ = std::max<std::size_t>(1, max_size);
    delay_ = delay;
  }

  /// Queues an item; see maybe().
  void push(Item item, bool now) {
    queue_.push_back(std::move(item));
    maybe(now);
  }
  /// Runs a batch if one is due (full, or `now`), else arms the delay timer.
  void maybe(bool now) {
    if (busy_ || queue_.empty()) return;
    if (queue_.size() >= max_ || now || solo_ > 0) {
      cancel();
      run();
      return;
    }
    if (armed_) return;
    armed_ = true;
    timer_.expires_after(delay_);
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      armed_ = false;
      run();
    });
  }
  /// Runs the next batch now, unless one is in flight or nothing is queued.
  void run() {
    if (busy_ || queue_.empty()) return;
    busy_ = true;
    const auto n = solo_ > 0 ? std::size_t{1} : std::min(queue_.size(), max_);
    if (solo_ > 0) --solo_;
    std::vector<Item> batch(std::make_move_iterator(queue_.begin()),
                            std::make_move_iterator(queue_.begin() + static_cast<long>(n)));
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(n));
    run_(std::move(batch));
  }
  /// The batch's statement answered: the next batch may run.
  void answered() noexcept { busy_ = false; }
  /// The batch failed: its items go back first in line, and no batch runs until retry().
  void put_back(std::vector<Item> batch) {
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(std::move(*it));
  }
  /// The batch was refused as a whole: its items go back first in line, and the next
  /// batch.size() batches carry one item each, so the one refused can be told from the rest.
  /// No batch runs until retry().
  void put_back_one_by_one(std::vector<Item> batch) {
    solo_ = batch.size();
    put_back(std::move(batch));
  }
  /// After put_back(): run again.
  void retry() {
    busy_ = false;
    run();
  }
  void cancel() {
    timer_.cancel();
    armed_ = false;
  }

  bool idle() const noexcept { return !busy_ && queue_.empty(); }
  std::size_t queued() const noexcept { return queue_.size(); }

 private:
  std::deque<Item> queue_;
  boost::asio::steady_timer timer_;
  std::function<void(std::vector<Item>)> run_;
  std::size_t max_ = 1;
  std::chrono::milliseconds delay_{0};
  bool busy_ = false;
  std::size_t solo_ = 0;  ///< batches still to run with a single item (put_back_one_by_one)
  bool armed_ = false;
};

}  // namespace tenure::detail
