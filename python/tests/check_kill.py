"""A rank killed mid-training: `python3 python/tests/check_kill.py` starts 4 ranks of itself
(env:// rendezvous, as torchrun would, but without torchrun's agent, which would stop the
others the moment one dies); rank 3 SIGKILLs itself in the middle of an allreduce loop, and
every other rank's Python must raise an exception that names rank 3 as dead. Each survivor
prints how long after the kill its exception came (measured, not asserted). Exit 0 when all
three did."""
import os
import signal
import socket
import subprocess
import sys
import time

WORLD, VICTIM = 4, 3


def worker():
    import torch
    import torch.distributed as dist

    import bcl.torch  # noqa: F401

    dist.init_process_group("bcl")
    rank = dist.get_rank()
    t = torch.ones(1 << 14)
    for step in range(100000):
        if rank == VICTIM and step == 50:
            with open(os.environ["KILL_TIME_FILE"], "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
        except Exception as e:  # what a training loop would catch
            killed = float(open(os.environ["KILL_TIME_FILE"]).read())
            text = str(e)
            print(f"rank {rank} caught {(time.time() - killed) * 1e3:.0f} ms after the kill: {text}")
            ok = f"rank {VICTIM} (" in text and "died" in text
            sys.exit(0 if ok else 5)
        t.fill_(1.0)
    sys.exit(6)


def launch():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    kill_file = f"/tmp/bcl-kill-{os.getpid()}"
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), KILL_TIME_FILE=kill_file,
                   BCL_KILL_WORKER="1")
        procs.append(subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    failed = False
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            print(f"rank {r} hung:\n{out}")
            failed = True
            continue
        if r == VICTIM:
            continue
        line = next((l for l in out.splitlines() if l.startswith(f"rank {r} caught")), None)
        print(line or f"rank {r}: no exception line (exit {p.returncode}):\n{out[-2000:]}")
        failed |= p.returncode != 0 or line is None
    if os.path.exists(kill_file):
        os.remove(kill_file)
    sys.exit(1 if failed else 0)


if os.environ.get("BCL_KILL_WORKER"):
    worker()
else:
    launch()
