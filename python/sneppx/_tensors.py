"""torch tensors in and out, without importing or depending on torch.

A torch tensor is recognized by its class (torch.Tensor or a subclass, such as
nn.Parameter) and read on the CPU through .detach().numpy(), which shares its
memory: a contiguous float32 tensor reaches the C runtime with no copy, and no
autograd graph is recorded (gradients do not flow through sneppx). A result goes
back as torch.from_numpy() of the result array, which shares it too. torch is
imported only then, when a torch tensor came in (so it is loaded already).
"""
import importlib
from typing import Any

import numpy as np


def is_torch_tensor(value: Any) -> bool:
    """value is a torch.Tensor (or of a subclass), told by its class, not by importing torch."""
    return any(cls.__name__ == "Tensor" and cls.__module__ == "torch" for cls in type(value).__mro__)


def torch_array(name: str, tensor: Any) -> np.ndarray:
    """A CPU tensor's elements as a numpy array sharing its memory (its strides kept); bfloat16,
    which numpy lacks, as its bits (uint16). A tensor on another device raises ValueError,
    one numpy cannot view (sparse, ...) TypeError, both naming the argument."""
    device = tensor.device
    if device.type != "cpu":
        raise ValueError(f"{name}: a tensor on {device}; sneppx computes on the CPU (move it there with .cpu())")
    tensor = tensor.detach().resolve_conj().resolve_neg()   # views of lazily negated data are materialized
    try:
        if str(tensor.dtype) == "torch.bfloat16":
            return tensor.view(_torch().int16).numpy().view(np.uint16)
        return tensor.numpy()
    except (TypeError, RuntimeError) as error:
        raise TypeError(f"{name}: cannot read this {tensor.dtype} tensor as an array ({error})") from None


def _torch() -> Any:
    """The torch module: only called once a torch tensor exists, so importing it is a lookup."""
    return importlib.import_module("torch")


def as_torch(result: np.ndarray) -> Any:
    """result as a torch tensor sharing its memory."""
    return _torch().from_numpy(result)


def output_like(value: Any, result: np.ndarray) -> Any:
    """result as value's kind: a torch tensor sharing result's memory when value is a torch
    tensor, else result itself."""
    return as_torch(result) if is_torch_tensor(value) else result
