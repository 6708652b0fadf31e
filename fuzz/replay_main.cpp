// A driver for the fuzz targets in builds without libFuzzer (gcc, no sanitizers): it runs every
// seed once, then mutations of the seeds drawn from a fixed random seed until its time is up. So
// every test run, CI's included, puts the targets' own oracles (a read that succeeds returns the
// saved bytes; an index that validates encodes back equal; a decoder refuses what it cannot
// read) to thousands of hostile inputs. Coverage-guided fuzzing under ASan and UBSan stays with
// scripts/fuzz.sh, whose build does not fit CI's time.
//
// Usage: fuzz_replay_<target> [-seconds=N] [-seed=S] [-max_len=N] [-crash=FILE] PATH...
// PATHs are files or directories of seeds (none found: random inputs of 4 to 469 bytes). A crash, an abort from an oracle, or an input that
// runs past 10 s writes the input to FILE (default ./replay-crash-<target>) before the process
// dies of its signal; rerun it with the same binary and FILE as the only PATH.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// What the signal handler writes: the input being run, and where.
const std::vector<uint8_t>* g_running = nullptr;
char g_crash_path[4096];

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return;
    c += w;
    n -= static_cast<size_t>(w);
  }
}

// Only async-signal-safe calls: open, write, close, then the default action of the signal.
void on_fatal_signal(int sig) {
  if (g_running) {
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      write_all(fd, g_running->data(), g_running->size());
      ::close(fd);
    }
  }
  const char* what =
      sig == SIGALRM ? "fuzz replay: an input ran past 10 s; it is in " : "fuzz replay: crashed; the input is in ";
  write_all(2, what, std::strlen(what));
  write_all(2, g_crash_path, std::strlen(g_crash_path));
  write_all(2, "\n", 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig == SIGALRM ? SIGABRT : sig);
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A few stacked edits of the kinds that find bugs in decoders: bit flips, boundary values in
// integers of every width, bytes inserted and erased, truncation, and a chunk of another seed.
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::vector<uint8_t> mutate(const std::vector<uint8_t>& base, const std::vector<std::vector<uint8_t>>& seeds,
                              size_t max_len) {
    std::vector<uint8_t> in = base;
    const int edits = 1 + static_cast<int>(below(4));
    for (int e = 0; e < edits; ++e) edit(in, seeds);
    if (in.size() > max_len) in.resize(max_len);
    return in;
  }

 private:
  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  void edit(std::vector<uint8_t>& in, const std::vector<std::vector<uint8_t>>& seeds) {
    static constexpr uint64_t kBoundaries[] = {
        0,          1,          2,          0x7f,       0x80,       0xff,  0x7fff,    0xffff, 0x7fffffff, 0x80000000,
        0xffffffff, 1ull << 32, 1ull << 40, ~0ull >> 1, 1ull << 63, ~0ull, ~0ull - 1, 4096,   65536};
    switch (in.empty() ? 3 : below(8)) {
      case 0:  // one bit
        in[below(in.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:  // one byte, any value
        in[below(in.size())] = static_cast<uint8_t>(rng_());
        break;
      case 2: {  // an integer of 1, 2, 4 or 8 bytes, little-endian, set to a boundary value
        const size_t width = size_t{1} << below(4);
        if (in.size() < width) break;
        const size_t at = below(in.size() - width + 1);
        uint64_t v = kBoundaries[below(std::size(kBoundaries))];
        if (below(4) == 0) v += below(3) - 1;  // and its neighbours
        for (size_t i = 0; i < width; ++i) in[at + i] = static_cast<uint8_t>(v >> (8 * i));
        break;
      }
      case 3: {  // bytes inserted
        const size_t n = 1 + below(8), at = below(in.size() + 1);
        std::vector<uint8_t> bytes(n);
        for (auto& b : bytes) b = static_cast<uint8_t>(rng_());
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), bytes.begin(), bytes.end());
        break;
      }
      case 4: {  // bytes erased
        const size_t at = below(in.size()), n = 1 + below(std::min<size_t>(16, in.size() - at));
        in.erase(in.begin() + static_cast<std::ptrdiff_t>(at), in.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 5:  // truncated
        in.resize(below(in.size()));
        break;
      case 6: {  // a chunk of another seed over this one
        const auto& other = seeds[below(seeds.size())];
        if (other.empty()) break;
        const size_t from = below(other.size()), n = 1 + below(std::min<size_t>(64, other.size() - from));
        const size_t at = below(in.size());
        for (size_t i = 0; i < n && at + i < in.size(); ++i) in[at + i] = other[from + i];
        break;
      }
      default: {  // a byte repeated: lengths and counts grow
        const size_t at = below(in.size()), n = 1 + below(32);
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), n, in[at]);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

bool flag(const std::string& arg, const char* name, uint64_t* out) {
  const std::string prefix = std::string("-") + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *out = std::stoull(arg.substr(prefix.size()));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seconds = 10, seed = 1, max_len = 65536;
  std::string crash = std::string("replay-crash-") + std::filesystem::path(argv[0]).filename().string();
  std::vector<std::vector<uint8_t>> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flag(arg, "seconds", &seconds) || flag(arg, "seed", &seed) || flag(arg, "max_len", &max_len)) continue;
    if (arg.rfind("-crash=", 0) == 0) {
      crash = arg.substr(7);
      continue;
    }
    const std::filesystem::path p(arg);
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());  // the same order, so the same inputs, every run
      for (const auto& f : files) seeds.push_back(read_file(f));
    } else if (std::filesystem::is_regular_file(p)) {
      seeds.push_back(read_file(p));
    } else {
      std::fprintf(stderr, "fuzz replay: no such seed file or directory: %s\n", arg.c_str());
      return 2;
    }
  }
  if (seeds.empty()) {  // a target that builds its own reference (index_records): random starts
    std::mt19937_64 rng(seed);
    for (size_t n = 4; n < 4 + 32 * 15; n += 15) {
      std::vector<uint8_t> s(n);
      for (auto& b : s) b = static_cast<uint8_t>(rng());
      seeds.push_back(std::move(s));
    }
  }
  std::snprintf(g_crash_path, sizeof g_crash_path, "%s", crash.c_str());
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) ::signal(sig, on_fatal_signal);

  auto run = [](const std::vector<uint8_t>& in) {
    g_running = &in;
    ::alarm(10);
    LLVMFuzzerTestOneInput(in.data(), in.size());
    ::alarm(0);
    g_running = nullptr;
  };
  for (const auto& s : seeds) run(s);
  Mutator mutator(seed);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  uint64_t mutated = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    for (int k = 0; k < 16; ++k, ++mutated) run(mutator.mutate(seeds[mutated % seeds.size()], seeds, max_len));
  }
  std::printf("fuzz replay: %zu seeds and %llu mutated inputs (seed %llu) in %llu s: no crash\n", seeds.size(),
              static_cast<unsigned long long>(mutated), static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seconds));
  return 0;
}
