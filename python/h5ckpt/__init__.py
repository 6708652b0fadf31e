"""h5ckpt: distributed checkpoints in parallel HDF5, from Python.

A binding of the C++ library (docs/python.md): Topology over mpi4py communicators, StateDict of
numpy arrays / torch tensors (references, never copies), Checkpointer.save / save_async / load with
resharding to any layout, checkpoint metadata and the read API. `h5ckpt.torch` builds StateDicts
from torch modules and optimizers and keeps RNG state and a step counter as extra state.

Importing h5ckpt imports mpi4py.MPI, which initializes MPI (with MPI_THREAD_MULTIPLE, which
save_async needs to run in the background). Every Topology and Checkpointer still alive at
interpreter exit is closed (pending saves waited for) before mpi4py finalizes MPI.
"""
import atexit as _atexit

from mpi4py import MPI as _MPI  # noqa: F401  (initializes MPI before the library needs it)

from . import _core
from ._core import (  # noqa: F401
    Box,
    CheckpointDirEntry,
    CheckpointInfo,
    CheckpointListing,
    Checkpointer,
    CheckpointerOptions,
    CheckpointReader,
    Config,
    Device,
    DType,
    Error,
    ErrorCode,
    LoadOptions,
    LoadReport,
    LoadStrictness,
    ParallelSizes,
    PruneOptions,
    PruneResult,
    RankCoords,
    ResolvedCheckpoint,
    SavedRegion,
    SaveHandle,
    SaveOptions,
    SaveReport,
    ShardPiece,
    ShardSpec,
    StateDict,
    StateTransfer,
    TensorInfo,
    TransferOptions,
    TransferReport,
    Topology,
    apply_env,
    convert_elements,
    dtype_from_name,
    dtype_is_float,
    dtype_name,
    dtype_size,
    error_code_name,
    is_checkpoint_dir,
    list_checkpoints,
    load_config,
    numpy_dtype,
    parse_byte_size,
    parse_config,
    prune_checkpoints,
    read_checkpoint_info,
    region_to_string,
    resolve_config,
    set_log_level,
    verify_checkpoint,
    version,
)
from ._core import loader  # noqa: F401

__version__ = version()

_atexit.register(_core._close_all)
