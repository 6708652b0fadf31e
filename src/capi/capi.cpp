// The C interface (include/h5ckpt/h5ckpt.h): handles wrap the C++ objects; every entry point
// turns a Status (or an exception, which must not cross the C boundary) into an int code plus
// thread-local text.
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "h5ckpt/checkpointer.h"
#include "h5ckpt/h5ckpt.h"
#include "h5ckpt/state.h"
#include "h5ckpt/topology.h"
#include "h5ckpt/transfer.h"

struct h5ckpt_topology {
  h5ckpt::Topology topo;
};
struct h5ckpt_state {
  h5ckpt::StateDict dict;
};
struct h5ckpt_checkpointer {
  explicit h5ckpt_checkpointer(const h5ckpt::Topology& t, const h5ckpt::CheckpointerOptions& o) : ck(t, o) {}
  h5ckpt::Checkpointer ck;
};
struct h5ckpt_save_handle {
  h5ckpt::SaveHandle handle;
};
struct h5ckpt_info {
  h5ckpt::CheckpointInfo info;
};
struct h5ckpt_transfer {
  explicit h5ckpt_transfer(MPI_Comm world) : transfer(world) {}
  h5ckpt::StateTransfer transfer;
};

namespace {

using h5ckpt::ErrorCode;
using h5ckpt::Status;

// The C enums promise these values.
static_assert(H5CKPT_INTERNAL == static_cast<int>(ErrorCode::kInternal));
static_assert(H5CKPT_CORRUPT == static_cast<int>(ErrorCode::kCorrupt));
static_assert(H5CKPT_REMOTE == static_cast<int>(ErrorCode::kRemote));
static_assert(H5CKPT_BOOL == static_cast<int>(h5ckpt::DType::kBool));
static_assert(H5CKPT_BF16 == static_cast<int>(h5ckpt::DType::kBF16));
static_assert(H5CKPT_STRICT_IGNORE_UNEXPECTED == static_cast<int>(h5ckpt::LoadStrictness::kIgnoreUnexpected));
static_assert(H5CKPT_STRICT_RAISE_ALL == static_cast<int>(h5ckpt::LoadStrictness::kRaiseAll));
static_assert(H5CKPT_STRICT_ALLOW_MISSING == static_cast<int>(h5ckpt::LoadStrictness::kAllowMissing));
static_assert(H5CKPT_I64 == static_cast<int>(h5ckpt::DType::kI64));

constexpr int kOk = H5CKPT_OK;  // an int, so lambdas returning codes deduce one type

thread_local std::string g_last_error;

int fail(const Status& st) {
  g_last_error = st.to_string();
  return static_cast<int>(st.code());
}
int fail(ErrorCode code, const std::string& msg) { return fail(Status(code, msg)); }
int report(const Status& st) { return st.ok() ? kOk : fail(st); }

// Runs fn, mapping exceptions (bad_alloc, std::length_error...) to H5CKPT_INTERNAL.
template <class Fn>
int guarded(const char* where, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return fail(ErrorCode::kInternal, std::string(where) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(ErrorCode::kInternal, std::string(where) + ": " + e.what());
  } catch (...) {
    return fail(ErrorCode::kInternal, std::string(where) + ": unknown exception");
  }
}

bool valid_dtype(int dtype) { return dtype >= H5CKPT_F32 && dtype <= H5CKPT_BOOL; }

// Checks the arguments common to all add_* calls and builds the global shape.
int tensor_args(const char* fn, const h5ckpt_state_t* state, const char* key, int dtype, int ndim, const int64_t* shape,
                h5ckpt::Shape* out) {
  const std::string where = std::string(fn) + ": ";
  if (!state) return fail(ErrorCode::kInvalidArgument, where + "state is NULL");
  if (!key || !*key) return fail(ErrorCode::kInvalidArgument, where + "key is NULL or empty");
  if (!valid_dtype(dtype))
    return fail(ErrorCode::kInvalidArgument, where + "unknown dtype " + std::to_string(dtype) + " for '" + key + "'");
  if (ndim <= 0 || !shape)
    return fail(ErrorCode::kInvalidArgument, where + "'" + key + "' needs ndim >= 1 and a shape array");
  out->assign(shape, shape + ndim);
  return kOk;
}

h5ckpt::SaveOptions save_options(const h5ckpt_save_options_t* o) {
  h5ckpt::SaveOptions s;
  if (o) {
    s.checksums = o->checksums != 0;
    s.overwrite = o->overwrite != 0;
    s.update_latest = o->update_latest != 0;
    s.step = o->step;
    s.device_stream = o->device_stream;
    s.persist = o->persist != 0;
    if (o->aggregate_writes == 1) s.aggregate_writes = h5ckpt::AggregateWrites::kOn;
    else if (o->aggregate_writes == 2) s.aggregate_writes = h5ckpt::AggregateWrites::kOff;
    if (o->write_window_bytes) s.write_window_bytes = o->write_window_bytes;
  }
  return s;
}

}  // namespace

