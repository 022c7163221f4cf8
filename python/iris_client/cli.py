"""The command line: ``python3 -m iris_client --target HOST:PORT [options] "text"``.

Streams the reply to stdout (flushed per piece, a newline at the end). Exit status 0 on
success, 1 when the server answers an error (``error: <CODE>: <details>`` on stderr), 2 for bad
usage (including unreadable files), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from google.protobuf import text_format

from .client import Client
from .errors import IrisError

USAGE_ERROR = 2
RPC_ERROR = 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m iris_client",
        description="Ask an iris server about images and text; the reply is streamed to stdout.")
    parser.add_argument("text", nargs="?", help="the user's text (after the images)")
    parser.add_argument("--target", required=True, help="server address, HOST:PORT")
    parser.add_argument("--image", action="append", default=[], metavar="PATH",
                        help="an image file (repeatable; sent before the text, in order)")
    parser.add_argument("--max-tokens", type=int, help="most tokens to generate")
    parser.add_argument("--temperature", type=float, help="sampling temperature (0 = greedy)")
    parser.add_argument("--top-p", type=float, help="nucleus sampling mass, (0, 1]")
    parser.add_argument("--top-k", type=int, help="sample among the k likeliest tokens")
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument("--stop", action="append", metavar="TEXT", help="stop string")
    parser.add_argument("--ignore-eos", action="store_true", help="go past end-of-sequence")
    parser.add_argument("--min-pixels", type=int, help="lower resize bound of every image")
    parser.add_argument("--max-pixels", type=int, help="upper resize bound of every image")
    parser.add_argument("--request-id", help="the request's id (default: server-assigned)")
    parser.add_argument("--timeout", type=float, help="deadline in seconds")
    parser.add_argument("--token-file", metavar="F", help="file holding the bearer token")
    parser.add_argument("--tls-ca", metavar="F", help="PEM root certificates: use TLS")
    parser.add_argument("--info", action="store_true", help="print the server's model info")
    parser.add_argument("--verbose", action="store_true",
                        help="print the finish reason, usage and timings to stderr")
    args = parser.parse_args(argv)
    if args.text is None and not args.image and not args.info:
        parser.error("nothing to do: give text, --image or --info")
    return args


def read_file(path: str, what: str) -> bytes:
    """Reads a file named on the command line; unreadable is a usage error."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as error:
        raise UsageError(f"cannot read {what} {path}: {error.strerror}") from None


class UsageError(Exception):
    """Bad command-line input found after parsing (e.g. an unreadable file)."""


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    token = None
    if args.token_file:
        token = read_file(args.token_file, "token file").decode().strip()
    ca = read_file(args.tls_ca, "CA file") if args.tls_ca else None
    images = [read_file(path, "image") for path in args.image]
    with Client(args.target, token=token, root_certificates=ca, timeout=args.timeout) as client:
        if args.info:
            out.write(text_format.MessageToString(client.model_info()))
            out.flush()
        if args.text is None and not images:
            return 0
        stream = client.generate(
            text=args.text, images=images, stream=True, max_tokens=args.max_tokens,
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
            stop=args.stop, ignore_eos=args.ignore_eos, min_pixels=args.min_pixels,
            max_pixels=args.max_pixels, request_id=args.request_id)
        with stream:
            for piece in stream:
                out.write(piece)
                out.flush()
            out.write("\n")
            out.flush()
        if args.verbose and stream.completion is not None:
            c = stream.completion
            err.write(f"finish {c.finish_reason}; prompt {c.usage.prompt_tokens} tokens "
                      f"({c.usage.image_tokens} image), completion {c.usage.completion_tokens}; "
                      f"first token {c.timings.first_token_ms:.1f} ms, "
                      f"total {c.timings.total_ms:.1f} ms\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    args = parse_args(argv)
    try:
        return run(args, sys.stdout, sys.stderr)
    except (UsageError, ValueError) as error:  # ValueError: a value the request cannot hold
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except IrisError as error:
        sys.stdout.flush()
        print(f"error: {error.code.name}: {error.details}", file=sys.stderr)
        return RPC_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
