"""sneppx-gen's reader of config files, with the runtime's rules and messages.

The runtime reads an HF config.json with sneppx_config_from_json
(runtime/config_json.c) and checks every config with sneppx_config_validate
(runtime/config.c). sneppx-gen cannot call them: it runs at build time, before
libsneppx exists (it renders the preset table libsneppx compiles), and its
vendored output must not need libsneppx. So this module is their Python mirror:
the same model types, rope_scaling types and keys, defaults, ranges, RoPE
arithmetic (templates/rope_freqs.c.j2) and the same messages, so that a file
the runtime refuses is refused here with the words the sneppx package uses
("FILE: FIELD: ..."). tests/python/test_gen_config.py checks both agree.

Two forms are read:
- an HF config.json (it has "model_type"): exactly as sneppx_config_from_json;
- sneppx's hand-config form (no "model_type"; also gen/archs.json's presets):
  the keyword arguments of sneppx.LLMConfig (HF names plus "bias", "qkv_bias",
  "o_bias", "rope_interleaved", "use_flash_attn", the aliases "num_heads" and
  "num_kv_heads") and "rotary_dim", with the defaults of sneppx_config_init() and
  the same type rules, plus the presets' informational keys (HAND_INFORMATIONAL);
  any other key is refused.
Both are checked by validate(), the mirror of sneppx_config_validate. sneppx-gen's own
"name" key (either form) names the output: read_name().
"""
import json
import math
import os
import re
import stat
import struct
import sys
from dataclasses import make_dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import config_fields, limits, model_types
from .echo import clip


class ConfigError(ValueError):
    """A config sneppx cannot run; the message names the field (and the file, from load_text)."""


# CONFIG_JSON_MAX_BYTES of runtime/config_json.c, and cJSON's CJSON_NESTING_LIMIT.
MAX_BYTES = 16 << 20
NESTING_LIMIT = 1000
# JSON numbers are doubles: larger integers are not exact (JSON_EXACT_INT_MAX).
EXACT_INT_MAX = 9007199254740992.0

# ---- tables ------------------------------------------------------------------

# sneppx_rope_type by HF name; the dict's keys, and which each type requires, are config_fields'.
ROPE_TYPES = {name: value for value, name in enumerate(config_fields.ROPE_TYPES)}

# The model types, by name (model_types.py).
MODEL_TYPES = {t.name: t for t in model_types.MODEL_TYPES}

# ---- the config, as the C struct holds it ---------------------------------------

# sneppx_rope_scaling and sneppx_config after sneppx_config_init(), field by field (config_fields).
RopeFields = make_dataclass("RopeFields", config_fields.dataclass_fields(config_fields.ROPE_SCALING_FIELDS, object),
                            frozen=True)
CConfig = make_dataclass("CConfig", config_fields.dataclass_fields(config_fields.CONFIG_FIELDS, RopeFields))


# ---- JSON, as cJSON sees it -------------------------------------------------------

class JsonObject:
    """A JSON object with every member kept in order, duplicates included (cJSON keeps them;
    lookup() refuses a duplicated key it is asked for). Keys end at a NUL, as C strings do."""

    def __init__(self, pairs: List[Tuple[str, Any]]):
        self.pairs = [(key.split("\0", 1)[0], value) for key, value in pairs]

    def first(self, key: str) -> Tuple[bool, Any]:
        for name, value in self.pairs:
            if name == key:
                return True, value
        return False, None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _max_depth(text: str) -> int:
    """The deepest nesting of arrays and objects (strings skipped)."""
    depth = deepest = 0
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text, re.S):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


# cJSON's lexicon where it is wider than Python's json: a number is what strtod reads
# from a run starting with '-' or a digit ("01", "1.", "-.5"); every byte <= 0x20
# between tokens is whitespace; raw control characters may stand in strings; a
# UTF-8 BOM may open the text. It is narrower on one point: a \\u escape of half
# a surrogate pair is an error.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?:-(?:\d+\.?\d*|\.\d+)|\d+\.?\d*)(?:[eE][+-]?\d+)?|[\x00-\x20]+|.',
                    re.S)
_PYTHON_NUMBER = re.compile(r'-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?\Z')
_ESCAPE = re.compile(r'\\(?:u([0-9a-fA-F]{4})|.)', re.S)
_JSON_SPACE = " \t\n\r"
# What runtime/json_text.c refuses before cJSON parses: a NUL byte, a \\u escape that is not
# four hex digits or is \\u0000 (cJSON would end a key or value there). Other escapes are
# matched only to be stepped over, as the C scan steps over them.
_BAD_TEXT = re.compile(rb'(?P<bad>\x00|\\u(?:0000|(?![0-9a-fA-F]{4})))|\\.', re.S)


