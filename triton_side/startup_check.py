"""Start-up self-check for the Triton container: is this the GPU and driver the image needs?

Run before ``tritonserver`` (``python3 startup_check.py && exec tritonserver ...``) so a
task placed on the wrong host stops at once with one plain line and a distinct exit
code, instead of a CUDA error buried in Triton's start-up log or models that fail to
load minutes later. Checks, in order:

* the NVIDIA device nodes are in the container (``/dev/nvidiactl``, ``/dev/nvidiaN``);
* ``nvidia-smi`` is there and answers (the driver's user-space part is mounted);
* at least ``--min-gpus`` GPUs are visible;
* every GPU's model matches ``--expect-gpu`` (a regular expression, full match against
  the name with or without its leading ``NVIDIA``: ``A10G|L4`` accepts "NVIDIA L4" but
  not "NVIDIA L40S");
* the driver's CUDA version (the ``CUDA Version`` in ``nvidia-smi``'s header) is at least
  ``--min-cuda``. Without the flag the minimum comes from the image's ``CUDA_VERSION``
  variable, major version only: CUDA 11+ runs on any driver of the same major version
  (minor-version compatibility), so demanding the image's exact minor would reject
  drivers that work. Pass ``--min-cuda "$CUDA_VERSION"`` to demand it anyway.

Exit codes (ECS shows them as the container's exit code): 0 all good, 2 usage error,
3 driver or devices missing or ``nvidia-smi`` failing, 4 too few GPUs, 5 wrong GPU
model, 6 driver too old for the image's CUDA, 1 a bug in this script.

It runs inside the stock Triton image with its system ``python3``: standard library
only, Python 3.8+, with ``_cli.py`` from the same folder. Tests point
``--nvidia-smi`` and ``--dev-dir`` at fakes.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

TYPE_CHECKING = False  # not typing.TYPE_CHECKING, which costs an import; type checkers know the name
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

if TYPE_CHECKING or __package__:  # type checkers see the package import
    from . import _cli
else:  # a script: Python 3.11+ with -I leaves the script's folder out of sys.path
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path[:1] != [_HERE]:
        sys.path.insert(0, _HERE)
    import _cli

PROG = "startup_check"

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USAGE = 2
EXIT_DRIVER = 3
EXIT_NO_GPU = 4
EXIT_GPU_MODEL = 5
EXIT_CUDA = 6

DEFAULT_TIMEOUT = 30.0  # nvidia-smi can take seconds on a multi-GPU host without persistence mode
QUERY_FIELDS = "index,name,uuid,driver_version,memory.total"
LINE_MAX = 300  # characters of nvidia-smi output kept in a failure line

_CUDA_HEADER = re.compile(r"CUDA Version\s*:\s*(\d+)\.(\d+)")
_DEV_GPU = re.compile(r"nvidia\d+")


@dataclass
class Gpu:
    index: str
    name: str
    uuid: str
    driver: str
    memory_mib: str


@dataclass
class Failure:
    code: int
    check: str
    message: str

    def line(self) -> str:
        return f"{PROG}: FAIL {self.check}: {self.message}"


UsageError = _cli.UsageError

DESCRIPTION = (
    "Check the GPU, NVIDIA driver and CUDA version before tritonserver starts. "
    "Exit 0 ok, 2 usage, 3 driver/devices, 4 too few GPUs, 5 wrong GPU model, 6 driver too old. "
    "Flags win over the environment variables named in brackets."
)
FLAGS = (
    _cli.Flag(
        "--expect-gpu",
        metavar="REGEX",
        help="every GPU's name must fully match, with or without its leading 'NVIDIA', "
        "case-insensitive, e.g. 'A10G|L4' or 'H100.*' [STARTUP_EXPECT_GPU] (default: any)",
    ),
    _cli.Flag(
        "--min-cuda",
        metavar="X.Y|none",
        help="lowest CUDA version the driver must support [STARTUP_MIN_CUDA] "
        "(default: the major version of $CUDA_VERSION, as the image sets it; 'none' skips the check)",
    ),
    _cli.Flag("--min-gpus", metavar="N", help="GPUs that must be visible [STARTUP_MIN_GPUS] (default 1)"),
    _cli.Flag("--nvidia-smi", metavar="PATH", help="nvidia-smi to run [STARTUP_NVIDIA_SMI] (default: from PATH)"),
    _cli.Flag("--dev-dir", metavar="DIR", help="where the device nodes are [STARTUP_DEV_DIR] (default /dev)"),
    _cli.Flag(
        "--timeout",
        metavar="SECONDS",
        help=f"limit for each nvidia-smi call [STARTUP_TIMEOUT] (default {DEFAULT_TIMEOUT:g})",
    ),
    _cli.Flag("--quiet", kind=_cli.SWITCH, help="print nothing when every check passes"),
)


@dataclass
class Options:
    expect_gpu: re.Pattern[str] | None = None
    min_cuda: tuple[int, int] | None = None
    min_cuda_source: str = ""
    min_gpus: int = 1
    nvidia_smi: str = "nvidia-smi"
    dev_dir: str = "/dev"
    timeout: float = DEFAULT_TIMEOUT
    quiet: bool = False


def parse_version(text: str) -> tuple[int, int]:
    """``12``, ``12.4``, ``12.4.1`` or ``12.4.1.003`` -> (12, 4); ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?(?:\.\d+)*\s*", text)
    if not m:
        raise ValueError(text)
    return int(m.group(1)), int(m.group(2) or 0)


