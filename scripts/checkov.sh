#!/usr/bin/env bash
# Static security scan of the deployable artifacts with checkov, in its own venv.
#
#   bash scripts/checkov.sh            # install (once) into .venv-checkov, then scan
#
# checkov pins old versions of common packages (e.g. `packaging`), so it never
# goes into the main .venv: it lives in .venv-checkov, created here on first use.
# What is scanned: the sidecar's Dockerfile, fluentbit/Dockerfile,
# deploy/triton.Dockerfile, deploy/task-definition.json,
# deploy/task-definition-modelsync.json and deploy/task-definition-controller.json, the CloudFormation
# templates (alarms/*.template.json, deploy/*.yaml|yml|json templates) and the
# Terraform module deploy/terraform (through its examples/ root module); then both once more with the
# optional cluster (CreateCluster / create_cluster) and the fleet's controller (GpuFaultAction=drain) on, from a copy.
# Skipped checks, each with its reason, are listed in .checkov.yaml (or in the resource they concern).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-checkov
CHECKOV_VERSION=${CHECKOV_VERSION:-3.3.30}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$VENV/bin/checkov" ]; then
  "$PY" -m venv "$VENV"
  printf '*\n' > "$VENV/.gitignore"   # keep git and ruff out of it
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "checkov==$CHECKOV_VERSION"
fi
[ -f "$VENV/.gitignore" ] || printf '*\n' > "$VENV/.gitignore"

files=(Dockerfile fluentbit/Dockerfile deploy/triton.Dockerfile deploy/task-definition.json
       deploy/task-definition-modelsync.json deploy/task-definition-controller.json)
for f in alarms/*.template.json deploy/*.yaml deploy/*.yml deploy/*.template.json; do
  [ -f "$f" ] && files+=("$f")
done
args=()
for f in "${files[@]}"; do args+=(--file "$f"); done
# Offline-safe: no Bridgecrew/Prisma platform calls, no version check.
export BC_SKIP_MAPPING=TRUE CHECKOV_RUN_SCA_PACKAGE_SCAN_V2=false
# The four scans are independent: they run at once (each checkov process spends most of its time loading
# its checks), each into its own file, printed in order; the exit code is the worst of them.
out=$(mktemp -d)
on="$out/on"
trap 'rm -rf "$out"' EXIT
scan() { local name=$1; shift; { "$VENV/bin/checkov" --config-file .checkov.yaml --skip-download "$@" >"$out/$name" 2>&1; echo $? >"$out/$name.rc"; } & }
scan files "${args[@]}" "$@"
# The Terraform module as a directory, so checkov resolves the examples/ module call, variables and
# locals (checkov ignores --file arguments once --directory is given, hence a second run).
scan module --framework terraform terraform_json --directory deploy/terraform "$@"
# The optional cluster (CreateCluster / create_cluster, off by default) and the fleet's controller with both its
# jobs (GpuFaultAction / gpu_fault_action = drain, report by default; model sync's fan-out with a bucket,
# ModelSyncBucketName / model_sync_bucket_name, empty by default): checkov leaves out what a condition or a count
# that is false with the defaults creates, so a copy with all of them on by default is scanned too.
mkdir -p "$on/deploy" "$on/dashboards"
cp -r deploy/terraform "$on/deploy/"
cp deploy/*.json deploy/user-data.sh "$on/deploy/"
cp dashboards/triton.json.tftpl "$on/dashboards/"
sed -e '/^  CreateCluster:$/,/^    Default:/ s/Default: "false"/Default: "true"/' \
    -e '/^  GpuFaultAction:$/,/^    Default:/ s/Default: report$/Default: drain/' \
    -e '/^  ModelSyncBucketName:$/,/^    Default:/ s/Default: ""$/Default: example-models/' deploy/stack.yaml >"$on/deploy/stack.yaml"
sed -e '/^variable "gpu_fault_action" {$/,/^}$/ s/default     = "report"/default     = "drain"/' \
    -e '/^variable "model_sync_bucket_name" {$/,/^}$/ s/default     = ""$/default     = "example-models"/' \
  deploy/terraform/variables.tf >"$on/deploy/terraform/variables.tf"
sed '/^variable "create_cluster" {$/,/^}$/ s/default     = false/default     = true/' \
  deploy/terraform/examples/main.tf >"$on/deploy/terraform/examples/main.tf"
if cmp -s deploy/stack.yaml "$on/deploy/stack.yaml" || cmp -s deploy/terraform/examples/main.tf "$on/deploy/terraform/examples/main.tf" \
  || cmp -s deploy/terraform/variables.tf "$on/deploy/terraform/variables.tf" \
  || ! grep -q '^    Default: drain$' "$on/deploy/stack.yaml" || ! grep -q '^    Default: example-models$' "$on/deploy/stack.yaml" \
  || ! grep -q 'default     = "example-models"' "$on/deploy/terraform/variables.tf"; then
  echo "checkov.sh: could not turn CreateCluster, GpuFaultAction and ModelSyncBucketName (and their variables) on in the copy" >&2
  wait
  exit 2
fi
scan stack-cluster --framework cloudformation --file "$on/deploy/stack.yaml" "$@"
scan module-cluster --framework terraform terraform_json --directory "$on/deploy/terraform" "$@"
wait
rc=0
for name in files module stack-cluster module-cluster; do
  cat "$out/$name"
  code=$(cat "$out/$name.rc" 2>/dev/null || echo 1)
  [ "$code" -gt "$rc" ] && rc=$code
done
exit "$rc"
