# The fleet's controller (docs/controller.md), as deploy/stack.yaml has it under ControllerEnabled: one small
# Fargate task per cluster (python -m controller from the exporter image) that reads the hosts' reports from its
# SQS queue, checks each against ECS and alone drains and replaces GPU instances within fleet-wide bounds, and with
# model sync owns its fan-out (one queue per Triton task, subscribed to the topic, removed when the task stops; the
# running task count); its dead-letter queue, a small versioned bucket for its state, its log group, its two roles
# and its alarms. tests/deploy/test_terraform.py compares every one of them with the stack's.
#
# Its containers are deploy/task-definition-controller.json's, read with templatefile() as main.tf reads the
# Triton task's, then patched with what is known only after apply (the queue's URL, the bucket's name) and the
# log group the module creates.
#
# On with gpu_fault_action = "drain" or with model sync (its topic's fan-out).

locals {
  controller = local.gpu_drain || local.model_sync
  controller_template_vars = {
    for name, value in {
      AccountId             = local.account_id
      Region                = local.region
      ExporterTag           = ""
      ClusterName           = var.cluster_name
      Namespace             = local.namespace
      ControllerQueueUrl    = ""
      ControllerStateBucket = ""
      ServiceName           = var.service_name
      ModelSyncTopicArn     = ""
      ModelSyncQueuePrefix  = local.queue_prefix
      ModelSyncBucketName   = var.model_sync_bucket_name
      ModelSyncPrefix       = var.model_sync_prefix
    } : name => trimsuffix(trimprefix(jsonencode(value), "\""), "\"")
  }
  controller_task_definition = jsondecode(templatefile("${path.module}/../task-definition-controller.json", local.controller_template_vars))
  # Known after apply: the queue's URL, the bucket's name and model sync's topic, replaced by name in the file's
  # environment.
  controller_environment = {
    CONTROLLER_QUEUE_URL    = one(aws_sqs_queue.controller[*].url)
    CONTROLLER_STATE_BUCKET = one(aws_s3_bucket.controller_state[*].id)
    CONTROLLER_TOPIC_ARN    = one(aws_sns_topic.modelsync[*].arn)
  }
  # The fan-out's variables of the file: only with model sync (the stack's !If ModelSyncEnabled).
  # Safe rollouts (canary_fraction > 0): the controller decides them for the daemons (MODELSYNC_ROLLOUTS=controller),
  # after the file's variables, as the stack has them.
  controller_rollout_environment = local.rollouts ? [
    { name = "CONTROLLER_ROLLOUTS", value = "on" },
    { name = "CONTROLLER_CANARY_FRACTION", value = var.canary_fraction },
    { name = "CONTROLLER_BAKE_SECONDS", value = tostring(var.bake_seconds) },
    { name = "CONTROLLER_BAKE_MIN_REQUESTS", value = tostring(var.bake_min_requests) },
    { name = "CONTROLLER_MAX_FAILURE_INCREASE", value = var.max_failure_increase },
    { name = "CONTROLLER_MAX_LATENCY_RATIO", value = var.max_latency_ratio },
    { name = "CONTROLLER_MAX_FAILURE_RATIO", value = var.max_failure_ratio },
  ] : []
  controller_fanout_variables = ["CONTROLLER_SERVICE", "CONTROLLER_TOPIC_ARN", "CONTROLLER_QUEUE_NAME_PREFIX", "CONTROLLER_BUCKET", "CONTROLLER_PREFIX"]
  controller_containers = [for c in local.controller_task_definition.containerDefinitions : merge(c, {
    image = var.exporter_image
    environment = concat([
      for e in c.environment : { name = e.name, value = lookup(local.controller_environment, e.name, e.value) }
      if local.model_sync || !contains(local.controller_fanout_variables, e.name)
    ], local.controller_rollout_environment)
    # The module creates the group, so the awslogs driver creates none (and the execution role may not).
    logConfiguration = merge(c.logConfiguration, {
      options = merge(
        { for key, value in c.logConfiguration.options : key => value if key != "awslogs-create-group" },
        { "awslogs-group" = one(aws_cloudwatch_log_group.controller[*].name) },
      )
    })
  })]
  cluster_arn = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:cluster/${var.cluster_name}"
  # ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY[:TAG|@sha256:DIGEST] -> the exporter image's repository.
  exporter_repository_arn = format(
    "arn:%s:ecr:%s:%s:repository/%s", local.partition,
    regex("^[0-9]{12}\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com/", var.exporter_image)[0],
    regex("^([0-9]{12})\\.", var.exporter_image)[0],
    regex("\\.amazonaws\\.com/([^:@]+)", var.exporter_image)[0],
  )
  controller_alarm_actions = var.alarm_topic_arn == "" ? [] : [var.alarm_topic_arn]
}