def _check_surrogates(string: str) -> None:
    pending_high, last_end = False, -1
    for match in _ESCAPE.finditer(string):
        unit = int(match.group(1), 16) if match.group(1) else None
        if pending_high and (unit is None or not 0xDC00 <= unit <= 0xDFFF or match.start() != last_end):
            raise ValueError("half a surrogate pair")
        if unit is not None and 0xDC00 <= unit <= 0xDFFF and not pending_high:
            raise ValueError("half a surrogate pair")
        pending_high = unit is not None and 0xD800 <= unit <= 0xDBFF
        last_end = match.end()
    if pending_high:
        raise ValueError("half a surrogate pair")


def _as_python_json(text: str) -> Tuple[str, List[int]]:
    """text in Python json's lexicon, and where cJSON-only whitespace stood (positions in the result)."""
    out, odd_space, at = [], [], 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            _check_surrogates(token)
        elif token[0] == "-" or token[0].isdigit():
            if not _PYTHON_NUMBER.match(token):
                value = float(token)
                token = "1e999" if value == math.inf else "-1e999" if value == -math.inf else repr(value)
        elif token[0] <= " " and any(c not in _JSON_SPACE for c in token):
            odd_space.extend(range(at, at + len(token)))
            token = " " * len(token)
        out.append(token)
        at += len(token)
    return "".join(out), odd_space


def parse(data: bytes) -> JsonObject:
    """The top-level object of a config file's bytes, with the runtime's refusals. Raises
    ConfigError with the runtime's message (without the file)."""
    if len(data) > MAX_BYTES:
        raise ConfigError(f"more than {MAX_BYTES} bytes, the most a config.json may have")
    for match in _BAD_TEXT.finditer(data):
        if match.group("bad") is not None:
            raise ConfigError(f"not valid JSON, or a NUL in a string (at byte {match.start()}: a NUL, a \\u escape "
                              "that is not four hex digits, or \\u0000)")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    text = data.decode("utf-8", "surrogateescape")
    if _max_depth(text) > NESTING_LIMIT:
        raise ConfigError(f"not valid JSON (nested deeper than {NESTING_LIMIT} levels)")
    limit = sys.getrecursionlimit()
    try:
        text, odd_space = _as_python_json(text)
        start = len(text) - len(text.lstrip(_JSON_SPACE))
        # json recurses per level: room for cJSON's NESTING_LIMIT levels above the caller's frames.
        sys.setrecursionlimit(max(limit, NESTING_LIMIT + 500))
        # Integers as doubles (what cJSON holds); NaN / Infinity are not JSON; control characters
        # may stand in strings.
        decoder = json.JSONDecoder(object_pairs_hook=JsonObject, parse_int=float, parse_constant=_reject_constant,
                                   strict=False)
        root, end = decoder.raw_decode(text, start)
    except json.JSONDecodeError as error:
        raise ConfigError(f"not valid JSON (at byte {len(text[:error.pos].encode('utf-8', 'surrogateescape'))})") \
            from None
    except (ValueError, RecursionError):
        raise ConfigError("not valid JSON") from None
    finally:
        sys.setrecursionlimit(limit)
    odd = set(odd_space)
    for at in range(end, len(text)):
        if text[at] not in _JSON_SPACE or at in odd:
            raise ConfigError(f"bytes after the JSON object (at byte {len(text[:at].encode('utf-8', 'surrogateescape'))})")
    if not isinstance(root, JsonObject):
        raise ConfigError("not a JSON object")
    return root


def _is_number(value: Any) -> bool:
    return isinstance(value, float)


def float32(value: float) -> float:
    """C's (float)value: the nearest float32, inf past its range (struct refuses those on
    some Pythons)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _g(value: float) -> str:
    """printf's %g, which (unlike format) writes a NaN's sign: the x86 NaN of an invalid
    operation (inf - inf) is negative, and glibc prints it "-nan"."""
    if math.isnan(value) and math.copysign(1.0, value) < 0:
        return "-nan"
    return f"{value:g}"


def describe(value: Any) -> str:
    """What a field held, as runtime/config_json.c's describe() says it."""
    if _is_number(value):
        return f"{value:.17g}"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return f'the string "{clip(value, 32)}"'
    if isinstance(value, list):
        return "an array"
    if isinstance(value, JsonObject):
        return "an object"
    return "null"


