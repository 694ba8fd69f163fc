"""BCL from Python. `import bcl.torch` registers the torch.distributed backend "bcl"."""

__version__ = "0.1.0"
