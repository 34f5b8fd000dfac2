"""Exit-clean gate proof on a GPU machine (issue 7): one NCCL process group, world size 1,
one all_reduce. `test_dirty` leaves the group alive at exit (PyTorch >= 2.4 then warns
"destroy_process_group() was not called" from ProcessGroupNCCL's destructor, after the
test returned): the gate must fail. `test_clean` ends with barrier + destroy: it must pass.

    cargo xtask verify --python python3 --level tests,exit-clean \
        --test crates/verify/gpu/pg_exit.py:test_dirty --test crates/verify/gpu/pg_exit.py:test_clean
"""
import os

import torch
import torch.distributed as dist


def _allreduce(port):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    assert t.sum().item() == 4.0, t


def test_dirty():
    _allreduce(29531)


def test_clean():
    _allreduce(29532)
    dist.barrier()
    dist.destroy_process_group()