class Scope:
    """One JSON object being read; prefix names it in messages ("", "rope_scaling.")."""

    def __init__(self, obj: JsonObject, prefix: str):
        self.obj, self.prefix = obj, prefix

    def fail(self, key: str, what: str, got: Any) -> ConfigError:
        return ConfigError(f"{self.prefix}{key}: expected {what}, got {describe(got)}")

    def lookup(self, key: str) -> Any:
        """The member's value, None when absent or null; a key given twice is an error."""
        found = [value for name, value in self.obj.pairs if name == key]
        if len(found) > 1:
            raise ConfigError(f"{self.prefix}{key}: appears {len(found)} times")
        return found[0] if found else None

    def size(self, key: str, fallback: int) -> int:
        value = self.lookup(key)
        if value is None:
            return fallback
        if not _is_integer(value) or value < 0:
            raise self.fail(key, "a non-negative integer", value)
        return int(value)

    def required_size(self, key: str) -> int:
        if self.lookup(key) is None:
            raise ConfigError(f"{self.prefix}{key}: missing")
        return self.size(key, 0)

    def real(self, key: str, fallback: float) -> float:
        value = self.lookup(key)
        if value is None:
            return fallback
        if not _is_number(value) or not math.isfinite(value):
            raise self.fail(key, "a finite number", value)
        return value

    def flag(self, key: str, fallback: int) -> int:
        value = self.lookup(key)
        if value is None:
            return fallback
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return int(value)

    def switch(self, key: str, fallback: int) -> int:
        """A flag of the hand form: true / false, or 0 / 1 as LLMConfig's keywords take it."""
        value = self.lookup(key)
        if value is None:
            return fallback
        if isinstance(value, bool) or (_is_number(value) and value in (0, 1)):
            return int(value)
        raise self.fail(key, "true or false (or 0 / 1)", value)

    def string(self, key: str) -> Optional[str]:
        value = self.lookup(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value.split("\0", 1)[0]


def _is_integer(value: Any) -> bool:
    return _is_number(value) and abs(value) <= EXACT_INT_MAX and value == math.floor(value)


# ---- the name ----------------------------------------------------------------------------

# A config's name ends up in file names, C symbols and comments of generated code and in
# log lines, so it holds only characters inert in all of them: the rule of runtime/config.c
# validate_name, at most SNEPPX_NAME_MAX - 1 bytes. It is sneppx-gen's own key, read in both
# forms (the runtime's reader names a config after its model_type).
NAME_MAX_BYTES = 63
NAME_CHARACTERS = "A-Z a-z 0-9 . _ -"
_NAME_CHARACTER = re.compile(r"[A-Za-z0-9._-]")


def name_problem(name: str) -> Optional[str]:
    """Why name is not a valid config name, or None (empty is valid: no name)."""
    data = name.encode("utf-8", "surrogatepass")
    if len(data) > NAME_MAX_BYTES:
        return f"{len(data)} bytes, more than {NAME_MAX_BYTES}"
    for at, byte in enumerate(data):
        if not _NAME_CHARACTER.fullmatch(chr(byte)):
            return f"byte {at} (0x{byte:02x}) is not one of {NAME_CHARACTERS}"
    return None


def derived_name(text: str) -> str:
    """A name made of a file's name: other characters become '_', clipped to NAME_MAX_BYTES."""
    name = "".join(c if _NAME_CHARACTER.fullmatch(c) else "_" for c in text)[:NAME_MAX_BYTES]
    return name or "custom"


def read_name(root: JsonObject, fallback: str) -> str:
    """The file's "name" (absent, null or "": derived_name(fallback)). Raises ConfigError
    naming the field for a name that breaks the rule: it is refused, never repaired."""
    top = Scope(root, "")
    value = top.lookup("name")
    if value is None or value == "":
        return derived_name(fallback)
    if not isinstance(value, str):
        raise top.fail("name", "a string", value)
    problem = name_problem(value)
    if problem:
        raise ConfigError(f"name: {problem}")
    return value


# ---- rope_scaling ------------------------------------------------------------------

# transformers 5's rope_parameters keys that are not rope_scaling's (read_rope reads them).
ROPE_CONFIG_KEYS = ("rope_theta", "partial_rotary_factor")


def read_rope_scaling(top: Scope, key: str = "rope_scaling") -> RopeFields:
    """runtime/config_json.c read_rope_scaling_value, of the dict top holds at key."""
    raw = top.lookup(key)
    if raw is None:
        return RopeFields()
    if not isinstance(raw, JsonObject):
        raise top.fail(key, "an object or null", raw)
    scope = Scope(raw, f"{key}.")
    extra = ROPE_CONFIG_KEYS if key == "rope_parameters" else ()
    try:
        rope_type, type_, type_error = scope.string("rope_type"), scope.string("type"), None
    except ConfigError as error:
        rope_type, type_, type_error = None, None, error
    name = rope_type if rope_type is not None else type_
    # As the runtime: a type given but not supported before the keys (its own keys, such as
    # longrope's long_factor, would name a key), a mistyped or missing one after them (a
    # per-layer dict is named by its unknown key).
    if name is not None and (rope_type is None or type_ is None or rope_type == type_) and name not in ROPE_TYPES:
        raise ConfigError(f"{key}.rope_type: '{clip(name)}' is not supported "
                          f"(supported: {', '.join(ROPE_TYPES)})")
    for field_name, _ in raw.pairs:
        if field_name not in config_fields.ROPE_KEYS + extra:
            raise ConfigError(f"{key}.{clip(field_name)}: unknown key "
                              f"(known: {', '.join(config_fields.ROPE_KEYS + extra)})")
    if type_error is not None:
        raise type_error
    if rope_type is not None and type_ is not None and rope_type != type_:
        raise ConfigError(f"{key}: rope_type '{clip(rope_type)}' and type "
                          f"'{clip(type_)}' disagree")
    if name is None:
        # transformers 5 reads a dict without a type as plain RoPE: so is one that holds nothing
        # else ({}, nulls, or rope_parameters' own rope_theta); a scaling parameter cannot be typed.
        for field_name, value in raw.pairs:
            if value is not None and field_name not in extra:
                raise ConfigError(f"{key}.rope_type: missing (nor is 'type' given), which "
                                  f"'{clip(field_name)}' needs")
        return RopeFields()
    for required in config_fields.rope_required(name):
        if scope.lookup(required) is None:
            raise ConfigError(f"{key}.{required}: missing (rope_type '{name}' needs it)")
    # YaRN without floor/ceil of the correction range is not implemented; an
    # absent or true "truncate" means floor/ceil (a null one does not).
    truncate = scope.lookup("truncate")
    if raw.first("truncate")[0] and truncate is not True:
        raise ConfigError(f"{key}.truncate: only true (YaRN with floor/ceil of the correction range) "
                          "is supported")
    # The real-valued parameters, then the integers (the order of the messages when several are wrong).
    values = {f.name: scope.real(f.name, config_fields.rope_absent(f, name))
              for f in config_fields.ROPE_PARAMETERS if f.c_type is config_fields.DOUBLE}
    for f in config_fields.ROPE_PARAMETERS:
        if f.c_type is config_fields.INT64:
            value = scope.lookup(f.name)
            if value is not None and not _is_integer(value):
                raise scope.fail(f.name, "an integer", value)
            values[f.name] = config_fields.rope_absent(f, name) if value is None else int(value)
    return RopeFields(type=ROPE_TYPES[name], **values)


def read_rope(top: Scope, c: CConfig) -> Any:
    """runtime/config_json.c read_rope: rope_theta and the scaling into c, from the top
    level or transformers 5's rope_parameters (a non-null, non-empty rope_scaling is taken in its
    place; its rope_theta and partial_rotary_factor win over the top-level ones); returns
    the partial_rotary_factor value (None when absent)."""
    scaling, parameters = top.lookup("rope_scaling"), top.lookup("rope_parameters")
    c.rope_theta = top.real("rope_theta", c.rope_theta)
    partial = top.lookup("partial_rotary_factor")
    # transformers takes `rope_scaling or rope_parameters`: an empty rope_scaling is none.
    if isinstance(scaling, JsonObject) and not scaling.pairs and parameters is not None:
        scaling = None
    if scaling is not None or parameters is None:
        c.rope_scaling = read_rope_scaling(top)
        return partial
    c.rope_scaling = read_rope_scaling(top, "rope_parameters")
    inner = Scope(parameters, "rope_parameters.")
    c.rope_theta = inner.real("rope_theta", c.rope_theta)
    inner_partial = inner.lookup("partial_rotary_factor")
    return partial if inner_partial is None else inner_partial


# ---- the two forms ---------------------------------------------------------------

def _read_partial_rotary(top: Scope, c: CConfig) -> None:
    """The hand form's partial_rotary_factor (LLMConfig's keyword): rotate int(head_dim * factor)."""
    if top.lookup("partial_rotary_factor") is None:
        return
    factor = top.real("partial_rotary_factor", 1.0)
    if c.kv_lora_rank > 0:   # as LLMConfig: the runtime reads rotary_dim only without MLA
        raise ConfigError(f"partial_rotary_factor: MLA (kv_lora_rank > 0) rotates the qk_rope_head_dim "
                          f"({c.qk_rope_head_dim}) dims of each head; give that instead")
    if not 0.0 < factor <= 1.0:
        raise ConfigError(f"partial_rotary_factor: {_g(factor)} must be in (0, 1]")
    heads = c.num_attention_heads if c.num_attention_heads > 0 else 1
    head_dim = c.head_dim if c.head_dim > 0 else c.hidden_size // heads
    c.rotary_dim = int(head_dim * factor)
    if c.rotary_dim < 2:
        raise ConfigError(f"partial_rotary_factor: {_g(factor)} of head_dim {head_dim} rotates no dimension pair")


def _refuse_partial_scaled_rope(factor: Any, c: CConfig) -> None:
    """runtime/config_json.c refuse_partial_scaled_rope (which says why)."""
    if _is_number(factor) and factor != 1.0 and c.rope_scaling.type != ROPE_TYPES["default"]:
        raise ConfigError(f"partial_rotary_factor: {_g(factor)} with rope_scaling "
                          f"'{config_fields.ROPE_TYPES[c.rope_scaling.type]}' is not supported (transformers "
                          "cannot run it: that RoPE covers part of each head, its attention the whole head)")


def _qwen2_slides(top: Scope) -> bool:
    """runtime/config_json.c qwen2_slides (which says why)."""
    types = top.lookup("layer_types")
    if types is not None:
        if not isinstance(types, list):
            raise top.fail("layer_types", "an array of strings", types)
        for item in types:
            if not isinstance(item, str):
                raise top.fail("layer_types", "an array of strings", item)
        return any(item.split("\0", 1)[0] != "full_attention" for item in types)
    window = top.lookup("sliding_window")
    layers, first_window = top.size("num_hidden_layers", 32), top.size("max_window_layers", 28)
    return (window is not None or not top.obj.first("sliding_window")[0]) and layers > first_window


def read_hf(root: JsonObject) -> CConfig:
    """runtime/config_json.c read_config: an HF config.json."""
    top = Scope(root, "")
    name = top.string("model_type")
    if name is None:
        raise ConfigError("model_type: missing")
    if name not in MODEL_TYPES:
        raise ConfigError(f"model_type: '{clip(name)}' is not supported (supported: "
                          f"{model_types.MODEL_TYPE_LIST})")
    kind = MODEL_TYPES[name]
    c = CConfig(name=name)
    c.hidden_size = top.required_size("hidden_size")
    c.num_attention_heads = top.required_size("num_attention_heads")
    # Absent (not null): the config class's default (Mistral's 8, Qwen2's 32), else num_attention_heads.
    absent = {key: not top.obj.first(key)[0] for key in ("num_key_value_heads", "sliding_window", "q_lora_rank")}
    c.num_key_value_heads = top.size("num_key_value_heads", kind.default_kv_heads
                                     if kind.default_kv_heads and absent["num_key_value_heads"]
                                     else c.num_attention_heads)
    partial = read_rope(top, c)
    c.max_position_embeddings = top.size("max_position_embeddings", kind.default_max_positions)
    if not kind.mla:  # DeepSeek's head dims are the MLA fields
        c.head_dim = top.size("head_dim", 0)
        _refuse_partial_scaled_rope(partial, c)
    if kind.bias == "attention_bias":
        c.qkv_bias = c.o_bias = top.flag("attention_bias", 0)
    elif kind.bias == "none":
        c.qkv_bias = c.o_bias = 0
    else:
        c.qkv_bias, c.o_bias = 1, 0
    if kind.window == "sliding_window":
        c.sliding_window = top.size("sliding_window", kind.default_window if absent["sliding_window"] else 0)
    elif kind.window == "use_sliding_window" and top.flag("use_sliding_window", 0) and _qwen2_slides(top):
        raise ConfigError("use_sliding_window: true (Qwen2 per-layer windows) is not supported")
    if kind.mla:
        # Absent: DeepseekV2Config's 1536; null: 0, the plain q_proj.
        c.q_lora_rank = top.size("q_lora_rank", kind.default_q_lora_rank if absent["q_lora_rank"] else 0)
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            setattr(c, key, top.required_size(key))
        c.rope_interleaved = 1  # the published weights rotate (x_2i, x_2i+1) pairs
    return c


# The hand form's sizes: every int64_t field, by its own name.
HAND_SIZES = tuple(f for f in config_fields.CONFIG_FIELDS if f.c_type is config_fields.INT64)
# sneppx.LLMConfig's aliases of two sizes (its constructor's num_heads / num_kv_heads).
HAND_ALIASES = {"num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads"}
# Keys of gen/archs.json's presets that describe the model to a reader but not the attention
# layer (the MLP's width, the norm's epsilon, the preset's names): accepted and not used.
HAND_INFORMATIONAL = ("family", "size", "aliases", "intermediate_size", "rms_norm_eps")
# Every key the hand form takes; another is a misspelling that would otherwise change
# nothing, silently ("sliding_windw": the layer would attend without a window).
HAND_KEYS = (tuple(f.name for f in config_fields.CONFIG_FIELDS) + tuple(HAND_ALIASES.values())
             + ("bias", "attention_bias", "partial_rotary_factor") + HAND_INFORMATIONAL)


def read_hand(root: JsonObject) -> CConfig:
    """sneppx's hand-config form: sneppx.LLMConfig's keyword arguments (+ rotary_dim)."""
    top = Scope(root, "")
    for key, _ in root.pairs:
        if key not in HAND_KEYS:
            raise ConfigError(f"{clip(key)}: unknown key (a config without model_type is "
                              f"sneppx.LLMConfig's keywords; known: {', '.join(HAND_KEYS)})")
    c = CConfig()
    for f in HAND_SIZES:
        alias = HAND_ALIASES.get(f.name)
        given = top.lookup(f.name)
        if alias is not None and top.lookup(alias) is not None:
            alias_value = top.size(alias, 0)
            if given is not None and top.size(f.name, 0) != alias_value:
                raise ConfigError(f"{f.name}: {describe(given)} and its alias {alias} "
                                  f"{alias_value} disagree")
            value = alias_value
        elif f.required:
            if alias is not None and given is None:
                raise ConfigError(f"{f.name} (or {alias}): missing")
            value = top.required_size(f.name)
        else:
            value = top.size(f.name, getattr(c, f.default_from) if f.default_from else f.default)
        setattr(c, f.name, value)
    c.rope_theta = top.real("rope_theta", c.rope_theta)
    c.rope_scaling = read_rope_scaling(top)
    if top.lookup("rotary_dim") is not None and top.lookup("partial_rotary_factor") is not None:
        raise ConfigError("rotary_dim: give rotary_dim or partial_rotary_factor, not both")
    _read_partial_rotary(top, c)
    bias, attention_bias = top.switch("bias", -1), top.switch("attention_bias", -1)
    if bias >= 0 and attention_bias >= 0 and bias != attention_bias:
        raise ConfigError(f"attention_bias: {describe(bool(attention_bias))} and bias {describe(bool(bias))} disagree")
    both = attention_bias if attention_bias >= 0 else (1 if bias < 0 else bias)
    c.qkv_bias = top.switch("qkv_bias", both)
    c.o_bias = top.switch("o_bias", both)
    c.rope_interleaved = top.switch("rope_interleaved", int(c.kv_lora_rank > 0))
    c.use_flash_attn = top.switch("use_flash_attn", 1)
    # How the runtime computes MLA and how many threads it takes: read for their rules, though
    # the generated file takes neither (it absorbs MLA, and its caller picks the threads).
    c.mla_naive = top.switch("mla_naive", 0)
    c.num_threads = top.size("num_threads", 0)
    weight_dtype = top.string("weight_dtype")
    if weight_dtype is not None:
        if weight_dtype not in config_fields.WEIGHT_DTYPES:
            raise ConfigError(f"weight_dtype: {clip(weight_dtype)!r} is not one of "
                              f"{', '.join(config_fields.WEIGHT_DTYPES)}")
        c.weight_dtype = config_fields.DTYPES.index(weight_dtype)
    compute_dtype = top.string("compute_dtype")
    if compute_dtype is not None:
        if compute_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"compute_dtype: {clip(compute_dtype)!r} is not float32 or bfloat16")
        c.compute_dtype = config_fields.DTYPES.index(compute_dtype)
    return c


