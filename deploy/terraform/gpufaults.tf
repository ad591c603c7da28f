# GPU faults (docs/gpu.md), as deploy/stack.yaml has them: the exporter's EXPORTER_GPU_FAULT_ACTION, and with
# gpu_fault_action = "drain" the task role may find this task's container instance, set it DRAINING, and mark its
# EC2 instance Unhealthy in the Auto Scaling group (the module's own with create_cluster, else
# gpu_fault_auto_scaling_group_name), which replaces it. gpu_fault_action = "report" (the default): no AWS call, no
# permission.

locals {
  gpu_drain = var.gpu_fault_action == "drain"
  # The group whose instances the exporter may mark Unhealthy; none: drained instances are not replaced.
  gpu_fault_group = local.create_cluster ? one(aws_autoscaling_group.gpu[*].name) : var.gpu_fault_auto_scaling_group_name
  gpu_drain_replaces = local.gpu_drain && (local.create_cluster || var.gpu_fault_auto_scaling_group_name != "")
  # The file's EXPORTER_GPU_FAULT_ACTION is "report" (main.tf replaces the value by name).
  gpu_fault_environment = { EXPORTER_GPU_FAULT_ACTION = var.gpu_fault_action }
}

# The ECS actions take the cluster's tasks and container instances as resources; SetInstanceHealth takes the group.
resource "aws_iam_role_policy" "task_gpu_drain" {
  count = local.gpu_drain ? 1 : 0
  name  = "gpu-fault-drain"
  role  = aws_iam_role.task.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat([
      {
        Sid      = "FindThisContainerInstance"
        Effect   = "Allow"
        Action   = "ecs:DescribeTasks"
        Resource = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:task/${var.cluster_name}/*"
      },
      {
        Sid      = "DrainThisContainerInstance"
        Effect   = "Allow"
        Action   = ["ecs:DescribeContainerInstances", "ecs:UpdateContainerInstancesState"]
        Resource = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:container-instance/${var.cluster_name}/*"
      },
      ], local.gpu_drain_replaces ? [{
        Sid      = "ReplaceThisInstance"
        Effect   = "Allow"
        Action   = "autoscaling:SetInstanceHealth"
        Resource = "arn:${local.partition}:autoscaling:${local.region}:${local.account_id}:autoScalingGroup:*:autoScalingGroupName/${local.gpu_fault_group}"
    }] : [])
  })
}
