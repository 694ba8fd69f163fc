#!/usr/bin/env bash
# The torch.distributed backend "bcl" as a user gets it: torch from PyPI (installed if this
# machine lacks it), `pip install --no-build-isolation ./python` (libbcl and the C++
# backend built against that torch), then under torchrun: every operation against
# Gloo in the same job on 2, 3 and 4 ranks (python/tests/check_ops.py), DDP on 4 ranks
# ending with the single-process model's weights (check_ddp.py), FSDP2 against Gloo
# (check_fsdp.py), subgroups (check_groups.py), the group timeout (check_timeout.py)
# and a rank killed mid-training (check_kill.py, 4 processes without torchrun). Run by
# scripts/test.sh; fails loudly when torch cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() {
  python3 -m pip install --quiet "$@" || python3 -m pip install --quiet --break-system-packages "$@"
}
python3 -c 'import torch' 2>/dev/null || pip_install torch
# Built against the installed torch (--no-build-isolation), so setuptools must be here.
python3 -c 'import setuptools' 2>/dev/null || pip_install setuptools
python3 -c 'import torch, torch.distributed as d; assert d.is_available(); print("torch", torch.__version__)'
pip_install --force-reinstall --no-deps --no-build-isolation ./python
# Run from elsewhere, so that `import bcl` is the installed package, not the source tree.
cd /tmp
for n in 2 3 4; do
  echo "== torch: every operation against gloo, $n ranks [torch-test.sh +${SECONDS} s]"
  timeout 600 python3 -m torch.distributed.run --nproc-per-node "$n" "$OLDPWD/python/tests/check_ops.py"
done
echo "== torch: DDP on 4 ranks equals one process on the global batch [torch-test.sh +${SECONDS} s]"
timeout 600 python3 -m torch.distributed.run --nproc-per-node 4 "$OLDPWD/python/tests/check_ddp.py"
echo "== torch: FSDP2 (fully_shard) of a small transformer, loss curve against gloo's [torch-test.sh +${SECONDS} s]"
timeout 600 python3 -m torch.distributed.run --nproc-per-node 4 "$OLDPWD/python/tests/check_fsdp.py"
echo "== torch: subgroups (2 of 4, a 2 x 2 grid with both families in flight) [torch-test.sh +${SECONDS} s]"
timeout 300 python3 -m torch.distributed.run --nproc-per-node 4 "$OLDPWD/python/tests/check_groups.py"
echo "== torch: the group's timeout bounds a collective (a rank 8 s late, timeout 3 s) [torch-test.sh +${SECONDS} s]"
timeout 120 python3 -m torch.distributed.run --nproc-per-node 2 "$OLDPWD/python/tests/check_timeout.py"
echo "== torch: a rank SIGKILLed mid-training; the others' Python raises naming it [torch-test.sh +${SECONDS} s]"
timeout 300 python3 "$OLDPWD/python/tests/check_kill.py"
