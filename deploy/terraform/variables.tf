# The deployment's inputs: the parameters of deploy/stack.yaml, snake_cased, with the same
# defaults and constraints (tests/deploy/test_terraform.py checks both). The alarm and scaling
# thresholds, names and switches are declared in the generated alarms.tf.json.

# --- cluster and network ----------------------------------------------------------------

variable "cluster_name" {
  type        = string
  description = "Name (not ARN) of the ECS cluster of GPU instances (ECS GPU-optimized AMI); with create_cluster = true, the name of the cluster the module creates"
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,255}$", var.cluster_name))
    error_message = "The cluster_name must be a cluster name (1-255 letters, digits, _ or -), not an ARN."
  }
}

variable "service_name" {
  type        = string
  description = "Name of the ECS service (also the scalable target service/<cluster>/<service>)"
  default     = "triton"
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,255}$", var.service_name))
    error_message = "The service_name must be 1-255 letters, digits, _ or -."
  }
}

variable "vpc_id" {
  type        = string
  description = "VPC of the subnets and of the load balancer"
  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "The vpc_id must be a VPC id (vpc-...)."
  }
}

variable "subnet_ids" {
  type        = list(string)
  description = "Subnets of the tasks' ENIs (awsvpc), in the VPC of the load balancer"
  validation {
    condition     = length(var.subnet_ids) > 0 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "The subnet_ids must be one or more subnet ids (subnet-...)."
  }
}

variable "security_group_ids" {
  type        = list(string)
  description = "Security groups of the tasks; must allow TCP 8000 from the load balancer (keep 8002 closed)"
  validation {
    condition     = length(var.security_group_ids) > 0 && alltrue([for s in var.security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "The security_group_ids must be one or more security group ids (sg-...)."
  }
}

variable "listener_arn" {
  type        = string
  description = "ARN of an existing Application Load Balancer listener in vpc_id; the module adds a rule to it"
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:elasticloadbalancing:[a-z0-9-]+:[0-9]{12}:listener/app/.+$", var.listener_arn))
    error_message = "The listener_arn must be an Application Load Balancer listener ARN."
  }
}

variable "listener_rule_priority" {
  type        = number
  description = "Priority of the module's forwarding rule on the listener (unique per listener)"
  default     = 100
  validation {
    condition     = var.listener_rule_priority >= 1 && var.listener_rule_priority <= 50000
    error_message = "The listener_rule_priority must be from 1 to 50000."
  }
}

variable "listener_deny_rule_priority" {
  type        = number
  description = "Priority of the module's rule that answers 403 to Triton's model configuration, statistics and trace paths (unique per listener; must be below listener_rule_priority, so that it is evaluated first)"
  default     = 99
  validation {
    condition     = var.listener_deny_rule_priority >= 1 && var.listener_deny_rule_priority <= 50000
    error_message = "The listener_deny_rule_priority must be from 1 to 50000."
  }
}

variable "listener_host_header" {
  type        = string
  description = "Host header the rule also requires (e.g. triton.example.com); empty matches any host"
  default     = ""
}

variable "health_check_grace_period_seconds" {
  type        = number
  description = "Seconds ECS ignores failing load balancer health checks after a task starts (model load time)"
  default     = 600
  validation {
    condition     = var.health_check_grace_period_seconds >= 0 && var.health_check_grace_period_seconds <= 7200
    error_message = "The health_check_grace_period_seconds must be from 0 to 7200."
  }
}

# --- images and models -------------------------------------------------------------------

variable "triton_image" {
  type        = string
  description = "Private ECR URI of the Triton image built from deploy/triton.Dockerfile (tag or @sha256 digest)"
  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com/[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.triton_image))
    error_message = "The triton_image must be a private ECR image URI, ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY:TAG."
  }
}

variable "exporter_image" {
  type        = string
  description = "Private ECR URI of the sidecar image built from the repository's Dockerfile"
  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com/[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.exporter_image))
    error_message = "The exporter_image must be a private ECR image URI, ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY:TAG."
  }
}

variable "log_router_image" {
  type        = string
  description = "Private ECR URI of the log-router image built from fluentbit/Dockerfile"
  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com/[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.log_router_image))
    error_message = "The log_router_image must be a private ECR image URI, ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY:TAG."
  }
}

