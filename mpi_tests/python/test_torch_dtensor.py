#!/usr/bin/env python3
"""h5ckpt.torch with DTensor state dicts, under mpirun.

Everywhere (torch 1.13 included): ht.dtensor_box against boxes worked out by hand (uneven chunks as
torch.chunk cuts them, empty shards, 2-D meshes, Shard on the same dimension twice, negative dims),
refusals of _StridedShard and Partial; and add_state_dict on stand-in DTensors (objects with the
attributes h5ckpt reads: shape, placements, device_mesh, to_local) saved on a 2-D mesh and loaded on
another, checked element by element against the formula, with the stored global tensors read back
through CheckpointReader.

Where torch.distributed.tensor exists (torch >= 2.4; the GPU machine): real DTensors made with
DTensor.from_local on a gloo process group, placements' boxes cross-checked against torch's own
compute_local_shape_and_global_offset at every coordinate, a model sharded on a 2-D mesh saved and
loaded into DTensors of another mesh, on CPU and (when CUDA is available) CUDA local tensors.
With older torch the second part prints one "skip" line naming the version.
A failure on any rank aborts the job (non-zero exit).
"""
import os
import shutil
import socket
import sys

import numpy as np
import torch
from mpi4py import MPI

import h5ckpt
import h5ckpt.torch as ht
from mpi_checks import check, eq, run

W = MPI.COMM_WORLD
R, N = W.Get_rank(), W.Get_size()
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h5ckpt-dtensor-test")
torch.set_num_threads(1)
S, REP = ("shard", 0), ("replicate",)


def sh(d):
    return ("shard", d)


# ---- the placement -> box mapping, against hand-computed boxes ---------------------------------------

def test_boxes_by_hand():
    B = ht.dtensor_box
    # 10 rows over 4: torch.chunk gives 3, 3, 3, 1.
    check([B([10, 4], [4], [c], [S]) for c in range(4)] ==
          [([0, 0], [3, 4]), ([3, 0], [3, 4]), ([6, 0], [3, 4]), ([9, 0], [1, 4])], "10 over 4")
    # 5 rows over 4: 2, 2, 1, 0 (the last shard is empty, placed at the end).
    check([B([5, 3], [4], [c], [S]) for c in range(4)] ==
          [([0, 0], [2, 3]), ([2, 0], [2, 3]), ([4, 0], [1, 3]), ([5, 0], [0, 3])], "5 over 4")
    # 2-D mesh (2, 3), Shard(0) x Shard(1) of [7, 8]: rows 4|3, columns 3|3|2.
    rows = {0: (0, 4), 1: (4, 3)}
    cols = {0: (0, 3), 1: (3, 3), 2: (6, 2)}
    for a in range(2):
        for b in range(3):
            want = ([rows[a][0], cols[b][0]], [rows[a][1], cols[b][1]])
            check(B([7, 8], [2, 3], [a, b], [S, sh(1)]) == want, f"(S0,S1) at {a},{b}")
    # Replicate on the first mesh dimension: the coordinate there does not matter.
    check(B([6, 5], [2, 2], [1, 1], [REP, sh(1)]) == ([0, 3], [6, 2]), "(R,S1)")
    check(B([6, 5], [2, 2], [0, 1], [REP, sh(-1)]) == ([0, 3], [6, 2]), "negative dim")
    # Shard(0) twice on mesh (2, 2) of 7 rows: 4|3, then 2|2 of the first and 2|1 of the second.
    want = {(0, 0): (0, 2), (0, 1): (2, 2), (1, 0): (4, 2), (1, 1): (6, 1)}
    for (a, b), (o, n) in want.items():
        check(B([7, 3], [2, 2], [a, b], [S, S]) == ([o, 0], [n, 3]), f"(S0,S0) at {a},{b}")
    # Fully replicated, and a 3-D mesh.
    check(B([4], [2, 2], [1, 0], [REP, REP]) == ([0], [4]), "replicated")
    check(B([9, 4, 5], [3, 1, 2], [2, 0, 1], [S, REP, sh(2)]) == ([6, 0, 3], [3, 4, 2]), "3-D mesh")


