/* C interface to h5ckpt, for C and Fortran trainers and Python (ctypes).
 *
 * A thin layer over the C++ library (include/h5ckpt/checkpointer.h): the same checkpoints, the
 * same collective semantics, the same automatic resharding on load. See docs/c-api.md.
 *
 * Conventions
 * - Every function that can fail returns an int: H5CKPT_OK (0) or one of the h5ckpt_error
 *   codes; h5ckpt_last_error() then gives this thread's text of that failure (which tensor,
 *   which file, which rank).
 * - Objects are opaque handles created by *_create / *_open and released by the matching
 *   *_free (which accept NULL). No function takes ownership of caller memory.
 * - save, save_async, load and topology creation are collective over the topology's world:
 *   every rank calls them in the same order and gets the same return code.
 * - Free checkpointers and topologies before MPI_Finalize; a topology must outlive every
 *   checkpointer created from it.
 *
 * Compiles as C99 and C++; includes only <mpi.h>, <stddef.h>, <stdint.h> and h5ckpt/export.h.
 */
#ifndef H5CKPT_H5CKPT_H
#define H5CKPT_H5CKPT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "h5ckpt/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes; the values equal h5ckpt::ErrorCode. */
enum h5ckpt_error {
  H5CKPT_OK = 0,
  H5CKPT_INVALID_ARGUMENT = 1, /* malformed argument: bad shard, null buffer, unknown dtype */
  H5CKPT_NOT_FOUND = 2,        /* checkpoint, key or file missing */
  H5CKPT_SHAPE_MISMATCH = 3,   /* global shape differs between ranks or from the checkpoint */
  H5CKPT_DTYPE_MISMATCH = 4,   /* dtype differs and no conversion exists */
  H5CKPT_CORRUPT = 5,          /* metadata or data fails validation / checksum */
  H5CKPT_NOT_COMMITTED = 6,    /* checkpoint directory was never committed */
  H5CKPT_ALREADY_EXISTS = 7,   /* save target exists and overwrite was not requested */
  H5CKPT_IO = 8,               /* operating-system or HDF5 I/O failure */
  H5CKPT_MPI = 9,              /* an MPI call failed */
  H5CKPT_REMOTE = 10,          /* another rank failed (the text names it) */
  H5CKPT_UNSUPPORTED = 11,     /* valid request this build cannot do */
  H5CKPT_INTERNAL = 12         /* a bug in h5ckpt (or out of memory) */
};

/* Element types; the values equal h5ckpt::DType. */
enum h5ckpt_dtype {
  H5CKPT_F32 = 0,
  H5CKPT_F64 = 1,
  H5CKPT_F16 = 2,
  H5CKPT_BF16 = 3,
  H5CKPT_F8E4M3 = 4,
  H5CKPT_F8E5M2 = 5,
  H5CKPT_I8 = 6,
  H5CKPT_I16 = 7,
  H5CKPT_I32 = 8,
  H5CKPT_I64 = 9,
  H5CKPT_U8 = 10,
  H5CKPT_BOOL = 11
};

typedef struct h5ckpt_topology h5ckpt_topology_t;         /* TP x DP x PP grid over a communicator */
typedef struct h5ckpt_state h5ckpt_state_t;               /* the tensors one rank saves or loads */
typedef struct h5ckpt_checkpointer h5ckpt_checkpointer_t; /* saves and loads states */
typedef struct h5ckpt_save_handle h5ckpt_save_handle_t;   /* an asynchronous save in flight */
typedef struct h5ckpt_info h5ckpt_info_t;                 /* a checkpoint's metadata (no MPI) */

/* ---- errors and versions ------------------------------------------------------------------ */

/* Text of the last failure of an h5ckpt_* call on this thread ("" if none). Valid until the
 * next failing call on this thread. */