variable "model_repository" {
  type        = string
  description = "Triton's --model-repository: s3://bucket/prefix, a path in the image, or the container path where model_repository_host_path is mounted"
  validation {
    condition     = length(var.model_repository) >= 1
    error_message = "The model_repository must not be empty."
  }
}

variable "model_repository_host_path" {
  type        = string
  description = "Host directory with the model repository (e.g. an EFS or instance-store mount on the GPU instances); mounted read-only at model_repository, which must then be an absolute path. Empty: no mount"
  default     = ""
}

variable "model_bucket_name" {
  type        = string
  description = "S3 bucket of an s3:// model_repository; the task role gets read access to it only. Empty for none"
  default     = ""
}

variable "expect_gpu" {
  type        = string
  description = "Regular expression of GPU models the task may run on (STARTUP_EXPECT_GPU); empty accepts any"
  default     = ""
}

variable "model_bucket_kms_key_arn" {
  type        = string
  description = "ARN of the customer managed KMS key that encrypts model_bucket_name or model_sync_bucket_name (SSE-KMS); the task role may then decrypt with it, through S3 only (kms:ViaService). Empty: SSE-S3 or no encryption"
  default     = ""
  validation {
    condition     = can(regex("^(arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+)?$", var.model_bucket_kms_key_arn))
    error_message = "The model_bucket_kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID), or empty."
  }
}

# --- model sync (optional; docs/modelsync.md) ---------------------------------------------

variable "model_sync_bucket_name" {
  type        = string
  description = "Bucket of <prefix><model>.zip archives that modelsync installs on every GPU instance; empty: no model sync (Triton serves model_repository as before). The bucket must send events to EventBridge"
  default     = ""
  validation {
    condition     = can(regex("^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])?$", var.model_sync_bucket_name))
    error_message = "The model_sync_bucket_name must be an S3 bucket name (3-63 lowercase letters, digits, . or -), or empty."
  }
}

variable "model_sync_prefix" {
  type        = string
  description = "Key prefix of the archives, a folder ending in / (e.g. models/); empty for the whole bucket"
  default     = ""
  # A folder: the grants on <prefix>* must not reach models-private/... from a prefix of models.
  validation {
    condition     = can(regex("^([^/*][^*]{0,499}/)?$", var.model_sync_prefix))
    error_message = "The model_sync_prefix must be empty or end with /, must not start with / and must not contain *."
  }
}

variable "model_sync_host_path" {
  type        = string
  description = "Directory on each GPU instance's local disk (e.g. the NVMe instance store) for the model store that the Triton tasks of the instance share; created and given to uid 10001 by the task itself. Mounted at /mnt/triton/store (read-write in modelsync, read-only in Triton)"
  default     = "/opt/triton-models"
  validation {
    condition     = can(regex("^/[A-Za-z0-9_./-]*$", var.model_sync_host_path))
    error_message = "The model_sync_host_path must be an absolute path (letters, digits, _ . / -)."
  }
}

# Safe rollouts (docs/modelsync.md, "Safe rollouts"): the stack's CanaryFraction, BakeSeconds, ...

variable "canary_fraction" {
  type        = string
  description = "Share of the Triton tasks that serve a new model artifact first (ceil(F x tasks), at least one), judged against the tasks on the previous artifact before the others install it; 0: every task at once"
  default     = "0"
  validation {
    condition     = can(regex("^(0(\\.[0-9]{1,4})?|1(\\.0{1,4})?)$", var.canary_fraction))
    error_message = "The canary_fraction must be a number from 0 to 1 (at most 4 decimals)."
  }
}

variable "bake_seconds" {
  type        = number
  description = "Seconds the canaries serve a new artifact before the verdict"
  default     = 600
  validation {
    condition     = var.bake_seconds >= 10 && var.bake_seconds <= 86400
    error_message = "The bake_seconds must be between 10 and 86400."
  }
}

variable "bake_min_requests" {
  type        = number
  description = "Fewer requests than this on the canaries during the bake is no evidence (the rollout waits)"
  default     = 100
  validation {
    condition     = var.bake_min_requests >= 1
    error_message = "The bake_min_requests must be at least 1."
  }
}

