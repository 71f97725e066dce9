"""Several runs of one packed step at once in one stub process (step parameter `execution_threads` > 1).

Each Triton instance of a python-backend step is a process with its own CUDA context, and the GPU time-slices
contexts: on the H100 four processes calling session.run made 873 runs/s, one process of four threads calling one
session 1,391 (onnxruntime gives concurrent runs their own CUDA streams; loadtest/results/h100-20m-threads). So a
GPU step runs as one instance whose execute() only checks its requests and queues them, and returns None; worker
threads merge what is queued, up to the token budget, run it, and answer each request through its response sender
(a non-decoupled model may, since Triton 24.06: exactly one response per request, with the final flag). Triton
counts the instance free as soon as execute() returns, so requests reach the queue as they arrive and a free
worker takes all that waits, the way four instances took what Triton's batcher had queued.

A lone short text that finds every worker idle replays its CUDA graph in execute() itself: onnxruntime keeps a
graph in the thread that captured it (initialize(), the same thread), and the answer goes back as execute()'s
return value, without a hand-over.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils
from cancellation import CHECK_CANCELLED_AFTER_S, cancelled_response
from packed_runner import _error_response

JOIN_TIMEOUT_S = 30.0  # finalize(): how long the workers may take to answer what is queued
# Threads that send answers. A send is one round trip to Triton's process, which handles sends on a pool of its own
# (32 threads): sent one after another from the worker that ran them, the ensemble's single texts (dozens of requests
# per run) made a run wait for each of its answers in turn, and served 3,100 texts/s against 5,000 before.
SEND_THREADS = 8
REPORT_EVERY_S = 30.0  # how often Triton's log gets where the runs' time went (Triton's own statistics see execute()
                       # only, which here just queues)


class StageTimes:
    """Where the threaded step's time goes, summed between reports: execute() calls, and per run the wait in the
    queue (of its oldest request), session.run and the rest of the run's work, and sending the answers."""

    def __init__(self, name):
        self.name, self.lock, self.since = name, threading.Lock(), time.perf_counter()
        self.sums = dict.fromkeys(("execute", "calls", "runs", "requests", "rows", "wait", "run", "send"), 0.0)

    def add(self, **amounts):
        with self.lock:
            for key, amount in amounts.items():
                self.sums[key] += amount
            due = time.perf_counter() - self.since >= REPORT_EVERY_S
        if due:
            self.report()

    def report(self):
        """Log the sums since the last report (if any run was made), and start again."""
        with self.lock:
            now = time.perf_counter()
            s, seconds, self.since = dict(self.sums), now - self.since, now
            self.sums = dict.fromkeys(self.sums, 0.0)
        runs = s["runs"]
        if not runs:
            return
        pb_utils.Logger.log_info(
            f"{self.name}: {runs / seconds:.0f} runs/s over {seconds:.0f}s, {s['requests'] / runs:.1f} requests and "
            f"{s['rows'] / runs:.1f} rows each; per run: {s['wait'] / runs * 1e3:.2f} ms queued, "
            f"{s['run'] / runs * 1e3:.2f} ms running, {s['send'] / runs * 1e3:.2f} ms handing the answers over; "
            f"execute(): {s['calls'] / seconds:.0f}/s, {s['execute'] / max(s['calls'], 1) * 1e3:.2f} ms each")


