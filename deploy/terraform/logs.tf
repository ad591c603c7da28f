locals {
  # Every group fluentbit/triton.conf writes with a fixed name, and the router's own awslogs group.
  # The per-model groups (<prefix>/model/<name>) are named from model names at run time, so the
  # router creates them with TRITON_LOG_RETENTION_DAYS; they outlive the module.
  log_groups = toset(["server", "errors", "metrics", "exporter", "log-router"])
  log_group_arns = {
    for key, group in aws_cloudwatch_log_group.this :
    key => "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:${group.name}"
  }
}

resource "aws_cloudwatch_log_group" "this" {
  for_each          = local.log_groups
  name              = "${var.log_group_prefix}/${each.key}"
  retention_in_days = var.log_retention_days
  tags              = var.tags
}
