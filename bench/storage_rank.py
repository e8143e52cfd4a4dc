"""One rank of `bench.storage` (run by torchrun on an emulated host): save or load a GPT-sized
DTensor state through the host's tenplex store, or through files on a storage host over HTTP.

    storage_rank.py {save,load} {store,storage} --out FILE [--store SOCKET | --url URL --dir DIR]

save: the state as tp shards (Shard(0) of every matrix) on a mesh of WORLD_SIZE; load: replicated
on every rank (dp). Writes {"seconds": {...}, "bytes": {...}} of this rank to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

SHAPES = {"emb": (256, 512), "head": (256, 512)} | {f"blocks.{i}.{n}": s for i in range(4) for n, s in
          (("qkv", (1536, 512)), ("o", (512, 512)), ("up", (2048, 512)), ("down", (512, 2048)))}  # fmt: skip


def state(placement, zero: bool) -> dict:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, shape in SHAPES.items():
        for kind in ("w", "exp_avg", "exp_avg_sq"):  # a parameter and its two Adam moments
            t = torch.zeros(shape) if zero else torch.randn(shape, generator=g)
            out[f"{kind}.{name}"] = distribute_tensor(t, mesh, [placement])
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=["save", "load"])
    p.add_argument("path", choices=["store", "storage"])
    p.add_argument("--out", required=True)
    p.add_argument("--store")
    p.add_argument("--url")
    p.add_argument("--dir")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, seconds, moved = dist.get_rank(), {}, {}
    if a.op == "save":
        sd = state(Shard(0), zero=False)
        dist.barrier()
        t0 = time.perf_counter()
        if a.path == "store":
            from tenplex.frameworks.dcp.storage import StoreWriter, complete_save

            md = dcp.save(sd, storage_writer=StoreWriter(a.store, job="bench", tag="saved"))
            if os.environ.get("LOCAL_RANK", "0") == "0":
                complete_save(a.store, "bench", "saved", md)
        else:
            local = Path(a.dir)
            dcp.save(sd, checkpoint_id=str(local))
            seconds["write"] = time.perf_counter() - t0
            mine = [f for f in local.iterdir() if f.name == f"__{rank}_0.distcp" or (rank == 0 and f.name == ".metadata")]
            for f in mine:  # to the storage host, over this host's link
                data = f.read_bytes()
                urllib.request.urlopen(urllib.request.Request(f"{a.url}/{f.name}", data=data, method="PUT")).read()
                moved[f"upload {f.name}"] = len(data)
        dist.barrier()
        seconds["save"] = time.perf_counter() - t0
    else:
        sd = state(Replicate(), zero=True)
        dist.barrier()
        t0 = time.perf_counter()
        if a.path == "store":
            from tenplex.frameworks.dcp.storage import StoreReader

            dcp.load(sd, storage_reader=StoreReader(a.store, job="bench", tag="state"))
        else:
            local = Path(a.dir)
            local.mkdir(parents=True, exist_ok=True)
            names = json.loads(urllib.request.urlopen(f"{a.url}/").read())
            for name in names:  # DCP's load-time reshard reads every chunk it needs: here, all of them
                data = urllib.request.urlopen(f"{a.url}/{name}").read()
                (local / name).write_bytes(data)
                moved[f"download {name}"] = len(data)
            seconds["fetch"] = time.perf_counter() - t0
            dcp.load(sd, checkpoint_id=str(local))
        dist.barrier()
        seconds["load"] = time.perf_counter() - t0
        ref = state(Shard(0), zero=False)
        assert all(torch.equal(sd[k].full_tensor(), ref[k].full_tensor()) for k in sd), "loaded state differs"
    Path(a.out).write_text(json.dumps({"rank": rank, "seconds": seconds, "bytes": moved}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
