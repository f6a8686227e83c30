"""Bad Kineto input: every problem is a BadInputError → exit 2 with exactly one stderr line naming the file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kineto_samples import document, event, kernel, sample_events, write

from traceanalyzer.cli import main
from traceanalyzer.loaders import load_one
from traceanalyzer.loaders.kineto_read import MAX_JSON_BYTES_ENV, GzipLimits
from traceanalyzer.model.errors import BadInputError

VALID = json.dumps(document(sample_events()))


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


CASES: dict[str, tuple[str, bytes, str]] = {
    # name: (file name, bytes, expected fragment of the message)
    "empty": ("t.json", b"", "empty file"),
    "whitespace": ("t.json", b"  \n\t ", "not a trace"),
    "garbage": ("t.json", b"\x00\x01garbage", "not a trace"),
    "json_garbage": ("t.json", b'{"traceEvents": [}', "not valid JSON"),
    "truncated_json": ("t.json", VALID[: len(VALID) // 2].encode(), "truncated JSON"),
    "truncated_gzip": ("t.json.gz", _gz(VALID.encode())[:-30], "truncated gzip"),
    "corrupt_gzip": ("t.json.gz", _gz(VALID.encode())[:40] + b"\xff" * 60 + _gz(VALID.encode())[100:],
                     "corrupt gzip"),
    "gzip_of_nothing": ("t.json.gz", _gz(b""), "gzip file does not contain a JSON trace"),
    "not_a_trace": ("t.json", b'{"name": "x", "values": [1, 2]}', "no \"traceEvents\" list"),
    "events_not_list": ("t.json", b'{"traceEvents": {"ph": "X"}}', "\"traceEvents\" is not a list"),
    "non_utf8": ("t.json", b'{"traceEvents": [{"ph": "X", "name": "k\xff\xfe"}]}', "not valid UTF-8"),
    "wrong_type_ts": ("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "12", "dur": 1}]}',
                      "$.traceEvents[0].ts"),
    "wrong_type_event": ("t.json", b'{"traceEvents": [3]}', "$.traceEvents[0]"),
    "float_device": ("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, '
                               b'"args": {"device": 0.5}}]}', "args.device"),
    "missing_ts": ("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}]}',
                   "has no \"ts\""),
    "unknown_phase": ("t.json", b'{"traceEvents": [{"ph": "Z", "cat": "kernel", "ts": 1, "dur": 1}]}',
                      "$.traceEvents[0].ph"),
    "huge_ts": ("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1e300, "dur": 1}]}',
                "beyond"),
    "missing_dur": ("t.json", b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "k", "ts": 1}]}',
                    "has no \"dur\""),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    filename, data, fragment = CASES[case]
    path = tmp_path / filename
    path.write_bytes(data)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n")
    assert err.startswith(f"Error: {path}:")
    assert fragment in err


def test_gzip_bomb_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bomb.json.gz", VALID)
    monkeypatch.setenv(MAX_JSON_BYTES_ENV, "1000")
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: {path}: decompressed size exceeds 1,000 bytes")
    assert err.count("\n") == 1


def test_gzip_limits_follow_the_compressed_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_JSON_BYTES_ENV, raising=False)
    limits = GzipLimits(ratio=50, floor_bytes=1 << 20, hard_cap_bytes=1 << 30)
    assert limits.limit_for(10) == 1 << 20  # the floor keeps small files legal
    assert limits.limit_for(100 << 10) == 50 * (100 << 10)
    assert limits.limit_for(1 << 30) == 1 << 30  # the hard cap bounds memory
    monkeypatch.setenv(MAX_JSON_BYTES_ENV, str(20 << 30))
    assert limits.limit_for(10) == 20 << 30  # the user's explicit limit wins


def test_concatenated_gzip_members_are_read(tmp_path: Path) -> None:
    data = VALID.encode()
    path = tmp_path / "multi.json.gz"
    path.write_bytes(_gz(data[:1000]) + _gz(data[1000:]))
    assert len(load_one(path).kernels) == 2


def test_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + VALID.encode())
    assert len(load_one(path).kernels) == 2


def test_zero_kernel_trace_is_loadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "cpu_only.json", document([event("cpu_op", "aten::add", 0, 1_000)]))
    assert main(["info", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "kineto-json" and out["counts"]["kernels"] == 0


def _valid_bytes(gz: bool) -> bytes:
    data = json.dumps(document([*sample_events(), kernel("k", 7_000_000, 10)])).encode()
    return _gz(data) if gz else data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gz=st.booleans(), cut=st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_any_truncation_is_bad_input(tmp_path: Path, gz: bool, cut: float) -> None:
    data = _valid_bytes(gz)
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    path.write_bytes(data[: int(cut * len(data))])
    with pytest.raises(BadInputError) as err:
        load_one(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{path}: ")


def test_negative_duration_is_dropped_with_a_warning(tmp_path) -> None:
    import json

    import traceanalyzer as ta

    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": -2.0,
               "args": {"device": 0, "stream": 7, "correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20.0, "dur": 3.0,
               "args": {"device": 0, "stream": 7, "correlation": 2}}]
    path = tmp_path / "negdur.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = ta.load(path, classify=False)
    k = trace.kernels
    assert (k["end_ns"] - k["start_ns"]).tolist() == [3000]
    assert "dropped 1 of 2 kernels rows that cannot be true: 1 ending before they start" in trace.warnings