class ThreadedSteps:
    """execute(requests) for a PackedSteps run by `threads` worker threads (see the module's docstring)."""

    def __init__(self, steps, threads, name="step"):
        self.steps, self.name = steps, name
        self.queue = []  # (part, sender, time queued), in arrival order
        self.busy = 0  # workers running a batch
        self.stopping = False
        self.changed = threading.Condition()
        self.threads, self.workers = threads, []
        self.times = StageTimes(name)
        self.senders = ThreadPoolExecutor(SEND_THREADS, thread_name_prefix=f"{name}-send")

    def start(self, gpu):
        """Start the workers; on a GPU they first make the step's warm-up runs all at once, size by size: concurrent
        runs get CUDA streams of their own (onnxruntime's stream pool), each with its own cuBLAS handle, and each
        handle would otherwise meet every token count cold under load. Returns a line for Triton's log."""
        started = time.perf_counter()
        feeds = list(self.steps.warm_feeds(gpu)) if gpu else []
        side_by_side = threading.Barrier(self.threads)
        warmed = threading.Barrier(self.threads + 1)
        self.workers = [threading.Thread(target=self._work, args=(feeds, side_by_side, warmed),
                                         name=f"{self.name}-run-{k}", daemon=True) for k in range(self.threads)]
        for worker in self.workers:
            worker.start()
        warmed.wait()
        return (f"{self.threads} execution threads ({len(feeds)} warm-up runs each, side by side, in "
                f"{time.perf_counter() - started:.1f}s)")

    def _warm_up(self, feeds, side_by_side, warmed):
        try:
            for feed in feeds:
                side_by_side.wait()
                self.steps.session.run(self.steps.outputs, feed)
        except threading.BrokenBarrierError:
            pass  # another thread's warm-up run failed (it said why): this one stops warming too
        except Exception as exc:  # noqa: BLE001 - a failed warm-up run only costs a cold first call
            side_by_side.abort()
            pb_utils.Logger.log_warn(f"{self.name}: warm-up run failed: {str(exc)[:300]}")
        finally:
            warmed.wait()

    def __call__(self, requests):
        start = time.perf_counter()
        parts, errors = self.steps.parse(requests, copy=True)
        with self.changed:
            idle = not self.queue and not self.busy
        if not errors and idle and self.steps.graphed(parts):
            return self.steps(requests)  # the lone short text's graph, on this thread (see the module's docstring)
        for index, response in errors.items():
            self._send(requests[index].get_response_sender(), response)
        now = time.perf_counter()
        queued = [(part, requests[part.index].get_response_sender(), now) for part in parts]
        with self.changed:
            self.queue.extend(queued)  # at once: a worker takes an execute()'s requests together
            self.changed.notify()
        self.times.add(execute=time.perf_counter() - start, calls=1)
        return None

    def _take(self):
        """The next requests to run: at least the oldest, then those behind it within the token budget; None when
        stopping with nothing queued."""
        with self.changed:
            while not self.queue and not self.stopping:
                self.changed.wait()
            if not self.queue:
                return None
            tokens, count = 0, 0
            for part, _, _ in self.queue:
                if count and tokens + part.rows.tokens > self.steps.max_tokens:
                    break
                tokens += part.rows.tokens
                count += 1
            taken, self.queue = self.queue[:count], self.queue[count:]
            self.busy += 1
            if self.queue:
                self.changed.notify()  # more waits: another worker may take it
            return taken

    def _work(self, feeds, side_by_side, warmed):
        self._warm_up(feeds, side_by_side, warmed)
        while (taken := self._take()) is not None:
            try:
                self._run(taken)
            finally:
                with self.changed:
                    self.busy -= 1

    def _run(self, taken):
        start = time.perf_counter()
        live = []
        for item in taken:  # one that waited long may have been given up by its caller
            if start - item[2] > CHECK_CANCELLED_AFTER_S and item[1].is_cancelled():
                self._send(item[1], cancelled_response())
            else:
                live.append(item)
        answered, sent = 0, start
        try:
            responses = self.steps.run([part for part, _, _ in live], graphs=False)
            sent = time.perf_counter()
            for response, (_, sender, _) in zip(responses, live):
                self._send(sender, response)
                answered += 1
        except Exception as exc:  # noqa: BLE001 - a request must never be left without its answer
            message = f"the step failed on this request: {type(exc).__name__}: {exc}"
            for _, sender, _ in live[answered:]:
                self._send(sender, _error_response(message, "INTERNAL"))
        self.times.add(runs=1, requests=len(taken), rows=sum(part.rows.rows for part, _, _ in taken),
                       wait=start - taken[0][2], run=sent - start, send=time.perf_counter() - sent)

    def _send(self, sender, response):
        """Hand an answer to a send thread (see SEND_THREADS)."""
        self.senders.submit(self._send_now, sender, response)

    def _send_now(self, sender, response):
        try:
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # noqa: BLE001 - e.g. the request was cancelled and Triton let it go
            pb_utils.Logger.log_warn(f"{self.name}: a response could not be sent: {str(exc)[:300]}")

    def close(self):
        """Answer what is queued, then stop the workers."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        for worker in self.workers:
            worker.join(JOIN_TIMEOUT_S)
        self.senders.shutdown(wait=True)
        self.times.report()
