# Triton Inference Server on ECS (EC2, GPU) with the EMF exporter sidecar and the FireLens log
# router: the same deployment as deploy/stack.yaml, which tests/test_terraform.py evaluates next
# to this module and compares resource by resource.
#
# Nothing here is written twice:
# - the containers are deploy/task-definition.json's, decoded and patched below with this
#   deployment's images, namespace, log prefix and router log group (the stack does the same);
#   the model-sync daemon's are deploy/modelsync-task-definition.json's (modelsync.tf);
# - the alarms, the GPU step scaling and their variables are alarms.tf.json, and the dashboard
#   body is ../../dashboards/triton.json.tftpl, both written by `python -m exporter render`
#   from the metric catalog.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  region     = data.aws_region.current.region
  partition  = data.aws_partition.current.partition
  family     = var.task_family != "" ? var.task_family : "${var.cluster_name}-${var.service_name}"

  # The ${...} placeholders of both task definition files (templatefile() takes extra names).
  # Their values land inside JSON strings, so they are JSON-escaped. The image tags are parts of
  # the image URIs, which the patches replace whole; the queue URL is known only after apply, so
  # modelsync.tf patches it in, and the task definitions' shape stays known at plan time.
  template_vars = {
    for name, value in {
      AccountId           = local.account_id
      Region              = local.region
      ModelRepository     = var.model_repository
      ExpectGpu           = var.expect_gpu
      TritonTag           = ""
      ExporterTag         = ""
      LogRouterTag        = ""
      ModelSyncBucketName = var.model_sync_bucket_name
      ModelSyncPrefix     = var.model_sync_prefix
      ModelSyncQueueUrl   = ""
    } : name => trimsuffix(trimprefix(jsonencode(value), "\""), "\"")
  }
  task_definition = jsondecode(templatefile("${path.module}/../task-definition.json", local.template_vars))

  # What this deployment changes in each container of the file.
  images = {
    "triton-server" = var.triton_image
    "exporter"      = var.exporter_image
    "log_router"    = var.log_router_image
  }
  environment = {
    # With model sync, Triton serves the daemon's repository (one source: the daemon's file).
    "triton-server" = { for key, value in { MODEL_REPOSITORY = local.daemon_environment.MODELSYNC_REPOSITORY } : key => value if local.model_sync }
    "exporter"      = { AWS_EMF_NAMESPACE = var.namespace }
    "log_router" = {
      TRITON_LOG_GROUP_PREFIX   = var.log_group_prefix
      TRITON_LOG_RETENTION_DAYS = tostring(var.log_retention_days)
    }
  }
  model_volume = "model-repository"
  router       = one([for c in local.task_definition.containerDefinitions : c if c.name == "log_router"])
  triton       = one([for c in local.task_definition.containerDefinitions : c if c.name == "triton-server"])
  # Where the explicit-mode flags go in Triton's shell command (after the repository flag).
  triton_repository_flag = "--model-repository=\"$MODEL_REPOSITORY\""
  explicit_model_control = "--model-control-mode=explicit --load-model=*"
  # The task's one host volume: the model-sync directory (repository/ and store/) with model sync,
  # else model_repository_host_path, else none.
  host_volumes = local.model_sync ? [{ name = local.daemon_volume.name, host_path = var.model_sync_host_path }] : (
    var.model_repository_host_path == "" ? [] : [{ name = local.model_volume, host_path = var.model_repository_host_path }]
  )
  patches = {
    # With model sync: explicit model control (modelsync loads each model after its link flip;
    # --load-model=* loads what the repository links to when Triton starts), and the daemon's whole
    # directory read-only at the daemon's mount path, as the repository's relative links point into
    # store/ beside it. Else the host directory, read-only at the repository path, when there is
    # one. (An object `for` with an `if` keeps or drops the key; a conditional could not return two
    # object shapes.)
    "triton-server" = merge(
      {
        for key, value in {
          mountPoints = [{ sourceVolume = local.model_volume, containerPath = var.model_repository, readOnly = true }]
        } : key => value if var.model_repository_host_path != "" && !local.model_sync
      },
      {
        for key, value in {
          command     = [for i, arg in local.triton.command : i == length(local.triton.command) - 1 ? replace(arg, local.triton_repository_flag, "${local.triton_repository_flag} ${local.explicit_model_control}") : arg]
          mountPoints = [{ sourceVolume = local.daemon_volume.name, containerPath = local.daemon_mount.containerPath, readOnly = true }]
        } : key => value if local.model_sync
      },
    )
    "exporter" = {}
    # The module creates the router's own group, so its awslogs driver creates none (and the
    # execution role has no logs:CreateLogGroup).
    "log_router" = {
      logConfiguration = merge(local.router.logConfiguration, {
        options = merge(
          { for key, value in local.router.logConfiguration.options : key => value if key != "awslogs-create-group" },
          { "awslogs-group" = aws_cloudwatch_log_group.this["log-router"].name },
        )
      })
    }
  }
  containers = [for c in local.task_definition.containerDefinitions : merge(c, {
    image       = local.images[c.name]
    environment = [for e in c.environment : { name = e.name, value = lookup(local.environment[c.name], e.name, e.value) }]
  }, local.patches[c.name])]

  # The load balancer sends to Triton's HTTP port, as the file names it.
  lb_container = "triton-server"
  lb_port = one([
    for p in one([for c in local.task_definition.containerDefinitions : c if c.name == local.lb_container]).portMappings :
    p.containerPort if p.name == "triton-http"
  ])
}

