"""KVCache: a paged KV cache (include/sneppx/kv_cache.h) for LLMConfig.forward_mha.

Rows are HF's batch rows: the cache is made with `batch` of them, each a
sequence of the C cache; fork() adds one. The C cache is made for one layer
shape and `num_layers` layers of it, so one KVCache serves a whole model whose
layers each run through their own LLMConfig (forward_mha(..., layer_idx=i)).
"""
import contextlib
import ctypes
import re
import threading
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _structs as S
from ._hf import INT64_MAX, c_count
from ._library import lib
from .errors import Error, InvalidArgumentError, check

# Mirrors of the public structs (tests/python/test_config_fields.py pins them to the
# header's layout). Options carry struct_size = sizeof the mirror, so fields the C
# header adds later take their defaults there; stats has no such field and is written whole.


class KVCacheOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("capacity_tokens", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("num_layers", ctypes.c_int64),
        ("dtype", ctypes.c_int),
        ("max_sequence_tokens", ctypes.c_int64),
    ]


class KVCacheStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "page_size", "num_layers", "total_pages", "free_pages", "sequences", "page_bytes", "token_elements",
        "token_bytes")] + [("dtype", ctypes.c_int)]


def kv_dtype(value: Any) -> int:
    """The sneppx_dtype of a KV cache's element type: its name ("float32", "bfloat16",
    "float16", "int8"), a numpy type or dtype of those names, or a torch dtype."""
    if isinstance(value, str):
        name = value
    elif str(value).startswith("torch."):     # torch.bfloat16, without importing torch
        name = str(value)[len("torch."):]
    elif isinstance(value, type) or hasattr(value, "kind"):  # np.float16, np.dtype("int8")
        try:
            name = np.dtype(value).name
        except TypeError:
            raise TypeError(f"dtype: expected a type name ({', '.join(S.DTYPES)}), got {value!r}") from None
    else:
        raise TypeError(f"dtype: expected a type name ({', '.join(S.DTYPES)}), got {value!r}")
    if name not in S.DTYPES:
        raise ValueError(f"dtype: {value!r} is not a KV cache type ({', '.join(S.DTYPES)})")
    return S.DTYPES.index(name)


#: How the C cache's messages name a sequence (by its id) and its calls' per-sequence arguments.
_C_SEQUENCE = re.compile(r"\bsequence (\d+)")
_C_SEQ_IDS = re.compile(r"\bseq_ids(?=\[)")


def _count(name: str, value: Any, low: int) -> int:
    """An integer of at least low that fits the C int64_t it goes to (ctypes would wrap it)."""
    if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):   # numpy's bool has __index__
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    value = int(value.__index__())
    if value < low:
        raise ValueError(f"{name}: {value} must be at least {low}")
    return c_count(name, value)


def layer_index(layer_idx: Any, num_layers: int) -> int:
    """forward_mha's and the cache's layer_idx, checked before it reaches C (whose message
    would name its own argument, layer_index) against the cache's num_layers."""
    index = _count("layer_idx", layer_idx, 0)
    if index >= num_layers:
        raise InvalidArgumentError(f"layer_idx: {index} must be in [0, {num_layers}) (the cache's num_layers)")
    return index


def per_row_list(name: str, value: Any) -> list:
    """A per-row argument (forward_ragged's, truncate_rows') as a list, else a TypeError
    naming the argument (list() alone says only "'int' object is not iterable")."""
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{name}: expected one entry per row (a list or other iterable), got "
                        f"{type(value).__name__}") from None


