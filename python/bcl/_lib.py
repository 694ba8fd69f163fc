"""Finds libbcl.so and loads it before bcl._C, which links against it: BCL_LIBRARY if set,
else the copy installed beside this file, else a checkout's target/release."""
import ctypes
import os
from pathlib import Path


def _candidates():
    if os.environ.get("BCL_LIBRARY"):
        yield Path(os.environ["BCL_LIBRARY"])
    here = Path(__file__).resolve().parent
    yield here / "libbcl.so"
    # A checkout: python/bcl/_lib.py -> target/release/libbcl.so of the workspace.
    yield here.parent.parent / "target" / "release" / "libbcl.so"


def load():
    tried = []
    for path in _candidates():
        if path.is_file():
            # Global, so that bcl._C's need for "libbcl.so" (its soname) is met by this copy.
            return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        tried.append(str(path))
    raise ImportError(
        "libbcl.so not found (tried " + ", ".join(tried) + "): set BCL_LIBRARY, or build it with "
        "`cargo build --release -p bcl-ffi` and reinstall with `pip install ./python`"
    )
