terraform {
  # templatefile/jsondecode/one() and variable validation; nothing newer is used.
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 5.100.0 added data.aws_region's `region` attribute (6.0 deprecated `name`).
      version = ">= 5.100.0, < 7.0.0"
    }
  }
}
