// Failure injection at named points of the code, for tests that stop or kill one rank where no
// outside observer can aim (inside an exchange, between two renames). Off unless the environment
// names the point; read on every call, since tests set it late.
#pragma once

namespace h5ckpt::util {

/// H5CKPT_TEST_KILL_AT=point[:rank[:nth]]: SIGKILL this process the nth time (default: the first)
/// it reaches `point`, on `rank` only when given, as a node failure would (no destructor, no flush,
/// no message to the others). H5CKPT_TEST_STOP_AT, same form: SIGSTOP instead, as a hung node or a
/// paused process would; its peers must end by their deadline. Each announces itself on stderr.
void test_point(const char* point, int rank);

/// True when the environment variable `env` (point[:rank[:nth]]) names `point`, on `rank` when it
/// gives one (a rank of -1 never matches one), and this is the nth arrival there in this process.
/// The matcher of test_point, for hooks that act otherwise (H5CKPT_TEST_CRASH_AT: _exit).
bool test_point_armed(const char* env, const char* point, int rank);

}  // namespace h5ckpt::util