H5CKPT_API const char* h5ckpt_last_error(void);
/* Short name of a return code, e.g. "corrupt checkpoint" for H5CKPT_CORRUPT. */
H5CKPT_API const char* h5ckpt_error_name(int code);
/* Library version, e.g. "0.1.0". */
H5CKPT_API const char* h5ckpt_version(void);
/* Bytes per element of a dtype; 0 for an unknown value. */
H5CKPT_API size_t h5ckpt_dtype_size(int dtype);

/* ---- topology ----------------------------------------------------------------------------- */

/* Megatron rank order over `comm` (TP fastest, then DP, then PP); tp * dp * pp must equal the
 * size of `comm`. Collective over `comm` (which is duplicated, not kept). */
H5CKPT_API int h5ckpt_topology_create(MPI_Comm comm, int tp, int dp, int pp, h5ckpt_topology_t** out);
/* With context (cp) and expert (ep) parallelism: world = tp*cp*dp*pp, rank order TP fastest, then
 * CP, DP, PP; experts split over ep inside the dp*cp ranks (ep must divide dp*cp). Collective. */
H5CKPT_API int h5ckpt_topology_create_ex(MPI_Comm comm, int tp, int cp, int dp, int pp, int ep,
                                         h5ckpt_topology_t** out);
/* This rank's coordinates in the grid (any pointer may be NULL). */
H5CKPT_API int h5ckpt_topology_coords(const h5ckpt_topology_t* topo, int* tp_rank, int* dp_rank, int* pp_rank);
H5CKPT_API void h5ckpt_topology_free(h5ckpt_topology_t* topo);

/* ---- state: references to the caller's buffers (never copied) -------------------------------
 * Keys are layout-independent names such as "model/layers.0.mlp.fc1.weight" (letters, digits,
 * "_.-/"; the first component "meta" is reserved). Shapes are arrays of `ndim` int64 extents.
 * Each buffer must stay valid until the save or load that uses it returns (for save_async:
 * until h5ckpt_save_async returns; the data is snapshotted then). Malformed shards are
 * reported by save/load with the key named. */

H5CKPT_API int h5ckpt_state_create(h5ckpt_state_t** out);
/* A box of the tensor: `offsets[d]`, `lengths[d]` per dimension; `data` holds the box's
 * elements in row-major order. */
H5CKPT_API int h5ckpt_state_add_sharded(h5ckpt_state_t* state, const char* key, int dtype, int ndim,
                                        const int64_t* global_shape, const int64_t* offsets, const int64_t* lengths,
                                        void* data);
/* Elements [begin, end) of the row-major flattening of the whole tensor (ZeRO / FSDP flat
 * shards); `data` holds end - begin elements. */
H5CKPT_API int h5ckpt_state_add_flat(h5ckpt_state_t* state, const char* key, int dtype, int ndim,
                                     const int64_t* global_shape, int64_t begin, int64_t end, void* data);
/* Several boxes of one tensor in one buffer (fused layouts, e.g. a SwiGLU fc1 shard holding its
 * gate rows then its up rows): box p is `offsets[p*ndim + d]`, `lengths[p*ndim + d]` per
 * dimension, and its elements (row-major within the box) start `buffer_offsets[p]` bytes into
 * `data`. Each box is saved, loaded and resharded like any other shard of the tensor. npieces < 1
 * or a NULL array fails here; boxes overlapping in the tensor or in the buffer, or outside the
 * shape, are reported by save/load with the key and the piece named. */
H5CKPT_API int h5ckpt_state_add_pieces(h5ckpt_state_t* state, const char* key, int dtype, int ndim,
                                       const int64_t* global_shape, int npieces, const int64_t* offsets,
                                       const int64_t* lengths, const uint64_t* buffer_offsets, void* data);
/* The whole tensor, held by this rank (replicas on several ranks are written once). */
H5CKPT_API int h5ckpt_state_add_replicated(h5ckpt_state_t* state, const char* key, int dtype, int ndim,
                                           const int64_t* global_shape, void* data);
/* An opaque byte blob held whole by this rank (stored as a 1-D uint8 tensor of `size`). */
H5CKPT_API int h5ckpt_state_add_bytes(h5ckpt_state_t* state, const char* key, void* data, size_t size);
/* Number of items added so far. */
H5CKPT_API size_t h5ckpt_state_size(const h5ckpt_state_t* state);
H5CKPT_API void h5ckpt_state_free(h5ckpt_state_t* state);