variable "max_failure_increase" {
  type        = string
  description = "Reject when the canaries' failure ratio exceeds the previous artifact's by more than this"
  default     = "0.01"
  validation {
    condition     = can(regex("^0\\.0{0,5}[1-9][0-9]{0,5}$", var.max_failure_increase)) && length(var.max_failure_increase) <= 8
    error_message = "The max_failure_increase must be a number above 0 and below 1, with at most 6 decimals."
  }
}

variable "max_latency_ratio" {
  type        = string
  description = "Reject when the canaries' average (and p95) latency exceeds the previous artifact's by this factor"
  default     = "1.5"
  validation {
    condition     = can(regex("^(1\\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9])|[2-9][0-9]{0,2}(\\.[0-9]{1,3})?|1[0-9]{1,2}(\\.[0-9]{1,3})?)$", var.max_latency_ratio))
    error_message = "The max_latency_ratio must be a number above 1 and below 1000, with at most 3 decimals."
  }
}

variable "max_failure_ratio" {
  type        = string
  description = "Reject a canary failing more than this share of its requests, whatever the previous artifact's"
  default     = "0.05"
  validation {
    condition     = can(regex("^0\\.0{0,5}[1-9][0-9]{0,5}$", var.max_failure_ratio)) && length(var.max_failure_ratio) <= 8
    error_message = "The max_failure_ratio must be a number above 0 and below 1, with at most 6 decimals."
  }
}

variable "rollout_operator_role_arn" {
  type        = string
  description = "The IAM role operators run `python -m modelsync rollout promote|reject` as: the controller's queue admits its messages beside the hosts' (the role itself needs sqs:SendMessage on the queue and the operator/* objects; docs/controller.md); empty: no operator commands"
  default     = ""
  validation {
    condition     = can(regex("^(arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512})?$", var.rollout_operator_role_arn))
    error_message = "The rollout_operator_role_arn must be empty or an IAM role ARN."
  }
}

# --- tracing (optional; docs/tracing.md, "Deploy"; tracing.tf) -----------------------------

variable "tracing" {
  type        = bool
  description = "Trace requests: Triton's OpenTelemetry trace flags (1 request in trace_rate, service.name service_name), the exporter's trace relay forwarding the spans to X-Ray's OTLP endpoint in this region, and AWS's managed X-Ray write policy (AWSXrayWriteOnlyAccess) on the task role. The account needs CloudWatch Transaction Search turned on first (docs/tracing.md)"
  default     = false
}

variable "trace_rate" {
  type        = string
  description = "With tracing, Triton traces 1 request in this many (--trace-config rate=N; a whole number, 1 or more)"
  default     = "1000"
  validation {
    condition     = can(regex("^[1-9][0-9]{0,8}$", var.trace_rate))
    error_message = "The trace_rate must be a whole number from 1 to 999999999."
  }
}

# --- OTLP metrics (optional; docs/otlp.md, "Deploy"; otlp.tf) -----------------------------

variable "otlp_metrics" {
  type        = bool
  description = "Send metrics over OTLP too: the exporter's outputs get CloudWatch's OTLP endpoint in this region after the EMF output (which stays: scaling and the classic alarms read it), the task role cloudwatch:PutMetricData, and the alarms the PromQL alarms (docs/otlp.md, docs/dashboards.md)"
  default     = false
}

variable "otlp_semconv" {
  type        = string
  description = "With otlp_metrics, genai: the OTLP output also sends OpenTelemetry's GenAI server metrics (gen_ai.server.time_to_first_token, time_per_output_token, request.duration) per LLM model version (EXPORTER_OTLP_SEMCONV; docs/otlp.md). Without otlp_metrics it changes nothing: there is no OTLP output"
  default     = "off"
  validation {
    condition     = contains(["off", "genai"], var.otlp_semconv)
    error_message = "The otlp_semconv must be off or genai."
  }
}

# --- GPU faults (docs/gpu.md; gpufaults.tf) ---------------------------------------------------

