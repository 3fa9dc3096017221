"""Tensor parallelism over MPI (LLMConfig.tensor_parallel): the layer split by heads
over the ranks of an mpi4py communicator, each rank holding its shard
(include/sneppx/shard.h, include/sneppx/mpi.h).

TensorParallelWeights wraps the config's weight source (synthetic, a state dict
or a checkpoint): each create() makes this rank's shard of that source's whole
layer through libsneppx_mpi, found beside libsneppx. Creating, forward_mha and
the cached forward are collective: every rank calls them in the same order with
the same arguments.
"""
import builtins
import contextlib
import ctypes
import sys
from typing import Any, Callable, Iterator, Optional, Tuple, TypeVar

from . import _structs as S
from ._layer import Layer
from ._library import lib
from ._locate import library_path
from ._weights import CheckpointWeights, StateDictWeights, SyntheticWeights
from . import errors
from .errors import CommError, InvalidArgumentError, OutOfMemoryError, check, status_code

T = TypeVar("T")

_MPI_LIBRARY_NAMES = ("libsneppx_mpi.so", "libsneppx_mpi.so.0")


class ShardTransport(ctypes.Structure):
    """sneppx_shard_transport: filled by libsneppx_mpi, handed to libsneppx as is."""
    _fields_ = [("context", ctypes.c_void_p), ("allgather", ctypes.c_void_p), ("sum_start", ctypes.c_void_p),
                ("sum_wait", ctypes.c_void_p), ("release", ctypes.c_void_p)]


class Shard(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("world", ctypes.c_int), ("transport", ShardTransport)]


class ShardInfo(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("world", ctypes.c_int)] + [
        (name, ctypes.c_int64) for name in ("q_head_begin", "q_heads", "kv_head_begin", "kv_heads")]


_c_config_p = ctypes.POINTER(S.Config)
_layer_out = ctypes.POINTER(ctypes.c_void_p)
_SHARD_PROTOTYPES = {
    "sneppx_layer_create_shard": (ctypes.c_int, [_c_config_p, ctypes.POINTER(S.Weights), ctypes.POINTER(Shard),
                                                 _layer_out]),
    "sneppx_layer_create_shard_typed": (ctypes.c_int, [_c_config_p, ctypes.POINTER(S.TypedWeights),
                                                       ctypes.POINTER(Shard), _layer_out]),
    "sneppx_layer_create_shard_from_safetensors": (ctypes.c_int, [_c_config_p, ctypes.c_char_p, ctypes.c_int64,
                                                                  ctypes.POINTER(Shard), _layer_out]),
    "sneppx_layer_shard_info": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ShardInfo)]),
    "sneppx_layer_config": (_c_config_p, [ctypes.c_void_p]),
    "sneppx_layer_shard_refuse": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]),
}
for _name, (_restype, _argtypes) in _SHARD_PROTOTYPES.items():
    _function = getattr(lib, _name)
    _function.restype, _function.argtypes = _restype, _argtypes

_mpi_lib: Optional[ctypes.CDLL] = None


def _mpi() -> ctypes.CDLL:
    """libsneppx_mpi beside libsneppx, loaded at the first tensor-parallel layer."""
    global _mpi_lib
    if _mpi_lib is None:
        directory = library_path().parent
        found = [directory / name for name in _MPI_LIBRARY_NAMES if (directory / name).exists()]
        if not found:
            raise ImportError(f"tensor_parallel: no libsneppx_mpi beside {library_path()}: this build of sneppx "
                              f"found no MPI (install libopenmpi-dev and rebuild)")
        library = ctypes.CDLL(str(found[0]))
        library.sneppx_mpi_shard_fortran.restype = ctypes.c_int
        library.sneppx_mpi_shard_fortran.argtypes = [ctypes.c_int, ctypes.POINTER(Shard), ctypes.c_char_p,
                                                     ctypes.c_size_t]
        _mpi_lib = library
    return _mpi_lib