/* ---- checkpointer ------------------------------------------------------------------------- */

/* `staging_bytes`: bound of the host staging pool for save_async (0: sized to the largest
 * save). `topo` must outlive the checkpointer. Not collective. */
H5CKPT_API int h5ckpt_checkpointer_create(const h5ckpt_topology_t* topo, uint64_t staging_bytes,
                                          h5ckpt_checkpointer_t** out);
/* Settings of a checkpointer (CheckpointerOptions in the C++ API, docs/configuration.md). */
typedef struct h5ckpt_checkpointer_options {
  uint64_t staging_bytes; /* bound of the host staging pool of save_async (0: largest save) */
  double timeout_s;       /* deadline of every wait for other ranks; then MPI_Abort (default 600; 0: none) */
  int64_t keep_last;      /* keep the N newest checkpoints of the directory saved into (default 0: all) */
  int64_t keep_every;     /* with keep_last: also keep steps that are multiples of K (default 0) */
  int io_threads;         /* load reader threads (0, the default: 2 on a network file system, else 1) */
  uint64_t memory_bytes;  /* bound of the library's buffers in a save or load (0: none; else >= 1 KiB) */
  /* Node-local checkpoints (docs/user-guide.md §13). local_dir: a node-local directory ("{node}":
   * the node's index), copied by the create call; NULL or "" (default): off. */
  const char* local_dir;
  int local_replicas;    /* copies of each node's files on the next nodes (default 1) */
  int64_t persist_every; /* steps that are multiples of K also go to the shared level (default 0: when asked) */
  int64_t local_keep;    /* local checkpoints each node keeps (default 2) */
} h5ckpt_checkpointer_options_t;

/* Fills `options` with the defaults above. */
H5CKPT_API void h5ckpt_checkpointer_options_init(h5ckpt_checkpointer_options_t* options);
/* As h5ckpt_checkpointer_create, with all settings. Negative values are refused. Not collective. */
H5CKPT_API int h5ckpt_checkpointer_create_with_options(const h5ckpt_topology_t* topo,
                                                       const h5ckpt_checkpointer_options_t* options,
                                                       h5ckpt_checkpointer_t** out);
/* A string attribute stored in the metadata of the following saves. */
H5CKPT_API int h5ckpt_checkpointer_set_attribute(h5ckpt_checkpointer_t* ck, const char* name, const char* value);
/* Waits for a save_async in flight, then frees. */
H5CKPT_API void h5ckpt_checkpointer_free(h5ckpt_checkpointer_t* ck);

typedef struct h5ckpt_save_options {
  int checksums;     /* record an xxh3 checksum per region (default 1) */
  int overwrite;     /* replace an existing checkpoint at `path` (default 0) */
  int update_latest; /* point <parent>/latest at the new checkpoint (default 1) */
  int64_t step;      /* stored in the metadata (default -1: none) */
  /* Device buffers: the cudaStream_t after whose queued work the state is final (the snapshot
   * waits for it on the device). NULL (default): the device is synchronized first. */
  void* device_stream;
  int persist; /* with a local_dir: also write this save to the shared level (default 0) */
  /* Two-phase writes of short runs (SaveOptions::aggregate_writes): 0 auto (default), 1 on, 2 off. */
  int aggregate_writes;
  uint64_t write_window_bytes; /* bytes an aggregating rank writes at once (0: the default, 32 MiB) */
} h5ckpt_save_options_t;

/* Fills `options` with the defaults above. */
H5CKPT_API void h5ckpt_save_options_init(h5ckpt_save_options_t* options);

/* Writes `state` as checkpoint directory `path` and commits it atomically. `options` may be
 * NULL (defaults). Collective. */
H5CKPT_API int h5ckpt_save(h5ckpt_checkpointer_t* ck, const h5ckpt_state_t* state, const char* path,
                           const h5ckpt_save_options_t* options);
