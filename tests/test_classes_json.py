"""``classify --json`` writes its text straight from the classes (classify.engine.classes_json): the same text as
json.dumps of every to_dict(), for any strings (non-ASCII, control characters, quotes, lone surrogates)."""

from __future__ import annotations

import json
import random

from traceanalyzer.classify import classify_names
from traceanalyzer.classify.engine import KernelClass, classes_json

_ALPHABET = ['a', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', '\x00', '\x1f', '\x7f', 'é', '中', '\U0001f600',
             '\udcff', '<', '>', '&', "'", ',', ':', '[', ']', '{', '}']


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, n)))


def _expected(classes: list[KernelClass]) -> str:
    return json.dumps([c.to_dict() for c in classes], indent=2, sort_keys=False, allow_nan=False)


def test_random_classes_encode_as_json_dumps() -> None:
    rng = random.Random(7)
    classes = [KernelClass(_text(rng, 30), _text(rng, 5), _text(rng, 5), _text(rng, 5), _text(rng, 5), _text(rng, 8),
                           rng.choice([None, _text(rng, 4)]), rng.choice([None, _text(rng, 4)]),
                           tuple(_text(rng, 6) for _ in range(rng.randint(0, 3))),
                           tuple(_text(rng, 6) for _ in range(rng.randint(0, 3))), _text(rng, 30))
               for _ in range(500)]
    assert any(c.fused for c in classes) and any(c.fp4_format is None for c in classes)
    for count in (0, 1, 2, 500):
        assert classes_json(classes[:count]) == _expected(classes[:count])


def test_real_names_encode_as_json_dumps() -> None:
    names = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::half_t>>(Params)",
             "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "[CUDA memcpy Device-to-Host]", "kernel_é_中", ""]
    classes = classify_names(names)
    assert classes_json(classes) == _expected(classes)
