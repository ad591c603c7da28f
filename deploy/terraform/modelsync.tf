# The model-repository sync (docs/modelsync.md), as deploy/stack.yaml has it with ModelSyncBucketName:
# two more containers in the Triton task (main.tf reads deploy/task-definition-modelsync.json: the
# init container gives the volumes to uid 10001, the daemon turns HEALTHY after its first sync and
# Triton starts only then), the daemon's log group, an SNS topic that an EventBridge rule on the
# bucket's object events publishes to (the controller, controller.tf, makes one queue per Triton task,
# subscribes it and removes it when the task stops; the daemon only reads it), and the daemon's
# permissions on the task role (iam.tf).
# model_sync_bucket_name = "" (the default): none of it.

locals {
  model_sync = var.model_sync_bucket_name != ""
  # Each task's queue is <queue_prefix><task id>, made by the controller: a prefix of fixed length (27
  # characters; SQS names stop at 80, and the task id takes up to 36) that no other deployment shares (the
  # roles' scope). The stack uses its stack id the same way.
  queue_prefix = "modelsync-${substr(sha1("${local.account_id}/${local.region}/${local.family}"), 0, 16)}-"
  # Safe rollouts: the controller decides them (controller.tf: CONTROLLER_ROLLOUTS=on, the canary settings, the
  # rollouts' objects under <prefix>.modelsync/); the daemons report their evidence to its queue and follow.
  rollouts = local.model_sync && var.canary_fraction != "0"
  modelsync_rollout_environment = local.rollouts ? [
    { name = "MODELSYNC_ROLLOUTS", value = "controller" },
    { name = "MODELSYNC_CONTROLLER_QUEUE_URL", value = one(aws_sqs_queue.controller[*].url) },
  ] : []
}

resource "aws_cloudwatch_log_group" "modelsync" {
  count             = local.model_sync ? 1 : 0
  name              = "${var.log_group_prefix}/modelsync"
  retention_in_days = var.log_retention_days
  tags              = var.tags
}

# Object events of the bucket, through EventBridge, to the topic (turn on the bucket's EventBridge
# notifications: aws s3api put-bucket-notification-configuration --bucket B --notification-configuration
# '{"EventBridgeConfiguration": {}}'). An event only makes the daemons reconcile sooner; every daemon
# also reconciles every MODELSYNC_INTERVAL.
resource "aws_sns_topic" "modelsync" {
  count = local.model_sync ? 1 : 0
  # Object keys only, no model data. SSE with the AWS managed key would stop EventBridge from
  # publishing (it cannot use alias/aws/sns); a customer managed key is an account choice with a key
  # policy of its own.
  #checkov:skip=CKV_AWS_26:EventBridge cannot publish to a topic encrypted with the AWS managed key
  tags = var.tags
}

resource "aws_sns_topic_policy" "modelsync" {
  count = local.model_sync ? 1 : 0
  arn   = aws_sns_topic.modelsync[0].arn
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "EventBridgeRuleOnly"
      Effect    = "Allow"
      Principal = { Service = "events.amazonaws.com" }
      Action    = "sns:Publish"
      Resource  = aws_sns_topic.modelsync[0].arn
      Condition = { ArnEquals = { "aws:SourceArn" = aws_cloudwatch_event_rule.modelsync[0].arn } }
    }]
  })
}

resource "aws_cloudwatch_event_rule" "modelsync" {
  count       = local.model_sync ? 1 : 0
  description = "Object created or deleted under the model-sync prefix -> the model-sync topic"
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
  target_id = "modelsync-topic"
  arn       = aws_sns_topic.modelsync[0].arn
}