def test_refusals():
    class _StridedShard:  # stand-ins named like torch's classes
        dim = 0

    class Partial:
        pass

    for p, what in ((_StridedShard(), "_StridedShard"), (Partial(), "Partial")):
        try:
            ht.dtensor_box([4, 4], [2], [0], [p])
            raise AssertionError(f"{what} accepted")
        except NotImplementedError as e:
            check(what in str(e), str(e))
    for args in (([4], [2], [2], [S]), ([4], [2], [0], [sh(1)]), ([4], [2, 2], [0], [S])):
        try:
            ht.dtensor_box(*args)
            raise AssertionError(f"{args} accepted")
        except ValueError:
            pass


# ---- stand-in DTensors (any torch) -------------------------------------------------------------------

class FakeMesh:
    def __init__(self, shape, coord):
        self.mesh = torch.zeros(shape)
        self._coord = coord

    def get_coordinate(self):
        return self._coord


class DTensor:  # the name add_state_dict recognizes, with the attributes it reads
    def __init__(self, local, global_shape, mesh, placements):
        self._local, self.shape, self.device_mesh, self.placements = local, torch.Size(global_shape), mesh, placements

    def to_local(self):
        return self._local


def mesh_coord(shape):
    """This rank's coordinate in a row-major mesh of `shape` over all ranks."""
    coord, r = [], R
    for d in reversed(shape):
        coord.append(r % d)
        r //= d
    return list(reversed(coord))


def formula(shape, k):
    n = int(np.prod(shape))
    return (torch.arange(n, dtype=torch.float32) * 0.5 + 1000 * k).reshape(shape)


