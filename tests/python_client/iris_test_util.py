"""Helpers of the iris_client tests: paths from the environment, the iris-server process, the
standard health/reflection services (through a descriptor set) and self-signed TLS files."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc

READY_RE = re.compile(r"iris-server: listening on (\S+):(\d+)")


def env_path(name: str) -> str | None:
    """The path in environment variable ``name``, or None when unset or empty."""
    value = os.environ.get(name, "")
    return value or None


def data_path(*parts: str) -> str:
    """A path under tests/data (IRIS_TEST_DATA, else next to this folder)."""
    root = env_path("IRIS_TEST_DATA") or os.path.join(os.path.dirname(__file__), "..", "data")
    return os.path.join(root, *parts)


def tiny_model() -> str:
    """The tiny synthetic checkpoint made by the ctest fixture model_tiny."""
    root = env_path("IRIS_TEST_MODELS")
    if root is None:
        raise RuntimeError("IRIS_TEST_MODELS is not set")
    return os.path.join(root, "tiny")


class ServerProcess:
    """An iris-server child process: started with ``args``, ready once it prints its
    listening line on stderr (the port is read from it), stopped with ``stop()``."""

    def __init__(self, binary: str, args: Sequence[str], ready_timeout: float = 60.0) -> None:
        self.args = [binary, *args]
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.host = ""
        self.port = 0
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, errors="replace")
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + ready_timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(2)
                raise RuntimeError(f"iris-server exited with {self.proc.returncode} before "
                                   f"listening: {' '.join(self.args)}\n{self.stderr()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"iris-server not ready in {ready_timeout} s\n{self.stderr()}")

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self._lines.append(line)
            if not self._ready.is_set():
                match = READY_RE.search(line)
                if match:
                    self.host, self.port = match.group(1), int(match.group(2))
                    self._ready.set()

    @property
    def target(self) -> str:
        """``host:port`` to connect to."""
        return f"{self.host}:{self.port}"

    def stderr(self) -> str:
        """Everything the server has written to stderr so far."""
        with self._lock:
            return "".join(self._lines)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stderr is not None and not self._reader.is_alive():
            self.proc.stderr.close()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; returns the exit code of the SIGTERM
        (None when it had to be killed)."""
        code = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            code = self.wait(timeout)
        else:
            code = self.proc.returncode
        self.kill()
        return code


class StdServices:
    """grpc.health.v1 and grpc.reflection.v1alpha messages built from the descriptor set the
    build generates (IRIS_GRPC_DESCRIPTORS), called with explicit serializers."""

    def __init__(self, descriptor_set: str) -> None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        with open(descriptor_set, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        self._pool = descriptor_pool.DescriptorPool()
        for file in files.file:
            self._pool.Add(file)
        get_class = getattr(message_factory, "GetMessageClass", None)
        factory = message_factory.MessageFactory(self._pool)

        def message(name: str) -> Any:
            descriptor = self._pool.FindMessageTypeByName(name)
            return get_class(descriptor) if get_class else factory.GetPrototype(descriptor)

        self.HealthCheckRequest = message("grpc.health.v1.HealthCheckRequest")
        self.HealthCheckResponse = message("grpc.health.v1.HealthCheckResponse")
        self.ReflectionRequest = message("grpc.reflection.v1alpha.ServerReflectionRequest")
        self.ReflectionResponse = message("grpc.reflection.v1alpha.ServerReflectionResponse")

    def health_check(self, channel: grpc.Channel, service: str = "",
                     timeout: float = 5.0, metadata: Any = None) -> str:
        """The serving status name ("SERVING", "NOT_SERVING", ...) of ``service``."""
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=self.HealthCheckRequest.SerializeToString,
            response_deserializer=self.HealthCheckResponse.FromString)
        response = check(self.HealthCheckRequest(service=service), timeout=timeout,
                         metadata=metadata)
        return self.HealthCheckResponse.ServingStatus.Name(response.status)

    def list_services(self, channel: grpc.Channel, timeout: float = 5.0) -> list[str]:
        """The service names that server reflection lists."""
        info = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=self.ReflectionRequest.SerializeToString,
            response_deserializer=self.ReflectionResponse.FromString)
        responses = info(iter([self.ReflectionRequest(list_services="*")]), timeout=timeout)
        names: list[str] = []
        for response in responses:
            names.extend(s.name for s in response.list_services_response.service)
        return names


def std_services() -> StdServices | None:
    """StdServices from IRIS_GRPC_DESCRIPTORS, or None when it is not available."""
    path = env_path("IRIS_GRPC_DESCRIPTORS")
    if path is None or not os.path.exists(path):
        return None
    return StdServices(path)


def make_self_signed_cert(directory: str) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1/localhost made with the openssl CLI;
    returns (cert.pem, key.pem) paths."""
    cert = os.path.join(directory, "cert.pem")
    key = os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
         "-out", cert, "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    return cert, key
