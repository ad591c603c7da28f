# The body is the generated dashboard (the same builder as dashboards/triton.json and the
# CloudFormation template's), with this deployment's namespace, region, names and thresholds.
resource "aws_cloudwatch_dashboard" "this" {
  count          = var.create_dashboard ? 1 : 0
  dashboard_name = local.dashboard_name
  dashboard_body = templatefile("${path.module}/../../dashboards/triton.json.tftpl", local.dashboard_template_vars)
}
