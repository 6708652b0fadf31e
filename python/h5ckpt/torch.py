"""h5ckpt.torch: StateDicts from torch modules and optimizers, and extra state (RNG, step).

The library saves what each rank holds as a part of a tensor's *global* shape. A torch trainer
knows its own sharding (which rows of which weight a tensor-parallel rank holds, which flat range of
the optimizer state a ZeRO rank owns); it says so with *rules* that map a parameter name to a
`Placement` (global shape + `h5ckpt.ShardSpec`). The helpers then add references to the module's
parameters and buffers and to the optimizer's state tensors: nothing is copied, so a load writes
straight into them.

    import h5ckpt, h5ckpt.torch as ht
    rules = {"fc1.weight": ht.Placement.split([4096, 1024], 0, tp, tp_rank)}   # others: replicated
    sd = h5ckpt.StateDict()
    placements = ht.add_module(sd, model, rules)                       # keys model/<name>
    ht.init_optimizer_state(opt)                                       # Adam/AdamW: state before step 1
    ht.add_optimizer(sd, opt, model.named_parameters(), placements)   # optimizer/<state>/<name>
    extra = ht.ExtraState(); extra.add_to(sd)                          # extra/rng/*, extra/step
    extra.capture(step=step); ckpt.save(sd, path)
    ...
    ckpt.load(sd, path); values = extra.restore()                      # RNGs set, values["step"]

Keys are layout-independent (no rank in them), so another TP/DP layout can load them.

DTensor state dicts (FSDP2, tensor parallelism through parallelize_module, any DeviceMesh) need no
rules: `add_state_dict` reads each DTensor's mesh, placements and global shape and adds its local
tensor with the box it holds (`dtensor_box`); ranks holding the same box (Replicate() dimensions,
data-parallel replicas) are written once. Loading into DTensors of another mesh writes straight
into their local tensors:

    sd = h5ckpt.StateDict()
    ht.add_state_dict(sd, model.state_dict(), prefix="model/")       # DTensors and plain tensors
    ht.add_state_dict(sd, opt.state_dict()["state"], prefix="optim/") # FSDP2: DTensors like the params
    ckpt.save(sd, path)  ...  ckpt.load(sd_of_another_mesh, path)
"""
import json
import random
import struct

import numpy as np
import torch as _torch

from . import ShardSpec

__all__ = [
    "Placement",
    "dtensor_box",
    "add_state_dict",
    "add_module",
    "add_optimizer",
    "add_tensor",
    "init_optimizer_state",
    "ExtraState",
]


class Placement:
    """Where a rank's tensor lies in the global tensor: the global shape and a ShardSpec."""

    __slots__ = ("global_shape", "shard")

    def __init__(self, global_shape, shard=None):
        self.global_shape = [int(d) for d in global_shape]
        self.shard = shard if shard is not None else ShardSpec.whole(self.global_shape)

    @staticmethod
    def whole(global_shape):
        """The whole tensor (replicated over the ranks that hold it)."""
        return Placement(global_shape)

    @staticmethod
    def split(global_shape, dim, parts, index):
        """Part `index` of dimension `dim` cut into `parts` near-equal parts (the first n % parts
        parts get one more element): column/row-parallel weights, vocabulary-parallel embeddings."""
        return Placement(global_shape, ShardSpec.split(list(global_shape), dim, parts, index))

    @staticmethod
    def box(global_shape, offset, shape):
        """An explicit box."""
        return Placement(global_shape, ShardSpec.box_of(list(offset), list(shape)))

    def flat_range(self, begin, end):
        """Elements [begin, end) of the row-major flattening of this placement's box: the ZeRO shard
        a data-parallel rank owns of this (tensor-parallel) part."""
        if self.shard.flat is not None:
            raise ValueError("flat_range of a flat range")
        return Placement(self.global_shape, ShardSpec.flat_range(self.shard.box, int(begin), int(end)))

    @property
    def local_shape(self):
        """Shape of the rank's buffer: the box's shape, or [n] for a flat range."""
        if self.shard.flat is not None:
            return [self.shard.numel()]
        return list(self.shard.box.shape)

    def __repr__(self):
        return f"Placement({self.global_shape}, {self.shard!r})"


