# A root module that deploys ../ (the Triton task, service, logs, IAM, alarms, dashboard and
# service scaling, and with model_sync_bucket the model sync containers in the Triton task, the topic and
# the rule that feeds it) into an
# existing GPU cluster behind an existing ALB listener, or, with create_cluster = true, into a cluster of
# its own (GPU instances in an Auto Scaling group, scaled by a capacity provider; docs/deploy.md, "Cluster
# from zero").
#
#   cp terraform.tfvars.example terraform.tfvars   # then fill in your cluster, network and images
#   terraform init && terraform plan -out triton.plan && terraform apply triton.plan
#
# The module reads deploy/task-definition.json, deploy/task-definition-modelsync.json and
# dashboards/triton.json.tftpl by relative path, so use it from a checkout of the repository (or a git source of the whole repository
# with `//deploy/terraform`), not from a copy of deploy/terraform alone.
#
# Not run here: `terraform validate` and `plan` need the Terraform binary and the AWS provider,
# which the project's machines cannot download (see docs/deploy.md, "Deploy with Terraform").

terraform {
  required_version = ">= 1.5.0"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 6.0.0, < 7.0.0"
    }
  }
}

provider "aws" {
  region = var.region
}

variable "region" {
  type        = string
  description = "Region of the cluster, the registries and the log groups"
}

variable "cluster_name" {
  type        = string
  description = "Name of the ECS cluster of GPU instances"
}

variable "vpc_id" {
  type        = string
  description = "VPC of the subnets and the load balancer"
}

variable "subnet_ids" {
  type        = list(string)
  description = "Subnets of the tasks' ENIs"
}

variable "security_group_ids" {
  type        = list(string)
  description = "Security groups of the tasks (TCP 8000 from the load balancer)"
}

variable "listener_arn" {
  type        = string
  description = "Existing ALB listener the module adds its rule to"
}

variable "image_tag" {
  type        = string
  description = "Tag of the three images pushed as in docs/deploy.md"
}

variable "model_bucket" {
  type        = string
  description = "S3 bucket of the model repository"
}

variable "model_sync_bucket" {
  type        = string
  description = "Bucket of <prefix><model>.zip archives modelsync installs on every GPU instance (docs/modelsync.md); empty: no model sync"
  default     = ""
}

variable "model_sync_prefix" {
  type        = string
  description = "Key prefix of the model archives in model_sync_bucket"
  default     = "triton/"
}

variable "create_cluster" {
  type        = bool
  description = "Create the cluster named cluster_name with its GPU instances (docs/deploy.md, \"Cluster from zero\"); false: cluster_name exists"
  default     = false
}

variable "alarm_topic_arn" {
  type        = string
  description = "SNS topic for the alarms; empty for none"
  default     = ""
}

data "aws_caller_identity" "current" {}

locals {
  registry = "${data.aws_caller_identity.current.account_id}.dkr.ecr.${var.region}.amazonaws.com"
}

module "triton" {
  source = "../"

  cluster_name       = var.cluster_name
  vpc_id             = var.vpc_id
  subnet_ids         = var.subnet_ids
  security_group_ids = var.security_group_ids
  listener_arn       = var.listener_arn

  triton_image     = "${local.registry}/triton-server:${var.image_tag}"
  exporter_image   = "${local.registry}/triton-emf-exporter:${var.image_tag}"
  log_router_image = "${local.registry}/triton-log-router:${var.image_tag}"

  model_repository  = "s3://${var.model_bucket}/triton"
  model_bucket_name = var.model_bucket
  expect_gpu        = "A10G|L4"

  # With a bucket: the modelsync daemon on every GPU instance, and Triton in explicit model-control
  # mode over the instance's /opt/triton-models (which must exist, owned by uid 10001).
  model_sync_bucket_name = var.model_sync_bucket
  model_sync_prefix      = var.model_sync_prefix

  desired_count   = 1
  min_capacity    = 1
  max_capacity    = 4

  # With a cluster of its own: g5.xlarge instances (one GPU each), 1 to max_capacity + 1 of them, so that a
  # rolling deployment has a GPU for its new task.
  create_cluster   = var.create_cluster
  instance_type    = "g5.xlarge"
  cluster_min_size = 1
  cluster_max_size = 5

  alarm_topic_arn = var.alarm_topic_arn

  tags = { app = "triton" }
}

output "service_name" {
  value = module.triton.service_name
}

output "log_groups" {
  value = module.triton.log_groups
}

output "dashboard_name" {
  value = module.triton.dashboard_name
}

output "alarm_names" {
  value = module.triton.alarm_names
}

output "model_sync_topic_arn" {
  value = module.triton.model_sync_topic_arn
}

output "namespace" {
  value = module.triton.namespace
}

output "capacity_provider_name" {
  value = module.triton.capacity_provider_name
}

output "autoscaling_group_name" {
  value = module.triton.autoscaling_group_name
}
