// Errors as values. No h5ckpt call throws across a collective; every failure is a Status.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "h5ckpt/export.h"

namespace h5ckpt {

/// Broad class of a failure; the message says exactly what and where.
enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  ///< caller passed something malformed (bad shard, null buffer, bad option)
  kNotFound,         ///< checkpoint, key or file missing
  kShapeMismatch,    ///< global shape differs between ranks or from the checkpoint
  kDtypeMismatch,    ///< dtype differs and no conversion exists
  kCorrupt,          ///< checkpoint metadata or data fails validation / checksum
  kNotCommitted,     ///< checkpoint directory was never committed
  kAlreadyExists,    ///< save target exists and overwrite was not requested
  kIo,               ///< operating-system or HDF5 I/O failure
  kMpi,              ///< an MPI call failed
  kRemote,           ///< another rank failed and its own error is not known here (agreements pass on the
                     ///< failing rank's code and message instead)
  kUnsupported,      ///< valid request that this build cannot do
  kInternal,         ///< a bug in h5ckpt
};

/// Human-readable name of an error code, e.g. "corrupt".
H5CKPT_API const char* error_code_name(ErrorCode code);

/// Outcome of an operation: ok, or a code plus a message with context (key, file, rank).
class [[nodiscard]] H5CKPT_API Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "corrupt: key 'model/w': region outside global shape"
  std::string to_string() const;
  /// Prefixes context ("while saving 'x'") to a failure; no-op on success.
  Status with_context(const std::string& context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

/// A value or the Status saying why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace h5ckpt

#define H5CKPT_CONCAT_INNER_(a, b) a##b
#define H5CKPT_CONCAT_(a, b) H5CKPT_CONCAT_INNER_(a, b)

/// Returns the Status of `expr` from the enclosing function when it is not ok.
#define H5CKPT_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::h5ckpt::Status h5ckpt_st_ = (expr);    \
    if (!h5ckpt_st_.ok()) return h5ckpt_st_; \
  } while (0)

#define H5CKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

/// `H5CKPT_ASSIGN_OR_RETURN(auto x, f());` unwraps a Result or returns its Status.
#define H5CKPT_ASSIGN_OR_RETURN(lhs, expr) \
  H5CKPT_ASSIGN_OR_RETURN_IMPL_(H5CKPT_CONCAT_(h5ckpt_res_, __LINE__), lhs, expr)