def _refuse_finalized() -> None:
    """CommError once MPI is finalized: any MPI call then aborts the process (mpi4py's
    py2f and allgather too), where the caller should get an exception."""
    mpi = sys.modules.get("mpi4py.MPI")   # not imported: no mpi4py communicator exists yet
    if mpi is not None and mpi.Is_finalized():
        raise CommError("comm: MPI is finalized (MPI.Finalize() was called); a tensor-parallel layer needs MPI "
                        "running")


def communicator_handle(comm: Any) -> int:
    """The Fortran handle of an mpi4py communicator (what libsneppx_mpi takes)."""
    py2f = getattr(comm, "py2f", None)
    if not callable(py2f) or not hasattr(comm, "Get_size"):
        raise TypeError(f"comm: expected an mpi4py communicator (mpi4py.MPI.Comm), got {comm!r}")
    _refuse_finalized()
    return int(py2f())


class TensorParallelWeights:
    """A weight source (SyntheticWeights, StateDictWeights, CheckpointWeights) made into
    this rank's shard of its layer over comm."""

    def __init__(self, source: Any, comm: Any):
        self.handle = communicator_handle(comm)
        self.comm = comm
        self.source = source
        self.description = f"{source.description}, tensor_parallel"   # + this rank's place once made

    def __deepcopy__(self, memo: Any) -> "TensorParallelWeights":
        import copy
        return TensorParallelWeights(copy.deepcopy(self.source, memo), self.comm)   # the communicator is shared

    def create(self, config: S.Config) -> Layer:
        shard = Shard()
        error = ctypes.create_string_buffer(512)
        if _mpi().sneppx_mpi_shard_fortran(self.handle, ctypes.byref(shard), error, len(error)) != 0:
            reason = error.value.decode(errors="replace")
            raise CommError(reason if reason.startswith("comm: ") else f"comm: {reason}")
        # From the shard, not comm: the caller may free comm (the layer holds its own duplicate).
        self.description = f"{self.source.description}, tensor_parallel(rank {shard.rank} of {shard.world})"
        # From here the create call owns the transport: it releases it unless a layer holds it.
        source = self.source
        if isinstance(source, SyntheticWeights):
            create = lambda handle: lib.sneppx_layer_create_shard(  # noqa: E731
                ctypes.byref(config), None, ctypes.byref(shard), handle)
        elif isinstance(source, StateDictWeights):
            weights = S.TypedWeights()
            for field, (array, dtype) in source.arrays.items():
                setattr(weights, field, S.TensorRef(array.ctypes.data, dtype))
            create = lambda handle: lib.sneppx_layer_create_shard_typed(  # noqa: E731
                ctypes.byref(config), ctypes.byref(weights), ctypes.byref(shard), handle)
        elif isinstance(source, CheckpointWeights):
            create = lambda handle: lib.sneppx_layer_create_shard_from_safetensors(  # noqa: E731
                ctypes.byref(config), source.path, source.layer, ctypes.byref(shard), handle)
        else:   # a source this module does not know: nothing was handed over yet
            release = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(shard.transport.release)
            release(shard.transport.context)
            raise TypeError(f"tensor_parallel: weights of {type(source).__name__} cannot be sharded")
        return Layer(config, create=create)


def tensor_parallel(cfg: Any, comm: Any) -> None:
    """LLMConfig.tensor_parallel: wraps cfg's weights and makes this rank's shard now
    (collective), so that a refusal (a world size that cannot split the heads, another
    config on some rank) is raised here, on every rank."""
    with cfg._lock:
        source = cfg._weights.source if isinstance(cfg._weights, TensorParallelWeights) else cfg._weights
        sharded = TensorParallelWeights(source, comm)
        cfg._layer = sharded.create(cfg._config)
        cfg._weights = sharded


def keep_sharding(current: Any, source: Any) -> Any:
    """The weight source a load installs: sharded over the same communicator as the
    config's current one, if that is sharded."""
    if isinstance(current, TensorParallelWeights) and not isinstance(source, TensorParallelWeights):
        return TensorParallelWeights(source, current.comm)
    return source


