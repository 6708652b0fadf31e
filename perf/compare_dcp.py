#!/usr/bin/env python3
"""h5ckpt (through the Python binding) side by side with PyTorch Distributed Checkpoint (DCP).

    mpirun -np 4 /usr/bin/python3 perf/compare_dcp.py --dir /tmp/dcp-bench --mib 1024

The same model state on the same ranks and storage: `--tensors` float32 matrices, `--mib` MiB in all.
With torch 2.x each is a DTensor on a (tp, dp) DeviceMesh (`--tp`, default 2 when the ranks are
even), its columns sharded over tp and its rows over dp, saved and loaded with
torch.distributed.checkpoint.save / load (and async_save where it exists). With torch 1.13 (no
DTensor checkpointing) each is a ShardedTensor chunked by rows over the ranks (1.13's DCP saves the
shards of ShardedTensors from every rank; plain tensors only from the coordinator). h5ckpt gets the
very same local shard memory (`ShardSpec.box_of` of each rank's box). Timed, each as the slowest rank:

  floor write   every rank writes its bytes with one write() + fsync into its own file
  floor read    and reads them back with one read() (page cache dropped first, when root)
  save          DCP save_state_dict(FileSystemWriter, fsync)  |  h5ckpt Checkpointer.save (fsync)
                (and h5ckpt save_async: the blocking part, then the wait)
  load          same layout: DCP load_state_dict into the same ChunkShardingSpec  |  h5ckpt load
  load other    another layout (torch 1.13: chunked by columns instead of rows; torch 2.x: the two
                mesh dimensions' placements swapped), so each rank's part overlaps several saved
                parts (resharding), with the bytes the ranks read
                (the kernel's rchar counter of every rank, summed); h5ckpt also with two-phase
                reads (LoadOptions.aggregate_reads)

Every load is checked element by element against the saved values. The run prints one JSON line:
times, bytes, and each time as a ratio to the floor of the same run (save/write floor, load/read
floor). torch.distributed runs the gloo backend; mpirun only starts the ranks (rank and size come
from mpi4py). A perf script, not a test: the 2-core development VM is noisy; compare ratios
within one run.
"""
import argparse
import json
import os
import shutil
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import h5ckpt

W = MPI.COMM_WORLD
R, N = W.Get_rank(), W.Get_size()


def import_dcp_on_python_311():
    """Debian 12 pairs torch 1.13 with Python 3.11, whose dataclasses refuse the unhashable default
    `tensor_properties=TensorProperties()` in torch/distributed/_shard/sharded_tensor/metadata.py
    ("mutable default ... use default_factory"; fixed in torch 2.0), so torch.distributed._shard
    does not import at all. This makes that one default's class hashable by identity while the
    module is imported; DCP's code is not changed."""
    import dataclasses
    orig = dataclasses._get_field

    def get_field(cls, name, *rest):
        try:
            return orig(cls, name, *rest)
        except ValueError as e:
            d = cls.__dict__.get(name)
            if "mutable default" not in str(e) or not isinstance(d, dataclasses.Field) \
                    or not type(d.default).__module__.startswith("torch.distributed._shard"):
                raise
            type(d.default).__hash__ = object.__hash__
            return orig(cls, name, *rest)

    dataclasses._get_field = get_field
    try:
        from torch.distributed._shard import sharded_tensor
        from torch.distributed._shard.sharding_spec import ChunkShardingSpec
        import torch.distributed._shard.checkpoint as dcp
    finally:
        dataclasses._get_field = orig
    return sharded_tensor, ChunkShardingSpec, dcp


