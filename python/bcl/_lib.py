"""libbcl through ctypes: where the library is, the prototypes of the calls used here, and
errors that carry BCL's own text (rank, host, device, cause)."""
import ctypes
import os
from pathlib import Path

UNIQUE_ID_BYTES = 128
SUCCESS, IN_PROGRESS = 0, 13

# bclDataType_t and bclRedOp_t, NCCL's numbering.
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)
SUM, PROD, MAX, MIN, AVG = range(5)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """bclConfig_t (bcl.h); start from `Config.default()`."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("device", ctypes.c_char_p), ("transport", ctypes.c_char_p),
                ("socketsPerPeer", ctypes.c_int), ("initTimeoutSeconds", ctypes.c_double),
                ("timeoutSeconds", ctypes.c_double)]

    @classmethod
    def default(cls):
        version = ctypes.c_int()
        check(lib.bclGetVersion(ctypes.byref(version)))
        return cls(ctypes.sizeof(cls), 0xBC1C0F16, version.value, None, None, 0, 0.0, 0.0)


class BclError(RuntimeError):
    """A failed BCL call: `code` is the bclResult_t, the text is bclGetLastError's."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


def _candidates():
    if os.environ.get("BCL_LIBRARY"):
        yield Path(os.environ["BCL_LIBRARY"])
    here = Path(__file__).resolve().parent
    yield here / "libbcl.so"
    # A checkout: python/bcl/_lib.py -> target/release/libbcl.so of the workspace.
    yield here.parent.parent / "target" / "release" / "libbcl.so"


def _load():
    tried = []
    for path in _candidates():
        if path.is_file():
            return ctypes.CDLL(str(path))
        tried.append(str(path))
    raise ImportError(
        "libbcl.so not found (tried " + ", ".join(tried) + "): set BCL_LIBRARY, or build it with "
        "`cargo build --release -p bcl-ffi` and reinstall with `pip install ./python`"
    )


lib = _load()
_p, _i, _sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
for name, args in {
    "bclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "bclCommInitRank": [ctypes.POINTER(_p), _i, UniqueId, _i],
    "bclCommInitRankConfig": [ctypes.POINTER(_p), _i, UniqueId, _i, ctypes.POINTER(Config)],
    "bclGetVersion": [ctypes.POINTER(_i)],
    "bclCommDestroy": [_p],
    "bclCommAbort": [_p],
    "bclCommSplit": [_p, _i, _i, ctypes.POINTER(_p), _p],
    "bclAllReduce": [_p, _p, _sz, _i, _i, _p, _p],
    "bclBroadcast": [_p, _p, _sz, _i, _i, _p, _p],
    "bclReduce": [_p, _p, _sz, _i, _i, _i, _p, _p],
    "bclAllGather": [_p, _p, _sz, _i, _p, _p],
    "bclReduceScatter": [_p, _p, _sz, _i, _i, _p, _p],
    "bclAllToAll": [_p, _p, _sz, _i, _p, _p],
    "bclAllToAllv": [_p, ctypes.POINTER(_sz), _p, ctypes.POINTER(_sz), _i, _p, _p],
    "bclAllGatherv": [_p, _p, ctypes.POINTER(_sz), _i, _p, _p],
    "bclReduceScatterv": [_p, _p, ctypes.POINTER(_sz), _i, _i, _p, _p],
    "bclGather": [_p, _p, _sz, _i, _i, _p, _p],
    "bclScatter": [_p, _p, _sz, _i, _i, _p, _p],
    "bclSend": [_p, _sz, _i, _i, _p, _p],
    "bclRecv": [_p, _sz, _i, _i, _p, _p],
    "bclBarrier": [_p, _p],
    "bclGroupStart": [],
    "bclGroupEnd": [],
    "bclStreamCreate": [ctypes.POINTER(_p)],
    "bclStreamSynchronize": [_p],
    "bclStreamDestroy": [_p],
    "bclEventCreate": [ctypes.POINTER(_p)],
    "bclEventRecord": [_p, _p],
    "bclEventQuery": [_p],
    "bclEventSynchronize": [_p],
    "bclEventDestroy": [_p],
}.items():
    fn = getattr(lib, name)
    fn.argtypes = args
    fn.restype = ctypes.c_int
lib.bclGetLastError.restype = ctypes.c_char_p
lib.bclGetLastError.argtypes = [_p]
lib.bclGetErrorString.restype = ctypes.c_char_p
lib.bclGetErrorString.argtypes = [_i]


def error(code):
    """The BclError of a failed call on this thread (its text is the call's)."""
    last = lib.bclGetLastError(None) or b""
    kind = lib.bclGetErrorString(code) or b""
    return BclError(code, f"{kind.decode()}: {last.decode(errors='replace')}")


def check(code):
    if code != SUCCESS:
        raise error(code)
