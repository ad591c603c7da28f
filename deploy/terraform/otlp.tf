# OTLP metrics (docs/otlp.md, "Deploy"), as deploy/stack.yaml has it with OtlpMetrics=true: the exporter
# sends the scrape to CloudWatch's OTLP endpoint in this region too, after the file's EMF output (which
# stays: scaling and the classic alarms read it); the task role may call cloudwatch:PutMetricData; and
# alarms.tf.json adds the PromQL alarms. otlp_metrics = false (the default): none of it, and the task
# definition is the file's. With otlp_semconv = "genai" as well, the output also sends OpenTelemetry's GenAI
# server metrics (EXPORTER_OTLP_SEMCONV); without otlp_metrics it sets nothing: there is no OTLP output.

locals {
  otlp_metrics = var.otlp_metrics
  # The file's EXPORTER_OUTPUT (main.tf replaces the value by name), with the OTLP endpoint after it.
  exporter_file_output = one([
    for e in one([for c in local.task_definition.containerDefinitions : c if c.name == "exporter"]).environment :
    e.value if e.name == "EXPORTER_OUTPUT"
  ])
  otlp_metrics_environment = {
    for key, value in {
      EXPORTER_OUTPUT = "${local.exporter_file_output} otlp+https://monitoring.${local.region}.${data.aws_partition.current.dns_suffix}/v1/metrics"
    } : key => value if local.otlp_metrics
  }
  # Added to the exporter's environment (main.tf), as the stack's OtlpSemconvEnabled does: the exporter
  # refuses EXPORTER_OTLP_SEMCONV without an OTLP output (exit 2 at start), so only with one.
  otlp_semconv_environment = [
    for e in [{ name = "EXPORTER_OTLP_SEMCONV", value = var.otlp_semconv }] : e
    if local.otlp_metrics && var.otlp_semconv != "off"
  ]
}

# The OTLP endpoint authorizes cloudwatch:PutMetricData. The action supports no resource-level
# permissions; its one narrowing key, cloudwatch:namespace, AWS documents for the Namespace of a
# PutMetricData call, and an OTLP request has no namespace: a condition on a key the request lacks does
# not match, so it would most likely refuse every OTLP request.
resource "aws_iam_role_policy" "task_otlp_metrics" {
  count = local.otlp_metrics ? 1 : 0
  name  = "otlp-metrics"
  role  = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Sid = "PutOtlpMetrics", Effect = "Allow", Action = "cloudwatch:PutMetricData", Resource = "*" },
    ]
  })
}