# Global tensors and their placements on the saving (A) and loading (B) meshes.
A_MESH = [2, N // 2] if N % 2 == 0 else [N, 1]
B_MESH = [1, N] if N > 1 else [1, 1]
TENSORS = {  # key: (global shape, placements on A, placements on B)
    "model/attn.qkv.weight": ([3 * N + 1, 6], [S, sh(1)], [REP, S]),
    "model/mlp.fc2.weight": ([5, 2 * N + 3], [REP, sh(1)], [REP, sh(0)]),
    "model/embed.weight": ([4 * N + 3, 4], [S, S], [S, REP]),
    "model/norm.bias": ([7], [REP, REP], [REP, S]),
    "model/tiny.bias": ([3], [S, S], [REP, S]),  # empty shards at 4 ranks on both meshes
    "optim/exp_avg/mlp.fc2.weight": ([5, 2 * N + 3], [S, REP], [REP, sh(1)]),  # FSDP2-like: Shard(0) over dp
}


def dstate(mesh_shape, which, fill=None, device="cpu", make=None):
    coord = mesh_coord(mesh_shape)
    out = {}
    for i, (key, (shape, pa, pb)) in enumerate(TENSORS.items()):
        pl = pa if which == "A" else pb
        offset, box = ht.dtensor_box(shape, mesh_shape, coord, pl)
        sl = tuple(slice(o, o + n) for o, n in zip(offset, box))
        local = formula(shape, i)[sl].contiguous() if fill is None else torch.full(box, fill)
        local = local.to(device)
        out[key] = make(local, shape, pl) if make else DTensor(local, shape, FakeMesh(mesh_shape, coord), pl)
    return out


def check_state(st, mesh_shape, which, what, box_of=None):
    coord = mesh_coord(mesh_shape)
    for i, (key, (shape, pa, pb)) in enumerate(TENSORS.items()):
        pl = pa if which == "A" else pb
        offset, box = (box_of or ht.dtensor_box)(shape, mesh_shape, coord, pl)
        sl = tuple(slice(o, o + n) for o, n in zip(offset, box))
        eq(st[key].to_local().cpu().numpy(), formula(shape, i)[sl].numpy(), f"{what}: {key}")


def save_and_reload(saved, load_into, tag):
    path = os.path.join(ROOT, tag)
    topo = h5ckpt.Topology.create(W, tp=1, dp=N, pp=1)
    ck = h5ckpt.Checkpointer(topo)
    sd = h5ckpt.StateDict()
    placements, other = ht.add_state_dict(sd, saved)
    check(other == {} and sorted(placements) == sorted(TENSORS), f"{tag}: keys {sorted(placements)}")
    ck.save(sd, path)
    # The stored global tensors, read back whole on rank 0, equal the formula element by element.
    if R == 0:
        reader = h5ckpt.CheckpointReader.open(path)
        for i, (key, (shape, _, _)) in enumerate(TENSORS.items()):
            eq(reader.read(key), formula(shape, i).numpy(), f"{tag}: stored {key}")
    W.Barrier()
    ld = h5ckpt.StateDict()
    ht.add_state_dict(ld, load_into)
    rep = ck.load(ld, path, strictness="raise_all")
    check(rep.missing_keys == [] and rep.unexpected_keys == [], repr(rep))
    ck.close()
    topo.close()


def test_standin_dtensors_reshard():
    saved = dstate(A_MESH, "A")
    target = dstate(B_MESH, "B", fill=-1.0)
    save_and_reload(saved, target, "standin")
    check_state(target, B_MESH, "B", "stand-in load on another mesh")


# ---- real DTensors (torch >= 2.4) ----------------------------------------------------------------------

def dtensor_api():
    try:
        from torch.distributed.tensor import DTensor as RealDTensor, Replicate, Shard  # noqa: F401
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: F401
        from torch.distributed.device_mesh import DeviceMesh  # noqa: F401
        return True
    except ImportError:
        return False


def init_torch_dist():
    import torch.distributed as dist
    if dist.is_initialized():
        return
    port = None
    if R == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = W.bcast(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # no network there: gloo over loopback
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=R, world_size=N)


def real(p):
    from torch.distributed.tensor import Replicate, Shard
    return Shard(p[1]) if p[0] == "shard" else Replicate()


def test_real_dtensors(device):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor as RealDTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    init_torch_dist()
    meshes = {"A": DeviceMesh(device, torch.arange(N).reshape(A_MESH)),
              "B": DeviceMesh(device, torch.arange(N).reshape(B_MESH))}

    def torch_box(shape, mesh_shape, coord, pl):  # torch's own answer, for the expected values
        mesh = meshes["A"] if list(mesh_shape) == A_MESH else meshes["B"]
        check(list(mesh.get_coordinate()) == coord, f"mesh coordinate {mesh.get_coordinate()} != {coord}")
        size, off = compute_local_shape_and_global_offset(shape, mesh, [real(p) for p in pl])
        return list(off), list(size)

    # ht.dtensor_box equals torch's mapping for every tensor and both meshes at this rank's coordinate.
    for which, mesh_shape in (("A", A_MESH), ("B", B_MESH)):
        coord = mesh_coord(mesh_shape)
        for key, (shape, pa, pb) in TENSORS.items():
            pl = pa if which == "A" else pb
            mine = ht.dtensor_box(shape, mesh_shape, coord, pl)
            theirs = torch_box(shape, mesh_shape, coord, pl)
            # An empty shard's offset is immaterial; torch may place it elsewhere.
            if 0 in mine[1]:
                check(mine[1] == theirs[1], f"{key} on {which}: {mine} vs torch {theirs}")
            else:
                check(mine == tuple(theirs), f"{key} on {which}: {mine} vs torch {theirs}")

    def make(which):
        def build(local, shape, pl):
            return RealDTensor.from_local(local, meshes[which], [real(p) for p in pl], run_check=False,
                                          shape=torch.Size(shape), stride=torch.empty(shape).stride())
        return build

    saved = dstate(A_MESH, "A", device=device, make=make("A"))
    for key, t in saved.items():
        check(t.to_local().device.type == device, f"{key}: local tensor on {t.to_local().device}")
    target = dstate(B_MESH, "B", fill=-1.0, device=device, make=make("B"))
    save_and_reload(saved, target, f"real_{device}")
    check_state(target, B_MESH, "B", f"real DTensors on {device}", box_of=torch_box)


def setup():
    if R == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
        os.makedirs(ROOT)
    W.Barrier()


tests = [("dtensor_box by hand", test_boxes_by_hand), ("refusals", test_refusals),
         ("stand-in DTensors, 2-D mesh -> another mesh", test_standin_dtensors_reshard)]
if dtensor_api():
    tests.append(("real DTensors on cpu", lambda: test_real_dtensors("cpu")))
    if torch.cuda.is_available():
        tests.append(("real DTensors on cuda", lambda: test_real_dtensors("cuda")))
    elif R == 0:
        print("skip real DTensors on cuda: torch.cuda.is_available() is False", flush=True)
elif R == 0:
    print(f"skip real DTensors: torch {torch.__version__} has no torch.distributed.tensor (needs >= 2.4)", flush=True)
run(W, tests, f"dtensor tests at {N} ranks (torch {torch.__version__}): all passed", before=setup)
if dtensor_api():
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
