#include "planner/bulk_allocator.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace h5ckpt::planner {

namespace {

// A number in a sysfs file; -1 when it is absent or not a number.
long long sysfs_number(const char* path) {
  std::ifstream in(path);
  long long v = -1;
  if (!(in >> v)) return -1;
  return v;
}

bool decide() {
  if (const char* env = std::getenv("H5CKPT_HUGE_PAGES"); env && (!std::strcmp(env, "0") || !std::strcmp(env, "1")))
    return env[0] == '1';
  return huge_pages_pay_with(sysfs_number("/sys/module/page_reporting/parameters/page_reporting_order"),
                             sysfs_number("/sys/module/page_reporting/parameters/reported_kib"),
                             ::sysconf(_SC_PAGESIZE));
}

}  // namespace

bool huge_pages_pay_with(long long order, long long reported_kib, long long page_bytes) {
  // Free page reporting hands free blocks of 2^order pages and more back to the host; it has once
  // `reported_kib` is above zero (a balloon device that takes them is present).
  if (order < 0 || order > 40 || reported_kib <= 0 || page_bytes <= 0) return true;
  return (page_bytes << order) > static_cast<long long>(BulkAllocator<char>::kHugePage);
}

bool huge_pages_pay() {
  static const bool pay = decide();
  return pay;
}

}  // namespace h5ckpt::planner