resource "aws_cloudwatch_log_group" "controller" {
  count             = local.controller ? 1 : 0
  name              = "${var.log_group_prefix}/controller"
  retention_in_days = var.log_retention_days
  tags              = var.tags
}

# --- the queue the hosts report to ---------------------------------------------------------------
# Unread reports wait while the controller is stopped (14 days, SQS's most); a message no pass can take comes back
# after the visibility timeout (several passes of --interval 15 s), and after 10 receives goes to the dead-letter
# queue instead of coming back for ever.

resource "aws_sqs_queue" "controller" {
  count                      = local.controller ? 1 : 0
  sqs_managed_sse_enabled    = true
  visibility_timeout_seconds = 120
  message_retention_seconds  = 1209600
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.controller_dead_letter[0].arn
    maxReceiveCount     = 10
  })
  tags = var.tags
}

resource "aws_sqs_queue" "controller_dead_letter" {
  count                     = local.controller ? 1 : 0
  sqs_managed_sse_enabled   = true
  message_retention_seconds = 1209600
  tags                      = var.tags
}

# Only the Triton task role sends, only the controller's role receives and deletes, only over TLS, whatever
# else identity policies in the account allow. The per-task fan-out queues are not the module's: the controller
# makes each with a policy that admits only model sync's topic (controller/fanout.py).
resource "aws_sqs_queue_policy" "controller" {
  count     = local.controller ? 1 : 0
  queue_url = aws_sqs_queue.controller[0].url
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "DenyInsecureTransport"
        Effect    = "Deny"
        Principal = "*"
        Action    = "sqs:*"
        Resource  = aws_sqs_queue.controller[0].arn
        Condition = { Bool = { "aws:SecureTransport" = "false" } }
      },
      {
        Sid       = "OnlyTheHostsSend"
        Effect    = "Deny"
        Principal = "*"
        Action    = "sqs:SendMessage"
        Resource  = aws_sqs_queue.controller[0].arn
        # With rollout_operator_role_arn: the operators' role too (python -m modelsync rollout promote|reject).
        Condition = { ArnNotEquals = { "aws:PrincipalArn" = var.rollout_operator_role_arn == "" ? aws_iam_role.task.arn : [aws_iam_role.task.arn, var.rollout_operator_role_arn] } }
      },
      {
        Sid       = "OnlyTheControllerReceives"
        Effect    = "Deny"
        Principal = "*"
        Action    = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"]
        Resource  = aws_sqs_queue.controller[0].arn
        Condition = { ArnNotEquals = { "aws:PrincipalArn" = aws_iam_role.controller_task[0].arn } }
      },
    ]
  })
}

resource "aws_sqs_queue_policy" "controller_dead_letter" {
  count     = local.controller ? 1 : 0
  queue_url = aws_sqs_queue.controller_dead_letter[0].url
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DenyInsecureTransport"
      Effect    = "Deny"
      Principal = "*"
      Action    = "sqs:*"
      Resource  = aws_sqs_queue.controller_dead_letter[0].arn
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })
}

# --- its state ---------------------------------------------------------------------------------------
# One small JSON object (controller/state.py), written conditionally (If-Match). A bucket of the module's own,
# holding nothing else (the controller's role may list it, so that S3 answers a missing state with 404, without
# seeing anything else); versioned, old states kept a week. terraform destroy deletes it only once it is empty,
# old versions included (docs/controller.md, "Deploy"), as the stack's deletion.

resource "aws_s3_bucket" "controller_state" {
  count = local.controller ? 1 : 0
  #checkov:skip=CKV_AWS_18:Access logging needs a second bucket; the one object's every write is the controller's, logged in its JSON lines
  #checkov:skip=CKV_AWS_144:Cross-region replication of a state the controller rebuilds (resume starts afresh) would cost a second bucket and replication role
  #checkov:skip=CKV_AWS_145:SSE-S3 encrypts the state; a customer managed key adds a key policy without changing who can read it (the bucket policy and roles decide)
  #checkov:skip=CKV2_AWS_62:No consumer of event notifications: the controller is the one writer and reader
  tags = var.tags
}