variable "gpu_fault_action" {
  type        = string
  description = "What an exporter does when a GPU turns unhealthy (a fatal XID, a driver recovery action, a lost GPU, a failed row remap): report (GpuHealthy=0, the GpuUnhealthy alarm, a log line; no AWS call), or drain: also report it to the fleet's controller, which the module then deploys (a Fargate service, its queue, state bucket, roles and alarms; controller.tf, docs/controller.md) and which alone sets container instances DRAINING and marks EC2 instances Unhealthy in their Auto Scaling group, one at a time within fleet-wide bounds (EXPORTER_GPU_FAULT_ACTION)"
  default     = "report"
  validation {
    condition     = contains(["report", "drain"], var.gpu_fault_action)
    error_message = "The gpu_fault_action must be report or drain."
  }
}

variable "gpu_fault_auto_scaling_group_name" {
  type        = string
  description = "With gpu_fault_action = drain and an existing cluster (create_cluster = false): the Auto Scaling group of its GPU instances, which the controller's role may mark an instance of Unhealthy. Empty: the module's own group with create_cluster; on an existing cluster, drained instances are then not replaced (the call is refused)"
  default     = ""
  validation {
    condition     = can(regex("^[A-Za-z0-9 ._/+=@:-]{0,255}$", var.gpu_fault_auto_scaling_group_name))
    error_message = "The gpu_fault_auto_scaling_group_name must be an Auto Scaling group name (up to 255 characters), or empty."
  }
}

# --- cluster from zero (optional; docs/deploy.md, "Cluster from zero"; cluster.tf) -------

variable "create_cluster" {
  type        = bool
  description = "Create the cluster too: an ECS cluster named cluster_name, an Auto Scaling group of GPU instances (instance_type, on the ECS GPU-optimized AMI) in subnet_ids with security_group_ids, the NVMe instance store mounted at model_sync_host_path, and a capacity provider with managed scaling for the service. false: cluster_name is an existing cluster of GPU instances"
  default     = false
}

variable "instance_type" {
  type        = string
  description = "With create_cluster: type of the GPU instances (NVIDIA, x86_64). Each task takes one GPU, so an instance runs as many tasks as it has GPUs (and free ENIs: awsvpc); g4dn, g5, g6, g6e, p4d and p5 have NVMe instance store"
  default     = "g5.xlarge"
  validation {
    condition     = can(regex("^(g4dn|g5|g6|g6e|g6f|gr6|gr6f|g7e|p3|p3dn|p4d|p4de|p5|p5e|p5en|p6-b200|p6-b300)\\.[0-9a-z]+$", var.instance_type))
    error_message = "The instance_type must be an NVIDIA GPU instance type on x86_64 (g4dn, g5, g6, g6e, g7e, p4d, p5, ...)."
  }
}

variable "cluster_min_size" {
  type        = number
  description = "With create_cluster: fewest GPU instances. 0 stops paying for GPUs while no task runs, but the first task then waits for an instance to start"
  default     = 1
  validation {
    condition     = var.cluster_min_size >= 0
    error_message = "The cluster_min_size must be 0 or more."
  }
}

variable "cluster_max_size" {
  type        = number
  description = "With create_cluster: most GPU instances. Leave room for max_capacity tasks and one more: a rolling deployment (maximum percent 200, minimum healthy percent 100) starts a new task before it stops an old one, so with one GPU per instance at least max_capacity + 1"
  default     = 5
  validation {
    condition     = var.cluster_max_size >= 1
    error_message = "The cluster_max_size must be 1 or more."
  }
}

variable "root_volume_size" {
  type        = number
  description = "With create_cluster: GiB of each instance's encrypted gp3 root volume, which holds the container images (a Triton image alone unpacks to some 20-30 GB); at least the AMI's 30"
  default     = 100
  validation {
    condition     = var.root_volume_size >= 30 && var.root_volume_size <= 16384
    error_message = "The root_volume_size must be from 30 to 16384 (GiB)."
  }
}

variable "gpu_ami_parameter" {
  type        = string
  description = "With create_cluster: the SSM parameter that holds the AMI id, by default AWS's public one for the latest ECS GPU-optimized Amazon Linux 2023 AMI. Read at every plan: instances launched after an apply use the newest AMI"
  default     = "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
  validation {
    # RE2 (Terraform's regex) refuses repeat counts over 1000, so the 2048 limit is a length() check.
    condition     = length(var.gpu_ami_parameter) <= 2048 && can(regex("^[A-Za-z0-9_./-]+$", var.gpu_ami_parameter))
    error_message = "The gpu_ami_parameter must be an SSM parameter name (letters, digits, _ . / -)."
  }
}

