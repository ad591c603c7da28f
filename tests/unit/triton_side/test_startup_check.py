"""triton_side/startup_check.py against fake ``nvidia-smi`` binaries and fake /dev folders.

The fakes print output in the layout real drivers print (535 and 550 branches, as seen
on g5 and g6 instances), fail the way a container without a driver fails, or hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from triton_side import startup_check
from triton_side.startup_check import main

SCRIPT = Path(startup_check.__file__)

A10G_QUERY = "0, NVIDIA A10G, GPU-8f5e3e2c-1b7a-4d5e-9c3b-2f6a7d8e9a01, 535.104.05, 23028\n"
A10G_TABLE = """\
Tue Nov 28 10:11:12 2023
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA A10G                    On  | 00000000:00:1E.0 Off |                    0 |
|  0%   27C    P8              16W / 300W |      4MiB / 23028MiB |      0%      Default |
|                                         |                      |                  N/A |
+-----------------------------------------+----------------------+----------------------+
"""

L4_QUERY = (
    "0, NVIDIA L4, GPU-2d9b3c4e-5f60-7182-93a4-b5c6d7e8f901, 550.90.07, 23034\n"
    "1, NVIDIA L4, GPU-3e0c4d5f-6071-8293-a4b5-c6d7e8f90a12, 550.90.07, 23034\n"
)
L4_TABLE = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.90.07              Driver Version: 550.90.07      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA L4                      Off |   00000000:38:00.0 Off |                    0 |
| N/A   44C    P0             28W /   72W |     196MiB /  23034MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
|   1  NVIDIA L4                      Off |   00000000:3A:00.0 Off |                    0 |
| N/A   41C    P8             16W /   72W |       4MiB /  23034MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
"""

