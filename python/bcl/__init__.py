"""BCL from Python. `import bcl.torch` registers the torch.distributed backend "bcl"."""
from ._lib import BclError  # noqa: F401

__version__ = "0.1.0"
