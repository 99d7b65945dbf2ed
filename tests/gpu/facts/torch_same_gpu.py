"""Two processes, one GPU, torch.distributed's "nccl" backend: does the
installed NCCL accept two ranks on cuda:0, and what does torch report?
Run as: python3 torch_same_gpu.py (it spawns its own two ranks)."""
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda:0"))
        t = torch.full((1024,), float(rank + 1), device="cuda:0")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print(f"rank {rank}: all_reduce on cuda:0 gave {t[0].item()} (want 3.0)", flush=True)
        dist.destroy_process_group()
    except Exception as e:  # the fact is the error, whatever it is
        print(f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        traceback.print_exc(limit=2)
        sys.exit(1)


if __name__ == "__main__":
    mp.start_processes(rank_main, args=(29511,), nprocs=2, start_method="spawn", join=True)