extern "C" {

const char* h5ckpt_last_error(void) { return g_last_error.c_str(); }

const char* h5ckpt_error_name(int code) {
  if (code < 0 || code > H5CKPT_INTERNAL) return "unknown";
  return h5ckpt::error_code_name(static_cast<ErrorCode>(code));
}

const char* h5ckpt_version(void) { return h5ckpt::version(); }

size_t h5ckpt_dtype_size(int dtype) {
  return valid_dtype(dtype) ? h5ckpt::dtype_size(static_cast<h5ckpt::DType>(dtype)) : 0;
}

// ---- topology --------------------------------------------------------------------------------

int h5ckpt_topology_create(MPI_Comm comm, int tp, int dp, int pp, h5ckpt_topology_t** out) {
  return guarded("h5ckpt_topology_create", [&] {
    if (!out) return fail(ErrorCode::kInvalidArgument, "h5ckpt_topology_create: out is NULL");
    *out = nullptr;
    auto t = h5ckpt::Topology::create(comm, h5ckpt::ParallelSizes{tp, dp, pp});
    if (!t.ok()) return fail(t.status());
    *out = new h5ckpt_topology{std::move(t).value()};
    return kOk;
  });
}

int h5ckpt_topology_create_ex(MPI_Comm comm, int tp, int cp, int dp, int pp, int ep, h5ckpt_topology_t** out) {
  return guarded("h5ckpt_topology_create_ex", [&] {
    if (!out) return fail(ErrorCode::kInvalidArgument, "h5ckpt_topology_create_ex: out is NULL");
    *out = nullptr;
    auto t = h5ckpt::Topology::create(comm, h5ckpt::ParallelSizes{tp, dp, pp, cp, ep});
    if (!t.ok()) return fail(t.status());
    *out = new h5ckpt_topology{std::move(t).value()};
    return kOk;
  });
}

int h5ckpt_topology_coords(const h5ckpt_topology_t* topo, int* tp_rank, int* dp_rank, int* pp_rank) {
  if (!topo) return fail(ErrorCode::kInvalidArgument, "h5ckpt_topology_coords: topology is NULL");
  const h5ckpt::RankCoords c = topo->topo.coords();
  if (tp_rank) *tp_rank = c.tp;
  if (dp_rank) *dp_rank = c.dp;
  if (pp_rank) *pp_rank = c.pp;
  return kOk;
}

void h5ckpt_topology_free(h5ckpt_topology_t* topo) { delete topo; }

// ---- state -----------------------------------------------------------------------------------

int h5ckpt_state_create(h5ckpt_state_t** out) {
  return guarded("h5ckpt_state_create", [&] {
    if (!out) return fail(ErrorCode::kInvalidArgument, "h5ckpt_state_create: out is NULL");
    *out = new h5ckpt_state{};
    return kOk;
  });
}

int h5ckpt_state_add_sharded(h5ckpt_state_t* state, const char* key, int dtype, int ndim, const int64_t* global_shape,
                             const int64_t* offsets, const int64_t* lengths, void* data) {
  return guarded("h5ckpt_state_add_sharded", [&] {
    h5ckpt::Shape shape;
    if (const int rc = tensor_args("h5ckpt_state_add_sharded", state, key, dtype, ndim, global_shape, &shape))
      return rc;
    if (!offsets || !lengths)
      return fail(ErrorCode::kInvalidArgument,
                  std::string("h5ckpt_state_add_sharded: '") + key + "' needs offsets and lengths arrays");
    auto spec =
        h5ckpt::ShardSpec::box_of(h5ckpt::Shape(offsets, offsets + ndim), h5ckpt::Shape(lengths, lengths + ndim));
    state->dict.add(key, static_cast<h5ckpt::DType>(dtype), std::move(shape), std::move(spec), data);
    return kOk;
  });
}

int h5ckpt_state_add_flat(h5ckpt_state_t* state, const char* key, int dtype, int ndim, const int64_t* global_shape,
                          int64_t begin, int64_t end, void* data) {
  return guarded("h5ckpt_state_add_flat", [&] {
    h5ckpt::Shape shape;
    if (const int rc = tensor_args("h5ckpt_state_add_flat", state, key, dtype, ndim, global_shape, &shape)) return rc;
    auto spec = h5ckpt::ShardSpec::flat_range(h5ckpt::ShardSpec::whole(shape).box, begin, end);
    state->dict.add(key, static_cast<h5ckpt::DType>(dtype), std::move(shape), std::move(spec), data);
    return kOk;
  });
}

int h5ckpt_state_add_pieces(h5ckpt_state_t* state, const char* key, int dtype, int ndim, const int64_t* global_shape,
                            int npieces, const int64_t* offsets, const int64_t* lengths, const uint64_t* buffer_offsets,
                            void* data) {
  return guarded("h5ckpt_state_add_pieces", [&] {
    h5ckpt::Shape shape;
    if (const int rc = tensor_args("h5ckpt_state_add_pieces", state, key, dtype, ndim, global_shape, &shape)) return rc;
    if (npieces < 1)
      return fail(ErrorCode::kInvalidArgument, std::string("h5ckpt_state_add_pieces: '") + key +
                                                   "' needs npieces >= 1, got " + std::to_string(npieces));
    if (!offsets || !lengths || !buffer_offsets)
      return fail(ErrorCode::kInvalidArgument, std::string("h5ckpt_state_add_pieces: '") + key +
                                                   "' needs offsets, lengths and buffer_offsets arrays");
    std::vector<h5ckpt::ShardPiece> pieces(static_cast<size_t>(npieces));
    for (int p = 0; p < npieces; ++p) {
      const int64_t* o = offsets + static_cast<size_t>(p) * ndim;
      const int64_t* l = lengths + static_cast<size_t>(p) * ndim;
      pieces[p].shard = h5ckpt::ShardSpec::box_of(h5ckpt::Shape(o, o + ndim), h5ckpt::Shape(l, l + ndim));
      pieces[p].buffer_offset = buffer_offsets[p];
    }
    state->dict.add_pieces(key, static_cast<h5ckpt::DType>(dtype), std::move(shape), std::move(pieces), data);
    return kOk;
  });
}

int h5ckpt_state_add_replicated(h5ckpt_state_t* state, const char* key, int dtype, int ndim,
                                const int64_t* global_shape, void* data) {
  return guarded("h5ckpt_state_add_replicated", [&] {
    h5ckpt::Shape shape;
    if (const int rc = tensor_args("h5ckpt_state_add_replicated", state, key, dtype, ndim, global_shape, &shape))
      return rc;
    state->dict.add_replicated(key, static_cast<h5ckpt::DType>(dtype), std::move(shape), data);
    return kOk;
  });
}

int h5ckpt_state_add_bytes(h5ckpt_state_t* state, const char* key, void* data, size_t size) {
  return guarded("h5ckpt_state_add_bytes", [&] {
    if (!state) return fail(ErrorCode::kInvalidArgument, "h5ckpt_state_add_bytes: state is NULL");
    if (!key || !*key) return fail(ErrorCode::kInvalidArgument, "h5ckpt_state_add_bytes: key is NULL or empty");
    state->dict.add_bytes(key, data, size);
    return kOk;
  });
}

size_t h5ckpt_state_size(const h5ckpt_state_t* state) { return state ? state->dict.size() : 0; }

void h5ckpt_state_free(h5ckpt_state_t* state) { delete state; }

// ---- checkpointer ----------------------------------------------------------------------------

int h5ckpt_checkpointer_create(const h5ckpt_topology_t* topo, uint64_t staging_bytes, h5ckpt_checkpointer_t** out) {
  return guarded("h5ckpt_checkpointer_create", [&] {
    if (!out) return fail(ErrorCode::kInvalidArgument, "h5ckpt_checkpointer_create: out is NULL");
    *out = nullptr;
    if (!topo) return fail(ErrorCode::kInvalidArgument, "h5ckpt_checkpointer_create: topology is NULL");
    h5ckpt::CheckpointerOptions o;
    o.staging_bytes = staging_bytes;
    *out = new h5ckpt_checkpointer(topo->topo, o);
    return kOk;
  });
}

void h5ckpt_checkpointer_options_init(h5ckpt_checkpointer_options_t* options) {
  if (!options) return;
  const h5ckpt::CheckpointerOptions d;
  options->staging_bytes = d.staging_bytes;
  options->timeout_s = d.timeout_s;
  options->keep_last = d.keep_last;
  options->keep_every = d.keep_every;
  options->io_threads = d.io_threads;
  options->memory_bytes = d.memory_bytes;
  options->local_dir = nullptr;
  options->local_replicas = d.local_replicas;
  options->persist_every = d.persist_every;
  options->local_keep = d.local_keep;
}

int h5ckpt_checkpointer_create_with_options(const h5ckpt_topology_t* topo, const h5ckpt_checkpointer_options_t* options,
                                            h5ckpt_checkpointer_t** out) {
  return guarded("h5ckpt_checkpointer_create_with_options", [&] {
    const char* where = "h5ckpt_checkpointer_create_with_options: ";
    if (!out) return fail(ErrorCode::kInvalidArgument, std::string(where) + "out is NULL");
    *out = nullptr;
    if (!topo) return fail(ErrorCode::kInvalidArgument, std::string(where) + "topology is NULL");
    h5ckpt::CheckpointerOptions o;
    if (options) {
      if (!(options->timeout_s >= 0) || options->keep_last < 0 || options->keep_every < 0 || options->io_threads < 0 ||
          options->local_replicas < 0 || options->persist_every < 0 || options->local_keep < 0)
        return fail(ErrorCode::kInvalidArgument,
                    std::string(where) +
                        "timeout_s, keep_last, keep_every, local_replicas, persist_every and "
                        "local_keep must be >= 0 and io_threads >= 0");
      o.staging_bytes = options->staging_bytes;
      o.timeout_s = options->timeout_s;
      o.keep_last = options->keep_last;
      o.keep_every = options->keep_every;
      o.io_threads = options->io_threads;
      o.memory_bytes = options->memory_bytes;
      o.local_dir = options->local_dir ? options->local_dir : "";
      o.local_replicas = options->local_replicas;
      o.persist_every = options->persist_every;
      o.local_keep = options->local_keep;
    }
    *out = new h5ckpt_checkpointer(topo->topo, o);
    return kOk;
  });
}

int h5ckpt_checkpointer_resolve(h5ckpt_checkpointer_t* ck, const char* path, h5ckpt_info_t** info, int* is_local) {
  return guarded("h5ckpt_checkpointer_resolve", [&] {
    if (!info) return fail(ErrorCode::kInvalidArgument, "h5ckpt_checkpointer_resolve: info is NULL");
    *info = nullptr;
    if (!ck || !path)
      return fail(ErrorCode::kInvalidArgument, "h5ckpt_checkpointer_resolve: checkpointer or path is NULL");
    auto r = ck->ck.resolve(path);
    if (!r.ok()) return fail(r.status());
    if (is_local) *is_local = r->level == "local" ? 1 : 0;
    *info = new h5ckpt_info{std::move(r->info)};
    return kOk;
  });
}

int h5ckpt_checkpointer_set_attribute(h5ckpt_checkpointer_t* ck, const char* name, const char* value) {
  return guarded("h5ckpt_checkpointer_set_attribute", [&] {
    if (!ck || !name || !value)
      return fail(ErrorCode::kInvalidArgument, "h5ckpt_checkpointer_set_attribute: NULL argument");
    ck->ck.set_attribute(name, value);
    return kOk;
  });
}

void h5ckpt_checkpointer_free(h5ckpt_checkpointer_t* ck) { delete ck; }

void h5ckpt_save_options_init(h5ckpt_save_options_t* options) {
  if (!options) return;
  const h5ckpt::SaveOptions d;
  options->checksums = d.checksums;
  options->overwrite = d.overwrite;
  options->update_latest = d.update_latest;
  options->step = d.step;
  options->device_stream = d.device_stream;
  options->persist = d.persist ? 1 : 0;
  options->aggregate_writes = static_cast<int>(d.aggregate_writes);
  options->write_window_bytes = d.write_window_bytes;
}

int h5ckpt_save(h5ckpt_checkpointer_t* ck, const h5ckpt_state_t* state, const char* path,
                const h5ckpt_save_options_t* options) {
  return guarded("h5ckpt_save", [&] {
    // A NULL argument on one rank only would leave the others in the collective: callers must
    // pass the same kind of arguments everywhere, as for any collective.
    if (!ck || !state || !path) return fail(ErrorCode::kInvalidArgument, "h5ckpt_save: NULL argument");
    return report(ck->ck.save(state->dict, path, save_options(options)).status());
  });
}

int h5ckpt_save_async(h5ckpt_checkpointer_t* ck, const h5ckpt_state_t* state, const char* path,
                      const h5ckpt_save_options_t* options, h5ckpt_save_handle_t** out) {
  return guarded("h5ckpt_save_async", [&] {
    if (!out) return fail(ErrorCode::kInvalidArgument, "h5ckpt_save_async: out is NULL");
    *out = nullptr;
    if (!ck || !state || !path) return fail(ErrorCode::kInvalidArgument, "h5ckpt_save_async: NULL argument");
    auto h = ck->ck.save_async(state->dict, path, save_options(options));
    if (!h.ok()) return fail(h.status());
    *out = new h5ckpt_save_handle{std::move(h).value()};
    return kOk;
  });
}

int h5ckpt_save_test(const h5ckpt_save_handle_t* handle, int* done) {
  if (!handle || !done) return fail(ErrorCode::kInvalidArgument, "h5ckpt_save_test: NULL argument");
  *done = handle->handle.test() ? 1 : 0;
  return kOk;
}

int h5ckpt_save_wait(h5ckpt_save_handle_t* handle) {
  return guarded("h5ckpt_save_wait", [&] {
    if (!handle || !handle->handle.valid())
      return fail(ErrorCode::kInvalidArgument, "h5ckpt_save_wait: handle is NULL or invalid");
    return report(handle->handle.wait().status());
  });
}

void h5ckpt_save_handle_free(h5ckpt_save_handle_t* handle) { delete handle; }

int h5ckpt_load(h5ckpt_checkpointer_t* ck, h5ckpt_state_t* state, const char* path, int strict) {
  return guarded("h5ckpt_load", [&] {
    if (!ck || !state || !path) return fail(ErrorCode::kInvalidArgument, "h5ckpt_load: NULL argument");
    h5ckpt::LoadOptions o;
    o.strict = strict != 0;
    return report(ck->ck.load(state->dict, path, o).status());
  });
}

void h5ckpt_load_options_init(h5ckpt_load_options_t* options) {
  if (!options) return;
  const h5ckpt::LoadOptions d;
  options->strict = d.strict;
  options->convert_dtype = d.convert_dtype;
  options->verify = d.verify;
  options->zero_redundancy = d.zero_redundancy;
  options->strictness = static_cast<int>(d.strictness);
}

int h5ckpt_load_with_options(h5ckpt_checkpointer_t* ck, h5ckpt_state_t* state, const char* path,
                             const h5ckpt_load_options_t* options) {
  return guarded("h5ckpt_load_with_options", [&] {
    if (!ck || !state || !path) return fail(ErrorCode::kInvalidArgument, "h5ckpt_load_with_options: NULL argument");
    h5ckpt::LoadOptions o;
    if (options) {
      o.strict = options->strict != 0;
      o.convert_dtype = options->convert_dtype != 0;
      o.verify = options->verify != 0;
      o.zero_redundancy = options->zero_redundancy != 0;
      if (options->strictness < H5CKPT_STRICT_IGNORE_UNEXPECTED || options->strictness > H5CKPT_STRICT_ALLOW_MISSING)
        return fail(ErrorCode::kInvalidArgument, "h5ckpt_load_with_options: strictness " +
                                                     std::to_string(options->strictness) +
                                                     " is none of H5CKPT_STRICT_*");
      o.strictness = static_cast<h5ckpt::LoadStrictness>(options->strictness);
    }
    return report(ck->ck.load(state->dict, path, o).status());
  });
}

// ---- metadata --------------------------------------------------------------------------------

int h5ckpt_info_open(const char* path, h5ckpt_info_t** out) {
  return guarded("h5ckpt_info_open", [&] {
    if (!out) return fail(ErrorCode::kInvalidArgument, "h5ckpt_info_open: out is NULL");
    *out = nullptr;
    if (!path) return fail(ErrorCode::kInvalidArgument, "h5ckpt_info_open: path is NULL");
    auto info = h5ckpt::read_checkpoint_info(path);
    if (!info.ok()) return fail(info.status());
    *out = new h5ckpt_info{std::move(info).value()};
    return kOk;
  });
}

size_t h5ckpt_info_num_tensors(const h5ckpt_info_t* info) { return info ? info->info.tensors.size() : 0; }

int h5ckpt_info_tensor(const h5ckpt_info_t* info, size_t index, const char** key, int* dtype, int* ndim,
                       const int64_t** shape) {
  if (!info) return fail(ErrorCode::kInvalidArgument, "h5ckpt_info_tensor: info is NULL");
  if (index >= info->info.tensors.size())
    return fail(ErrorCode::kInvalidArgument, "h5ckpt_info_tensor: index " + std::to_string(index) + " out of range (" +
                                                 std::to_string(info->info.tensors.size()) + " tensors)");
  const h5ckpt::TensorInfo& t = info->info.tensors[index];
  if (key) *key = t.key.c_str();
  if (dtype) *dtype = static_cast<int>(t.dtype);
  if (ndim) *ndim = static_cast<int>(t.shape.size());
  if (shape) *shape = t.shape.data();
  return kOk;
}

int h5ckpt_info_find(const h5ckpt_info_t* info, const char* key, size_t* index) {
  if (!info || !key) return fail(ErrorCode::kInvalidArgument, "h5ckpt_info_find: NULL argument");
  const h5ckpt::TensorInfo* t = info->info.find(key);
  if (!t)
    return fail(ErrorCode::kNotFound, std::string("key '") + key + "' is not in checkpoint '" + info->info.path + "'");
  if (index) *index = static_cast<size_t>(t - info->info.tensors.data());
  return kOk;
}

int64_t h5ckpt_info_step(const h5ckpt_info_t* info) { return info ? info->info.step : -1; }

int h5ckpt_info_topology(const h5ckpt_info_t* info, int* tp, int* dp, int* pp) {
  if (!info) return fail(ErrorCode::kInvalidArgument, "h5ckpt_info_topology: info is NULL");
  if (tp) *tp = info->info.saved_sizes.tp;
  if (dp) *dp = info->info.saved_sizes.dp;
  if (pp) *pp = info->info.saved_sizes.pp;
  return kOk;
}

int h5ckpt_info_verify(const h5ckpt_info_t* info) {
  return guarded("h5ckpt_info_verify", [&] {
    if (!info) return fail(ErrorCode::kInvalidArgument, "h5ckpt_info_verify: info is NULL");
    return report(h5ckpt::verify_checkpoint(info->info));
  });
}

void h5ckpt_info_free(h5ckpt_info_t* info) { delete info; }

// ---- transfer (live state between ranks) -------------------------------------------------

int h5ckpt_transfer_create(MPI_Comm world, h5ckpt_transfer_t** out) {
  return guarded("h5ckpt_transfer_create", [&] {
    if (!out) return fail(ErrorCode::kInvalidArgument, "h5ckpt_transfer_create: out is NULL");
    *out = new h5ckpt_transfer(world);
    return kOk;
  });
}

void h5ckpt_transfer_free(h5ckpt_transfer_t* transfer) { delete transfer; }

void h5ckpt_transfer_options_init(h5ckpt_transfer_options_t* options) {
  if (!options) return;
  const h5ckpt::TransferOptions d;
  options->version = d.version;
  options->delta = d.delta;
  options->verify = d.verify;
  options->in_place = d.in_place;
  options->strict = d.strict;
  options->convert_dtype = d.convert_dtype;
  options->memory_bytes = d.memory_bytes;
  options->timeout_s = d.timeout_s;
  options->threads = d.threads;
  options->device_stream = d.device_stream;
  options->keep_previous = d.keep_previous;
}

int h5ckpt_transfer_run(h5ckpt_transfer_t* transfer, const h5ckpt_state_t* source, h5ckpt_state_t* destination,
                        const h5ckpt_transfer_options_t* options, h5ckpt_transfer_report_t* out) {
  return guarded("h5ckpt_transfer_run", [&] {
    if (!transfer) return fail(ErrorCode::kInvalidArgument, "h5ckpt_transfer_run: transfer is NULL");
    h5ckpt::TransferOptions o;
    if (options) {
      o.version = options->version;
      o.delta = options->delta != 0;
      o.verify = options->verify != 0;
      o.in_place = options->in_place != 0;
      o.strict = options->strict != 0;
      o.convert_dtype = options->convert_dtype != 0;
      o.memory_bytes = options->memory_bytes;
      o.timeout_s = options->timeout_s;
      o.threads = options->threads;
      o.device_stream = options->device_stream;
      o.keep_previous = options->keep_previous != 0;
    }
    auto r =
        transfer->transfer.transfer(source ? &source->dict : nullptr, destination ? &destination->dict : nullptr, o);
    if (r.ok() && out) {
      out->delta = r->delta;
      out->bytes_sent = r->bytes_sent;
      out->bytes_received = r->bytes_received;
      out->bytes_total = r->bytes_total;
      out->blocks_received = r->blocks_received;
      out->blocks_total = r->blocks_total;
      out->total_s = r->total_s;
      out->bytes_sent_device = r->bytes_sent_device;
    }
    return report(r.status());
  });
}

int64_t h5ckpt_transfer_version(const h5ckpt_transfer_t* transfer) {
  return transfer ? transfer->transfer.version() : -1;
}

}  // extern "C"