/* Returns once this rank's data is snapshotted; writing and the commit go on in the
 * background (synchronously if MPI was not initialized with MPI_THREAD_MULTIPLE). The caller
 * may then modify its buffers and free `state`. Collective. */
H5CKPT_API int h5ckpt_save_async(h5ckpt_checkpointer_t* ck, const h5ckpt_state_t* state, const char* path,
                                 const h5ckpt_save_options_t* options, h5ckpt_save_handle_t** out);
/* 1 in *done once the save has committed or failed (never blocks). */
H5CKPT_API int h5ckpt_save_test(const h5ckpt_save_handle_t* handle, int* done);
/* Blocks until the save has committed or failed; returns its outcome (the same on every rank).
 * Collective in effect: every rank should wait. */
H5CKPT_API int h5ckpt_save_wait(h5ckpt_save_handle_t* handle);
H5CKPT_API void h5ckpt_save_handle_free(h5ckpt_save_handle_t* handle);

/* Fills the buffers of `state` from checkpoint `path` (or the one its `latest` names), whatever
 * layout saved it. strict != 0: every key must exist with the same global shape; strict == 0:
 * missing keys are skipped and their buffers left untouched. Float dtypes are converted when
 * the saved one differs. Collective. */
H5CKPT_API int h5ckpt_load(h5ckpt_checkpointer_t* ck, h5ckpt_state_t* state, const char* path, int strict);

/* h5ckpt_load_options_t::strictness (LoadStrictness in C++). Every mode checks the whole request
 * before reading and fails with one message (h5ckpt_last_error) listing every missing key, shape
 * mismatch, refused dtype and unexpected key; shape and dtype problems always fail. */
enum {
  H5CKPT_STRICT_IGNORE_UNEXPECTED = 0, /* default: missing keys fail; keys only the checkpoint holds do not */
  H5CKPT_STRICT_RAISE_ALL = 1,         /* missing keys and keys only the checkpoint holds fail */
  H5CKPT_STRICT_ALLOW_MISSING = 2      /* missing keys are skipped, their buffers left untouched */
};

typedef struct h5ckpt_load_options {
  int strict;          /* 0: as strictness = H5CKPT_STRICT_ALLOW_MISSING (default 1: strictness decides) */
  int convert_dtype;   /* float-to-float conversion when the saved dtype differs (default 1) */
  int verify;          /* check every byte read against the saved block checksums (default 1) */
  int zero_redundancy; /* replicas read once and sent to the others (default 1) */
  int strictness;      /* one of H5CKPT_STRICT_* (default H5CKPT_STRICT_IGNORE_UNEXPECTED) */
} h5ckpt_load_options_t;

/* Fills `options` with the defaults above. */
H5CKPT_API void h5ckpt_load_options_init(h5ckpt_load_options_t* options);
/* h5ckpt_load with all options (`options` may be NULL: defaults). Collective. */
H5CKPT_API int h5ckpt_load_with_options(h5ckpt_checkpointer_t* ck, h5ckpt_state_t* state, const char* path,
                                        const h5ckpt_load_options_t* options);

/* The checkpoint a load of `path` reads and its metadata: with a local_dir the newest one that can
 * be served, node-local (*is_local = 1) or shared (0); without, the one at `path`. `*info` is freed
 * with h5ckpt_info_free; `is_local` may be NULL. The reason for the choice is in the library log.
 * Collective. */
H5CKPT_API int h5ckpt_checkpointer_resolve(h5ckpt_checkpointer_t* ck, const char* path, h5ckpt_info_t** info,
                                           int* is_local);

/* ---- checkpoint metadata (no MPI needed) ---------------------------------------------------- */

/* Reads and validates the metadata of `path` (following `latest`). */
H5CKPT_API int h5ckpt_info_open(const char* path, h5ckpt_info_t** out);
H5CKPT_API size_t h5ckpt_info_num_tensors(const h5ckpt_info_t* info);
/* Tensor `index` (sorted by key). The key and shape pointers live as long as `info`; any output
 * pointer may be NULL. */
