#include "util/work_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace h5ckpt::detail {

int default_threads(int requested, int ranks_here, int busy_here) {
  if (requested > 0) return requested;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, hw / std::max(1, ranks_here) - std::max(0, busy_here));
}

// A worker woken by a submit may take its feeder's core at once (the scheduler's wake-up
// preemption): on the 2-core VM a 1-rank verified load's reader spent 5-11 ms of its 0.4 s
// submitting ~190 checks; with the checkers SCHED_BATCH, which does not preempt when it wakes,
// 0.9-1.5 ms. The policy needs no privilege; where it is refused the worker runs as before.
void WorkPool::run_as_batch() {
  sched_param none{};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
}

WorkPool::WorkPool(int threads, int max_queued, bool batch) {
  threads = std::max(1, threads);
  max_queued_ = max_queued > 0 ? static_cast<size_t>(max_queued) : 2 * static_cast<size_t>(threads) + 2;
  workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i)
    workers_.emplace_back([this, batch] {
      if (batch) run_as_batch();
      work();
    });
}

WorkPool::~WorkPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  has_work_.notify_all();
  for (auto& w : workers_) w.join();
}

std::shared_ptr<WorkPool::Group> WorkPool::group(std::function<void(const Status&)> on_done) {
  auto g = std::make_shared<Group>();
  g->on_done_ = std::move(on_done);
  return g;
}

void WorkPool::submit(const std::shared_ptr<Group>& g, std::function<Status()> job, bool holds_buffer) {
  {
    std::lock_guard<std::mutex> lock(g->mu_);
    ++g->pending_;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (holds_buffer) {
      has_room_.wait(lock, [&] { return in_flight_ < max_queued_; });
      ++in_flight_;
    }
    queue_.push_back(Job{g, std::move(job), holds_buffer});
  }
  has_work_.notify_one();
}

void WorkPool::finish_one(const std::shared_ptr<Group>& g, const Status& st) {
  std::function<void(const Status&)> report;
  Status outcome;
  {
    std::lock_guard<std::mutex> lock(g->mu_);
    if (!st.ok() && g->status_.ok()) g->status_ = st;
    if (--g->pending_ == 0 && g->sealed_ && !g->done_) {
      g->done_ = true;
      report = std::move(g->on_done_);
      outcome = g->status_;
      g->done_cv_.notify_all();
    }
  }
  if (report) report(outcome);
}

void WorkPool::seal(const std::shared_ptr<Group>& g, const Status& producer) {
  // Counted as one more job that finishes now, so the last finisher reports exactly once.
  {
    std::lock_guard<std::mutex> lock(g->mu_);
    ++g->pending_;
    g->sealed_ = true;
  }
  finish_one(g, producer);
}

Status WorkPool::wait(const std::shared_ptr<Group>& g) {
  std::unique_lock<std::mutex> lock(g->mu_);
  g->done_cv_.wait(lock, [&] { return g->done_; });
  return g->status_;
}

void WorkPool::work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      has_work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    run(job);
  }
}

void WorkPool::help() {
  for (;;) {
    Job job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    run(job);
  }
}

void WorkPool::run(Job& job) {
  Status st = job.run();
  finish_one(job.group, st);
  if (!job.holds_buffer) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
  }
  has_room_.notify_one();
}

}  // namespace h5ckpt::detail
