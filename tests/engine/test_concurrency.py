"""One shared engine under 64 asyncio tasks and 4 threads at once, with vLLM inside this process and in its own
engine processes: every result equals the sequential result for the same input, nothing deadlocks, the whole run
finishes within a generous bound, and vLLM's scheduler batches the concurrent callers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from corpus import mixed_length

from rbln_retrieval import PoolingEngine

TASKS, THREADS, CALLS = 64, 4, 480
THREAD_CALLS = 96  # of CALLS; the asyncio tasks issue the rest (64 tasks, 6 calls each)
TIMEOUT = 1_200  # seconds; generous for a loaded 2-core machine, the test asserts no speed


def call_plan() -> list[tuple[str, Any]]:
    """Forty distinct calls, half embed (1-5 texts, documents or queries) and half score (a query and 1-6 documents)."""
    texts = mixed_length(120)
    plan: list[tuple[str, Any]] = []
    for i in range(20):
        plan.append(("embed", (texts[i * 5 : i * 5 + 1 + i % 5], "query" if i % 3 == 0 else "document")))
        plan.append(("score", (texts[100 + i], texts[i * 4 : i * 4 + 1 + i % 6])))
    return plan


def run_sync(engine, call: tuple[str, Any]) -> Any:
    name, args = call
    if name == "embed":
        return engine.embed(args[0], kind=args[1])
    return engine.score(*args)


async def run_async(engine, call: tuple[str, Any]) -> Any:
    name, args = call
    if name == "embed":
        return await engine.aembed(args[0], kind=args[1])
    return await engine.ascore(*args)


def assert_same(result: Any, expected: Any, call: tuple[str, Any]) -> None:
    if call[0] == "embed":
        assert result.shape == expected.shape
        np.testing.assert_allclose(result, expected, atol=1e-5)
    else:
        assert result == pytest.approx(expected, abs=1e-5)


@pytest.fixture(scope="module", params=["in-process", "engine-processes"])
def engine(request, minilm, minilm_engine) -> Iterator[PoolingEngine]:
    if request.param == "in-process":
        yield minilm_engine
        return
    processes = PoolingEngine.shared(minilm, device="cpu", dtype="float32", in_process=False)
    yield processes
    processes.close()  # not left to the exit hook: the session's last lines stay pytest's summary


async def test_tasks_and_threads_share_one_engine_and_get_the_sequential_results(engine):
    plan = call_plan()
    expected = [run_sync(engine, call) for call in plan]
    # Call k runs plan[k % 40]: the threads take the first THREAD_CALLS, the tasks the rest, interleaved.
    thread_calls = [list(range(t, THREAD_CALLS, THREADS)) for t in range(THREADS)]
    task_calls = [list(range(THREAD_CALLS + t, CALLS, TASKS)) for t in range(TASKS)]
    done: list[int] = []
    failures: list[BaseException] = []

    def thread_worker(ks: list[int]) -> None:
        try:
            for k in ks:
                assert_same(run_sync(engine, plan[k % 40]), expected[k % 40], plan[k % 40])
                done.append(k)
        except BaseException as exc:  # reported by the main test below
            failures.append(exc)

    async def task_worker(ks: list[int]) -> None:
        for k in ks:
            assert_same(await run_async(engine, plan[k % 40]), expected[k % 40], plan[k % 40])
            done.append(k)

    threads = [threading.Thread(target=thread_worker, args=(ks,), daemon=True) for ks in thread_calls]
    for thread in threads:
        thread.start()
    await asyncio.wait_for(asyncio.gather(*(task_worker(ks) for ks in task_calls)), timeout=TIMEOUT)
    for thread in threads:
        await asyncio.to_thread(thread.join, TIMEOUT)
        assert not thread.is_alive(), "a sync caller is still blocked: deadlock or lost request"
    assert not failures, failures[0]
    assert sorted(done) == list(range(CALLS))


async def test_concurrent_async_callers_are_batched_into_shared_steps(engine):
    texts = mixed_length(TASKS)
    expected = engine.embed(texts, kind="query")
    before = engine.stats()["steps"]
    results = await asyncio.gather(*(engine.aembed([text], kind="query") for text in texts))
    steps = engine.stats()["steps"] - before
    for row, result in zip(expected, results):
        np.testing.assert_allclose(result[0], row, atol=1e-5)
    # One step per caller would mean no batching; the scheduler packs callers that arrive while a step computes.
    print(f"\n{TASKS} concurrent callers: {steps} steps")
    assert steps < TASKS // 2, f"{TASKS} concurrent callers took {steps} steps"