H5CKPT_API int h5ckpt_info_tensor(const h5ckpt_info_t* info, size_t index, const char** key, int* dtype, int* ndim,
                                  const int64_t** shape);
/* Index of `key`, or H5CKPT_NOT_FOUND. */
H5CKPT_API int h5ckpt_info_find(const h5ckpt_info_t* info, const char* key, size_t* index);
/* The step recorded at save time (-1: none). */
H5CKPT_API int64_t h5ckpt_info_step(const h5ckpt_info_t* info);
/* The topology that saved the checkpoint (any pointer may be NULL). */
H5CKPT_API int h5ckpt_info_topology(const h5ckpt_info_t* info, int* tp, int* dp, int* pp);
/* Re-reads every saved region and checks its checksum (the failure names tensor and region). */
H5CKPT_API int h5ckpt_info_verify(const h5ckpt_info_t* info);
H5CKPT_API void h5ckpt_info_free(h5ckpt_info_t* info);

/* ---- live state between ranks, without storage (include/h5ckpt/transfer.h) ---------------- */

typedef struct h5ckpt_transfer h5ckpt_transfer_t; /* a publisher/receiver over one communicator */

typedef struct h5ckpt_transfer_options {
  int64_t version;       /* the source's version, e.g. the training step (default 0) */
  int delta;             /* only changed blocks move when every rank holds the previous version (1) */
  int verify;            /* every block checked against the source's checksums (1) */
  int in_place;          /* checked where received instead of staged (0) */
  int strict;            /* every destination key must be held by a source (1) */
  int convert_dtype;     /* float-to-float conversion (1) */
  uint64_t memory_bytes; /* staging bound per rank; 0: none (0) */
  double timeout_s;      /* deadline of every wait (600); 0: none */
  int threads;           /* threads per rank hashing, checking and copying; 0: cores / ranks on the node */
  void* device_stream;   /* device buffers: the cudaStream_t read after; NULL: the whole device */
  int keep_previous;     /* in_place: overwritten bytes kept aside and put back on failure (1); 0:
                            a failure leaves new bytes */
} h5ckpt_transfer_options_t;

typedef struct h5ckpt_transfer_report {
  int delta;                /* only changed blocks moved */
  uint64_t bytes_sent;      /* payload bytes this rank sent */
  uint64_t bytes_received;  /* payload bytes this rank received */
  uint64_t bytes_total;     /* bytes a full transfer sends to this rank */
  uint64_t blocks_received; /* checksum blocks received */
  uint64_t blocks_total;    /* checksum blocks of everything this rank receives */
  double total_s;
  uint64_t bytes_sent_device; /* of bytes_sent: device to device (NCCL) */
} h5ckpt_transfer_report_t;

/* Duplicates `world`. Collective over it. Free before MPI_Finalize. */
H5CKPT_API int h5ckpt_transfer_create(MPI_Comm world, h5ckpt_transfer_t** out);
H5CKPT_API void h5ckpt_transfer_free(h5ckpt_transfer_t* transfer);
/* Fills `options` with the defaults above. */
H5CKPT_API void h5ckpt_transfer_options_init(h5ckpt_transfer_options_t* options);
/* Fills every destination buffer from the ranks holding the source state, in any layout: source
 * or destination may be NULL on ranks without that role (the same state on both for an in-memory
 * reshard). `options` and `report` may be NULL. Collective over the transfer's communicator; every
 * rank gets the same code; on failure the destination buffers are unchanged. */
H5CKPT_API int h5ckpt_transfer_run(h5ckpt_transfer_t* transfer, const h5ckpt_state_t* source,
                                   h5ckpt_state_t* destination, const h5ckpt_transfer_options_t* options,
                                   h5ckpt_transfer_report_t* report);
/* The version of the last committed transfer, -1 before the first. */
H5CKPT_API int64_t h5ckpt_transfer_version(const h5ckpt_transfer_t* transfer);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* H5CKPT_H5CKPT_H */
