// Umbrella header for C++ trainers.
#pragma once

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/checkpointer.h"
#include "h5ckpt/reader.h"
#include "h5ckpt/state.h"
#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"
#include "h5ckpt/transfer.h"
#include "h5ckpt/types.h"
