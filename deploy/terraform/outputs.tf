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

output "model_sync_service_name" {
  description = "Name of the modelsync DAEMON service (null without model sync)"
  value       = one(aws_ecs_service.modelsync[*].name)
}

output "model_sync_task_definition_arn" {
  description = "ARN (with revision) of the modelsync task definition (null without model sync)"
  value       = one(aws_ecs_task_definition.modelsync[*].arn)
}

output "model_sync_queue_url" {
  description = "URL of the queue the EventBridge rule fills; the daemon's MODELSYNC_QUEUE_URL (null without model sync)"
  value       = one(aws_sqs_queue.modelsync[*].url)
}

output "model_sync_queue_arn" {
  description = "ARN of the model-sync queue (null without model sync)"
  value       = one(aws_sqs_queue.modelsync[*].arn)
}

output "model_sync_task_role_arn" {
  description = "Role of the modelsync daemon: read the archives under the prefix, consume the queue (null without model sync)"
  value       = one(aws_iam_role.modelsync[*].arn)
}

output "model_sync_log_group" {
  description = "modelsync's awslogs group: its EMF (sync attempts, ModelArtifact per host) and log lines (null without model sync)"
  value       = one(aws_cloudwatch_log_group.modelsync[*].name)
}
