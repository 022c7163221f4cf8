"""iris-server --engine-cpus / --worker-cpus / --encoder-cpus on the tiny model: after a request
with an image, every thread's allowed CPUs (/proc/<pid>/task/*/status) are the engine set for the
engine thread and the OpenMP team it started (threads named iris-engine), the encoder set for the
encoder's thread (iris-encoder), and the worker set for every other thread; bad lists, unusable
CPUs and an encoder set without or overlapping the engine's stop the server at startup naming the
flag.

Needs two CPUs in this process's affinity mask (skipped otherwise), IRIS_SERVER_BIN and
IRIS_TEST_MODELS (the model_tiny fixture).
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from iris_test_util import ServerProcess, data_path, env_path, tiny_model  # noqa: E402

from iris_client import Client  # noqa: E402

SERVER_BIN = env_path("IRIS_SERVER_BIN")
IMAGE = data_path("images", "rgb_300x200.png")
ALLOWED = sorted(os.sched_getaffinity(0))


def parse_cpu_list(text: str) -> list[int]:
    out = []
    for item in text.split(","):
        lo, _, hi = item.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def threads_of(pid: int) -> list[tuple[str, list[int]]]:
    """(name, allowed CPUs) of every thread of process `pid`."""
    out = []
    task_dir = f"/proc/{pid}/task"
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"{task_dir}/{tid}/status") as f:
                cpus = next(l.split(":", 1)[1].strip() for l in f if l.startswith("Cpus_allowed_list:"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        out.append((name, parse_cpu_list(cpus)))
    return out


def server_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "OMP_NUM_THREADS")}
    env.update(extra)
    return env


def start(env: dict, *args: str) -> ServerProcess:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # ServerProcess passes the environment on as it is
    try:
        return ServerProcess(SERVER_BIN, ["--model", tiny_model(), "--port", "0", *args])
    finally:
        os.environ.clear()
        os.environ.update(saved)


@unittest.skipUnless(SERVER_BIN, "IRIS_SERVER_BIN is not set")
@unittest.skipUnless(len(ALLOWED) >= 2, "needs two CPUs in the affinity mask")
class AffinityTest(unittest.TestCase):
    def run_request(self, server: ServerProcess) -> None:
        with Client(server.target, timeout=120) as client:
            reply = client.generate(text="Describe this image.", images=[IMAGE], max_tokens=8)
            self.assertTrue(reply.text)

    def test_engine_team_and_workers_on_their_cpus(self):
        engine, workers = ALLOWED[0], ALLOWED[1]
        # Two team threads on one CPU, so that the team has a thread besides the engine's own.
        server = start(server_env(OMP_NUM_THREADS="2"), f"--engine-cpus={engine}", f"--worker-cpus={workers}")
        try:
            self.assertIn(f"engine on CPUs {engine}, workers on CPUs {workers}", server.stderr())
            self.assertIn(", 1 workers,", server.stderr())  # --workers 0: one per worker CPU
            self.run_request(server)
            threads = threads_of(server.proc.pid)
        finally:
            self.assertEqual(server.stop(timeout=60), 0, server.stderr()[-4000:])
        names = [name for name, _ in threads]
        self.assertGreaterEqual(names.count("iris-engine"), 2, threads)  # the engine thread + its team
        self.assertGreaterEqual(names.count("iris-worker"), 1, threads)
        for name, cpus in threads:
            want = [engine] if name == "iris-engine" else [workers]
            self.assertEqual(cpus, want, f"thread {name}: {threads}")

    def test_engine_set_alone_sizes_the_team(self):
        server = start(server_env(), f"--engine-cpus={ALLOWED[-1]}")
        try:
            self.assertIn(", 1 threads,", server.stderr())  # the team: one thread per engine CPU
            self.run_request(server)
            threads = threads_of(server.proc.pid)
        finally:
            self.assertEqual(server.stop(timeout=60), 0, server.stderr()[-4000:])
        engine = [cpus for name, cpus in threads if name == "iris-engine"]
        self.assertEqual(engine, [[ALLOWED[-1]]], threads)  # a team of one: no extra thread
        for name, cpus in threads:
            if name != "iris-engine":
                self.assertEqual(cpus, ALLOWED, f"thread {name} is not pinned: {threads}")

    def test_encoder_team_on_its_own_cpus(self):
        engine, encoder = ALLOWED[0], ALLOWED[1]
        server = start(server_env(), f"--engine-cpus={engine}", f"--encoder-cpus={encoder}")
        try:
            self.assertIn(f"engine on CPUs {engine}, encoder on CPUs {encoder}", server.stderr())
            self.assertIn("the encoder beside it on cpu", server.stderr())
            with Client(server.target, timeout=60) as client:
                info = client.model_info()
            self.assertIn(", 1 threads,", info.encoder_device)
            self.assertTrue(info.device.startswith("cpu: "), info.device)
            self.run_request(server)  # an image: encoded on the encoder's thread
            threads = threads_of(server.proc.pid)
        finally:
            self.assertEqual(server.stop(timeout=60), 0, server.stderr()[-4000:])
        names = [name for name, _ in threads]
        self.assertEqual(names.count("iris-encoder"), 1, threads)  # a team of one: the thread alone
        for name, cpus in threads:
            if name in ("iris-engine", "iris-encoder"):
                self.assertEqual(cpus, [engine if name == "iris-engine" else encoder], f"thread {name}: {threads}")

    def test_bad_lists_stop_the_server_naming_the_flag(self):
        beyond = ALLOWED[-1] + 1
        for args, env, message in (
                (["--engine-cpus=0-"], {}, '--engine-cpus: "0-" is not a CPU number or range N-M'),
                (["--worker-cpus=1,,0"], {}, "--worker-cpus: empty item"),
                (["--engine-cpus=3-1"], {}, '--engine-cpus: range "3-1" ends before it starts'),
                ([f"--worker-cpus={beyond}"], {}, f"--worker-cpus: CPU {beyond} not among the CPUs this process may run on"),
                (["--engine-cpus=0"], {"OMP_PLACES": "cores"}, "--engine-cpus: OMP_PLACES is set"),
                ([f"--encoder-cpus={ALLOWED[0]}"], {}, "--encoder-cpus needs --engine-cpus"),
                ([f"--engine-cpus={ALLOWED[0]}", f"--encoder-cpus={ALLOWED[0]}"], {},
                 f"--encoder-cpus and --engine-cpus share CPU {ALLOWED[0]}")):
            run = subprocess.run([SERVER_BIN, "--model", tiny_model(), "--port", "0", *args],
                                 env=server_env(**env), capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL)
            self.assertEqual(run.returncode, 1, args)
            self.assertIn(message, run.stderr, args)


if __name__ == "__main__":
    unittest.main()
