// detail::WorkPool and default_threads: the helper threads behind a load's block checks and a
// snapshot's copies. What is tried here: a producer that helps runs the queued jobs itself while
// every worker is held up, the room of buffer-holding jobs it runs is given back, their errors
// reach the group, the default thread count leaves the readers' cores alone, and a batch pool's
// workers run as SCHED_BATCH (a woken worker does not take its feeder's core).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "util/work_pool.h"

using namespace h5ckpt;
using detail::WorkPool;

namespace {

// Holds a worker inside a job until released.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
  Status hold() {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
    return Status::Ok();
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

// A pool whose only worker is held inside a job until the test ends (a failed assertion too):
// whatever else is submitted waits in the queue.
struct HeldPool {
  WorkPool pool;
  Gate gate;
  std::shared_ptr<WorkPool::Group> held;
  explicit HeldPool(int max_queued) : pool(1, max_queued), held(pool.group()) {
    pool.submit(
        held, [this] { return gate.hold(); }, /*holds_buffer=*/false);
    pool.seal(held);
    gate.wait_entered();
  }
  ~HeldPool() {
    gate.release();
    EXPECT_TRUE(pool.wait(held).ok());
  }
};

}  // namespace

TEST(DefaultThreads, RequestedWinsElseHardwareShareLessTheBusyThreads) {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(detail::default_threads(3, 64, 8), 3);
  EXPECT_EQ(detail::default_threads(0, 1), std::max(1, hw));
  EXPECT_EQ(detail::default_threads(0, 1, 1), std::max(1, hw - 1));
  EXPECT_EQ(detail::default_threads(0, 2, 1), std::max(1, hw / 2 - 1));
  EXPECT_EQ(detail::default_threads(0, 1, hw + 5), 1);  // never fewer than one
  EXPECT_EQ(detail::default_threads(0, 4 * hw, 0), 1);
}

TEST(WorkPool, HelpRunsTheQueuedJobsOnTheCallingThreadWhileTheWorkerIsHeld) {
  constexpr int kJobs = 12;  // what the jobs write outlives the pool (declared first)
  std::vector<std::thread::id> ran_on(kJobs);
  std::atomic<int> ran{0};
  HeldPool held(/*max_queued=*/64);
  WorkPool& pool = held.pool;

  auto g = pool.group();
  for (int i = 0; i < kJobs; ++i)
    pool.submit(g, [&, i] {
      ran_on[i] = std::this_thread::get_id();
      ++ran;
      return i == 7 ? Status(ErrorCode::kCorrupt, "job 7 found a bad block") : Status::Ok();
    });
  pool.seal(g);
  pool.help();
  // Every job ran, here, before the worker was let go.
  ASSERT_EQ(ran.load(), kJobs);
  for (int i = 0; i < kJobs; ++i) EXPECT_EQ(ran_on[i], std::this_thread::get_id()) << "job " << i;
  const Status outcome = pool.wait(g);
  EXPECT_EQ(outcome.code(), ErrorCode::kCorrupt);
  EXPECT_NE(outcome.to_string().find("job 7"), std::string::npos) << outcome.to_string();
}

TEST(WorkPool, JobsRunByHelpGiveBackTheirBufferRoom) {
  std::atomic<int> ran{0};
  // Room for two buffer-holding jobs; the worker is held by a job that holds none.
  HeldPool held(/*max_queued=*/2);
  WorkPool& pool = held.pool;

  auto g = pool.group();
  auto job = [&] {
    ++ran;
    return Status::Ok();
  };
  pool.submit(g, job);
  pool.submit(g, job);  // the room is full now
  pool.help();
  ASSERT_EQ(ran.load(), 2);
  // Both slots are free again: two more submits must not block while the worker is still held.
  auto more = std::async(std::launch::async, [&] {
    pool.submit(g, job);
    pool.submit(g, job);
  });
  ASSERT_EQ(more.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "submit blocked: the jobs help() ran did not give back their room";
  pool.help();
  pool.seal(g);
  EXPECT_TRUE(pool.wait(g).ok());
  EXPECT_EQ(ran.load(), 4);
}

TEST(WorkPool, HelpWithNothingQueuedReturnsAtOnce) {
  WorkPool pool(2);
  pool.help();
  auto g = pool.group();
  std::atomic<int> ran{0};
  for (int i = 0; i < 5; ++i)
    pool.submit(g, [&] {
      ++ran;
      return Status::Ok();
    });
  pool.seal(g);
  EXPECT_TRUE(pool.wait(g).ok());
  pool.help();
  EXPECT_EQ(ran.load(), 5);
}

namespace {

// The policy of every job's thread in a pool of 3 workers.
std::vector<int> worker_policies(bool batch) {
  WorkPool pool(3, 0, batch);
  auto g = pool.group();
  std::mutex mu;
  std::vector<int> policies;
  for (int i = 0; i < 12; ++i)
    pool.submit(g, [&] {
      const int p = sched_getscheduler(0);  // 0: the calling thread
      std::lock_guard<std::mutex> lock(mu);
      policies.push_back(p);
      return Status::Ok();
    });
  pool.seal(g);
  EXPECT_TRUE(pool.wait(g).ok());
  return policies;
}

}  // namespace

// A batch pool's workers run as SCHED_BATCH, so that waking one never takes the feeding thread's
// core (the reader of a verified load lost 5-11 ms per load to that on the 2-core VM); a default
// pool's keep the policy of the thread that made them (a transfer's hashers must preempt its
// polling loop), and so does that thread.
TEST(WorkPool, BatchWorkersRunAsBatchAndOthersAsTheirMaker) {
  const int before = sched_getscheduler(0);
  const std::vector<int> plain = worker_policies(false);
  ASSERT_EQ(plain.size(), 12u);
  for (int p : plain) EXPECT_EQ(p, before);
  {  // where the policy is refused (a sandbox), a batch pool runs as before: nothing more to check
    bool allowed = false;
    std::thread probe([&] {
      sched_param none{};
      allowed = pthread_setschedparam(pthread_self(), SCHED_BATCH, &none) == 0;
    });
    probe.join();
    if (!allowed) GTEST_SKIP() << "SCHED_BATCH refused here";
  }
  const std::vector<int> batch = worker_policies(true);
  ASSERT_EQ(batch.size(), 12u);
  for (int p : batch) EXPECT_EQ(p, SCHED_BATCH);
  EXPECT_EQ(sched_getscheduler(0), before);
}
