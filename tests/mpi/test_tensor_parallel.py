"""LLMConfig.tensor_parallel(comm) with Debian's python3-mpi4py, run by ctest on every
rank of `mpirun -np 2 python3 -m pytest` (each rank runs the same tests in the same
order, as the collective calls need): forward_mha, the KV cache, state dicts and a
checkpoint read shard by shard, against the whole layer in the same process within
1e-6 (tests/support/shard_cases.c says why that holds at real widths too); and the
refusals, raised on every rank, Python's own argument checks included."""
import json
import os
import subprocess
import sys
import struct
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import sneppx

COMM = MPI.COMM_WORLD
RANK, WORLD = COMM.Get_rank(), COMM.Get_size()


def small(**overrides):
    """8 query heads, 2 K/V heads: splits over 1, 2, 4 and 8 ranks."""
    fields = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=256, num_threads=1)
    fields.update(overrides)
    return sneppx.LLMConfig(**fields)


def error(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def inputs(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def random_state_dict(cfg, seed):
    rng = np.random.default_rng(seed)   # the same on every rank
    return {name: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
            for name, shape in cfg.tensor_shapes().items()}


def sharded_with_weights(seed):
    """The whole layer and its shard on this rank, both holding the same random weights."""
    whole, cfg = small(), small()
    weights = random_state_dict(whole, seed)
    whole.load_state_dict(weights)
    cfg.tensor_parallel(COMM)
    cfg.load_state_dict(weights)       # stays sharded: each rank packs its rows and columns
    return whole, cfg, weights


def test_forward_synthetic():
    whole, cfg = small(), small()
    cfg.tensor_parallel(COMM)
    x = inputs(1, 2, 7, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
    heads = 8 // WORLD
    kv = 2 // WORLD if WORLD <= 2 else 1
    kv_first = RANK * kv if WORLD <= 2 else RANK // (WORLD // 2)
    assert cfg.shard == {"rank": RANK, "world": WORLD, "q_heads": (RANK * heads, (RANK + 1) * heads),
                         "kv_heads": (kv_first, kv_first + kv)}
    assert cfg.weights_source.endswith(f"tensor_parallel(rank {RANK} of {WORLD})")
    assert whole.shard is None


def test_state_dict_and_kv_cache():
    whole, cfg, weights = sharded_with_weights(5)
    assert "state_dict" in cfg.weights_source and "tensor_parallel" in cfg.weights_source
    x = inputs(2, 1, 5, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
    # A prefill of 6 tokens in 2 rows, then 3 decode steps; the shard's cache holds its K/V heads.
    whole_cache, cache = whole.kv_cache(batch=2, max_tokens=16), cfg.kv_cache(batch=2, max_tokens=16)
    for step, tokens in enumerate((6, 1, 1, 1)):
        x = inputs(10 + step, 2, tokens, 128)
        got = cfg.forward_mha(x, past_key_value=cache)
        want = whole.forward_mha(x, past_key_value=whole_cache)
        assert error(got, want) <= 1e-6, f"step {step}"
    assert cache.lengths == whole_cache.lengths == [9, 9]


def test_mla_and_llama3_8b():
    mla = dict(hidden_size=128, num_attention_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
               v_head_dim=32, max_position_embeddings=256, num_threads=1)
    whole, cfg = sneppx.LLMConfig(**mla), sneppx.LLMConfig(**mla)
    cfg.tensor_parallel(COMM)
    x = inputs(3, 1, 6, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
    whole, cfg = (sneppx.LLMConfig.from_name("llama3", "8B") for _ in range(2))   # OMP_NUM_THREADS=1
    cfg.tensor_parallel(COMM)
    x = inputs(4, 1, 3, 4096)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
    assert error(cfg.forward_mha(x[:, :1]), whole.forward_mha(x[:, :1])) <= 1e-6   # a decode step's sweep


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, values in tensors.items():
        raw = np.ascontiguousarray(values, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(values.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def test_checkpoint(tmp_path):
    whole, cfg = small(), small()
    weights = random_state_dict(whole, 7)
    # Rank 0's file, read by every rank.
    path = Path(COMM.bcast(str(tmp_path / "layer.safetensors") if RANK == 0 else None))
    if RANK == 0:
        write_safetensors(path, {f"model.layers.0.self_attn.{name}": value for name, value in weights.items()})
    COMM.Barrier()
    whole.load_safetensors(path)
    cfg.tensor_parallel(COMM)
    cfg.load_safetensors(path)
    x = inputs(5, 1, 4, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
    COMM.Barrier()   # no rank reads the file after rank 0's tmp_path goes


@pytest.mark.skipif(WORLD == 1, reason="one rank splits every config")
def test_a_world_that_cannot_split():
    cfg = small(num_attention_heads=WORLD * 2 + 1, num_key_value_heads=1, hidden_size=16 * (WORLD * 2 + 1),
                head_dim=16)
    with pytest.raises(sneppx.InvalidArgumentError, match=f"world: {WORLD} ranks cannot split .* world sizes "
                                                          f"that can: 1 or {WORLD * 2 + 1}"):
        cfg.tensor_parallel(COMM)
    assert cfg.shard is None           # left as it was: a layer of its own
    x = inputs(6, 1, 2, cfg.hidden_size)
    assert cfg.forward_mha(x).shape == x.shape


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_another_config_on_one_rank():
    cfg = small(rope_theta=20000.0 if RANK == WORLD - 1 else 10000.0)
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"config: rank {WORLD - 1} of {WORLD}'s differs from rank 0's: rope_theta 20000 / "
                             f"10000"):
        cfg.tensor_parallel(COMM)


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_default_positions_on_one_rank_explicit_on_another():
    """position_ids=None is 0..seq_len-1 in every row: a rank that spells those out agrees
    with one that does not, and other positions are still refused on every rank."""
    whole, cfg = small(), small()
    cfg.tensor_parallel(COMM)
    x = inputs(7, 2, 5, 128)
    spelled = np.tile(np.arange(5), (2, 1))
    positions = spelled if RANK == WORLD - 1 else None
    assert error(cfg.forward_mha(x, position_ids=positions), whole.forward_mha(x)) <= 1e-6
    shifted = spelled + 1 if RANK == WORLD - 1 else None
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"position_ids: rank {WORLD - 1} of {WORLD}'s positions differ from rank 0's: "):
        cfg.forward_mha(x, position_ids=shifted)


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_a_bad_argument_in_python_on_one_rank():
    """Python's checks run before the C call: a rank they refuse still takes part in the
    call (sneppx_layer_shard_refuse), so the others fail with its message, not a hang,
    and no cache grows."""
    cfg = small()
    cfg.tensor_parallel(COMM)
    last = RANK == WORLD - 1
    want = f"rank {WORLD - 1} of {WORLD}: " if not last else ""
    x = inputs(7, 1, 4, 128)
    bad = x[..., :100] if last else x
    with pytest.raises(ValueError, match=f"{want}hidden_states: expected shape"):
        cfg.forward_mha(bad)
    cache = cfg.kv_cache(batch=1, max_tokens=16)
    with pytest.raises(ValueError, match=f"{want}hidden_states: expected shape"):
        cfg.forward_mha(bad, past_key_value=cache)
    with pytest.raises(ValueError, match=f"{want}position_ids: 2 arrays for 1 rows"):
        cfg.forward_ragged(cache, [0], [x[0]], position_ids=[[0, 1, 2, 3], [0]] if last else None)
    with pytest.raises(ValueError, match=f"{want}hidden_states: batch 2 does not match the cache's 1 rows"):
        cfg.forward_mha(np.concatenate([x, x]) if last else x, past_key_value=cache)
    assert cache.lengths == [0]
    whole = small()
    assert error(cfg.forward_mha(x, past_key_value=cache), whole.forward_mha(x)) <= 1e-6
    assert cache.lengths == [4]


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_a_bad_load_or_setting_on_one_rank():
    """A load or a setter that rebuilds the layer checks its arguments on every rank
    before any rank starts the collective create: one rank's bad value raises on all."""
    whole, cfg, weights = sharded_with_weights(8)
    last = RANK == WORLD - 1
    want = f"rank {WORLD - 1} of {WORLD}: " if not last else ""
    partial = {name: array for name, array in weights.items() if name != "o_proj.weight"} if last else weights
    with pytest.raises(ValueError, match=f"{want}.*o_proj.weight"):
        cfg.load_state_dict(partial)
    with pytest.raises(TypeError, match=f"{want}num_threads"):
        cfg.num_threads = "two" if last else 1
    with pytest.raises(ValueError, match=f"{want}mla_naive: applies to MLA configs"):
        cfg.mla_naive = last
    with pytest.raises(ValueError, match=f"{want}new_max_positions"):
        cfg.extend_context(-1 if last else 512)
    cfg.num_threads = 1 + RANK % 2     # each rank its own count: still one collective rebuild
    x = inputs(9, 1, 5, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_another_layer_of_a_state_dict_on_one_rank():
    """A whole model's state dict with layer=N: a rank taking another layer would pack its
    rows of other weights (it ran, each rank's share of another layer summed). Refused on
    every rank naming layer, as a checkpoint's layer_index is; the config keeps its weights."""
    whole, cfg, weights = sharded_with_weights(24)
    model = {f"model.layers.{layer}.self_attn.{name}": value * (layer + 1)
             for layer in (0, 1) for name, value in weights.items()}
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"^layer: rank {WORLD - 1} of {WORLD} passes 1, rank 0 0: "):
        cfg.load_state_dict(model, layer=1 if RANK == WORLD - 1 else 0)
    x = inputs(25, 1, 5, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
    cfg.load_state_dict(model, layer=0)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6


def test_two_threads_on_one_sharded_config():
    """One LLMConfig may be used from several threads: on a shard, each call pairs whole with
    one of the other ranks' (they used to interleave their records and sums: wrong outputs,
    MPI errors). A call paired with the other thread's on another rank is refused there,
    naming hidden_states (the shapes differ); every other returns the whole layer's output."""
    import threading
    cfg, whole = small(), small()
    cfg.tensor_parallel(COMM)
    xs = [inputs(26, 1, 40, 128), inputs(27, 1, 200, 128)]   # 200 tokens: sums in several chunks
    wants = [whole.forward_mha(x) for x in xs]
    failures = []

    def calls(i):
        for _ in range(100):
            try:
                got = cfg.forward_mha(xs[i])
                if error(got, wants[i]) > 1e-6:
                    failures.append(f"thread {i}: error {error(got, wants[i]):.3g}")
            except sneppx.InvalidArgumentError as refused:
                if not str(refused).startswith("hidden_states: rank "):
                    failures.append(f"thread {i}: {refused}")
            except Exception as other:   # an MPI error, a CommError: reported below
                failures.append(f"thread {i}: {type(other).__name__}: {other}")

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert error(cfg.forward_mha(xs[1]), wants[1]) <= 1e-6


def test_not_a_communicator():
    with pytest.raises(TypeError, match="comm: expected an mpi4py communicator"):
        small().tensor_parallel("MPI_COMM_WORLD")


class _BadHandle:
    """Looks like an mpi4py communicator, but its Fortran handle names none."""
    def py2f(self):
        return 1 << 30

    def Get_size(self):
        return 1

    def Get_rank(self):
        return 0


@pytest.mark.parametrize("comm, message", [(MPI.COMM_NULL, "comm: MPI_COMM_NULL"),
                                           (_BadHandle(), "comm: Fortran handle 1073741824 is not a communicator")])
def test_a_communicator_that_is_none(comm, message):
    """Refused by this rank alone (no collective call was made), named once, and the process
    lives on (an invalid handle used to reach MPI, whose default error handler aborts); the
    config stays whole."""
    cfg = small()
    x = inputs(3, 1, 4, 128)
    want = cfg.forward_mha(x)
    with pytest.raises(sneppx.CommError, match=f"^{message}$"):
        cfg.tensor_parallel(comm)
    assert "tensor_parallel" not in cfg.weights_source
    assert error(cfg.forward_mha(x), want) == 0.0


def test_the_callers_communicator_may_be_freed():
    """The layer holds its own duplicate of comm: after the caller frees theirs, the layer
    still runs and describes itself (repr, weights_source) without asking comm anything."""
    cfg = small()
    whole = small()
    comm = COMM.Dup()
    cfg.tensor_parallel(comm)
    comm.Free()
    assert cfg.weights_source.endswith(f"tensor_parallel(rank {RANK} of {WORLD})")
    assert "tensor_parallel" in repr(cfg)
    x = inputs(4, 1, 5, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
    # A load needs comm: refused naming it (it was mpi4py's bare MPI_ERR_COMM), nothing changed.
    with pytest.raises(sneppx.CommError, match="^comm: the communicator given to tensor_parallel\\(\\) was freed"):
        cfg.load_state_dict(random_state_dict(cfg, 3))
    with pytest.raises(sneppx.CommError, match="^comm: "):
        cfg.num_threads = 1
    assert "synthetic" in cfg.weights_source
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_a_row_the_cache_lacks_on_one_rank():
    """forward_ragged's row check raises IndexError: that rank still takes part in the
    call, so the others fail with its message instead of waiting for it, and no row grows."""
    cfg = small()
    cfg.tensor_parallel(COMM)
    cache = cfg.kv_cache(batch=1, max_tokens=16)
    last = RANK == WORLD - 1
    x = inputs(11, 3, 128)
    with pytest.raises(IndexError if last else ValueError,
                       match=f"{'' if last else f'rank {WORLD - 1} of {WORLD}: '}rows\\[0\\]: 5 is not a row of this cache"):
        cfg.forward_ragged(cache, [5 if last else 0], [x])
    assert cache.lengths == [0]
    got = cfg.forward_ragged(cache, [0], [x])[0]
    assert error(got, small().forward_mha(x[None])[0]) <= 1e-6
    assert cache.lengths == [3]


def test_int8_groups():
    """int8 weights: a shard's o_proj groups of 32 input features start at its own first
    column. Where every rank's columns are a multiple of 32 (head_dim 64) they are the
    whole layer's groups and the outputs agree within 1e-6; where they are not (2 heads
    of 80 over 2 ranks: the whole layer's group of columns 64..95 is cut) the shard
    quantizes by its own groups, as accurate against float32 as the whole int8 layer
    but not equal to it (measured 4.6e-3 apart, each 6.6e-3 / 6.8e-3 from float32)."""
    for head_dim in (64, 80):
        fields = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim)
        reference, whole, cfg = small(**fields), small(**fields), small(**fields)
        weights = random_state_dict(reference, 12)
        reference.load_state_dict(weights)
        whole.load_state_dict(weights, dtype="int8")
        cfg.tensor_parallel(COMM)
        cfg.load_state_dict(weights, dtype="int8")
        x = inputs(13, 2, 9, 64)
        got, want, exact = cfg.forward_mha(x), whole.forward_mha(x), reference.forward_mha(x)
        if head_dim == 64 or WORLD == 1:
            assert error(got, want) <= 1e-6
        else:
            assert error(got, exact) <= 1.5 * error(want, exact)
            assert error(got, exact) <= 2e-2


# A ragged call that differs on the last rank only where the totals and positions cannot
# show it: (rows, q_lens, position_ids) on the last rank and on the others, and the message.
RAGGED_DIFFERENCES = {
    # The same tokens and positions in all, split otherwise between the rows: each rank
    # would cache other tokens per row, and the call return a sum of two different calls.
    "q_lens": (([0, 1], [3, 1], [[2, 3, 4], [5]]), ([0, 1], [1, 3], [[2], [3, 4, 5]]),
               "q_lens: rank {last} of {world}'s differ from rank 0's \\(4 tokens in all on each\\)"),
    # The same rows with the same lengths in another order: each rank would cache one
    # row's tokens in the other row.
    "seq_ids": (([1, 0], [1, 1], None), ([0, 1], [1, 1], None),
                "seq_ids: rank {last} of {world}'s differ from rank 0's \\(2 sequences on each\\)"),
}


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
@pytest.mark.parametrize("name", sorted(RAGGED_DIFFERENCES))
def test_ragged_call_that_differs_on_one_rank(name):
    """Refused on every rank, naming the argument, and no row grows or changes (it used to
    run); the next call still gives the whole layer's output."""
    last_call, other_call, message = RAGGED_DIFFERENCES[name]
    rows, q_lens, positions = last_call if RANK == WORLD - 1 else other_call
    cfg, whole = small(), small()
    cfg.tensor_parallel(COMM)
    cache, whole_cache = cfg.kv_cache(batch=2, max_tokens=16), whole.kv_cache(batch=2, max_tokens=16)
    x = inputs(14, 2, 2, 128)
    cfg.forward_mha(x, past_key_value=cache)
    whole.forward_mha(x, past_key_value=whole_cache)
    before = [cache.read(row) for row in (0, 1)]
    y = inputs(15, sum(q_lens), 128)
    chunks = np.split(y, np.cumsum(q_lens)[:-1])
    with pytest.raises(sneppx.InvalidArgumentError, match=message.format(last=WORLD - 1, world=WORLD)):
        cfg.forward_ragged(cache, rows, chunks, position_ids=positions)
    assert cache.lengths == [2, 2]
    for row, (k, v) in enumerate(before):
        got_k, got_v = cache.read(row)
        assert np.array_equal(got_k, k) and np.array_equal(got_v, v)
    z = inputs(16, 2, 1, 128)
    assert error(cfg.forward_mha(z, past_key_value=cache), whole.forward_mha(z, past_key_value=whole_cache)) <= 1e-6


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_another_weight_dtype_on_one_rank():
    """A load with another dtype on one rank: every rank's create refuses, naming the
    dtypes (they used to be their enum values, "weight_dtype 3 / 0"), and the config
    keeps its weights and dtype."""
    whole, cfg, weights = sharded_with_weights(17)
    last = RANK == WORLD - 1
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"config: rank {WORLD - 1} of {WORLD}'s differs from rank 0's: weight_dtype int8 / "
                             f"float32 \\(rank {WORLD - 1} / rank 0\\)"):
        cfg.load_state_dict(weights, dtype="int8" if last else "float32")
    assert cfg.weight_dtype == "float32"
    x = inputs(18, 1, 5, 128)
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_another_cache_dtype_on_one_rank():
    """A cache of another dtype on one rank would sum heads rounded two ways (it ran, about
    4e-3 from the whole layer): refused on every rank, naming both dtypes, and no row of
    either cache grows."""
    whole, cfg = small(), small()
    cfg.tensor_parallel(COMM)
    last = RANK == WORLD - 1
    cache = cfg.kv_cache(1, max_tokens=16, dtype="bfloat16" if last else "float32")
    x = inputs(19, 1, 4, 128)
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"cache: rank {WORLD - 1} of {WORLD}'s holds bfloat16, rank 0's float32: "):
        cfg.forward_mha(x, past_key_value=cache)
    assert cache.lengths == [0]
    same = cfg.kv_cache(1, max_tokens=16, dtype="bfloat16")
    whole_cache = whole.kv_cache(1, max_tokens=16, dtype="bfloat16")
    assert error(cfg.forward_mha(x, past_key_value=same), whole.forward_mha(x, past_key_value=whole_cache)) <= 1e-6


def causal_plane(batch, q_len, past=0):
    keys = past + q_len
    plane = np.where(np.arange(keys)[None, :] <= past + np.arange(q_len)[:, None], 0.0, -np.inf)
    return np.broadcast_to(plane.astype(np.float32), (batch, 1, q_len, keys)).copy()


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_a_mask_that_differs_on_one_rank():
    """Each rank attends with its own mask, so masks that differ would sum two calls: refused
    on every rank, for forward_mha and for a cached forward (whose cache keeps its rows); the
    same entries given as one broadcast plane on one rank and a plane per row on another
    agree."""
    whole, cfg = small(), small()
    cfg.tensor_parallel(COMM)
    last = RANK == WORLD - 1
    x = inputs(20, 2, 6, 128)
    mask = causal_plane(2, 6)
    given = mask[:1] if last else mask   # [1, 1, 6, 6] broadcast on one rank
    assert error(cfg.forward_mha(x, attention_mask=given), whole.forward_mha(x, attention_mask=mask)) <= 1e-6
    other = mask.copy()
    if last:
        other[1, 0, 5, 0] = -np.inf      # one more hidden key, in the second row only
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"attention_mask: rank {WORLD - 1} of {WORLD}'s entries differ from rank 0's: "):
        cfg.forward_mha(x, attention_mask=other)

    cache = cfg.kv_cache(2, max_tokens=16)
    cfg.forward_mha(x, past_key_value=cache)
    step = inputs(21, 2, 1, 128)
    plane = causal_plane(2, 1, past=6)
    if last:
        plane[0, 0, 0, 2] = -np.inf
    # Named as forward_mha's argument, not as the C call's masks.
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"^attention_mask: rank {WORLD - 1} of {WORLD}'s entries differ from rank 0's: "):
        cfg.forward_mha(step, attention_mask=plane, past_key_value=cache)
    assert cache.lengths == [6, 6]
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=f"^attention_mask: rank {WORLD - 1} of {WORLD} passes one, rank 0 none: "):
        cfg.forward_mha(step, attention_mask=plane if last else None, past_key_value=cache)
    # A plane one rank's C call refuses (it shows a token the window released): the others
    # name it as forward_mha's argument too.
    windowed = small(sliding_window=4)
    windowed.tensor_parallel(COMM)
    cache = windowed.kv_cache(2, max_tokens=16, page_size=2)
    windowed.forward_mha(x, past_key_value=cache)   # 6 tokens: the first page goes
    window = np.where(np.arange(7) >= 3, 0.0, -np.inf).astype(np.float32)
    plane = np.broadcast_to(np.zeros(7, np.float32) if last else window, (2, 1, 1, 7))
    want = "" if last else f"rank {WORLD - 1} of {WORLD}: "
    with pytest.raises(sneppx.InvalidArgumentError, match=f"^{want}attention_mask\\[0\\]: row 0 lets the query"):
        windowed.forward_mha(step, attention_mask=plane, past_key_value=cache)
    assert cache.lengths == [6, 6]


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_hidden_states_that_differ_on_one_rank():
    """Each rank projects its heads of the input it is given: inputs that differ would sum
    two layers' halves. Refused on every rank, for forward_mha and a cached step (the
    cache keeps its rows)."""
    cfg = small()
    cfg.tensor_parallel(COMM)
    x = inputs(22, 1, 3, 128)
    if RANK == WORLD - 1:
        x[0, 2, 7] += 1e-3
    want = f"hidden_states: rank {WORLD - 1} of {WORLD}'s differ from rank 0's: "
    with pytest.raises(sneppx.InvalidArgumentError, match=want):
        cfg.forward_mha(x)
    cache = cfg.kv_cache(1, max_tokens=8)
    with pytest.raises(sneppx.InvalidArgumentError, match=want):
        cfg.forward_mha(x, past_key_value=cache)
    assert cache.lengths == [0]
    x[0, 2, 7] = -0.0 if RANK == 0 else 0.0   # the same value
    cfg.forward_mha(x, past_key_value=cache)
    assert cache.lengths == [3]
    # Two sign flips, each in a float whose bits a 64-bit hash step takes as its top
    # half: FNV's multiply alone carried both differences into bit 63 only, where they
    # cancelled, and the call ran (0.18 from the whole layer).
    y = inputs(23, 1, 3, 128)
    if RANK == WORLD - 1:
        y[0, 0, 0], y[0, 1, 2] = -y[0, 0, 0], -y[0, 1, 2]
    with pytest.raises(sneppx.InvalidArgumentError, match=want):
        cfg.forward_mha(y)


_AFTER_FINALIZE = """
import numpy as np
from mpi4py import MPI
import sneppx
fields = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_threads=1)
cfg, other = sneppx.LLMConfig(**fields), sneppx.LLMConfig(**fields)
cfg.tensor_parallel(MPI.COMM_WORLD)
MPI.Finalize()
calls = {"forward_mha": lambda: cfg.forward_mha(np.ones((1, 3, 128), np.float32)),
         "a setter": lambda: setattr(cfg, "num_threads", 1),
         "tensor_parallel": lambda: other.tensor_parallel(MPI.COMM_WORLD)}
for what, call in calls.items():
    try:
        call()
        print(what, "returned")
    except sneppx.CommError as error:
        print(what, "CommError", error)
"""


def test_after_mpi_finalize():
    """After MPI.Finalize() every MPI call aborts the process (mpi4py's own py2f and
    allgather too): a forward, a setter that rebuilds and tensor_parallel() raise CommError
    instead, and the layer is destroyed at exit without MPI. Run in a process of its own,
    an MPI singleton (this one's MPI must stay up for the other tests)."""
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_"))}
    done = subprocess.run([sys.executable, "-c", _AFTER_FINALIZE], env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["forward_mha CommError shard transport: allgather failed: MPI is finalized (destroy sharded "
                     "layers before MPI_Finalize)"] + [
        f"{what} CommError comm: MPI is finalized (MPI.Finalize() was called); a tensor-parallel layer needs MPI "
        "running" for what in ("a setter", "tensor_parallel")], done.stdout + done.stderr


@pytest.mark.skipif(WORLD == 1, reason="needs another rank")
def test_out_of_memory_in_python_on_one_rank(monkeypatch):
    """A MemoryError in Python's own work on one rank (converting hidden_states, copying a
    state dict: ranks on machines with less free memory) is that rank's verdict like a bad
    argument: the others raise OutOfMemoryError "rank R of W: ..." instead of waiting in
    the call for it forever, and the layer and the cache stay as they were."""
    whole, cfg, weights = sharded_with_weights(12)
    last = RANK == WORLD - 1
    want = f"rank {WORLD - 1} of {WORLD}: " if not last else ""
    x = inputs(13, 1, 4, 128)
    cache = cfg.kv_cache(batch=1, max_tokens=16)

    def no_memory(*args, **kwargs):
        raise MemoryError("no memory for the copy")
    if last:
        monkeypatch.setattr(sneppx.config, "hidden_states_array", no_memory)
        monkeypatch.setattr(sneppx.config, "StateDictWeights", no_memory)
    with pytest.raises(MemoryError, match=f"^{want}no memory for the copy$"):
        cfg.forward_mha(x)
    with pytest.raises(MemoryError, match=f"^{want}no memory for the copy$"):
        cfg.forward_mha(x, past_key_value=cache)
    with pytest.raises(MemoryError, match=f"^{want}no memory for the copy$"):
        cfg.load_state_dict(random_state_dict(cfg, 14))
    monkeypatch.undo()
    # The output arrays too (as big as the input): allocated before the C call.
    if last:
        monkeypatch.setattr(np, "empty_like", no_memory)
    with pytest.raises(MemoryError, match=f"^{want}no memory for the copy$"):
        cfg.forward_mha(x)
    with pytest.raises(MemoryError, match=f"^{want}no memory for the copy$"):
        cfg.forward_mha(x, past_key_value=cache)
    with pytest.raises(MemoryError, match=f"^{want}no memory for the copy$"):
        cfg.forward_ragged(cache, [0], [x[0]])
    monkeypatch.undo()
    assert cache.lengths == [0]
    assert error(cfg.forward_mha(x), whole.forward_mha(x)) <= 1e-6
