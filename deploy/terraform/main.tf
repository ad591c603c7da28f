# Triton Inference Server on ECS (EC2, GPU) with the EMF exporter sidecar and the FireLens log
# router: the same deployment as deploy/stack.yaml, which tests/deploy/test_terraform.py evaluates next
# to this module and compares resource by resource.
#
# Nothing here is written twice:
# - the containers are deploy/task-definition.json's or, with model sync, deploy/task-definition-
#   modelsync.json's (two more containers: modelsync-init and modelsync), decoded and patched below
#   with this deployment's images, namespace, log prefix, log groups, topic and queue prefix, and
#   with tracing the trace flags and the relay's settings (tracing.tf), with otlp_metrics the
#   exporter's OTLP output (otlp.tf) (the stack does the same);
# - the alarms, the service scaling (docs/scaling.md) and their variables are alarms.tf.json, and the dashboard
#   body is ../../dashboards/triton.json.tftpl, both written by `python -m render`
#   from the metric catalog.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  region     = data.aws_region.current.region
  partition  = data.aws_partition.current.partition
  family     = var.task_family != "" ? var.task_family : "${var.cluster_name}-${var.service_name}"
  # One namespace per deployment by default (the stack's is Triton/<stack name>, its task family too),
  # so two deployments in one account never alarm or scale on each other's metrics.
  namespace = var.namespace != "" ? var.namespace : "Triton/${local.family}"
  # The same for the names of the alarms, scaling policies, Contributor Insights rules and the dashboard (the
  # stack's are its name): two deployments with the defaults would otherwise overwrite each other's.
  alarm_name_prefix = var.alarm_name_prefix != "" ? var.alarm_name_prefix : local.family
  dashboard_name    = var.dashboard_name != "" ? var.dashboard_name : local.family

  # The ${...} placeholders of both task definition files (templatefile() takes extra names).
  # Their values land inside JSON strings, so they are JSON-escaped. The image tags are parts of
  # the image URIs, which the patches replace whole; the topic's ARN is known only after apply, so
  # the modelsync patch puts it in, and the task definition's shape stays known at plan time.
  template_vars = {
    for name, value in {
      AccountId            = local.account_id
      Region               = local.region
      ModelRepository      = var.model_repository
      ExpectGpu            = var.expect_gpu
      Namespace            = local.namespace
      TritonTag            = ""
      ExporterTag          = ""
      LogRouterTag         = ""
      ModelSyncBucketName  = var.model_sync_bucket_name
      ModelSyncPrefix      = var.model_sync_prefix
      ModelSyncTopicArn    = ""
      TritonAdminKeyArn    = ""
      ModelSyncQueuePrefix = local.queue_prefix
    } : name => trimsuffix(trimprefix(jsonencode(value), "\""), "\"")
  }
  task_definition = jsondecode(templatefile(
    "${path.module}/../${local.model_sync ? "task-definition-modelsync.json" : "task-definition.json"}", local.template_vars
  ))

  # What this deployment changes in each container of the file.
  images = {
    "triton-server"  = var.triton_image
    "exporter"       = var.exporter_image
    "log_router"     = var.log_router_image
    "modelsync-init" = var.exporter_image
    "modelsync"      = var.exporter_image
  }
  environment = {
    "triton-server" = {}
    # With otlp_metrics, the OTLP endpoint too (otlp.tf); the GPU fault action (gpufaults.tf).
    "exporter"       = merge(local.otlp_metrics_environment, local.gpu_fault_environment)
    "modelsync-init" = {}
    # Known after apply: the topic every daemon subscribes its own queue to.
    "modelsync" = { for key, value in { MODELSYNC_TOPIC_ARN = one(aws_sns_topic.modelsync[*].arn) } : key => value if local.model_sync }
    "log_router" = {
      TRITON_LOG_GROUP_PREFIX   = var.log_group_prefix
      TRITON_LOG_RETENTION_DAYS = tostring(var.log_retention_days)
    }
  }
  # Environment variables a container gets beyond the file's (tracing.tf, otlp.tf, gpufaults.tf, protection.tf),
  # after them.
  added_environment = {
    "exporter" = concat(local.tracing_environment, local.otlp_semconv_environment, local.controller_report_environment,
    local.task_protection_environment)
    # With rollouts: the daemon follows the controller (modelsync.tf).
    "modelsync" = local.modelsync_rollout_environment
  }
  model_volume = "model-repository"
  # With triton_args: the user's flags after the file's (before the trace flags, as the stack has them).
  triton_args = var.triton_args == "" ? "" : " ${var.triton_args}"
  router      = one([for c in local.task_definition.containerDefinitions : c if c.name == "log_router"])
  triton      = one([for c in local.task_definition.containerDefinitions : c if c.name == "triton-server"])
  # The volumes: with model sync, the file's (the instance's store at model_sync_host_path, and the
  # task's repository); else model_repository_host_path, when there is one.
  volumes = local.model_sync ? [
    for v in local.task_definition.volumes : { name = v.name, host_path = lookup(v, "host", null) != null ? var.model_sync_host_path : null }
    ] : (
    var.model_repository_host_path == "" ? [] : [{ name = local.model_volume, host_path = var.model_repository_host_path }]
  )
  # The awslogs group of the daemon and its init container, which the module creates (so their driver
  # creates none): one object key per modelsync container in the file, none without model sync.
  modelsync_logs = {
    for c in local.task_definition.containerDefinitions : "logConfiguration" => {
      logDriver = c.logConfiguration.logDriver
      options = merge(
        { for key, value in c.logConfiguration.options : key => value if key != "awslogs-create-group" },
        { "awslogs-group" = one(aws_cloudwatch_log_group.modelsync[*].name) },
      )
    } if c.name == "modelsync"
  }
  patches = {
    # Without model sync, the host directory read-only at the repository path, when there is one.
    # (An object `for` with an `if` keeps or drops the key; a conditional could not return two
    # object shapes.)
    # With tracing, the trace flags after the file's command line (tracing.tf).
    "triton-server" = merge(
      { cpu = var.triton_cpu, memoryReservation = var.triton_memory },
      {
        for key, value in {
          mountPoints = [{ sourceVolume = local.model_volume, containerPath = var.model_repository, readOnly = true }]
        } : key => value if var.model_repository_host_path != "" && !local.model_sync
      },
      {
        for key, value in {
          command = [local.triton.command[0], local.triton.command[1], "${local.triton.command[2]}${local.triton_args}${local.tracing ? local.trace_flags : ""}"]
        } : key => value if local.tracing || var.triton_args != ""
      },
    )
    "exporter"       = {}
    "modelsync-init" = local.modelsync_logs
    "modelsync"      = local.modelsync_logs
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
  # The admin key's secret (admin_key.tf), known after apply: each container the file gives it to gets its ARN.
  admin_key_secrets = [{ name = "TRITON_ADMIN_KEY", valueFrom = aws_secretsmanager_secret.admin_key.arn }]
  containers = [for c in local.task_definition.containerDefinitions : merge(c, { image = local.images[c.name] }, {
    for key, value in { secrets = local.admin_key_secrets } : key => value if lookup(c, "secrets", null) != null
    }, {
    for key, value in {
      environment = concat(
        [for e in lookup(c, "environment", []) : { name = e.name, value = lookup(local.environment[c.name], e.name, e.value) }],
        lookup(local.added_environment, c.name, []),
      )
    } : key => value if lookup(c, "environment", null) != null
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
    for_each = local.volumes
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

# Only inference, model metadata and readiness, and server health reach Triton from the load balancer: the
# forwarding rule takes /v2/models/* and /v2/health/*, and a rule evaluated before it answers 403 to the model
# configuration, statistics and trace settings under /v2/models/ (Triton refuses them without the admin key
# too). The repository, logging, trace and shared-memory APIs are under no forwarded path.
resource "aws_lb_listener_rule" "deny" {
  listener_arn = var.listener_arn
  priority     = var.listener_deny_rule_priority

  action {
    type = "fixed-response"
    fixed_response {
      status_code  = "403"
      content_type = "application/json"
      message_body = "{\"error\":\"not served through the load balancer\"}"
    }
  }

  condition {
    path_pattern {
      values = ["/v2/models/*/config", "/v2/models/*stats", "/v2/models/*/trace/*"]
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

  lifecycle {
    precondition {
      condition     = var.listener_deny_rule_priority < var.listener_rule_priority
      error_message = "The listener_deny_rule_priority must be below listener_rule_priority, so that it is evaluated first."
    }
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
      values = ["/v2/models/*", "/v2/health/*"]
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
  cluster                            = local.create_cluster ? aws_ecs_cluster.this[0].name : var.cluster_name
  task_definition                    = aws_ecs_task_definition.this.arn
  launch_type                        = local.create_cluster ? null : "EC2"
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

  # ECS takes a launch type or a capacity provider strategy, not both. With the module's own cluster
  # (cluster.tf), its capacity provider: managed scaling then adds a GPU instance for a task that no
  # instance has room for.
  dynamic "capacity_provider_strategy" {
    for_each = aws_ecs_capacity_provider.gpu
    content {
      capacity_provider = capacity_provider_strategy.value.name
      weight            = 1
      base              = 0
    }
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

  # ECS refuses a target group that no listener uses yet, and a capacity provider the cluster does not
  # have yet.
  depends_on = [aws_lb_listener_rule.this, aws_ecs_cluster_capacity_providers.this]

  lifecycle {
    # desired_count is the count at creation; after that the service scaling owns it, and an
    # apply does not reset it (the CloudFormation stack resets it on every update).
    ignore_changes = [desired_count]
  }

  tags = var.tags
}
