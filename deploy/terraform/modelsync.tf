# The model-repository sync (docs/modelsync.md), as deploy/stack.yaml has it with ModelSyncBucketName:
# an ECS daemon service (one modelsync task per GPU instance) writing the instance's local repository,
# an SQS queue fed by an EventBridge rule on the bucket's object events, its least-privilege role,
# and (main.tf, iam.tf) Triton in explicit model-control mode over that repository and the daemon's
# log statement on the execution role. model_sync_bucket_name = "" (the default): none of it.
#
# The daemon's container is deploy/modelsync-task-definition.json's, decoded and patched with this
# deployment's image, namespace, Triton URL, queue and log group (the stack sets the same values).

locals {
  model_sync = var.model_sync_bucket_name != ""

  modelsync_task_definition = jsondecode(templatefile("${path.module}/../modelsync-task-definition.json", local.template_vars))
  daemon                    = one(local.modelsync_task_definition.containerDefinitions)
  daemon_volume             = one(local.modelsync_task_definition.volumes)
  daemon_mount              = one(local.daemon.mountPoints)
  daemon_environment        = { for e in local.daemon.environment : e.name => e.value }
}

resource "aws_cloudwatch_log_group" "modelsync" {
  count             = local.model_sync ? 1 : 0
  name              = "${var.log_group_prefix}/modelsync"
  retention_in_days = var.log_retention_days
  tags              = var.tags
}

# Object events of the bucket, through EventBridge (turn on the bucket's EventBridge notifications:
# aws s3api put-bucket-notification-configuration --bucket B --notification-configuration
# '{"EventBridgeConfiguration": {}}'). An event only makes a daemon reconcile sooner; every daemon
# also reconciles every MODELSYNC_INTERVAL. Events only: nothing in the queue outlives a reconcile.
resource "aws_sqs_queue" "modelsync" {
  count = local.model_sync ? 1 : 0
  # SSE-SQS: SSE-KMS with the AWS managed key would stop EventBridge from delivering (it cannot use
  # alias/aws/sqs); a customer managed key is an account choice with its own key policy.
  sqs_managed_sse_enabled    = true
  message_retention_seconds  = 86400
  receive_wait_time_seconds  = 20
  visibility_timeout_seconds = 60
  tags                       = var.tags
}

resource "aws_cloudwatch_event_rule" "modelsync" {
  count       = local.model_sync ? 1 : 0
  description = "Object created or deleted under the model-sync prefix -> the modelsync queue"
  state       = "ENABLED"
  event_pattern = jsonencode({
    source        = ["aws.s3"]
    "detail-type" = ["Object Created", "Object Deleted"]
    detail = {
      bucket = { name = [var.model_sync_bucket_name] }
      object = { key = [{ prefix = var.model_sync_prefix }] }
    }
  })
  tags = var.tags
}

resource "aws_cloudwatch_event_target" "modelsync" {
  count     = local.model_sync ? 1 : 0
  rule      = aws_cloudwatch_event_rule.modelsync[0].name
  target_id = "modelsync-queue"
  arn       = aws_sqs_queue.modelsync[0].arn
}

resource "aws_sqs_queue_policy" "modelsync" {
  count     = local.model_sync ? 1 : 0
  queue_url = aws_sqs_queue.modelsync[0].url
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "EventBridgeRuleOnly"
      Effect    = "Allow"
      Principal = { Service = "events.amazonaws.com" }
      Action    = "sqs:SendMessage"
      Resource  = aws_sqs_queue.modelsync[0].arn
      Condition = { ArnEquals = { "aws:SourceArn" = aws_cloudwatch_event_rule.modelsync[0].arn } }
    }]
  })
}

# Read the archives under the prefix (GET by version id, HEAD, the sha256 tag), list the prefix,
# receive and delete the queue's messages. Nothing else: no write to S3, no other queue.
resource "aws_iam_role" "modelsync" {
  count              = local.model_sync ? 1 : 0
  description        = "modelsync daemon - read model archives under the prefix, consume the model-sync queue"
  assume_role_policy = local.ecs_tasks_trust
  tags               = var.tags
}

resource "aws_iam_role_policy" "modelsync" {
  count = local.model_sync ? 1 : 0
  name  = "modelsync"
  role  = aws_iam_role.modelsync[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "ListThePrefix"
        Effect    = "Allow"
        Action    = "s3:ListBucket"
        Resource  = "arn:${local.partition}:s3:::${var.model_sync_bucket_name}"
        Condition = { StringLike = { "s3:prefix" = "${var.model_sync_prefix}*" } }
      },
      {
        Sid      = "ReadArchives"
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"]
        Resource = "arn:${local.partition}:s3:::${var.model_sync_bucket_name}/${var.model_sync_prefix}*"
      },
      {
        Sid      = "ConsumeTheQueue"
        Effect   = "Allow"
        Action   = ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
        Resource = aws_sqs_queue.modelsync[0].arn
      },
    ]
  })
}

# The host's network: one task per instance, reaching the Triton of that instance (model_sync_triton_url).
resource "aws_ecs_task_definition" "modelsync" {
  count                    = local.model_sync ? 1 : 0
  family                   = "${local.family}-modelsync"
  network_mode             = local.modelsync_task_definition.networkMode
  requires_compatibilities = local.modelsync_task_definition.requiresCompatibilities
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.modelsync[0].arn
  container_definitions = jsonencode([merge(local.daemon, {
    image = var.exporter_image
    environment = [for e in local.daemon.environment : {
      name = e.name
      value = lookup({
        MODELSYNC_QUEUE_URL = aws_sqs_queue.modelsync[0].url
        TRITON_URL          = var.model_sync_triton_url
        AWS_EMF_NAMESPACE   = var.namespace
      }, e.name, e.value)
    }]
    # The module creates the group, so the awslogs driver creates none.
    logConfiguration = merge(local.daemon.logConfiguration, {
      options = merge(
        { for key, value in local.daemon.logConfiguration.options : key => value if key != "awslogs-create-group" },
        { "awslogs-group" = aws_cloudwatch_log_group.modelsync[0].name },
      )
    })
  })])

  volume {
    name      = local.daemon_volume.name
    host_path = var.model_sync_host_path
  }

  tags = var.tags
}

resource "aws_ecs_service" "modelsync" {
  count               = local.model_sync ? 1 : 0
  name                = "${var.service_name}-modelsync"
  cluster             = var.cluster_name
  task_definition     = aws_ecs_task_definition.modelsync[0].arn
  launch_type         = "EC2"
  scheduling_strategy = "DAEMON"
  # A daemon replaces its task in place on each instance; ECS keeps at most one per instance (100%).
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100
  enable_execute_command             = var.enable_exec
  propagate_tags                     = "SERVICE"
  tags                               = var.tags
}
