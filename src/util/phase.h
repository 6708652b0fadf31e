// The operation and phase the calling thread is in ("save"/"write"), set by each engine phase.
// Bounded waits name it when they expire and fault injection can select on it; the background
// writer of an asynchronous save has its own, as it runs on its own thread.
#pragma once

namespace h5ckpt {

struct PhaseName {
  const char* operation = "";  ///< "save", "load", ... ("" outside any operation)
  const char* phase = "";      ///< "prepare", "write", "commit", "metadata", "plan", "read", ...
};

/// The calling thread's current operation and phase.
inline PhaseName& current_phase() {
  thread_local PhaseName p;
  return p;
}

/// Sets the calling thread's phase for a scope and restores the previous one after.
class PhaseScope {
 public:
  PhaseScope(const char* operation, const char* phase) : saved_(current_phase()) {
    current_phase() = PhaseName{operation, phase};
  }
  ~PhaseScope() { current_phase() = saved_; }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseName saved_;
};

}  // namespace h5ckpt
