"""Hostile inputs, round 3 (issue 30), families 4–6: user patterns and files, option values, Dask scheduler
addresses and peers. Each case is exit 2 with one line naming the limit, quickly (nothing connects, nothing
hangs); the Dask peers are sockets made here (nothing listening, a silent listener, one that answers garbage)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_hostile import run_cli

from traceanalyzer.classify.prefilter import backtracking_hazard
from traceanalyzer.classify.rules import rule_set

REPO = Path(__file__).resolve().parents[1]
KINETO_DIR = REPO / "fixtures" / "kineto" / "tp2_prefill_serial"
KINETO_FILE = KINETO_DIR / "rank0.json.gz"
pytestmark = pytest.mark.timeout(120)


def assert_one_line(code: int, err: list[str], problem: str) -> None:
    assert code == 2, err
    assert len(err) == 1 and problem in err[0], err


# -- user patterns and files ---------------------------------------------------------------------------------------
def _rules(tmp_path: Path, match: str) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(f"[[rule]]\nid = \"mine\"\nbucket = \"gemm\"\nmatch = '{match}'\n")
    return path


NESTED = "an unbounded repetition inside another"
TWO_WAYS = "a repeated alternation that can read one text two ways"


@pytest.mark.parametrize(("pattern", "hazard"), [
    ("(a+)+$", NESTED), (r"(\w*x?)*y", NESTED), ("(x(?:y|z+){3})+", NESTED),
    ("(a|a)*$", TWO_WAYS), ("(a|aa)+$", TWO_WAYS), ("(?:a{1,2})+$", TWO_WAYS), ("k_(ab|a|ba)*?$", TWO_WAYS),
    (r"(.|\s)*$", TWO_WAYS), (r"(\d\d|[0-9])*$", TWO_WAYS), ("([^x]|a)*$", TWO_WAYS), (r"(\w\w|\w)*$", TWO_WAYS),
    (r"(?s)(.|\n)*$", TWO_WAYS), ("(?:[ab]c|a[bc])*$", TWO_WAYS)])
def test_catastrophic_patterns_are_refused_before_matching(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          pattern: str, hazard: str) -> None:
    names = tmp_path / "names.txt"
    names.write_text("a" * 5000 + "!\n")
    started = time.monotonic()
    code, _, err = run_cli(capsys, ["classify", str(names), "--rules", str(_rules(tmp_path, pattern))])
    assert_one_line(code, err, hazard)
    code, _, err = run_cli(capsys, ["summary", str(KINETO_FILE), "--layer-pattern", pattern])
    assert_one_line(code, err, f"--layer-pattern {pattern!r} has {hazard}")
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("pattern", ["(ab)+", "(?:er|ne)+", "(foo|foobar)+x", "(?:ab|ac)+", "([ab]|a)*",
                                     "(a|)*b", "(a|b){1,5}(a|a)", r"layers\.(\d+)\.", "(a|a)*+", r"(\w|\d)+$",
                                     r"(?:x|\d)+$", r"(.|\n)*$", "(?i)(a|A)*$", r"(\d|x\d)+$"])
def test_patterns_that_read_each_text_one_way_are_allowed(pattern: str) -> None:
    """Unambiguous repeated bodies (a uniquely decodable set of texts), bounded repeats and possessive repeats
    (no backtracking) pass (an atomic group is judged as a plain one: refused, to be safe); each one matches a
    long almost-matching text quickly."""
    assert backtracking_hazard(pattern) is None
    started = time.monotonic()
    for text in ("a" * 26 + "!", "1" * 26 + "!", "x1" * 13 + "!", "\n" * 26 + "!"):
        re.search(pattern, text)
    assert time.monotonic() - started < 1


def test_the_backtracking_check_reads_a_bounded_number_of_classes(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    """A rules file crafted so that the check itself would be slow (thousands of distinct classes in repeated
    alternations) is refused at the check's limit, quickly; repeated bodies without a choice cost nothing."""
    from traceanalyzer.classify.prefilter import MAX_CHECKED_CLASSES

    names = tmp_path / "names.txt"
    names.write_text("k\n")

    def rules(body: Callable[[int], str], count: int) -> Path:
        path = tmp_path / "many.toml"
        path.write_text("".join(f"[[rule]]\nid = \"r{i}\"\nbucket = \"gemm\"\nmatch = '({body(i)})*y'\n"
                                for i in range(count)), encoding="utf-8")
        return path

    def classes(i: int, sep: str) -> str:
        return sep.join(f"[^{chr(0x4E00 + (i * 41 + j) % 5000)}]x" for j in range(40))

    started = time.monotonic()
    code, _, err = run_cli(capsys, ["classify", str(names), "--rules",
                                    str(rules(lambda i: classes(i, "|"), MAX_CHECKED_CLASSES // 41 + 5))])
    assert_one_line(code, err, f"more character classes in repeated groups than the check reads "
                               f"({MAX_CHECKED_CLASSES:,} in all)")
    code, _, err = run_cli(capsys, ["classify", str(names), "--rules",
                                    str(rules(lambda i: classes(i, ""), MAX_CHECKED_CLASSES // 41 + 5))])
    assert code == 0, err  # one shape per body: nothing to read two ways, nothing counted
    assert time.monotonic() - started < 20


def test_the_shipped_rules_have_no_backtracking_hazard() -> None:
    for rule in rule_set(None).rules:
        for pattern in (rule.pattern, rule.exclude):
            if pattern is not None:
                assert backtracking_hazard(pattern.pattern, pattern.flags) is None, rule.id


def test_plain_repeated_groups_stay_allowed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text("my_abab_kernel\n")
    code, out, err = run_cli(capsys, ["classify", str(names), "--json", "--rules",
                                      str(_rules(tmp_path, "my_(ab)+_k(?:er|ne)+l"))])
    assert code == 0, err
    assert '"rule": "mine"' in out


def test_rules_files_that_are_too_big_or_too_deep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text("k\n")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    code, _, err = run_cli(capsys, ["classify", str(names), "--rules", str(big)])
    assert_one_line(code, err, "rules file larger than 1 MiB")
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    code, _, err = run_cli(capsys, ["classify", str(names), "--rules", str(deep)])
    assert_one_line(code, err, "nested too deeply")
    if Path("/dev/zero").exists():
        code, _, err = run_cli(capsys, ["classify", str(names), "--rules", "/dev/zero"])
        assert_one_line(code, err, "rules file larger than 1 MiB")


# -- option values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "1e309", "-inf"])
def test_fail_if_slower_must_be_a_finite_percentage(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, _, err = run_cli(capsys, ["diff", str(KINETO_FILE), "--vs", str(KINETO_FILE), "--fail-if-slower", value])
    assert code == 2 and len(err) == 1 and "--fail-if-slower" in err[0], err


@pytest.mark.parametrize("window", ["1e300:1e301", "0:1e308", "1e10:"])
def test_windows_beyond_int64_nanoseconds_are_bad_input(capsys: pytest.CaptureFixture[str], window: str) -> None:
    code, _, err = run_cli(capsys, ["summary", "--json", str(KINETO_FILE), "--window", window])
    assert_one_line(code, err, "START and END are at most 9.22e+09 s")


def test_a_window_in_exponent_notation_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    """``5e-1:10`` was refused; it is the window 0.5 s to 10 s, as ``0.5:10`` (the same answer)."""
    from traceanalyzer.loaders.limits import parse_window

    assert parse_window("5e-1:1e1") == parse_window("0.5:10")
    nsys = REPO / "fixtures" / "nsys" / "tp2_prefill_serial.sqlite"  # kernels from 7.75 s of its clock
    a = run_cli(capsys, ["summary", "--json", str(nsys), "--window", "78e-1:8.3"])
    b = run_cli(capsys, ["summary", "--json", str(nsys), "--window", "7.8:8.3"])
    assert a[0] == 0 and a[1] == b[1]


def test_a_gpu_log_from_year_9999_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "power.csv"
    log.write_text("timestamp, index, power.draw [W], power.limit [W]\n"
                   "9999/11/30 14:29:52.363, 0, 300.0, 700.0\n")
    code, _, err = run_cli(capsys, ["summary", "--json", str(KINETO_FILE), "--gpu-log", str(log)])
    assert_one_line(code, err, "no readable timestamps")


# -- Dask scheduler addresses and peers --------------------------------------------------------------------------------
pytest.importorskip("distributed")


@pytest.mark.parametrize(("address", "problem"), [
    ("not-a-url", "is not [PROTOCOL://]HOST:PORT"),
    ("tcp://:8786", "is not [PROTOCOL://]HOST:PORT"),
    ("tcp://host:99999", "is not [PROTOCOL://]HOST:PORT"),
    ("inproc://10.0.0.1/1/2", "uses inproc://"),
    ("ucx://10.0.0.1:8786", "uses ucx://"),
    ("tls://10.0.0.1:8786", "uses tls:// but dask's configuration has no client certificate"),
    ("tcp://" + "h" * 100_000 + ":8786", "is 100,011 characters long"),
])
def test_bad_scheduler_addresses_are_refused_before_connecting(capsys: pytest.CaptureFixture[str], address: str,
                                                              problem: str) -> None:
    started = time.monotonic()
    code, _, err = run_cli(capsys, ["summary", str(KINETO_FILE), "--engine", "dask", "--scheduler", address])
    assert_one_line(code, err, problem)
    assert time.monotonic() - started < 5 and len(err[0]) < 400


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, list[bytes]]]:
    """A TCP listener on loopback; ``replies`` (set by the test) is what it sends each connection, then it holds
    the connection open without a word."""
    server = socket.create_server(("127.0.0.1", 0))
    replies: list[bytes] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            for reply in replies:
                conn.sendall(reply)
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server, replies
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_nothing_listening_fails_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    started = time.monotonic()
    code, _, err = run_cli(capsys, ["summary", str(KINETO_FILE), "--engine", "dask", "--scheduler",
                                    f"tcp://127.0.0.1:{port}"])
    assert_one_line(code, err, f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("reply", "problem"), [
    (b"", "is not a Dask scheduler: it said nothing within 2 s"),  # accepts, silent: was a hang
    (b"\xff" * 64, "is not a Dask scheduler"),  # garbage: was a 3 EiB allocation, MemoryError
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "is not a Dask scheduler: it answered 8 bytes"),
])
def test_peers_that_are_not_dask_schedulers(capsys: pytest.CaptureFixture[str],
                                            listener: tuple[socket.socket, list[bytes]], reply: bytes,
                                            problem: str) -> None:
    import re

    server, replies = listener
    replies.append(reply)
    address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    started = time.monotonic()
    code, _, err = run_cli(capsys, ["summary", str(KINETO_FILE), "--engine", "dask", "--scheduler", address,
                                    "--scheduler-timeout", "2"])
    assert code == 2 and len(err) == 1 and re.search(problem, err[0]), err
    assert time.monotonic() - started < 30


@pytest.fixture(scope="module")
def client_tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Dask configuration with a self-signed client certificate (made by openssl), as a tls:// user has."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=traceanalyzer-test"], check=True, capture_output=True)
    return {"distributed.comm.tls.client.cert": str(cert), "distributed.comm.tls.client.key": str(key),
            "distributed.comm.tls.ca-file": str(cert)}


@pytest.mark.parametrize("scheme", ["ws", "tls", "wss"])
@pytest.mark.parametrize(("reply", "problem"), [
    (b"", r"within 2 s: Timed out"),  # accepts, silent: the TLS or WebSocket handshake never ends
    (b"\xff" * 64, r"is not a Dask scheduler|\(the connection failed\)|within 2 s"),  # ws waits for more bytes
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", r"is not a Dask scheduler|\(the connection failed\)"),
], ids=["silent", "garbage", "http"])
def test_tls_and_websocket_peers_that_are_not_dask_schedulers(
        capsys: pytest.CaptureFixture[str], listener: tuple[socket.socket, list[bytes]],
        request: pytest.FixtureRequest, scheme: str, reply: bytes, problem: str) -> None:
    """Over tls/ws/wss the first bytes are a TLS or HTTP handshake, so the tcp probe cannot judge the peer; dask's
    connect is bounded by --scheduler-timeout instead (its handshake read too): each case ends as exit 2 within
    the timeout plus dask's start."""
    import dask

    server, replies = listener
    replies.append(reply)
    config = request.getfixturevalue("client_tls") if scheme != "ws" else {}
    address = f"{scheme}://127.0.0.1:{server.getsockname()[1]}"
    started = time.monotonic()
    with dask.config.set(config):
        code, _, err = run_cli(capsys, ["summary", str(KINETO_FILE), "--engine", "dask", "--scheduler", address,
                                        "--scheduler-timeout", "2"])
    assert code == 2 and len(err) == 1 and re.search(problem, err[0]), err
    assert time.monotonic() - started < 15


def test_a_local_cluster_has_no_more_workers_than_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine dask -j 16`` on two files started 16 workers (19 processes): now 2."""
    from traceanalyzer.pipeline import dask_engine as on_dask

    asked: list[int] = []

    class Stop(Exception):
        pass

    def fake(scheduler: object, jobs: int, timeout: float = 10.0) -> object:
        asked.append(jobs)
        raise Stop

    monkeypatch.setattr(on_dask, "dask_client", fake)
    with pytest.raises(Stop):
        import traceanalyzer as ta

        ta.summary([KINETO_DIR / "rank0.json.gz", KINETO_DIR / "rank1.json.gz"], engine="dask", jobs=16)
    assert asked == [2]


def test_relative_paths_reach_workers_with_another_working_directory(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The issue: ``--engine dask`` with a relative path failed ("no such file") where the workers' working
    directory differs. The workers here start in the repository; the driver runs in tmp_path, beside the file."""
    import json
    import logging
    import shutil

    from distributed import LocalCluster

    shutil.copyfile(KINETO_FILE, tmp_path / "rank0.json.gz")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      silence_logs=logging.CRITICAL) as cluster:
        monkeypatch.chdir(tmp_path)
        code, out, err = run_cli(capsys, ["summary", "--json", "rank0.json.gz", "--engine", "dask", "--scheduler",
                                          cluster.scheduler_address])
        assert code == 0, err
        assert [t["path"] for t in json.loads(out)["traces"]] == ["rank0.json.gz"]  # as the user named it


def test_a_reader_that_leaves_ends_the_summary_quietly() -> None:
    """``summary | head -1``: exit 0 and nothing on stderr (rich's own handling was a silent exit 1)."""
    import subprocess
    import sys

    proc = subprocess.run(["bash", "-c", f'"{sys.executable}" -m traceanalyzer.cli summary "{KINETO_DIR}" | head -1;'
                           ' exit "${PIPESTATUS[0]}"'], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout.startswith("traceanalyzer summary of")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc and fork")
def test_sigterm_under_jobs_stops_the_workers(tmp_path: Path) -> None:
    """The issue: SIGTERM 0.8 s into ``summary -j 2`` left both pool workers running. Now it ends as Ctrl-C does,
    workers terminated, exit 143 (128 + SIGTERM)."""
    import signal
    import subprocess
    import sys

    from test_hostile import _pool_case, _survivors

    script = _pool_case(tmp_path, bad=False)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "sigterm"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.8)
        proc.send_signal(signal.SIGTERM)  # the parent only, as `kill PID` does
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        time.sleep(0.5)
        left = _survivors(str(script))
    assert proc.returncode == 128 + signal.SIGTERM and left == [], (proc.returncode, err[-2000:])


def test_a_result_cut_by_the_file_size_limit_is_exit_2(tmp_path: Path) -> None:
    """``ulimit -f``: ``summary --json > file`` was silently truncated with exit 0."""
    import subprocess
    import sys

    out = tmp_path / "out.json"
    proc = subprocess.run(["bash", "-c", f'ulimit -f 4; "{sys.executable}" -m traceanalyzer.cli summary --json '
                           f'"{KINETO_DIR}" > "{out}"'], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["Error: cannot write the standard output: file too large (ulimit -f)"]