def dtensor_api():
    """torch 2.x: (init_device_mesh, DTensor, Shard, dcp) when DTensor and dcp.save/load exist;
    None on torch 1.x, which takes the ShardedTensor path."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.tensor import DTensor, Shard
        except ImportError:  # torch 2.0-2.3
            from torch.distributed._tensor import DTensor, Shard
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return None
    if not (hasattr(dcp, "save") and hasattr(dcp, "load")):
        return None
    return init_device_mesh, DTensor, Shard, dcp


class ShardedTensorLayouts:
    """torch 1.13: ShardedTensors chunked by rows ("save") or by columns ("other") over the ranks."""

    def __init__(self, shape):
        self.sharded_tensor, ChunkShardingSpec, self.dcp = import_dcp_on_python_311()
        placements = [f"rank:{r}/cpu" for r in range(N)]
        self.specs = {"save": ChunkShardingSpec(dim=0, placements=placements),
                      "other": ChunkShardingSpec(dim=1, placements=placements)}
        self.shape = shape
        self.name = "ShardedTensor rows/columns"

    def make(self, which, names):
        return {k: self.sharded_tensor.empty(self.specs[which], *self.shape) for k in names}

    def local(self, st):
        shard = st.local_shards()[0]
        return shard.tensor, h5ckpt.ShardSpec.box_of(list(shard.metadata.shard_offsets),
                                                     list(shard.metadata.shard_sizes))

    def save(self, state, path, single_file_per_rank):
        writer = self.dcp.FileSystemWriter(path, single_file_per_rank=single_file_per_rank, sync_files=True)
        self.dcp.save_state_dict(state, writer)

    def load(self, state, path):
        self.dcp.load_state_dict(state, self.dcp.FileSystemReader(path))

    async_save = None


class DTensorLayouts:
    """torch 2.x: DTensors on a (tp, dp) mesh; "save" shards columns over tp and rows over dp (a
    column-parallel weight under data-parallel sharding), "other" swaps the two."""

    async_save = None  # torch 2.2 has dcp.save/load but no async_save (added in 2.3)

    def __init__(self, shape, tp, api):
        init_device_mesh, self.DTensor, Shard, self.dcp = api
        if N % tp:
            raise SystemExit(f"--tp {tp} does not divide {N} ranks")
        self.tp, self.dp = tp, N // tp
        self.mesh = init_device_mesh("cpu", (self.tp, self.dp), mesh_dim_names=("tp", "dp"))
        self.coord = list(self.mesh.get_coordinate())
        self.placements = {"save": [Shard(1), Shard(0)], "other": [Shard(0), Shard(1)]}
        self.shape = shape
        self.name = f"DTensor (tp {self.tp}, dp {self.dp}) mesh"
        self.locals = {}  # id(DTensor) -> (local tensor, box)
        if hasattr(self.dcp, "async_save"):
            self.async_save = self._async_save

    def box(self, which):
        """This rank's box: each tensor dim sharded by the mesh dim whose placement names it, in
        torch.chunk's way (ceil-sized chunks, the last ones shorter or empty)."""
        off, size = [0, 0], list(self.shape)
        for mesh_dim, p in enumerate(self.placements[which]):
            d, k, c = p.dim, self.mesh.size(mesh_dim), self.coord[mesh_dim]
            n = self.shape[d]
            cs = -(-n // k)
            off[d] = min(n, c * cs)
            size[d] = max(0, min(n, off[d] + cs) - off[d])
        return off, size

    def make(self, which, names):
        off, size = self.box(which)
        out = {}
        for k in names:
            t = torch.empty(size, dtype=torch.float32)
            try:
                dt = self.DTensor.from_local(t, self.mesh, self.placements[which], run_check=False,
                                             shape=torch.Size(self.shape), stride=(self.shape[1], 1))
            except TypeError:  # from_local without shape/stride (even splits only)
                dt = self.DTensor.from_local(t, self.mesh, self.placements[which], run_check=False)
            self.locals[id(dt)] = (dt.to_local(), h5ckpt.ShardSpec.box_of(off, size))
            out[k] = dt
        return out

    def local(self, dt):
        return self.locals[id(dt)]

    def save(self, state, path, single_file_per_rank):
        writer = self.dcp.FileSystemWriter(path, single_file_per_rank=single_file_per_rank, sync_files=True)
        self.dcp.save(state, storage_writer=writer)

    def _async_save(self, state, path, single_file_per_rank):
        writer = self.dcp.FileSystemWriter(path, single_file_per_rank=single_file_per_rank, sync_files=True)
        return self.dcp.async_save(state, storage_writer=writer)

    def load(self, state, path):
        self.dcp.load(state, storage_reader=self.dcp.FileSystemReader(path))


def args_():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="directory on the storage to measure (emptied first)")
    ap.add_argument("--mib", type=int, default=1024, help="state size in MiB (all ranks)")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--single-file-per-rank", action="store_true", help="DCP FileSystemWriter option")
    ap.add_argument("--tp", type=int, default=0,
                    help="torch 2.x: tp size of the (tp, dp) mesh (default: 2 when the ranks are even, else 1)")
    ap.add_argument("--sharded-tensor", action="store_true",
                    help="use torch 1.13's ShardedTensor path even where DTensor exists")
    return ap.parse_args()


def rchar():
    with open("/proc/self/io") as f:
        vals = dict(line.split(": ") for line in f.read().splitlines())
    return int(vals["rchar"]), int(vals["read_bytes"])


def drop_caches():
    """Cold reads: flush and drop the page cache (root only; otherwise the reads are warm)."""
    ok = 0
    if R == 0:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            ok = 1
        except OSError:
            ok = 0
    return W.bcast(ok, root=0)


def timed(fn):
    """Runs fn on every rank between barriers; returns (slowest rank's seconds, fn's result)."""
    W.Barrier()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    return W.allreduce(dt, op=MPI.MAX), out


