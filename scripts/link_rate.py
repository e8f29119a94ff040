#!/usr/bin/env python3
"""The rate of the link between two GPUs through NCCL, moved as the trainer moves its gradients
and parameters: each rank sends N bytes to the other and receives N at the same time (point to
point). Prints the median over repeats, in GB/s each way.

    torchrun --standalone --nproc_per_node 2 scripts/link_rate.py [--mb 256] [--repeats 7]

NCCL picks the transport: NVLink or PCIe by default, host shared memory with NCCL_P2P_DISABLE=1,
sockets with NCCL_SHM_DISABLE=1 as well.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="MiB each rank sends")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    if dist.get_world_size() != 2:
        raise SystemExit("link_rate.py: run it on 2 GPUs (torchrun --nproc_per_node 2)")
    send = torch.randn(args.mb * 2**20 // 4, device="cuda")
    recv = torch.empty_like(send)

    def exchange():
        ops = [dist.P2POp(dist.isend, send, 1 - rank), dist.P2POp(dist.irecv, recv, 1 - rank)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        torch.cuda.synchronize()

    exchange()  # NCCL's connection is set up on first use
    seconds = []
    for _ in range(args.repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        exchange()
        seconds.append(time.perf_counter() - start)
    median = sorted(seconds)[len(seconds) // 2]
    nbytes = send.numel() * 4
    if rank == 0:
        print(f"RESULT link_gb_s={nbytes / median / 1e9:.2f} bytes={nbytes} ms={median * 1e3:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