# ---- DTensor placements ------------------------------------------------------------------------

def _placement_kind(p):
    """('shard', dim) or ('replicate', None) of a torch placement or of a plain tuple ("shard", d) /
    ("replicate",). Placements whose local values are not a box of the global tensor are refused."""
    if isinstance(p, tuple):
        if len(p) == 2 and p[0] == "shard":
            return "shard", int(p[1])
        if len(p) == 1 and p[0] == "replicate":
            return "replicate", None
        raise ValueError(f"placement {p!r}: expected ('shard', dim) or ('replicate',)")
    name = type(p).__name__
    if name == "_StridedShard":  # a subclass of Shard: test it first
        raise NotImplementedError(
            f"placement {p!r}: _StridedShard (FSDP2 over tensor-parallel shards of the same dimension) is not "
            "supported; its local values are interleaved rows, not one box. Save the tensor-parallel and FSDP "
            "dimensions on different tensor dimensions, or gather the state dict first")
    if name == "Shard":
        return "shard", int(p.dim)
    if name == "Replicate":
        return "replicate", None
    raise NotImplementedError(f"placement {p!r} is not supported (Shard(d) and Replicate() are): "
                              "a Partial value must be reduced before it is saved")


def dtensor_box(global_shape, mesh_shape, coordinate, placements):
    """The box (offset, shape) of the global tensor that the rank at `coordinate` of a mesh of
    `mesh_shape` holds under `placements` (one per mesh dimension), as DTensor computes it: mesh
    dimensions apply in order; Shard(d) cuts the part of dimension d the earlier mesh dimensions left
    into mesh_shape[i] chunks the way torch.chunk does (ceil(n / k) elements each, so the last ones may
    be short or empty) and keeps chunk coordinate[i]; Replicate() keeps it whole. Two mesh dimensions
    may shard the same tensor dimension (the later one cuts the earlier one's chunk). Pure: no
    torch.distributed needed; placements may be torch objects or ("shard", d) / ("replicate",)."""
    shape = [int(d) for d in global_shape]
    offset = [0] * len(shape)
    if len(mesh_shape) != len(placements) or len(coordinate) != len(placements):
        raise ValueError(f"mesh of shape {list(mesh_shape)}, coordinate {list(coordinate)} and "
                         f"{len(placements)} placements do not match")
    for i, p in enumerate(placements):
        kind, d = _placement_kind(p)
        if kind == "replicate":
            continue
        if d < 0:
            d += len(shape)
        if not 0 <= d < len(shape):
            raise ValueError(f"placement {p!r} shards dimension {d} of a {len(shape)}-d tensor")
        k, c = int(mesh_shape[i]), int(coordinate[i])
        if not 0 <= c < k:
            raise ValueError(f"coordinate {c} outside mesh dimension {i} of size {k}")
        n = shape[d]
        chunk = -(-n // k) if n else 0
        start = min(chunk * c, n)
        shape[d] = min(n, start + chunk) - start
        offset[d] += start
    return offset, shape


def _is_dtensor(t):
    return type(t).__name__ == "DTensor" and hasattr(t, "placements") and hasattr(t, "to_local")


def _dtensor_placement(key, t):
    mesh = t.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:
        raise ValueError(f"'{key}': this rank is not in the DTensor's mesh")
    offset, shape = dtensor_box(list(t.shape), list(mesh.mesh.shape), list(coord), list(t.placements))
    local = t.to_local()
    if list(local.shape) != shape:
        raise ValueError(f"'{key}': the local tensor has shape {list(local.shape)}, but the placements "
                         f"{list(t.placements)} on mesh {list(mesh.mesh.shape)} give this rank the box "
                         f"offset {offset} shape {shape} (padded local tensors are not supported)")
    return local, Placement.box(list(t.shape), offset, shape)


def add_state_dict(sd, state_dict, prefix="", allow_shape_mismatch=()):
    """Adds every tensor of `state_dict` (e.g. module.state_dict(), or an optimizer's "state" dict:
    nested dicts are walked, their keys joined with "/") as `prefix + name`: a DTensor as its local
    tensor with the box its placements give (dtensor_box), a plain tensor whole (replicated), 0-d
    as [1]. References only: a load writes into the local tensors, whatever mesh saved them.
    Returns ({key: Placement}, {key: non-tensor value}) — the values (e.g. optimizer param_groups
    entries) are left to the caller."""
    placements, other = {}, {}

    def walk(d, path):
        for name, v in d.items():
            key = f"{path}{name}"
            if isinstance(v, dict):
                walk(v, key + "/")
            elif _is_dtensor(v):
                local, pl = _dtensor_placement(key, v)
                if not local.is_contiguous():
                    raise ValueError(f"'{key}': the local tensor is not contiguous")
                add_tensor(sd, key, local, pl, allow_shape_mismatch=key in allow_shape_mismatch)
                placements[key] = pl
            elif isinstance(v, _torch.Tensor):
                placements[key] = add_tensor(sd, key, v, None, allow_shape_mismatch=key in allow_shape_mismatch)
            else:
                other[key] = v

    walk(state_dict, prefix)
    return placements, other


def _placement_for(rules, name, tensor):
    if rules is None:
        p = None
    elif callable(rules):
        p = rules(name, tensor)
    else:
        p = rules.get(name)
    if p is None:
        return Placement.whole(list(tensor.shape) or [1])
    if isinstance(p, Placement):
        return p
    if isinstance(p, tuple) and len(p) == 2:
        return Placement(p[0], p[1])
    raise TypeError(f"rule for '{name}' returned {p!r}; expected a Placement, (global_shape, ShardSpec) or None")


def add_tensor(sd, key, tensor, placement=None, **kwargs):
    """Adds one tensor (a reference) with its placement (default: whole). 0-d tensors are stored
    as shape [1]. Extra keywords go to StateDict.add (dtype=, allow_shape_mismatch=)."""
    if tensor.dim() == 0:
        tensor = tensor.view(1)  # a view: same memory
    if placement is None:
        placement = Placement.whole(list(tensor.shape))
    sd.add(key, tensor.detach(), placement.global_shape, placement.shard, **kwargs)
    return placement


def add_module(sd, module, rules=None, prefix="model/", buffers=True, allow_shape_mismatch=()):
    """Adds every parameter (and, with buffers=True, every persistent buffer) of `module` as
    `prefix + name`. `rules` maps a name (as in module.state_dict()) to the rank's Placement: a dict,
    or a callable (name, tensor) -> Placement | (global_shape, ShardSpec) | None; None and missing
    names mean replicated whole. Names in `allow_shape_mismatch` may load from a checkpoint whose
    dimension 0 differs (padded vocabularies). Returns {name: Placement}."""
    placements = {}
    named = module.state_dict(keep_vars=True) if buffers else dict(module.named_parameters())
    for name, t in named.items():
        if not isinstance(t, _torch.Tensor):
            continue
        p = _placement_for(rules, name, t)
        add_tensor(sd, prefix + name, t, p, allow_shape_mismatch=name in allow_shape_mismatch)
        placements[name] = p
    return placements


def init_optimizer_state(optimizer):
    """Creates the state torch creates lazily at the first step, so that a load has buffers to fill
    before any step: Adam and AdamW (step, exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad), and
    SGD with momentum and dampening 0 (momentum_buffer). The values equal a fresh optimizer's: the
    next step behaves as the first one would. Parameters that already have state are left alone."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state[p]
            if st:
                continue
            if isinstance(optimizer, (_torch.optim.Adam, _torch.optim.AdamW)):
                if group.get("capturable", False) or group.get("fused", False):
                    st["step"] = _torch.zeros((1,), dtype=_torch.float32, device=p.device)
                else:
                    st["step"] = _torch.tensor(0.0)
                st["exp_avg"] = _torch.zeros_like(p, memory_format=_torch.preserve_format)
                st["exp_avg_sq"] = _torch.zeros_like(p, memory_format=_torch.preserve_format)
                if group.get("amsgrad", False):
                    st["max_exp_avg_sq"] = _torch.zeros_like(p, memory_format=_torch.preserve_format)
            elif isinstance(optimizer, _torch.optim.SGD):
                if group.get("momentum", 0) == 0:
                    continue
                if group.get("dampening", 0) != 0:
                    raise NotImplementedError("SGD with dampening: its first step is not a step from a zero buffer")
                st["momentum_buffer"] = _torch.zeros_like(p, memory_format=_torch.preserve_format)
            else:
                raise NotImplementedError(
                    f"init_optimizer_state: {type(optimizer).__name__} is not known; run one step (or create its "
                    "state) before building the StateDict")


def add_optimizer(sd, optimizer, named_params, placements=None, prefix="optimizer/"):
    """Adds the optimizer's state tensors of the parameters in `named_params` ((name, param) pairs,
    e.g. module.named_parameters(), or a dict) as `prefix + state_name + "/" + name`, e.g.
    optimizer/exp_avg/layers.0.fc1.weight. A state tensor shaped like its parameter gets the
    parameter's placement (`placements`: {name: Placement} as add_module returns, or a callable
    (name, param) -> Placement; default whole); 0-d tensors (Adam's step) and other shapes are
    replicated whole (0-d as [1]). Call init_optimizer_state first (or after a step) so the state
    exists. Non-tensor state values cannot be referenced: they are returned as
    {key: value} for the caller to keep (e.g. in ExtraState values). Returns (keys, non_tensor)."""
    if isinstance(named_params, dict):
        named_params = named_params.items()
    keys, non_tensor = [], {}
    for name, p in named_params:
        st = optimizer.state.get(p)
        if not st:
            continue
        pl = _placement_for(placements, name, p) if placements is not None else Placement.whole(list(p.shape) or [1])
        for sname in sorted(st):
            v = st[sname]
            key = f"{prefix}{sname}/{name}"
            if isinstance(v, _torch.Tensor):
                if v.dim() > 0 and tuple(v.shape) == tuple(p.shape):
                    add_tensor(sd, key, v, pl)
                else:
                    add_tensor(sd, key, v, None)
                keys.append(key)
            elif v is not None:
                non_tensor[key] = v
    return keys, non_tensor


# ---- extra state: RNGs and a step counter -----------------------------------------------------

_PY_RNG = struct.Struct("<q625Iqd")  # version, Mersenne Twister words + index, has_gauss, gauss_next
_NP_RNG = struct.Struct("<624Iqqd")  # MT19937 key, pos, has_gauss, cached_gaussian


def _pack_python_rng(buf):
    version, internal, gauss = random.getstate()
    buf[:] = np.frombuffer(
        _PY_RNG.pack(version, *internal, 0 if gauss is None else 1, 0.0 if gauss is None else gauss), dtype=np.uint8)


def _unpack_python_rng(buf):
    vals = _PY_RNG.unpack(buf.tobytes())
    random.setstate((vals[0], tuple(vals[1:626]), vals[627] if vals[626] else None))


def _pack_numpy_rng(buf):
    name, key, pos, has_gauss, gauss = np.random.get_state()
    if name != "MT19937":
        raise ValueError(f"numpy's global RNG is {name}, not MT19937")
    buf[:] = np.frombuffer(_NP_RNG.pack(*[int(k) for k in key], pos, has_gauss, gauss), dtype=np.uint8)


def _unpack_numpy_rng(buf):
    vals = _NP_RNG.unpack(buf.tobytes())
    np.random.set_state(("MT19937", np.array(vals[:624], dtype=np.uint32), vals[624], vals[625], vals[626]))


def _max_op():
    from mpi4py import MPI
    return MPI.MAX


class ExtraState:
    """RNG states (torch's default CPU generator, numpy's global RNG, Python's `random`), a step
    counter and a small JSON dict of values, as byte items in fixed-size buffers it owns.

    add_to(sd) adds references to its buffers: extra/rng/torch, extra/rng/numpy, extra/rng/python
    (bytes), extra/step (int64 [1]) and extra/values (JSON, zero-padded to `json_bytes`).
    capture(step, **values) fills them from the current state; call it right before each save (the
    StateDict needs no rebuilding). After a load, restore() sets the RNGs and returns the values
    with "step".

    When every rank draws the same random numbers (data order, as in docs/examples/python), the
    items are identical on all ranks and written once: the library keeps one replica of identical
    shards, so states that differ between ranks would silently come back as one rank's. Pass the
    mpi4py communicator as `comm` to have capture() check that they are identical (it raises
    ValueError on every rank otherwise; seed after building modules whose initialization draws from
    the RNG by local shapes). Ranks with RNG states of their own (dropout) use
    prefix=f"extra/rank{rank}/": such keys exist only for the saving world size, so a job with
    another size loads them with strict=False and re-seeds.
    """

    def __init__(self, prefix="extra/", json_bytes=4096, comm=None):
        self.prefix = prefix
        self.comm = comm
        self.torch_rng = np.zeros(_torch.get_rng_state().numel(), dtype=np.uint8)
        self.numpy_rng = np.zeros(_NP_RNG.size, dtype=np.uint8)
        self.python_rng = np.zeros(_PY_RNG.size, dtype=np.uint8)
        self.step_buf = np.zeros(1, dtype=np.int64)
        self.values_buf = np.zeros(json_bytes, dtype=np.uint8)

    def keys(self):
        p = self.prefix
        return [p + "rng/torch", p + "rng/numpy", p + "rng/python", p + "step", p + "values"]

    def add_to(self, sd):
        k = self.keys()
        sd.add_bytes(k[0], self.torch_rng)
        sd.add_bytes(k[1], self.numpy_rng)
        sd.add_bytes(k[2], self.python_rng)
        sd.add(k[3], self.step_buf)
        sd.add_bytes(k[4], self.values_buf)
        return k

    def capture(self, step=None, **values):
        """Snapshots the three RNGs, the step and `values` (JSON-serializable) into the buffers."""
        self.torch_rng[:] = _torch.get_rng_state().numpy()
        _pack_numpy_rng(self.numpy_rng)
        _pack_python_rng(self.python_rng)
        if step is not None:
            self.step_buf[0] = int(step)
        text = json.dumps(values, sort_keys=True).encode()
        if len(text) > self.values_buf.size:
            raise ValueError(f"ExtraState values take {len(text)} bytes as JSON, more than json_bytes="
                             f"{self.values_buf.size}")
        self.values_buf[:] = 0
        self.values_buf[:len(text)] = np.frombuffer(text, dtype=np.uint8)
        if self.comm is not None and self.comm.Get_size() > 1:
            mine = b"".join(b.tobytes() for b in (self.torch_rng, self.numpy_rng, self.python_rng, self.step_buf,
                                                   self.values_buf))
            differ = [r for r, other in enumerate(self.comm.allgather(mine)) if other != mine]
            if self.comm.allreduce(len(differ), op=_max_op()):
                raise ValueError(f"ExtraState '{self.prefix}': the RNG states, step or values differ between ranks, "
                                 "but its keys are replicated (one copy is saved); seed every rank alike, or use a "
                                 "per-rank prefix")

    @property
    def step(self):
        return int(self.step_buf[0])

    def values(self):
        raw = self.values_buf.tobytes().rstrip(b"\0")
        return json.loads(raw.decode()) if raw else {}

    def restore(self):
        """Sets torch's, numpy's and Python's RNG from the buffers (after a load); returns the
        captured values plus "step"."""
        _torch.set_rng_state(_torch.from_numpy(self.torch_rng.copy()))
        _unpack_numpy_rng(self.numpy_rng)
        _unpack_python_rng(self.python_rng)
        out = self.values()
        out["step"] = self.step
        return out