def main():
    a = args_()
    torch.set_num_threads(1)

    if R == 0:
        shutil.rmtree(a.dir, ignore_errors=True)
        os.makedirs(a.dir)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
    else:
        port = None
    port = W.bcast(port, root=0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the GPU machine has no network: gloo over loopback
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=R, world_size=N)

    per_tensor = a.mib * (1 << 20) // a.tensors // 4  # float32 elements
    cols = 1024
    rows = max(N, per_tensor // cols // N * N)
    shape = [rows, cols]
    total = a.tensors * rows * cols * 4
    api = None if a.sharded_tensor else dtensor_api()
    if api:
        layouts = DTensorLayouts(shape, a.tp or (2 if N % 2 == 0 else 1), api)
    else:
        layouts = ShardedTensorLayouts(shape)
    names = [f"layer{i}.weight" for i in range(a.tensors)]
    by_rows, by_cols = "save", "other"

    def make(which):
        return layouts.make(which, names)

    local = layouts.local

    def expected(i, spec):  # the saved value of tensor i over a box: a formula of row and column
        r0, c0 = spec.box.offset
        nr, nc = spec.box.shape
        rr = torch.arange(r0, r0 + nr, dtype=torch.float32)[:, None]
        cc = torch.arange(c0, c0 + nc, dtype=torch.float32)[None, :]
        return rr * 1024.0 + cc + i * 0.5

    state = make(by_rows)
    for i, (k, st) in enumerate(state.items()):
        t, box = local(st)
        t.copy_(expected(i, box))

    def to_h5(sd_torch):
        sd = h5ckpt.StateDict()
        for k, st in sd_torch.items():
            t, box = local(st)
            sd.add("model/" + k, t, shape, box)
        return sd

    def verify(sd_torch, what):
        bad = 0
        for i, (k, st) in enumerate(sd_torch.items()):
            t, box = local(st)
            bad += int(not torch.equal(t, expected(i, box)))
        bad = W.allreduce(bad)
        if bad:
            raise SystemExit(f"{what}: {bad} tensor parts differ from the saved values")

    def wipe(sd_torch):
        for st in sd_torch.values():
            local(st)[0].fill_(-1.0)  # also touches the memory before the timed phase

    # ---- the floor: one write + fsync per rank, one read back ----
    mine = torch.cat([local(st)[0].reshape(-1) for st in state.values()]).numpy()
    back = np.empty_like(mine)
    floor_file = os.path.join(a.dir, f"floor.{R}")

    def floor_write():
        fd = os.open(floor_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        view = memoryview(mine).cast("B")
        off = 0
        while off < len(view):
            off += os.write(fd, view[off:])
        os.fsync(fd)
        os.close(fd)

    def floor_read():
        fd = os.open(floor_file, os.O_RDONLY)
        view = memoryview(back).cast("B")
        off = 0
        while off < len(view):
            n = os.readv(fd, [view[off:]])
            if n <= 0:
                break
            off += n
        os.close(fd)

    res = {"ranks": N, "tensors": a.tensors, "shape": shape, "bytes": total, "machine": socket.gethostname(),
           "torch": torch.__version__, "h5ckpt": h5ckpt.version(), "layout": layouts.name}
    back.fill(0)
    res["floor_write_s"], _ = timed(floor_write)
    cold = drop_caches()
    res["cold_reads"] = bool(cold)
    res["floor_read_s"], _ = timed(floor_read)
    if W.allreduce(int(not np.array_equal(back, mine))):
        raise SystemExit("floor read-back differs")
    res["floor_read_bytes"] = total

    # ---- DCP ----
    dcp_dir = os.path.join(a.dir, "dcp")
    res["dcp_save_s"], _ = timed(lambda: layouts.save(state, dcp_dir, a.single_file_per_rank))
    if layouts.async_save:  # torch 2.x: the blocking part of DCP's async_save, then the wait
        t_block, fut = timed(lambda: layouts.async_save(state, os.path.join(a.dir, "dcp-async"),
                                                        a.single_file_per_rank))
        t_wait, _ = timed(fut.result)
        res["dcp_save_async_blocking_s"] = t_block
        res["dcp_save_async_total_s"] = t_block + t_wait

    def load_dcp(target):
        r0 = rchar()
        layouts.load(target, dcp_dir)
        r1 = rchar()
        return r1[0] - r0[0], r1[1] - r0[1]

    same = make(by_rows)
    wipe(same)
    drop_caches()
    res["dcp_load_s"], (rc, rb) = timed(lambda: load_dcp(same))
    verify(same, "DCP load")
    res["dcp_load_bytes_read"] = W.allreduce(rc)
    other = make(by_cols)
    wipe(other)
    drop_caches()
    res["dcp_load_other_s"], (rc, rb) = timed(lambda: load_dcp(other))
    verify(other, "DCP load into columns")
    res["dcp_load_other_bytes_read"] = W.allreduce(rc)
    res["dcp_load_other_disk_bytes"] = W.allreduce(rb)

    # ---- h5ckpt through the binding ----
    topo = h5ckpt.Topology.create(W, dp=N)
    ck = h5ckpt.Checkpointer(topo, metrics=False)
    sd_save = to_h5(state)
    res["h5ckpt_save_s"], rep = timed(lambda: ck.save(sd_save, os.path.join(a.dir, "h5-sync")))
    res["h5ckpt_bytes_written"] = W.allreduce(rep.bytes_written)
    # The staging pool is allocated by the first save_async: one untimed save sizes it, then its pages
    # are touched again (this VM hands idle memory back to the host) before the timed one.
    ck.save_async(sd_save, os.path.join(a.dir, "h5-async-warmup")).wait()
    ck.touch_staging()
    t_block, handle = timed(lambda: ck.save_async(sd_save, os.path.join(a.dir, "h5-async")))
    t_wait, _ = timed(handle.wait)
    res["h5ckpt_save_async_blocking_s"] = t_block
    res["h5ckpt_save_async_total_s"] = t_block + t_wait

    def load_h5(target_torch, sd, **opts):
        r0 = rchar()
        rep = ck.load(sd, os.path.join(a.dir, "h5-sync"), **opts)
        r1 = rchar()
        return r1[0] - r0[0], r1[1] - r0[1], rep.bytes_read

    same = make(by_rows)
    sd_same = to_h5(same)
    wipe(same)
    drop_caches()
    res["h5ckpt_load_s"], (rc, rb, br) = timed(lambda: load_h5(same, sd_same))
    verify(same, "h5ckpt load")
    res["h5ckpt_load_bytes_read"] = W.allreduce(rc)
    other = make(by_cols)
    sd_other = to_h5(other)
    wipe(other)
    drop_caches()
    res["h5ckpt_load_other_s"], (rc, rb, br) = timed(lambda: load_h5(other, sd_other))
    verify(other, "h5ckpt load into columns")
    res["h5ckpt_load_other_bytes_read"] = W.allreduce(rc)
    res["h5ckpt_load_other_disk_bytes"] = W.allreduce(rb)
    res["h5ckpt_load_other_report_bytes_read"] = W.allreduce(br)
    # Two-phase reads (LoadOptions.aggregate_reads): every byte read once, pieces sent over MPI.
    wipe(other)
    drop_caches()
    res["h5ckpt_load_other_aggregated_s"], (rc, rb, br) = timed(lambda: load_h5(other, sd_other, aggregate_reads=True))
    verify(other, "h5ckpt aggregated load into columns")
    res["h5ckpt_load_other_aggregated_bytes_read"] = W.allreduce(rc)
    ck.close()
    topo.close()

    fw, fr = res["floor_write_s"], res["floor_read_s"]
    res["ratios"] = {
        "h5ckpt_save_over_dcp_save": res["h5ckpt_save_s"] / res["dcp_save_s"],
        "h5ckpt_load_over_dcp_load": res["h5ckpt_load_s"] / res["dcp_load_s"],
        "h5ckpt_load_other_over_dcp_load_other": res["h5ckpt_load_other_s"] / res["dcp_load_other_s"],
        "dcp_save": res["dcp_save_s"] / fw,
        "h5ckpt_save": res["h5ckpt_save_s"] / fw,
        "h5ckpt_save_async_blocking": res["h5ckpt_save_async_blocking_s"] / fw,
        "dcp_load": res["dcp_load_s"] / fr,
        "h5ckpt_load": res["h5ckpt_load_s"] / fr,
        "dcp_load_other": res["dcp_load_other_s"] / fr,
        "h5ckpt_load_other": res["h5ckpt_load_other_s"] / fr,
        "h5ckpt_load_other_aggregated": res["h5ckpt_load_other_aggregated_s"] / fr,
        "dcp_load_other_bytes": res["dcp_load_other_bytes_read"] / total,
        "h5ckpt_load_other_bytes": res["h5ckpt_load_other_bytes_read"] / total,
        "h5ckpt_load_other_aggregated_bytes": res["h5ckpt_load_other_aggregated_bytes_read"] / total,
    }
    if "dcp_save_async_blocking_s" in res:
        res["ratios"]["h5ckpt_async_blocking_over_dcp_async_blocking"] = \
            res["h5ckpt_save_async_blocking_s"] / res["dcp_save_async_blocking_s"]
    dist.barrier()
    dist.destroy_process_group()
    if R == 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # a failure on any rank ends the job
        if isinstance(e, SystemExit) and e.code in (None, 0):
            raise
        import traceback
        sys.stderr.write(f"rank {R}: {traceback.format_exc()}")
        sys.stderr.flush()
        W.Abort(1)
