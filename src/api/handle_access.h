// Constructs SaveHandles inside the library: the constructor takes the internal shared state
// (SaveHandle::State, defined in engine/async_saver.h) and is not part of the installed contract.
#pragma once

#include <memory>
#include <utility>

#include "h5ckpt/checkpointer.h"

namespace h5ckpt::detail {

struct SaveHandleAccess {
  static SaveHandle make(std::shared_ptr<SaveHandle::State> state) { return SaveHandle(std::move(state)); }
};

}  // namespace h5ckpt::detail
