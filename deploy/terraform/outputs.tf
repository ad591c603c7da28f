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
  description = "Log group name per kind: server, errors, metrics (the EMF documents), exporter, log-router"
  value       = { for key, group in aws_cloudwatch_log_group.this : key => group.name }
}

output "dashboard_name" {
  description = "Name of the CloudWatch dashboard (null when create_dashboard is false)"
  value       = one(aws_cloudwatch_dashboard.this[*].dashboard_name)
}
