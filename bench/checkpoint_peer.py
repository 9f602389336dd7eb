#!/usr/bin/env python3
"""The PyTorch peer of checkpoint_bench (one process): the same 24 f32 matrices (about --mib MiB)
saved with torch.save (then fsync) and with torch.distributed.checkpoint (DCP, one rank), and
loaded back, printing a row like checkpoint_bench's."""
import argparse
import os
import shutil
import tempfile
import time

import torch
import torch.distributed.checkpoint as dcp


def fsync_tree(path):
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    a = ap.parse_args()
    rows = a.mib * (1 << 20) // 4 // 1024 // 24
    state = {f"model.t{i}": torch.full((rows, 1024), float(i)) for i in range(24)}
    d = tempfile.mkdtemp(prefix="torch_ckpt_bench_")
    t0 = time.perf_counter()
    torch.save(state, os.path.join(d, "model.pt"))
    fsync_tree(d)
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = torch.load(os.path.join(d, "model.pt"))
    load_s = time.perf_counter() - t0
    assert back["model.t5"][0, 0].item() == 5.0
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=os.path.join(d, "dcp"))
    fsync_tree(os.path.join(d, "dcp"))
    dcp_save_s = time.perf_counter() - t0
    dest = {k: torch.zeros_like(v) for k, v in state.items()}
    t0 = time.perf_counter()
    dcp.load(dest, checkpoint_id=os.path.join(d, "dcp"))
    dcp_load_s = time.perf_counter() - t0
    assert dest["model.t5"][0, 0].item() == 5.0
    shutil.rmtree(d)
    print(f"| torch.save / torch.load | {a.mib} | {save_s:.2f} ({a.mib / save_s:.0f} MiB/s) | "
          f"{load_s:.2f} ({a.mib / load_s:.0f} MiB/s) |")
    print(f"| torch DCP save / load (1 rank) | {a.mib} | {dcp_save_s:.2f} ({a.mib / dcp_save_s:.0f} MiB/s) | "
          f"{dcp_load_s:.2f} ({a.mib / dcp_load_s:.0f} MiB/s) |")


if __name__ == "__main__":
    main()
