"""Puts the workspace's libbcl.so into the package (building it with cargo if it is missing),
so that `pip install ./python` gives an importable `bcl` that needs no BCL_LIBRARY."""
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
WORKSPACE = HERE.parent


class WithLibrary(build_py):
    def run(self):
        lib = WORKSPACE / "target" / "release" / "libbcl.so"
        if (WORKSPACE / "Cargo.toml").is_file():
            subprocess.run(["cargo", "build", "--release", "--locked", "-p", "bcl-ffi"],
                           cwd=WORKSPACE, check=True)
        if not lib.is_file():
            raise SystemExit(f"{lib} is missing: build it with `cargo build --release -p bcl-ffi`")
        super().run()
        target = Path(self.build_lib) / "bcl"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, target / "libbcl.so")


setup(cmdclass={"build_py": WithLibrary})