class KVCache:
    """A paged KV cache of `batch` rows for one layer shape; see LLMConfig.kv_cache().

    len(cache): tokens cached in its longest row (HF's get_seq_length());
    cache.lengths: per row. fork(row) adds a row that continues from `row`
    (pages shared, copied on write); truncate(row, n) drops tokens n..;
    truncate_rows(rows, lengths) does it for several rows, all or none;
    reset() empties every row. Rows are 0..len(cache.lengths)-1.
    Calls on one KVCache are serialized by a lock; a forward holds it."""

    __slots__ = ("_handle", "_destroy", "_rows", "_lock", "_config", "num_layers", "page_size",
                 "max_tokens", "dtype", "__weakref__")

    def __init__(self, config: Any, batch: int, max_tokens: int, page_size: Optional[int], num_layers: int,
                 dtype: Any = "float32"):
        self._handle = None
        dtype_value = kv_dtype(dtype)
        batch = _count("batch", batch, 1)
        max_tokens = _count("max_tokens", max_tokens, 1)
        num_layers = _count("num_layers", num_layers, 1)
        self._destroy = lib.sneppx_kv_cache_destroy
        options = KVCacheOptions()
        lib.sneppx_kv_cache_options_init(ctypes.byref(options))
        options.struct_size = ctypes.sizeof(KVCacheOptions)
        # None: the library's default, as sneppx_kv_cache_options_init gives it.
        page_size = _count("page_size", options.page_size if page_size is None else page_size, 1)
        pages_per_row = -(-max_tokens // page_size)
        # The pool: every row at max_tokens, and one page per row for a fork's
        # copy-on-write of its last page.
        capacity = batch * (pages_per_row + 1) * page_size
        too_large = (f"max_tokens: {batch} rows of {max_tokens} tokens make a pool of {capacity} tokens (pages of "
                     f"{page_size}, a spare page per row), beyond what a cache holds")
        if capacity > INT64_MAX:
            raise InvalidArgumentError(too_large)
        options.capacity_tokens = capacity
        options.page_size = page_size
        options.num_layers = num_layers
        options.max_sequence_tokens = max_tokens
        options.dtype = dtype_value
        handle = ctypes.c_void_p()
        try:
            check(lib.sneppx_kv_cache_create(ctypes.byref(config), ctypes.byref(options), ctypes.byref(handle)))
        except InvalidArgumentError as error:
            if "options.capacity_tokens" not in str(error):
                raise
            # The caller gave batch and max_tokens, not the pool's size they make.
            raise InvalidArgumentError(f"{too_large} ({error})") from None
        self._handle = handle.value
        self._config = config
        self._lock = threading.RLock()
        self._rows: List[int] = []
        self.num_layers, self.page_size, self.max_tokens = num_layers, page_size, max_tokens
        self.dtype = S.DTYPES[dtype_value]
        for _ in range(batch):
            self._rows.append(self._add())

    def __del__(self):
        if getattr(self, "_handle", None):   # None when __init__ raised
            self._destroy(self._handle)
            self._handle = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        # copy.copy, copy.deepcopy and pickle all come here. The default would copy _handle:
        # two objects destroying one C cache, the second use a use-after-free.
        raise TypeError("KVCache cannot be copied or pickled: its pages live in C memory owned by this object; "
                        "fork(row) adds a row that continues from another (pages shared, copied on write)")

    def _add(self) -> int:
        seq_id = ctypes.c_int64()
        check(lib.sneppx_kv_cache_add_sequence(self._handle, ctypes.byref(seq_id)))
        return seq_id.value

    def _row(self, row: Any, name: str = "row") -> int:
        """row's index, checked; errors name `name` (forward_ragged's rows[i])."""
        if isinstance(row, (bool, np.bool_)) or not hasattr(row, "__index__"):
            raise TypeError(f"{name}: expected an integer, got {row!r}")
        index = row.__index__()
        if not 0 <= index < len(self._rows):
            raise IndexError(f"{name}: {index} is not a row of this cache (0..{len(self._rows) - 1})")
        return index

    def _distinct_seq_ids(self, rows: list) -> List[int]:
        """The C sequences of rows, each row at most once; errors name rows[i] (the C calls'
        own checks would name their seq_ids[i]). Called with the lock held."""
        seq_ids = [self._rows[self._row(row, f"rows[{i}]")] for i, row in enumerate(rows)]
        first: dict = {}
        for i, seq_id in enumerate(seq_ids):
            if seq_id in first:
                raise InvalidArgumentError(f"rows[{i}]: row {rows[i]} is also rows[{first[seq_id]}]: "
                                           "each row at most once per call")
            first[seq_id] = i
        return seq_ids

    @contextlib.contextmanager
    def in_rows(self, seq_ids_name: str = "rows") -> Any:
        """C errors raised inside, in this object's terms: a C sequence id becomes its row (ids
        are not row indices: reset() and forks make new ones, with generation bits), and the C
        calls' seq_ids[i] becomes the Python caller's seq_ids_name[i]. Called with the lock held."""
        try:
            yield
        except Error as error:
            rows = {seq_id: row for row, seq_id in enumerate(self._rows)}
            text = _C_SEQUENCE.sub(lambda m: f"row {rows[int(m.group(1))]}" if int(m.group(1)) in rows
                                   else m.group(0), str(error))
            text = _C_SEQ_IDS.sub(seq_ids_name, text)
            if text == str(error):
                raise
            raise type(error)(text) from None

    @property
    def batch(self) -> int:
        return len(self._rows)

    @property
    def lengths(self) -> List[int]:
        """Tokens cached per row (the largest over the layers, as sneppx_kv_cache_length)."""
        with self._lock:
            result = []
            for seq_id in self._rows:
                length = ctypes.c_int64()
                check(lib.sneppx_kv_cache_length(self._handle, seq_id, ctypes.byref(length)))
                result.append(length.value)
            return result

    def layer_lengths(self, layer_idx: int) -> List[int]:
        """Tokens cached per row at one layer."""
        layer_idx = layer_index(layer_idx, self.num_layers)
        with self._lock:
            result = []
            for seq_id in self._rows:
                length = ctypes.c_int64()
                check(lib.sneppx_kv_cache_layer_length(self._handle, seq_id, layer_idx, ctypes.byref(length)))
                result.append(length.value)
            return result

    def __len__(self) -> int:
        lengths = self.lengths
        return max(lengths) if lengths else 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """HF's name: tokens cached at layer_idx in the longest row."""
        lengths = self.layer_lengths(layer_idx)
        return max(lengths) if lengths else 0

    def fork(self, row: int) -> int:
        """A new row continuing from `row` as it is now; returns its index."""
        with self._lock:
            child = ctypes.c_int64()
            with self.in_rows():
                check(lib.sneppx_kv_cache_fork(self._handle, self._rows[self._row(row)], ctypes.byref(child)))
            self._rows.append(child.value)
            return len(self._rows) - 1

    def truncate(self, row: int, length: int) -> None:
        """Keeps the first `length` tokens of `row` (speculative decoding's rollback)."""
        with self._lock:
            seq_id = self._rows[self._row(row)]
            with self.in_rows():
                check(lib.sneppx_kv_cache_truncate(self._handle, seq_id, _count("length", length, 0)))

    def truncate_rows(self, rows: Any, lengths: Any) -> None:
        """Keeps lengths[i] tokens of row rows[i], all or none: when one is refused (a
        length past the row's, or too far back under a sliding window), no row is cut."""
        rows, lengths = per_row_list("rows", rows), per_row_list("lengths", lengths)
        if len(lengths) != len(rows):
            raise ValueError(f"lengths: {len(lengths)} entries for {len(rows)} rows")
        counts = [_count(f"lengths[{i}]", length, 0) for i, length in enumerate(lengths)]
        with self._lock:
            seq_ids = self._distinct_seq_ids(rows)
            with self.in_rows():
                check(lib.sneppx_kv_cache_truncate_sequences(self._handle, len(seq_ids),
                                                             (ctypes.c_int64 * len(seq_ids))(*seq_ids),
                                                             (ctypes.c_int64 * len(counts))(*counts)))

    def reset(self) -> None:
        """Empties every row (the rows stay, with length 0)."""
        with self._lock:
            check(lib.sneppx_kv_cache_reset(self._handle))
            self._rows = [self._add() for _ in self._rows]

    def first_held(self, row: int) -> int:
        """The first token `row` still holds at every layer: 0, or under a sliding window
        the first token of its first page not yet released (a multiple of page_size)."""
        with self._lock:
            first = ctypes.c_int64()
            check(lib.sneppx_kv_cache_first_held(self._handle, self._rows[self._row(row)], ctypes.byref(first)))
            return first.value

    def read(self, row: int, layer_idx: int = 0, begin: Optional[int] = None,
             end: Optional[int] = None) -> Tuple[Any, Optional[Any]]:
        """What the cache holds for tokens [begin, end) of `row` at layer_idx (begin: the
        first token it holds, first_held(row); end: the row's length there), widened to
        float32 (int8: times each row's scale), as (k, v): standard [tokens, num_kv_heads,
        head_dim] each, K after RoPE; MLA (latent rows [tokens, kv_lora_rank +
        qk_rope_head_dim], None). Tokens a sliding window released are gone (an explicit
        begin must not be before first_held). New float32 ndarrays, whatever the forwards
        took (torch.from_numpy wraps them without a copy)."""
        layer_idx = layer_index(layer_idx, self.num_layers)
        begin = None if begin is None else _count("begin", begin, 0)
        with self._lock:
            seq_id = self._rows[self._row(row)]
            begin = self.first_held(row) if begin is None else begin
            length = ctypes.c_int64()
            check(lib.sneppx_kv_cache_layer_length(self._handle, seq_id, layer_idx, ctypes.byref(length)))
            end = length.value if end is None else _count("end", end, 0)
            elements = self.stats()["token_elements"]
            # Sized for what a valid range copies; C refuses the others, naming begin or end,
            # before it writes (so an end far past the row allocates nothing first).
            tokens = max(min(end, length.value) - begin, 0)
            if self._config.kv_lora_rank > 0:
                k, v = np.empty((tokens, elements), np.float32), None
            else:
                heads = self._config.num_key_value_heads
                k = np.empty((tokens, heads, elements // (2 * heads)), np.float32)
                v = np.empty_like(k)
            as_float = ctypes.POINTER(ctypes.c_float)
            with self.in_rows():
                check(lib.sneppx_kv_cache_read(self._handle, seq_id, layer_idx, begin, end,
                                               k.ctypes.data_as(as_float),
                                               None if v is None else v.ctypes.data_as(as_float)))
            return k, v

    def stats(self) -> dict:
        """Pool figures: page_size, num_layers, total_pages, free_pages, sequences, page_bytes,
        token_elements, token_bytes (one token of one layer, int8's scales included) and
        dtype (the element type's name)."""
        stats = KVCacheStats()
        check(lib.sneppx_kv_cache_stats_get(self._handle, ctypes.byref(stats)))
        figures = {name: getattr(stats, name) for name, _ in KVCacheStats._fields_}
        figures["dtype"] = S.DTYPES[figures["dtype"]]
        return figures

    def __repr__(self) -> str:
        return (f"KVCache(batch={self.batch}, lengths={self.lengths}, page_size={self.page_size}, "
                f"num_layers={self.num_layers}, dtype={self.dtype!r})")
