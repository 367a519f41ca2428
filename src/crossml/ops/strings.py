"""String ops (string tensors are numpy object arrays; these ops run on the CPU):
StringNormalizer, StringConcat, StringSplit, RegexFullMatch, and TfIdfVectorizer (strings or ints).

ImageDecoder is not implemented: it needs an image library (Pillow / OpenCV), which crossml does
not depend on.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from crossml.ops.registry import op


def _strings(x: Any, what: str = "X") -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != object:
        kind = f"a {x.dtype} tensor" if hasattr(x, "dtype") else type(x).__name__
        raise TypeError(f"input {what} must be a string tensor, got {kind}")
    return x


def _map_strings(fn: Any, x: np.ndarray, otype: Any = object) -> np.ndarray:
    out = np.empty(x.shape, dtype=otype)
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    for i, s in enumerate(flat_in):
        flat_out[i] = fn(s)
    return out


# --------------------------------------------------------------------------------------------
# StringNormalizer


@op("StringNormalizer", since=10, cpu_only=True)
def string_normalizer(x: Any, *, case_change_action: str = "NONE", is_case_sensitive: int = 0,
                      locale: str = "", stopwords: list[str] | None = None) -> np.ndarray:
    """Drops elements equal to a stopword (case-folded unless is_case_sensitive), then changes case.

    Input is [C] or [1, C]; when every element is dropped the output is a single empty string.
    """
    x = _strings(x)
    if x.ndim == 2 and x.shape[0] != 1 or x.ndim not in (1, 2):
        raise ValueError(f"StringNormalizer expects shape [C] or [1, C], got {x.shape}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"case_change_action must be NONE, LOWER or UPPER, got {case_change_action!r}")
    stops = set(stopwords or [])
    if not is_case_sensitive:
        stops = {w.casefold() for w in stops}
    kept = []
    for s in x.reshape(-1).tolist():
        key = s if is_case_sensitive else s.casefold()
        if key in stops:
            continue
        if case_change_action == "LOWER":
            s = s.lower()
        elif case_change_action == "UPPER":
            s = s.upper()
        kept.append(s)
    if not kept:
        kept = [""]
    out = np.empty(len(kept), dtype=object)
    out[:] = kept
    return out.reshape(1, -1) if x.ndim == 2 else out


# --------------------------------------------------------------------------------------------
# StringConcat, StringSplit, RegexFullMatch


@op("StringConcat", since=20, cpu_only=True)
def string_concat(x: Any, y: Any) -> np.ndarray:
    a, b = np.broadcast_arrays(_strings(x, "X"), _strings(y, "Y"))
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = a[idx] + b[idx]
    return out


@op("StringSplit", since=20, cpu_only=True)
def string_split(x: Any, *, delimiter: str = "", maxsplit: int | None = None) -> tuple[np.ndarray, torch.Tensor]:
    x = _strings(x)
    sep = delimiter or None  # empty / missing: split on runs of whitespace
    limit = -1 if maxsplit is None else maxsplit
    parts = [s.split(sep, limit) if s else [] for s in x.reshape(-1).tolist()]  # "" has no substrings
    width = max((len(p) for p in parts), default=0)
    y = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, :len(p)] = p
    counts = torch.tensor([len(p) for p in parts], dtype=torch.int64).reshape(x.shape)
    return y.reshape(*x.shape, width), counts


@op("RegexFullMatch", since=20, cpu_only=True)
def regex_full_match(x: Any, *, pattern: str) -> torch.Tensor:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
    out = _map_strings(lambda s: regex.fullmatch(s) is not None, _strings(x), np.bool_)
    return torch.from_numpy(out)


# --------------------------------------------------------------------------------------------
# TfIdfVectorizer


def _ngram_table(pool: list[Any], ngram_counts: list[int], ngram_indexes: list[int],
                 min_n: int, max_n: int) -> dict[tuple[Any, ...], int]:
    """n-gram tuple -> output column, for the pool's n-grams with min_n <= n <= max_n."""
    table: dict[tuple[Any, ...], int] = {}
    j = 0  # index of the n-gram in the pool (into ngram_indexes)
    for k, start in enumerate(ngram_counts):
        n = k + 1
        end = ngram_counts[k + 1] if k + 1 < len(ngram_counts) else len(pool)
        if (end - start) % n:
            raise ValueError(f"the pool's {n}-grams ({end - start} items from {start}) are not a multiple of {n}")
        for s in range(start, end, n):
            if min_n <= n <= max_n:
                table[tuple(pool[s:s + n])] = ngram_indexes[j]
            j += 1
    if j != len(ngram_indexes):
        raise ValueError(f"ngram_indexes has {len(ngram_indexes)} entries but the pool holds {j} n-grams")
    return table


def _count_row(row: list[Any], table: dict[tuple[Any, ...], int], counts: np.ndarray, min_n: int, max_n: int,
               max_skip: int) -> None:
    size = len(row)
    for n in range(min_n, max_n + 1):
        for skip in range(max_skip + 1 if n > 1 else 1):  # unigrams are counted once
            step = skip + 1
            for start in range(size - (n - 1) * step):
                col = table.get(tuple(row[start:start + (n - 1) * step + 1:step]))
                if col is not None:
                    counts[col] += 1


@op("TfIdfVectorizer", since=9, cpu_only=True)
def tfidf_vectorizer(x: Any, *, max_gram_length: int, max_skip_count: int, min_gram_length: int, mode: str,
                     ngram_counts: list[int], ngram_indexes: list[int], pool_int64s: list[int] | None = None,
                     pool_strings: list[str] | None = None, weights: list[float] | None = None) -> torch.Tensor:
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"mode must be TF, IDF or TFIDF, got {mode!r}")
    if not 1 <= min_gram_length <= max_gram_length:
        raise ValueError(f"need 1 <= min_gram_length ({min_gram_length}) <= max_gram_length ({max_gram_length})")
    if (pool_int64s is None) == (pool_strings is None):
        raise ValueError("exactly one of pool_int64s and pool_strings must be given")
    if isinstance(x, torch.Tensor):
        if pool_int64s is None:
            raise TypeError(f"input is a {x.dtype} tensor but the pool holds strings")
        data = np.asarray(x.cpu().tolist(), dtype=object).reshape(tuple(x.shape))
        pool: list[Any] = list(pool_int64s)
    else:
        data = _strings(x)
        if pool_strings is None:
            raise TypeError("input is a string tensor but the pool holds integers")
        pool = list(pool_strings)
    if data.ndim > 2:
        raise ValueError(f"TfIdfVectorizer expects shape [C] or [B, C], got {data.shape}")
    rows = data.reshape(1, -1) if data.ndim < 2 else data
    width = max(ngram_indexes) + 1 if ngram_indexes else 0
    table = _ngram_table(pool, ngram_counts, ngram_indexes, min_gram_length, max_gram_length)
    counts = np.zeros((rows.shape[0], width), dtype=np.int64)
    for b in range(rows.shape[0]):
        _count_row(rows[b].tolist(), table, counts[b], min_gram_length, max_gram_length, max_skip_count)
    tf = torch.from_numpy(counts).to(torch.float32)
    w = torch.tensor(weights, dtype=torch.float32) if weights else None
    if w is not None and w.numel() != width:
        raise ValueError(f"weights has {w.numel()} entries; expected {width} (one per output column)")
    if mode == "IDF":
        y = (tf > 0).to(torch.float32) * (w if w is not None else 1.0)
    elif mode == "TFIDF":
        y = tf * w if w is not None else tf
    else:
        y = tf
    return y if data.ndim == 2 else y.reshape(width)