def layer_config(cfg: Any) -> S.Config:
    """The config a KV cache of cfg's layer is made for: a shard's own (its K/V heads),
    else cfg's."""
    if not isinstance(cfg._weights, TensorParallelWeights):
        return cfg._config
    # Under cfg's lock: the use_flash_attn setter's sneppx_layer_set_flash writes the
    # layer's config, with the GIL released, while this copies it.
    with cfg._lock:
        layer = cfg._current_layer()
        return S.Config.from_buffer_copy(lib.sneppx_layer_config(layer._handle).contents)


def shard_info(cfg: Any) -> Optional[dict]:
    """This rank's heads, or None when cfg is not tensor-parallel."""
    if not isinstance(cfg._weights, TensorParallelWeights):
        return None
    info = ShardInfo()
    check(lib.sneppx_layer_shard_info(cfg._current_layer()._handle, ctypes.byref(info)))
    return {"rank": info.rank, "world": info.world, "q_heads": (info.q_head_begin, info.q_head_begin + info.q_heads),
            "kv_heads": (info.kv_head_begin, info.kv_head_begin + info.kv_heads)}


def is_sharded(cfg: Any) -> bool:
    return isinstance(cfg._weights, TensorParallelWeights)


@contextlib.contextmanager
def refused_on_every_rank(cfg: Any) -> Iterator[None]:
    """The argument checks before a forward's C call. On a tensor-parallel config, any
    exception they raise on this rank (a TypeError or ValueError, an IndexError for a cache
    row that is not there, a MemoryError converting the inputs) is this rank's part in the
    call the other ranks make (sneppx_layer_shard_refuse): they fail with "rank R of W: ..."
    (OutOfMemoryError for a MemoryError, else InvalidArgumentError) instead of pairing their
    call with this rank's next one. The block must hold no collective step itself."""
    try:
        yield
    except Exception as error:
        if is_sharded(cfg):
            layer = cfg._current_layer()   # a create the others make first, if the layer is new
            refusal = OutOfMemoryError if isinstance(error, MemoryError) else InvalidArgumentError
            lib.sneppx_layer_shard_refuse(layer._handle, status_code(refusal), str(error).encode())
        raise


def _exception_class(name: str) -> type:
    """The class another rank raised, by name: sneppx's own or a builtin one (ValueError for
    any other)."""
    known = getattr(errors, name, None) or getattr(builtins, name, None)
    return known if isinstance(known, type) and issubclass(known, Exception) else ValueError


def agreed(cfg: Any, prepare: Callable[[], T], same: Optional[Tuple[str, Any]] = None) -> T:
    """prepare(): the local checks of a step that ends in a collective create (a load, a
    setter that rebuilds the layer). On a tensor-parallel config the ranks then exchange
    verdicts (one mpi4py allgather), so a check that fails on one rank raises on every
    rank, the others with "rank R of W: ...", before any of them starts the create.
    same: (name, value) of an argument every rank must pass alike that the create cannot
    compare (a state dict's layer: each rank would pack its rows of another layer);
    InvalidArgumentError on every rank, naming it, where one differs."""
    if not is_sharded(cfg):
        return prepare()
    comm = cfg._weights.comm
    _refuse_finalized()
    if not comm:   # mpi4py's Free() nulls it; MPI itself would only say MPI_ERR_COMM
        raise CommError("comm: the communicator given to tensor_parallel() was freed; loads and settings that "
                        "rebuild the layer use it (forwards use the layer's own duplicate)")
    failure: Optional[Exception] = None
    try:
        result = prepare()
    except Exception as error:   # whatever it is (a MemoryError copying weights too): the others must hear
        failure = error
    # The value only once prepare() has checked it (it may not pickle otherwise).
    verdicts = comm.allgather((None if failure is None else (type(failure).__name__, str(failure)),
                                            None if same is None or failure is not None else same[1]))
    if failure is not None:
        raise failure
    for rank, (verdict, _) in enumerate(verdicts):
        if verdict is not None:
            raise _exception_class(verdict[0])(f"rank {rank} of {len(verdicts)}: {verdict[1]}")
    for rank, (_, value) in enumerate(verdicts):
        if value != verdicts[0][1]:
            raise InvalidArgumentError(f"{same[0]}: rank {rank} of {len(verdicts)} passes {value!r}, rank 0 "
                                       f"{verdicts[0][1]!r}: every rank of a sharded layer makes the same call")
    return result