L40S_QUERY = "0, NVIDIA L40S, GPU-4f1d5e60-7182-93a4-b5c6-d7e8f90a1b23, 550.54.15, 46068\n"
L40S_TABLE = L4_TABLE.replace("550.90.07", "550.54.15").replace("NVIDIA L4  ", "NVIDIA L40S")

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def fake_smi(tmp: Path, query: str, table: str, code: int = 0, sleep: float = 0) -> Path:
    """A shell-script nvidia-smi: CSV for --query-gpu, the table otherwise; logs its arguments.

    With ``sleep`` it hangs instead (exec: the process the check kills at its timeout is the one
    that hangs, so no stray sleep outlives the test)."""
    path = tmp / "bin" / "nvidia-smi"
    path.parent.mkdir(parents=True, exist_ok=True)
    (tmp / "query.out").write_text(query)
    (tmp / "table.out").write_text(table)
    path.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> "{tmp}/calls.log"
        {f"exec sleep {sleep}" if sleep else ":"}
        case "$1" in
          --query-gpu=*) cat "{tmp}/query.out" ;;
          *) cat "{tmp}/table.out" ;;
        esac
        exit {code}
        """)
    )
    path.chmod(0o755)
    return path


def fake_dev(tmp: Path, names: tuple[str, ...] = ("nvidiactl", "nvidia0", "nvidia-uvm")) -> Path:
    dev = tmp / "dev"
    dev.mkdir(exist_ok=True)
    for n in names:
        (dev / n).touch()
    return dev


def run(tmp: Path, *args: str, env: dict[str, str] | None = None) -> int:
    argv = ["--nvidia-smi", str(tmp / "bin" / "nvidia-smi"), "--dev-dir", str(tmp / "dev"), *args]
    return main(argv, env or {})


def test_a10g_passes_and_names_gpu_driver_and_cuda(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE)
    fake_dev(tmp_path)
    code = run(tmp_path, "--expect-gpu", "A10G|L4", env={"CUDA_VERSION": "12.4.1.003"})
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    assert out.startswith("startup_check: OK 1 GPU (NVIDIA A10G 23028 MiB), driver 535.104.05, CUDA 12.2 >= 12.0")
    # The image wants 12.4, the driver has 12.2: allowed, and said.
    assert "minor-version compatibility" in out
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == "--query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader,nounits"
    assert calls[1] == ""  # plain nvidia-smi for the header's CUDA Version


def test_two_l4_pass_min_gpus_and_exact_minor(tmp_path, capsys):
    fake_smi(tmp_path, L4_QUERY, L4_TABLE)
    fake_dev(tmp_path, ("nvidiactl", "nvidia0", "nvidia1"))
    assert run(tmp_path, "--expect-gpu", "L4", "--min-gpus", "2", "--min-cuda", "12.4") == 0
    out = capsys.readouterr().out
    assert "2 GPUs (NVIDIA L4 23034 MiB)" in out and "CUDA 12.4 >= 12.4" in out


def test_l4_pattern_does_not_accept_l40s(tmp_path, capsys):
    fake_smi(tmp_path, L40S_QUERY, L40S_TABLE)
    fake_dev(tmp_path)
    assert run(tmp_path, "--expect-gpu", "A10G|L4") == startup_check.EXIT_GPU_MODEL
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["startup_check: FAIL gpu-model: GPU 0 is 'NVIDIA L40S'; expected /A10G|L4/"]


def test_expect_gpu_from_env_is_case_insensitive_and_full_names_work(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE)
    fake_dev(tmp_path)
    assert run(tmp_path, env={"STARTUP_EXPECT_GPU": "a10g"}) == 0
    assert run(tmp_path, "--expect-gpu", "NVIDIA A10.*") == 0
    assert run(tmp_path, env={"STARTUP_EXPECT_GPU": "L4"}) == startup_check.EXIT_GPU_MODEL
    # A flag wins over the environment.
    assert run(tmp_path, "--expect-gpu", "A10G", env={"STARTUP_EXPECT_GPU": "L4"}) == 0


def test_driver_too_old_for_image_major(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE.replace("CUDA Version: 12.2", "CUDA Version: 11.4"))
    fake_dev(tmp_path)
    assert run(tmp_path, env={"CUDA_VERSION": "12.6.3"}) == startup_check.EXIT_CUDA
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("startup_check: FAIL cuda: driver 535.104.05 supports CUDA 11.4, below 12.0")
    assert "CUDA_VERSION=12.6.3" in err[0]


def test_explicit_min_cuda_rejects_older_minor_and_none_skips(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE)
    fake_dev(tmp_path)
    assert run(tmp_path, "--min-cuda", "12.4") == startup_check.EXIT_CUDA
    assert "supports CUDA 12.2, below 12.4" in capsys.readouterr().err
    (tmp_path / "calls.log").unlink()
    assert run(tmp_path, "--min-cuda", "none", env={"CUDA_VERSION": "13.0"}) == 0
    # No CUDA check asked for: nvidia-smi's table is not even read.
    assert (tmp_path / "calls.log").read_text().count("\n") == 1


def test_unreadable_cuda_header_fails_when_a_minimum_is_set(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, "something else entirely\n")
    fake_dev(tmp_path)
    assert run(tmp_path, "--min-cuda", "12") == startup_check.EXIT_DRIVER
    assert "no 'CUDA Version' in nvidia-smi's header" in capsys.readouterr().err


def test_driver_not_loaded(tmp_path, capsys):
    fake_smi(tmp_path, NO_DRIVER, NO_DRIVER, code=9)
    fake_dev(tmp_path)
    assert run(tmp_path) == startup_check.EXIT_DRIVER
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "startup_check: FAIL driver: `nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total "
        "--format=csv,noheader,nounits` exited 9: " + NO_DRIVER.strip()
    ]


def test_no_devices_found(tmp_path, capsys):
    fake_smi(tmp_path, "No devices were found\n", "No devices were found\n", code=6)
    fake_dev(tmp_path)
    assert run(tmp_path) == startup_check.EXIT_NO_GPU
    assert capsys.readouterr().err.splitlines() == [
        "startup_check: FAIL gpus: nvidia-smi found no GPU: No devices were found"
    ]


def test_too_few_gpus(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE)
    fake_dev(tmp_path)
    assert run(tmp_path, "--min-gpus", "4") == startup_check.EXIT_NO_GPU
    assert "1 GPU visible, 4 needed" in capsys.readouterr().err


def test_missing_binary_and_devices_each_get_one_line(tmp_path, capsys):
    (tmp_path / "dev").mkdir()
    assert run(tmp_path) == startup_check.EXIT_DRIVER
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith("startup_check: FAIL devices: ")
    assert "nvidiactl is missing" in err[0] and "resourceRequirements" in err[0]
    assert err[1].startswith(f"startup_check: FAIL driver: {tmp_path}/bin/nvidia-smi not found")


def test_gpu_device_missing_while_driver_answers(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE)
    fake_dev(tmp_path, ("nvidiactl", "nvidia-uvm"))
    assert run(tmp_path) == startup_check.EXIT_DRIVER
    assert (
        capsys.readouterr()
        .err.splitlines()[0]
        .startswith(f"startup_check: FAIL devices: no {tmp_path}/dev/nvidiaN GPU device")
    )


def test_binary_from_path_is_found(tmp_path, capsys, monkeypatch):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE)
    fake_dev(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main(["--dev-dir", str(tmp_path / "dev")], {}) == 0


def test_not_executable(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE).chmod(0o644)
    fake_dev(tmp_path)
    assert run(tmp_path) == startup_check.EXIT_DRIVER
    assert "FAIL driver: cannot run" in capsys.readouterr().err


def test_hung_driver_times_out(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE, sleep=10)
    fake_dev(tmp_path)
    code = run(tmp_path, "--timeout", "0.3")
    assert code == startup_check.EXIT_DRIVER
    assert "did not answer within 0.3 s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--expect-gpu", "A10G("], {}, "not a regular expression"),
        (["--min-cuda", "twelve"], {}, "--min-cuda must look like"),
        ([], {"CUDA_VERSION": "latest"}, "is not a CUDA version"),
        (["--min-gpus", "0"], {}, "between 1 and 64"),
        (["--timeout", "-1"], {}, "--timeout must be above 0"),
        (["--bogus"], {}, "unrecognized arguments"),
    ],
)
def test_usage_errors_exit_2(args, env, needle, capsys):
    assert main(args, env) == startup_check.EXIT_USAGE
    assert needle in capsys.readouterr().err


def test_quiet_prints_nothing_when_ok(tmp_path, capsys):
    fake_smi(tmp_path, A10G_QUERY, A10G_TABLE)
    fake_dev(tmp_path)
    assert run(tmp_path, "--quiet") == 0
    assert capsys.readouterr() == ("", "")


def test_runs_as_a_script_with_exit_code_and_one_line(tmp_path):
    """As ECS runs it: `python3 startup_check.py`, the environment only, exit code visible."""
    fake_smi(tmp_path, L40S_QUERY, L40S_TABLE)
    fake_dev(tmp_path)
    env = {
        "PATH": os.environ["PATH"],
        "STARTUP_NVIDIA_SMI": str(tmp_path / "bin" / "nvidia-smi"),
        "STARTUP_DEV_DIR": str(tmp_path / "dev"),
        "STARTUP_EXPECT_GPU": "A10G|L4",
    }
    proc = subprocess.run([sys.executable, "-I", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == startup_check.EXIT_GPU_MODEL
    assert proc.stdout == ""
    assert proc.stderr == "startup_check: FAIL gpu-model: GPU 0 is 'NVIDIA L40S'; expected /A10G|L4/\n"
    help_proc = subprocess.run([sys.executable, "-I", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert help_proc.returncode == 0 and "--expect-gpu" in help_proc.stdout
