#!/usr/bin/env python3
"""Recovery figures for the README and the life-cycle issue, from real processes and signals
(run by scripts/recovery-bench.sh, which builds bcl-recover first).

Per trial, 8 ranks of bcl-recover on this host (default transport: shm between them):
  kill     SIGKILL 1 of 8 in an allreduce loop -> the last survivor's first correct allreduce
           on the shrunk communicator (ms from the signal);
  stop     SIGSTOP 1 of 8 -> the same (it includes the hang timeout, BCL_HANG_TIMEOUT_MS);
  grow     after a kill, a fresh process joins: from its start to its first correct allreduce
           on 8 ranks;
  restart  what a job does today: 8 processes started, init, first allreduce (from the start
           to the last rank's first correct allreduce).
Then, in one job of 16 ranks, TRIALS times in alternating order: the 4 x 4 grid's row and
column communicators by split, and the same from scratch (an id per row and column, init
through their stores), each to its first checked allreduces (the slowest rank's time).
The kinds are interleaved trial by trial (this VM changes speed every 10-60 s). Prints the
median and worst of each, and the ratio restart+detection / kill recovery.
"""
import os, signal, statistics, subprocess, sys, tempfile, threading, time

BIN = sys.argv[1]
TRIALS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
WORLD = 8


def now_ms():
    return time.time() * 1000.0


def free_id():
    import socket, secrets
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"bcl://127.0.0.1:{port}/{secrets.token_hex(16)}"


class Rank:
    def __init__(self, rank, world, uid, env):
        e = dict(os.environ, BCL_RANK=str(rank), BCL_WORLD_SIZE=str(world), BCL_UNIQUE_ID=uid,
                 BCL_TIMEOUT_S="20", BCL_INIT_TIMEOUT_S="30", BCL_TEST_ELEMS="16384", **env)
        self.p = subprocess.Popen([BIN], env=e, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        self.lines = []
        self.ready = threading.Event()
        self.t = threading.Thread(target=self.read, daemon=True)
        self.t.start()

    def read(self):
        for line in self.p.stdout:
            self.lines.append((now_ms(), line.strip()))
            if line.strip() == "ready":
                self.ready.set()

    def field(self, start, key):
        for _, l in self.lines:
            if l.startswith(start):
                for w in l.split():
                    if w.startswith(key + "="):
                        return float(w.split("=", 1)[1])
        return None

    def finish(self, limit=60):
        try:
            self.p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.t.join(timeout=5)


def start(env=None, world=WORLD):
    uid = free_id()
    return [Rank(r, world, uid, env or {}) for r in range(world)]


def wait_ready(ranks):
    for r in ranks:
        if not r.ready.wait(60):
            raise RuntimeError("a rank did not start")


def fault(sig, victim=5):
    ranks = start()
    wait_ready(ranks)
    time.sleep(0.2)
    t0 = now_ms()
    ranks[victim].p.send_signal(sig)
    worst = 0.0
    for i, r in enumerate(ranks):
        if i == victim:
            continue
        r.finish()
        at = r.field("recovered", "at")
        if r.p.returncode != 0 or at is None:
            raise RuntimeError(f"rank {i} did not recover (exit {r.p.returncode})")
        worst = max(worst, at - t0)
    ranks[victim].p.kill()
    ranks[victim].finish()
    return worst


def grow():
    d = tempfile.mkdtemp(prefix="bcl-grow-")
    idf = os.path.join(d, "id")
    ranks = start({"BCL_RECOVER_GROW_TO": "8", "BCL_RECOVER_ID_FILE": idf})
    wait_ready(ranks)
    ranks[6].p.kill()
    t0 = now_ms()
    new = Rank(7, 8, "unused", {"BCL_RECOVER_MODE": "join", "BCL_RECOVER_ID_FILE": idf})
    new.finish()
    for i, r in enumerate(ranks):
        r.finish()
    at = new.field("grown", "at")
    if new.p.returncode != 0 or at is None:
        raise RuntimeError("the new rank did not join")
    return at - t0


def restart():
    t0 = now_ms()
    ranks = start({"BCL_RECOVER_AFTER": "0"})
    wait_ready(ranks)
    last = max(r.lines[0][0] for r in ranks)
    for r in ranks:
        r.p.kill()
        r.finish()
    return last - t0


def split_grid():
    uid = free_id()
    ranks = [Rank(r, 16, uid, {"BCL_RECOVER_MODE": "split", "BCL_RECOVER_TRIALS": str(TRIALS)})
             for r in range(16)]
    for r in ranks:
        r.finish(limit=60 + 10 * TRIALS)
    if any(r.p.returncode != 0 for r in ranks):
        raise RuntimeError("the split job failed: exits " + str([r.p.returncode for r in ranks]))
    rows = [l for _, l in ranks[0].lines if l.startswith("split trial=")]
    val = lambda l, k: float(l.split(k + "=")[1].split()[0])
    return [val(l, "split_ms") for l in rows], [val(l, "scratch_ms") for l in rows]


def main():
    kinds = {"kill": lambda: fault(signal.SIGKILL), "stop": lambda: fault(signal.SIGSTOP),
             "grow": grow, "restart": restart}
    got = {k: [] for k in kinds}
    for t in range(TRIALS):
        for k, f in kinds.items():
            got[k].append(f())
        print(f"trial {t + 1}/{TRIALS}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in got.items()),
              flush=True)
    print()
    print(f"| {WORLD} ranks, {TRIALS} trials | median ms | worst ms |")
    print("|---|---|---|")
    names = {"kill": "kill 1 -> first correct allreduce on 7", "stop": "stop 1 -> first correct allreduce on 7",
             "grow": "new process start -> first correct allreduce on 8",
             "restart": "restart all 8 -> first correct allreduce"}
    for k in kinds:
        print(f"| {names[k]} | {statistics.median(got[k]):.0f} | {max(got[k]):.0f} |")
    split, scratch = split_grid()
    print(f"\n| 16 ranks as 4 x 4, {TRIALS} trials | median ms | worst ms | first trial ms |")
    print("|---|---|---|---|")
    print(f"| rows + columns by split | {statistics.median(split):.0f} | {max(split):.0f} | {split[0]:.0f} |")
    print(f"| rows + columns from scratch | {statistics.median(scratch):.0f} | {max(scratch):.0f} | {scratch[0]:.0f} |")
    detect = 20.0  # the dead verdict (ms) that a restart also waits for before relaunching
    ratio = (statistics.median(got["restart"]) + detect) / statistics.median(got["kill"])
    print(f"\nrestart path (relaunch + init + first allreduce, excluding checkpoint reload and the "
          f"launcher's own restart) / in-place recovery after a kill: {ratio:.1f}x (medians)")


main()
