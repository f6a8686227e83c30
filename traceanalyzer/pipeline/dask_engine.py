"""The Dask engine: a summary of many rank files on a dask.distributed cluster (``summary --engine dask``,
``ta.summary(paths, engine="dask")``).

Each rank file is loaded, classified and analysed on a worker, and stays there. What travels to the driver is
compact: each trace's rank facts (to renumber colliding ranks), its :class:`~traceanalyzer.pipeline.stages.TracePart`
without the activity tables (per-device summaries: per-step figures, the collective table cross-rank matching
needs), then, once the driver has matched collectives across ranks and sent each worker its ranks' matched
columns, each rank's what-if costs and each device's findings evidence. Cross-rank matching, the what-if and the
findings reduce on the driver (:func:`traceanalyzer.pipeline.stages.reduce_parts`), which never holds a trace. The
functions run are the local engine's, in the same order per trace, so the answer is the same to the nanosecond.

Workers read the files by path: the paths must name the same files on every worker (a shared filesystem).
Without a scheduler address (``--scheduler``, ``DASK_SCHEDULER_ADDRESS``) a ``LocalCluster`` of ``jobs`` worker
processes is started for the call. docs/SCALE.md: clusters (Slurm, Kubernetes), memory per worker, what travels.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.structure.layer_pattern import check_layer_pattern
from ..loaders import SUMMARY_TABLES, expand_paths
from ..loaders.limits import Window, parse_window
from ..model.errors import BadInputError, printable
from ..model.trace import PathLike, Trace
from .loading import empty_trace_error, lacks_kernel_table, rank_facts, rank_plan, renumbered
from .stages import TracePart, analyze_trace, reduce_parts
from .workers import load_file

if TYPE_CHECKING:
    from distributed import Client, Future

    from ..analysis.device import DeviceKey, DeviceState
    from ..analysis.results import CrossRankSummary, DeviceSummary, Finding, Summary, WhatIf
    from ..analysis.summary import SummaryOptions
    from ..analysis.what_if.comm_free import RankCosts
    from ..findings.context import EvidenceKey
    from ..findings.evidence import DeviceEvidence

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"


def summarize_on_dask(paths: Sequence[PathLike], opts: SummaryOptions, *, scheduler: str | None = None,
                      window: str | None = None, timeout: float = 10.0) -> Summary:
    """The summary of trace files / directories of rank traces, computed on a Dask cluster (module doc) with the
    local engine's options ``opts``: ``scheduler`` (else ``$DASK_SCHEDULER_ADDRESS``, else a LocalCluster of
    ``opts.jobs`` worker processes, no more than there are files); ``window`` as
    :func:`traceanalyzer.pipeline.summarize.summarize_paths`; ``timeout``: seconds to reach the scheduler."""
    check_layer_pattern(opts.layer_pattern)
    skipped: list[str] = []
    files = [str(f) for f in expand_paths(list(paths), skipped)]
    win = parse_window(window)
    rules, jobs = opts.rules, opts.jobs
    rules_path = None if rules is None else str(Path(rules).absolute())  # as the files: workers have their own cwd
    with dask_client(scheduler, min(jobs, max(len(files), 1)), timeout) as client:  # no idle workers
        loaded = [client.submit(_load, str(Path(f).absolute()), rules_path, win, f, pure=False) for f in files]
        if skipped and loaded:  # said once, with the first trace's warnings (as the local engine)
            loaded[0] = client.submit(_with_warnings, loaded[0], skipped, pure=False)
        facts_f = [client.submit(_facts, t, pure=False) for t in loaded]
        full = [client.submit(analyze_trace, t, opts, pure=False) for t in loaded]  # ranks as loaded, mostly kept
        facts = client.gather(facts_f)
        plan = rank_plan([f["ranks"] for f in facts])
        if plan is not None:  # colliding ranks without torch.distributed's word: renumbered by file order first
            client.cancel(full)
            loaded = [client.submit(renumbered, t, new_rank, note, pure=False)
                      for t, (new_rank, note) in zip(loaded, plan, strict=True)]
            full = [client.submit(analyze_trace, t, opts, pure=False) for t in loaded]
        if not any(f["kernels"] for f in facts):
            raise empty_trace_error(files[0] if len(files) == 1 else ", ".join(str(p) for p in paths),
                                    any(f["no_kernel_table"] for f in facts))
        compact = [client.submit(_compact, p, pure=False) for p in full]
        work = DaskTraceWork(client, loaded, full, opts)  # starts the findings evidence: no cross-rank input
        work.parts = client.gather(compact)
        return reduce_parts(work.parts, opts, work)


#: seconds a client waits for the scheduler to answer (``--scheduler-timeout``; dask's own default is 30)
CONNECT_TIMEOUT_S = 10.0
_MAX_ADDRESS = 1024  # characters of a scheduler address; a longer one is refused before parsing
_SCHEMES = ("tcp", "tls", "ws", "wss")


def check_scheduler_address(address: str) -> None:
    """:class:`BadInputError` for an address a client cannot connect to, said before connecting: too long, not
    ``[PROTOCOL://]HOST:PORT`` with a host and a port 1–65535, a protocol other than tcp/tls/ws/wss (``inproc://``
    exists only inside one process, ``ucx://`` needs UCX), or tls/wss without a client certificate in dask's
    configuration (``distributed.comm.tls``)."""
    shown = printable(address if len(address) <= 80 else address[:80] + "…")
    problem = None
    if len(address) > _MAX_ADDRESS:
        problem = f"is {len(address):,} characters long"
    else:
        scheme, _, rest = address.rpartition("://")
        scheme = scheme or "tcp"
        host, _, port = rest.rpartition(":")
        if scheme not in _SCHEMES:
            problem = f"uses {printable(scheme)}://, which this client does not connect to (tcp, tls, ws, wss)"
        elif not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            problem = "is not [PROTOCOL://]HOST:PORT with a host and a port 1-65535"
        elif scheme in ("tls", "wss"):
            import dask

            if not dask.config.get("distributed.comm.tls.client.cert", None):
                problem = f"uses {scheme}:// but dask's configuration has no client certificate " \
                          "(distributed.comm.tls.client.cert)"
    if problem:
        raise BadInputError(None, f"the Dask scheduler address {shown} {problem}",
                            "give it as tcp://HOST:8786, as `dask scheduler` prints it")


def _probe(address: str, timeout: float) -> None:
    """Before dask's client connects (it retries a refused connection until its timeout, waits without bound for
    a silent peer's handshake and allocates whatever length a peer's first 8 bytes say): fail at once where
    nothing listens; over tcp, a scheduler speaks first — its handshake, a message of a few hundred bytes whose
    length leads it — so a peer that says nothing within ``timeout`` or announces an impossible length is not
    one."""
    import socket

    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as exc:
        raise BadInputError(None, f"cannot reach the Dask scheduler at {printable(address)}: "
                            f"{printable(exc.strerror or exc)}", "start one with `dask scheduler`, or drop "
                            "--scheduler for a local cluster") from None
    with sock:
        if (scheme or "tcp") != "tcp":
            return
        deadline = time.monotonic() + timeout
        head = b""
        try:
            while len(head) < 8 and time.monotonic() < deadline:
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                head = sock.recv(8, socket.MSG_PEEK)
                if not head:
                    break  # closed by the peer
                if len(head) < 8:
                    time.sleep(0.01)
        except OSError:
            pass
    length = int.from_bytes(head, "little") if len(head) == 8 else 0
    if not 0 < length < _MAX_HANDSHAKE:
        said = "said nothing" if not head else f"answered {len(head)} bytes that are not a Dask message"
        raise BadInputError(None, f"{printable(address)} is not a Dask scheduler: it {said} within {timeout:g} s",
                            "give the address `dask scheduler` prints (--scheduler-timeout sets the wait)")


_MAX_HANDSHAKE = 1 << 24  # bytes: a scheduler's handshake is a few hundred


@contextmanager
def dask_client(scheduler: str | None, jobs: int, timeout: float = CONNECT_TIMEOUT_S) -> Iterator[Client]:
    """A client of the scheduler at ``scheduler`` (else ``$DASK_SCHEDULER_ADDRESS``; checked by
    :func:`check_scheduler_address`, connected within ``timeout`` seconds), or of a LocalCluster of ``jobs``
    single-threaded worker processes started for the call; closed (and the cluster shut down) after."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise BadInputError(None, "--engine dask needs dask.distributed",
                            "pip install 'traceanalyzer[dask]'") from exc
    address = scheduler or os.environ.get(SCHEDULER_ENV)
    if address:
        check_scheduler_address(address)
        _probe(address, timeout)
        try:
            client = Client(address, timeout=timeout)  # the connection and dask's handshake, within ``timeout``
        except (OSError, TimeoutError) as exc:  # dask says "Timed out" for a silent peer (tls/ws: a handshake)
            said = printable(str(exc)[:200]) or type(exc).__name__
            timed_out = isinstance(exc, TimeoutError) or "timed out" in said.lower()
            problem = f"within {timeout:g} s" if timed_out else "(the connection failed)"
            raise BadInputError(None, f"cannot reach the Dask scheduler at {printable(address)} {problem}: {said}",
                                "start one with `dask scheduler`, or drop --scheduler for a local cluster "
                                "(--scheduler-timeout sets the wait)") from None
        except Exception as exc:  # a peer that answers, but not as a Dask scheduler (garbage frames, a web server)
            raise BadInputError(None, f"{printable(address)} is not a Dask scheduler: it answered something else "
                                f"({type(exc).__name__})", "give the address `dask scheduler` prints") from None
        try:
            yield client
        finally:
            client.close()
        return
    # loopback only, no dashboard, its HTTP endpoint on a free port (not 8787, which a user's cluster may hold);
    # its workers share our stderr: a task's failure is told once, by our error line, not by dask's log too;
    # no statistical profiler in the workers (sampling our deep stacks every 10 ms cost ~50 % more CPU)
    import dask

    with dask.config.set({"distributed.worker.profile.enabled": False}):
        with _sigint_ignored():  # worker processes start with Ctrl-C ignored (a restarted one: ``dask_setup``)
            cluster = LocalCluster(n_workers=max(jobs, 1), threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                                   silence_logs=logging.CRITICAL, preload=[__name__])
        quiet = logging.getLogger("asyncio")  # a task cut by Ctrl-C is "never retrieved": said by our one line
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            with cluster, Client(cluster) as client:
                yield client
        finally:
            quiet.setLevel(level)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the local cluster starts its worker processes, which inherit that (an ignored signal
    stays ignored across exec, and Python leaves it so), so a Ctrl-C while they import does not make each print a
    traceback. The cost: a Ctrl-C in that second is lost (press it again)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def dask_setup(worker: object) -> None:
    """Run in each local-cluster worker process as it starts (``preload``): Ctrl-C reaches the whole process
    group, and only the driver should act on it — it shuts the cluster down and says ``Interrupted.`` — not every
    worker printing its traceback (68 lines)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class DaskTraceWork:
    """:class:`~traceanalyzer.pipeline.stages.TraceWork` where each trace lives on a worker: the what-if costs and the
    findings evidence are computed there, from the trace and its full part; only their compact results travel."""

    def __init__(self, client: Client, traces: list[Future[Any]], full_parts: list[Future[Any]],
                 options: SummaryOptions) -> None:
        self.client, self.traces, self.full_parts, self.options = client, traces, full_parts, options
        self.parts: list[TracePart] = []  # the compact parts, once gathered
        self.states: dict[DeviceKey, DeviceState] = {}  # the devices' working state stays on the workers
        self._evidence: list[Future[Any]] | None = None
        if options.findings:
            self._submit_evidence()

    def _submit_evidence(self) -> list[Future[Any]]:
        if self._evidence is None:
            self._evidence = [self.client.submit(_evidence, t, p, self.options, pure=False)
                              for t, p in zip(self.traces, self.full_parts, strict=True)]
        return self._evidence

    def comm_free(self, run_paths: set[str], run_devices: list[DeviceSummary], cross: CrossRankSummary | None,
                  with_range: bool) -> WhatIf:
        from ..analysis.what_if.comm_free import combine_comm_free, cross_rank_columns

        futures = []
        for trace, full, part in zip(self.traces, self.full_parts, self.parts, strict=True):
            if part.header.path not in run_paths:
                continue
            columns = {d.rank: cross_rank_columns(cross, d.rank) for d in part.devices}
            futures.append(self.client.submit(_comm_costs, trace, full, columns, with_range, pure=False,
                                              priority=1))
        ranks: dict[int, RankCosts] = {}
        for costs in self.client.gather(futures):  # the first trace's costs of each rank, as the local engine
            for rank, value in costs.items():
                ranks.setdefault(rank, value)
        return combine_comm_free(ranks, run_devices, cross, with_range=with_range)

    def findings(self, result: Summary, options: SummaryOptions) -> list[Finding]:
        from ..findings import run_findings

        evidence: dict[EvidenceKey, DeviceEvidence] = {}
        for found in self.client.gather(self._submit_evidence()):
            evidence.update(found)
        wanted = _late_wanted(result)
        late = [self.client.submit(_late_evidence, trace, full, wanted[part.header.path], options, pure=False)
                for trace, full, part in zip(self.traces, self.full_parts, self.parts, strict=True)
                if part.header.path in wanted]
        for found in self.client.gather(late):
            _absorb(evidence, found)
        return run_findings([], result, options, evidence=evidence)


# -- tasks (run on the workers) -------------------------------------------------------------------------------
def _load(path: str, rules: str | None, window: Window | None, shown: str | None = None) -> Trace:
    """Load ``path`` (absolute: a worker's working directory is not the driver's) on a worker, the trace named
    ``shown`` as the user named it; an error on the worker says which worker read the file."""
    try:
        trace = load_file(path, rules=rules, tables=SUMMARY_TABLES, window=window)
    except BadInputError as exc:
        try:
            from distributed import get_worker

            where = get_worker().address
        except (ImportError, ValueError):
            where = None
        if where and exc.args:
            exc.args = (f"{exc.args[0]} (read by Dask worker {where}, which needs the file at this path)",)
        raise
    return trace if shown is None or shown == path else replace(trace, path=shown)


def _with_warnings(trace: Trace, warnings: list[str]) -> Trace:
    return replace(trace, warnings=[*trace.warnings, *warnings])


def _facts(trace: Trace) -> dict[str, Any]:
    return {"ranks": rank_facts(trace), "kernels": len(trace.kernels), "no_kernel_table": lacks_kernel_table(trace)}


def _compact(part: TracePart) -> TracePart:
    return part.compact()


def _comm_costs(trace: Trace, part: TracePart, columns: dict[int, Any], with_range: bool) -> dict[int, RankCosts]:
    from ..analysis.what_if.comm_free import trace_comm_costs

    return trace_comm_costs(trace, part.devices, None, columns, with_range=with_range, states=part.device_states())


def _evidence(trace: Trace, part: TracePart, options: Any) -> dict[EvidenceKey, DeviceEvidence]:
    from ..findings import materialized_evidence

    return materialized_evidence(trace, part.devices, options, states=part.device_states())


# -- the late evidence figures (findings.evidence.LATE_FIGURES) ----------------------------------------------------
def _late_wanted(result: Summary) -> dict[str, set[tuple[int, int]]]:
    """Per trace path, the (rank, device) pairs whose late findings evidence the rules will read
    (:func:`~traceanalyzer.findings.late_evidence_wanted`): asked of the traces' holders after the what-if."""
    from ..findings import late_evidence_wanted

    out: dict[str, set[tuple[int, int]]] = {}
    for d in late_evidence_wanted(result):
        out.setdefault(d.trace, set()).add((d.rank, d.device))
    return out


def _late_evidence(trace: Trace, part: TracePart, wanted: set[tuple[int, int]], options: SummaryOptions
                   ) -> dict[EvidenceKey, DeviceEvidence]:
    """On the worker holding the trace: the late evidence figures of its ``wanted`` (rank, device) pairs."""
    from ..findings import materialized_evidence
    from ..findings.evidence import LATE_FIGURES

    return materialized_evidence(trace, [d for d in part.devices if (d.rank, d.device) in wanted], options,
                                 figures=LATE_FIGURES, states=part.device_states())


def _absorb(evidence: dict[EvidenceKey, DeviceEvidence], late: dict[EvidenceKey, DeviceEvidence]) -> None:
    """The late figures joined to the evidence of the same devices."""
    for key, found in late.items():
        if key in evidence:
            evidence[key].absorb(found)
        else:
            evidence[key] = found
