"""`pip install ./python`: builds the backend's C++ part (bcl._C, a c10d::Backend over the C
ABI) against the installed torch, and puts the workspace's libbcl.so beside it (building it
with cargo first), so the installed `bcl` needs no BCL_LIBRARY. Needs torch at build time:
install with `pip install --no-build-isolation ./python`.

Settings (environment): BCL_CARGO_FEATURES, cargo features of the libbcl it builds (`cuda`
for GPU tensors); BCL_PREBUILT_LIBRARY, the path of a libbcl.so to take instead of building
one (a machine without cargo, such as the GPU machine of scripts/device-check.sh)."""
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = Path(__file__).resolve().parent
WORKSPACE = HERE.parent
PREBUILT = os.environ.get("BCL_PREBUILT_LIBRARY")
LIBRARY = Path(PREBUILT).resolve() if PREBUILT else WORKSPACE / "target" / "release" / "libbcl.so"


def build_library():
    features = os.environ.get("BCL_CARGO_FEATURES", "")
    if not PREBUILT and (WORKSPACE / "Cargo.toml").is_file():
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "bcl-ffi"]
                       + (["--features", features] if features else []),
                       cwd=WORKSPACE, check=True)
    if not LIBRARY.is_file():
        raise SystemExit(f"{LIBRARY} is missing: build it with `cargo build --release -p bcl-ffi`")


class WithLibrary(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "bcl"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(LIBRARY, target / "libbcl.so")


class Extension(BuildExtension):
    def run(self):
        build_library()
        super().run()


setup(
    ext_modules=[
        CppExtension(
            "bcl._C",
            ["csrc/module.cpp", "csrc/process_group.cpp", "csrc/p2p.cpp", "csrc/work.cpp"],
            include_dirs=[str(WORKSPACE / "include")],
            library_dirs=[str(LIBRARY.parent)],
            libraries=["bcl"],
            # libbcl.so sits beside _C in the installed package.
            extra_link_args=["-Wl,-rpath,$ORIGIN"],
            extra_compile_args=["-O2"],
        )
    ],
    cmdclass={"build_py": WithLibrary, "build_ext": Extension},
)