# --- capacity ----------------------------------------------------------------------------

variable "desired_count" {
  type        = number
  description = "Tasks at creation; then the service scaling (min_capacity..max_capacity, docs/scaling.md) owns the count"
  default     = 1
  validation {
    condition     = var.desired_count >= 0
    error_message = "The desired_count must be 0 or more."
  }
}

variable "triton_memory" {
  type        = number
  description = "MiB of instance memory reserved for the Triton container (a soft reservation: it may use more when the instance has it); size it for the models' host-side copies and the Python backend's stubs"
  default     = 8192
  validation {
    condition     = var.triton_memory >= 512
    error_message = "The triton_memory must be at least 512."
  }
}

variable "triton_args" {
  type        = string
  description = "More tritonserver flags, after the module's own (e.g. --backend-config=python,shm-default-byte-size=16777216 --model-load-thread-count=8); not the flags that open the admin API (--allow-sagemaker, --allow-vertex-ai, --http-restricted-api, --grpc-restricted-protocol) or that model sync owns (--model-repository, --model-control-mode, --load-model)"
  default     = ""
  # Letters, digits and - _ = . , : / + and blanks only: the flags go through the shell (sh -c).
  validation {
    condition     = can(regex("^[A-Za-z0-9 _=.,:/+-]{0,1000}$", var.triton_args)) && !can(regex("--(allow-sagemaker|allow-vertex-ai|http-restricted-api|grpc-restricted-protocol|model-repository|model-control-mode|load-model)", var.triton_args))
    error_message = "The triton_args may hold letters, digits, blanks and - _ = . , : / + only, at most 1000 characters, and none of the flags the module owns."
  }
}

variable "triton_cpu" {
  type        = number
  description = "CPU units (1024 = one vCPU) reserved for the Triton container, which also weighs its share under contention; the sidecars take 128 each. Leave room for them and the ECS agent on the instance type"
  default     = 3072
  validation {
    condition     = var.triton_cpu >= 256
    error_message = "The triton_cpu must be at least 256."
  }
}

# --- observability -----------------------------------------------------------------------

variable "namespace" {
  type        = string
  description = "CloudWatch namespace the exporter writes (AWS_EMF_NAMESPACE), one per ECS service: alarms and scaling read it. Empty: Triton/<task family>, so two deployments never scale on each other's metrics"
  default     = ""
  validation {
    condition     = can(regex("^([ -~]{1,255})?$", var.namespace))
    error_message = "The namespace must be 1-255 printable ASCII characters, or empty."
  }
}

variable "alarm_name_prefix" {
  type        = string
  description = "Prefix of every alarm, scaling policy and Contributor Insights rule name. Empty: the task family, so two deployments in one account never share an alarm name"
  default     = ""
}

variable "dashboard_name" {
  type        = string
  description = "Name of the CloudWatch dashboard. Empty: the task family, so two deployments in one account never share one"
  default     = ""
}

variable "log_group_prefix" {
  type        = string
  description = "Fluent Bit log group prefix (TRITON_LOG_GROUP_PREFIX); every log group of the module starts with it"
  default     = "/ecs/triton"
  validation {
    condition     = can(regex("^[A-Za-z0-9_./#-]{0,470}[A-Za-z0-9_.#-]$", var.log_group_prefix))
    error_message = "The log_group_prefix must be a log group name prefix without a trailing slash."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Retention of every log group of the module, and of the per-model groups the router creates"
  default     = 30
  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "The log_retention_days must be a retention CloudWatch Logs offers (1, 3, 5, 7, 14, 30, 60, 90, ... 3653)."
  }
}

variable "enable_exec" {
  type        = bool
  description = "Turn on ECS Exec (enable_execute_command and the SSM channel permissions on the task role)"
  default     = false
}

# --- Terraform only ----------------------------------------------------------------------

variable "task_family" {
  type        = string
  description = "Family of the task definition; empty: <cluster_name>-<service_name> (the stack uses its stack name)"
  default     = ""
}

variable "tags" {
  type        = map(string)
  description = "Tags for every resource that takes them"
  default     = {}
}
