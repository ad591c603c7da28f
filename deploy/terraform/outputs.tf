output "service_name" {
  description = "Name of the ECS service"
  value       = aws_ecs_service.this.name
}

output "task_definition_arn" {
  description = "ARN (with revision) of the task definition"
  value       = aws_ecs_task_definition.this.arn
}

output "target_group_arn" {
  description = "Target group of the service (aws elbv2 describe-target-health)"
  value       = aws_lb_target_group.this.arn
}

output "task_role_arn" {
  description = "Role of the containers"
  value       = aws_iam_role.task.arn
}

output "execution_role_arn" {
  description = "Role of the ECS agent (image pulls, the router's own logs)"
  value       = aws_iam_role.execution.arn
}

output "log_groups" {
  description = "Log group name per kind: server, errors, metrics (the EMF documents), exporter, log-router, and modelsync with model sync"
  value = merge(
    { for key, group in aws_cloudwatch_log_group.this : key => group.name },
    { for group in aws_cloudwatch_log_group.modelsync : "modelsync" => group.name },
  )
}

output "dashboard_name" {
  description = "Name of the CloudWatch dashboard (null when create_dashboard is false)"
  value       = one(aws_cloudwatch_dashboard.this[*].dashboard_name)
}

# --- model sync: null while model_sync_bucket_name is empty ----------------------------------

output "model_sync_topic_arn" {
  description = "Topic the EventBridge rule publishes the bucket's object events to; the daemons' MODELSYNC_TOPIC_ARN (null without model sync)"
  value       = one(aws_sns_topic.modelsync[*].arn)
}

output "model_sync_log_group" {
  description = "modelsync's awslogs group: its EMF (sync attempts, ModelArtifact per task) and log lines (null without model sync)"
  value       = one(aws_cloudwatch_log_group.modelsync[*].name)
}

output "namespace" {
  description = "The CloudWatch namespace the exporter and modelsync write, and the alarms and scaling read"
  value       = local.namespace
}

# --- cluster from zero: null while create_cluster is false -----------------------------------

output "autoscaling_group_name" {
  description = "The GPU instances' Auto Scaling group (null without create_cluster)"
  value       = one(aws_autoscaling_group.gpu[*].name)
}

output "capacity_provider_name" {
  description = "The capacity provider of the service, which scales the Auto Scaling group (null without create_cluster)"
  value       = one(aws_ecs_capacity_provider.gpu[*].name)
}

# --- the fleet's controller: null while gpu_fault_action is not drain ---------------------------------------

output "controller_queue_url" {
  description = "The fleet controller's queue, where the hosts report: CONTROLLER_QUEUE_URL (null without the controller)"
  value       = one(aws_sqs_queue.controller[*].url)
}

output "controller_service_name" {
  description = "The fleet controller's ECS service: scale it to 0 to stop its decisions (null without the controller)"
  value       = one(aws_ecs_service.controller[*].name)
}

output "controller_state_bucket" {
  description = "The bucket of the controller's state: CONTROLLER_STATE_BUCKET, for python -m controller status and resume (null without the controller)"
  value       = one(aws_s3_bucket.controller_state[*].id)
}
