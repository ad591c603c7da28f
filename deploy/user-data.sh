#!/bin/bash
# User data of the GPU instances that deploy/stack.yaml (CreateCluster=true) and deploy/terraform
# (create_cluster = true) launch on the ECS GPU-optimized AMI; docs/deploy.md, "Cluster from zero".
#
# Both fill in its two placeholders, ClusterName and ModelStorePath (dollar sign, braces), and nothing
# else: the shell's own variables are written $name, never with braces, so that neither CloudFormation's
# Fn::Sub nor Terraform's templatefile() reads them. The stack holds a copy of this file, which
# tests/deploy/test_cluster.py keeps equal, and runs it in a sandbox (one, two and no NVMe devices, a reboot,
# a stop and start).
set -euo pipefail

# 1. Join the cluster. The AMI turns GPU support on in its own agent configuration already
#    (/var/lib/ecs/ecs.config); it is set here too, so that the tasks' GPU requirement never rests on
#    that alone. ECS_AWSVPC_BLOCK_IMDS: the tasks (awsvpc) cannot reach the instance metadata service,
#    so not the instance role's credentials either; they have their task role, and none of them uses IMDS.
mkdir -p /etc/ecs
touch /etc/ecs/ecs.config
sed -i -e '/^ECS_CLUSTER=/d' -e '/^ECS_ENABLE_GPU_SUPPORT=/d' -e '/^ECS_AWSVPC_BLOCK_IMDS=/d' /etc/ecs/ecs.config
cat >>/etc/ecs/ecs.config <<'CONFIG'
ECS_CLUSTER=${ClusterName}
ECS_ENABLE_GPU_SUPPORT=true
ECS_AWSVPC_BLOCK_IMDS=true
CONFIG

# 2. The model store (docs/modelsync.md, "On ECS"), at every boot: cloud-init runs its per-boot scripts
#    before the ECS agent starts (ecs.service is After=cloud-final.service), so no task ever sees the
#    path before it is mounted. On this first boot the per-boot stage has passed already: run it now.
mkdir -p /var/lib/cloud/scripts/per-boot
cat >/var/lib/cloud/scripts/per-boot/triton-model-store <<'STORE'
#!/bin/bash
# The model store of the Triton tasks on the instance's NVMe instance store: formatted (XFS) when it holds
# no filesystem, mounted at the store path, owned by uid 10001 (the modelsync daemon's user). A reboot
# keeps the store; a stop and start hands over blank devices, formatted again here. Without instance
# store, a directory on the root volume. Written by the instance's user data (deploy/user-data.sh).
set -euo pipefail
store='${ModelStorePath}'
owner=10001:10001
log() { echo "triton-model-store: $*" >&2; }

# The instance-store NVMe devices, by their model name (EBS volumes are "Amazon Elastic Block Store");
# udev links each device under more than one name (with and without its namespace id), so each once,
# and no partitions.
devices=$(
  for link in /dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*; do
    case "$link" in *-part[0-9]*) continue ;; esac
    if [ -e "$link" ]; then readlink -f "$link"; fi
  done | sort -u
)
# shellcheck disable=SC2086  # one device path per word
set -- $devices

# Several devices (g5.48xlarge, p4d, p5...): one RAID 0 array over all of them, for the capacity and the
# read bandwidth of all; the store is a cache of the bucket, which a lost device only empties.
raid0() {
  # Assembled at boot already (by mdadm's udev rules): the array that holds the first device.
  for holder in /sys/class/block/"$(basename "$1")"/holders/md*; do
    if [ -e "$holder" ]; then
      echo "/dev/$(basename "$holder")"
      return 0
    fi
  done
  command -v mdadm >/dev/null 2>&1 || dnf install -y -q mdadm >&2 || true
  if ! command -v mdadm >/dev/null 2>&1; then
    log "mdadm is not installed and could not be installed: the store uses $1 alone of $# devices"
    echo "$1"
    return 0
  fi
  if ! mdadm --assemble /dev/md0 "$@" >&2; then
    log "creating a RAID 0 array of $# devices"
    mdadm --create /dev/md0 --name=triton-models --level=0 --raid-devices="$#" --run "$@" >&2 || return 1
  fi
  udevadm settle || true
  echo /dev/md0
}

if [ "$#" -eq 0 ]; then
  log "no NVMe instance store on this instance type: $store is a directory on the root volume"
  mkdir -p "$store"
elif [ "$#" -eq 1 ]; then
  target=$1
else
  target=$(raid0 "$@")
fi

if [ "$#" -gt 0 ]; then
  fstype=$(blkid -o value -s TYPE "$target" || true)
  if [ -z "$fstype" ]; then
    log "formatting $target (XFS): new, or blank after a stop and start"
    mkfs.xfs -q -K "$target"
    fstype=xfs
  fi
  mkdir -p "$store"
  if mountpoint -q "$store"; then
    log "$store is mounted already"
  else
    mount -o noatime "$target" "$store"
  fi
  log "$store: $target ($fstype) on $# instance-store device(s)"
fi
chown "$owner" "$store"
chmod 0755 "$store"
log "$store is ready, owned by $owner"
STORE
chmod 0755 /var/lib/cloud/scripts/per-boot/triton-model-store
/var/lib/cloud/scripts/per-boot/triton-model-store
