# GPU faults (docs/gpu.md), as deploy/stack.yaml has them: the exporter's EXPORTER_GPU_FAULT_ACTION, and with
# gpu_fault_action = "drain" the exporter reports a GPU turning unhealthy to the fleet's controller (controller.tf,
# docs/controller.md), which alone drains and replaces instances. The Triton task role may send to the
# controller's queue and nothing more: it can neither drain an instance nor mark one Unhealthy.
# gpu_fault_action = "report" (the default): no AWS call, no permission, no controller.

locals {
  gpu_drain = var.gpu_fault_action == "drain"
  # The group whose instances the controller may mark Unhealthy; none: drained instances are not replaced.
  gpu_fault_group    = local.create_cluster ? one(aws_autoscaling_group.gpu[*].name) : var.gpu_fault_auto_scaling_group_name
  gpu_drain_replaces = local.gpu_drain && (local.create_cluster || var.gpu_fault_auto_scaling_group_name != "")
  # The file's EXPORTER_GPU_FAULT_ACTION is "report" (main.tf replaces the value by name).
  gpu_fault_environment = { EXPORTER_GPU_FAULT_ACTION = var.gpu_fault_action }
  # With the controller: its queue, after the file's variables (main.tf's added_environment), as the stack has it.
  controller_report_environment = [for queue in aws_sqs_queue.controller : { name = "CONTROLLER_QUEUE_URL", value = queue.url } if local.gpu_drain]
}

# The exporter's reports, and with rollouts (canary_fraction > 0) the modelsync daemon's canary evidence
# (MODELSYNC_ROLLOUTS=controller), to the controller's queue (which also runs for model sync's fan-out alone:
# nothing in the task sends to it then).
resource "aws_iam_role_policy" "task_controller_report" {
  count = local.gpu_drain || local.rollouts ? 1 : 0
  name  = "report-to-controller"
  role  = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid      = "ReportToTheController"
      Effect   = "Allow"
      Action   = "sqs:SendMessage"
      Resource = aws_sqs_queue.controller[0].arn
    }]
  })
}
