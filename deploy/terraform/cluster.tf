# A cluster from zero, as deploy/stack.yaml has it with CreateCluster=true (docs/deploy.md, "Cluster from
# zero"): an ECS cluster named cluster_name, GPU instances from an Auto Scaling group on the ECS
# GPU-optimized AMI, and a capacity provider that scales the group to the tasks (managed scaling) and
# keeps every instance that runs a task from being scaled in (managed termination protection); the
# service uses it instead of the EC2 launch type (main.tf). The instances join the cluster through
# ../user-data.sh, which also mounts the NVMe instance store at model_sync_host_path.
# create_cluster = false (the default): none of it, and cluster_name is an existing cluster.

locals {
  create_cluster = var.create_cluster
  # Never starts with aws, ecs or fargate, which ECS refuses; 255 characters at most.
  capacity_provider_name = substr("gpu-${local.family}", 0, 255)
  instance_policies = [
    "arn:${local.partition}:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role",
    "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore",
  ]
}

# The AMI id, read at plan time from the public parameter (a new AMI reaches instances launched after the
# next apply).
data "aws_ssm_parameter" "gpu_ami" {
  count = local.create_cluster ? 1 : 0
  name  = var.gpu_ami_parameter
}

resource "aws_ecs_cluster" "this" {
  count = local.create_cluster ? 1 : 0
  name  = var.cluster_name
  # Container Insights follows the account's default (aws ecs put-account-setting-default --name
  # containerInsights); it is billed per metric, and the tasks' GPU, Triton and model metrics come from the
  # exporter. ECS Exec is off unless enable_exec; its sessions are TLS, and their logging an account choice.
  #checkov:skip=CKV_AWS_65:Container Insights follows the account default; the exporter sends the GPU, Triton and model metrics
  #checkov:skip=CKV_AWS_224:ECS Exec is off by default (enable_exec); session logging and its key are the account's choice
  tags = var.tags
}

# The ECS agent's managed policy (register the instance, poll for tasks, pull images, write awslogs), and
# Session Manager's: the instances have no SSH key and no open port, so this is the way onto a host
# (nvidia-smi, /var/log/ecs, the store's mount). The tasks never get these credentials: the user data
# blocks the metadata service for awsvpc tasks (ECS_AWSVPC_BLOCK_IMDS).
resource "aws_iam_role" "instance" {
  count       = local.create_cluster ? 1 : 0
  description = "GPU container instances - the ECS agent (register, pull images, logs) and Session Manager (no SSH)"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "instance" {
  for_each   = toset(local.create_cluster ? local.instance_policies : [])
  role       = aws_iam_role.instance[0].name
  policy_arn = each.key
}

resource "aws_iam_instance_profile" "instance" {
  count = local.create_cluster ? 1 : 0
  role  = aws_iam_role.instance[0].name
  tags  = var.tags
}

resource "aws_launch_template" "gpu" {
  count         = local.create_cluster ? 1 : 0
  image_id      = data.aws_ssm_parameter.gpu_ami[0].insecure_value
  instance_type = var.instance_type
  # The tasks' groups: the agent pulls the images and writes the awslogs groups over the instance's own
  # ENI, so it needs the egress the tasks have; no inbound rule reaches the host (the tasks listen on
  # their own ENIs).
  vpc_security_group_ids = var.security_group_ids
  # ../user-data.sh, with the cluster (created first) and the store's path.
  user_data = base64encode(templatefile("${path.module}/../user-data.sh", {
    ClusterName    = aws_ecs_cluster.this[0].name
    ModelStorePath = var.model_sync_host_path
  }))

  iam_instance_profile {
    arn = aws_iam_instance_profile.instance[0].arn
  }

  # IMDSv2 only, one hop: no container in bridge mode reaches it either.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = var.root_volume_size
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tags = var.tags
}

resource "aws_autoscaling_group" "gpu" {
  count               = local.create_cluster ? 1 : 0
  min_size            = var.cluster_min_size
  max_size            = var.cluster_max_size
  vpc_zone_identifier = var.subnet_ids
  # Managed termination protection needs it: ECS then lifts the protection of an instance with no task.
  protect_from_scale_in = true
  # Terraform only: destroy terminates the instances even while they are protected from scale-in (the
  # stack's deletion needs their protection lifted first, docs/deploy.md).
  force_delete = true

  launch_template {
    id      = aws_launch_template.gpu[0].id
    version = aws_launch_template.gpu[0].latest_version
  }

  tag {
    key                 = "Name"
    value               = var.cluster_name
    propagate_at_launch = true
  }

  # ECS tags the group it scales; the configuration has the tag too, so that no apply removes it.
  tag {
    key                 = "AmazonECSManaged"
    value               = "true"
    propagate_at_launch = true
  }

  dynamic "tag" {
    for_each = var.tags
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}

resource "aws_ecs_capacity_provider" "gpu" {
  count = local.create_cluster ? 1 : 0
  name  = local.capacity_provider_name

  auto_scaling_group_provider {
    auto_scaling_group_arn         = aws_autoscaling_group.gpu[0].arn
    managed_termination_protection = "ENABLED"
    managed_draining               = "ENABLED"

    # 100: no idle GPU instance kept in reserve (each costs the most in the deployment).
    managed_scaling {
      status          = "ENABLED"
      target_capacity = 100
    }
  }

  tags = var.tags
}

resource "aws_ecs_cluster_capacity_providers" "this" {
  count              = local.create_cluster ? 1 : 0
  cluster_name       = aws_ecs_cluster.this[0].name
  capacity_providers = [aws_ecs_capacity_provider.gpu[0].name]

  default_capacity_provider_strategy {
    capacity_provider = aws_ecs_capacity_provider.gpu[0].name
    weight            = 1
    base              = 0
  }
}
