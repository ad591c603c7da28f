terraform {
  # templatefile/jsondecode/one() and variable validation; nothing newer is used.
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 6.0.0 added data.aws_region's `region` attribute (and deprecated `name`), which main.tf reads;
      # aws_cloudwatch_metric_alarm's evaluation_criteria/evaluation_interval (the PromQL alarms of
      # alarms.tf.json) came with hashicorp/terraform-provider-aws PR #47449 (merged 2026-04-16). Its release
      # is 6.42 or 6.43 by second-hand accounts (no release notes here to check): 6.43.0 covers both.
      version = ">= 6.43.0, < 7.0.0"
    }
  }
}
