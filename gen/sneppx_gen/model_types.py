"""The HF config.json model types sneppx reads, and how each gives its attention fields.

The one list: gen's reader (config_json.py) reads it here, and `sneppx-gen build
model-types` renders it into libsneppx's table (runtime/model_types.h), which
runtime/config_json.c reads, with the list its messages name. A rule not yet known
(a new `bias` or `window` value) needs its code in both readers; the C build fails
on it until runtime/model_types.h has its constant.
"""
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class ModelType:
    name: str                    # config.json's model_type
    default_max_positions: int   # the transformers config class's default max_position_embeddings
    bias: str                    # "attention_bias" (q/k/v and o together, default false), "none",
                                 # "qkv" (q/k/v on, o off: Qwen2Attention hard-codes it)
    window: str                  # "sliding_window" (read), "use_sliding_window" (true refused when
                                 # a layer slides by Qwen2Config's rule), "none"
    mla: bool = False            # DeepSeek's MLA fields (required) and interleaved RoPE pairs
    # The config class's defaults of two fields a file may leave out (absent, not null):
    # num_key_value_heads (0: num_attention_heads, as a null gives) and, for the
    # "sliding_window" rule, sliding_window (a null is no window).
    default_kv_heads: int = 0
    default_window: int = 0
    # MLA: q_lora_rank when the file leaves it out (a null is 0, the plain q_proj).
    default_q_lora_rank: int = 0

    @property
    def c_bias(self) -> str:
        return f"SNEPPX_MODEL_BIAS_{self.bias.upper()}"

    @property
    def c_window(self) -> str:
        return f"SNEPPX_MODEL_WINDOW_{self.window.upper()}"


MODEL_TYPES: Tuple[ModelType, ...] = (
    ModelType("llama", 2048, "attention_bias", "none"),
    ModelType("mistral", 131072, "none", "sliding_window", default_kv_heads=8, default_window=4096),
    ModelType("qwen2", 32768, "qkv", "use_sliding_window", default_kv_heads=32),
    ModelType("deepseek_v2", 2048, "attention_bias", "none", mla=True, default_q_lora_rank=1536),
)

# "llama, mistral, ...": the supported list both readers' messages give.
MODEL_TYPE_LIST = ", ".join(t.name for t in MODEL_TYPES)
