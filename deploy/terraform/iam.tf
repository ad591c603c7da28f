# Least-privilege roles, statement for statement those of deploy/stack.yaml.

locals {
  ecs_tasks_trust = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ecs-tasks.amazonaws.com" }
      Action    = "sts:AssumeRole"
      Condition = { StringEquals = { "aws:SourceAccount" = local.account_id } }
    }]
  })

  # ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY[:TAG|@sha256:DIGEST] -> the repository's ARN.
  image_repository_arns = distinct([
    for image in [var.triton_image, var.exporter_image, var.log_router_image] : format(
      "arn:%s:ecr:%s:%s:repository/%s", local.partition,
      regex("^[0-9]{12}\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com/", image)[0],
      regex("^([0-9]{12})\\.", image)[0],
      regex("\\.amazonaws\\.com/([^:@]+)", image)[0],
    )
  ])
}

# The ECS agent: pull the three images, write the log router's own awslogs group (and, with model
# sync, the daemon's: its stdout is EMF, its stderr JSON log lines).
resource "aws_iam_role" "execution" {
  description        = "ECS agent for the Triton task - pull the three images, write the log router's own awslogs group, read the admin key"
  assume_role_policy = local.ecs_tasks_trust
  tags               = var.tags
}

resource "aws_iam_role_policy" "execution" {
  name = "pull-images-and-router-logs"
  role = aws_iam_role.execution.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat([
      # ecr:GetAuthorizationToken has no resource-level permissions (the Service Authorization
      # Reference lists no resource type for it); the token alone grants no repository access.
      { Sid = "EcrAuthToken", Effect = "Allow", Action = "ecr:GetAuthorizationToken", Resource = "*" },
      {
        Sid      = "EcrPullTheThreeImages"
        Effect   = "Allow"
        Action   = ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"]
        Resource = local.image_repository_arns
      },
      {
        Sid      = "LogRouterOwnLogs"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "${local.log_group_arns["log-router"]}:*"
      },
      # The admin key, injected into Triton, the exporter and model sync at the task's start (admin_key.tf).
      {
        Sid      = "TritonAdminKeySecret"
        Effect   = "Allow"
        Action   = "secretsmanager:GetSecretValue"
        Resource = aws_secretsmanager_secret.admin_key.arn
      },
      ],
      # The modelsync daemon's awslogs group, with model sync only (no instance: no statement).
      [for group in aws_cloudwatch_log_group.modelsync : {
        Sid      = "ModelSyncOwnLogs"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:${group.name}:*"
      }],
    )
  })
}

# The containers (ECS has one role per task). Only the log router, modelsync (with model sync), the
# exporter's trace relay (with tracing, tracing.tf) and, with an s3:// repository, Triton call AWS: the
# exporter sends EMF over TCP to the router, which writes it with PutLogEvents, so no
# cloudwatch:PutMetricData, and it reads task metadata from the ECS agent, so no ecs:* either.
resource "aws_iam_role" "task" {
  description        = "Triton task containers - write the Fluent Bit log groups under the prefix, read the model bucket, model sync"
  assume_role_policy = local.ecs_tasks_trust
  tags               = var.tags
}

# Fluent Bit's cloudwatch_logs output calls CreateLogGroup only when CreateLogStream answers
# ResourceNotFoundException, so the groups this module creates need no create right.
resource "aws_iam_role_policy" "task_logs" {
  name = "fluent-bit-log-groups"
  role = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "WriteFixedGroups"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = [for key, arn in local.log_group_arns : "${arn}:*" if key != "log-router"]
      },
      {
        # <prefix>/model/* is not a Resource "*": per-model group names come from model names at
        # run time, and the wildcard stays under the module's own prefix.
        Sid      = "CreateAndWriteModelGroups"
        Effect   = "Allow"
        Action   = ["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:${var.log_group_prefix}/model/*"
      },
    ]
  })
}

resource "aws_iam_role_policy" "task_model_bucket" {
  count = var.model_bucket_name == "" ? 0 : 1
  name  = "read-model-repository"
  role  = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Sid = "ListModelBucket", Effect = "Allow", Action = "s3:ListBucket", Resource = "arn:${local.partition}:s3:::${var.model_bucket_name}" },
      { Sid = "ReadModelObjects", Effect = "Allow", Action = "s3:GetObject", Resource = "arn:${local.partition}:s3:::${var.model_bucket_name}/*" },
    ]
  })
}

# modelsync (a container of the task): read the archives under the prefix (GET by version id, HEAD, the sha256
# tag; and <prefix>.modelsync/fleet.json, the controller's count of running tasks), list the prefix; receive from
# and delete on its task's queue, which the controller makes, subscribes and removes (MODELSYNC_FANOUT=controller:
# GetQueueUrl, ReceiveMessage, DeleteMessageBatch, nothing else); the rollouts' state objects
# (<prefix>.modelsync/rollouts/) are read, never written: the controller decides and writes them (controller.tf).
# It cannot create, tag, reconfigure, delete, list or subscribe a queue (issue 36, finding 5), nor write anything
# in S3.
resource "aws_iam_role_policy" "task_modelsync" {
  count = local.model_sync ? 1 : 0
  name  = "modelsync"
  role  = aws_iam_role.task.id
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
        # Its task's queue, <prefix><task id> (IAM has no variable for the task id, so the grant covers the
        # prefix: a daemon could read another task's queue by name, which steals hints, never a queue).
        Sid      = "ReadItsTasksQueue"
        Effect   = "Allow"
        Action   = ["sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:DeleteMessage"]
        Resource = "arn:${local.partition}:sqs:${local.region}:${local.account_id}:${local.queue_prefix}*"
      },
    ]
  })
}

# A bucket encrypted with a customer managed key: decrypt through S3 only.
resource "aws_iam_role_policy" "task_model_bucket_key" {
  count = var.model_bucket_kms_key_arn == "" ? 0 : 1
  name  = "model-bucket-key"
  role  = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DecryptThroughS3"
      Effect    = "Allow"
      Action    = "kms:Decrypt"
      Resource  = var.model_bucket_kms_key_arn
      Condition = { StringEquals = { "kms:ViaService" = "s3.${local.region}.amazonaws.com" } }
    }]
  })
}

resource "aws_iam_role_policy" "task_exec" {
  count = var.enable_exec ? 1 : 0
  name  = "ecs-exec"
  role  = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      # The ssmmessages channel actions support no resource-level permissions; AWS documents
      # Resource "*" for ECS Exec. Present only with enable_exec = true.
      Sid      = "EcsExecChannels"
      Effect   = "Allow"
      Action   = ["ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"]
      Resource = "*"
    }]
  })
}
