"""Finds the Python stubs generated from proto/iris/v1/iris.proto (the build makes them).

Search order: the folders in $IRIS_PYTHONPATH (os.pathsep-separated) if it is set; otherwise
$IRIS_BUILD_DIR/python if that is set, then <repo>/build/python. The first folder holding
iris_client/_proto/iris_pb2.py is put on sys.path.
"""

from __future__ import annotations

import os
import sys
from typing import List, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StubsNotFound(RuntimeError):
    pass


def candidate_dirs() -> List[str]:
    env = os.environ.get("IRIS_PYTHONPATH")
    if env:
        return [d for d in env.split(os.pathsep) if d]
    dirs = []
    build_dir = os.environ.get("IRIS_BUILD_DIR")
    if build_dir:
        dirs.append(os.path.join(build_dir, "python"))
    dirs.append(os.path.join(REPO_ROOT, "build", "python"))
    return dirs


def load_stubs() -> Tuple[object, object]:
    """(iris_pb2, iris_pb2_grpc), or StubsNotFound with what to do about it."""
    dirs = candidate_dirs()
    for d in dirs:
        if os.path.isfile(os.path.join(d, "iris_client", "_proto", "iris_pb2.py")):
            if d not in sys.path:
                sys.path.insert(0, d)
            break
    else:
        raise StubsNotFound(
            "iris-bench: the Python stubs of the iris API were not found (looked for "
            "iris_client/_proto/iris_pb2.py in: " + ", ".join(dirs) + ").\n"
            "Build them with `cmake --build build --target iris_python`, or point "
            "IRIS_PYTHONPATH (or IRIS_BUILD_DIR) at the build's python folder.")
    try:
        from iris_client._proto import iris_pb2, iris_pb2_grpc  # noqa: E402
    except ImportError as e:
        raise StubsNotFound(f"iris-bench: cannot import the iris API stubs from {d}: {e}") from None
    return iris_pb2, iris_pb2_grpc
