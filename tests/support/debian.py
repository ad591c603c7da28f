"""Debian's ``python3`` in containers, to run triton_side/ under the Pythons around Triton's.

Triton's images bring Python 3.10 (Ubuntu 22.04-based) or 3.12 (24.04-based). Debian's
bullseye, bookworm and trixie bring 3.9, 3.11 and 3.13, which bracket them
(docs/rehearsal.md). Each image is a minbase root with ``python3`` included, made the way
the container rehearsal makes its base (:meth:`rehearsal.Images.debian_root`:
``mmdebstrap --variant=minbase``, then ``docker import``), on the rehearsal's engine and
kept in its data root: it is rebuilt only when its recipe changes (about two minutes a
suite, cold), so a rerun costs container starts only.

:func:`run_commands` runs a list of commands in one container on the host's network
(a Triton or a fake listening on the host's loopback is reachable) and returns what each
printed and its exit code; :func:`run_on_host` runs the same list here, for comparison.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.ecs_local import DockerEngine
from tests.support.rehearsal import Images

SUITES = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}  # suite -> its python3
PYTHON = "{python}"  # in a command: the interpreter (the container's python3, or the host's)


def python_image(docker: DockerEngine, suite: str, log: Callable[[str], None] = print) -> str:
    """The image of ``suite``'s minbase root with ``python3``, built unless current."""
    return Images(docker, log=log).debian_root(suite, f"rehearsal/{suite}-python3", include=("python3",))


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


def _commands(commands: Iterable[Sequence[str]], python: str) -> list[list[str]]:
    return [[python if word == PYTHON else word for word in command] for command in commands]


def run_commands(
    docker: DockerEngine,
    image: str,
    commands: Sequence[Sequence[str]],
    mounts: Iterable[Path],
    work: Path,
    timeout: float = 300.0,
) -> list[Result]:
    """Run ``commands`` in turn in one container of ``image`` (``python3`` for PYTHON), host network.

    Each folder in ``mounts`` (and ``work``, where the outputs are collected)
    appears at the same path inside, so the commands' paths mean the same in
    both places. The container's environment is the image's: no variable of
    this process leaks into it.
    """
    work.mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh"]
    for i, command in enumerate(_commands(commands, "python3")):
        lines.append(f"{shlex.join(command)} >{work}/{i}.out 2>{work}/{i}.err </dev/null; echo $? >{work}/{i}.rc")
    (work / "run.sh").write_text("\n".join(lines) + "\n")
    volumes = [arg for folder in {*mounts, work} for arg in ("-v", f"{folder}:{folder}")]
    docker.cli("run", "--rm", "--network", "host", *volumes, image, "sh", str(work / "run.sh"), timeout=timeout)
    return [
        Result(int((work / f"{i}.rc").read_text()), (work / f"{i}.out").read_text(), (work / f"{i}.err").read_text())
        for i in range(len(commands))
    ]


def run_on_host(python: str, commands: Sequence[Sequence[str]], timeout: float = 60.0) -> list[Result]:
    """The same commands here, with ``python`` for PYTHON and an environment as bare as the container's."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    results = []
    for command in _commands(commands, python):
        proc = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL
        )
        results.append(Result(proc.returncode, proc.stdout, proc.stderr))
    return results