resource "aws_s3_bucket_server_side_encryption_configuration" "controller_state" {
  count  = local.controller ? 1 : 0
  bucket = aws_s3_bucket.controller_state[0].id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_public_access_block" "controller_state" {
  count                   = local.controller ? 1 : 0
  bucket                  = aws_s3_bucket.controller_state[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "controller_state" {
  count  = local.controller ? 1 : 0
  bucket = aws_s3_bucket.controller_state[0].id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "controller_state" {
  count  = local.controller ? 1 : 0
  bucket = aws_s3_bucket.controller_state[0].id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "controller_state" {
  count  = local.controller ? 1 : 0
  bucket = aws_s3_bucket.controller_state[0].id
  rule {
    id     = "old-states"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = 7
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "aws_s3_bucket_policy" "controller_state" {
  count  = local.controller ? 1 : 0
  bucket = aws_s3_bucket.controller_state[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DenyInsecureTransport"
      Effect    = "Deny"
      Principal = "*"
      Action    = "s3:*"
      Resource  = [aws_s3_bucket.controller_state[0].arn, "${aws_s3_bucket.controller_state[0].arn}/*"]
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })
}

# --- its roles -----------------------------------------------------------------------------------------

# The ECS agent on Fargate: pull the exporter image, write the controller's log group.
resource "aws_iam_role" "controller_execution" {
  count              = local.controller ? 1 : 0
  description        = "ECS agent for the fleet's controller - pull the exporter image, write the controller's log group"
  assume_role_policy = local.ecs_tasks_trust
  tags               = var.tags
}

resource "aws_iam_role_policy" "controller_execution" {
  count = local.controller ? 1 : 0
  name  = "pull-image-and-logs"
  role  = aws_iam_role.controller_execution[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      # ecr:GetAuthorizationToken has no resource-level permissions (the Service Authorization
      # Reference lists no resource type for it); the token alone grants no repository access.
      { Sid = "EcrAuthToken", Effect = "Allow", Action = "ecr:GetAuthorizationToken", Resource = "*" },
      {
        Sid      = "EcrPullTheExporterImage"
        Effect   = "Allow"
        Action   = ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"]
        Resource = local.exporter_repository_arn
      },
      {
        Sid      = "ControllerOwnLogs"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:${aws_cloudwatch_log_group.controller[0].name}:*"
      },
    ]
  })
}

# The controller's own rights (docs/controller.md, "What the deployment must give it"): each action it calls
# (controller/inbox.py, fleet.py, state.py, fanout.py), on this cluster, its queue, its state, the GPU instances'
# group and model sync's queue prefix, topic and fleet size.
resource "aws_iam_role" "controller_task" {
  count              = local.controller ? 1 : 0
  description        = "The fleet's controller - read its queue, check reports against ECS, drain and replace GPU instances of this cluster, keep its state, make and remove model sync's per-task queues"
  assume_role_policy = local.ecs_tasks_trust
  tags               = var.tags
}

resource "aws_iam_role_policy" "controller_task" {
  count = local.controller ? 1 : 0
  name  = "controller"
  role  = aws_iam_role.controller_task[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat([
      # The hosts' reports: long-poll, delete once handled (DeleteMessageBatch authorizes DeleteMessage).
      {
        Sid      = "ReadTheReports"
        Effect   = "Allow"
        Action   = ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
        Resource = aws_sqs_queue.controller[0].arn
      },
      # The cluster's tasks: a report's task must be RUNNING here; the fan-out's tasks of the Triton service, and
      # whether a task whose queue remains has stopped (DescribeTasks).
      {
        Sid      = "DescribeTheClustersTasks"
        Effect   = "Allow"
        Action   = "ecs:DescribeTasks"
        Resource = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:task/${var.cluster_name}/*"
      },
      # Whether a DRAINING instance still has tasks; the Triton service's tasks (the fan-out). Resource "*" narrowed
      # by the ecs:cluster condition to this cluster, as AWS CDK's ECS drain hook grants it (a container-instance
      # ARN as its resource is refused).
      {
        Sid       = "ListTheClustersTasks"
        Effect    = "Allow"
        Action    = "ecs:ListTasks"
        Resource  = "*"
        Condition = { ArnEquals = { "ecs:cluster" = local.cluster_arn } }
      },
      ],
      # GPU drains only (gpu_fault_action = "drain").
      local.gpu_drain ? [
        # Its container instance registered here with the EC2 instance named; set DRAINING in its turn.
        {
          Sid      = "DrainTheInstance"
          Effect   = "Allow"
          Action   = ["ecs:DescribeContainerInstances", "ecs:UpdateContainerInstancesState"]
          Resource = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:container-instance/${var.cluster_name}/*"
        },
        # The cluster's size, which --max-draining and --pause-above are shares of.
        {
          Sid      = "CountTheInstances"
          Effect   = "Allow"
          Action   = "ecs:ListContainerInstances"
          Resource = local.cluster_arn
        },
        # Whether a replaced instance has left its group. A Describe action: no resource-level permissions.
        {
          Sid      = "IsItStillInItsGroup"
          Effect   = "Allow"
          Action   = "autoscaling:DescribeAutoScalingInstances"
          Resource = "*"
        },
      ] : [],
      # Mark the EC2 instance Unhealthy: its group replaces it. Only with a group known.
      local.gpu_drain_replaces ? [{
        Sid      = "ReplaceTheInstance"
        Effect   = "Allow"
        Action   = "autoscaling:SetInstanceHealth"
        Resource = "arn:${local.partition}:autoscaling:${local.region}:${local.account_id}:autoScalingGroup:*:autoScalingGroupName/${local.gpu_fault_group}"
      }] : [],
      # Model sync's fan-out (controller/fanout.py), on the queues of the module's own prefix only.
      local.model_sync ? [
        # Make each Triton task's queue with its tags (a tagged CreateQueue needs TagQueue too), read and correct its
        # policy (only the topic may send) and encryption, read its tags (whose queue it is, before removing it),
        # GetQueueUrl (whether a subscribed queue still exists).
        {
          Sid      = "MakeAndCheckTheTasksQueues"
          Effect   = "Allow"
          Action   = ["sqs:CreateQueue", "sqs:TagQueue", "sqs:GetQueueAttributes", "sqs:SetQueueAttributes", "sqs:ListQueueTags", "sqs:GetQueueUrl"]
          Resource = "arn:${local.partition}:sqs:${local.region}:${local.account_id}:${local.queue_prefix}*"
        },
        # Remove a stopped task's queue (once ECS confirms it stopped and its tags name this service).
        {
          Sid      = "RemoveStoppedTasksQueues"
          Effect   = "Allow"
          Action   = "sqs:DeleteQueue"
          Resource = "arn:${local.partition}:sqs:${local.region}:${local.account_id}:${local.queue_prefix}*"
        },
        # sqs:ListQueues supports no resource-level permissions (the Service Authorization Reference lists no
        # resource type for it); it reveals queue URLs only, and the controller lists with the module's own prefix.
        { Sid = "ListTheTasksQueues", Effect = "Allow", Action = "sqs:ListQueues", Resource = "*" },
        # Subscribe only queues of the prefix, over SQS, to model sync's topic.
        {
          Sid      = "SubscribeTheTasksQueues"
          Effect   = "Allow"
          Action   = "sns:Subscribe"
          Resource = aws_sns_topic.modelsync[0].arn
          Condition = {
            StringEquals = { "sns:Protocol" = "sqs" }
            StringLike   = { "sns:Endpoint" = "arn:${local.partition}:sqs:${local.region}:${local.account_id}:${local.queue_prefix}*" }
          }
        },
        # List the topic's subscriptions; unsubscribe a queue before it is removed.
        {
          Sid      = "TheTopicsSubscriptions"
          Effect   = "Allow"
          Action   = ["sns:ListSubscriptionsByTopic", "sns:Unsubscribe"]
          Resource = [aws_sns_topic.modelsync[0].arn, "${aws_sns_topic.modelsync[0].arn}:*"]
        },
        # The count of the service's running tasks, which a canary share is sized from: the one object.
        {
          Sid      = "PublishTheFleetSize"
          Effect   = "Allow"
          Action   = "s3:PutObject"
          Resource = "arn:${local.partition}:s3:::${var.model_sync_bucket_name}/${var.model_sync_prefix}.modelsync/fleet.json"
        },
      ] : [],
      # A model bucket encrypted with a customer managed key: S3 asks KMS for a data key to write that object.
      local.model_sync && var.model_bucket_kms_key_arn != "" ? [{
        Sid       = "EncryptTheFleetSize"
        Effect    = "Allow"
        Action    = "kms:GenerateDataKey"
        Resource  = var.model_bucket_kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "s3.${local.region}.amazonaws.com" } }
      }] : [],
      # Safe rollouts (canary_fraction > 0, controller/rollouts.py): each model's state (<prefix>.modelsync/rollouts/,
      # conditional writes), its stable copy (stable/) and the operators' answers (operator/, create-only), read and
      # written by the controller alone; the artifacts a rollout names (HEAD by version id, the sha256 tag), listed
      # under the prefix only; the bucket's versioning (checked at start: a rejected artifact's predecessor is
      # pinned to its version).
      local.rollouts ? [
        {
          Sid    = "DecideTheRollouts"
          Effect = "Allow"
          Action = ["s3:GetObject", "s3:PutObject"]
          Resource = [for folder in ["rollouts", "stable", "operator"] :
          "arn:${local.partition}:s3:::${var.model_sync_bucket_name}/${var.model_sync_prefix}.modelsync/${folder}/*"]
        },
        {
          Sid      = "ReadTheRolledOutArtifacts"
          Effect   = "Allow"
          Action   = ["s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"]
          Resource = "arn:${local.partition}:s3:::${var.model_sync_bucket_name}/${var.model_sync_prefix}*"
        },
        {
          Sid       = "ListTheModelPrefix"
          Effect    = "Allow"
          Action    = "s3:ListBucket"
          Resource  = "arn:${local.partition}:s3:::${var.model_sync_bucket_name}"
          Condition = { StringLike = { "s3:prefix" = "${var.model_sync_prefix}*" } }
        },
        {
          Sid      = "CheckTheBucketIsVersioned"
          Effect   = "Allow"
          Action   = "s3:GetBucketVersioning"
          Resource = "arn:${local.partition}:s3:::${var.model_sync_bucket_name}"
        },
      ] : [],
      # Whether a stopped canary's instance was DRAINING (not a crash); DrainTheInstance grants it with drains on.
      local.rollouts && !local.gpu_drain ? [{
        Sid      = "WasTheCanarysInstanceDraining"
        Effect   = "Allow"
        Action   = "ecs:DescribeContainerInstances"
        Resource = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:container-instance/${var.cluster_name}/*"
      }] : [],
      # A model bucket encrypted with a customer managed key: S3 asks KMS to decrypt what the controller reads there
      # and for a data key to write the rollouts' objects, on the controller's behalf only.
      local.rollouts && var.model_bucket_kms_key_arn != "" ? [{
        Sid       = "RolloutObjectsWithTheKey"
        Effect    = "Allow"
        Action    = ["kms:Decrypt", "kms:GenerateDataKey"]
        Resource  = var.model_bucket_kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "s3.${local.region}.amazonaws.com" } }
      }] : [],
      [
        # Its state: read and write the one object (the default key, controller/<cluster>/state.json) ...
        {
          Sid      = "TheState"
          Effect   = "Allow"
          Action   = ["s3:GetObject", "s3:PutObject"]
          Resource = "${aws_s3_bucket.controller_state[0].arn}/controller/${var.cluster_name}/state.json"
        },
        # ... and list its bucket, so that S3 answers the first read with 404 (no state yet), not 403.
        {
          Sid      = "TellAMissingStateFromADeniedOne"
          Effect   = "Allow"
          Action   = "s3:ListBucket"
          Resource = aws_s3_bucket.controller_state[0].arn
        },
    ])
  })
}

# --- the task and its service ---------------------------------------------------------------------------

resource "aws_ecs_task_definition" "controller" {
  count                    = local.controller ? 1 : 0
  family                   = "${local.family}-controller"
  network_mode             = local.controller_task_definition.networkMode
  requires_compatibilities = local.controller_task_definition.requiresCompatibilities
  cpu                      = local.controller_task_definition.cpu
  memory                   = local.controller_task_definition.memory
  execution_role_arn       = aws_iam_role.controller_execution[0].arn
  task_role_arn            = aws_iam_role.controller_task[0].arn
  container_definitions    = jsonencode(local.controller_containers)
  tags                     = var.tags
}

# Desired count 1, and a deployment stops the old task before it starts the new one (100 % / 0 %): two
# controllers never decide at once. No load balancer; its ENI in the module's subnets, which reach ECR, ECS, SQS,
# S3 and CloudWatch Logs as the Triton tasks'. desired_count is the module's: no scaling owns it.
resource "aws_ecs_service" "controller" {
  count                              = local.controller ? 1 : 0
  name                               = "${var.service_name}-controller"
  cluster                            = local.create_cluster ? aws_ecs_cluster.this[0].name : var.cluster_name
  task_definition                    = aws_ecs_task_definition.controller[0].arn
  launch_type                        = "FARGATE"
  desired_count                      = 1
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100
  propagate_tags                     = "SERVICE"

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = var.security_group_ids
    assign_public_ip = false
  }

  tags = var.tags
}

# --- its alarms (docs/controller.md, "How to watch it") ---------------------------------------------------
# Its metrics, named in controller/metrics.py, in the deployment's namespace with the dimension cluster. Here
# rather than in alarms.tf.json, which render/ generates from the metric catalog: the catalog does not know the
# controller's metrics yet.

resource "aws_cloudwatch_metric_alarm" "controller_drains_paused" {
  count               = local.controller ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-gpu-drains-paused"
  alarm_description   = "GPU drains are paused: more than --pause-above of the cluster's instances reported a draining GPU fault within an hour (a driver, an AMI?). Find the cause, then python -m controller resume (docs/controller.md)."
  namespace           = local.namespace
  metric_name         = "GpuDrainsPaused"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 1
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "controller_drain_failures" {
  count               = local.controller ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-gpu-drain-failures"
  alarm_description   = "An ECS or Auto Scaling call of a GPU drain or replacement failed (a missing permission, throttling); the controller retries on its next pass. Its log line says which call and why."
  namespace           = local.namespace
  metric_name         = "GpuDrainFailures"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 1
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "controller_not_running" {
  count               = local.controller ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-controller-not-running"
  alarm_description   = "No controller heartbeat for 5 minutes: nothing decides GPU drains or makes a new task's model-sync queue (hosts keep serving; reports wait in the queue). Missing data is breaching: silence is a failure."
  namespace           = local.namespace
  metric_name         = "ControllerHeartbeat"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 5
  datapoints_to_alarm = 5
  threshold           = 1
  comparison_operator = "LessThanThreshold"
  treat_missing_data  = "breaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "controller_reports_refused" {
  count               = local.controller ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-gpu-reports-refused"
  alarm_description   = "The controller refused a GPU fault report: malformed, naming another cluster, a task not running, or sent by another role session than the reporting task's. Its log line names the check."
  namespace           = local.namespace
  metric_name         = "GpuReportsRefused"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 1
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "controller_state_failures" {
  count               = local.controller ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-controller-state-failures"
  alarm_description   = "The controller could not read or write its state for 3 minutes in a row (S3, its rights, or a conflict that does not clear); it decides nothing new until it can."
  namespace           = local.namespace
  metric_name         = "ControllerStateFailures"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 3
  datapoints_to_alarm = 3
  threshold           = 3
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}

# With model sync: a fan-out call that keeps failing (a missing right, a throttle that does not pass) leaves new tasks
# without their queue (they still sync every interval) or stopped tasks' queues behind.
resource "aws_cloudwatch_metric_alarm" "controller_fanout_failures" {
  count               = local.model_sync ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-controller-fanout-failures"
  alarm_description   = "The controller's fan-out calls (ECS, SQS, SNS, the fleet size in S3) failed in 3 of 5 minutes: new Triton tasks may have no model-sync queue (they sync every interval instead) or the canary share no fleet size. Its log line says which call and why."
  namespace           = local.namespace
  metric_name         = "FanoutFailures"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 5
  datapoints_to_alarm = 3
  threshold           = 1
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}

# With rollouts: a canary's Triton exiting while it served the artifact (two reject it), and a rollout state that
# had to be rewritten from the controller's stable copy.
resource "aws_cloudwatch_metric_alarm" "controller_rollout_crashes" {
  count               = local.rollouts ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-rollout-crashes"
  alarm_description   = "A canary's Triton exited while it served a new model artifact (ECS stop code EssentialContainerExited, or its daemon reported Triton gone, outside a drain, scale-in or deployment); a second crash rejects the artifact. The controller's log line names the model, the artifact and the task."
  namespace           = local.namespace
  metric_name         = "RolloutCrashes"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 1
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "controller_rollout_state_repairs" {
  count               = local.rollouts ? 1 : 0
  alarm_name          = "${local.alarm_name_prefix}-rollout-state-repairs"
  alarm_description   = "A model's rollout state did not parse or validate (a hand edit, a writer other than the controller) and was rewritten from the controller's stable copy; no rejection was bypassed. Find who wrote it."
  namespace           = local.namespace
  metric_name         = "RolloutStateRepairs"
  dimensions          = { cluster = var.cluster_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 1
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.controller_alarm_actions
  ok_actions          = local.controller_alarm_actions
  tags                = var.tags
}
