"""Latency of a policy's single-observation calls: SB3 eager, TorchScript, ONNX Runtime.

Measured by its worst case, not its mean: p50, p99 and max of ``calls`` timed calls after
``warmup`` untimed ones, the first call on a freshly loaded instance reported apart, and the
end-to-end time from the environment's numpy observation to a numpy action (host-to-device
copies included). A 100 Hz control loop leaves less than 10 ms per step.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.deploy.graph import INPUT_NAME, DeployedPolicy, example_input, onnx_session
from workbench.training.model import PolicySource


def latency_stats(samples_s: np.ndarray) -> dict[str, float]:
    """p50, p99, max and mean of per-call times, in milliseconds."""
    ms = samples_s * 1e3
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(np.max(ms)),
        "mean": float(np.mean(ms)),
    }


def time_calls(call: Callable[[], Any], calls: int) -> np.ndarray:
    """Wall time of each of ``calls`` calls, in seconds."""
    samples = np.empty(calls)
    clock = time.perf_counter
    for i in range(calls):
        started = clock()
        call()
        samples[i] = clock() - started
    return samples


@dataclass
class Backend:
    """One inference path: a fresh instance, an inference-only call and an end-to-end call.

    ``load()`` returns ``(inference, end_to_end)``: ``inference`` runs on an input prepared
    in the backend's own type; ``end_to_end`` starts from the environment's float64 numpy
    observation and ends with a numpy action (normalization outside the graph, numpy->tensor
    conversion, copies included).
    """

    name: str
    load: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]]


def latency_backends(
    source: PolicySource, torchscript_path: Path, onnx_path: Path, obs: np.ndarray
) -> list[Backend]:
    """SB3 eager, TorchScript and ONNX Runtime on one raw observation ``obs`` (float64)."""
    raw = obs[None].astype(np.float64)

    def sb3() -> tuple[Callable[[], Any], Callable[[], Any]]:
        policy = copy.deepcopy(source.model.policy)  # a fresh instance for the first call
        prepared = torch.as_tensor(source.normalize(raw))

        def inference() -> Any:
            with torch.no_grad():
                return policy._predict(prepared, deterministic=True)

        return inference, lambda: policy.predict(source.normalize(raw), deterministic=True)

    def torchscript() -> tuple[Callable[[], Any], Callable[[], Any]]:
        module = torch.jit.load(str(torchscript_path))
        prepared = torch.from_numpy(raw.astype(np.float32))

        def inference() -> Any:
            with torch.no_grad():
                return module(prepared)

        def end_to_end() -> Any:
            with torch.no_grad():
                return module(torch.from_numpy(raw.astype(np.float32))).numpy()

        return inference, end_to_end

    def onnxruntime() -> tuple[Callable[[], Any], Callable[[], Any]]:
        session = onnx_session(onnx_path, threads=1)
        prepared = raw.astype(np.float32)
        return (
            lambda: session.run(None, {INPUT_NAME: prepared}),
            lambda: session.run(None, {INPUT_NAME: raw.astype(np.float32)})[0][0],
        )

    return [Backend("sb3_eager", sb3), Backend("torchscript", torchscript),
            Backend("onnxruntime", onnxruntime)]


def measure_latency(
    backends: Sequence[Backend], calls: int, warmup: int
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Per backend: first call on a fresh instance, then ``warmup`` untimed calls, then
    ``calls`` timed inference-only and ``calls`` timed end-to-end calls.

    One thread for torch and ONNX Runtime: a controller runs one observation at a time next
    to other work, and one thread keeps the figures comparable across machines.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    samples: dict[str, np.ndarray] = {}
    try:
        for backend in backends:
            inference, end_to_end = backend.load()
            first = time_calls(end_to_end, 1)[0]
            for _ in range(warmup):
                end_to_end()
            samples[f"{backend.name}/inference"] = time_calls(inference, calls)
            samples[f"{backend.name}/end_to_end"] = time_calls(end_to_end, calls)
            results[backend.name] = {
                "first_call_ms": float(first * 1e3),
                "inference_ms": latency_stats(samples[f"{backend.name}/inference"]),
                "end_to_end_ms": latency_stats(samples[f"{backend.name}/end_to_end"]),
            }
    finally:
        torch.set_num_threads(threads)
    report = {"calls": calls, "warmup": warmup, "threads": 1, "backends": results}
    return report, samples


def fp16_variant(
    module: DeployedPolicy, obs: np.ndarray, expected: np.ndarray, directory: Path,
    calls: int, warmup: int,
) -> dict[str, Any]:
    """FP16 actor on the GPU (TorchScript), when CUDA is present; skipped cleanly otherwise.

    Only the MLP runs in half precision: normalization stays float64 and the output float32.
    Its parity is reported, not enforced (FP16 differs by ~1e-3); no INT8 variant, control
    policies are sensitive to small input changes.
    """
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device (FP16 runs only on a GPU)"}
    half = copy.deepcopy(module).cuda()
    half.head.half()
    half.actor_dtype = torch.float16
    path = directory / "policy_fp16_cuda.pt"
    with torch.no_grad():
        traced = torch.jit.trace(half, example_input(obs.shape[1]).cuda())
    traced.save(str(path))
    with torch.no_grad():
        out = traced(torch.from_numpy(obs).cuda()).cpu().numpy()
    raw = obs[:1]

    def end_to_end() -> Any:
        with torch.no_grad():  # host->device and device->host copies included (.cuda/.cpu)
            return traced(torch.from_numpy(raw).cuda()).cpu().numpy()

    first = time_calls(end_to_end, 1)[0]
    for _ in range(warmup):
        end_to_end()
    return {
        "file": path.name,
        "device": torch.cuda.get_device_name(0),
        "max_abs_diff_vs_fp32_reference": float(np.max(np.abs(out - expected))),
        "first_call_ms": float(first * 1e3),
        "end_to_end_ms": latency_stats(time_calls(end_to_end, calls)),
    }