def options(argv: Sequence[str] | None, env: Mapping[str, str]) -> Options:
    """Merge flags and environment (flags win); UsageError on bad values."""
    ns = _cli.parse(FLAGS, argv, f"{PROG}.py", DESCRIPTION)

    def pick(flag: object, var: str) -> str | None:
        return _cli.pick(flag, var, env)

    opts = Options(quiet=bool(ns["quiet"]))
    pattern = pick(ns["expect_gpu"], "STARTUP_EXPECT_GPU")
    if pattern is not None:
        try:
            opts.expect_gpu = re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            raise UsageError(f"--expect-gpu {pattern!r} is not a regular expression: {exc}") from None

    min_cuda = pick(ns["min_cuda"], "STARTUP_MIN_CUDA")
    if min_cuda is not None:
        if min_cuda.strip().lower() not in ("none", "off", "0"):
            try:
                opts.min_cuda = parse_version(min_cuda)
            except ValueError:
                raise UsageError(f"--min-cuda must look like 12 or 12.4 or 'none', got {min_cuda!r}") from None
            opts.min_cuda_source = "--min-cuda/STARTUP_MIN_CUDA"
    elif env.get("CUDA_VERSION", "").strip():
        # Minor-version compatibility: any driver of the image's CUDA major version works.
        try:
            major, _ = parse_version(env["CUDA_VERSION"])
        except ValueError:
            raise UsageError(f"CUDA_VERSION={env['CUDA_VERSION']!r} is not a CUDA version") from None
        opts.min_cuda = (major, 0)
        opts.min_cuda_source = f"image CUDA_VERSION={env['CUDA_VERSION'].strip()}"

    raw = pick(ns["min_gpus"], "STARTUP_MIN_GPUS")
    if raw is not None:
        try:
            opts.min_gpus = int(raw)
        except ValueError:
            raise UsageError(f"--min-gpus must be a whole number, got {raw!r}") from None
        if not 1 <= opts.min_gpus <= 64:
            raise UsageError(f"--min-gpus must be between 1 and 64, got {raw!r}")

    raw = pick(ns["timeout"], "STARTUP_TIMEOUT")
    if raw is not None:
        try:
            opts.timeout = float(raw)
        except ValueError:
            raise UsageError(f"--timeout must be a number of seconds, got {raw!r}") from None
        if not 0 < opts.timeout <= 600:
            raise UsageError(f"--timeout must be above 0 and at most 600, got {raw!r}")

    opts.nvidia_smi = pick(ns["nvidia_smi"], "STARTUP_NVIDIA_SMI") or "nvidia-smi"
    opts.dev_dir = pick(ns["dev_dir"], "STARTUP_DEV_DIR") or "/dev"
    return opts


# --- checks -------------------------------------------------------------------------------


def check_devices(dev_dir: str) -> list[Failure]:
    """The nvidia container runtime puts the control node and one node per assigned GPU here."""
    try:
        names = os.listdir(dev_dir)
    except OSError as exc:
        return [Failure(EXIT_DRIVER, "devices", f"cannot list {dev_dir}: {exc.strerror or exc}")]
    problems = []
    if "nvidiactl" not in names:
        problems.append(f"{os.path.join(dev_dir, 'nvidiactl')} is missing")
    if not any(_DEV_GPU.fullmatch(n) for n in names):
        problems.append(f"no {os.path.join(dev_dir, 'nvidia')}N GPU device")
    if not problems:
        return []
    return [
        Failure(
            EXIT_DRIVER,
            "devices",
            " and ".join(problems) + ": no GPU is assigned to this container "
            "(give it a GPU in resourceRequirements and run it on an ECS GPU-optimized AMI)",
        )
    ]


def resolve(binary: str) -> str | None:
    if os.sep in binary:
        return binary if os.path.isfile(binary) else None
    return shutil.which(binary)


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= LINE_MAX else line[: LINE_MAX - 3] + "..."
    return ""


