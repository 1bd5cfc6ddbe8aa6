"""What the GPU measurements share: timing by CUDA-graph replay, the card's ceilings, exact fp32 for the token
checks, random models of the course's shapes, the machine, and a runner that writes the JSON after every part."""
from __future__ import annotations

import contextlib
import datetime
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from course.paths import REPO_ROOT
from course.results import machine as host_machine
from step01_kvcache.model import Transformer
from step01_kvcache.rope import RotaryEmbedding
from step01_kvcache.tiny import SMOLLM2_135M, tiny_model

CHAPTER = REPO_ROOT / "step06_triton"  # the chapter this measures: its lesson, and its results beside it
RESULTS = CHAPTER / "results"
LLAMA_3_2_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                    num_kv_heads=8, head_dim=64, rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                    tie_word_embeddings=True)
MODELS = {"smollm2_135m": SMOLLM2_135M, "llama_3_2_1b": LLAMA_3_2_1B}
# The module a recorded command ran -> the module that runs the same bench, with the same flags, today. A results
# file keeps its command as it was run; a page shows the one a reader can type (tests/lessons/test_commands_exist.py
# checks every command a page shows).
RUNS_TODAY = {"step06_triton.bench": "benchmarks.step06.kernels", "step06_triton.e2e": "benchmarks.step06.engine"}


def command_today(recorded: str) -> str:
    """The command that reruns the bench a results file's `recorded` command ran (the file itself is not changed)."""
    head, sep, tail = recorded.partition(" -m ")
    module, space, args = tail.partition(" ")
    return head + sep + RUNS_TODAY.get(module, module) + space + args if sep else recorded


def median_ms(fn: Callable[[], object]) -> float:
    """Median time of one call of `fn` replayed from a CUDA graph, as an engine replays its decode steps (the
    host's launch overhead out of the measurement, which matters for launches of tens of microseconds), with the
    L2 cache flushed before every replay; plain launches if `fn` cannot be captured."""
    import triton.testing
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return eager_ms(fn)
    ms = float(triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median"))
    del graph
    return ms


def replay_us(graph: torch.cuda.CUDAGraph, times: int) -> list[float]:
    """Microseconds of each of `times` replays of a captured step, timed by CUDA events (its caches warm, as an
    engine replays one step after another)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(times):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


def eager_ms(fn: Callable[[], object]) -> float:
    """Median time of one call of `fn` launched as it is (its host work included when it exceeds the GPU's)."""
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def checked(out: torch.Tensor, ref: torch.Tensor, what: str, tol: float = 1e-2) -> float:
    """The relative error of a bf16 result against its fp32 reference; a wrong kernel stops the run."""
    err = rel_err(out, ref)
    if not err < tol:  # NaN fails too
        raise AssertionError(f"{what}: relative error {err:.3g} against the fp32 reference")
    return err


def copy_bandwidth(nbytes: int = 2**31, probes: int = 3) -> float:
    """Bytes per second of a device-to-device copy of `nbytes` (bytes read + written): what moving these bytes can
    cost at best, the ceiling of a memory-bound kernel. The fastest of `probes` copies, each between fresh buffers:
    on an H200 one probe now and then reads 2.7 TB/s where copies reach 4.2, and a floor set by a slow probe would
    flatter whatever is held against it."""
    best = 0.0
    for _ in range(probes):
        x = torch.randn(nbytes // 4, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)  # a fixed destination: a clone inside a graph read low
        best = max(best, 2 * x.nbytes / (median_ms(lambda x=x, y=y: y.copy_(x)) / 1e3))
        del x, y
    return best


def ceilings() -> dict:
    """What the card can do at all: device-to-device copy (bytes read + written) and a bf16 matmul."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm = median_ms(lambda: a @ b)
    return dict(copy_tb_s=round(copy_bandwidth() / 1e12, 3), matmul_tflop_s=round(2 * 8192**3 / mm / 1e9, 1))


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 matmuls without TF32 inside the block (token identity is checked in exact fp32), the flag as it was
    after it, whatever happens inside."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def random_model(shape: dict, dtype: torch.dtype, device: str = "cuda", seed: int = 0) -> Transformer:
    """A model of the course's architecture in `shape` (SmolLM2-135M's, a Llama-3.2-1B's), random weights: the real
    ones do not travel to the GPU machine. RoPE frequencies stay fp32."""
    model = tiny_model(seed, **shape).to(device=device, dtype=dtype)
    cfg = model.config
    model.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta).to(device)
    return model


def machine() -> dict:
    """The host (course.results.machine), the GPU and the day."""
    import triton
    props = torch.cuda.get_device_properties(0)
    return dict(host_machine(), gpu=props.name, sms=props.multi_processor_count,
                gpu_memory_gib=round(props.total_memory / 2**30, 1), triton=triton.__version__,
                date=datetime.date.today().isoformat())


class Parts:
    """Runs a measurement's parts one by one into one JSON file, written after every part: a part that raises is
    reported in the file (its traceback printed) and the others still run; with `keep`, the file's other parts
    stay."""

    def __init__(self, out: Path | None, command: str, keep: bool = False) -> None:
        self.out, self.t0 = out, time.perf_counter()
        old = json.loads(out.read_text()) if keep and out and out.is_file() else {}
        self.result: dict = {**old, "chapter": "step06", "machine": machine() if torch.cuda.is_available() else {}}
        self.result.setdefault("commands", []).append(command)

    def run(self, key: tuple[str, ...], fn: Callable[[], dict]) -> dict:
        node = self.result
        for k in key[:-1]:
            node = node.setdefault(k, {})
        try:
            node[key[-1]] = fn()
        except Exception as exc:  # noqa: BLE001 - reported in the JSON, not hidden
            traceback.print_exc()
            node[key[-1]] = dict(error=error_text(exc))
        print(*key, json.dumps(node[key[-1]])[:1200], flush=True)
        self.save()
        torch.cuda.empty_cache()
        return node[key[-1]]

    def finish(self, goals: Callable[[dict], list[dict]]) -> None:
        """The targets judged on whatever parts ran (JSON key `goals`), written, and printed met or missed."""
        self.result["goals"] = goals(self.result)
        self.save()
        for g in self.result["goals"]:
            print(("MET   " if g["met"] else "MISSED"), g["goal"], g["measured"])

    def save(self) -> None:
        self.result["duration_s"] = round(time.perf_counter() - self.t0, 1)
        if self.out:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(json.dumps(self.result, indent=1) + "\n")


def error_text(exc: Exception) -> str:
    """How a results file records a part that raised: the exception's type and its message's first line."""
    first = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def needs_gpu(name: str) -> bool:
    """True when there is a GPU; otherwise says so and the caller exits 2."""
    if torch.cuda.is_available():
        return True
    print(f"{name} needs a CUDA GPU (the CPU runs the kernels only through Triton's interpreter)", file=sys.stderr)
    return False
