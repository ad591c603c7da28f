# Request tracing (docs/tracing.md, "Deploy"), as deploy/stack.yaml has it with Tracing=true: Triton
# started with its OpenTelemetry trace flags (1 request in trace_rate, every timestamp, service.name =
# service_name), sending to the exporter's trace relay on the task's localhost (awsvpc: one network
# namespace), which adds the ECS context and forwards the spans SigV4-signed to X-Ray's OTLP endpoint in
# this region; the task role gets AWS's managed X-Ray write policy. tracing = false (the default): none
# of it, and the task definition is the file's.

locals {
  tracing = var.tracing
  # Appended to Triton's command line (main.tf patches the file's command with it).
  trace_flags = " --trace-config mode=opentelemetry --trace-config opentelemetry,url=http://127.0.0.1:4318/v1/traces --trace-config rate=${var.trace_rate} --trace-config level=TIMESTAMPS --trace-config opentelemetry,resource=service.name=${var.service_name}"
  # Added to the exporter's environment: the relay's destination, and the group of its slow-request lines
  # (trace_id=... span_id=...), which the X-Ray console shows beside a trace.
  tracing_environment = [
    for e in [
      { name = "EXPORTER_TRACES_TO", value = "otlp+https://xray.${local.region}.${data.aws_partition.current.dns_suffix}/v1/traces" },
      { name = "EXPORTER_TRACES_LOG_GROUPS", value = aws_cloudwatch_log_group.this["exporter"].name },
    ] : e if local.tracing
  ]
}

# AWS documents a managed X-Ray write policy for the OTLP endpoint (docs/tracing.md, "Deploy", with the
# sources); X-Ray's write actions support no resource-level permissions, so no inline statement could be
# narrower in resources.
resource "aws_iam_role_policy_attachment" "task_xray" {
  count      = local.tracing ? 1 : 0
  role       = aws_iam_role.task.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/AWSXrayWriteOnlyAccess"
}