class SmiError(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def run_smi(smi: str, args: list[str], timeout: float) -> str:
    """Run nvidia-smi; SmiError with one clear line when it cannot run, hangs or fails."""
    cmd = [smi, *args]
    shown = " ".join(["nvidia-smi", *args])
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SmiError(
            Failure(EXIT_DRIVER, "driver", f"`{shown}` did not answer within {timeout:g} s: the driver is hung")
        ) from None
    except OSError as exc:
        raise SmiError(Failure(EXIT_DRIVER, "driver", f"cannot run {smi}: {exc.strerror or exc}")) from None
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        said = first_line(out) or first_line(err) or "no output"
        if "no devices were found" in (out + err).lower():
            raise SmiError(Failure(EXIT_NO_GPU, "gpus", f"nvidia-smi found no GPU: {said}"))
        raise SmiError(Failure(EXIT_DRIVER, "driver", f"`{shown}` exited {proc.returncode}: {said}"))
    return out


def parse_query(text: str) -> list[Gpu]:
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        cells = [c.strip() for c in row] + [""] * 5
        gpus.append(Gpu(*cells[:5]))
    return gpus


def parse_header_cuda(text: str) -> tuple[int, int] | None:
    m = _CUDA_HEADER.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def model_matches(pattern: re.Pattern[str], name: str) -> bool:
    short = re.sub(r"^(NVIDIA|Tesla)\s+", "", name, flags=re.IGNORECASE)
    return bool(pattern.fullmatch(name) or pattern.fullmatch(short))


def fmt(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def run_checks(opts: Options, env: Mapping[str, str]) -> tuple[list[Failure], str]:
    """All checks; returns the failures (in check order) and the summary for the OK line."""
    failures = check_devices(opts.dev_dir)
    smi = resolve(opts.nvidia_smi)
    if smi is None:
        failures.append(
            Failure(
                EXIT_DRIVER,
                "driver",
                f"{opts.nvidia_smi} not found: the NVIDIA driver is not mounted into this container "
                "(no GPU in resourceRequirements, or not an ECS GPU-optimized AMI)",
            )
        )
        return failures, ""
    try:
        gpus = parse_query(run_smi(smi, [f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits"], opts.timeout))
    except SmiError as exc:
        return [*failures, exc.failure], ""
    if len(gpus) < opts.min_gpus:
        failures.append(
            Failure(EXIT_NO_GPU, "gpus", f"{len(gpus)} GPU visible, {opts.min_gpus} needed")
            if gpus
            else Failure(EXIT_NO_GPU, "gpus", "nvidia-smi lists no GPU")
        )
    if opts.expect_gpu is not None:
        wrong = [g for g in gpus if not model_matches(opts.expect_gpu, g.name)]
        if wrong:
            listed = ", ".join(f"GPU {g.index} is {g.name!r}" for g in wrong)
            failures.append(Failure(EXIT_GPU_MODEL, "gpu-model", f"{listed}; expected /{opts.expect_gpu.pattern}/"))

    cuda = None
    if opts.min_cuda is not None:
        try:
            cuda = parse_header_cuda(run_smi(smi, [], opts.timeout))
        except SmiError as exc:
            failures.append(exc.failure)
        else:
            if cuda is None:
                failures.append(
                    Failure(
                        EXIT_DRIVER,
                        "cuda",
                        "no 'CUDA Version' in nvidia-smi's header: cannot check the driver",
                    )
                )
            elif cuda < opts.min_cuda:
                driver = gpus[0].driver if gpus else "?"
                failures.append(
                    Failure(
                        EXIT_CUDA,
                        "cuda",
                        f"driver {driver} supports CUDA {fmt(cuda)}, below {fmt(opts.min_cuda)} "
                        f"({opts.min_cuda_source}): use a newer ECS GPU-optimized AMI or an older image",
                    )
                )

    names = sorted({f"{g.name} {g.memory_mib} MiB" if g.memory_mib.isdigit() else g.name for g in gpus})
    summary = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ({', '.join(names) or 'none'})"
    if gpus:
        summary += f", driver {gpus[0].driver}"
    if cuda is not None and opts.min_cuda is not None:
        summary += f", CUDA {fmt(cuda)} >= {fmt(opts.min_cuda)} ({opts.min_cuda_source})"
        image = env.get("CUDA_VERSION", "").strip()
        try:
            image_version = parse_version(image) if image else None
        except ValueError:
            image_version = None
        if image_version is not None and cuda < image_version:
            summary += f"; image CUDA {fmt(image_version)} runs in minor-version compatibility mode"
    return failures, summary


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point for ``python3 startup_check.py``; returns the exit code."""
    env = os.environ if env is None else env
    try:
        opts = options(argv, env)
    except _cli.Exit as exc:  # --help
        return exc.status
    except UsageError as exc:
        return _cli.usage_error(f"{PROG}.py", exc, show_usage=False)  # one line, as every failure here
    try:
        failures, summary = run_checks(opts, env)
    except Exception as exc:  # a bug here must still leave one readable line
        print(f"{PROG}: FAIL bug: {type(exc).__name__}: {first_line(str(exc))}", file=sys.stderr, flush=True)
        return EXIT_BUG
    if failures:
        for f in failures:
            print(f.line(), file=sys.stderr, flush=True)
        return failures[0].code
    if not opts.quiet:
        print(f"{PROG}: OK {summary}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