def read(root: JsonObject) -> CConfig:
    """The config a parsed file describes, validated."""
    has_model_type, _ = root.first("model_type")
    c = read_hf(root) if has_model_type else read_hand(root)
    validate(c)
    return c


def load_text(path: str) -> bytes:
    """The bytes of a config file: a regular file (a FIFO or device would block or never end),
    at most one byte more than the bound, so an oversized file is reported as such."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError("not a regular file")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_file(path: str) -> Tuple[JsonObject, CConfig]:
    """The parsed object and config of a file; ConfigError and OSError name the file."""
    try:
        root = parse(load_text(path))
        return root, read(root)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    except OSError as error:
        raise OSError(f"{path}: {error.strerror or error}") from None


# ---- sneppx_config_validate ------------------------------------------------------------

def head_dim_of(c: CConfig) -> int:
    if c.head_dim > 0:
        return c.head_dim
    return c.hidden_size // c.num_attention_heads if c.num_attention_heads > 0 else 0


def rotary_dim_of(c: CConfig) -> int:
    if c.kv_lora_rank > 0:
        return c.qk_rope_head_dim
    return c.rotary_dim if c.rotary_dim > 0 else head_dim_of(c)


def _check_ranges(c: CConfig, ranges) -> None:
    for name, lo, hi in ranges:
        value = getattr(c, name)
        if not lo <= value <= hi:
            raise ConfigError(f"config.{name}: {value} is outside [{lo}, {hi}]")


def _check_limits(c: CConfig) -> None:
    """The ranges of limits.CONFIG_RANGES, as runtime/config.c walks its rendered table:
    the MLA-only ones must be 0 without MLA."""
    mla = c.kv_lora_rank > 0
    for r in limits.CONFIG_RANGES:
        value = getattr(c, r.field)
        if r.mla_only and not mla:
            if value:
                raise ConfigError(f"config.{r.field}: {value} applies to MLA configs (kv_lora_rank > 0) only; "
                                  "0 without MLA")
        elif not r.low <= value <= r.high:
            raise ConfigError(f"config.{r.field}: {value} is outside [{r.low}, {r.high}]")


def validate(c: CConfig) -> None:
    """runtime/config.c sneppx_config_validate, message for message."""
    _check_limits(c)
    m = limits.HEAD_DIM_MULTIPLE
    if c.kv_lora_rank > 0:
        if (c.qk_nope_head_dim + c.qk_rope_head_dim) % m:
            raise ConfigError(f"config.qk_nope_head_dim + qk_rope_head_dim: "
                              f"{c.qk_nope_head_dim + c.qk_rope_head_dim} must be a multiple of {m}")
        if c.kv_lora_rank % m:
            raise ConfigError(f"config.kv_lora_rank: {c.kv_lora_rank} must be a multiple of {m}")
        if (c.kv_lora_rank + c.qk_rope_head_dim) % m:
            raise ConfigError(f"config.kv_lora_rank + qk_rope_head_dim: "
                              f"{c.kv_lora_rank + c.qk_rope_head_dim} must be a multiple of {m}")
        if c.v_head_dim % m:
            raise ConfigError(f"config.v_head_dim: {c.v_head_dim} must be a multiple of {m}")
        if c.sliding_window:
            raise ConfigError("config.sliding_window: MLA has no sliding window")
        if c.rotary_dim not in (0, c.qk_rope_head_dim):
            raise ConfigError(f"config.rotary_dim: {c.rotary_dim}, but MLA rotates the qk_rope_head_dim "
                              f"({c.qk_rope_head_dim}) dims of each head: leave it 0")
        _validate_rope(c, c.qk_rope_head_dim)
        return
    if c.mla_naive:
        raise ConfigError("config.mla_naive: applies to MLA configs (kv_lora_rank > 0) only")
    _check_ranges(c, (("num_key_value_heads", 1, c.num_attention_heads),))
    if c.num_attention_heads % c.num_key_value_heads:
        raise ConfigError(f"config.num_key_value_heads: {c.num_key_value_heads} does not divide "
                          f"num_attention_heads {c.num_attention_heads}")
    head_dim = head_dim_of(c)
    if c.head_dim == 0 and c.hidden_size % c.num_attention_heads:
        raise ConfigError(f"config.head_dim: 0 means hidden_size/num_attention_heads, but "
                          f"{c.hidden_size}/{c.num_attention_heads} is not whole")
    if not m <= head_dim <= limits.MAX_HEAD_DIM or head_dim % m:
        raise ConfigError(f"config.head_dim: {head_dim} is not supported "
                          f"(a multiple of {m} from {m} to {limits.MAX_HEAD_DIM})")
    rotary_dim = rotary_dim_of(c)
    if rotary_dim > head_dim:
        raise ConfigError(f"config.rotary_dim: {rotary_dim} exceeds head_dim {head_dim}")
    _validate_rope(c, rotary_dim)


def _validate_rope(c: CConfig, rotary_dim: int) -> None:
    s = c.rope_scaling
    if not (c.rope_theta > 1.0) or not math.isfinite(c.rope_theta):
        raise ConfigError(f"config.rope_theta: {_g(c.rope_theta)} must be a finite number > 1")
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ConfigError(f"config.rotary_dim: {rotary_dim} must be even and > 0")
    if s.type != ROPE_TYPES["default"] and (not (s.factor > 0) or not math.isfinite(s.factor)):
        raise ConfigError(f"config.rope_scaling.factor: {_g(s.factor)} must be > 0")
    if s.type == ROPE_TYPES["dynamic"] and rotary_dim == 2:
        raise ConfigError("config.rope_scaling.type: dynamic scales the base by a power d / (d - 2) of the rotary "
                          "dim d, which 2 makes infinite")
    if s.type == ROPE_TYPES["llama3"]:
        if not (s.high_freq_factor > s.low_freq_factor) or not (s.low_freq_factor > 0):
            raise ConfigError(f"config.rope_scaling: llama3 needs 0 < low_freq_factor ({_g(s.low_freq_factor)}) "
                              f"< high_freq_factor ({_g(s.high_freq_factor)})")
    if s.type in (ROPE_TYPES["llama3"], ROPE_TYPES["yarn"]) and s.original_max_position_embeddings < 0:
        raise ConfigError(f"config.rope_scaling.original_max_position_embeddings: "
                          f"{s.original_max_position_embeddings} must be >= 0")
    if s.type == ROPE_TYPES["yarn"]:   # 0 reads as the default / derived; below 0 is refused
        for name, zero in (("beta_fast", "YaRN's 32"), ("beta_slow", "YaRN's 1"),
                           ("attention_factor", "derived from factor and mscale")):
            if getattr(s, name) < 0:
                raise ConfigError(f"config.rope_scaling.{name}: {_g(getattr(s, name))} must be >= 0 (0: {zero})")
    # validate_rope_numbers: the tables and the softmax scale the runtime will compute must be finite.
    for f in config_fields.ROPE_FINITE:
        if not math.isfinite(getattr(s, f.name)):
            raise ConfigError(f"config.rope_scaling.{f.name}: {_g(getattr(s, f.name))} is not finite")
    inv_freq, attention_factor = rope_inv_freq(c, rotary_dim, c.max_position_embeddings)
    for i, value in enumerate(inv_freq):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"config.rope_scaling: these parameters (factor {_g(s.factor)}) give RoPE "
                              f"frequency {i} = {_g(value)}")
    if not math.isfinite(attention_factor) or not (attention_factor > 0):
        raise ConfigError(f"config.rope_scaling: these parameters give the cos/sin attention factor "
                          f"{_g(attention_factor)}")
    scale = softmax_scale(c)
    if not 0 < float32(scale) < math.inf:  # the float the kernels scale by (NaN: refused)
        raise ConfigError(f"config.rope_scaling.mscale_all_dim: {_g(s.mscale_all_dim)} gives the softmax scale "
                          f"{_g(scale)}, not a finite float > 0")


# ---- C double arithmetic (IEEE results where Python would raise) ----------------------------

def _div(a: float, b: float) -> float:
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _log(x: float) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    return -math.inf if x == 0 else math.log(x)


def _pow(x: float, y: float) -> float:
    try:
        return math.pow(x, y)
    except OverflowError:
        return math.inf
    except ValueError:  # a negative base to a fractional power, or 0 to a negative one
        return math.inf if x == 0 else math.nan


def _floor(x: float) -> float:
    return float(math.floor(x)) if math.isfinite(x) else x


def _ceil(x: float) -> float:
    return float(math.ceil(x)) if math.isfinite(x) else x


def yarn_get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * _log(scale) + 1.0


def rope_inv_freq(c: CConfig, rotary_dim: int, seq_len: int) -> Tuple[List[float], float]:
    """templates/rope_freqs.c.j2 sneppx_rope_inv_freq, operation for operation."""
    s = c.rope_scaling
    dim, half, base = rotary_dim, rotary_dim // 2, c.rope_theta
    orig = s.original_max_position_embeddings if s.original_max_position_embeddings > 0 else c.max_position_embeddings
    attention_factor = 1.0
    if s.type == ROPE_TYPES["dynamic"] and seq_len > c.max_position_embeddings:
        grown = s.factor * _div(float(seq_len), float(c.max_position_embeddings)) - (s.factor - 1.0)
        base *= _pow(grown, _div(float(dim), float(dim - 2)))
    inv_freq = [_pow(base, -float(2 * i) / float(dim)) for i in range(half)]
    if s.type == ROPE_TYPES["linear"]:
        inv_freq = [_div(f, s.factor) for f in inv_freq]
    elif s.type == ROPE_TYPES["llama3"]:
        low_wavelen = _div(float(orig), s.low_freq_factor)
        high_wavelen = _div(float(orig), s.high_freq_factor)
        for i, f in enumerate(inv_freq):
            wavelen = _div(2.0 * math.pi, f)
            if wavelen < high_wavelen:
                continue
            if wavelen > low_wavelen:
                inv_freq[i] = _div(f, s.factor)
            else:
                smooth = _div(_div(float(orig), wavelen) - s.low_freq_factor, s.high_freq_factor - s.low_freq_factor)
                inv_freq[i] = _div((1.0 - smooth) * f, s.factor) + smooth * f
    elif s.type == ROPE_TYPES["yarn"]:
        beta_fast = s.beta_fast if s.beta_fast > 0 else 32.0
        beta_slow = s.beta_slow if s.beta_slow > 0 else 1.0

        def correction_dim(rotations: float) -> float:
            return _div(dim * _log(_div(float(orig), rotations * 2.0 * math.pi)), 2.0 * _log(base))

        low, high = _floor(correction_dim(beta_fast)), _ceil(correction_dim(beta_slow))
        if low < 0:
            low = 0.0
        if high > dim - 1:
            high = float(dim - 1)
        if low == high:
            high += 0.001
        for i, f in enumerate(inv_freq):
            ramp = _div(float(i) - low, high - low)
            ramp = 0.0 if ramp < 0 else (1.0 if ramp > 1 else ramp)
            inv_freq[i] = _div(f, s.factor) * ramp + f * (1.0 - ramp)
        if s.attention_factor > 0:
            attention_factor = s.attention_factor
        elif s.mscale != 0 and s.mscale_all_dim != 0:
            attention_factor = _div(yarn_get_mscale(s.factor, s.mscale), yarn_get_mscale(s.factor, s.mscale_all_dim))
        else:
            attention_factor = yarn_get_mscale(s.factor, 1.0)
    return inv_freq, attention_factor


def softmax_scale_and_formula(c: CConfig) -> Tuple[float, str]:
    """runtime/config.c sneppx_config_softmax_scale, and its formula for the comment beside
    the literal in generated code."""
    if c.kv_lora_rank > 0:
        scale = 1.0 / math.sqrt(float(c.qk_nope_head_dim + c.qk_rope_head_dim))
        formula = f"1 / sqrt({c.qk_nope_head_dim} + {c.qk_rope_head_dim})"
        s = c.rope_scaling
        if s.type != ROPE_TYPES["default"] and s.mscale_all_dim != 0:
            mscale = yarn_get_mscale(s.factor, s.mscale_all_dim)
            scale *= mscale * mscale
            formula += f" x mscale(factor {s.factor:g}, mscale_all_dim {s.mscale_all_dim:g})^2"
        return scale, formula
    return 1.0 / math.sqrt(float(head_dim_of(c))), f"1 / sqrt(head_dim {head_dim_of(c)})"


def softmax_scale(c: CConfig) -> float:
    return softmax_scale_and_formula(c)[0]


def describe_config(c: CConfig) -> Dict[str, Any]:
    """The config as a flat dict of the C struct's fields (tests compare it with the library's)."""
    out = {k: v for k, v in vars(c).items() if k not in ("name", "rope_scaling")}
    out.update({f"rope_scaling.{k}": v for k, v in vars(c.rope_scaling).items()})
    return out
