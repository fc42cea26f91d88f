"""``chargen export RUN_DIR OUT --web``: a folder that any static host serves, whose page
samples the model in the visitor's browser, at no server cost.

    OUT/index.html   the page (chargen/page/index.html, hand-written)
    OUT/chargen.js   the sampler (chargen/page/chargen.js, hand-written, no dependencies)
    OUT/model.json   shapes, vocabulary, mode, defaults: the weights' header
    OUT/weights.bin  every tensor, little-endian float32 (or float16), rows padded to 8
    OUT/README.md    the model card, with a static Space's front matter

The page computes what chargen.portable computes, to the bit: with float32 weights it
draws the text of ``chargen sample --rng portable`` for the same seed. Float16 weights
halve the download and change the numbers (python -m benchmarks.web measures how often the text).
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np

from .card import web_card_text
from .checkpoint import CARD, PAGE_FORMAT, PAGE_HEADER
from .checks import MAX_SEED
from .errors import ChargenError
from .model import CharLSTM
from .portable import LANES, as_weights, pad
from .sample import DEFAULTS, MAX_LENGTH

if TYPE_CHECKING:
    from .api import TrainedModel

FORMAT = PAGE_FORMAT
PAGE_FILES = ("index.html", "chargen.js")  # the page's own code, copied as it is
HEADER, WEIGHTS = PAGE_HEADER, "weights.bin"
WEB_DTYPES = {"fp32": "float32", "fp16": "float16"}
MAX_PAGE_SAMPLES = 1000  # the page's own cap: each sample's text is held in the page


def tensor_order(layers: int) -> list[str]:
    """The tensors in the order weights.bin holds them."""
    names = ["embed.weight"]
    for k in range(layers):
        names += [f"lstm.weight_ih_l{k}", f"lstm.weight_hh_l{k}", f"lstm.bias_ih_l{k}", f"lstm.bias_hh_l{k}"]
    return names + ["head.weight", "head.bias"]


def weights_blob(model: CharLSTM, dtype: str) -> tuple[bytes, list[dict]]:
    """weights.bin's bytes and each tensor's entry in the header: as ``dtype`` (rounded
    once, as ``PortableModel`` rounds them), matrices row-major with zero columns up to a
    multiple of LANES, as the page's kernels read them."""
    params, parts, entries, offset = dict(model.named_parameters()), [], [], 0
    for name in tensor_order(model.config.layers):
        tensor = as_weights(params[name], dtype)
        padded = pad(tensor) if tensor.ndim == 2 else tensor
        parts.append(padded.astype(f"<{np.dtype(dtype).str[1:]}").tobytes())
        entries.append({"name": name, "shape": list(padded.shape), "width": int(tensor.shape[-1]), "offset": offset})
        offset += padded.size
    return b"".join(parts), entries


def header(model: TrainedModel, entries: list[dict], blob: bytes, dtype: str, name: str) -> dict:
    record, shape = model.record, model.model.config
    return {
        "format": FORMAT, "version": 1, "name": name, "mode": model.mode, "items": model.kind.items,
        "chars": model.tokenizer.chars, "vocab_size": shape.vocab_size, "lanes": LANES,
        "embedding": shape.embedding, "hidden": shape.hidden, "layers": shape.layers,
        "default_prime": model.default_prime,
        "defaults": {"temperature": DEFAULTS.temperature, "top_k": DEFAULTS.top_k, "top_p": DEFAULTS.top_p,
                     "length": DEFAULTS.length, "num_samples": model.kind.default_samples},
        "limits": {"length": MAX_LENGTH, "samples": MAX_PAGE_SAMPLES, "seed": MAX_SEED},
        "weights": {"file": WEIGHTS, "dtype": dtype, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()},
        "tensors": entries,
        "about": {"corpus": record.corpus.name, "parameters": record.parameters,
                  "val_bpc": record.summary.best_val_bpc},
    }


def page_files(model: TrainedModel, web_dtype: str, name: str, card: bool = True) -> dict[str, bytes]:
    """The page folder's files for ``model`` (a run or model folder's, loaded), by name."""
    if web_dtype not in WEB_DTYPES:
        raise ChargenError(f"--web-dtype is fp32 or fp16, not {web_dtype!r}")
    dtype = WEB_DTYPES[web_dtype]
    blob, entries = weights_blob(model.model, dtype)
    page = resources.files("chargen") / "page"
    files = {file: (page / file).read_bytes() for file in PAGE_FILES}
    files[WEIGHTS] = blob
    files[HEADER] = json.dumps(header(model, entries, blob, dtype, name), ensure_ascii=False, indent=1).encode()
    if card:
        files[CARD] = web_card_text(model, name, dtype).encode("utf-8")
    return files
