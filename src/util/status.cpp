#include "h5ckpt/status.h"

namespace h5ckpt {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kShapeMismatch: return "shape mismatch";
    case ErrorCode::kDtypeMismatch: return "dtype mismatch";
    case ErrorCode::kCorrupt: return "corrupt checkpoint";
    case ErrorCode::kNotCommitted: return "not committed";
    case ErrorCode::kAlreadyExists: return "already exists";
    case ErrorCode::kIo: return "I/O error";
    case ErrorCode::kMpi: return "MPI error";
    case ErrorCode::kRemote: return "failed on another rank";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace h5ckpt
