#include "util/test_points.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace h5ckpt::util {

bool test_point_armed(const char* env, const char* point, int rank) {
  const char* at = std::getenv(env);
  if (at == nullptr) return false;
  std::vector<std::string> f;
  const std::string spec(at);
  for (size_t b = 0, e; b <= spec.size(); b = e + 1) {
    e = spec.find(':', b);
    if (e == std::string::npos) e = spec.size();
    f.push_back(spec.substr(b, e - b));
  }
  if (f[0] != point || (f.size() > 1 && !f[1].empty() && std::atoi(f[1].c_str()) != rank)) return false;
  static std::mutex mu;
  static std::map<std::string, int> reached;
  std::lock_guard<std::mutex> lock(mu);
  const int nth = f.size() > 2 ? std::atoi(f[2].c_str()) : 1;
  return ++reached[std::string(env) + point] == nth;
}

void test_point(const char* point, int rank) {
  for (const auto& [env, sig, verb] :
       {std::tuple{"H5CKPT_TEST_KILL_AT", SIGKILL, "kills"}, std::tuple{"H5CKPT_TEST_STOP_AT", SIGSTOP, "stops"}}) {
    if (!test_point_armed(env, point, rank)) continue;
    std::fprintf(stderr, "h5ckpt: %s=%s: rank %d %s itself\n", env, std::getenv(env), rank, verb);
    std::fflush(stderr);
    std::raise(sig);
  }
}

}  // namespace h5ckpt::util
