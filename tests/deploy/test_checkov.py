"""checkov's static security scan of everything deployable: the Dockerfiles, the task definitions, the
CloudFormation templates and the Terraform module (scripts/checkov.sh, in its own venv: checkov pins old
versions of common packages). The scan runs once for the session; each test reads its own part."""

from __future__ import annotations

import importlib.util
import re
import subprocess

import pytest

from tests.support.paths import REPO

# The first run installs checkov into its own venv, then scans; on a busy 2-core machine that is minutes, and the
# module fixture's time counts against the first test's limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def scan() -> str:
    proc = subprocess.run(["bash", "scripts/checkov.sh"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_dockerfiles_task_definitions_and_templates_pass(scan: str) -> None:
    assert "dockerfile scan results" in scan and "cloudformation scan results" in scan, scan
    failed = re.findall(r"Failed checks: (\d+)", scan)
    assert failed and set(failed) == {"0"}


def test_the_terraform_module_passes_with_both_frameworks(scan: str) -> None:
    """deploy/terraform is scanned through examples/ with the terraform and terraform_json frameworks."""
    for framework in ("terraform", "terraform_json"):
        block = re.search(rf"^{framework} scan results:\s+Passed checks: (\d+), Failed checks: (\d+)", scan, re.M)
        assert block, f"no {framework} scan in the checkov output"
        assert int(block.group(1)) > 0 and block.group(2) == "0", block.group(0)


def test_every_skip_says_why_and_checkov_stays_out_of_the_main_venv() -> None:
    text = (REPO / ".checkov.yaml").read_text()
    skipped = re.findall(r"^\s+- (CKV\w+)", text, re.MULTILINE)
    assert {"CKV_AWS_338", "CKV_AWS_378"} <= set(skipped)  # the Terraform-only skips
    for check in skipped:  # every skip carries its reason in the comment right above it
        above = text[: text.index(f"- {check}")].rstrip().splitlines()[-1].strip()
        assert above.startswith("#") and len(above) > 20, check
    assert importlib.util.find_spec("checkov") is None  # never installed into the main venv
