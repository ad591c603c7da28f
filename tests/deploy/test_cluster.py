"""A cluster from zero: deploy/stack.yaml with CreateCluster=true (the Terraform module's create_cluster).

What is proven here, offline (tests/deploy/test_terraform.py proves the module creates the same):

- off by default: no cluster, instance, group or capacity provider, and the service on the EC2 launch
  type in the existing ClusterName, as before;
- on: what the stack would create is valid for the APIs that create it (botocore's models for
  ecs CreateCluster, CreateCapacityProvider, PutClusterCapacityProviders and CreateService, autoscaling
  CreateAutoScalingGroup, ec2 CreateLaunchTemplate, iam CreateRole, AttachRolePolicy and
  CreateInstanceProfile), the service takes the capacity provider strategy instead of a launch type
  and waits for the cluster's association, managed scaling and managed termination protection hold
  together, the launch template asks for IMDSv2, an encrypted root volume and no SSH key, the instance
  role has the two managed policies only, and the group leaves room for a rolling deployment;
- the user data (deploy/user-data.sh, copied into the stack) runs: in a sandbox with fake disks and
  recording mkfs/mount/mdadm (one NVMe device, two, none, a reboot with and without the array assembled,
  a stop and start, no mdadm), and, where this machine allows it (root, losetup, mkfs.xfs), on a real
  loop device formatted and mounted for real. Every run checks the ECS agent's configuration and the
  store's owner, uid 10001.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters

from tests.deploy.test_deploy import PLACEHOLDER, substitute
from tests.deploy.test_stack import ACCOUNT, REGION, VALUES, Stack, api_shape, by_name, mk, stack_taskdef
from tests.deploy.test_stack import template as template
from tests.support.paths import REPO

SESSION = botocore.session.get_session()
ROOT = REPO
USER_DATA = ROOT / "deploy" / "user-data.sh"
TF = ROOT / "deploy" / "terraform"
DOCS = ROOT / "docs" / "deploy.md"
ON = {"CreateCluster": "true"}
CLUSTER_RESOURCES = {
    "Cluster",
    "InstanceRole",
    "InstanceProfile",
    "LaunchTemplate",
    "AutoScalingGroup",
    "CapacityProvider",
    "ClusterCapacityProviders",
}
AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
OWNER = (10001, 10001)  # the modelsync daemon's user (deploy/task-definition-modelsync.json)


@pytest.fixture(scope="module")
def on(template) -> Stack:
    return mk(template, **ON)


def user_data(s: Stack) -> str:
    return base64.b64decode(s.props("LaunchTemplate")["LaunchTemplateData"]["UserData"]).decode()


# --- the stack ------------------------------------------------------------------------------


def test_nothing_of_it_exists_by_default(template) -> None:
    off = mk(template)
    assert template["Parameters"]["CreateCluster"]["Default"] == "false"
    assert not CLUSTER_RESOURCES & set(off.resources())
    svc = off.props("Service")
    assert svc["LaunchType"] == "EC2" and "CapacityProviderStrategy" not in svc
    assert svc["Cluster"] == VALUES["ClusterName"]
    for name, output in template["Outputs"].items():
        if name in ("AutoScalingGroupName", "CapacityProviderName"):
            assert output["Condition"] == "CreatesCluster"


def test_every_resource_of_it_exists_when_on(template, on: Stack) -> None:
    assert set(on.resources()) >= CLUSTER_RESOURCES
    for name in CLUSTER_RESOURCES:
        assert template["Resources"][name]["Condition"] == "CreatesCluster", name
    assert on.props("Cluster") == {"ClusterName": VALUES["ClusterName"]}


def test_the_service_runs_on_the_capacity_provider(template, on: Stack) -> None:
    """ECS refuses a service with both a launch type and a capacity provider strategy, and one whose capacity
    provider is not associated with its cluster yet: the service's cluster is the association's Ref (its
    primary identifier, the cluster's name), so CloudFormation creates the association first."""
    svc = on.props("Service")
    assert "LaunchType" not in svc
    assert svc["CapacityProviderStrategy"] == [
        {"CapacityProvider": f"gpu-{on.pseudo['AWS::StackName']}", "Weight": 1, "Base": 0}
    ]
    assert svc["Cluster"] == VALUES["ClusterName"] == on.props("ClusterCapacityProviders")["Cluster"]
    raw = template["Resources"]["Service"]["Properties"]["Cluster"]
    assert raw == {"Fn::If": ["CreatesCluster", {"Ref": "ClusterCapacityProviders"}, {"Ref": "ClusterName"}]}
    assoc = on.props("ClusterCapacityProviders")
    assert assoc["CapacityProviders"] == [on.props("CapacityProvider")["Name"]]
    assert assoc["DefaultCapacityProviderStrategy"] == svc["CapacityProviderStrategy"]
    # The alarms' scalable target (service/<cluster>/<service>) names the same cluster.
    assert on.props("Alarms")["Parameters"]["ClusterName"] == svc["Cluster"]


def test_managed_scaling_and_termination_protection_hold_together(on: Stack) -> None:
    """Managed termination protection works only with managed scaling and with every instance of the group
    protected from scale-in (ECS lifts the protection of the instances that run no task)."""
    provider = on.props("CapacityProvider")["AutoScalingGroupProvider"]
    assert provider["ManagedScaling"] == {"Status": "ENABLED", "TargetCapacity": 100}
    assert provider["ManagedTerminationProtection"] == "ENABLED" and provider["ManagedDraining"] == "ENABLED"
    assert provider["AutoScalingGroupArn"] == "<AutoScalingGroup>"
    asg = on.props("AutoScalingGroup")
    assert asg["NewInstancesProtectedFromScaleIn"] is True
    assert {"Key": "AmazonECSManaged", "Value": "true", "PropagateAtLaunch": True} in asg["Tags"]
    assert asg["LaunchTemplate"] == {
        "LaunchTemplateId": "<LaunchTemplate>",
        "Version": "<LaunchTemplate.LatestVersionNumber>",
    }
    assert asg["VPCZoneIdentifier"] == VALUES["SubnetIds"].split(",")
    assert (asg["MinSize"], asg["MaxSize"]) == ("1", "5")
    assert not re.match(r"(?i)(aws|ecs|fargate)", on.props("CapacityProvider")["Name"])  # prefixes ECS refuses


def test_the_group_leaves_room_for_a_rolling_deployment(template, on: Stack) -> None:
    """MaximumPercent 200 with MinimumHealthyPercent 100: a deployment starts a new task before it stops an old
    one, so at MaxCapacity tasks it needs one more GPU than scaling ever asks for (one GPU per g5.xlarge)."""
    deployment = on.props("Service")["DeploymentConfiguration"]
    assert (deployment["MaximumPercent"], deployment["MinimumHealthyPercent"]) == (200, 100)
    params = template["Parameters"]
    assert params["InstanceType"]["Default"] == "g5.xlarge"  # one GPU, with NVMe instance store
    assert int(params["ClusterMaxSize"]["Default"]) >= int(params["MaxCapacity"]["Default"]) + 1
    assert int(params["ClusterMinSize"]["Default"]) >= int(params["MinCapacity"]["Default"])
    assert "MaxCapacity + 1" in params["ClusterMaxSize"]["Description"]
    tf = (TF / "variables.tf").read_text()
    assert "max_capacity + 1" in tf.split('variable "cluster_max_size"')[1].split("variable ")[0]


def test_the_launch_template_is_hardened(template, on: Stack) -> None:
    data = on.props("LaunchTemplate")["LaunchTemplateData"]
    assert data["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
    }
    (root,) = data["BlockDeviceMappings"]
    assert root == {
        "DeviceName": "/dev/xvda",  # the AL2023 ECS AMI's root device
        "Ebs": {"VolumeSize": "100", "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True},
    }
    assert "KeyName" not in data and "NetworkInterfaces" not in data  # no SSH key, no public address
    assert data["ImageId"] == f"<ssm:{AMI_PARAMETER}>"  # CloudFormation resolves the SSM parameter
    assert data["InstanceType"] == "g5.xlarge" and data["IamInstanceProfile"] == {"Arn": "<InstanceProfile.Arn>"}
    assert data["SecurityGroupIds"] == VALUES["SecurityGroupIds"].split(",")
    s = mk(template, **ON, RootVolumeSize="400", InstanceType="p5.48xlarge", GpuAmiParameter="/team/ami")
    data = s.props("LaunchTemplate")["LaunchTemplateData"]
    assert (data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"], data["InstanceType"]) == ("400", "p5.48xlarge")
    assert data["ImageId"] == "<ssm:/team/ami>"
    for bad in ("m5.xlarge", "g5g.xlarge", "inf2.xlarge", "g5"):  # no NVIDIA GPU, an Arm one, not a type
        with pytest.raises(AssertionError):  # the parameter's pattern refuses it, as CloudFormation would
            mk(template, **ON, InstanceType=bad)
    assert template["Parameters"]["RootVolumeSize"]["MinValue"] == 30  # the AMI's own root volume


def test_the_ami_is_the_public_gpu_parameter(template) -> None:
    p = template["Parameters"]["GpuAmiParameter"]
    assert p["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert p["Default"] == AMI_PARAMETER
    tf = (TF / "variables.tf").read_text()
    assert f'default     = "{AMI_PARAMETER}"' in tf
    cluster_tf = (TF / "cluster.tf").read_text()
    assert 'data "aws_ssm_parameter" "gpu_ami"' in cluster_tf and "name  = var.gpu_ami_parameter" in cluster_tf
    assert AMI_PARAMETER in DOCS.read_text()


def test_the_instance_role_has_the_agent_and_session_manager_policies_only(on: Stack) -> None:
    role = on.props("InstanceRole")
    (st,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert st == {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
    assert role["ManagedPolicyArns"] == [
        "arn:aws:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role",
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
    ]
    assert "Policies" not in role  # nothing inline
    assert on.props("InstanceProfile") == {"Roles": ["<InstanceRole>"]}
    # The tasks cannot borrow it: the metadata service is closed to awsvpc tasks.
    assert "ECS_AWSVPC_BLOCK_IMDS=true" in user_data(on).splitlines()


def test_what_the_stack_creates_is_valid_for_the_apis(template) -> None:
    """Each resource's evaluated properties in the shape of the API call that creates it, against botocore."""
    s = mk(template, **ON, ClusterMaxSize="9", RootVolumeSize="200")
    ecs, ec2 = SESSION.get_service_model("ecs"), SESSION.get_service_model("ec2")
    autoscaling, iam = SESSION.get_service_model("autoscaling"), SESSION.get_service_model("iam")

    def check(model: Any, operation: str, params: dict[str, Any]) -> None:
        validate_parameters(params, model.operation_model(operation).input_shape)

    check(ecs, "CreateCluster", api_shape(s.props("Cluster")))
    provider = api_shape(s.props("CapacityProvider"))
    provider["autoScalingGroupProvider"]["autoScalingGroupArn"] = "triton-AutoScalingGroup-1A2B3C"
    check(ecs, "CreateCapacityProvider", provider)
    assoc = s.props("ClusterCapacityProviders")
    check(
        ecs,
        "PutClusterCapacityProviders",
        {
            "cluster": assoc["Cluster"],
            "capacityProviders": assoc["CapacityProviders"],
            "defaultCapacityProviderStrategy": api_shape(assoc["DefaultCapacityProviderStrategy"]),
        },
    )
    svc = api_shape(s.props("Service"))
    svc["healthCheckGracePeriodSeconds"] = int(svc["healthCheckGracePeriodSeconds"])
    assert "desiredCount" not in svc  # kept by ECS across updates (docs/scaling.md); CreateService starts 1
    check(ecs, "CreateService", svc)
    assert ("launchType" in svc) != ("capacityProviderStrategy" in svc)  # ECS refuses both

    asg = dict(s.props("AutoScalingGroup"))
    asg.update(
        AutoScalingGroupName="triton-AutoScalingGroup-1A2B3C",
        MinSize=int(asg["MinSize"]),
        MaxSize=int(asg["MaxSize"]),
        VPCZoneIdentifier=",".join(asg["VPCZoneIdentifier"]),  # the API's comma-separated form
    )
    asg["LaunchTemplate"] = {"LaunchTemplateId": "lt-0123456789abcdef0", "Version": "1"}
    check(autoscaling, "CreateAutoScalingGroup", asg)

    data = s.props("LaunchTemplate")["LaunchTemplateData"]
    data["ImageId"] = "ami-0123456789abcdef0"  # what the SSM parameter holds
    data["IamInstanceProfile"] = {"Arn": f"arn:aws:iam::{ACCOUNT}:instance-profile/triton-InstanceProfile-1A2B"}
    data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] = int(data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"])
    check(ec2, "CreateLaunchTemplate", {"LaunchTemplateName": "triton-gpu", "LaunchTemplateData": data})
    assert len(base64.b64decode(data["UserData"])) <= 16 * 1024  # EC2's limit on user data, before base64

    role = s.props("InstanceRole")
    check(
        iam,
        "CreateRole",
        {
            "RoleName": "triton-InstanceRole-1A2B",
            "Description": role["Description"],
            "AssumeRolePolicyDocument": json.dumps(role["AssumeRolePolicyDocument"]),
        },
    )
    for arn in role["ManagedPolicyArns"]:
        check(iam, "AttachRolePolicy", {"RoleName": "triton-InstanceRole-1A2B", "PolicyArn": arn})
    check(iam, "CreateInstanceProfile", {"InstanceProfileName": "triton-InstanceProfile-1A2B"})


# --- the user data ---------------------------------------------------------------------------


def filled(cluster: str = "gpu-cluster", store: str = "/opt/triton-models") -> str:
    return substitute(USER_DATA.read_text(), {"ClusterName": cluster, "ModelStorePath": store})


def test_the_stack_user_data_is_the_file(template, on: Stack) -> None:
    text = USER_DATA.read_text()
    assert set(PLACEHOLDER.findall(text)) == {"ClusterName", "ModelStorePath"}
    assert "%{" not in text and "${!" not in text  # nothing templatefile() or Fn::Sub would read otherwise
    assert not re.findall(r"\$\{(?!ClusterName\}|ModelStorePath\})", text)
    assert user_data(on) == filled()
    s = mk(template, **ON, ClusterName="inference-gpus", ModelSyncHostPath="/local/nvme/triton")
    assert user_data(s) == filled("inference-gpus", "/local/nvme/triton")
    # The store the user data mounts is the one the model-sync task mounts.
    synced = mk(template, **ON, ModelSyncBucketName="example-models", ModelSyncHostPath="/local/nvme/triton")
    volumes = {v["name"]: v for v in stack_taskdef(synced)["volumes"]}
    assert volumes["model-store"]["host"]["sourcePath"] == "/local/nvme/triton"
    assert "store='/local/nvme/triton'" in user_data(synced)
    daemon = by_name(stack_taskdef(synced))["modelsync"]
    assert tuple(int(x) for x in daemon["user"].split(":")) == OWNER


def test_the_user_data_parses() -> None:
    for script in (filled(), per_boot_script(filled())):
        proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert filled().startswith("#!/bin/bash\n") and per_boot_script(filled()).startswith("#!/bin/bash\n")
    if shutil.which("shellcheck"):  # the heredoc's script apart too: shellcheck does not look into it
        for script in (filled(), per_boot_script(filled())):
            proc = subprocess.run(["shellcheck", "-s", "bash", "-"], input=script, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout


def per_boot_script(text: str) -> str:
    m = re.search(r"<<'STORE'\n(.*?\n)STORE\n", text, re.S)
    assert m, "no per-boot script in the user data"
    return m.group(1)


# The sandbox: the paths the script touches, moved under a directory of the test, and its disk tools
# replaced by fakes that record their calls and keep the disks' state (filesystems, RAID superblocks,
# mounts) in files. PATH holds the fakes and links to the ordinary tools the script may use, nothing else:
# a command outside both fails the run.
MOVED = ("/etc/ecs", "/var/lib/cloud/scripts/per-boot", "/dev/disk/by-id/", "/sys/class/block/")
TOOLS = ("bash", "sed", "cat", "mkdir", "touch", "chmod", "readlink", "sort", "basename", "grep", "rm", "ln", "tr")
FAKES = {
    # blkid -o value -s TYPE DEV: the filesystem a fake mkfs wrote there, else exit 2 as blkid does.
    "blkid": 'f="$STATE/fs/$(echo "$5" | tr / _)"; [ -f "$f" ] || exit 2; cat "$f"',
    "mkfs.xfs": 'echo "mkfs.xfs $*" >>"$STATE/calls"; for a; do d=$a; done\n'
    'echo xfs >"$STATE/fs/$(echo "$d" | tr / _)"',
    "mount": 'echo "mount $*" >>"$STATE/calls"; for a; do d=$a; done; echo "$d" >>"$STATE/mounts"',
    "mountpoint": 'grep -qxF "$2" "$STATE/mounts" 2>/dev/null',
    "udevadm": 'echo "udevadm $*" >>"$STATE/calls"',
    "dnf": 'echo "dnf $*" >>"$STATE/calls"; exit 1',  # no repository reachable
    # mdadm --assemble MD DEV... finds the superblocks a --create wrote (the same devices), else fails;
    # both leave the array as the holder of its devices in sysfs, as the kernel does.
    "mdadm": """echo "mdadm $*" >>"$STATE/calls"
op=$1; md=$2; shift 2
devs=$(for a; do case "$a" in -*) ;; *) echo "$a" ;; esac; done)
if [ "$op" = --assemble ]; then
  if [ ! -f "$STATE/superblock" ] || [ "$(cat "$STATE/superblock")" != "$devs" ]; then
    echo "mdadm: no superblock" >&2
    exit 1
  fi
else
  echo "$devs" >"$STATE/superblock"
fi
for d in $devs; do
  mkdir -p "$SYS/$(basename "$d")/holders"
  touch "$SYS/$(basename "$d")/holders/$(basename "$md")"
done""",
}


class Sandbox:
    def __init__(self, root: Path, devices: int, mdadm: bool = True) -> None:
        self.root, self.store = root, root / "opt" / "triton-models"
        self.state, self.sys = root / "state", root / "sys" / "class" / "block"
        for d in (self.state / "fs", self.sys, root / "dev" / "disk" / "by-id", root / "bin", root / "etc"):
            d.mkdir(parents=True, exist_ok=True)
        by_id = root / "dev" / "disk" / "by-id"
        # The root volume (EBS): never the store's.
        (root / "dev" / "nvme0n1").touch()
        (by_id / "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0").symlink_to("../../nvme0n1")
        self.devices = []
        for i in range(1, devices + 1):
            dev = root / "dev" / f"nvme{i}n1"
            dev.touch()
            (self.sys / dev.name / "holders").mkdir(parents=True)
            serial = f"AWS{i}1D2C3B4A5F6E7D8C"
            # Each device under two names (with and without its namespace id), and a partition of it.
            (by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_{serial}").symlink_to(f"../../{dev.name}")
            (by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_{serial}_1").symlink_to(f"../../{dev.name}")
            (by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_{serial}-part1").symlink_to(f"../../{dev.name}p1")
            self.devices.append(str(dev))
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found, tool
            (root / "bin" / tool).symlink_to(found)
        chown = shutil.which("chown")
        if os.geteuid() == 0 and chown:
            (root / "bin" / "chown").symlink_to(chown)
        else:  # record the owner instead
            self._fake("chown", 'echo "$1" >"$STATE/owner"')
        for name, body in FAKES.items():
            if name == "mdadm" and not mdadm:
                continue
            self._fake(name, body)
        script = filled(store=str(self.store))
        for path in MOVED:
            script = script.replace(path, f"{root}{path}")
        self.user_data = root / "user-data"
        self.user_data.write_text(script)

    def _fake(self, name: str, body: str) -> None:
        path = self.root / "bin" / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)

    @property
    def per_boot(self) -> Path:
        return self.root / "var/lib/cloud/scripts/per-boot/triton-model-store"

    def run(self, script: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {"PATH": f"{self.root / 'bin'}", "STATE": str(self.state), "SYS": str(self.sys), "LANG": "C"}
        cmd = ["bash", str(self.user_data)] if script is None else [str(script)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def calls(self, prefix: str = "") -> list[str]:
        f = self.state / "calls"
        lines = f.read_text().splitlines() if f.exists() else []
        return [line for line in lines if line.startswith(prefix)]

    def reboot(self) -> None:
        """Mounts and assembled arrays are gone; the disks keep what was written to them."""
        (self.state / "mounts").unlink(missing_ok=True)
        for holders in self.sys.glob("*/holders"):
            for h in holders.iterdir():
                h.unlink()
        (self.state / "calls").unlink(missing_ok=True)

    def stop_and_start(self) -> None:
        """The instance store comes back blank."""
        self.reboot()
        for f in (self.state / "fs").iterdir():
            f.unlink()
        (self.state / "superblock").unlink(missing_ok=True)

    def ecs_config(self) -> list[str]:
        return (self.root / "etc/ecs/ecs.config").read_text().splitlines()

    def owner(self) -> tuple[int, int]:
        if (self.state / "owner").exists():
            uid, gid = (self.state / "owner").read_text().strip().split(":")
            return int(uid), int(gid)
        st = self.store.stat()
        return st.st_uid, st.st_gid

    def mounted(self) -> list[str]:
        f = self.state / "mounts"
        return f.read_text().splitlines() if f.exists() else []


def test_the_sandbox_moves_every_path_the_script_touches(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, devices=1)
    code = [line for line in box.user_data.read_text().splitlines() if not line.lstrip().startswith("#")]
    outside = [line for line in code if re.search(r"(?<![\w.-])/(etc|var|sys|opt|usr|run|dev/disk)/", line)]
    assert outside == [], outside


def check_joined(box: Sandbox) -> None:
    config = box.ecs_config()
    for line in ("ECS_CLUSTER=gpu-cluster", "ECS_ENABLE_GPU_SUPPORT=true", "ECS_AWSVPC_BLOCK_IMDS=true"):
        assert config.count(line) == 1, config


def test_one_nvme_device_is_formatted_and_mounted(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, devices=1)
    (box.root / "etc/ecs").mkdir(parents=True)
    (box.root / "etc/ecs/ecs.config").write_text("ECS_LOGLEVEL=info\nECS_CLUSTER=default\n")  # what was there stays
    proc = box.run()
    (dev,) = box.devices
    assert box.calls("mkfs") == [f"mkfs.xfs -q -K {dev}"]
    assert box.calls("mount") == [f"mount -o noatime {dev} {box.store}"]
    assert not box.calls("mdadm") and not box.calls("dnf")
    assert box.owner() == OWNER and oct(box.store.stat().st_mode & 0o777) == "0o755"
    check_joined(box)
    assert box.ecs_config()[0] == "ECS_LOGLEVEL=info" and "ECS_CLUSTER=default" not in box.ecs_config()
    assert f"formatting {dev} (XFS)" in proc.stderr and "owned by 10001:10001" in proc.stderr
    assert box.per_boot.stat().st_mode & 0o111  # cloud-init runs it at every boot
    # The user data again (cloud-init runs it once, but nothing breaks if it ran twice): no second format.
    box.run()
    check_joined(box)
    assert len(box.calls("mkfs")) == 1 and box.mounted() == [str(box.store)]


def test_a_reboot_keeps_the_store_and_a_stop_and_start_formats_it_again(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, devices=1)
    box.run()
    (dev,) = box.devices
    box.reboot()
    proc = box.run(box.per_boot)  # what cloud-init runs at the next boot
    assert not box.calls("mkfs") and box.calls("mount") == [f"mount -o noatime {dev} {box.store}"]
    assert "formatting" not in proc.stderr and box.owner() == OWNER
    box.stop_and_start()
    box.run(box.per_boot)
    assert box.calls("mkfs") == [f"mkfs.xfs -q -K {dev}"] and box.mounted() == [str(box.store)]
    assert box.owner() == OWNER


def test_two_nvme_devices_become_one_raid0_array(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, devices=2)
    proc = box.run()
    devs = " ".join(box.devices)
    assert box.calls("mdadm") == [
        f"mdadm --assemble /dev/md0 {devs}",
        f"mdadm --create /dev/md0 --name=triton-models --level=0 --raid-devices=2 --run {devs}",
    ]
    assert box.calls("mkfs") == ["mkfs.xfs -q -K /dev/md0"]
    assert box.calls("mount") == [f"mount -o noatime /dev/md0 {box.store}"]
    assert "creating a RAID 0 array of 2 devices" in proc.stderr
    assert box.owner() == OWNER
    check_joined(box)


def test_after_a_reboot_the_array_is_used_again_not_made_again(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, devices=2)
    box.run()
    devs = " ".join(box.devices)
    # udev assembled it at boot (mdadm's rules), under another number: the script finds it by its devices.
    box.reboot()
    for dev in box.devices:
        (box.sys / Path(dev).name / "holders" / "md127").touch()
    shutil.copy(box.state / "fs" / "_dev_md0", box.state / "fs" / "_dev_md127")
    box.run(box.per_boot)
    assert not box.calls("mdadm") and not box.calls("mkfs")
    assert box.calls("mount") == [f"mount -o noatime /dev/md127 {box.store}"]
    # Not assembled at boot: assembled here, from the superblocks on the devices; no new array, no format.
    box.reboot()
    box.run(box.per_boot)
    assert box.calls("mdadm") == [f"mdadm --assemble /dev/md0 {devs}"] and not box.calls("mkfs")
    # Stopped and started: blank devices, a new array, formatted.
    box.stop_and_start()
    box.run(box.per_boot)
    assert box.calls("mdadm")[-1].startswith("mdadm --create /dev/md0") and box.calls("mkfs") == [
        "mkfs.xfs -q -K /dev/md0"
    ]
    assert box.owner() == OWNER


def test_without_mdadm_several_devices_fall_back_to_the_first(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, devices=3, mdadm=False)
    proc = box.run()
    assert box.calls("dnf") == ["dnf install -y -q mdadm"]
    first = box.devices[0]
    assert box.calls("mkfs") == [f"mkfs.xfs -q -K {first}"] and box.calls("mount") == [
        f"mount -o noatime {first} {box.store}"
    ]
    assert f"the store uses {first} alone of 3 devices" in proc.stderr
    assert box.owner() == OWNER


def test_without_instance_store_the_store_is_a_directory_on_the_root_volume(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, devices=0)
    proc = box.run()
    assert not box.calls() and box.store.is_dir() and not box.mounted()
    assert "no NVMe instance store on this instance type" in proc.stderr
    assert box.owner() == OWNER
    check_joined(box)
    box.reboot()
    box.run(box.per_boot)
    assert box.owner() == OWNER and not box.calls()


def _loop_device_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("losetup", "mkfs.xfs", "blkid", "mount", "umount", "mountpoint", "wipefs"):
        if not shutil.which(tool):
            return f"needs {tool}"
    return None


@pytest.mark.skipif(_loop_device_usable() is not None, reason=str(_loop_device_usable()))
def test_on_a_real_loop_device(tmp_path: Path) -> None:
    """The single-device path for real: a loop device stands for the NVMe instance store, formatted XFS and
    mounted by the script itself; then a reboot (unmounted, run again: the data stays) and a stop and start
    (wiped: formatted again)."""
    image = tmp_path / "nvme1n1.img"
    with image.open("wb") as f:
        f.truncate(320 * 1024 * 1024)  # XFS needs 300 MB at least
    proc = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"no loop device here: {proc.stderr.strip()}")
    loop = proc.stdout.strip()
    root = tmp_path / "root"
    by_id = root / "dev" / "disk" / "by-id"
    by_id.mkdir(parents=True)
    (by_id / "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1234567890ABCDEF").symlink_to(loop)
    store = root / "opt" / "triton-models"
    script = filled(store=str(store))
    for path in MOVED:
        script = script.replace(path, f"{root}{path}")
    per_boot = root / "var/lib/cloud/scripts/per-boot/triton-model-store"

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(
            list(cmd), input=script if cmd == ("bash",) else None, capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0, p.stdout + p.stderr
        return p

    try:
        proc = run("bash")
        assert subprocess.run(["mountpoint", "-q", str(store)]).returncode == 0
        assert (
            subprocess.run(["blkid", "-o", "value", "-s", "TYPE", loop], capture_output=True, text=True).stdout.strip()
            == "xfs"
        )
        assert (store.stat().st_uid, store.stat().st_gid) == OWNER and f"formatting {loop}" in proc.stderr
        assert "ECS_CLUSTER=gpu-cluster" in (root / "etc/ecs/ecs.config").read_text().splitlines()
        (store / "add").mkdir()
        # Reboot: the mount is gone, the filesystem stays.
        subprocess.run(["umount", str(store)], check=True)
        proc = run(str(per_boot))
        assert "formatting" not in proc.stderr and (store / "add").is_dir()
        assert run(str(per_boot)).stderr.count("mounted already") == 1  # run twice in one boot: no harm
        # Stop and start: a blank device, formatted again.
        subprocess.run(["umount", str(store)], check=True)
        subprocess.run(["wipefs", "-a", "-q", loop], check=True)
        proc = run(str(per_boot))
        assert f"formatting {loop}" in proc.stderr and not (store / "add").exists()
        assert (store.stat().st_uid, store.stat().st_gid) == OWNER
    finally:
        subprocess.run(["umount", str(store)], capture_output=True)
        subprocess.run(["losetup", "-d", loop], capture_output=True)


# --- the Terraform evaluator's new parts ---------------------------------------------------------


def test_the_evaluator_reads_data_sources_with_count(tmp_path: Path) -> None:
    """tests/support/tfeval.py: a data source's arguments reach its stub; with count it is a list (empty at 0); a
    for_each on a data source, which it does not implement, is refused; base64encode is the standard one."""
    from tests.support.tfeval import Module, TfError

    (tmp_path / "main.tf").write_text(
        'variable "on" {\n  type = bool\n}\n'
        'data "aws_ssm_parameter" "ami" {\n  count = var.on ? 1 : 0\n  name  = "/aws/x"\n}\n'
        'output "ami" {\n  value = one(data.aws_ssm_parameter.ami[*].insecure_value)\n}\n'
        'output "b64" {\n  value = base64encode("é\\n/aws/x")\n}\n'
    )
    stub = {"aws_ssm_parameter": lambda args: {"insecure_value": f"ami-for-{args['name']}"}}
    outputs = Module(tmp_path, {"on": True}, stub).outputs()
    assert outputs["ami"] == "ami-for-/aws/x"
    assert outputs["b64"] == base64.b64encode("é\n/aws/x".encode()).decode()
    assert Module(tmp_path, {"on": False}, stub).outputs()["ami"] is None
    (tmp_path / "main.tf").write_text(
        'data "aws_ssm_parameter" "ami" {\n  for_each = toset(["a"])\n  name = each.key\n}\n'
        'output "x" {\n  value = data.aws_ssm_parameter.ami\n}\n'
    )
    with pytest.raises(TfError, match="for_each on a data source"):
        Module(tmp_path, {}, stub).outputs()


# --- docs ---------------------------------------------------------------------------------------


def test_docs_explain_the_cluster_from_zero(template) -> None:
    docs = DOCS.read_text()
    section = docs.split("## Cluster from zero", 1)
    assert len(section) == 2, "docs/deploy.md has no 'Cluster from zero' section"
    text = section[1].split("\n## ", 1)[0]
    for name in (
        "CreateCluster",
        "InstanceType",
        "ClusterMinSize",
        "ClusterMaxSize",
        "RootVolumeSize",
        "GpuAmiParameter",
    ):
        assert f"`{name}`" in text, name
        assert name in json.dumps(template["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]), name
    for fact in (
        "set-instance-protection",
        "deploy/user-data.sh",
        "AmazonSSMManagedInstanceCore",
        "RAID 0",
        "create_cluster",
    ):
        assert fact in text, fact
    assert "Cluster from zero" in (ROOT / "README.md").read_text()
    assert f"{REGION}" in text and "per hour" in text  # the cost note, with its region