resource "aws_ecs_task_definition" "this" {
  family                   = local.family
  network_mode             = local.task_definition.networkMode
  requires_compatibilities = local.task_definition.requiresCompatibilities
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn
  container_definitions    = jsonencode(local.containers)

  dynamic "volume" {
    for_each = local.host_volumes
    content {
      name      = volume.value.name
      host_path = volume.value.host_path
    }
  }

  tags = var.tags
}

resource "aws_lb_target_group" "this" {
  vpc_id           = var.vpc_id
  target_type      = "ip"
  protocol         = "HTTP"
  protocol_version = "HTTP1"
  port             = local.lb_port
  # Shorter than Triton's --exit-timeout-secs=30 + stopTimeout 40: drained before SIGTERM ends it.
  deregistration_delay = 30

  health_check {
    enabled             = true
    protocol            = "HTTP"
    port                = "traffic-port"
    path                = "/v2/health/ready"
    interval            = 15
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 3
    matcher             = "200"
  }

  tags = var.tags
}

resource "aws_lb_listener_rule" "this" {
  listener_arn = var.listener_arn
  priority     = var.listener_rule_priority

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.this.arn
  }

  condition {
    path_pattern {
      values = ["/v2/*"]
    }
  }

  dynamic "condition" {
    for_each = var.listener_host_header == "" ? [] : [var.listener_host_header]
    content {
      host_header {
        values = [condition.value]
      }
    }
  }

  tags = var.tags
}

resource "aws_ecs_service" "this" {
  name                               = var.service_name
  cluster                            = var.cluster_name
  task_definition                    = aws_ecs_task_definition.this.arn
  launch_type                        = "EC2"
  desired_count                      = var.desired_count
  enable_execute_command             = var.enable_exec
  health_check_grace_period_seconds  = var.health_check_grace_period_seconds
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  propagate_tags                     = "SERVICE"

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = var.security_group_ids
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.this.arn
    container_name   = local.lb_container
    container_port   = local.lb_port
  }

  # ECS refuses a target group that no listener uses yet.
  depends_on = [aws_lb_listener_rule.this]

  lifecycle {
    # desired_count is the count at creation; after that the GPU step scaling owns it, and an
    # apply does not reset it (the CloudFormation stack resets it on every update).
    ignore_changes = [desired_count]
  }

  tags = var.tags
}
