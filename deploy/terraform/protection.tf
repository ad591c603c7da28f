# ECS task scale-in protection (docs/scaling.md), as deploy/stack.yaml has it: with task_protection the exporter
# protects its task while the work in flight outlasts the drain (EXPORTER_TASK_PROTECTION=on), and the ECS agent,
# which calls ECS as the task role, may update and read the protection of this cluster's tasks. Off: nothing.

variable "task_protection" {
  type        = bool
  description = "true: the exporter sets ECS task scale-in protection while the task's work in flight outlasts the drain (LLM streams; never for short requests, so scale-in and deployments go on), renewed, cleared when idle, 60 minutes on end at most (EXPORTER_TASK_PROTECTION; docs/scaling.md); the task role may then update and read the protection of this cluster's tasks"
  default     = false
}

locals {
  # After the file's variables and the controller's queue (main.tf's added_environment), as the stack has it.
  task_protection_environment = [for e in [{ name = "EXPORTER_TASK_PROTECTION", value = "on" }] : e if var.task_protection]
}

resource "aws_iam_role_policy" "task_protection" {
  count = var.task_protection ? 1 : 0
  name  = "task-scale-in-protection"
  role  = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid      = "TaskScaleInProtection"
      Effect   = "Allow"
      Action   = ["ecs:UpdateTaskProtection", "ecs:GetTaskProtection"]
      Resource = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:task/${var.cluster_name}/*"
    }]
  })
}
